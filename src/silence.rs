//! Silences, as Alertmanager has them: a set of label matchers (`alertname=low_utilization`,
//! `gpu=~"3|4"`, `severity!=critical`, `hostname!~"lab-.*"`), a time span, a comment, and here
//! optionally a job (`--until-job PID`: the silence ends when that process does). A silenced
//! alert is still evaluated, recorded and exported; its notifications are not sent and kill
//! actions it asks for are held. Silences persist in `state_dir/silences.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// How a matcher compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// `=`
    Eq,
    /// `!=`
    Ne,
    /// `=~` (anchored regex)
    Re,
    /// `!~`
    Nre,
}

/// One label matcher.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Matcher {
    pub name: String,
    pub op: Op,
    pub value: String,
}

impl Matcher {
    /// Parses `name=value`, `name!=value`, `name=~re`, `name!~re` (value optionally in double
    /// quotes). The error names the 1-based column.
    pub fn parse(s: &str) -> Result<Matcher, (usize, String)> {
        let name_len = s
            .char_indices()
            .find(|(_, c)| !(c.is_ascii_alphanumeric() || *c == '_'))
            .map_or(s.len(), |(i, _)| i);
        let name = &s[..name_len];
        if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
            return Err((
                1,
                format!("`{s}`: a matcher starts with a label name (alertname=…)"),
            ));
        }
        let rest = &s[name_len..];
        let (op, value) = if let Some(v) = rest.strip_prefix("=~") {
            (Op::Re, v)
        } else if let Some(v) = rest.strip_prefix("!~") {
            (Op::Nre, v)
        } else if let Some(v) = rest.strip_prefix("!=") {
            (Op::Ne, v)
        } else if let Some(v) = rest.strip_prefix('=') {
            (Op::Eq, v)
        } else {
            return Err((
                name_len + 1,
                format!("`{s}`: expected =, !=, =~ or !~ after `{name}`"),
            ));
        };
        let value_col = s.len() - value.len() + 1;
        let value = match value.strip_prefix('"') {
            Some(q) => q
                .strip_suffix('"')
                .ok_or_else(|| (value_col, format!("`{s}`: unterminated quote")))?
                .replace("\\\"", "\""),
            None => value.to_string(),
        };
        let m = Matcher {
            name: name.to_string(),
            op,
            value,
        };
        if matches!(op, Op::Re | Op::Nre) {
            regex::Regex::new(&format!("^(?:{})$", m.value))
                .map_err(|e| (value_col, format!("`{s}`: bad regex: {e}")))?;
        }
        Ok(m)
    }

    /// Whether `labels` satisfy the matcher (a missing label reads as empty, as in Alertmanager).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let v = labels.get(&self.name).map_or("", String::as_str);
        let re =
            || regex::Regex::new(&format!("^(?:{})$", self.value)).is_ok_and(|r| r.is_match(v));
        match self.op {
            Op::Eq => v == self.value,
            Op::Ne => v != self.value,
            Op::Re => re(),
            Op::Nre => !re(),
        }
    }
}

impl std::fmt::Display for Matcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let op = match self.op {
            Op::Eq => "=",
            Op::Ne => "!=",
            Op::Re => "=~",
            Op::Nre => "!~",
        };
        write!(f, "{}{op}{:?}", self.name, self.value)
    }
}

/// The longest silence: a year and a day. Longer is a typo (`--for 10000000d`), not a plan.
pub const MAX_SILENCE_MS: i64 = 366 * 86_400_000;
/// The longest comment, in characters.
pub const MAX_COMMENT_CHARS: usize = 1024;
/// The most matchers one silence takes.
pub const MAX_MATCHERS: usize = 32;
/// The largest process id Linux hands out (`PID_MAX_LIMIT`, 2²²).
pub const MAX_PID: u64 = 4_194_304;

/// A `silence_add` request, checked: every field within its bounds, an error naming the field
/// otherwise (a duration of `u64::MAX` or `1e300` is no silence of an hour, a pid of `-1` or `"1"`
/// is no pid to drop silently).
#[derive(Debug, Clone, PartialEq)]
pub struct AddRequest {
    pub matchers: Vec<Matcher>,
    pub for_ms: i64,
    pub comment: String,
    pub until_pid: Option<u32>,
    /// The job's start time (clock ticks since boot, `/proc/PID/stat` field 22) as the asker
    /// saw it: with the pid, the job's identity across PID reuse.
    pub until_start: Option<u64>,
}

