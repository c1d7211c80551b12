//! PID namespaces: NVML reports host PIDs; gpuwatch can only signal PIDs of its own namespace.
//!
//! In the initial namespace (detected by `kthreadd` at PID 2, which only exists there) host PID
//! and local PID are the same. Inside a container gpuwatch cannot see host PIDs through its own
//! `/proc`; when the host's `/proc` is mounted (`actions.kill.host_proc`, e.g. `/host/proc`) the
//! `NSpid` line of `/host/proc/HOSTPID/status` lists the process's PID in every nested namespace,
//! and the entry at gpuwatch's own depth is the local PID (verified by start time). Otherwise the
//! mapping is refused with a reason.

use std::path::{Path, PathBuf};

/// A PID and the namespace it is counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pid {
    /// As NVML reports it: the host's PID namespace.
    Host(u32),
    /// As gpuwatch sees it: its own PID namespace (a job it started or attached to).
    Local(u32),
}

impl Pid {
    /// The number, whatever its namespace.
    pub fn number(self) -> u32 {
        match self {
            Pid::Host(p) | Pid::Local(p) => p,
        }
    }
}

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

    /// The host PID of local PID `local` (`None` when it cannot be told).
    pub fn host_of(&self, local: u32) -> Option<u32> {
        match self {
            PidMapper::Identity => Some(local),
            PidMapper::Unavailable(_) => None,
            PidMapper::HostProc { root, depth } => {
                use std::os::unix::fs::MetadataExt as _;
                // The same process in both views: our namespace, the same PID in it, the same
                // start time.
                let start = crate::sys::read_stat(local)?.start_ticks;
                let ours = std::fs::metadata("/proc/self/ns/pid").ok()?.ino();
                std::fs::read_dir(root).ok()?.flatten().find_map(|e| {
                    let host: u32 = e.file_name().to_str()?.parse().ok()?;
                    let status = std::fs::read_to_string(e.path().join("status")).ok()?;
                    let nspid = parse_nspid(&status)?;
                    if nspid.len() != depth + 1 || local_pid(&nspid, *depth) != Some(local) {
                        return None;
                    }
                    if start_ticks_in(&e.path())? != start {
                        return None;
                    }
                    let ns = std::fs::metadata(e.path().join("ns/pid")).ok()?.ino();
                    (ns == ours).then_some(host)
                })
            }
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
                let host_start = start_ticks_in(&root.join(host_pid.to_string()));
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

/// The start time (clock ticks since boot) in `dir/stat`, a process's directory under a `/proc`
/// (ours or the host's).
fn start_ticks_in(dir: &Path) -> Option<u64> {
    crate::sys::parse_stat(&std::fs::read_to_string(dir.join("stat")).ok()?).map(|s| s.start_ticks)
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

/// When local PID `pid` is PID 1 of a PID namespace nested below ours (its `NSpid` line has
/// more than one entry and ends in 1), the processes its death takes with it: the kernel kills
/// every process of that namespace, and of the namespaces nested in it, when their init dies —
/// including processes that joined from outside (`nsenter`, `docker exec -u root`), which are
/// not its descendants. `Ok(None)` when `pid` is no namespace init (or is gone); `Err` names a
/// process that may be a member but whose namespace cannot be read (the caller must then refuse).
pub fn namespace_members(pid: u32) -> Result<Option<Vec<u32>>, String> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Ok(None);
    };
    let Some(nspid) = parse_nspid(&status) else {
        return Ok(None);
    };
    if nspid.len() < 2 || nspid.last() != Some(&1) {
        return Ok(None);
    }
    let depth = nspid.len();
    let ns = match ns_inode(pid) {
        Ok(Some(ino)) => ino,
        Ok(None) => return Ok(None),
        Err(e) => return Err(format!("cannot read the PID namespace of pid {pid}: {e}")),
    };
    let rd = std::fs::read_dir("/proc").map_err(|e| format!("/proc: {e}"))?;
    let mut members = Vec::new();
    for entry in rd.flatten() {
        let Some(other) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if other == pid {
            continue;
        }
        // A process of that namespace or one below it has a PID at every level down to it.
        let Some(theirs) = std::fs::read_to_string(entry.path().join("status"))
            .ok()
            .and_then(|s| parse_nspid(&s))
        else {
            continue;
        };
        if theirs.len() < depth {
            continue;
        }
        match in_namespace(other, ns, theirs.len() - depth) {
            Ok(true) => members.push(other),
            Ok(false) => {}
            Err(e) => {
                return Err(format!(
                    "cannot tell whether pid {other} is in the PID namespace of pid {pid}: {e}"
                ))
            }
        }
    }
    members.sort_unstable();
    Ok(Some(members))
}

/// The inode of `pid`'s PID namespace (`None`: the process is gone).
fn ns_inode(pid: u32) -> std::io::Result<Option<u64>> {
    use std::os::unix::fs::MetadataExt as _;
    match std::fs::metadata(format!("/proc/{pid}/ns/pid")) {
        Ok(m) => Ok(Some(m.ino())),
        Err(e) if gone(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

fn gone(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
}

/// Whether `pid`'s PID namespace is `ns` or lies at most `levels` namespaces below it (walked up
/// with the `NS_GET_PARENT` ioctl). A process that exited meanwhile is no member.
fn in_namespace(pid: u32, ns: u64, levels: usize) -> std::io::Result<bool> {
    use std::os::fd::{AsRawFd as _, FromRawFd as _};
    use std::os::unix::fs::MetadataExt as _;
    let mut file = match std::fs::File::open(format!("/proc/{pid}/ns/pid")) {
        Ok(f) => f,
        Err(e) if gone(&e) => return Ok(false),
        Err(e) => return Err(e),
    };
    for _ in 0..levels {
        if file.metadata()?.ino() == ns {
            return Ok(true);
        }
        // SAFETY: NS_GET_PARENT on a namespace file descriptor returns a new descriptor or -1.
        let parent = unsafe { libc::ioctl(file.as_raw_fd(), libc::NS_GET_PARENT) };
        if parent < 0 {
            // EPERM: the parent lies outside our own namespace, so `ns` (inside it) is no
            // ancestor.
            let e = std::io::Error::last_os_error();
            return if e.raw_os_error() == Some(libc::EPERM) {
                Ok(false)
            } else {
                Err(e)
            };
        }
        // SAFETY: `parent` is a fresh descriptor that nothing else owns.
        file = unsafe { std::fs::File::from_raw_fd(parent) };
    }
    Ok(file.metadata()?.ino() == ns)
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
        if start_ticks_in(&entry.path()) == Some(my_start) {
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

    /// A user's job that is PID 1 of its own PID namespace (a container started with
    /// `docker run --user` and no init) holds a root process that joined with `nsenter`: the
    /// kill of the job is refused and audited, and the root process lives. Once it is gone, the
    /// same ladder stops the job. Needs root (CI runs as root); elsewhere it says so and passes.
    #[test]
    fn a_container_init_is_not_killed_while_a_protected_process_shares_its_namespace() {
        use crate::action::audit::{AuditDecision, AuditLog};
        use crate::action::ladder::{KillManager, KillRequest};
        use crate::action::policy::{KillPolicy, KillSection};
        use crate::values::DurationSetting;
        use std::collections::HashMap;
        use std::io::BufRead as _;
        use std::os::unix::process::CommandExt as _;
        use std::process::{Command, Stdio};
        use std::time::{Duration, Instant};

        if unsafe { libc::geteuid() } != 0 {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs as root and must test PID namespaces"
            );
            eprintln!("skipped: making PID namespaces needs root");
            return;
        }
        // The job: `sleep` as nobody, PID 1 of a new PID namespace.
        let mut job = Command::new("unshare")
            .args(["--pid", "--fork", "--kill-child"])
            .args([
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
            ])
            .args(["sh", "-c", "echo ready; exec sleep 600"])
            .process_group(0)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(job.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
        let children =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", job.id())).unwrap();
        let init: u32 = children.split_whitespace().next().unwrap().parse().unwrap();
        let nspid = parse_nspid(&std::fs::read_to_string(format!("/proc/{init}/status")).unwrap());
        assert_eq!(nspid.as_ref().and_then(|n| n.last()), Some(&1), "{nspid:?}");
        assert_eq!(namespace_members(init), Ok(Some(vec![])));
        // A root process joins the namespace from outside (not a descendant of the job).
        let mut root = Command::new("nsenter")
            .args(["-t", &init.to_string(), "-p", "--", "sleep", "600"])
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let member = loop {
            if let Ok(Some(m)) = namespace_members(init) {
                if let Some(&m) = m.first() {
                    break m;
                }
            }
            assert!(Instant::now() < deadline, "the root process joined");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(crate::sys::read_uid(member), Some(0));
        // Whatever happens below, nothing of the test outlives it.
        struct Reap(Vec<u32>);
        impl Drop for Reap {
            fn drop(&mut self) {
                for &pid in &self.0 {
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                }
            }
        }
        let _reap = Reap(vec![member, init, job.id(), root.id()]);

        let dir = tempfile::tempdir().unwrap();
        let section = KillSection {
            dry_run: false,
            allow_users: vec!["nobody".into()],
            min_uid: 0,
            grace: DurationSetting::from_ms(0),
            term_timeout: DurationSetting::from_ms(200),
            ..KillSection::default()
        };
        let audit_path = dir.path().join("audit.jsonl");
        let mut m = KillManager::new(
            KillPolicy::new(section),
            AuditLog::open(&audit_path).unwrap(),
            PidMapper::Identity,
        );
        let gpu_of = HashMap::from([(init, 0)]);
        let ask = |m: &mut KillManager| {
            m.request(KillRequest {
                host_pid: init,
                start_ticks: None,
                local: false,
                mig: None,
                alert: "gpu_memory_quota".into(),
                fingerprint: "fp".into(),
                reason: "over its quota".into(),
            });
        };
        ask(&mut m);
        let refused = m.tick(crate::sys::now_ms(), &gpu_of);
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(refused[0].decision, AuditDecision::Refused, "{refused:?}");
        assert!(
            refused[0].reason.contains("PID namespace")
                && refused[0].reason.contains(&format!("pid {member}")),
            "{}",
            refused[0].reason
        );
        assert_eq!(m.active(), 0);
        let logged = AuditLog::read_all(&audit_path).unwrap();
        assert_eq!(
            logged.last().map(|r| r.decision),
            Some(AuditDecision::Refused)
        );
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            crate::sys::live_start_ticks(member).is_some(),
            "the root process lives"
        );
        assert!(
            crate::sys::live_start_ticks(init).is_some(),
            "the job lives"
        );

        // Without it, the job is stopped (SIGTERM is ignored by a namespace init without a
        // handler; SIGKILL follows).
        unsafe { libc::kill(member as libc::pid_t, libc::SIGKILL) };
        root.wait().unwrap();
        ask(&mut m);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut decisions = Vec::new();
        while m.active() > 0 && Instant::now() < deadline {
            decisions.extend(
                m.tick(crate::sys::now_ms(), &gpu_of)
                    .into_iter()
                    .map(|r| r.decision),
            );
            let _ = job.try_wait();
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(decisions.contains(&AuditDecision::Kill), "{decisions:?}");
        let status = job.wait().unwrap();
        assert!(!status.success(), "the job was stopped: {status:?}");
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
        assert_eq!(m.host_of(me), Some(me));
        assert_eq!(PidMapper::Identity.host_of(me), Some(me));
        assert_eq!(PidMapper::Unavailable("x".into()).host_of(me), None);
    }
}
