//! Hang forensics: when a job rule says a watched job hangs (`job_stalled`,
//! `job_hung_collective`, `nccl_hang` on its GPUs, `rank_dead`), the evidence people need to fix
//! it is collected while the job is still stuck — by morning it is gone.
//!
//! A bundle in `state_dir/forensics/<pid>-<UTC time>/`: `stacks.txt` (`py-spy dump`, with
//! `--native` when it works, of every process of the job), `output.txt` (the job's last output
//! lines), `gpus.txt` (utilization, power, SM clock, memory, XIDs of the newest snapshot),
//! `processes.txt` (the process tree) and `README.txt` (what was done, what was skipped and why).
//! Optionally a signal goes to the job first (e.g. `SIGUSR1` for PyTorch's Flight Recorder dump).
//! Bounded: at most [`MAX_PROCESSES`] processes, each dump cut at [`MAX_FILE_BYTES`], one
//! `timeout` for the whole collection; processes of other users are left alone unless
//! `other_users`; the watch rate-limits bundles per job (`min_interval`) and records each one in
//! the audit log.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::values::DurationSetting;

/// At most this many of the job's processes are dumped.
pub const MAX_PROCESSES: usize = 16;
/// Each file of a bundle is cut at this size.
pub const MAX_FILE_BYTES: usize = 1024 * 1024;

/// `[actions.forensics]` in the config file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ForensicsSection {
    /// Collect bundles for watched jobs (`run` / `attach`).
    pub enabled: bool,
    /// The alerts that trigger a bundle.
    pub alerts: Vec<String>,
    /// The py-spy executable (default: `py-spy` on the PATH; without it, stacks are skipped).
    pub py_spy: Option<PathBuf>,
    /// Try `py-spy dump --native` first (C/C++/CUDA frames too).
    pub native: bool,
    /// A signal sent to the job's processes before the dumps, e.g. `"SIGUSR1"` (off by default).
    pub signal: Option<String>,
    /// How long to wait after the signal.
    pub signal_wait: DurationSetting,
    /// The whole collection's time limit.
    pub timeout: DurationSetting,
    /// At most one bundle per job this often.
    pub min_interval: DurationSetting,
    /// Dump processes of other users too (gpuwatch must be allowed to ptrace them).
    pub other_users: bool,
}

impl Default for ForensicsSection {
    fn default() -> Self {
        ForensicsSection {
            enabled: true,
            alerts: [
                "job_stalled",
                "job_hung_collective",
                "nccl_hang",
                "rank_dead",
            ]
            .map(String::from)
            .to_vec(),
            py_spy: None,
            native: true,
            signal: None,
            signal_wait: DurationSetting::from_ms(5000),
            timeout: DurationSetting::from_ms(30_000),
            min_interval: DurationSetting::from_ms(30 * 60_000),
            other_users: false,
        }
    }
}

/// Whether process `pid` has a handler for `signal` (`SigCgt` in `/proc/PID/status`).
fn catches(pid: u32, signal: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    caught_mask(&status).is_some_and(|mask| {
        u32::try_from(signal - 1)
            .ok()
            .and_then(|bit| 1u64.checked_shl(bit))
            .is_some_and(|b| mask & b != 0)
    })
}

