//! Configuration: `config.toml` → validated [`Config`].
//!
//! Two levels (ripgrep's LowArgs → HiArgs): the serde structs mirror the file; `load` checks them
//! once and reports every problem with `file:line:column`. Each section's type is owned by the
//! module that uses it; this file only assembles them.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The whole configuration file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `[daemon]`: sampling and state.
    pub daemon: DaemonSection,
    /// `[rules]`: evaluation interval, extra rule directories, stock-rule parameter overrides
    /// (owned by `rules`).
    pub rules: crate::rules::RulesConfig,
    /// `[notify]`: global delivery settings (owned by `notify`).
    pub notify: crate::notify::settings::NotifySection,
    /// `[[channel]]`: notification channels (owned by `notify`).
    pub channel: Vec<crate::notify::settings::ChannelSection>,
    /// `[[route]]`: which alerts go to which channels (owned by `notify`).
    pub route: Vec<crate::notify::settings::RouteSection>,
    /// `[actions]`: kill / exec policy (owned by `action`).
    pub actions: crate::action::ActionsSection,
    /// `[job]`: `gpuwatch run` / `attach` settings (owned by `job`).
    pub job: crate::job::JobSection,
    /// Directory the config file lives in; relative paths in it resolve against this.
    #[serde(skip)]
    pub base_dir: PathBuf,
    /// The config file's path (for messages).
    #[serde(skip)]
    pub path: PathBuf,
    /// The config file's text (to turn spans into `line:column`).
    #[serde(skip)]
    pub text: String,
}

impl Config {
    /// `[daemon] hostname`, or the machine's host name when unset.
    pub fn hostname(&self) -> String {
        if !self.daemon.hostname.is_empty() {
            return self.daemon.hostname.clone();
        }
        crate::sys::hostname()
    }
}

/// `[daemon]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DaemonSection {
    /// Sampling interval, e.g. `"1s"`.
    pub interval: String,
    /// Where alert state and the outbox live.
    pub state_dir: PathBuf,
    /// Rule directories or files, relative to the config file.
    pub rules: Vec<PathBuf>,
    /// Host name put in alerts and messages (default: the machine's host name).
    pub hostname: String,
}

impl Default for DaemonSection {
    fn default() -> Self {
        DaemonSection {
            interval: "1s".into(),
            state_dir: PathBuf::from("/var/lib/gpuwatch"),
            rules: vec![PathBuf::from("rules/")],
            hostname: String::new(),
        }
    }
}

/// A configuration error that points into the file.
#[derive(Debug, thiserror::Error)]
#[error("{path}:{line}:{column}: {message}")]
pub struct ConfigError {
    /// The file.
    pub path: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

/// 1-based line and column of byte offset `offset` in `text`.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rfind('\n')
        .map_or(before.len(), |nl| before.len() - nl - 1)
        + 1;
    (line, column)
}

/// Parses a config from text; `path` is used in messages and to resolve relative paths.
pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
    let mut config: Config = toml::from_str(text).map_err(|e| {
        let (line, column) = e.span().map_or((1, 1), |s| line_col(text, s.start));
        ConfigError {
            path: path.display().to_string(),
            line,
            column,
            message: e.message().to_string(),
        }
    })?;
    config.base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    config.path = path.to_path_buf();
    config.text = text.to_string();
    Ok(config)
}

/// Reads and parses a config file.
pub fn load(path: &Path) -> anyhow::Result<Config> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read config {}: {e}", path.display()))?;
    Ok(parse(&text, path)?)
}

/// Parses a duration such as `"500ms"`, `"90s"`, `"5m"`, `"1h"`, `"2d"` or a plain number of
/// seconds (`"30"`), into milliseconds.
pub fn parse_duration_ms(s: &str) -> Result<i64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: expected e.g. \"90s\", \"5m\", \"1h\""))?;
    let scale = match unit.trim() {
        "" | "s" => 1000.0,
        "ms" => 1.0,
        "m" | "min" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        other => {
            return Err(format!(
                "invalid duration unit {other:?} in {s:?} (use ms, s, m, h, d)"
            ))
        }
    };
    let ms = value * scale;
    if !ms.is_finite() || !(0.0..=1e15).contains(&ms) {
        return Err(format!("duration {s:?} out of range"));
    }
    #[expect(clippy::cast_possible_truncation, reason = "range checked above")]
    Ok(ms.round() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("90s"), Ok(90_000));
        assert_eq!(parse_duration_ms("5m"), Ok(300_000));
        assert_eq!(parse_duration_ms("1h"), Ok(3_600_000));
        assert_eq!(parse_duration_ms("100ms"), Ok(100));
        assert_eq!(parse_duration_ms("30"), Ok(30_000));
        assert!(parse_duration_ms("5 parsecs").is_err());
    }

    #[test]
    fn errors_point_into_the_file() {
        let err = parse("[daemon]\ninterval = 5\n", Path::new("c.toml")).unwrap_err();
        assert_eq!((err.line, err.column), (2, 12), "{err}");
        assert!(err.to_string().starts_with("c.toml:2:12: "), "{err}");
    }
}
