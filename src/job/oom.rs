//! Evidence that the kernel OOM killer ended a job: the `oom_kill` counter of the job's memory
//! cgroup (`memory.events` on cgroup v2, `memory.oom_control` on v1), read when the job starts and
//! again when it ends, and `Killed process PID` / `oom-kill:…pid=PID` lines in the kernel log when
//! `/dev/kmsg` is readable. Parsing is pure; the readers are best effort.

use std::io::Read;
use std::path::{Path, PathBuf};

/// Where a job's OOM-kill counter lives and its value at the start.
#[derive(Debug, Clone, PartialEq)]
pub struct OomWatch {
    /// The file holding the counter.
    pub counter_file: Option<PathBuf>,
    /// The counter's value when the job started.
    pub start_count: Option<u64>,
    /// The job's PID.
    pub pid: u32,
}

impl OomWatch {
    /// Finds the memory cgroup of `pid` (under `/sys/fs/cgroup`) and reads its counter.
    pub fn start(pid: u32) -> OomWatch {
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let counter_file = counter_file(Path::new("/sys/fs/cgroup"), &cgroup);
        let start_count = counter_file.as_deref().and_then(read_count);
        OomWatch {
            counter_file,
            start_count,
            pid,
        }
    }

    /// Evidence of an OOM kill since [`OomWatch::start`], if any.
    pub fn evidence(&self) -> Option<String> {
        if let (Some(file), Some(before)) = (&self.counter_file, self.start_count) {
            if let Some(after) = read_count(file) {
                if after > before {
                    return Some(format!(
                        "oom_kill counter {before} → {after} in {}",
                        file.display()
                    ));
                }
            }
        }
        kernel_log_evidence(self.pid)
    }
}

/// The counter file for a `/proc/PID/cgroup` text under the cgroup mount `root`.
pub fn counter_file(root: &Path, proc_cgroup: &str) -> Option<PathBuf> {
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        if controllers.is_empty() {
            // cgroup v2 unified hierarchy.
            let f = root.join(rel).join("memory.events");
            if f.exists() {
                return Some(f);
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            let f = root.join("memory").join(rel).join("memory.oom_control");
            if f.exists() {
                return Some(f);
            }
        }
    }
    None
}

/// Reads `oom_kill N` from a `memory.events` or `memory.oom_control` file.
pub fn read_count(file: &Path) -> Option<u64> {
    parse_oom_kill(&std::fs::read_to_string(file).ok()?)
}

/// Parses the `oom_kill N` line.
pub fn parse_oom_kill(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next() == Some("oom_kill"))
            .then(|| it.next()?.parse().ok())
            .flatten()
    })
}

/// Searches the kernel log (`/dev/kmsg`, when readable) for an OOM kill of `pid`.
pub fn kernel_log_evidence(pid: u32) -> Option<String> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .ok()?;
    let mut hit = None;
    let mut buf = vec![0u8; 8192];
    // Each read returns one record; stop at EAGAIN (end of buffer) or after a bound.
    for _ in 0..100_000 {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let rec = String::from_utf8_lossy(&buf[..n]);
                if let Some(line) = kmsg_oom_line(&rec, pid) {
                    hit = Some(format!("kernel log: {line}"));
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(_) => break,
        }
    }
    hit
}

/// The message part of a kmsg record when it reports an OOM kill of `pid`.
pub fn kmsg_oom_line(record: &str, pid: u32) -> Option<String> {
    let msg = record.split_once(';').map_or(record, |(_, m)| m);
    let msg = msg.lines().next().unwrap_or("").trim();
    let killed = format!("Killed process {pid} ");
    let task = format!(",pid={pid},");
    ((msg.contains(&killed) && msg.contains("Out of memory"))
        || msg.starts_with(&killed)
        || (msg.starts_with("oom-kill:") && msg.contains(&task)))
    .then(|| msg.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_counters() {
        let v2 = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(parse_oom_kill(v2), Some(2));
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n";
        assert_eq!(parse_oom_kill(v1), Some(7));
        assert_eq!(parse_oom_kill("low 0\n"), None);
    }

    #[test]
    fn finds_counter_files() {
        let dir = tempfile::tempdir().unwrap();
        let v2 = dir.path().join("user.slice/job.scope");
        std::fs::create_dir_all(&v2).unwrap();
        std::fs::write(v2.join("memory.events"), "oom_kill 0\n").unwrap();
        assert_eq!(
            counter_file(dir.path(), "0::/user.slice/job.scope\n"),
            Some(v2.join("memory.events"))
        );
        let v1 = dir.path().join("memory/slurm/job_7");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("memory.oom_control"), "oom_kill 1\n").unwrap();
        assert_eq!(
            counter_file(dir.path(), "5:cpuacct,cpu:/x\n4:memory:/slurm/job_7\n"),
            Some(v1.join("memory.oom_control"))
        );
        assert_eq!(counter_file(dir.path(), "0::/missing\n"), None);
    }

    #[test]
    fn kernel_log_lines() {
        let rec = "3,1234,5678,-;Out of memory: Killed process 4242 (python) total-vm:1kB";
        assert!(kmsg_oom_line(rec, 4242).is_some());
        assert!(kmsg_oom_line(rec, 424).is_none());
        let rec = "6,1,2,-;oom-kill:constraint=CONSTRAINT_MEMCG,task=python,pid=4242,uid=1000";
        assert!(kmsg_oom_line(rec, 4242).is_some());
        assert!(kmsg_oom_line("6,1,2,-;eth0: link up", 4242).is_none());
    }
}
