//! Silences, as Alertmanager has them: a set of label matchers (`alertname=low_utilization`,
//! `gpu=~"3|4"`, `severity!=critical`, `hostname!~"lab-.*"`), a time span, a comment, and here
//! optionally a job (`--until-job PID`: the silence ends when that process does). A silenced
//! alert is still evaluated, recorded and exported; its notifications are not sent and kill
//! actions it asks for are held. Silences persist in `state_dir/silences.json` and, between two
//! compactions, `state_dir/silences.journal` (one fdatasync'd line per change: an add costs
//! O(1), not a rewrite of every silence).

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

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

/// The most memory one `=~`/`!~` matcher's compiled regex may take (its automaton; the regex
/// crate's `size_limit`): a pattern such as `a{1000}` (35 KB) passes, `\w{50}` (2.7 MB) or
/// `.{100}` does not. A Unicode class is large (`\w+` alone is 50 KB): `[a-z0-9_]+` or
/// `(?-u:\w)+` is a few hundred bytes.
pub const MAX_REGEX_BYTES: usize = 64 * 1024;

/// One label matcher. An `=~`/`!~` matcher's regex is compiled once: when the matcher is parsed,
/// or, for one read back from disk, at its first match (a restart with thousands of silences
/// does not wait for them, and a pattern never consulted costs nothing); its copies, and every
/// matcher with the same pattern, share it. It is serialized as `{"name", "op", "value"}`, as it
/// always was.
#[derive(Debug, Clone)]
pub struct Matcher {
    name: String,
    op: Op,
    value: String,
    /// `=~`/`!~`: `^(?:value)$` compiled; `None` for `=`/`!=`.
    re: Option<Arc<Compiled>>,
}

/// A regex matcher's pattern, compiled at most once. `None` inside: it does not compile within
/// [`MAX_REGEX_BYTES`] (only a pattern read back can: one written by an older gpuwatch, which
/// had no such limit), and the matcher matches nothing, so its silence silences nothing.
#[derive(Debug, Default)]
struct Compiled(std::sync::OnceLock<Option<Arc<regex::Regex>>>);

impl PartialEq for Matcher {
    fn eq(&self, other: &Matcher) -> bool {
        (&self.name, self.op, &self.value) == (&other.name, other.op, &other.value)
    }
}

impl Eq for Matcher {}

/// A matcher as it is stored and sent: the compiled regex is not part of it.
#[derive(Serialize)]
struct MatcherRef<'a> {
    name: &'a str,
    op: Op,
    value: &'a str,
}

/// A matcher read back.
#[derive(Deserialize)]
struct MatcherData {
    name: String,
    op: Op,
    value: String,
}

