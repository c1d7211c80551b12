//! The `exec` action: run a configured command for an alert, with the alert in environment
//! variables and as JSON on stdin, under a time limit; its output is captured and logged.
//!
//! The command runs in its own process group with a minimal environment (PATH, HOME, USER,
//! LOGNAME, LANG, LC_ALL, TZ, TMPDIR plus the `GPUWATCH_*` variables), so secrets gpuwatch reads
//! from its environment never reach user scripts. On timeout the group gets SIGTERM, then SIGKILL
//! two seconds later.

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::settings::{DurationSetting, RegexSetting};
use crate::model::{AlertEvent, AlertStatus};

/// Most bytes of stdout and of stderr kept per run.
const MAX_OUTPUT_BYTES: usize = 64 * 1024;

/// Environment variables passed through from gpuwatch's own environment.
const PASS_ENV: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR",
];

/// One `[[actions.exec]]` entry.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExecSection {
    /// Name; a rule selects it with `action: "exec:NAME"`.
    pub name: String,
    /// Program and arguments (no shell; use `["sh", "-c", "…"]` for one).
    pub command: Vec<String>,
    /// Time limit (default 30s).
    #[serde(default = "default_timeout")]
    pub timeout: DurationSetting,
    /// Also run for alerts whose name matches one of these regexes (besides rules naming it).
    #[serde(default)]
    pub alerts: Vec<RegexSetting>,
    /// Run on `firing`, `resolved` or both (default `["firing"]`).
    #[serde(default = "default_on")]
    pub on: Vec<ExecOn>,
}

/// Which alert transitions run an exec action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecOn {
    /// The alert fires (and repeats).
    Firing,
    /// The alert resolves.
    Resolved,
}

fn default_timeout() -> DurationSetting {
    DurationSetting::from_ms(30_000)
}

fn default_on() -> Vec<ExecOn> {
    vec![ExecOn::Firing]
}

impl ExecSection {
    /// Checks the entry; errors name it.
    pub fn validate(&self) -> Result<(), String> {
        if self.command.is_empty() || self.command[0].is_empty() {
            return Err(format!("actions.exec {:?}: command is empty", self.name));
        }
        Ok(())
    }

    /// Whether this entry runs for `event`: the rule named it (`action` annotation
    /// `exec:NAME`) or the alert name matches `alerts`, and the status is in `on`.
    pub fn matches(&self, event: &AlertEvent) -> bool {
        let status = match event.status {
            AlertStatus::Firing => ExecOn::Firing,
            AlertStatus::Resolved => ExecOn::Resolved,
        };
        if !self.on.contains(&status) {
            return false;
        }
        let named = event
            .actions
            .iter()
            .any(|a| matches!(a, crate::model::Action::Exec(n) if *n == self.name));
        named || self.alerts.iter().any(|r| r.0.is_match(&event.name))
    }
}

/// What happened when an exec action ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecOutcome {
    /// The entry's name.
    pub name: String,
    /// Exit code, when it exited.
    pub exit_code: Option<i32>,
    /// Signal that ended it, when one did.
    pub signal: Option<i32>,
    /// True when the time limit was hit and the command was killed.
    pub timed_out: bool,
    /// How long it ran, ms.
    pub duration_ms: u64,
    /// Captured stdout (lossy UTF-8, at most 64 KiB).
    pub stdout: String,
    /// Captured stderr (lossy UTF-8, at most 64 KiB).
    pub stderr: String,
    /// Set when it could not be started.
    pub error: Option<String>,
}

impl ExecOutcome {
    /// True when it exited 0 in time.
    pub fn success(&self) -> bool {
        self.exit_code == Some(0) && !self.timed_out && self.error.is_none()
    }
}

