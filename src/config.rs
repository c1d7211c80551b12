//! Configuration: `config.toml` → one validated [`Config`], the same for every command.
//!
//! Two levels (ripgrep's LowArgs → HiArgs): the serde structs mirror the file, with typed fields
//! (durations, intervals, regexes, paths, secrets) parsed by the one grammar of
//! [`crate::values`]; [`parse`] then runs every section's own checks and reports **every**
//! problem at once, each as `file:line:column`: each top-level section is deserialized on its
//! own (so a bad `[job]` does not hide a bad `[daemon]`), each `[[channel]]` and `[[route]]`
//! entry too, and the sections' checks ([`crate::values::Problem`]) are placed at their keys.
//! An unknown key is an error with a "did you mean" suggestion.
//!
//! [`Setup::load`] adds what needs the rules: the rule files themselves, `[rules.params]`
//! against the loaded rules, and each rule's `action: "exec:NAME"` against `[[actions.exec]]`.
//! `check`, `daemon` and `run`/`attach` all load through it, so they accept and reject the same
//! files with the same messages.
//!
//! Each section's type is owned by the module that uses it; this module assembles them and sits
//! above them in the layers (`docs/architecture.md`): nothing below imports it.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Deserialize;
use toml::de::{DeTable, DeValue, ValueDeserializer};
use toml::Spanned;

pub use crate::values::{line_col, parse_duration_ms};
use crate::values::{DurationSetting, IntervalSetting};

/// The whole configuration file.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// `[daemon]`: sampling and state.
    pub daemon: DaemonSection,
    /// `[rules]`: evaluation interval, budget, extra rule directories, stock-rule parameter
    /// overrides (owned by `rules`).
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
    /// `[report]`: energy price and carbon intensity for `gpuwatch report` (owned by `report`).
    pub report: crate::report::ReportSection,
    /// `[exporter]`: the daemon's `/metrics` listener (owned by `exporter`).
    pub exporter: crate::exporter::ExporterSection,
    /// `[digest]`: who used the GPUs, sent on a schedule (owned by `usage`).
    pub digest: crate::usage::DigestSection,
    /// `[recording]`: the daemon's own metric log (owned by `record`).
    pub recording: crate::record::RecordingSection,
    /// `[kubernetes]`: the kubelet's PodResources socket (owned by `sys::podresources`).
    pub kubernetes: crate::sys::podresources::KubernetesSection,
    /// Directory the config file lives in; relative paths in it resolve against this.
    pub base_dir: PathBuf,
    /// The config file's path (for messages).
    pub path: PathBuf,
    /// The config file's text (to turn spans into `line:column`).
    pub text: String,
}

/// The top-level sections, in the order `config.example.toml` documents them.
const SECTIONS: &[&str] = &[
    "daemon",
    "rules",
    "notify",
    "channel",
    "route",
    "actions",
    "job",
    "report",
    "exporter",
    "digest",
    "recording",
    "kubernetes",
];

impl Config {
    /// The built-in configuration used when no file is given: defaults, with the state under
    /// `~/.local/state/gpuwatch` (a user without a config is not root).
    pub fn builtin() -> Config {
        let mut c = Config::default();
        if let Some(home) = std::env::var_os("HOME") {
            c.daemon.state_dir = PathBuf::from(home).join(".local/state/gpuwatch");
        }
        c
    }

    /// `[daemon] hostname`, or when unset: in a Kubernetes pod (`KUBERNETES_SERVICE_HOST` set)
    /// the node's name from `NODE_NAME` (the DaemonSet sets it from `spec.nodeName`: a pod's
    /// own host name is the pod's name), else the machine's host name.
    pub fn hostname(&self) -> String {
        if !self.daemon.hostname.is_empty() {
            return self.daemon.hostname.clone();
        }
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        if let (Some(_), Some(node)) = (env("KUBERNETES_SERVICE_HOST"), env("NODE_NAME")) {
            return node.trim().to_string();
        }
        crate::sys::hostname()
    }

