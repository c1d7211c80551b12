//! The typed values config files and command lines are made of, parsed by one grammar
//! everywhere: durations (`"500ms"`, `"90s"`, `"5m"`, `"1h"`, `"2d"`, or a number of seconds),
//! regular expressions compiled once, and `line:column` positions for error messages.
//!
//! A bottom layer beside `model` and `sys`: it imports nothing from the crate.

use serde::{Deserialize, Deserializer};

/// The shortest sampling interval gpuwatch accepts anywhere (`[daemon] interval`,
/// `record --interval`), ms.
pub const MIN_INTERVAL_MS: i64 = 100;

/// The longest sampling interval, ms.
pub const MAX_INTERVAL_MS: i64 = 3_600_000;

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

/// Parses a duration (see [`parse_duration_ms`]) into a `std::time::Duration`.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let ms = parse_duration_ms(s)?;
    Ok(std::time::Duration::from_millis(ms.unsigned_abs()))
}

/// A sampling interval: a duration between [`MIN_INTERVAL_MS`] and [`MAX_INTERVAL_MS`].
pub fn parse_interval_ms(s: &str) -> Result<i64, String> {
    let ms = parse_duration_ms(s)?;
    if ms < MIN_INTERVAL_MS {
        return Err(format!(
            "interval {s:?} is below the shortest interval, {MIN_INTERVAL_MS}ms"
        ));
    }
    if ms > MAX_INTERVAL_MS {
        return Err(format!("interval {s:?} is above the longest interval, 1h"));
    }
    Ok(ms)
}

/// Parses a size: bytes, or with `K`/`KB` (1000), `KiB` (1024), `M`/`MB`, `MiB`, `G`/`GB`,
/// `GiB`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size (try 100MB or 1048576)"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1_048_576.0,
        "g" | "gb" => 1e9,
        "gib" => 1_073_741_824.0,
        u => return Err(format!("unknown size unit `{u}` in `{s}`")),
    };
    let bytes = n * mult;
    if !(1.0..1e18).contains(&bytes) {
        return Err(format!("`{s}` is not a usable size"));
    }
    Ok(bytes as u64)
}

/// `1h 2m 3s`, `4.2s`.
pub fn format_duration_ms(ms: i64) -> String {
    let ms = ms.max(0);
    if ms < 60_000 {
        return format!("{:.1}s", ms as f64 / 1000.0);
    }
    let s = ms / 1000;
    let (h, m, s) = (s / 3600, (s / 60) % 60, s % 60);
    if h > 0 {
        format!("{h}h {m}m {s}s")
    } else {
        format!("{m}m {s}s")
    }
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

/// The start of every line of a text, to turn many byte offsets into `line:column` in
/// O(log n) each ([`line_col`] scans from the start: fine for one error, quadratic for a
/// position per entry of a large file).
#[derive(Debug, Clone)]
pub struct LineIndex {
    starts: Vec<usize>,
    len: usize,
}

impl LineIndex {
    /// Indexes `text`.
    pub fn new(text: &str) -> LineIndex {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        LineIndex {
            starts,
            len: text.len(),
        }
    }

    /// 1-based line and column (in bytes) of `offset`, as [`line_col`] gives them.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.len);
        let line = self.starts.partition_point(|s| *s <= offset).max(1);
        (line, offset - self.starts[line - 1] + 1)
    }
}

/// Escapes `&`, `<`, `>` and `"` for HTML (notification bodies, the report page).
pub fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

