//! Process details from `/proc` for the PIDs NVML reports: owner (uid and user name from
//! `/proc/PID/status`), command line (`/proc/PID/cmdline`), container id (`/proc/PID/cgroup`) and
//! start time and runtime (`/proc/PID/stat` start time, and it against `/proc/uptime`).
//!
//! The parsers are pure functions over file contents (unit-tested below); [`ProcCache`] reads the
//! files and keeps what it learned per PID (keyed with the start time so a reused PID is noticed),
//! so a process list refresh costs one small `stat` read per known process.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// What `/proc` tells about one process. Every field is `None` when the process is not visible
/// (another PID namespace, already exited, no permission).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcDetails {
    /// Real uid of the owner.
    pub uid: Option<u32>,
    /// User name of that uid (NSS lookup), or the uid as text when it has no name.
    pub user: Option<String>,
    /// Command line, arguments joined by single spaces.
    pub command: Option<String>,
    /// Container id (64 hex digits) when the process runs in a Docker/containerd/CRI-O/Podman
    /// container.
    pub container: Option<String>,
    /// Seconds since the process started.
    pub runtime_s: Option<f64>,
    /// When it started, clock ticks since boot (with the pid, its identity across PID reuse).
    pub start_ticks: Option<u64>,
}

pub use crate::sys::parse_status_uid;

/// The command line from the bytes of `/proc/PID/cmdline` (NUL-separated arguments); `None` for
/// kernel threads and zombies, whose cmdline is empty.
pub fn parse_cmdline(raw: &[u8]) -> Option<String> {
    crate::sys::parse_cmdline(raw).map(|args| args.join(" "))
}

/// The container from the text of `/proc/PID/cgroup`: for a Kubernetes pod (`…/kubepods…/pod<uid>/…`
/// with the cgroupfs driver, `…kubepods-<qos>-pod<uid>.slice/…` with systemd's, where the uid's
/// dashes are underscores) `k8s pod <uid>` — the pod is the unit people account by, and its name
/// is not in the path; else the first path segment that is (or wraps, as in `docker-<id>.scope`,
/// `cri-containerd-<id>.scope`, `crio-<id>`, `libpod-<id>`) a 64-digit hex id; else, for a Slurm
/// job step (`…/job_77/step_0`, cgroup v1 and v2), `slurm job 77`. `None` for host processes.
pub fn parse_cgroup_container(cgroup: &str) -> Option<String> {
    kube_pod(cgroup)
        .or_else(|| container_id(cgroup))
        .or_else(|| slurm_job(cgroup))
}

/// The paths of the text of `/proc/PID/cgroup` (lines `hierarchy-id:controllers:path`).
fn cgroup_paths(cgroup: &str) -> impl Iterator<Item = &str> {
    cgroup.lines().filter_map(|line| line.splitn(3, ':').nth(2))
}

fn kube_pod(cgroup: &str) -> Option<String> {
    cgroup_paths(cgroup)
        .filter(|path| path.contains("kubepods"))
        .find_map(|path| {
            path.split('/').find_map(|seg| {
                let seg = seg.strip_suffix(".slice").unwrap_or(seg);
                let uid = match seg.strip_prefix("pod") {
                    Some(uid) => uid,
                    None => &seg[seg.rfind("-pod")? + 4..],
                };
                let ok = uid.len() >= 4
                    && uid
                        .bytes()
                        .all(|b| b.is_ascii_hexdigit() || b == b'-' || b == b'_');
                ok.then(|| format!("k8s pod {}", uid.replace('_', "-").to_ascii_lowercase()))
            })
        })
}

fn slurm_job(cgroup: &str) -> Option<String> {
    cgroup_paths(cgroup)
        .filter(|path| path.contains("slurm"))
        .find_map(|path| {
            path.split('/').find_map(|seg| {
                let id = seg.strip_prefix("job_")?;
                (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| format!("{}{id}", crate::model::SLURM_JOB_PREFIX))
            })
        })
}

fn container_id(cgroup: &str) -> Option<String> {
    for path in cgroup_paths(cgroup) {
        for segment in path.rsplit('/') {
            let mut s = segment.strip_suffix(".scope").unwrap_or(segment);
            if let Some(pos) = s.rfind('-') {
                s = &s[pos + 1..];
            }
            if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Some(s.to_ascii_lowercase());
            }
        }
    }
    None
}

