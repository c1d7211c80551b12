//! Config value types that validate while the file is parsed, so a bad regex or duration is
//! reported at its `file:line:column` by the TOML parser.

use serde::{Deserialize, Deserializer};

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
            Raw::Text(s) => {
                crate::config::parse_duration_ms(&s).map_err(serde::de::Error::custom)?
            }
            Raw::Seconds(s) => i64::try_from(s.saturating_mul(1000))
                .map_err(|_| serde::de::Error::custom("duration out of range"))?,
        };
        Ok(DurationSetting { ms })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct T {
        d: DurationSetting,
        r: Option<RegexSetting>,
    }

    #[test]
    fn parse_and_point_at_errors() {
        let t: T = toml::from_str("d = \"5m\"\nr = \"^py\"\n").unwrap();
        assert_eq!(t.d.ms, 300_000);
        assert!(t.r.unwrap().0.is_match("python"));
        let t: T = toml::from_str("d = 30\n").unwrap();
        assert_eq!(t.d.ms, 30_000);
        let err = crate::config::parse("[x]\n", std::path::Path::new("c.toml"));
        assert!(err.is_err());
        let e = toml::from_str::<T>("d = \"1s\"\nr = \"(\"\n").unwrap_err();
        assert!(e.message().contains("invalid regex"), "{e}");
        assert_eq!(e.span().map(|s| s.start), Some(13));
    }
}
