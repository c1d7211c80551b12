//! The durable outbox: every notification is written to `state_dir/outbox/<id>.json` (temp file,
//! fsync, rename, fsync of the directory) before the first send attempt, updated after each
//! failed attempt (attempt count, next attempt time, last error) and removed once delivered. A
//! `kill -9` at any point leaves either the old or the new version of an entry, never a torn one,
//! so a restarted daemon resends everything not yet acknowledged (at-least-once; receivers dedupe
//! on the stable id). Entries that fail permanently or exceed `give_up_after` move to
//! `outbox/dead/` with their last error, for a human to look at.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Notification;

/// One queued notification and its delivery bookkeeping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboxEntry {
    /// The message (its `id` names the file).
    pub notification: Notification,
    /// Failed attempts so far.
    pub attempts: u32,
    /// Earliest time of the next attempt, UTC ms.
    pub next_attempt_ms: i64,
    /// Last failure, secret-free.
    pub last_error: Option<String>,
}

/// The on-disk queue.
/// How long a given-up message stays in `outbox/dead/`.
pub const DEAD_KEPT_DAYS: u64 = 30;

#[derive(Debug, Clone)]
pub struct Outbox {
    dir: PathBuf,
}

impl Outbox {
    /// Opens (creating) `state_dir/outbox`, removes leftover temp files and the given-up messages
    /// in `dead/` older than [`DEAD_KEPT_DAYS`] (the directory would grow for ever).
    pub fn open(state_dir: &Path) -> std::io::Result<Outbox> {
        let dir = state_dir.join("outbox");
        crate::sys::create_private_dir(&dir.join("dead"))?;
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "tmp") {
                let _ = fs::remove_file(&path);
            }
        }
        let kept = std::time::Duration::from_secs(DEAD_KEPT_DAYS * 86_400);
        if let Ok(entries) = fs::read_dir(dir.join("dead")) {
            for e in entries.flatten() {
                let old = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > kept);
                if old {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        Ok(Outbox { dir })
    }

    /// The outbox directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Writes (or replaces) an entry durably.
    pub fn put(&self, entry: &OutboxEntry) -> std::io::Result<()> {
        let json = serde_json::to_vec_pretty(entry).map_err(std::io::Error::other)?;
        write_atomic(&self.path(&entry.notification.id), &json)
    }

    /// Removes a delivered entry.
    pub fn remove(&self, id: &str) -> std::io::Result<()> {
        match fs::remove_file(self.path(id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => sync_dir(&self.dir),
        }
    }

    /// Moves an entry to `dead/` (given up).
    pub fn bury(&self, entry: &OutboxEntry) -> std::io::Result<()> {
        let json = serde_json::to_vec_pretty(entry).map_err(std::io::Error::other)?;
        write_atomic(
            &self
                .dir
                .join("dead")
                .join(format!("{}.json", entry.notification.id)),
            &json,
        )?;
        self.remove(&entry.notification.id)
    }

    /// Every pending entry, oldest first. Unreadable files are renamed `*.corrupt` and reported.
    pub fn load(&self) -> std::io::Result<(Vec<OutboxEntry>, Vec<String>)> {
        self.load_new(|_| false)
    }

    /// Like [`Outbox::load`], leaving out the entries `known` names by id (those already
    /// pending): what another process put there (a job's undelivered messages).
    pub fn load_new(
        &self,
        known: impl Fn(&str) -> bool,
    ) -> std::io::Result<(Vec<OutboxEntry>, Vec<String>)> {
        let mut entries = Vec::new();
        let mut problems = Vec::new();
        for e in fs::read_dir(&self.dir)? {
            let path = e?.path();
            if path.extension().is_none_or(|x| x != "json")
                || path
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .is_some_and(&known)
            {
                continue;
            }
            let parsed = fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<OutboxEntry>(&b).map_err(|e| e.to_string()));
            match parsed {
                Ok(entry) => entries.push(entry),
                Err(err) => {
                    problems.push(format!("{}: {err}", path.display()));
                    let _ = fs::rename(&path, path.with_extension("corrupt"));
                }
            }
        }
        entries.sort_by_key(|e| (e.notification.created_ms, e.notification.id.clone()));
        Ok((entries, problems))
    }
}

use crate::sys::sync_dir;
pub use crate::sys::write_atomic;

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::*;
    use crate::model::AlertStatus;

    #[test]
    fn put_load_remove_bury() {
        let dir = tempfile::tempdir().unwrap();
        let ob = Outbox::open(dir.path()).unwrap();
        let mut n1 = notification(vec![alert(1, AlertStatus::Firing)]);
        n1.id = "b1".into();
        let mut n2 = n1.clone();
        n2.id = "a2".into();
        n2.created_ms += 1;
        let e1 = OutboxEntry {
            notification: n1,
            attempts: 0,
            next_attempt_ms: 0,
            last_error: None,
        };
        let e2 = OutboxEntry {
            notification: n2,
            ..e1.clone()
        };
        ob.put(&e2).unwrap();
        ob.put(&e1).unwrap();
        std::fs::write(ob.dir().join("junk.json"), b"{not json").unwrap();
        std::fs::write(ob.dir().join(".x.tmp"), b"half").unwrap();
        let ob = Outbox::open(dir.path()).unwrap();
        let (entries, problems) = ob.load().unwrap();
        assert_eq!(entries, vec![e1.clone(), e2.clone()], "oldest first");
        assert_eq!(problems.len(), 1);
        assert!(!ob.dir().join(".x.tmp").exists());
        ob.remove("b1").unwrap();
        ob.bury(&e2).unwrap();
        assert!(ob.load().unwrap().0.is_empty());
        assert!(ob.dir().join("dead/a2.json").exists());
    }
}
