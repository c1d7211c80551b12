//! Secrets (SMTP passwords, bot tokens, webhook URLs that embed tokens): where they come from
//! (inline, an environment variable or a file) and a [`Secret`] newtype whose `Debug` and
//! `Display` print `***`, so a secret can never reach a log line or an error message by accident.

use std::fmt;
use std::path::{Path, PathBuf};

/// A secret value. Only [`Secret::expose`] gives the text; formatting prints `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The secret text, for the one place that needs it (a request, a login).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Replaces every occurrence of this secret (if non-trivial) in `text` with `***` — and,
    /// when the secret is a URL, every token-like part of it on its own (path segments and
    /// query values, raw and percent-decoded, and a password), because receivers echo paths
    /// (`Cannot POST /robot/send?access_token=…`) and errors quote URLs in pieces.
    pub fn redact(&self, text: &str) -> String {
        if self.0.len() < 4 {
            return text.to_string();
        }
        let mut out = text.replace(&self.0, "***");
        for part in self.token_parts() {
            out = out.replace(&part, "***");
        }
        out
    }

    /// The parts of a URL secret that carry a credential: path segments and query values that
    /// look like tokens (8+ characters with a digit, or 16+), and a password. Longest first.
    fn token_parts(&self) -> Vec<String> {
        let Ok(url) = reqwest::Url::parse(&self.0) else {
            return Vec::new();
        };
        let tokenish = |s: &str| {
            let n = s.chars().count();
            n >= 16 || (n >= 8 && s.chars().any(|c| c.is_ascii_digit()))
        };
        let mut parts: Vec<String> = Vec::new();
        let mut add = |raw: &str| {
            for s in [raw.to_string(), percent_decode(raw)] {
                if tokenish(&s) && !parts.contains(&s) {
                    parts.push(s);
                }
            }
        };
        for seg in url.path_segments().into_iter().flatten() {
            add(seg);
        }
        if let Some(q) = url.query() {
            for pair in q.split('&') {
                add(pair.split_once('=').map_or(pair, |(_, v)| v));
            }
        }
        if let Some(p) = url.password() {
            add(p);
        }
        parts.sort_by_key(|p| std::cmp::Reverse(p.len()));
        parts
    }
}

/// `%XX` escapes decoded (lossy), `+` left as it is.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                #[expect(clippy::cast_possible_truncation, reason = "two hex digits")]
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Resolves one secret-valued setting given as `key = "…"`, `key_env = "VAR"` or
/// `key_file = "path"` (relative to `base_dir`). At most one may be set; `Ok(None)` when none is.
/// Errors name the key and the variable or file, never the value.
pub fn resolve(
    key: &str,
    inline: Option<&str>,
    env: Option<&str>,
    file: Option<&Path>,
    base_dir: &Path,
) -> Result<Option<Secret>, String> {
    let given =
        usize::from(inline.is_some()) + usize::from(env.is_some()) + usize::from(file.is_some());
    if given > 1 {
        return Err(format!(
            "set only one of `{key}`, `{key}_env`, `{key}_file`"
        ));
    }
    if let Some(v) = inline {
        return Ok(Some(Secret::new(v)));
    }
    if let Some(var) = env {
        return match std::env::var(var) {
            Ok(v) if !v.is_empty() => Ok(Some(Secret::new(v))),
            Ok(_) => Err(format!("`{key}_env`: environment variable {var} is empty")),
            Err(_) => Err(format!(
                "`{key}_env`: environment variable {var} is not set"
            )),
        };
    }
    if let Some(path) = file {
        let full: PathBuf = if path.is_absolute() {
            path.to_path_buf()
        } else {
            base_dir.join(path)
        };
        return match std::fs::read_to_string(&full) {
            Ok(v) => {
                let v = v.trim_end_matches(['\n', '\r']).to_string();
                if v.is_empty() {
                    Err(format!("`{key}_file`: {} is empty", full.display()))
                } else {
                    Ok(Some(Secret::new(v)))
                }
            }
            Err(e) => Err(format!("`{key}_file`: cannot read {}: {e}", full.display())),
        };
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatting_hides_the_value() {
        let s = Secret::new("hunter2-very-secret");
        assert_eq!(format!("{s}"), "***");
        assert_eq!(format!("{s:?}"), "***");
        assert_eq!(s.expose(), "hunter2-very-secret");
        assert_eq!(s.redact("url was hunter2-very-secret/x"), "url was ***/x");
    }

    /// Issue 11: tokens inside a secret URL are masked on their own, as receivers echo them.
    #[test]
    fn token_parts_of_a_url_are_masked_alone() {
        let telegram = Secret::new("https://api.telegram.org/bot123456:AAbbCCdd-EEff/sendMessage");
        assert_eq!(
            telegram.redact("Cannot POST /bot123456:AAbbCCdd-EEff/sendMessage"),
            "Cannot POST /***/sendMessage"
        );
        let ding = Secret::new("https://oapi.dingtalk.com/robot/send?access_token=0f9e8d7c6b5a4");
        assert_eq!(
            ding.redact("404 for /robot/send?access_token=0f9e8d7c6b5a4"),
            "404 for /robot/send?access_token=***"
        );
        let feishu = Secret::new(
            "https://open.feishu.cn/open-apis/bot/v2/hook/6f1c2a3b-9d8e-4f00-aa11-223344556677",
        );
        assert_eq!(
            feishu.redact("hook 6f1c2a3b-9d8e-4f00-aa11-223344556677 not found"),
            "hook *** not found"
        );
        // Ordinary words of the path stay readable.
        assert!(ding.redact("robot send").contains("robot send"));
        let pass = Secret::new("https://user:s3cretpass99@example.org/x");
        assert_eq!(pass.redact("auth s3cretpass99 refused"), "auth *** refused");
        assert_eq!(percent_decode("a%2Fb%zz%é%4"), "a/b%zz%é%4");
    }

    #[test]
    fn resolves_env_and_file_without_leaking() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tok"), "filetoken\n").unwrap();
        let s = resolve("token", None, None, Some(Path::new("tok")), dir.path())
            .unwrap()
            .unwrap();
        assert_eq!(s.expose(), "filetoken");
        let err = resolve(
            "password",
            None,
            Some("GPUWATCH_TEST_UNSET_VAR_X"),
            None,
            dir.path(),
        )
        .unwrap_err();
        assert!(
            err.contains("GPUWATCH_TEST_UNSET_VAR_X is not set"),
            "{err}"
        );
        let err = resolve("url", Some("a"), Some("B"), None, dir.path()).unwrap_err();
        assert!(err.contains("only one"), "{err}");
        assert_eq!(resolve("url", None, None, None, dir.path()), Ok(None));
    }
}