/// The `GPUWATCH_*` environment for `event`.
pub fn alert_env(event: &AlertEvent, hostname: &str) -> Vec<(String, String)> {
    let time = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .unwrap_or_default()
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    };
    let mut env = vec![
        ("GPUWATCH_ALERT_NAME".to_string(), event.name.clone()),
        (
            "GPUWATCH_ALERT_STATUS".to_string(),
            match event.status {
                AlertStatus::Firing => "firing".into(),
                AlertStatus::Resolved => "resolved".into(),
            },
        ),
        (
            "GPUWATCH_ALERT_SEVERITY".to_string(),
            event.severity.as_str().into(),
        ),
        (
            "GPUWATCH_ALERT_FINGERPRINT".to_string(),
            event.fingerprint.clone(),
        ),
        (
            "GPUWATCH_ALERT_STARTS_AT".to_string(),
            time(event.starts_at_ms),
        ),
        (
            "GPUWATCH_ALERT_REPEAT".to_string(),
            event.repeat.to_string(),
        ),
        ("GPUWATCH_HOSTNAME".to_string(), hostname.to_string()),
    ];
    if let Some(end) = event.ends_at_ms {
        env.push(("GPUWATCH_ALERT_ENDS_AT".into(), time(end)));
    }
    if let Some(gpu) = event.gpu {
        env.push(("GPUWATCH_ALERT_GPU".into(), gpu.to_string()));
    }
    for key in ["summary", "description", "ended"] {
        if let Some(v) = event.annotations.get(key) {
            env.push((
                format!("GPUWATCH_ALERT_{}", key.to_ascii_uppercase()),
                v.clone(),
            ));
        }
    }
    for (k, v) in &event.labels {
        let name: String = k
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_uppercase()
                } else {
                    '_'
                }
            })
            .collect();
        env.push((format!("GPUWATCH_LABEL_{name}"), v.clone()));
    }
    env
}

/// Runs `section` for `event` and waits for it (at most its timeout plus the kill grace).
pub fn run_exec(section: &ExecSection, event: &AlertEvent, hostname: &str) -> ExecOutcome {
    let start = Instant::now();
    let mut outcome = ExecOutcome {
        name: section.name.clone(),
        exit_code: None,
        signal: None,
        timed_out: false,
        duration_ms: 0,
        stdout: String::new(),
        stderr: String::new(),
        error: None,
    };
    let Some((program, args)) = section.command.split_first() else {
        outcome.error = Some("empty command".into());
        return outcome;
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for key in PASS_ENV {
        if let Some(v) = std::env::var_os(key) {
            cmd.env(key, v);
        }
    }
    cmd.envs(alert_env(event, hostname));
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            outcome.error = Some(format!("cannot start {program:?}: {e}"));
            tracing::error!(exec = %section.name, "{}", outcome.error.as_deref().unwrap_or(""));
            return outcome;
        }
    };
    let json = serde_json::to_vec(event).unwrap_or_default();
    let stdin = child.stdin.take();
    let writer = std::thread::spawn(move || {
        if let Some(mut s) = stdin {
            // The script may not read stdin; a broken pipe is fine.
            let _ = s.write_all(&json);
        }
    });
    let readers = [
        child
            .stdout
            .take()
            .map(|s| std::thread::spawn(move || capture(s))),
        child
            .stderr
            .take()
            .map(|s| std::thread::spawn(move || capture(s))),
    ];
    let pgid = child.id() as libc::pid_t;
    let deadline = start + section.timeout.as_std();
    let mut term_sent_at: Option<Instant> = None;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) => {}
            Err(e) => {
                outcome.error = Some(format!("cannot wait: {e}"));
                break None;
            }
        }
        let now = Instant::now();
        if now >= deadline && term_sent_at.is_none() {
            outcome.timed_out = true;
            // SAFETY: kill(2) on the command's own process group.
            unsafe { libc::kill(-pgid, libc::SIGTERM) };
            term_sent_at = Some(now);
        }
        if term_sent_at.is_some_and(|t| now >= t + Duration::from_secs(2)) {
            // SAFETY: as above.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    if outcome.timed_out {
        // Take down anything the command left behind in its group.
        // SAFETY: as above.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
    }
    // Something the command left running in its group may still hold its pipes: its output is
    // waited for a moment, then the group is taken down, and a pipe still held after that is
    // left behind (its thread ends when the holder does) — the action stays bounded.
    let [out, err] = readers;
    let pipes = [
        Some(Pipe::from(writer)),
        out.map(Pipe::from),
        err.map(Pipe::from),
    ];
    let finished = |p: &[Option<Pipe>; 3]| p.iter().flatten().all(Pipe::is_finished);
    let wait = |p: &[Option<Pipe>; 3], d: Duration| {
        let until = Instant::now() + d;
        while !finished(p) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    wait(&pipes, Duration::from_secs(2));
    if !finished(&pipes) {
        // SAFETY: kill(2) on the command's own process group.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        wait(&pipes, Duration::from_secs(1));
    }
    let [_, out, err] = pipes;
    outcome.stdout = out.and_then(Pipe::output).unwrap_or_default();
    outcome.stderr = err.and_then(Pipe::output).unwrap_or_default();
    if let Some(status) = status {
        outcome.exit_code = status.code();
        outcome.signal = status.signal();
    }
    outcome.duration_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    log_outcome(&outcome);
    outcome
}