impl AddRequest {
    /// Checks the JSON fields of a control-socket request (`matchers`, `for_ms`, `comment`,
    /// `until_pid`; `for_ms` defaults to one hour, the others to none).
    pub fn from_json(ask: &serde_json::Value) -> Result<AddRequest, String> {
        let list = match &ask["matchers"] {
            serde_json::Value::Array(a) => a,
            _ => return Err("matchers: must be an array of matcher strings".into()),
        };
        if list.is_empty() {
            return Err("matchers: a silence needs at least one matcher".into());
        }
        if list.len() > MAX_MATCHERS {
            return Err(format!("matchers: at most {MAX_MATCHERS}"));
        }
        let mut matchers = Vec::with_capacity(list.len());
        for (i, m) in list.iter().enumerate() {
            let text = m
                .as_str()
                .ok_or_else(|| format!("matchers[{i}]: must be a string"))?;
            matchers.push(
                Matcher::parse(text)
                    .map_err(|(col, e)| format!("matchers[{i}] column {col}: {e}"))?,
            );
        }
        let for_ms = match &ask["for_ms"] {
            serde_json::Value::Null => 3_600_000,
            v => v
                .as_i64()
                .filter(|ms| (1..=MAX_SILENCE_MS).contains(ms))
                .ok_or_else(|| {
                    format!("for_ms: must be a whole number of milliseconds from 1 to {MAX_SILENCE_MS} (366 days); got {v}")
                })?,
        };
        let comment = match &ask["comment"] {
            serde_json::Value::Null => String::new(),
            serde_json::Value::String(c) if c.chars().count() <= MAX_COMMENT_CHARS => c.clone(),
            serde_json::Value::String(_) => {
                return Err(format!("comment: at most {MAX_COMMENT_CHARS} characters"))
            }
            _ => return Err("comment: must be a string".into()),
        };
        let until_pid = match &ask["until_pid"] {
            serde_json::Value::Null => None,
            v => Some(
                v.as_u64()
                    .filter(|p| (1..=MAX_PID).contains(p))
                    .and_then(|p| u32::try_from(p).ok())
                    .ok_or_else(|| {
                        format!("until_pid: must be a process id from 1 to {MAX_PID}; got {v}")
                    })?,
            ),
        };
        let until_start = match &ask["until_start"] {
            serde_json::Value::Null => None,
            v => Some(v.as_u64().ok_or_else(|| {
                format!("until_start: must be a process start time in clock ticks; got {v}")
            })?),
        };
        if until_start.is_some() && until_pid.is_none() {
            return Err("until_start: needs until_pid".into());
        }
        Ok(AddRequest {
            matchers,
            for_ms,
            comment,
            until_pid,
            until_start,
        })
    }
}

/// One silence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Silence {
    pub id: String,
    pub matchers: Vec<Matcher>,
    pub starts_ms: i64,
    pub ends_ms: i64,
    pub comment: String,
    pub created_by: String,
    /// Ends when this process does.
    #[serde(default)]
    pub until_pid: Option<u32>,
    /// ... the process of `until_pid` that started at this time (clock ticks since boot): a
    /// later process that reuses the pid is not the job.
    #[serde(default)]
    pub until_start: Option<u64>,
}

impl Silence {
    /// Active at `now_ms`.
    pub fn active(&self, now_ms: i64) -> bool {
        self.starts_ms <= now_ms && now_ms < self.ends_ms
    }

    /// Whether it silences an alert with `labels` at `now_ms`.
    pub fn silences(&self, labels: &BTreeMap<String, String>, now_ms: i64) -> bool {
        self.active(now_ms) && self.matchers.iter().all(|m| m.matches(labels))
    }
}

/// The daemon's silences, persisted.
#[derive(Debug, Default)]
pub struct Silences {
    path: Option<PathBuf>,
    list: Vec<Silence>,
}

#[derive(Serialize, Deserialize)]
struct File {
    silences: Vec<Silence>,
}

impl Silences {
    /// Loads `state_dir/silences.json` (none when it does not exist; an unreadable one is an
    /// error naming it).
    pub fn load(state_dir: &Path) -> anyhow::Result<Silences> {
        let path = state_dir.join("silences.json");
        let list = match std::fs::read(&path) {
            Ok(bytes) => {
                let f: File = serde_json::from_slice(&bytes)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                f.silences
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(anyhow::anyhow!("{}: {e}", path.display())),
        };
        Ok(Silences {
            path: Some(path),
            list,
        })
    }

    fn save(&self) -> anyhow::Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let json = serde_json::to_vec_pretty(&File {
            silences: self.list.clone(),
        })?;
        crate::sys::write_atomic(path, &json)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
    }

    /// Adds a silence; its id.
    pub fn add(&mut self, mut s: Silence) -> anyhow::Result<String> {
        let seed = format!("{}{:?}{}", s.starts_ms, s.matchers, self.list.len());
        s.id = crate::sys::fnv1a64_hex(seed.bytes());
        let id = s.id.clone();
        self.list.push(s);
        self.save()?;
        Ok(id)
    }

    /// Ends silence `id` now (`false` when there is none of that id still active).
    pub fn expire(&mut self, id: &str, now_ms: i64) -> anyhow::Result<bool> {
        let Some(s) = self
            .list
            .iter_mut()
            .find(|s| s.id == id && s.ends_ms > now_ms)
        else {
            return Ok(false);
        };
        s.ends_ms = now_ms;
        self.save()?;
        Ok(true)
    }

