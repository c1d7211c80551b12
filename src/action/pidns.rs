//! PID namespaces: NVML reports host PIDs; gpuwatch can only signal PIDs of its own namespace.
//!
//! In the initial namespace (detected by `kthreadd` at PID 2, which only exists there) host PID
//! and local PID are the same. Inside a container gpuwatch cannot see host PIDs through its own
//! `/proc`; when the host's `/proc` is mounted (`actions.kill.host_proc`, e.g. `/host/proc`) the
//! `NSpid` line of `/host/proc/HOSTPID/status` lists the process's PID in every nested namespace,
//! and the entry at gpuwatch's own depth is the local PID (verified by start time). Otherwise the
//! mapping is refused with a reason.

use std::path::{Path, PathBuf};

/// How host PIDs become local PIDs.
#[derive(Debug, Clone, PartialEq)]
pub enum PidMapper {
    /// gpuwatch runs in the host PID namespace: same numbers.
    Identity,
    /// Through a host `/proc` mount; `depth` is gpuwatch's namespace depth below the host.
    HostProc {
        /// The host's `/proc`.
        root: PathBuf,
        /// gpuwatch's namespace depth (0 = host).
        depth: usize,
    },
    /// No mapping possible; the reason.
    Unavailable(String),
}

impl PidMapper {
    /// Detects the situation of this process. `host_proc` is the configured host `/proc` mount.
    pub fn detect(host_proc: Option<&Path>) -> PidMapper {
        if in_initial_pid_namespace(Path::new("/proc")) {
            return PidMapper::Identity;
        }
        let Some(root) = host_proc else {
            return PidMapper::Unavailable(
                "gpuwatch runs inside a PID namespace (container) and cannot see the host PIDs \
                 NVML reports; run it with the host PID namespace (--pid=host / hostPID) or set \
                 actions.kill.host_proc to a mount of the host's /proc"
                    .into(),
            );
        };
        match own_depth(root) {
            Some(depth) => PidMapper::HostProc {
                root: root.to_path_buf(),
                depth,
            },
            None => PidMapper::Unavailable(format!(
                "cannot find gpuwatch itself in {} (is it the host's /proc?)",
                root.display()
            )),
        }
    }

    /// The local PID of host PID `host_pid`.
    pub fn map(&self, host_pid: u32) -> Result<u32, String> {
        match self {
            PidMapper::Identity => Ok(host_pid),
            PidMapper::Unavailable(reason) => Err(reason.clone()),
            PidMapper::HostProc { root, depth } => {
                let status = std::fs::read_to_string(root.join(format!("{host_pid}/status")))
                    .map_err(|e| format!("host PID {host_pid}: {e}"))?;
                let nspid = parse_nspid(&status)
                    .ok_or_else(|| format!("host PID {host_pid}: no NSpid line (kernel < 4.1?)"))?;
                let local = local_pid(&nspid, *depth).ok_or_else(|| {
                    format!("host PID {host_pid} is not in gpuwatch's PID namespace")
                })?;
                // The same process in both views has the same start time.
                let host_start = crate::sys::parse_stat(
                    &std::fs::read_to_string(root.join(format!("{host_pid}/stat")))
                        .unwrap_or_default(),
                )
                .map(|s| s.start_ticks);
                let local_start = crate::sys::read_stat(local).map(|s| s.start_ticks);
                if host_start.is_none() || host_start != local_start {
                    return Err(format!(
                        "host PID {host_pid} → local PID {local}: start times differ, refusing"
                    ));
                }
                Ok(local)
            }
        }
    }
}

/// True when `proc_root` shows `kthreadd` as PID 2 with parent 0 (the initial PID namespace).
pub fn in_initial_pid_namespace(proc_root: &Path) -> bool {
    std::fs::read_to_string(proc_root.join("2/status")).is_ok_and(|s| {
        s.lines()
            .any(|l| l.split_whitespace().eq(["Name:", "kthreadd"]))
            && s.lines().any(|l| l.split_whitespace().eq(["PPid:", "0"]))
    })
}

/// The PIDs of the `NSpid:` line, outermost namespace first.
pub fn parse_nspid(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    line["NSpid:".len()..]
        .split_whitespace()
        .map(|s| s.parse().ok())
        .collect()
}

/// The PID at namespace depth `depth` (0 = outermost) of an NSpid list.
pub fn local_pid(nspid: &[u32], depth: usize) -> Option<u32> {
    nspid.get(depth).copied()
}

/// gpuwatch's depth below the namespace of `host_proc`: find the host entry whose innermost
/// NSpid is our PID and whose start time matches ours.
fn own_depth(host_proc: &Path) -> Option<usize> {
    let me = std::process::id();
    let my_start = crate::sys::read_stat(me)?.start_ticks;
    for entry in std::fs::read_dir(host_proc).ok()?.flatten() {
        let name = entry.file_name();
        let Some(_) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let Some(nspid) = parse_nspid(&status) else {
            continue;
        };
        if nspid.last() != Some(&me) {
            continue;
        }
        let start = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|s| crate::sys::parse_stat(&s))
            .map(|s| s.start_ticks);
        if start == Some(my_start) {
            return Some(nspid.len() - 1);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nspid_lines() {
        let status =
            "Name:\tpython\nTgid:\t4242\nNgid:\t0\nPid:\t4242\nPPid:\t1\nNSpid:\t4242\t17\t1\n";
        assert_eq!(parse_nspid(status), Some(vec![4242, 17, 1]));
        assert_eq!(local_pid(&[4242, 17, 1], 0), Some(4242));
        assert_eq!(local_pid(&[4242, 17, 1], 1), Some(17));
        assert_eq!(local_pid(&[4242], 1), None);
        assert_eq!(parse_nspid("Name:\tx\n"), None);
    }

    #[test]
    fn namespace_detection_on_fake_proc() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!in_initial_pid_namespace(dir.path()));
        std::fs::create_dir(dir.path().join("2")).unwrap();
        std::fs::write(dir.path().join("2/status"), "Name:\tkthreadd\nPPid:\t0\n").unwrap();
        assert!(in_initial_pid_namespace(dir.path()));
    }

    #[test]
    fn unavailable_mapping_refuses_with_reason() {
        let m = PidMapper::Unavailable("in a container".into());
        assert_eq!(m.map(5), Err("in a container".into()));
        assert_eq!(PidMapper::Identity.map(5), Ok(5));
    }

    #[test]
    fn host_proc_mapping_of_ourselves() {
        // Our own /proc as the "host" view: depth 0, and our PID maps to itself.
        let m = PidMapper::HostProc {
            root: "/proc".into(),
            depth: own_depth(Path::new("/proc")).unwrap(),
        };
        let me = std::process::id();
        assert_eq!(m.map(me), Ok(me));
    }
}