    /// The state directory (a relative path resolves against the config file's directory).
    pub fn state_dir(&self) -> PathBuf {
        self.resolve(&self.daemon.state_dir)
    }

    /// Where the daemon's recording lives: `[recording] dir`, else `state_dir/recording`.
    pub fn recording_dir(&self) -> PathBuf {
        if self.recording.dir.as_os_str().is_empty() {
            self.state_dir().join("recording")
        } else {
            self.resolve(&self.recording.dir)
        }
    }

    /// `p` resolved against the config file's directory when relative.
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base_dir.join(p)
        }
    }

    /// The sampling interval.
    pub fn interval(&self) -> std::time::Duration {
        self.daemon.interval.as_std()
    }

    /// `sampler` with this file's NVML call timeout, GPM switch (off when either says off) and
    /// GPM cadence.
    pub fn sampler_config(
        &self,
        sampler: &crate::sampler::SamplerConfig,
    ) -> crate::sampler::SamplerConfig {
        crate::sampler::SamplerConfig {
            call_timeout: self.daemon.nvml_timeout.as_std(),
            gpm: sampler.gpm && self.daemon.gpm,
            gpm_interval: self.daemon.gpm_interval.as_std(),
            pod_resources: self.kubernetes.socket().map(|p| self.resolve(p)),
            ..sampler.clone()
        }
    }

    /// What the start-up check of the expected GPUs reads: the history in the state directory
    /// and `[daemon] expected_gpus`; `record` writes the enumerated GPUs into the history.
    pub fn expected_options(&self, record: bool) -> crate::sampler::expected::ExpectedOptions {
        crate::sampler::expected::ExpectedOptions {
            state_dir: Some(self.state_dir()),
            expected_gpus: self.daemon.expected_gpus,
            record,
        }
    }

    /// Engine options: the host name, `[rules] eval_interval` and `[daemon] interval`.
    pub fn engine_options(&self, hostname: &str) -> crate::engine::EngineOptions {
        crate::engine::EngineOptions {
            hostname: hostname.to_string(),
            eval_interval_ms: self.rules.eval_interval_ms(),
            sample_interval_ms: Some(self.daemon.interval.ms),
            clock_speed: crate::sys::clock_speed(),
        }
    }

    /// `[actions]` with a relative `audit_log` resolved against the config file's directory.
    pub fn actions_resolved(&self) -> crate::action::ActionsSection {
        let mut actions = self.actions.clone();
        if let Some(p) = &actions.kill.audit_log {
            actions.kill.audit_log = Some(self.resolve(p));
        }
        actions
    }

    /// The kill/exec runner for this configuration.
    pub fn action_runner(&self, hostname: &str) -> crate::action::ActionRunner {
        crate::action::ActionRunner::new(&self.actions_resolved(), &self.state_dir(), hostname)
    }

    /// The notification settings (channels with secrets resolved, routes, quiet hours, …).
    pub fn notify_settings(&self) -> anyhow::Result<crate::notify::settings::NotifySettings> {
        let hostname = self.hostname();
        crate::notify::settings::NotifySettings::from_config(
            &crate::notify::settings::NotifyConfig {
                notify: &self.notify,
                channels: &self.channel,
                routes: &self.route,
                hostname: &hostname,
                base_dir: &self.base_dir,
                path: &self.path,
                text: &self.text,
            },
        )
    }
}