impl Serialize for Matcher {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        MatcherRef {
            name: &self.name,
            op: self.op,
            value: &self.value,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Matcher {
    /// Never fails on the pattern, compiled at the first match: a silence read back stays
    /// listed and expirable even when its pattern no longer compiles (it then silences nothing,
    /// and says so once in the log).
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Matcher, D::Error> {
        let MatcherData { name, op, value } = MatcherData::deserialize(deserializer)?;
        let re = matches!(op, Op::Re | Op::Nre).then(Arc::default);
        Ok(Matcher {
            name,
            op,
            value,
            re,
        })
    }
}

/// Compiled patterns, shared by every matcher with the same one (10,000 silences that say
/// `hostname=~"lab-.*"` hold one regex): pattern → the regex while some matcher holds it.
#[derive(Default)]
struct Interned {
    map: std::collections::HashMap<String, std::sync::Weak<regex::Regex>>,
    /// The map is swept of patterns no longer held when it grows to this size.
    sweep_at: usize,
}

/// `^(?:pattern)$` compiled within [`MAX_REGEX_BYTES`], or the regex already compiled for it.
fn compile(pattern: &str) -> Result<Arc<regex::Regex>, regex::Error> {
    static INTERNED: std::sync::OnceLock<Mutex<Interned>> = std::sync::OnceLock::new();
    let table = INTERNED.get_or_init(Mutex::default);
    let lock = || {
        table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    if let Some(re) = lock().map.get(pattern).and_then(std::sync::Weak::upgrade) {
        return Ok(re);
    }
    // Compiled outside the lock: other threads' matchers are not held up.
    let re = Arc::new(
        regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
            .size_limit(MAX_REGEX_BYTES)
            // No lazy DFA: its cache (7 to 50 KB per regex and per thread that matches with it)
            // would outweigh the regex; a label value is short work for the other engines.
            .dfa_size_limit(0)
            .build()?,
    );
    let mut t = lock();
    if let Some(theirs) = t.map.get(pattern).and_then(std::sync::Weak::upgrade) {
        return Ok(theirs);
    }
    t.map.insert(pattern.to_string(), Arc::downgrade(&re));
    if t.map.len() >= t.sweep_at {
        // Amortised O(1): at least as many inserts as patterns kept since the last sweep.
        t.map.retain(|_, w| w.strong_count() > 0);
        t.sweep_at = (2 * t.map.len()).max(64);
    }
    Ok(re)
}

impl Matcher {
    /// The label it looks at.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How it compares.
    pub fn op(&self) -> Op {
        self.op
    }

    /// The value or pattern it compares with.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The compiled regex of an `=~`/`!~` matcher (compiled now if it was read back and not
    /// used yet); `None` for `=`/`!=` and for a pattern that does not compile.
    fn regex(&self) -> Option<&regex::Regex> {
        let cell = self.re.as_ref()?;
        cell.0
            .get_or_init(|| match compile(&self.value) {
                Ok(re) => Some(re),
                Err(e) => {
                    tracing::warn!(
                        "silences: matcher {self} does not compile within {} KiB, so its silence silences nothing: {e}",
                        MAX_REGEX_BYTES / 1024
                    );
                    None
                }
            })
            .as_deref()
    }

    /// Whether it is an `=~`/`!~` matcher whose pattern does not compile (read back from an
    /// older gpuwatch's files): it matches nothing.
    pub fn is_broken(&self) -> bool {
        self.re.is_some() && self.regex().is_none()
    }

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
        let re = match op {
            Op::Eq | Op::Ne => None,
            Op::Re | Op::Nre => Some(compile(&value).map_err(|e| {
                (
                    value_col,
                    match e {
                        regex::Error::CompiledTooBig(_) => format!(
                            "`{s}`: the regex is too large compiled (over {} KiB); use a simpler \
                         pattern (an ASCII class such as [a-z0-9_] or (?-u:\\w) instead of \\w)",
                            MAX_REGEX_BYTES / 1024
                        ),
                        e => format!("`{s}`: bad regex: {e}"),
                    },
                )
            })?),
        };
        Ok(Matcher {
            name: name.to_string(),
            op,
            value,
            re: re.map(|re| Arc::new(Compiled(std::sync::OnceLock::from(Some(re))))),
        })
    }

    /// Whether `labels` satisfy the matcher (a missing label reads as empty, as in Alertmanager).
    /// A regex matcher whose pattern did not compile matches nothing, whichever its op.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let v = labels.get(&self.name).map_or("", String::as_str);
        match self.op {
            Op::Eq => v == self.value,
            Op::Ne => v != self.value,
            Op::Re => self.regex().is_some_and(|re| re.is_match(v)),
            Op::Nre => self.regex().is_some_and(|re| !re.is_match(v)),
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

/// The most silences kept (in force, and ended within the last day): beyond it an add first
/// drops the ended ones, and is refused when all of them are still in force. Memory and the
/// time a notification spends matching stay bounded whatever a client sends.
pub const MAX_SILENCES: usize = 20_000;
/// At most this many distinct `=~`/`!~` patterns among the silences in force (compiled, they
/// take up to [`MAX_REGEX_BYTES`] each: 16 MiB at most in all).
pub const MAX_REGEX_PATTERNS: usize = 256;
/// How long an ended silence is kept (listed as expired) before it is dropped, ms.
const KEEP_ENDED_MS: i64 = 86_400_000;
/// The journal is folded into `silences.json` once it holds more entries than this or than the
/// list holds silences, whichever is more: each fold costs one write of the list, paid for by at
/// least as many appends (amortised O(1) per change).
const COMPACT_MIN_ENTRIES: usize = 256;
/// ... and once the set has not changed for this long (ms), so that `silences.json` alone (what an
/// older gpuwatch reads) is complete soon after a change.
const COMPACT_QUIET_MS: i64 = 10_000;

/// The daemon's silences, shared by the loop that changes them and the threads that read them
/// (the pipeline's hold of kill actions, the notification dispatcher through a [`Feed`]).
pub type Shared = Arc<Mutex<Silences>>;

/// The daemon's silences, persisted: `state_dir/silences.json` (the list as of the last
/// compaction, in the format every gpuwatch reads) and `state_dir/silences.journal` (one JSON
/// line per add or expiry since, each flushed to disk with `fdatasync` before the change is
/// acknowledged). Loading replays the journal onto the list; a change costs one appended line,
/// not a rewrite of the whole list.
#[derive(Debug, Default)]
pub struct Silences {
    /// `state_dir/silences.json`; none: kept in memory only.
    path: Option<PathBuf>,
    journal: Option<Journal>,
    /// Shared with the readers' snapshots ([`Silences::snapshot`]): a change copies the list
    /// only while a reader holds a snapshot of it.
    list: Arc<Vec<Silence>>,
    /// The ids in `list` (ids are unique; a replayed add of a known id was compacted already).
    ids: HashSet<String>,
    /// When the set last changed (UTC ms).
    changed_ms: i64,
}

/// `state_dir/silences.journal`, appended to.
#[derive(Debug)]
struct Journal {
    path: PathBuf,
    /// Opened at the first write.
    file: Option<std::fs::File>,
    /// Entries in the file (replayed ones included).
    entries: usize,
    /// Its length in bytes: a write that fails half-way is cut back to it.
    len: u64,
    /// After a fold that failed: no new try before the journal holds this many entries (twice
    /// as many as then), so a broken `silences.json` does not make every change rewrite the
    /// whole list.
    retry_at: usize,
}

/// One journal line (written).
#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum EntryRef<'a> {
    Add(&'a Silence),
    Expire { id: &'a str, at_ms: i64 },
}

/// One journal line (read).
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum Entry {
    Add(Silence),
    Expire { id: String, at_ms: i64 },
}

#[derive(Deserialize)]
struct File {
    silences: Vec<Silence>,
}

#[derive(Serialize)]
struct FileRef<'a> {
    silences: &'a [Silence],
}

impl Journal {
    /// The file, opened for appending (created 0600, its directory entry made durable).
    fn file(&mut self) -> std::io::Result<&mut std::fs::File> {
        if self.file.is_none() {
            use std::os::unix::fs::OpenOptionsExt as _;
            let existed = self.path.exists();
            let f = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o600)
                .open(&self.path)?;
            if !existed {
                if let Some(dir) = self.path.parent() {
                    crate::sys::sync_dir(dir)?;
                }
            }
            self.file = Some(f);
        }
        self.file
            .as_mut()
            .ok_or_else(|| std::io::Error::other("journal not open"))
    }

    /// Appends one line and flushes it to disk; on failure the file is cut back to what it was.
    fn append(&mut self, entry: &EntryRef<'_>) -> anyhow::Result<()> {
        use std::io::Write as _;
        let mut line = serde_json::to_vec(entry)?;
        line.push(b'\n');
        let len = self.len;
        let path = self.path.clone();
        let f = self
            .file()
            .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
        if let Err(e) = f.write_all(&line).and_then(|()| f.sync_data()) {
            let _ = f.set_len(len);
            return Err(anyhow::anyhow!("cannot write {}: {e}", path.display()));
        }
        self.len += line.len() as u64;
        self.entries += 1;
        Ok(())
    }

    /// Empties the file (its entries are in `silences.json` now).
    fn clear(&mut self) -> anyhow::Result<()> {
        let path = self.path.clone();
        let f = self
            .file()
            .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
        f.set_len(0)
            .and_then(|()| f.sync_all())
            .map_err(|e| anyhow::anyhow!("cannot truncate {}: {e}", path.display()))?;
        self.len = 0;
        self.entries = 0;
        Ok(())
    }
}

impl Silences {
    /// Loads `state_dir/silences.json` and replays `state_dir/silences.journal` onto it (none
    /// when neither exists). A file that cannot be read is an error naming it. Damage is not:
    /// a `silences.json` that does not parse is moved aside to `silences.json.damaged`, a journal
    /// line that is not an entry is skipped (the journal is copied to
    /// `silences.journal.damaged` first), each said in the log naming the file and line, and the
    /// rest is loaded and kept durable — one bad byte lost every silence, and the silences added
    /// after it were acknowledged but kept in memory only. A last line cut short (a crash while
    /// it was written: never acknowledged) is dropped.
    pub fn load(state_dir: &Path) -> anyhow::Result<Silences> {
        let path = state_dir.join("silences.json");
        let list = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<File>(&bytes) {
                Ok(f) => f.silences,
                Err(e) => {
                    let aside = state_dir.join("silences.json.damaged");
                    std::fs::rename(&path, &aside).map_err(|r| {
                        anyhow::anyhow!(
                            "{}: {e}; it cannot be moved aside to {}: {r}",
                            path.display(),
                            aside.display()
                        )
                    })?;
                    tracing::warn!(
                        "{}: {e}; moved aside to {} (its silences are not in force)",
                        path.display(),
                        aside.display()
                    );
                    Vec::new()
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(anyhow::anyhow!("{}: {e}", path.display())),
        };
        let ids = list.iter().map(|s| s.id.clone()).collect();
        let mut silences = Silences {
            path: Some(path),
            journal: None,
            list: Arc::new(list),
            ids,
            // A journal left from the last run is folded in at the first housekeeping.
            changed_ms: i64::MIN,
        };
        let journal_path = state_dir.join("silences.journal");
        let bytes = match std::fs::read(&journal_path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(anyhow::anyhow!("{}: {e}", journal_path.display())),
        };
        let whole = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        let mut entries = 0;
        let mut damaged = false;
        for (n, line) in bytes
            .get(..whole)
            .unwrap_or_default()
            .split(|b| *b == b'\n')
            .enumerate()
        {
            if line.is_empty() {
                continue;
            }
            let entry: Entry = match serde_json::from_slice(line) {
                Ok(entry) => entry,
                Err(e) => {
                    let aside = state_dir.join("silences.journal.damaged");
                    if !damaged {
                        damaged = true;
                        std::fs::write(&aside, &bytes).map_err(|w| {
                            anyhow::anyhow!(
                                "{}:{}: {e}; it cannot be copied to {}: {w}",
                                journal_path.display(),
                                n + 1,
                                aside.display()
                            )
                        })?;
                    }
                    tracing::warn!(
                        "{}:{}: {e}; the line is skipped (the journal is copied to {})",
                        journal_path.display(),
                        n + 1,
                        aside.display()
                    );
                    // Counted: the fold that drops it is due like any other.
                    entries += 1;
                    continue;
                }
            };
            entries += 1;
            match entry {
                Entry::Add(s) => {
                    if silences.ids.insert(s.id.clone()) {
                        Arc::make_mut(&mut silences.list).push(s);
                    }
                }
                Entry::Expire { id, at_ms } => {
                    if let Some(s) = Arc::make_mut(&mut silences.list)
                        .iter_mut()
                        .find(|s| s.id == id)
                    {
                        s.ends_ms = s.ends_ms.min(at_ms);
                    }
                }
            }
        }
        let mut journal = Journal {
            path: journal_path,
            file: None,
            entries,
            len: whole as u64,
            retry_at: 0,
        };
        if whole < bytes.len() {
            // A torn last line: cut it off so that the next entry starts on a line of its own.
            journal
                .file()
                .and_then(|f| f.set_len(whole as u64).and_then(|()| f.sync_all()))
                .map_err(|e| anyhow::anyhow!("{}: {e}", journal.path.display()))?;
        }
        silences.journal = Some(journal);
        Ok(silences)
    }

    /// Writes the whole list to `silences.json` and empties the journal.
    fn compact(&mut self) -> anyhow::Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let json = serde_json::to_vec_pretty(&FileRef {
            silences: &self.list,
        })?;
        crate::sys::write_atomic(path, &json)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        // A crash before the journal is emptied replays entries already in the file: adds of
        // known ids are skipped and expiries keep the earlier end, so nothing changes.
        match &mut self.journal {
            Some(j) => j.clear(),
            None => Ok(()),
        }
    }

    /// Records `entry` durably (before the change is made and acknowledged).
    fn record(&mut self, entry: &EntryRef<'_>) -> anyhow::Result<()> {
        match &mut self.journal {
            Some(j) => j.append(entry),
            // Kept in memory only.
            None => Ok(()),
        }
    }

    /// Folds the journal into `silences.json` once it is as long as the list (or 256 entries).
    fn maybe_compact(&mut self) {
        let (entries, retry_at) = self
            .journal
            .as_ref()
            .map_or((0, 0), |j| (j.entries, j.retry_at));
        if entries > COMPACT_MIN_ENTRIES.max(self.list.len()).max(retry_at) {
            if let Err(e) = self.compact() {
                // The journal still holds every change: nothing is lost, it only grows.
                tracing::warn!("silences: {e:#}");
                if let Some(j) = &mut self.journal {
                    j.retry_at = 2 * j.entries;
                }
            } else if let Some(j) = &mut self.journal {
                j.retry_at = 0;
            }
        }
    }

    /// Adds a silence (durably: its journal line is on disk when this returns); its id. With
    /// [`MAX_SILENCES`] kept, the ended ones are dropped first; with as many in force, the add
    /// is refused.
    pub fn add(&mut self, mut s: Silence) -> anyhow::Result<String> {
        if self.list.len() >= MAX_SILENCES {
            let now = s.starts_ms;
            if self.list.iter().any(|x| x.ends_ms <= now) {
                self.drop_where(|x| x.ends_ms <= now);
            }
            if self.list.len() >= MAX_SILENCES {
                anyhow::bail!(
                    "too many silences: {MAX_SILENCES} are in force; expire some (`gpuwatch silence expire ID`) before adding more"
                );
            }
        }
        // Each distinct pattern is a compiled regex of up to MAX_REGEX_BYTES: their number is
        // bounded (10,000 silences with a pattern each took 270 to 700 MiB).
        let now = s.starts_ms;
        let is_re = |m: &&Matcher| matches!(m.op(), Op::Re | Op::Nre);
        let new_patterns: Vec<&str> = s
            .matchers
            .iter()
            .filter(is_re)
            .map(Matcher::value)
            .collect();
        if !new_patterns.is_empty() {
            let mut patterns: std::collections::HashSet<&str> = self
                .list
                .iter()
                .filter(|x| x.ends_ms > now)
                .flat_map(|x| x.matchers.iter().filter(is_re).map(Matcher::value))
                .collect();
            patterns.extend(new_patterns);
            if patterns.len() > MAX_REGEX_PATTERNS {
                anyhow::bail!(
                    "too many different regex matchers: at most {MAX_REGEX_PATTERNS} distinct \
                     `=~`/`!~` patterns among the silences in force (each compiled one may take \
                     {} KiB); reuse a pattern, use `=` matchers, or expire some silences",
                    MAX_REGEX_BYTES / 1024
                );
            }
        }
        let mut salt = self.list.len();
        s.id = loop {
            let seed = format!("{}{:?}{salt}", s.starts_ms, s.matchers);
            let id = crate::sys::fnv1a64_hex(seed.bytes());
            if !self.ids.contains(&id) {
                break id;
            }
            salt += 1;
        };
        self.record(&EntryRef::Add(&s))?;
        let id = s.id.clone();
        self.ids.insert(id.clone());
        self.changed_ms = s.starts_ms;
        Arc::make_mut(&mut self.list).push(s);
        self.maybe_compact();
        Ok(id)
    }

    /// Ends silence `id` now (`false` when there is none of that id still active).
    pub fn expire(&mut self, id: &str, now_ms: i64) -> anyhow::Result<bool> {
        let Some(i) = self
            .list
            .iter()
            .position(|s| s.id == id && s.ends_ms > now_ms)
        else {
            return Ok(false);
        };
        self.record(&EntryRef::Expire { id, at_ms: now_ms })?;
        if let Some(s) = Arc::make_mut(&mut self.list).get_mut(i) {
            s.ends_ms = now_ms;
        }
        self.changed_ms = now_ms;
        self.maybe_compact();
        Ok(true)
    }

    /// Drops the silences `gone` says (not journaled: only ended ones are dropped, and a replay
    /// that brings them back drops them again).
    fn drop_where(&mut self, gone: impl Fn(&Silence) -> bool) {
        let list = Arc::make_mut(&mut self.list);
        list.retain(|s| !gone(s));
        self.ids = list.iter().map(|s| s.id.clone()).collect();
    }

    /// Ends the silences whose job has exited (`alive(pid, start)` false: no such process, or
    /// another one that reused the pid); drops those ended more than a day ago; folds the
    /// journal into `silences.json` once the set has been quiet for a while. The daemon calls it
    /// about once a second (it walks the whole list).
    pub fn housekeeping(
        &mut self,
        now_ms: i64,
        alive: impl Fn(u32, Option<u64>) -> bool,
    ) -> anyhow::Result<()> {
        let ended: Vec<String> = self
            .list
            .iter()
            .filter(|s| s.active(now_ms) && s.until_pid.is_some_and(|p| !alive(p, s.until_start)))
            .map(|s| s.id.clone())
            .collect();
        for id in ended {
            self.expire(&id, now_ms)?;
        }
        let cutoff = now_ms.saturating_sub(KEEP_ENDED_MS);
        if self.list.iter().any(|s| s.ends_ms <= cutoff) {
            self.drop_where(|s| s.ends_ms <= cutoff);
            self.changed_ms = now_ms;
        }
        let pending = self.journal.as_ref().is_some_and(|j| j.entries > 0);
        if pending && now_ms.saturating_sub(self.changed_ms) >= COMPACT_QUIET_MS {
            if let Err(e) = self.compact() {
                // Tried again after another quiet while (the journal keeps everything).
                self.changed_ms = now_ms;
                return Err(e);
            }
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

    /// Every silence, as a handle a reader can keep without holding the lock: O(1). The next
    /// change copies the list only if the handle is still held then, so a reader should drop it
    /// once done.
    pub fn snapshot(&self) -> Arc<Vec<Silence>> {
        self.list.clone()
    }
}

/// Where a reader of silences (the notification grouper) gets the set in force: a fixed list,
/// or the daemon's live set, read at the moment of use — a silence applies to what is notified
/// from the moment its add is acknowledged, and nothing is copied per change.
#[derive(Clone)]
pub enum Feed {
    /// This list, for ever.
    Fixed(Arc<Vec<Silence>>),
    /// The daemon's silences as they are when read.
    Live(Shared),
}

impl Default for Feed {
    fn default() -> Feed {
        Feed::Fixed(Arc::default())
    }
}

impl std::fmt::Debug for Feed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Feed::Fixed(l) => write!(f, "Feed::Fixed({} silences)", l.len()),
            Feed::Live(_) => write!(f, "Feed::Live"),
        }
    }
}

impl Feed {
    /// A fixed list.
    pub fn fixed(list: Vec<Silence>) -> Feed {
        Feed::Fixed(Arc::new(list))
    }