/// A thread feeding or draining one of the command's pipes.
enum Pipe {
    Feed(std::thread::JoinHandle<()>),
    Drain(std::thread::JoinHandle<String>),
}

impl From<std::thread::JoinHandle<()>> for Pipe {
    fn from(h: std::thread::JoinHandle<()>) -> Pipe {
        Pipe::Feed(h)
    }
}

impl From<std::thread::JoinHandle<String>> for Pipe {
    fn from(h: std::thread::JoinHandle<String>) -> Pipe {
        Pipe::Drain(h)
    }
}

impl Pipe {
    fn is_finished(&self) -> bool {
        match self {
            Pipe::Feed(h) => h.is_finished(),
            Pipe::Drain(h) => h.is_finished(),
        }
    }

    /// What a drained pipe gave, when its thread has ended (a pipe still held is left behind).
    fn output(self) -> Option<String> {
        match self {
            Pipe::Drain(h) if h.is_finished() => h.join().ok(),
            _ => None,
        }
    }
}

fn capture(mut from: impl Read) -> String {
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = MAX_OUTPUT_BYTES.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    String::from_utf8_lossy(&kept).into_owned()
}

fn log_outcome(o: &ExecOutcome) {
    if o.success() {
        tracing::info!(exec = %o.name, duration_ms = o.duration_ms, stdout = %o.stdout.trim_end(), stderr = %o.stderr.trim_end(), "exec action finished");
    } else {
        tracing::warn!(exec = %o.name, exit_code = ?o.exit_code, signal = ?o.signal, timed_out = o.timed_out, error = ?o.error, stdout = %o.stdout.trim_end(), stderr = %o.stderr.trim_end(), "exec action failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Severity;

    fn event() -> AlertEvent {
        let mut labels = std::collections::BTreeMap::new();
        labels.insert("alertname".into(), "gpu_hot".into());
        labels.insert("gpu".into(), "1".into());
        let mut annotations = std::collections::BTreeMap::new();
        annotations.insert("summary".into(), "GPU 1 at 91 °C".into());
        AlertEvent {
            fingerprint: "f00d".into(),
            name: "gpu_hot".into(),
            severity: Severity::Critical,
            status: AlertStatus::Firing,
            labels,
            annotations,
            starts_at_ms: 1_764_687_600_000,
            ends_at_ms: None,
            at_ms: 1_764_687_600_000,
            repeat: false,
            gpu: Some(1),
            actions: vec![crate::model::Action::Exec("checkpoint".into())],
            target_pid: None,
            target_start: None,
            target_local: false,
            chart: None,
            once: false,
            ended: None,
        }
    }

    fn section(script: &str, timeout_ms: i64) -> ExecSection {
        ExecSection {
            name: "checkpoint".into(),
            command: vec!["sh".into(), "-c".into(), script.into()],
            timeout: DurationSetting::from_ms(timeout_ms),
            alerts: vec![],
            on: default_on(),
        }
    }

    #[test]
    fn env_and_stdin_reach_the_command() {
        let s = section(
            r#"echo "$GPUWATCH_ALERT_NAME $GPUWATCH_ALERT_STATUS $GPUWATCH_ALERT_GPU $GPUWATCH_LABEL_ALERTNAME"; echo "$GPUWATCH_ALERT_SUMMARY"; cat; echo err >&2"#,
            5000,
        );
        let o = run_exec(&s, &event(), "node1");
        assert!(o.success(), "{o:?}");
        let mut lines = o.stdout.lines();
        assert_eq!(lines.next(), Some("gpu_hot firing 1 gpu_hot"));
        assert_eq!(lines.next(), Some("GPU 1 at 91 °C"));
        let json: AlertEvent = serde_json::from_str(lines.next().unwrap()).unwrap();
        assert_eq!(json, event());
        assert_eq!(o.stderr, "err\n");
    }

    #[test]
    fn secrets_in_our_environment_are_not_passed() {
        std::env::set_var("GPUWATCH_TEST_SECRET_SMTP_PASSWORD", "hunter2");
        let o = run_exec(&section("env", 5000), &event(), "h");
        assert!(!o.stdout.contains("hunter2"));
        assert!(o.stdout.contains("GPUWATCH_ALERT_NAME=gpu_hot"));
    }

    #[test]
    fn timeout_kills_the_command() {
        let s = section("trap '' TERM; sleep 30", 200);
        let start = Instant::now();
        let o = run_exec(&s, &event(), "h");
        assert!(o.timed_out);
        assert!(!o.success());
        assert_eq!(o.signal, Some(libc::SIGKILL));
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        let o = run_exec(&section("sleep 30", 200), &event(), "h");
        assert_eq!(o.signal, Some(libc::SIGTERM));
    }

    /// A command that leaves something running that holds its output does not keep the action
    /// (and the daemon's stop, which waits for actions) waiting for it.
    #[test]
    fn a_process_left_holding_the_output_does_not_hold_the_action() {
        let s = section("sleep 60 & echo started", 30_000);
        let start = Instant::now();
        let o = run_exec(&s, &event(), "h");
        assert!(o.success(), "{o:?}");
        assert_eq!(o.stdout.trim(), "started");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn failures_are_reported() {
        let o = run_exec(&section("exit 4", 5000), &event(), "h");
        assert_eq!(o.exit_code, Some(4));
        let mut s = section("", 1000);
        s.command = vec!["/nonexistent/tool".into()];
        let o = run_exec(&s, &event(), "h");
        assert!(o.error.unwrap().contains("cannot start"));
    }

    #[test]
    fn matching() {
        let mut s = section("true", 1000);
        assert!(s.matches(&event()));
        let mut e = event();
        e.actions.clear();
        assert!(!s.matches(&e));
        // An annotation naming the entry is presentation only: it never runs the command.
        e.annotations
            .insert("action".into(), "exec:checkpoint".into());
        assert!(!s.matches(&e));
        s.alerts = vec![RegexSetting::new("^gpu_").unwrap()];
        assert!(s.matches(&e));
        e.status = AlertStatus::Resolved;
        assert!(!s.matches(&e));
        s.on = vec![ExecOn::Resolved];
        assert!(s.matches(&e));
        s.command.clear();
        assert!(s.validate().is_err());
        let text = "[[actions.exec]]\nname = \"x\"\ncommand = [\"true\"]\non = [\"sometimes\"]\n";
        let err = crate::config::parse(text, std::path::Path::new("c.toml")).unwrap_err();
        assert_eq!(err[0].line, 4, "{err}");
    }
}