/// Cuts `s` to at most `max` characters, ending in `…` when cut.
pub fn truncate_chars(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// `s` with control characters (newlines, escape sequences) shown as `\u{..}` escapes, so
/// output from outside cannot forge log lines or drive a terminal.
pub fn escape_control(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// [`escape_control`] for text whose line layout matters (a report, a message body): newlines
/// and tabs stay, every other control character (escape sequences, C1, DEL) is escaped.
pub fn escape_control_lines(s: &str) -> String {
    if !s.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
        return s.to_string();
    }
    s.split('\n')
        .map(|line| {
            line.split('\t')
                .map(escape_control)
                .collect::<Vec<_>>()
                .join("\t")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A problem a section's own checks found, at a dotted key path (`actions.exec.0.command`);
/// the config loader turns the path into `file:line:column`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted key path from the top of the file; array elements by index.
    pub key: String,
    /// What is wrong.
    pub message: String,
}

impl Problem {
    /// A problem at `key`.
    pub fn at(key: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// Byte offset, in the TOML document `root` was parsed from, of the value at the dotted `key`
/// (`actions.exec.0.command`; array elements by index), or of the longest prefix of the path
/// that exists (a key left at its default points at its section; 0 when even that is absent).
pub fn key_offset(root: &toml::Spanned<toml::de::DeTable<'_>>, key: &str) -> usize {
    use toml::de::DeValue;
    let mut offset = 0;
    let mut table: Option<&toml::de::DeTable<'_>> = Some(root.get_ref());
    let mut value: Option<&toml::Spanned<DeValue<'_>>> = None;
    for part in key.split('.') {
        let next = match (table, value.map(toml::Spanned::get_ref)) {
            (Some(t), _) => t
                .iter()
                .find(|(k, _)| k.get_ref().as_ref() == part)
                .map(|(_, v)| v),
            (None, Some(DeValue::Array(a))) => part.parse::<usize>().ok().and_then(|i| a.get(i)),
            _ => None,
        };
        let Some(v) = next else { break };
        offset = v.span().start;
        value = Some(v);
        table = match v.get_ref() {
            DeValue::Table(t) => Some(t),
            _ => None,
        };
    }
    offset
}

/// `(line, column)` of the value at dotted `key` in the TOML `text` (see [`key_offset`]).
pub fn key_line_col(text: &str, key: &str) -> (usize, usize) {
    let offset = toml::de::DeTable::parse(text).map_or(0, |root| key_offset(&root, key));
    line_col(text, offset)
}

/// A sampling interval: a duration from [`MIN_INTERVAL_MS`] to [`MAX_INTERVAL_MS`], checked while
/// the file is parsed (so the error points at the value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntervalSetting {
    /// The interval in milliseconds.
    pub ms: i64,
}

impl IntervalSetting {
    /// An interval of `ms` milliseconds (not checked).
    pub const fn from_ms(ms: i64) -> IntervalSetting {
        IntervalSetting { ms }
    }

    /// As a `std::time::Duration`.
    pub fn as_std(self) -> std::time::Duration {
        std::time::Duration::from_millis(u64::try_from(self.ms).unwrap_or(1000))
    }
}

impl<'de> Deserialize<'de> for IntervalSetting {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = DurationSetting::deserialize(d)?;
        let text = format!("{}ms", raw.ms);
        parse_interval_ms(&text)
            .map(IntervalSetting::from_ms)
            .map_err(serde::de::Error::custom)
    }
}

/// A regular expression from the config file, compiled once.
#[derive(Debug, Clone)]
pub struct RegexSetting(pub regex::Regex);

impl RegexSetting {
    /// Compiles `pattern`.
    pub fn new(pattern: &str) -> Result<RegexSetting, String> {
        regex::Regex::new(pattern)
            .map(RegexSetting)
            .map_err(|e| format!("invalid regex {pattern:?}: {e}"))
    }

    /// The pattern text.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl PartialEq for RegexSetting {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl<'de> Deserialize<'de> for RegexSetting {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        RegexSetting::new(&s).map_err(serde::de::Error::custom)
    }
}

/// A duration such as `"90s"`, kept in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationSetting {
    /// The duration in milliseconds.
    pub ms: i64,
}

impl DurationSetting {
    /// A duration of `ms` milliseconds.
    pub const fn from_ms(ms: i64) -> DurationSetting {
        DurationSetting { ms }
    }

    /// As a `std::time::Duration`.
    pub fn as_std(self) -> std::time::Duration {
        std::time::Duration::from_millis(u64::try_from(self.ms).unwrap_or(0))
    }
}

impl<'de> Deserialize<'de> for DurationSetting {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Seconds(u64),
        }
        let ms = match Raw::deserialize(d)? {
            Raw::Text(s) => parse_duration_ms(&s).map_err(serde::de::Error::custom)?,
            Raw::Seconds(s) => i64::try_from(s.saturating_mul(1000))
                .map_err(|_| serde::de::Error::custom("duration out of range"))?,
        };
        Ok(DurationSetting { ms })
    }
}

/// Appends a non-negative integer without going through `core::fmt`.
pub fn push_u64(out: &mut String, mut n: u64) {
    let mut buf = [0_u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // The bytes are ASCII digits.
    out.push_str(std::str::from_utf8(&buf[i..]).unwrap_or("0"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        let hostile = "a\u{1b}]52;c;eA==\u{7}b\u{1b}[2J\u{9b}c\u{7f}";
        assert_eq!(
            escape_control(hostile),
            "a\\u{1b}]52;c;eA==\\u{7}b\\u{1b}[2J\\u{9b}c\\u{7f}"
        );
        assert_eq!(escape_control("x\ny"), "x\\ny");
        // The line layout stays; everything else is escaped as above.
        assert_eq!(
            escape_control_lines(&format!("{hostile}\n\tz\r")),
            format!("{}\n\tz\\r", escape_control(hostile))
        );
        assert_eq!(escape_control_lines("plain\ttext\n"), "plain\ttext\n");
    }

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
    fn one_grammar_and_interval_bounds() {
        assert!(parse_duration_ms("1sec").is_err());
        assert_eq!(
            parse_duration("2.5s"),
            Ok(std::time::Duration::from_millis(2500))
        );
        assert_eq!(parse_interval_ms("100ms"), Ok(100));
        assert!(parse_interval_ms("5ms").is_err());
        assert!(parse_interval_ms("2h").is_err());
        assert_eq!(format_duration_ms(4_200), "4.2s");
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
        let text = "ab\ncd\n\nxyz";
        let index = LineIndex::new(text);
        for offset in 0..=text.len() + 2 {
            assert_eq!(index.line_col(offset), line_col(text, offset), "{offset}");
        }
    }
}