    /// Ends the silences whose job has exited (`alive(pid, start)` false: no such process, or
    /// another one that reused the pid); drops those ended more than a day ago.
    pub fn housekeeping(
        &mut self,
        now_ms: i64,
        alive: impl Fn(u32, Option<u64>) -> bool,
    ) -> anyhow::Result<()> {
        let mut changed = false;
        for s in &mut self.list {
            if s.active(now_ms) && s.until_pid.is_some_and(|p| !alive(p, s.until_start)) {
                s.ends_ms = now_ms;
                changed = true;
            }
        }
        let before = self.list.len();
        self.list.retain(|s| s.ends_ms > now_ms - 86_400_000);
        if changed || self.list.len() != before {
            self.save()?;
        }
        Ok(())
    }

    /// The active silence that silences `labels`, if any.
    pub fn silencing(&self, labels: &BTreeMap<String, String>, now_ms: i64) -> Option<&Silence> {
        self.list.iter().find(|s| s.silences(labels, now_ms))
    }

    /// Every silence (active and recently ended).
    pub fn list(&self) -> &[Silence] {
        &self.list
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn add_requests_are_checked_field_by_field() {
        let ok = AddRequest::from_json(&serde_json::json!({
            "matchers": ["gpu=0"], "for_ms": 60_000, "comment": "maintenance", "until_pid": 42
        }))
        .unwrap();
        assert_eq!((ok.for_ms, ok.until_pid), (60_000, Some(42)));
        let default = AddRequest::from_json(&serde_json::json!({"matchers": ["gpu=0"]})).unwrap();
        assert_eq!((default.for_ms, default.until_pid), (3_600_000, None));
        for (ask, field) in [
            (
                serde_json::json!({"matchers": ["gpu=0"], "for_ms": u64::MAX}),
                "for_ms",
            ),
            (
                serde_json::json!({"matchers": ["gpu=0"], "for_ms": 1e300}),
                "for_ms",
            ),
            (
                serde_json::json!({"matchers": ["gpu=0"], "for_ms": i64::MAX}),
                "for_ms",
            ),
            (
                serde_json::json!({"matchers": ["gpu=0"], "until_pid": -1}),
                "until_pid",
            ),
            (
                serde_json::json!({"matchers": ["gpu=0"], "until_pid": "1"}),
                "until_pid",
            ),
            (serde_json::json!({"matchers": []}), "matchers"),
            (serde_json::json!({"matchers": "gpu=0"}), "matchers"),
            (serde_json::json!({"matchers": ["gpu=~\"("]}), "matchers[0]"),
            (
                serde_json::json!({"matchers": ["gpu=0"], "comment": "x".repeat(2000)}),
                "comment",
            ),
        ] {
            let e = AddRequest::from_json(&ask).unwrap_err();
            assert!(e.starts_with(field), "{ask}: {e}");
        }
    }

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    #[test]
    fn alertmanager_matcher_syntax() {
        let l = labels(&[("alertname", "low_utilization"), ("gpu", "3")]);
        for (m, want) in [
            ("alertname=low_utilization", true),
            ("gpu=~\"3|4\"", true),
            ("gpu=~3|4", true),
            ("gpu!~\"3|4\"", false),
            ("gpu!=3", false),
            ("severity=", true),
            ("gpu=~3.", false),
        ] {
            assert_eq!(Matcher::parse(m).unwrap().matches(&l), want, "{m}");
        }
        assert_eq!(Matcher::parse("gpu~3").unwrap_err().0, 4);
        assert_eq!(Matcher::parse("=3").unwrap_err().0, 1);
        assert_eq!(Matcher::parse("gpu=~\"(3\"").unwrap_err().0, 6);
        assert_eq!(Matcher::parse("gpu=\"3").unwrap_err().0, 5);
    }

    #[test]
    fn persist_expire_and_jobs() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Silences::load(dir.path()).unwrap();
        let id = s
            .add(Silence {
                id: String::new(),
                matchers: vec![Matcher::parse("gpu=3").unwrap()],
                starts_ms: 0,
                ends_ms: 1000,
                comment: "reseating GPU 3".into(),
                created_by: "alice".into(),
                until_pid: Some(42),
                until_start: Some(1000),
            })
            .unwrap();
        let s2 = Silences::load(dir.path()).unwrap();
        assert_eq!(s2.list().len(), 1);
        assert!(s2.silencing(&labels(&[("gpu", "3")]), 500).is_some());
        assert!(s2.silencing(&labels(&[("gpu", "4")]), 500).is_none());
        let mut s3 = s2;
        // The job's pid now belongs to another process (another start time): the job ended.
        s3.housekeeping(550, |pid, start| pid == 42 && start == Some(999))
            .unwrap();
        assert!(
            s3.silencing(&labels(&[("gpu", "3")]), 560).is_none(),
            "a reused pid is not the job"
        );
        s3.housekeeping(600, |_, _| false).unwrap();
        assert!(
            s3.silencing(&labels(&[("gpu", "3")]), 700).is_none(),
            "the job ended"
        );
        assert!(!s3.expire(&id, 800).unwrap(), "already ended");
    }
}