/// The `SigCgt` mask of a `/proc/PID/status` text.
fn caught_mask(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("SigCgt:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// The signal number of a name such as `SIGUSR1` or `USR1`.
pub fn signal_number(name: &str) -> Option<i32> {
    let n = name.trim().to_ascii_uppercase();
    let n = n.strip_prefix("SIG").unwrap_or(&n);
    Some(match n {
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "QUIT" => libc::SIGQUIT,
        "INT" => libc::SIGINT,
        "HUP" => libc::SIGHUP,
        "CONT" => libc::SIGCONT,
        _ => return None,
    })
}

impl ForensicsSection {
    /// Checks what serde could not, at `actions.forensics.*` keys.
    pub fn validate(&self) -> Vec<crate::values::Problem> {
        use crate::values::Problem;
        let mut out = Vec::new();
        if let Some(s) = &self.signal {
            if signal_number(s).is_none() {
                out.push(Problem::at(
                    "actions.forensics.signal",
                    format!("{s:?}: one of SIGUSR1, SIGUSR2, SIGQUIT, SIGINT, SIGHUP, SIGCONT"),
                ));
            }
        }
        if !(1000..=600_000).contains(&self.timeout.ms) {
            out.push(Problem::at(
                "actions.forensics.timeout",
                "must be between 1s and 10m",
            ));
        }
        out
    }

    /// Whether alert `name` asks for a bundle.
    pub fn wants(&self, name: &str) -> bool {
        self.enabled && self.alerts.iter().any(|a| a == name)
    }
}

/// What to collect.
#[derive(Debug, Clone)]
pub struct Request {
    /// The job's main process and its tree.
    pub job_pid: u32,
    pub pids: Vec<u32>,
    pub command: String,
    /// The alert that asked.
    pub alert: String,
    /// The job's last output lines.
    pub tail: Vec<String>,
    /// The newest GPU snapshot, as text.
    pub gpus: String,
    /// `state_dir/forensics`.
    pub root: PathBuf,
    /// When, UTC ms.
    pub time_ms: i64,
}

/// A collected bundle.
#[derive(Debug, Clone, PartialEq)]
pub struct Bundle {
    pub dir: PathBuf,
    /// Per process dumped: (pid, the top frames of its first thread, innermost first).
    pub top_frames: Vec<(u32, Vec<String>)>,
    /// What was skipped or failed, and why.
    pub notes: Vec<String>,
}

impl Bundle {
    /// The stacks' top frames, one line per process: `pid 4242: wait (threading.py:320) ← …`.
    pub fn summary(&self) -> String {
        self.top_frames
            .iter()
            .map(|(pid, frames)| format!("pid {pid}: {}", frames.join(" ← ")))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The py-spy to use, if installed.
fn py_spy(section: &ForensicsSection) -> Option<PathBuf> {
    if let Some(p) = &section.py_spy {
        return p.exists().then(|| p.clone());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("py-spy"))
        .find(|p| p.is_file())
}

/// Runs `cmd` until it ends or `deadline`; (success, output cut at [`MAX_FILE_BYTES`]). The
/// command runs in a process group of its own, killed whole at the deadline, and its output is
/// waited for at most a second more: a grandchild that keeps the pipe open never holds the
/// caller.
pub(crate) fn run_bounded(mut cmd: Command, deadline: Instant) -> (bool, String) {
    use std::os::unix::process::CommandExt as _;
    let child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return (false, format!("cannot start: {e}")),
    };
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let (done, output) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(o) = out.as_mut() {
            let _ = o.take(MAX_FILE_BYTES as u64).read_to_end(&mut buf);
        }
        let mut e = Vec::new();
        if let Some(x) = err.as_mut() {
            let _ = x.take(64 * 1024).read_to_end(&mut e);
        }
        buf.extend_from_slice(&e);
        let _ = done.send(buf);
    });
    let ok = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status.success(),
            Ok(None) if Instant::now() >= deadline => {
                // SAFETY: kill(2) of the process group the child leads (`process_group(0)`).
                unsafe {
                    libc::kill(-(child.id() as i32), libc::SIGKILL);
                }
                let _ = child.kill();
                let _ = child.wait();
                break false;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => break false,
        }
    };
    let text = output
        .recv_timeout(
            Duration::from_secs(1).max(deadline.saturating_duration_since(Instant::now())),
        )
        .unwrap_or_default();
    (ok, String::from_utf8_lossy(&text).into_owned())
}

/// The top `n` frames of the first thread of a `py-spy dump`, innermost first: its Python
/// frames (`func (file.py:12)`) when it has any — with `--native` the innermost ones are libc
/// and the interpreter — else its first frames.
pub fn top_frames(dump: &str, n: usize) -> Vec<String> {
    let frames: Vec<String> = dump
        .lines()
        .skip_while(|l| !l.starts_with("Thread "))
        .skip(1)
        .take_while(|l| l.starts_with("    "))
        .map(|l| l.trim().to_string())
        .collect();
    let python = |f: &&String| {
        f.strip_suffix(')')
            .and_then(|x| x.rsplit_once(':'))
            .is_some_and(|(_, line)| !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()))
    };
    let py: Vec<String> = frames.iter().filter(python).take(n).cloned().collect();
    if py.is_empty() {
        frames.into_iter().take(n).collect()
    } else {
        py
    }
}

