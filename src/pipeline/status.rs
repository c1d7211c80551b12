//! The status files `gpuwatch run` / `attach` leave in `state_dir/jobs/PID.json` while a job
//! runs (rewritten every few seconds, removed at the end), which `gpuwatch top` shows.
//!
//! A process is a PID *and* its start time (clock ticks since boot, `/proc/PID/stat`): a file
//! names the job's process and the `run`/`attach` process that watches it, each with its start.
//! It is live while both still run with those start times; a `run` ended by SIGKILL leaves its
//! file behind, and the PID can name another process later. [`live_jobs`] (used by `top`) and
//! [`sweep`] (by the next `run`) remove the files whose processes are provably gone or
//! replaced; a file they cannot judge (a process `/proc` does not let them read) stays.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// One status file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobStatus {
    /// The job's PID.
    pub pid: u32,
    /// When the job's process started, clock ticks since boot (absent in files of older
    /// versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ticks: Option<u64>,
    /// The `run`/`attach` process that writes the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watcher_pid: Option<u32>,
    /// When that process started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watcher_start_ticks: Option<u64>,
    /// The command line, shell-quoted.
    pub command: String,
    /// Progress in words (`step 120/1000`).
    pub progress: String,
    /// Seconds since progress moved, if it ever did.
    #[serde(default)]
    pub progress_age_s: Option<f64>,
    /// Seconds to the end at the recent pace, if known.
    #[serde(default)]
    pub eta_s: Option<f64>,
}

/// What `/proc` says of a process known by PID and (maybe) start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// It runs (the same start time, when one is known).
    Running,
    /// It is provably not running: no such PID, a zombie, or another process at the PID.
    Gone,
    /// `/proc` shows the PID but not its state (no permission).
    Unknown,
}

fn seen(pid: u32, start: Option<u64>) -> Seen {
    match crate::sys::live_start_ticks(pid) {
        Some(now) if start.is_none_or(|s| s == now) => Seen::Running,
        Some(_) => Seen::Gone,
        // A stat we can read of a process that does not run: a zombie.
        None if crate::sys::read_stat(pid).is_some() => Seen::Gone,
        None if Path::new(&format!("/proc/{pid}")).exists() => Seen::Unknown,
        None => Seen::Gone,
    }
}

impl JobStatus {
    /// The file of `pid` in `dir`.
    pub fn path(dir: &Path, pid: u32) -> std::path::PathBuf {
        dir.join(format!("{pid}.json"))
    }

    /// What `/proc` says of the job: running only when the job's process and its watcher both
    /// run with their recorded start times; gone when either is provably gone or replaced. A
    /// file of an older version (no start times) is judged by the job's PID alone.
    fn seen(&self) -> Seen {
        let job = seen(self.pid, self.start_ticks);
        let watcher = self
            .watcher_pid
            .map_or(Seen::Running, |w| seen(w, self.watcher_start_ticks));
        match (job, watcher) {
            (Seen::Gone, _) | (_, Seen::Gone) => Seen::Gone,
            (Seen::Running, Seen::Running) => Seen::Running,
            _ => Seen::Unknown,
        }
    }
}

/// The largest status file read (its command line is at most the kernel's argument limit).
const MAX_STATUS_BYTES: u64 = 4 << 20;

/// A status file's bytes: a regular file of at most [`MAX_STATUS_BYTES`], not followed through a
/// link (`run` writes regular files). Anything else in the directory is not read: a FIFO named
/// `N.json` blocked `top` and every later `run` for ever, and a link to `/dev/zero` filled
/// memory.
fn read_status(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    let meta = f.metadata().ok()?;
    if !meta.is_file() || meta.len() > MAX_STATUS_BYTES {
        return None;
    }
    let mut bytes = Vec::new();
    f.take(MAX_STATUS_BYTES + 1).read_to_end(&mut bytes).ok()?;
    (bytes.len() as u64 <= MAX_STATUS_BYTES).then_some(bytes)
}

/// Removes `path` if it still holds `bytes` (a `run` may have just written it for a new job).
fn remove_stale(path: &Path, bytes: &[u8]) {
    if read_status(path).is_some_and(|now| now == bytes) {
        if let Err(e) = std::fs::remove_file(path) {
            tracing::debug!("stale job status {}: {e}", path.display());
        }
    }
}

