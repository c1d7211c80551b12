//! The state directory of a daemon that plays a simulated scenario faster (`--sim … --speed
//! N`): its alert state, outbox and silences live apart from the real ones, in a new private
//! directory `gpuwatch-sim-PID-START-SALT` under the temporary directory (`$TMPDIR`, else
//! `/tmp`), kept when the daemon stops cleanly (marked [`KEPT`]; it says where, and how
//! `gpuwatch digest --state-dir` reads it) until the user removes it. PID and START (its start time, clock ticks since
//! boot) name the daemon that made it.
//!
//! A daemon killed with `kill -9` cannot mark its directory kept, nor deliver what its outbox still
//! held. The next `--speed` daemon finds such directories ([`stranded`]): ours (this user's, a
//! real directory of mode 0700 — 0710 with `control_group` —, not a link) whose daemon no longer
//! runs — its PID is gone or is another process now (another start time; for a directory named
//! by an older gpuwatch without the start time, a process started after the directory last
//! changed), and nothing answers on its control socket. It says how many undelivered messages
//! each held and removes it ([`sweep`]): they were messages about simulated time, played for a
//! demonstration or a test, and sending them late, from another run, would only mislead; saying
//! so, never silently, is what the user needs. A live daemon's directory is never touched.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use tracing::{info, warn};

/// The directories' name prefix.
pub const PREFIX: &str = "gpuwatch-sim";

/// The file a daemon that stopped cleanly leaves in its directory: the directory is kept for
/// the user (`gpuwatch digest --state-dir`), never swept as stranded.
pub const KEPT: &str = "KEPT";

/// Marks `dir` as kept at a clean stop (see [`KEPT`]).
pub fn keep(dir: &Path) {
    let note = "A gpuwatch --speed daemon stopped cleanly here; its state is kept until you \
                remove this directory (`gpuwatch digest --state-dir` reads it).\n";
    if let Err(e) = std::fs::write(dir.join(KEPT), note) {
        warn!(
            "cannot mark {} as kept: {e}; the next --speed run may remove it",
            dir.display()
        );
    }
}

/// Makes this daemon's directory: new (never one that was there before: another user could have
/// planted links in it), mode 0700, named `PREFIX-PID-START-SALT`.
pub fn create() -> std::io::Result<PathBuf> {
    create_in(&std::env::temp_dir())
}

fn create_in(base: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt as _;
    let pid = std::process::id();
    let start = crate::sys::live_start_ticks(pid).unwrap_or(0);
    let mut last = None;
    for n in 0..100u32 {
        let salt = crate::sys::fnv1a64_hex(format!("{pid}{n}{:?}", Instant::now()).bytes());
        let dir = base.join(format!("{PREFIX}-{pid}-{start}-{salt}"));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no temporary directory")))
}

/// The daemon a directory name says made it: PID and, in names since the start time is in
/// them, that start time.
fn maker(name: &str) -> Option<(u32, Option<u64>)> {
    let rest = name.strip_prefix(PREFIX)?.strip_prefix('-')?;
    let parts: Vec<&str> = rest.split('-').collect();
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match parts.as_slice() {
        [pid, start, salt] if digits(pid) && digits(start) && hex(salt) => {
            Some((pid.parse().ok()?, Some(start.parse().ok()?)))
        }
        [pid, salt] if digits(pid) && hex(salt) => Some((pid.parse().ok()?, None)),
        _ => None,
    }
}

/// When process `pid` started, UTC ms (boot time from `/proc/stat` plus its start ticks).
fn started_ms(pid: u32) -> Option<i64> {
    let ticks = crate::sys::live_start_ticks(pid)?;
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let boot_s: i64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = u64::try_from(hz).ok().filter(|h| *h > 0)?;
    let after_boot_ms = i64::try_from(ticks.saturating_mul(1000) / hz).ok()?;
    Some(boot_s * 1000 + after_boot_ms)
}

/// Whether the daemon that made `dir` (named after `pid`, `start`) may still run.
fn maker_runs(dir: &Path, pid: u32, start: Option<u64>, meta: &std::fs::Metadata) -> bool {
    // A daemon that answers on the directory's control socket runs, whatever the name says.
    if std::os::unix::net::UnixStream::connect(super::control::socket_path(dir)).is_ok() {
        return true;
    }
    match (crate::sys::live_start_ticks(pid), start) {
        (None, _) => false,
        (Some(now), Some(then)) => now == then,
        // An older name without the start time: a process that started after the directory
        // last changed (every daemon writes its state there) did not make it.
        (Some(_), None) => {
            let changed_ms = meta.mtime() * 1000 + meta.mtime_nsec() / 1_000_000;
            started_ms(pid).is_none_or(|s| s <= changed_ms + 2_000)
        }
    }
}

/// A directory a killed `--speed` daemon left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stranded {
    /// The directory.
    pub dir: PathBuf,
    /// The PID of the daemon that made it.
    pub pid: u32,
    /// Messages its outbox still held (not delivered, not given up).
    pub undelivered: usize,
    /// Messages it had given up on (`outbox/dead/`).
    pub given_up: usize,
    /// The alerts the undelivered messages were about (names, at most five).
    pub alerts: Vec<String>,
}