/// The rule paths for commands: `explicit` (`--rules DIR`) when given; else `[daemon] rules`
/// and `[rules] dirs` relative to the config file (those that exist); else `./rules`; else the
/// stock `rules/` directory shipped with gpuwatch.
pub fn rule_paths(explicit: &[PathBuf], config: Option<&Config>) -> Vec<PathBuf> {
    if !explicit.is_empty() {
        return explicit.to_vec();
    }
    if let Some(c) = config {
        let mut out: Vec<PathBuf> = c
            .daemon
            .rules
            .iter()
            .chain(&c.rules.dirs)
            .map(|p| c.base_dir.join(p))
            .collect();
        out.dedup();
        if out.iter().any(|p| p.exists()) {
            out.retain(|p| p.exists());
            return out;
        }
    }
    let cwd = PathBuf::from("rules");
    if cwd.is_dir() {
        return vec![cwd];
    }
    if let Some(dir) = crate::rules::shipped_rules_dir() {
        return vec![dir];
    }
    vec![cwd]
}

/// `[daemon]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DaemonSection {
    /// Sampling interval, e.g. `"1s"` (100 ms to 1 h).
    pub interval: IntervalSetting,
    /// Where alert state and the outbox live.
    pub state_dir: PathBuf,
    /// Rule directories or files, relative to the config file.
    pub rules: Vec<PathBuf>,
    /// Host name put in alerts and messages (default: the machine's host name).
    pub hostname: String,
    /// How long one NVML call may block before its GPU is reported stalled.
    pub nvml_timeout: DurationSetting,
    /// How many GPUs this machine should have (`gpu_missing` when fewer answer); `None` = the
    /// GPUs on the PCI bus and those seen before.
    pub expected_gpus: Option<u32>,
    /// A group whose members may also use the control socket (`gpuwatch alerts`, `silence`,
    /// `reload`); unset = the daemon's user only.
    pub control_group: Option<String>,
    /// Read the GPM profiling metrics (SM active, tensor and DRAM activity, …) on GPUs that
    /// have GPM (Hopper and later); `false` leaves them absent and saves the sample each tick.
    pub gpm: bool,
    /// How often a GPU's GPM sample is taken (each value is the mean between two samples, so a
    /// longer cadence loses no time, only resolution); `0s` = at every sample.
    pub gpm_interval: DurationSetting,
}

impl DaemonSection {
    /// The section's own checks.
    pub fn validate(&self) -> Vec<crate::values::Problem> {
        use crate::values::Problem;
        let mut out = Vec::new();
        if !(100..=60_000).contains(&self.nvml_timeout.ms) {
            out.push(Problem::at(
                "daemon.nvml_timeout",
                "must be between 100ms and 60s (real calls take up to ~20 ms; a longer one is a wedged driver)",
            ));
        }
        if !(0..=3_600_000).contains(&self.gpm_interval.ms) {
            out.push(Problem::at(
                "daemon.gpm_interval",
                "must be between 0s (every sample) and 1h",
            ));
        }
        if self.expected_gpus.is_some_and(|n| !(1..=64).contains(&n)) {
            out.push(Problem::at("daemon.expected_gpus", "must be 1 to 64"));
        }
        if let Some(g) = &self.control_group {
            if crate::sys::group_id(g).is_none() {
                out.push(Problem::at(
                    "daemon.control_group",
                    format!("no group {g:?} on this machine"),
                ));
            }
        }
        out
    }
}

impl Default for DaemonSection {
    fn default() -> Self {
        DaemonSection {
            interval: IntervalSetting::from_ms(1000),
            state_dir: PathBuf::from("/var/lib/gpuwatch"),
            rules: vec![PathBuf::from("rules/")],
            hostname: String::new(),
            nvml_timeout: DurationSetting::from_ms(1000),
            expected_gpus: None,
            control_group: None,
            gpm: true,
            gpm_interval: DurationSetting::from_ms(10_000),
        }
    }
}

/// A configuration error that points into the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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

/// Every problem found in a configuration, in file order; displayed one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl std::ops::Deref for ConfigErrors {
    type Target = [ConfigError];

    fn deref(&self) -> &[ConfigError] {
        &self.0
    }
}

