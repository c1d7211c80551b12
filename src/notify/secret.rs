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

    /// Replaces every occurrence of this secret (if non-trivial) in `text` with `***`.
    pub fn redact(&self, text: &str) -> String {
        if self.0.len() < 4 {
            return text.to_string();
        }
        text.replace(&self.0, "***")
    }
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