fn write_capped(dir: &Path, name: &str, text: &str) -> std::io::Result<()> {
    let text = if text.len() > MAX_FILE_BYTES {
        let mut end = MAX_FILE_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        &text[..end]
    } else {
        text
    };
    crate::sys::write_atomic(&dir.join(name), text.as_bytes())
}

/// The process tree as text: `pid ppid state command`.
fn process_tree(pids: &[u32]) -> String {
    let mut out = String::from("PID PPID STATE COMMAND\n");
    for &pid in pids {
        let stat = crate::sys::read_stat(pid);
        let cmd = crate::sys::read_cmdline(pid)
            .map(|c| c.join(" "))
            .unwrap_or_else(|| "(gone)".into());
        match stat {
            Some(s) => out.push_str(&format!("{pid} {} {} {cmd}\n", s.ppid, s.state)),
            None => out.push_str(&format!("{pid} - - {cmd}\n")),
        }
    }
    out
}

/// Collects a bundle for `req` (blocking, within `section.timeout`).
pub fn collect(section: &ForensicsSection, req: &Request) -> Bundle {
    let started = Instant::now();
    let deadline = started + section.timeout.as_std();
    let stamp = chrono::DateTime::from_timestamp_millis(req.time_ms).map_or_else(
        || req.time_ms.to_string(),
        |t| t.format("%Y%m%dT%H%M%SZ").to_string(),
    );
    let dir = req.root.join(format!("{}-{stamp}", req.job_pid));
    let mut bundle = Bundle {
        dir: dir.clone(),
        top_frames: Vec::new(),
        notes: Vec::new(),
    };
    if let Err(e) = crate::sys::create_private_dir(&dir) {
        bundle
            .notes
            .push(format!("cannot create {}: {e}", dir.display()));
        return bundle;
    }
    let me = crate::sys::euid();
    let mut pids: Vec<u32> = Vec::new();
    for &pid in std::iter::once(&req.job_pid).chain(&req.pids) {
        if pids.contains(&pid) {
            continue;
        }
        if pids.len() >= MAX_PROCESSES {
            bundle.notes.push(format!(
                "more than {MAX_PROCESSES} processes: the rest skipped"
            ));
            break;
        }
        let uid = crate::sys::read_uid(pid);
        if uid.is_some_and(|u| u != me) && me != 0 && !section.other_users {
            bundle.notes.push(format!(
                "pid {pid}: another user's process, skipped (actions.forensics.other_users)"
            ));
            continue;
        }
        pids.push(pid);
    }
    if let Some(sig) = section.signal.as_deref().and_then(signal_number) {
        // Only to the processes that handle the signal: its default action ends a process
        // (SIGUSR1 would kill a shell wrapper or a DataLoader worker, and with it the job).
        let catching: Vec<u32> = pids.iter().copied().filter(|p| catches(*p, sig)).collect();
        for &pid in &catching {
            // SAFETY: kill(2) on a process of the job, owned as checked above, that handles it.
            unsafe { libc::kill(pid as libc::pid_t, sig) };
        }
        bundle.notes.push(format!(
            "sent {} to the {} of {} process(es) that handle it, then waited {}",
            section.signal.as_deref().unwrap_or(""),
            catching.len(),
            pids.len(),
            crate::values::format_duration_ms(section.signal_wait.ms)
        ));
        std::thread::sleep(section.signal_wait.as_std().min(deadline - Instant::now()));
    }
    let mut stacks = String::new();
    match py_spy(section) {
        None => bundle
            .notes
            .push("py-spy is not installed: no stacks (pip install py-spy)".into()),
        Some(spy) => {
            for &pid in &pids {
                if Instant::now() >= deadline {
                    bundle
                        .notes
                        .push(format!("pid {pid}: out of time, not dumped"));
                    continue;
                }
                let dump = |native: bool| {
                    let mut c = Command::new(&spy);
                    c.args(["dump", "--pid", &pid.to_string()]);
                    if native {
                        c.arg("--native");
                    }
                    run_bounded(c, deadline)
                };
                let (mut ok, mut text) = dump(section.native);
                if !ok && section.native {
                    (ok, text) = dump(false);
                }
                stacks.push_str(&format!("==== pid {pid}\n{text}\n"));
                if ok {
                    let frames = top_frames(&text, 3);
                    if !frames.is_empty() {
                        bundle.top_frames.push((pid, frames));
                    }
                } else {
                    let first = text
                        .lines()
                        .find(|l| !l.trim().is_empty())
                        .unwrap_or("failed");
                    bundle.notes.push(format!("pid {pid}: py-spy: {first}"));
                }
            }
        }
    }
    let mut readme = format!(
        "gpuwatch hang forensics for job {} ({})\nalert: {}\ncollected in {:.1} s\n",
        req.job_pid,
        req.command,
        req.alert,
        started.elapsed().as_secs_f64()
    );
    for n in &bundle.notes {
        readme.push_str(&format!("note: {n}\n"));
    }
    let written = [
        ("stacks.txt", stacks),
        ("output.txt", req.tail.join("\n") + "\n"),
        ("gpus.txt", req.gpus.clone()),
        ("processes.txt", process_tree(&pids)),
        ("README.txt", readme),
    ]
    .iter()
    .try_for_each(|(name, text)| write_capped(&dir, name, text));
    if let Err(e) = written {
        bundle.notes.push(format!("writing the bundle: {e}"));
    }
    bundle
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_frames_of_a_dump() {
        let dump = "Process 4242: python3 train.py\nPython v3.11.2 (/usr/bin/python3.11)\n\n\
                    Thread 4242 (idle): \"MainThread\"\n    stuck_here (train.py:4)\n    step (train.py:9)\n    <module> (train.py:12)\n    extra (x.py:1)\nThread 4243 (idle): \"other\"\n    run (threading.py:1)\n";
        assert_eq!(
            top_frames(dump, 3),
            vec![
                "stuck_here (train.py:4)",
                "step (train.py:9)",
                "<module> (train.py:12)"
            ]
        );
        assert!(top_frames("no threads", 3).is_empty());
        let native = "Thread 1 (idle): \"MainThread\"\n    0x7fe9 (libc.so.6)\n    PyThread_acquire_lock_timed (libpython3.11.so.1.0)\n    stuck_here (<string>:6)\n    <module> (<string>:7)\n";
        assert_eq!(
            top_frames(native, 3),
            vec!["stuck_here (<string>:6)", "<module> (<string>:7)"]
        );
    }

    #[test]
    fn signals_and_validation() {
        assert_eq!(signal_number("SIGUSR1"), Some(libc::SIGUSR1));
        assert_eq!(signal_number("usr2"), Some(libc::SIGUSR2));
        assert_eq!(signal_number("SIGKILL"), None);
        let bad = ForensicsSection {
            signal: Some("SIGKILL".into()),
            ..ForensicsSection::default()
        };
        assert_eq!(bad.validate().len(), 1);
        assert!(ForensicsSection::default().wants("job_stalled"));
        assert!(!ForensicsSection::default().wants("gpu_lost"));
    }

    /// The signal goes only to processes that handle it: a shell (which dies of SIGUSR1) does
    /// not; one that trapped it does.
    #[test]
    fn only_processes_that_handle_the_signal() {
        assert_eq!(
            caught_mask("Name:\tx\nSigCgt:\t0000000000000200\n"),
            Some(0x200)
        );
        let plain = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let trapping = std::process::Command::new("sh")
            .args(["-c", "trap 'echo got' USR1; while true; do sleep 1; done"])
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        while !catches(trapping.id(), libc::SIGUSR1) && t0.elapsed().as_secs() < 10 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(catches(trapping.id(), libc::SIGUSR1));
        assert!(!catches(plain.id(), libc::SIGUSR1));
        for mut c in [plain, trapping] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