/// Turns byte offsets and key paths into [`ConfigError`]s for one file.
struct Locator<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Locator<'_> {
    fn at(&self, offset: usize, message: impl Into<String>) -> ConfigError {
        let (line, column) = line_col(self.text, offset);
        ConfigError {
            path: self.path.display().to_string(),
            line,
            column,
            message: message.into(),
        }
    }

    fn toml(&self, e: &toml::de::Error) -> ConfigError {
        let offset = e.span().map_or(0, |s| s.start);
        self.at(offset, with_suggestion(e.message()))
    }
}

/// Deserializes one value of the document into `T`; errors keep their place in the file. serde
/// stops at the first bad key, so that key is reported, left out, and the rest tried again: every
/// bad key of a section is reported at once (a nested table with a problem counts as one key).
fn section<T: DeserializeOwned>(
    v: &Spanned<DeValue<'_>>,
    loc: &Locator<'_>,
) -> Result<T, Vec<ConfigError>> {
    let mut v = v.clone();
    let mut errors = Vec::new();
    let mut removed: Vec<String> = Vec::new();
    loop {
        let e = match T::deserialize(ValueDeserializer::from(v.clone())) {
            Ok(t) if errors.is_empty() => return Ok(t),
            Ok(_) => return Err(errors),
            Err(e) => e,
        };
        // A key left out that the struct requires is not a new problem.
        if removed
            .iter()
            .any(|k| e.message() == format!("missing field `{k}`"))
        {
            return Err(errors);
        }
        errors.push(loc.toml(&e));
        let Some(at) = e.span().map(|s| s.start) else {
            return Err(errors);
        };
        let DeValue::Table(table) = v.get_mut() else {
            return Err(errors);
        };
        let key = table
            .iter()
            .find(|(k, val)| k.span().start <= at && at < val.span().end.max(k.span().end))
            .map(|(k, _)| k.clone());
        match key {
            Some(k) => {
                removed.push(k.get_ref().to_string());
                table.remove(&k);
            }
            None => return Err(errors),
        }
    }
}

/// Deserializes an array of tables entry by entry, so each bad entry is reported.
fn entries<T: DeserializeOwned>(
    v: &Spanned<DeValue<'_>>,
    loc: &Locator<'_>,
    errors: &mut Vec<ConfigError>,
) -> Vec<T> {
    match v.get_ref() {
        DeValue::Array(items) => items
            .iter()
            .filter_map(|item| section(item, loc).map_err(|e| errors.extend(e)).ok())
            .collect(),
        _ => {
            errors.push(loc.at(v.span().start, "expected an array of tables (`[[…]]`)"));
            Vec::new()
        }
    }
}