/// The `.json` entries of `dir` (none when it is not a real directory of ours).
fn json_files(dir: &Path) -> Vec<PathBuf> {
    let ours =
        std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir() && m.uid() == crate::sys::euid());
    if !ours {
        return Vec::new();
    }
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect()
}

/// The directories in `base` that `--speed` daemons no longer running left behind, except
/// `own`.
pub fn stranded(base: &Path, own: &Path) -> Vec<Stranded> {
    let Ok(entries) = std::fs::read_dir(base) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let dir = e.path();
        let Some((pid, start)) = e.file_name().to_str().and_then(maker) else {
            continue;
        };
        let Ok(meta) = std::fs::symlink_metadata(&dir) else {
            continue;
        };
        // Ours, made as gpuwatch makes them: a real directory, 0700 (0710 when the control
        // socket has a group).
        let ours =
            meta.is_dir() && meta.uid() == crate::sys::euid() && meta.mode() & 0o767 == 0o700;
        if !ours || dir == own || dir.join(KEPT).exists() || maker_runs(&dir, pid, start, &meta) {
            continue;
        }
        let outbox = dir.join("outbox");
        let pending = json_files(&outbox);
        let mut alerts: Vec<String> = Vec::new();
        for p in &pending {
            let entry = std::fs::read(p).ok().and_then(|b| {
                serde_json::from_slice::<crate::notify::outbox::OutboxEntry>(&b).ok()
            });
            for a in entry.into_iter().flat_map(|e| e.notification.alerts) {
                if !alerts.contains(&a.name) && alerts.len() < 5 {
                    alerts.push(a.name);
                }
            }
        }
        out.push(Stranded {
            undelivered: pending.len(),
            given_up: json_files(&outbox.join("dead")).len(),
            dir,
            pid,
            alerts,
        });
    }
    out.sort_by(|a, b| a.dir.cmp(&b.dir));
    out
}