    /// The daemon's live set.
    pub fn live(shared: &Shared) -> Feed {
        Feed::Live(shared.clone())
    }

    /// The silences now (a handle, O(1); drop it once done).
    pub fn current(&self) -> Arc<Vec<Silence>> {
        match self {
            Feed::Fixed(l) => l.clone(),
            Feed::Live(s) => s
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .snapshot(),
        }
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

    /// A regex matcher is compiled once (when parsed, or read back at its first match), within
    /// [`MAX_REGEX_BYTES`] (a larger one is refused naming the matcher), shared by its copies and
    /// by every matcher with the same pattern; it is stored and sent as it always was, and a
    /// stored pattern that no longer compiles is kept but matches nothing.
    #[test]
    fn regex_matchers_are_compiled_once_and_bounded() {
        let m = Matcher::parse("gpu=~\"3|4\"").unwrap();
        assert!(
            m.re.as_ref().unwrap().0.get().is_some(),
            "compiled when parsed"
        );
        assert!(Matcher::parse("gpu=3").unwrap().re.is_none());
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(json, r#"{"name":"gpu","op":"Re","value":"3|4"}"#);
        let back: Matcher = serde_json::from_str(&json).unwrap();
        assert_eq!(back, m);
        let copy = back.clone();
        assert!(
            back.re.as_ref().unwrap().0.get().is_none(),
            "read back: compiled at the first match"
        );
        assert!(back.matches(&labels(&[("gpu", "4")])));
        assert!(!back.matches(&labels(&[("gpu", "5")])));
        assert!(
            copy.re.as_ref().unwrap().0.get().is_some(),
            "copies share it"
        );
        assert!(
            std::ptr::eq(back.regex().unwrap(), m.regex().unwrap()),
            "one regex per pattern"
        );

        assert!(Matcher::parse("job=~\"a{1000}\"").is_ok());
        for hostile in [
            r#"job=~"\w{50}""#,
            r#"job!~".{100}""#,
            "job=~((a{100}){100})",
        ] {
            let (col, e) = Matcher::parse(hostile).unwrap_err();
            assert_eq!(col, 6, "{e}");
            assert!(
                e.starts_with(&format!(
                    "`{hostile}`: the regex is too large compiled (over 64 KiB)"
                )),
                "{e}"
            );
        }
        let e = AddRequest::from_json(&serde_json::json!({"matchers": ["gpu=0", "job=~\\w{50}"]}))
            .unwrap_err();
        assert!(e.starts_with("matchers[1] column 6: `job=~\\w{50}`"), "{e}");

        // Written by an older gpuwatch (no size limit): listed, never silencing.
        for op in ["Re", "Nre"] {
            let stored = format!(r#"{{"name":"job","op":"{op}","value":"\\w{{50}}"}}"#);
            let m: Matcher = serde_json::from_str(&stored).unwrap();
            assert!(!m.matches(&labels(&[("job", "x")])), "{op}");
            assert!(m.is_broken());
            assert_eq!(serde_json::to_string(&m).unwrap(), stored, "kept as it was");
        }
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

    fn silence(n: usize, starts_ms: i64) -> Silence {
        Silence {
            id: String::new(),
            matchers: vec![Matcher::parse(&format!("job=job-{n}")).unwrap()],
            starts_ms,
            ends_ms: starts_ms + 3_600_000,
            comment: format!("silence {n}"),
            created_by: "alice".into(),
            until_pid: None,
            until_start: None,
        }
    }

    /// What an older gpuwatch reads: `silences.json` alone.
    fn json_file(dir: &Path) -> Vec<Silence> {
        let bytes = std::fs::read(dir.join("silences.json")).unwrap();
        serde_json::from_slice::<File>(&bytes).unwrap().silences
    }

    fn journal_lines(dir: &Path) -> usize {
        std::fs::read_to_string(dir.join("silences.journal"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    /// Issue 25 item 5: an add appends one journal line instead of rewriting the list; the
    /// journal is folded into `silences.json` once it holds more entries than the list holds
    /// silences (or 256), and a load replays it: ids unique, every add and expiry kept.
    #[test]
    fn adds_are_journaled_compacted_and_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Silences::load(dir.path()).unwrap();
        let mut ids = HashSet::new();
        for n in 0..1000 {
            // The same matchers at the same time: still a new id each.
            let id = s.add(silence(n % 3, 1000)).unwrap();
            assert!(ids.insert(id), "unique ids");
        }
        assert!(
            !dir.path().join("silences.json").exists(),
            "no rewrite of the list per add"
        );
        assert_eq!(journal_lines(dir.path()), 1000);
        // One entry more than the list: folded in.
        let first = s.list()[0].id.clone();
        assert!(s.expire(&first, 2000).unwrap());
        assert_eq!(journal_lines(dir.path()), 0);
        let json = json_file(dir.path());
        assert_eq!(json.len(), 1000);
        assert_eq!(json[0].ends_ms, 2000);
        for n in 0..10 {
            s.add(silence(n, 3000)).unwrap();
        }
        assert_eq!(journal_lines(dir.path()), 10);

        let again = Silences::load(dir.path()).unwrap();
        assert_eq!(again.list(), s.list());

        // A crash between writing silences.json and emptying the journal: the journal is
        // replayed onto a list that has its entries already; nothing changes.
        let journal = std::fs::read(dir.path().join("silences.journal")).unwrap();
        let mut s = again;
        s.compact().unwrap();
        assert_eq!(journal_lines(dir.path()), 0);
        assert_eq!(json_file(dir.path()).len(), 1010);
        std::fs::write(dir.path().join("silences.journal"), journal).unwrap();
        let replayed = Silences::load(dir.path()).unwrap();
        assert_eq!(replayed.list(), s.list());
    }

    /// A crash while a line was written leaves it cut short: it was never acknowledged, so the
    /// load drops it, and the next add starts on a line of its own.
    #[test]
    fn a_torn_last_journal_line_is_dropped() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().unwrap();
        let mut s = Silences::load(dir.path()).unwrap();
        s.add(silence(1, 1000)).unwrap();
        let path = dir.path().join("silences.journal");
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(br#"{"add":{"id":"x","matc"#).unwrap();
        drop(f);
        let mut s = Silences::load(dir.path()).unwrap();
        assert_eq!(s.list().len(), 1);
        s.add(silence(2, 1000)).unwrap();
        let s = Silences::load(dir.path()).unwrap();
        assert_eq!(s.list().len(), 2);
        assert_eq!(journal_lines(dir.path()), 2);
    }

    /// Issue 25, fourth round: one damaged journal line (a bad block, a stray write) made the
    /// whole load fail, so the daemon started without any silence — those of `silences.json`
    /// too — and kept the ones added after in memory only (acknowledged, gone at the next
    /// restart, and again at every restart after). A damaged line is skipped and the journal
    /// kept aside; a damaged `silences.json` is moved aside; the rest is loaded and stays
    /// durable.
    #[test]
    fn a_damaged_journal_line_or_list_is_kept_aside_and_the_rest_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Silences::load(dir.path()).unwrap();
        let ids: Vec<String> = (0..3).map(|n| s.add(silence(n, 1000)).unwrap()).collect();
        drop(s);
        let path = dir.path().join("silences.journal");
        let text = std::fs::read(&path).unwrap();
        let mut lines: Vec<&[u8]> = text.split(|b| *b == b'\n').collect();
        lines[1] = b"\x00\xff{\"add\":{}}";
        let damaged = lines.join(&b'\n');
        std::fs::write(&path, &damaged).unwrap();
        let mut s = Silences::load(dir.path()).unwrap();
        let loaded: Vec<&str> = s.list().iter().map(|x| x.id.as_str()).collect();
        assert_eq!(loaded, [ids[0].as_str(), ids[2].as_str()]);
        assert_eq!(
            std::fs::read(dir.path().join("silences.journal.damaged")).unwrap(),
            damaged,
            "the journal as it was, kept aside"
        );
        let added = s.add(silence(7, 2000)).unwrap();
        drop(s);
        let s = Silences::load(dir.path()).unwrap();
        assert_eq!(s.list().len(), 3, "an add after the damage is durable");
        assert!(s.ids.contains(&added));

        // The list itself damaged: moved aside, the journal still replayed, adds durable.
        let mut s = s;
        s.compact().unwrap();
        let list = dir.path().join("silences.json");
        std::fs::write(&list, b"{\"silences\":[{\"id\":").unwrap();
        std::fs::write(&path, b"").unwrap();
        let mut s = Silences::load(dir.path()).unwrap();
        assert!(s.list().is_empty());
        assert_eq!(
            std::fs::read(dir.path().join("silences.json.damaged")).unwrap(),
            b"{\"silences\":[{\"id\":"
        );
        s.add(silence(8, 3000)).unwrap();
        drop(s);
        assert_eq!(Silences::load(dir.path()).unwrap().list().len(), 1);
    }

    /// A fold that fails (here `silences.json` is a directory) is not tried again at every
    /// change: only once the journal has doubled. Nothing is lost meanwhile.
    #[test]
    fn a_failed_fold_waits_for_the_journal_to_double() {
        let dir = tempfile::tempdir().unwrap();
        let mut set = Silences::load(dir.path()).unwrap();
        std::fs::create_dir(dir.path().join("silences.json")).unwrap();
        let mut ids = Vec::new();
        for n in 0..200 {
            ids.push(set.add(silence(n, 1_000)).unwrap());
        }
        for id in &ids[..100] {
            assert!(set.expire(id, 2_000).unwrap());
        }
        // 300 entries for 200 silences: the fold was tried at 257 and failed.
        let j = set.journal.as_ref().unwrap();
        assert_eq!(j.entries, 300);
        assert_eq!(j.retry_at, 2 * 257);
        for id in &ids[100..150] {
            assert!(set.expire(id, 2_000).unwrap());
        }
        assert_eq!(
            set.journal.as_ref().unwrap().retry_at,
            2 * 257,
            "not tried again"
        );
        std::fs::remove_dir(dir.path().join("silences.json")).unwrap();
        let back = Silences::load(dir.path()).unwrap();
        assert_eq!(back.list().len(), 200, "the journal kept every change");
    }

    /// A set that stays quiet is folded into `silences.json` (what an older gpuwatch reads) by
    /// the housekeeping; expiries of ended jobs are journaled like any other change.
    #[test]
    fn a_quiet_journal_is_folded_into_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Silences::load(dir.path()).unwrap();
        s.add(silence(1, 1000)).unwrap();
        let mut job = silence(2, 1000);
        job.until_pid = Some(42);
        let job = s.add(job).unwrap();
        s.housekeeping(1000 + COMPACT_QUIET_MS - 1, |_, _| true)
            .unwrap();
        assert!(json_file_missing_or_short(dir.path()));
        s.housekeeping(1000 + COMPACT_QUIET_MS, |_, _| true)
            .unwrap();
        assert_eq!(json_file(dir.path()).len(), 2);
        assert_eq!(journal_lines(dir.path()), 0);
        let t = 1000 + COMPACT_QUIET_MS + 1;
        s.housekeeping(t, |_, _| false).unwrap();
        assert_eq!(journal_lines(dir.path()), 1, "the job's end is journaled");
        let again = Silences::load(dir.path()).unwrap();
        let ended = again.list().iter().find(|x| x.id == job).unwrap();
        assert_eq!(ended.ends_ms, t);
    }

    fn json_file_missing_or_short(dir: &Path) -> bool {
        !dir.join("silences.json").exists() || json_file(dir).len() < 2
    }

    /// At most MAX_REGEX_PATTERNS distinct regex patterns among the silences in force: one
    /// more is refused, a pattern already in use is not.
    #[test]
    fn distinct_regex_patterns_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let mut set = Silences::load(dir.path()).unwrap();
        let silence = |m: &str| Silence {
            id: String::new(),
            matchers: vec![Matcher::parse(m).unwrap()],
            starts_ms: 1_000,
            ends_ms: 10_000_000,
            comment: String::new(),
            created_by: String::new(),
            until_pid: None,
            until_start: None,
        };
        for n in 0..MAX_REGEX_PATTERNS {
            set.add(silence(&format!("job=~\"run-{n}-.*\""))).unwrap();
        }
        let e = set.add(silence("job=~\"one-more.*\"")).unwrap_err();
        assert!(
            e.to_string().contains("too many different regex matchers"),
            "{e}"
        );
        set.add(silence("job=~\"run-7-.*\"")).unwrap();
        set.add(silence("gpu=3")).unwrap();
    }

    /// At most MAX_SILENCES are kept: ended ones make room, and an add beyond as many in force
    /// is refused with a clear error (nothing recorded).
    #[test]
    fn the_number_of_silences_is_bounded() {
        let mut s = Silences::default();
        for n in 0..MAX_SILENCES {
            s.add(silence(n, 1000)).unwrap();
        }
        let e = s.add(silence(0, 2000)).unwrap_err().to_string();
        assert!(e.contains("too many silences"), "{e}");
        assert_eq!(s.list().len(), MAX_SILENCES);
        let first = s.list()[0].id.clone();
        assert!(s.expire(&first, 2000).unwrap());
        s.add(silence(0, 3000)).unwrap();
        assert_eq!(s.list().len(), MAX_SILENCES);
        assert!(
            s.list().iter().all(|x| x.id != first),
            "the ended one made room"
        );
    }

    /// A reader's snapshot is O(1) and sees every acknowledged add; a change while none is held
    /// copies nothing.
    #[test]
    fn a_live_feed_reads_the_set_in_force() {
        let shared: Shared = Arc::default();
        let feed = Feed::live(&shared);
        assert!(feed.current().is_empty());
        shared.lock().unwrap().add(silence(1, 1000)).unwrap();
        let snap = feed.current();
        assert_eq!(snap.len(), 1);
        let before = Arc::as_ptr(&shared.lock().unwrap().snapshot());
        assert_eq!(before, Arc::as_ptr(&snap), "a handle, not a copy");
        drop(snap);
        shared.lock().unwrap().add(silence(2, 1000)).unwrap();
        assert_eq!(feed.current().len(), 2);
    }
}