/// Parses a config from text; `path` is used in messages and to resolve relative paths. Runs
/// every section's checks and returns every problem.
pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigErrors> {
    let loc = Locator { path, text };
    let root = DeTable::parse(text).map_err(|e| ConfigErrors(vec![loc.toml(&e)]))?;
    let mut config = Config::default();
    let mut errors = Vec::new();
    for (key, value) in root.get_ref() {
        let name: &str = key.get_ref().as_ref();
        let result = match name {
            "daemon" => section(value, &loc).map(|s| config.daemon = s),
            "rules" => section(value, &loc).map(|s| config.rules = s),
            "notify" => section(value, &loc).map(|s| config.notify = s),
            "actions" => section(value, &loc).map(|s| config.actions = s),
            "job" => section(value, &loc).map(|s| config.job = s),
            "report" => section(value, &loc).map(|s| config.report = s),
            "exporter" => section(value, &loc).map(|s| config.exporter = s),
            "digest" => section(value, &loc).map(|s| config.digest = s),
            "recording" => section(value, &loc).map(|s| config.recording = s),
            "kubernetes" => section(value, &loc).map(|s| config.kubernetes = s),
            "channel" => {
                config.channel = entries(value, &loc, &mut errors);
                Ok(())
            }
            "route" => {
                config.route = entries(value, &loc, &mut errors);
                Ok(())
            }
            other => Err(vec![loc.at(
                key.span().start,
                with_suggestion(&format!(
                    "unknown section `{other}`, expected one of {}",
                    SECTIONS
                        .iter()
                        .map(|s| format!("`{s}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            )]),
        };
        if let Err(e) = result {
            errors.extend(e);
        }
    }
    let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let problems = config
        .daemon
        .validate()
        .into_iter()
        .chain(config.rules.validate())
        .chain(config.actions.validate())
        .chain(config.job.validate())
        .chain(config.report.validate())
        .chain(config.exporter.validate())
        .chain(config.digest.validate())
        .chain(config.recording.validate());
    for p in problems {
        errors.push(loc.at(crate::values::key_offset(&root, &p.key), p.message));
    }
    config.base_dir = base_dir;
    config.path = path.to_path_buf();
    config.text = text.to_string();
    if errors.is_empty() {
        Ok(config)
    } else {
        errors.sort_by_key(|e| (e.line, e.column));
        errors.dedup();
        Err(ConfigErrors(errors))
    }
}

/// Rule paths the file names (`[daemon] rules`, `[rules] dirs`) must exist: a typo would
/// otherwise silently fall back to other rules. (Left at its default, `rules/` next to the file
/// is only tried.) Checked by [`Setup::load`], where the rules are needed.
fn missing_rule_paths(config: &Config) -> Vec<ConfigError> {
    let Ok(root) = DeTable::parse(&config.text) else {
        return Vec::new();
    };
    let loc = Locator {
        path: &config.path,
        text: &config.text,
    };
    let base_dir = &config.base_dir;
    let given = |section: &str, key: &str| {
        root.get_ref()
            .iter()
            .find(|(k, _)| k.get_ref().as_ref() == section)
            .and_then(|(_, v)| match v.get_ref() {
                DeValue::Table(t) => Some(t.iter().any(|(k, _)| k.get_ref().as_ref() == key)),
                _ => None,
            })
            .unwrap_or(false)
    };
    let mut out = Vec::new();
    for (section, key, paths) in [
        ("daemon", "rules", &config.daemon.rules),
        ("rules", "dirs", &config.rules.dirs),
    ] {
        if !given(section, key) {
            continue;
        }
        for (i, p) in paths.iter().enumerate() {
            let full = if p.is_absolute() {
                p.clone()
            } else {
                base_dir.join(p)
            };
            if !full.exists() {
                out.push(loc.at(
                    crate::values::key_offset(&root, &format!("{section}.{key}.{i}")),
                    format!("no such rule file or directory: {}", full.display()),
                ));
            }
        }
    }
    out
}

/// Reads and parses a config file.
pub fn load(path: &Path) -> anyhow::Result<Config> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read config {}: {e}", path.display()))?;
    Ok(parse(&text, path)?)
}

/// Appends "did you mean `x`?" to a serde "unknown field/variant `y`, expected one of …"
/// message when one expected name is close to the unknown one.
pub fn with_suggestion(message: &str) -> String {
    let Some(rest) = message
        .strip_prefix("unknown field `")
        .or_else(|| message.strip_prefix("unknown variant `"))
        .or_else(|| message.strip_prefix("unknown section `"))
    else {
        return message.to_string();
    };
    let Some((unknown, expected)) = rest.split_once('`') else {
        return message.to_string();
    };
    let best = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|c| (edit_distance(unknown, c), c))
        .filter(|(d, c)| *d <= (c.len().max(unknown.len()) / 3).max(1))
        .min();
    match best {
        Some((_, c)) => format!("{message}; did you mean `{c}`?"),
        None => message.to_string(),
    }
}

/// Levenshtein distance (small inputs: key names).
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// What a command runs with, validated once: the configuration, its rules and its notification
/// settings. `check`, `daemon` and `run`/`attach` all load through here.
pub struct Setup {
    /// The configuration (built-in defaults when no file was given).
    pub config: Config,
    /// Whether a file was given.
    pub from_file: bool,
    /// The rule paths in use.
    pub rule_paths: Vec<PathBuf>,
    /// The rule files' modification times, taken just before they were loaded.
    pub rules_signature: crate::rules::FilesSignature,
    /// The loaded rules.
    pub rules: crate::rules::RuleSet,
    /// Notification settings.
    pub notify: crate::notify::settings::NotifySettings,
}

impl fmt::Debug for Setup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Setup")
            .field("path", &self.config.path)
            .field("rules", &self.rules.len())
            .finish_non_exhaustive()
    }
}

/// Every problem [`Setup::load`] found, one message per line (each names its file and
/// position).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupErrors(pub Vec<String>);

impl fmt::Display for SetupErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join("\n"))
    }
}