/// At the start of a `--speed` daemon: says, for every directory an earlier one left behind
/// (killed before it could stop), how many undelivered messages it held, that they are dropped,
/// and removes it. Returns what it found.
pub fn sweep(own: &Path) -> Vec<Stranded> {
    let base = own
        .parent()
        .map_or_else(std::env::temp_dir, Path::to_path_buf);
    let found = stranded(&base, own);
    for s in &found {
        let removed = std::fs::remove_dir_all(&s.dir);
        let dir = s.dir.display();
        let pid = s.pid;
        if s.undelivered > 0 {
            let about = if s.alerts.is_empty() {
                String::new()
            } else {
                format!(" (about {})", s.alerts.join(", "))
            };
            let given_up = match s.given_up {
                0 => String::new(),
                n => format!(", and {n} it had given up on"),
            };
            let (what, them) = match s.undelivered {
                1 => ("1 undelivered message".to_string(), "it"),
                n => (format!("{n} undelivered messages"), "them"),
            };
            match removed {
                Ok(()) => warn!(
                    "{what}{about}{given_up} from an earlier --speed run (pid {pid}) killed before \
                     it could deliver {them}, in {dir}: dropped (messages about simulated time \
                     are not sent late); the directory is removed"
                ),
                Err(e) => warn!(
                    "{what}{about}{given_up} from an earlier --speed run (pid {pid}) killed before \
                     it could deliver {them}, in {dir}: not sent; the directory cannot be removed \
                     ({e}): remove it by hand"
                ),
            }
        } else {
            match removed {
                Ok(()) => info!(
                    "removed {dir}, left by an earlier --speed run (pid {pid}) that was killed; \
                     it held no undelivered messages"
                ),
                Err(e) => warn!(
                    "{dir}, left by an earlier --speed run (pid {pid}) that was killed, cannot \
                     be removed: {e}"
                ),
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_say_who_made_them() {
        assert_eq!(
            maker("gpuwatch-sim-4242-123456-00ff00ff00ff00ff"),
            Some((4242, Some(123_456)))
        );
        assert_eq!(
            maker("gpuwatch-sim-4242-00ff00ff00ff00ff"),
            Some((4242, None))
        );
        for other in [
            "gpuwatch-sim-x-00ff",
            "gpuwatch-simulator-1-ff",
            "gpuwatch-sim-1-2-3-ff",
            "gpuwatch-sim-1-zz",
            "gpuwatch-test-home-1",
        ] {
            assert_eq!(maker(other), None, "{other}");
        }
    }

    /// A directory this process made is its own (its PID and start time), one named after a
    /// process that is gone is stranded, one of a live process with another start time too; a
    /// directory with a wider mode, a link, or another name is left alone.
    #[test]
    fn only_directories_of_daemons_gone_are_stranded() {
        use std::os::unix::fs::PermissionsExt as _;
        let base = tempfile::tempdir().unwrap();
        let mine = create_in(base.path()).unwrap();
        let (me, my_start) = maker(mine.file_name().unwrap().to_str().unwrap()).unwrap();
        assert_eq!(me, std::process::id());
        let my_start = my_start.unwrap();
        // A process that has ended.
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        gone.wait().unwrap();
        let private = |name: String| {
            let d = base.path().join(name);
            std::fs::create_dir(&d).unwrap();
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
            d
        };
        let dead = private(format!("{PREFIX}-{}-1-aa", gone.id()));
        let reused = private(format!("{PREFIX}-{me}-{}-bb", my_start + 1));
        let old_dead = private(format!("{PREFIX}-{}-cc", gone.id()));
        // An old name, this (live) process's PID, changed after it started: maybe its own.
        let old_live = private(format!("{PREFIX}-{me}-dd"));
        let wide = private(format!("{PREFIX}-{}-1-ee", gone.id()));
        std::fs::set_permissions(&wide, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(&dead, base.path().join(format!("{PREFIX}-1-1-ff"))).unwrap();
        std::fs::create_dir_all(dead.join("outbox/dead")).unwrap();
        std::fs::write(dead.join("outbox/a.json"), b"{}").unwrap();
        std::fs::write(dead.join("outbox/b.json"), b"{}").unwrap();
        std::fs::write(dead.join("outbox/dead/c.json"), b"{}").unwrap();
        let found = stranded(base.path(), Path::new("/nonexistent"));
        let dirs: Vec<&Path> = found.iter().map(|s| s.dir.as_path()).collect();
        let mut want = vec![dead.as_path(), reused.as_path(), old_dead.as_path()];
        want.sort();
        assert_eq!(dirs, want, "{found:?}");
        assert!(!dirs.contains(&mine.as_path()) && !dirs.contains(&old_live.as_path()));
        let d = found.iter().find(|s| s.dir == dead).unwrap();
        assert_eq!((d.undelivered, d.given_up), (2, 1));
        // `own` is never stranded, whatever its name says.
        assert!(stranded(base.path(), &dead).iter().all(|s| s.dir != dead));
        // The sweep removes what it reports, and nothing else.
        let swept = sweep(&mine);
        assert_eq!(swept.len(), 3);
        assert!(!dead.exists() && !reused.exists() && !old_dead.exists());
        assert!(mine.exists() && old_live.exists() && wide.exists());
    }
}
