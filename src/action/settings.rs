//! Config value types of `[actions]`: re-exported from [`crate::values`], where every section
//! finds them.

pub use crate::values::{DurationSetting, RegexSetting};

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

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