impl std::error::Error for SetupErrors {}

impl Setup {
    /// Loads the config at `path` (built-in defaults when `None`), then the rules (`rules`
    /// overrides the config's rule paths), and checks everything that needs both. Returns every
    /// problem found.
    pub fn load(path: Option<&Path>, rules: &[PathBuf]) -> Result<Setup, SetupErrors> {
        let mut errors = Vec::new();
        let config = match path {
            Some(p) => match std::fs::read_to_string(p) {
                Ok(text) => match parse(&text, p) {
                    Ok(c) => Some(c),
                    Err(es) => {
                        errors.extend(es.iter().map(ToString::to_string));
                        None
                    }
                },
                Err(e) => {
                    return Err(SetupErrors(vec![format!(
                        "cannot read config {}: {e}",
                        p.display()
                    )]))
                }
            },
            None => Some(Config::builtin()),
        };
        // Go on with defaults so rule errors are reported together with config errors.
        let from_file = path.is_some();
        let config_ok = config.is_some();
        let config = config.unwrap_or_default();
        let notify = match config.notify_settings() {
            Ok(n) => Some(n),
            Err(e) => {
                if config_ok {
                    errors.extend(e.to_string().lines().map(str::to_string));
                }
                None
            }
        };
        if from_file && rules.is_empty() {
            errors.extend(missing_rule_paths(&config).iter().map(ToString::to_string));
        }
        if config_ok {
            // The daemon keeps its alert state and outbox there: say now if it cannot.
            if let Err(e) = crate::sys::usable_dir(&config.state_dir()) {
                let at = if from_file {
                    let (l, c) = crate::values::key_line_col(&config.text, "daemon.state_dir");
                    format!("{}:{l}:{c}: ", config.path.display())
                } else {
                    String::new()
                };
                errors.push(format!("{at}[daemon] state_dir: {e}"));
            }
        }
        let mut rule_paths = rule_paths(rules, from_file.then_some(&config));
        if !from_file && rules.is_empty() {
            // No config and no stock rules found: run with none rather than fail.
            rule_paths.retain(|p| p.exists());
        }
        let rules_signature = crate::rules::files_signature(&rule_paths);
        let set = match crate::rules::RuleSet::load(&rule_paths, &config.rules) {
            Ok(set) => Some(set),
            Err(es) => {
                errors.extend(es.iter().map(ToString::to_string));
                None
            }
        };
        if let Some(set) = &set {
            let file = config.path.display().to_string();
            for p in set.check_params(&config.rules) {
                errors.push(format!("{file}: {p}"));
            }
            errors.extend(check_rule_actions(set, &config));
        }
        match (errors.is_empty(), set, notify) {
            (true, Some(rules), Some(notify)) => Ok(Setup {
                config,
                from_file,
                rule_paths,
                rules_signature,
                rules,
                notify,
            }),
            _ => Err(SetupErrors(errors)),
        }
    }
}