/// The start time (clock ticks after boot, field 22) from the text of `/proc/PID/stat`. The
/// command name (field 2) is in parentheses and may itself contain spaces and parentheses, so
/// fields are counted after the last `)`.
pub fn parse_stat_starttime(stat: &str) -> Option<u64> {
    crate::sys::parse_stat(stat).map(|s| s.start_ticks)
}

/// Seconds since boot from the text of `/proc/uptime`.
pub fn parse_uptime(uptime: &str) -> Option<f64> {
    uptime.split_whitespace().next()?.parse().ok()
}

use crate::sys::user_name;

#[derive(Debug, Clone)]
struct Known {
    start_ticks: u64,
    details: ProcDetails,
}

/// Reads `/proc` for GPU processes, remembering what does not change during a process's life.
#[derive(Debug)]
pub struct ProcCache {
    root: PathBuf,
    clock_ticks_per_s: f64,
    known: HashMap<u32, Known>,
    users: HashMap<u32, Option<String>>,
}

impl Default for ProcCache {
    fn default() -> Self {
        Self::new("/proc")
    }
}

impl ProcCache {
    /// A cache reading from `root` (normally `/proc`).
    pub fn new(root: impl AsRef<Path>) -> Self {
        // SAFETY: sysconf has no preconditions.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        ProcCache {
            root: root.as_ref().to_path_buf(),
            clock_ticks_per_s: if ticks > 0 { ticks as f64 } else { 100.0 },
            known: HashMap::new(),
            users: HashMap::new(),
        }
    }

    /// Details of `pid` now. Processes that are not visible give all-`None` details.
    pub fn lookup(&mut self, pid: u32) -> ProcDetails {
        let dir = self.root.join(pid.to_string());
        let Some(start_ticks) = std::fs::read_to_string(dir.join("stat"))
            .ok()
            .as_deref()
            .and_then(parse_stat_starttime)
        else {
            self.known.remove(&pid);
            return ProcDetails::default();
        };
        let uptime_s = std::fs::read_to_string(self.root.join("uptime"))
            .ok()
            .as_deref()
            .and_then(parse_uptime);
        let runtime_s =
            uptime_s.map(|up| (up - start_ticks as f64 / self.clock_ticks_per_s).max(0.0));
        if let Some(k) = self.known.get(&pid) {
            if k.start_ticks == start_ticks {
                let mut d = k.details.clone();
                d.runtime_s = runtime_s;
                d.start_ticks = Some(start_ticks);
                return d;
            }
        }
        let uid = std::fs::read_to_string(dir.join("status"))
            .ok()
            .as_deref()
            .and_then(parse_status_uid);
        let user = uid.and_then(|u| {
            self.users
                .entry(u)
                .or_insert_with(|| user_name(u).or_else(|| Some(u.to_string())))
                .clone()
        });
        let command = std::fs::read(dir.join("cmdline"))
            .ok()
            .as_deref()
            .and_then(parse_cmdline);
        let container = std::fs::read_to_string(dir.join("cgroup"))
            .ok()
            .as_deref()
            .and_then(parse_cgroup_container);
        let details = ProcDetails {
            uid,
            user,
            command,
            container,
            runtime_s,
            start_ticks: Some(start_ticks),
        };
        self.known.insert(
            pid,
            Known {
                start_ticks,
                details: details.clone(),
            },
        );
        details
    }

    /// Forgets processes not in `alive` (call after each refresh so the cache stays small).
    pub fn retain(&mut self, alive: &[u32]) {
        self.known.retain(|pid, _| alive.contains(pid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_from_status() {
        let status = "Name:\tpython\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t1000\t1001\t1000\t1000\nGid:\t100\n";
        assert_eq!(parse_status_uid(status), Some(1000));
        assert_eq!(parse_status_uid("Name:\tx\n"), None);
    }

    #[test]
    fn cmdline_joins_arguments() {
        assert_eq!(
            parse_cmdline(b"python\0train.py\0--lr\x003e-4\0").as_deref(),
            Some("python train.py --lr 3e-4")
        );
        assert_eq!(parse_cmdline(b""), None);
        assert_eq!(parse_cmdline(b"\0"), None);
    }

    #[test]
    fn container_ids_from_cgroup() {
        let id = "4f2a9c3b8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a";
        let cases = [
            format!("0::/system.slice/docker-{id}.scope\n"),
            format!("12:memory:/docker/{id}\n11:cpu:/docker/{id}\n"),
            format!("0::/machine.slice/libpod-{id}.scope/container\n"),
            format!("0::/crio-{id}\n"),
        ];
        for c in &cases {
            assert_eq!(parse_cgroup_container(c).as_deref(), Some(id), "{c}");
        }
        // Kubernetes: the pod (both cgroup drivers), whatever container of it
        let pod = "k8s pod 8d1d6d2f-0b0b-4e1b-9a7e-1f0e6a3b2c1d";
        for c in [
            format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod8d1d6d2f_0b0b_4e1b_9a7e_1f0e6a3b2c1d.slice/cri-containerd-{id}.scope\n"),
            format!("0::/kubepods/besteffort/pod8d1d6d2f-0b0b-4e1b-9a7e-1f0e6a3b2c1d/{id}\n"),
            format!("0::/kubepods.slice/kubepods-pod8d1d6d2f_0b0b_4e1b_9a7e_1f0e6a3b2c1d.slice/crio-{id}.scope\n"),
            format!("11:memory:/kubepods/burstable/pod8d1d6d2f-0b0b-4e1b-9a7e-1f0e6a3b2c1d/{id}\n"),
        ] {
            assert_eq!(parse_cgroup_container(&c).as_deref(), Some(pod), "{c}");
        }
        assert_eq!(
            parse_cgroup_container("0::/kubepods.slice/kubepods-besteffort.slice\n"),
            None,
            "a QoS slice alone names no pod"
        );
        assert_eq!(
            parse_cgroup_container("0::/user.slice/user-1000.slice/session-3.scope\n"),
            None
        );
        assert_eq!(parse_cgroup_container("0::/\n"), None);
        assert_eq!(
            parse_cgroup_container("0::/system.slice/slurmstepd.scope/job_77/step_0/user/task_0\n")
                .as_deref(),
            Some("slurm job 77")
        );
        assert_eq!(
            parse_cgroup_container("4:memory:/slurm/uid_1000/job_123/step_batch\n").as_deref(),
            Some("slurm job 123")
        );
    }

    #[test]
    fn stat_start_time_survives_odd_command_names() {
        let stat = "4242 (my (weird) prog) S 1 4242 4242 0 -1 4194304 100 0 0 0 5 3 0 0 20 0 1 0 987654 12345678 300 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(parse_stat_starttime(stat), Some(987_654));
        assert_eq!(parse_stat_starttime("garbage"), None);
        assert_eq!(parse_uptime("12345.67 54321.00\n"), Some(12345.67));
    }

    #[test]
    fn lookup_of_own_process_and_fake_root() {
        let mut cache = ProcCache::default();
        let me = cache.lookup(std::process::id());
        assert!(me.uid.is_some());
        assert!(me.user.is_some());
        assert!(me.command.is_some());
        assert!(me.runtime_s.is_some_and(|r| r >= 0.0));
        // Second lookup comes from the cache and still has a fresh runtime.
        assert_eq!(cache.lookup(std::process::id()).command, me.command);

        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("77");
        std::fs::create_dir(&p).unwrap();
        std::fs::write(dir.path().join("uptime"), "1000.0 1.0\n").unwrap();
        std::fs::write(
            p.join("stat"),
            "77 (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 50000 0 0\n",
        )
        .unwrap();
        std::fs::write(p.join("status"), "Uid:\t4242\t4242\t4242\t4242\n").unwrap();
        std::fs::write(p.join("cmdline"), b"a\0b\0").unwrap();
        std::fs::write(p.join("cgroup"), "0::/\n").unwrap();
        let mut fake = ProcCache::new(dir.path());
        let d = fake.lookup(77);
        assert_eq!(d.uid, Some(4242));
        assert_eq!(d.command.as_deref(), Some("a b"));
        assert_eq!(d.container, None);
        let expect = 1000.0 - 50000.0 / fake.clock_ticks_per_s;
        assert!((d.runtime_s.unwrap() - expect.max(0.0)).abs() < 1e-6);
        assert_eq!(d.start_ticks, Some(50_000));
        assert_eq!(fake.lookup(78), ProcDetails::default());
    }
}