/// Reads every status file in `dir`: the jobs that run now, by PID; the files of jobs whose
/// process or watcher is provably gone or replaced are removed.
pub fn live_jobs(dir: &Path) -> Vec<JobStatus> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut jobs = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let Some(bytes) = read_status(&path) else {
            continue;
        };
        let Ok(job) = serde_json::from_slice::<JobStatus>(&bytes) else {
            continue;
        };
        match job.seen() {
            Seen::Running => jobs.push(job),
            Seen::Gone => remove_stale(&path, &bytes),
            Seen::Unknown => {}
        }
    }
    jobs.sort_by_key(|j| j.pid);
    jobs
}

/// Removes the status files in `dir` of jobs that no longer run (see [`live_jobs`]).
pub fn sweep(dir: &Path) {
    live_jobs(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(pid: u32, start: Option<u64>, watcher: Option<(u32, Option<u64>)>) -> JobStatus {
        JobStatus {
            pid,
            start_ticks: start,
            watcher_pid: watcher.map(|w| w.0),
            watcher_start_ticks: watcher.and_then(|w| w.1),
            command: format!("job {pid}"),
            progress: "step 1".into(),
            progress_age_s: None,
            eta_s: None,
        }
    }

    fn write(dir: &Path, name: &str, s: &JobStatus) {
        std::fs::write(dir.join(name), serde_json::to_vec(s).unwrap()).unwrap();
    }

    #[test]
    fn only_jobs_whose_processes_still_run_are_live() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let my_start = crate::sys::live_start_ticks(me).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let start = crate::sys::live_start_ticks(pid).unwrap();
        let watcher = Some((me, Some(my_start)));
        let live = status(pid, Some(start), watcher);
        write(dir.path(), &format!("{pid}.json"), &live);
        // The same PID, another process (the start differs).
        let reused = status(pid, Some(start + 1), watcher);
        write(dir.path(), "reused.json", &reused);
        // A watcher that is another process now.
        let orphan = status(pid, Some(start), Some((me, Some(my_start + 1))));
        write(dir.path(), "orphan.json", &orphan);
        // An older file without start times, of a running PID: kept (nothing proves it stale).
        let old = status(me, None, None);
        write(dir.path(), "old.json", &old);
        std::fs::write(dir.path().join("junk.json"), "not json").unwrap();
        let mut expected = vec![live, old];
        expected.sort_by_key(|j| j.pid);
        assert_eq!(live_jobs(dir.path()), expected);
        for gone in ["reused.json", "orphan.json"] {
            assert!(!dir.path().join(gone).exists(), "{gone} was kept");
        }
        assert!(
            dir.path().join("junk.json").exists(),
            "only judged files go"
        );
        // The job ends (reaped): its file goes too.
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(live_jobs(dir.path()).iter().all(|j| j.pid != pid));
        assert!(!JobStatus::path(dir.path(), pid).exists());
    }

    /// Issue 25, fourth round: what is not a regular status file is not read — a FIFO named
    /// like one blocked `top` and every later `run` (their sweep) for ever, a link to
    /// `/dev/zero` read until memory ran out; a link to a stale file is not followed (nor its
    /// target removed), a directory is skipped.
    #[test]
    fn only_regular_status_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = std::ffi::CString::new(
            dir.path()
                .join("1.json")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .unwrap();
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("2.json")).unwrap();
        std::fs::create_dir(dir.path().join("3.json")).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let stale = elsewhere.path().join("4.json");
        write(
            elsewhere.path(),
            "4.json",
            &status(u32::MAX - 1, Some(1), None),
        );
        std::os::unix::fs::symlink(&stale, dir.path().join("4.json")).unwrap();
        let me = std::process::id();
        let live = status(me, crate::sys::live_start_ticks(me), None);
        write(dir.path(), "5.json", &live);
        let (tx, rx) = std::sync::mpsc::channel();
        let path = dir.path().to_path_buf();
        std::thread::spawn(move || tx.send(live_jobs(&path)));
        let jobs = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("live_jobs returned");
        assert_eq!(jobs, vec![live]);
        assert!(stale.exists(), "a link's target is not removed");
        // A file too large to be a status file.
        let big = dir.path().join("6.json");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_STATUS_BYTES + 1)
            .unwrap();
        assert_eq!(read_status(&big), None);
    }
}