/// Every rule `action: "exec:NAME"` must name an `[[actions.exec]]` entry: a typo would
/// otherwise silently never run.
pub fn check_rule_actions(set: &crate::rules::RuleSet, config: &Config) -> Vec<String> {
    let names = config.actions.exec_names();
    let mut out = Vec::new();
    for rule in set.rules() {
        for action in &rule.spec.actions {
            let crate::model::Action::Exec(name) = action else {
                continue;
            };
            if names.contains(&name.as_str()) {
                continue;
            }
            let mut msg = format!(
                "rule `{}`: action \"exec:{name}\" names no [[actions.exec]] entry",
                rule.spec.name
            );
            let close = names
                .iter()
                .filter(|n| edit_distance(n, name) <= (name.len() / 3).max(1))
                .min_by_key(|n| edit_distance(n, name));
            match close {
                Some(c) => msg.push_str(&format!("; did you mean \"exec:{c}\"?")),
                None if names.is_empty() => msg.push_str(" (the config defines none)"),
                None => msg.push_str(&format!(" (defined: {})", names.join(", "))),
            }
            out.push(format!("{}:{}:1: {msg}", rule.file, rule.line.max(1)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_point_into_the_file() {
        let err = parse("[daemon]\ninterval = true\n", Path::new("c.toml")).unwrap_err();
        assert_eq!((err[0].line, err[0].column), (2, 12), "{err}");
        assert!(err.to_string().starts_with("c.toml:2:12: "), "{err}");
    }

    #[test]
    fn every_section_is_reported_at_once() {
        let text = "[daemon]\ninterval = \"5ms\"\n\n[job]\ntick = \"1ms\"\n\n[rules]\nbudget = \"1m\"\n\n[actions.kill]\nterm_timeout = \"0s\"\n";
        let err = parse(text, Path::new("c.toml")).unwrap_err();
        let lines: Vec<usize> = err.iter().map(|e| e.line).collect();
        assert_eq!(lines, vec![2, 5, 8, 11], "{err}");
        assert!(err[0].message.contains("shortest interval"), "{err}");
    }

    #[test]
    fn every_bad_key_of_a_section_is_reported() {
        let text = "[daemon]\ninterval = true\nstate_dir = 3\nhostnam = \"x\"\nrules = [\"r\"]\n";
        let err = parse(text, Path::new("c.toml")).unwrap_err();
        let lines: Vec<usize> = err.iter().map(|e| e.line).collect();
        assert_eq!(lines, vec![2, 3, 4], "{err}");
        assert!(err[2].message.contains("did you mean `hostname`?"), "{err}");
    }

    #[test]
    fn notify_durations_are_typed() {
        let text = "[notify]\ngroup_wait = \"soon\"\nretry_max = \"5 parsecs\"\n\n[[route]]\nchannels = []\nrepeat_interval = \"often\"\n";
        let err = parse(text, Path::new("c.toml")).unwrap_err();
        let at: Vec<(usize, usize)> = err.iter().map(|e| (e.line, e.column)).collect();
        assert_eq!(at, vec![(2, 14), (3, 13), (7, 19)], "{err}");
        assert!(
            err.iter().all(|e| e.message.contains("invalid duration")),
            "{err}"
        );
    }

    #[test]
    fn unknown_keys_suggest() {
        let err = parse("[daemon]\nintervall = \"1s\"\n", Path::new("c.toml")).unwrap_err();
        assert!(err[0].message.contains("did you mean `interval`?"), "{err}");
        let err = parse("[deamon]\n", Path::new("c.toml")).unwrap_err();
        assert!(err[0].message.contains("did you mean `daemon`?"), "{err}");
        assert_eq!((err[0].line, err[0].column), (1, 2), "{err}");
    }

    #[test]
    fn suggestions_only_when_close() {
        assert_eq!(edit_distance("intervall", "interval"), 1);
        let m = with_suggestion("unknown field `zzz`, expected `interval` or `rules`");
        assert!(!m.contains("did you mean"), "{m}");
    }
}
