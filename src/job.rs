//! Training jobs: `gpuwatch run -- CMD` (wrap) and `gpuwatch attach PID`.
//!
//! `run` spawns the command in its own process group, passes its stdout and stderr through
//! byte for byte (each chunk is written as soon as it is read, so partial lines such as tqdm bars
//! appear at once), optionally tees both to a file, scans the lines for progress and crash
//! markers, forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT to the job's group, and when the job ends
//! builds a [`JobReport`]: exit code or signal, crash class, duration, progress, last lines and,
//! when a sampler ran, per-GPU peak memory and mean utilization. `attach` watches a process it did
//! not start (pidfd, else polling `/proc`).
//!
//! While the job runs, a [`JobObserver`] gets a [`JobSample`] every tick: that is where the GPU
//! sampler, the rules engine and the kill action plug in. Submodules: [`progress`] (patterns),
//! [`scan`] (lines, tail, markers), [`follow`] (log files), [`oom`] (OOM-killer evidence),
//! [`report`] (exit, classification, report).

pub mod follow;
pub mod oom;
pub mod progress;
pub mod report;
pub mod scan;
pub mod tty;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use anyhow::Context;

use crate::sys::hostname;
pub use crate::sys::{now_ms, parse_stat, read_cmdline, read_stat, ProcStat};
use serde::Deserialize;

pub use crate::model::job::JobSample;
pub use follow::LogFollower;
pub use progress::{ProgressParser, ProgressState, ProgressUpdate};
pub use report::{classify, CrashClass, ExitEvidence, GpuJobStats, GpuUsage, JobExit, JobReport};
pub use scan::{Markers, OutputScanner, Stream};

/// `[job]` in the config file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct JobSection {
    /// Extra progress regexes (tried before the defaults). Named groups `step`, `total`,
    /// `epoch`, `epochs` are read; a pattern without them counts every match as progress.
    pub progress: Vec<crate::values::RegexSetting>,
    /// Whether the built-in patterns (Epoch 3/10, step N, tqdm, Lightning, HF Trainer) apply.
    pub default_patterns: bool,
    /// How many output lines the end-of-job report keeps.
    pub tail_lines: usize,
    /// Tee the job's output to this file (appended), relative to the config file.
    pub tee: Option<PathBuf>,
    /// Follow this log file for progress.
    pub progress_log: Option<PathBuf>,
    /// How often the job is sampled for rules, e.g. `"1s"` (at least 10 ms).
    pub tick: crate::values::DurationSetting,
    /// How long `run` / `attach` wait at the end for notifications to be delivered (`"30s"`).
    pub notify_timeout: crate::values::DurationSetting,
    /// When jobs should be done: a local time `"08:00"` (the next one after the job starts) or
    /// `"2026-12-04 08:00"`; `job_eta` says when the pace will miss it. `run --deadline` wins.
    pub deadline: Option<String>,
}

impl Default for JobSection {
    fn default() -> Self {
        JobSection {
            progress: Vec::new(),
            default_patterns: true,
            tail_lines: 20,
            tee: None,
            progress_log: None,
            tick: crate::values::DurationSetting::from_ms(1000),
            notify_timeout: crate::values::DurationSetting::from_ms(30_000),
            deadline: None,
        }
    }
}

impl JobSection {
    /// Checks what serde could not (the regexes and durations are checked while parsing, with
    /// their file:line:column); errors name the key.
    pub fn validate(&self) -> Vec<crate::values::Problem> {
        let mut problems = Vec::new();
        if self.tick.ms < 10 {
            problems.push(crate::values::Problem::at(
                "job.tick",
                "tick must be at least 10ms",
            ));
        }
        if self.notify_timeout.ms < 0 {
            problems.push(crate::values::Problem::at(
                "job.notify_timeout",
                "notify_timeout must not be negative",
            ));
        }
        if let Some(d) = &self.deadline {
            if let Err(e) = parse_deadline(d, now_ms()) {
                problems.push(crate::values::Problem::at("job.deadline", e));
            }
        }
        problems
    }

    /// The progress patterns as text.
    pub fn progress_patterns(&self) -> Vec<String> {
        self.progress
            .iter()
            .map(|r| r.as_str().to_string())
            .collect()
    }
}

/// What one job run is configured with (CLI flags over `[job]`).
#[derive(Debug, Clone, PartialEq)]
pub struct JobOptions {
    /// Progress regexes tried first.
    pub progress: Vec<String>,
    /// Whether the default patterns apply.
    pub default_patterns: bool,
    /// Lines kept for the report.
    pub tail_lines: usize,
    /// Tee file.
    pub tee: Option<PathBuf>,
    /// Log file followed for progress.
    pub progress_log: Option<PathBuf>,
    /// Observer tick.
    pub tick_ms: u64,
    /// When the job should be done, UTC ms (`job_eta`).
    pub deadline_ms: Option<i64>,
}

impl Default for JobOptions {
    fn default() -> Self {
        JobOptions {
            progress: Vec::new(),
            default_patterns: true,
            tail_lines: 20,
            tee: None,
            progress_log: None,
            tick_ms: 1000,
            deadline_ms: None,
        }
    }
}

/// Receives the job's samples while it runs. The daemon-side implementation samples GPUs,
/// evaluates job rules and runs actions; the default does nothing.
pub trait JobObserver {
    /// Called every tick while the job runs.
    fn tick(&mut self, _sample: &JobSample) {}
    /// Called once at the end with the final sample (`alive == false`, exit set) and the
    /// report, which the observer may complete (its `alerts`).
    fn finish(&mut self, sample: &JobSample, _report: &mut JobReport) {
        self.tick(sample);
    }
    /// When gpuwatch's kill action signalled the job, the reason (for the crash class).
    fn killed_by_gpuwatch(&self) -> Option<String> {
        None
    }
    /// Per-GPU usage gathered while the job ran (`None` when no sampler ran).
    fn gpu_stats(&self) -> Option<Vec<GpuJobStats>> {
        None
    }
}

/// The observer that only watches output.
#[derive(Debug, Default)]
pub struct NoObserver;
impl JobObserver for NoObserver {}

/// State shared between the pump threads and the main loop.
struct Shared {
    scanner: Mutex<OutputScanner>,
    tee: Option<Mutex<std::fs::File>>,
    /// When the job should be done, UTC ms.
    deadline_ms: Option<i64>,
}

impl Shared {
    fn scanner(&self) -> std::sync::MutexGuard<'_, OutputScanner> {
        self.scanner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What `-` means for `run`'s and `attach`'s files: standard output is the job's own.
pub const JOB_DASH: crate::sys::output::Dash =
    crate::sys::output::Dash::Refused("standard output carries the job's own output");

/// The tee file, opened for appending (a device or FIFO in place; a link followed).
fn open_tee(path: &Path) -> anyhow::Result<std::fs::File> {
    crate::sys::output::target(path, JOB_DASH)
        .and_then(|t| t.open_append())
        .with_context(|| format!("cannot open tee file {}", path.display()))
}

/// Copies one pipe to our stream, chunk by chunk, into the scanner and the tee.
fn pump(mut from: impl Read, stream: Stream, shared: &Shared) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut out_ok = true;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let chunk = &buf[..n];
        if out_ok {
            // Keep draining even when our own output is gone, so the job never blocks on us.
            let res = match stream {
                Stream::Stdout => {
                    let mut o = std::io::stdout().lock();
                    o.write_all(chunk).and_then(|()| o.flush())
                }
                Stream::Stderr => {
                    let mut e = std::io::stderr().lock();
                    e.write_all(chunk).and_then(|()| e.flush())
                }
            };
            out_ok = res.is_ok();
        }
        if let Some(tee) = &shared.tee {
            let mut f = tee
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let _ = f.write_all(chunk);
        }
        shared.scanner().feed(stream, chunk, now_ms());
    }
}

/// Signals `run` forwards to the job's process group.
const FORWARDED: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Whether `signal`'s disposition is "ignore" (inherited from the parent: `nohup`, a shell's
/// background job).
fn ignored_at_start(signal: i32) -> bool {
    // SAFETY: sigaction(2) with a null new action only reads the current one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    }
}

/// Runs `command` under watch; returns the report (its `exit_code` is what `run` exits with).
pub fn run_job(
    command: &[String],
    opts: &JobOptions,
    observer: &mut dyn JobObserver,
) -> anyhow::Result<JobReport> {
    let (program, args) = command
        .split_first()
        .context("no command given (usage: gpuwatch run -- CMD ARGS...)")?;
    let parser = ProgressParser::new(&opts.progress, opts.default_patterns)
        .map_err(|e| anyhow::anyhow!(e))?;
    let tee = opts.tee.as_deref().map(open_tee).transpose()?;
    let shared = Arc::new(Shared {
        scanner: Mutex::new(OutputScanner::new(parser, opts.tail_lines)),
        tee: tee.map(Mutex::new),
        deadline_ms: opts.deadline_ms,
    });

    // Catch the signals before spawning so none is lost between spawn and registration. A
    // signal ignored when gpuwatch started (`nohup` ignores SIGHUP; `cmd &` in a script ignores
    // SIGINT and SIGQUIT) stays ignored: it is not caught and forwarded, and the job inherits
    // the ignore, as it would without gpuwatch.
    let forwarded_signals: Vec<i32> = FORWARDED
        .iter()
        .copied()
        .filter(|s| !ignored_at_start(*s))
        .collect();
    let mut signals = signal_hook::iterator::Signals::new(&forwarded_signals)
        .context("cannot install signal handlers")?;
    let signal_handle = signals.handle();

    let terminal = tty::Terminal::foreground();
    let mut cmd = Command::new(program);
    tty::own_group(&mut cmd, terminal.is_some());
    cmd.args(args)
        .stdin(Stdio::inherit())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if std::env::var_os("PYTHONUNBUFFERED").is_none() {
        // Python block-buffers a pipe; unbuffered output keeps progress and the tail current.
        cmd.env("PYTHONUNBUFFERED", "1");
    }
    let started_at_ms = now_ms();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            // The child may have been given the terminal before its exec failed.
            if let Some(t) = terminal {
                t.take_back_from(-1);
            }
            return Err(e).with_context(|| format!("cannot start {program:?}"));
        }
    };
    let pid = child.id();
    // The child is not reaped before the end of the loop below: its stat is its own.
    let start_ticks = read_stat(pid).map(|s| s.start_ticks);
    let oom_watch = oom::OomWatch::start(pid);

    let forwarded: Arc<Mutex<Option<i32>>> = Arc::new(Mutex::new(None));
    let fwd = Arc::clone(&forwarded);
    let pgid = pid as libc::pid_t;
    let signal_thread = std::thread::spawn(move || {
        for sig in signals.forever() {
            *fwd.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(sig);
            // SAFETY: plain kill(2) on the job's process group.
            unsafe {
                libc::kill(-pgid, sig);
            }
        }
    });

    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut pumps = Vec::new();
    if let Some(out) = child.stdout.take() {
        let (s, tx) = (Arc::clone(&shared), done_tx.clone());
        pumps.push(std::thread::spawn(move || {
            pump(out, Stream::Stdout, &s);
            let _ = tx.send(());
        }));
    }
    if let Some(err) = child.stderr.take() {
        let (s, tx) = (Arc::clone(&shared), done_tx.clone());
        pumps.push(std::thread::spawn(move || {
            pump(err, Stream::Stderr, &s);
            let _ = tx.send(());
        }));
    }
    drop(done_tx);

    let (exit_tx, exit_rx) = mpsc::channel();
    // The std handle is only used for the pipes; the waiter reaps the child itself so it can
    // follow stops (Ctrl-Z) as well as the end.
    drop(child);
    let waiter = std::thread::spawn(move || {
        let _ = exit_tx.send(tty::wait_child(pid, terminal));
    });

    let mut follower = opts.progress_log.as_deref().map(LogFollower::new);
    let command_text = report::shell_join(command);
    let mut ticker = Ticker::new(opts.tick_ms);
    let status = loop {
        match exit_rx.recv_timeout(ticker.wait()) {
            Ok(status) => break status.context("cannot wait for the job")?,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                anyhow::bail!("the job waiter thread ended unexpectedly")
            }
        }
        poll_follower(follower.as_mut(), &shared);
        if ticker.due() {
            let sample = sample(
                &shared,
                pid,
                start_ticks,
                &command_text,
                started_at_ms,
                true,
            );
            observer.tick(&sample);
        }
    };
    let ended_at_ms = now_ms();
    let _ = waiter.join();
    signal_handle.close();
    let _ = signal_thread.join();

    // Drain the pipes: a daemonised grandchild may hold them open, so wait at most 2 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    for _ in 0..pumps.len() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            break;
        }
    }
    poll_follower(follower.as_mut(), &shared);

    let exit = match (status.code(), status.signal()) {
        (Some(code), _) => JobExit::Exited { code },
        (None, Some(signal)) => JobExit::Signaled {
            signal,
            core_dumped: status.core_dumped(),
        },
        (None, None) => JobExit::Ended,
    };
    let evidence = ExitEvidence {
        killed_by_gpuwatch: observer.killed_by_gpuwatch(),
        forwarded_signal: *forwarded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
        oom_kill: matches!(exit, JobExit::Signaled { signal, .. } if signal == libc::SIGKILL)
            .then(|| oom_watch.evidence())
            .flatten(),
    };
    Ok(finish(
        &shared,
        observer,
        FinishInfo {
            command: command.to_vec(),
            command_text,
            pid,
            start_ticks,
            mode: "run",
            started_at_ms,
            ended_at_ms,
            exit,
            evidence,
        },
    ))
}

/// Paces the watch loop: log files are polled every [`POLL_MS`], the observer every tick.
struct Ticker {
    tick: Duration,
    next: std::time::Instant,
}

/// How often followed log files are polled.
const POLL_MS: u64 = 100;

impl Ticker {
    fn new(tick_ms: u64) -> Ticker {
        let tick = Duration::from_millis(tick_ms.max(10));
        Ticker {
            tick,
            next: std::time::Instant::now() + tick,
        }
    }

    /// How long to wait for the next event.
    fn wait(&self) -> Duration {
        self.next
            .saturating_duration_since(std::time::Instant::now())
            .min(Duration::from_millis(POLL_MS))
    }

    /// True (once) when a tick is due.
    fn due(&mut self) -> bool {
        let now = std::time::Instant::now();
        if now < self.next {
            return false;
        }
        self.next += self.tick;
        if self.next < now {
            self.next = now + self.tick;
        }
        true
    }
}

fn poll_follower(follower: Option<&mut LogFollower>, shared: &Shared) {
    if let Some(f) = follower {
        let bytes = f.poll();
        if !bytes.is_empty() {
            shared.scanner().feed(Stream::Stdout, &bytes, now_ms());
        }
    }
}

fn sample(
    shared: &Shared,
    pid: u32,
    start_ticks: Option<u64>,
    command: &str,
    started_at_ms: i64,
    alive: bool,
) -> JobSample {
    let (progress, tail) = {
        let sc = shared.scanner();
        (sc.progress.clone(), sc.tail())
    };
    JobSample {
        time_ms: now_ms(),
        pid,
        start_ticks,
        command: command.to_string(),
        started_at_ms,
        progress,
        alive,
        exit: None,
        crash_class: None,
        pids: if alive {
            let mut v: Vec<u32> = process_tree(pid).into_iter().collect();
            v.sort_unstable();
            v
        } else {
            Vec::new()
        },
        deadline_ms: shared.deadline_ms,
        utc_offset_s: local_offset_s(),
        tail,
    }
}

/// The local time zone's offset from UTC now, seconds.
fn local_offset_s() -> i32 {
    use chrono::Offset as _;
    chrono::Local::now().offset().fix().local_minus_utc()
}

/// The next time `text` names, as UTC ms after `now_ms`: `HH:MM` or `HH:MM:SS` (local time,
/// today or else tomorrow), or a date and time `YYYY-MM-DD HH:MM[:SS]` / RFC 3339.
pub fn parse_deadline(text: &str, now_ms: i64) -> Result<i64, String> {
    use chrono::TimeZone as _;
    let t = text.trim();
    let bad =
        || format!("deadline {t:?}: expected a local time HH:MM (e.g. 08:00), or YYYY-MM-DD HH:MM");
    if let Ok(d) = chrono::DateTime::parse_from_rfc3339(t) {
        return Ok(d.timestamp_millis());
    }
    for fmt in [
        "%Y-%m-%d %H:%M:%S",
        "%Y-%m-%d %H:%M",
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%dT%H:%M",
    ] {
        if let Ok(n) = chrono::NaiveDateTime::parse_from_str(t, fmt) {
            return chrono::Local
                .from_local_datetime(&n)
                .earliest()
                .map(|d| d.timestamp_millis())
                .ok_or_else(bad);
        }
    }
    let time = chrono::NaiveTime::parse_from_str(t, "%H:%M:%S")
        .or_else(|_| chrono::NaiveTime::parse_from_str(t, "%H:%M"))
        .map_err(|_| bad())?;
    let now = chrono::Local
        .timestamp_millis_opt(now_ms)
        .earliest()
        .ok_or_else(bad)?;
    let today = now.date_naive().and_time(time);
    let at = chrono::Local
        .from_local_datetime(&today)
        .earliest()
        .ok_or_else(bad)?;
    let at = if at.timestamp_millis() <= now_ms {
        at + chrono::Duration::days(1)
    } else {
        at
    };
    Ok(at.timestamp_millis())
}

struct FinishInfo {
    command: Vec<String>,
    command_text: String,
    pid: u32,
    start_ticks: Option<u64>,
    mode: &'static str,
    started_at_ms: i64,
    ended_at_ms: i64,
    exit: JobExit,
    evidence: ExitEvidence,
}

fn finish(shared: &Shared, observer: &mut dyn JobObserver, info: FinishInfo) -> JobReport {
    let (progress, markers, last_lines) = {
        let mut sc = shared.scanner();
        sc.finish(info.ended_at_ms);
        (sc.progress.clone(), sc.markers.clone(), sc.tail())
    };
    let (crash_class, crash_detail) = classify(info.exit, &info.evidence, &markers);
    let mut last = sample(
        shared,
        info.pid,
        info.start_ticks,
        &info.command_text,
        info.started_at_ms,
        false,
    );
    last.time_ms = info.ended_at_ms;
    last.exit = Some(info.exit);
    last.crash_class = Some(crash_class);
    let mut report = JobReport {
        command: info.command,
        pid: info.pid,
        mode: info.mode.into(),
        hostname: hostname(),
        started_at_ms: info.started_at_ms,
        ended_at_ms: info.ended_at_ms,
        exit: info.exit,
        exit_code: info.exit.exit_code(),
        crash_class,
        crash_detail,
        progress,
        gpus: observer.gpu_stats(),
        last_lines,
        alerts: Vec::new(),
    };
    observer.finish(&last, &mut report);
    report
}

/// The PIDs of `root` and all its descendants (our PID namespace), from `/proc/*/stat`.
pub fn process_tree(root: u32) -> HashSet<u32> {
    let mut parent_of = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some(stat) = read_stat(pid) {
                parent_of.push((pid, stat.ppid));
            }
        }
    }
    let mut tree = HashSet::from([root]);
    loop {
        let before = tree.len();
        for &(pid, ppid) in &parent_of {
            if tree.contains(&ppid) {
                tree.insert(pid);
            }
        }
        if tree.len() == before {
            return tree;
        }
    }
}

/// Waits for a process that is not our child. Uses a pidfd when the kernel has one, otherwise
/// polls `/proc/PID/stat` (start time guards against PID reuse).
struct ProcessWaiter {
    pid: u32,
    start_ticks: u64,
    pidfd: Option<std::os::fd::OwnedFd>,
}

impl ProcessWaiter {
    fn new(pid: u32, start_ticks: u64) -> ProcessWaiter {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        let pidfd = (fd >= 0).then(|| {
            use std::os::fd::FromRawFd;
            // SAFETY: fd is a fresh descriptor we own.
            unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) }
        });
        ProcessWaiter {
            pid,
            start_ticks,
            pidfd,
        }
    }

    /// Waits up to `timeout`; returns the last stat seen when the process ended (a zombie's
    /// stat carries its exit status), `Some(None)` when it is gone, `None` while it lives.
    fn wait(&self, timeout: Duration) -> Option<Option<ProcStat>> {
        if let Some(fd) = &self.pidfd {
            use std::os::fd::AsRawFd;
            let mut pfd = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n <= 0 {
                return None;
            }
        } else {
            std::thread::sleep(timeout);
        }
        match read_stat(self.pid) {
            Some(st)
                if st.start_ticks == self.start_ticks && st.state != 'Z' && st.state != 'X' =>
            {
                None
            }
            Some(st) if st.start_ticks == self.start_ticks => Some(Some(st)),
            _ => Some(None),
        }
    }
}

/// Watches `pid` until it ends; returns the report. The exit status comes from `/proc` when the
/// process is still a zombie we may read; otherwise the report says "ended".
pub fn attach_job(
    pid: u32,
    opts: &JobOptions,
    observer: &mut dyn JobObserver,
) -> anyhow::Result<JobReport> {
    let stat = read_stat(pid).with_context(|| format!("no process {pid}"))?;
    if stat.state == 'Z' {
        anyhow::bail!("process {pid} has already ended (zombie)");
    }
    let command = read_cmdline(pid).unwrap_or_else(|| vec![format!("[pid {pid}]")]);
    let parser = ProgressParser::new(&opts.progress, opts.default_patterns)
        .map_err(|e| anyhow::anyhow!(e))?;
    let shared = Shared {
        scanner: Mutex::new(OutputScanner::new(parser, opts.tail_lines)),
        tee: None,
        deadline_ms: opts.deadline_ms,
    };
    // Without --progress-log, follow the process's stdout/stderr when they are regular files.
    let mut followers: Vec<LogFollower> = match &opts.progress_log {
        Some(p) => vec![LogFollower::new(p)],
        None => output_files(pid)
            .iter()
            .map(|p| LogFollower::new(p))
            .collect(),
    };
    let oom_watch = oom::OomWatch::start(pid);
    let started_at_ms = now_ms();
    let command_text = report::shell_join(&command);
    // The kernel shows a process's exit code only to who may inspect it (else a 0): without
    // that right (another user's job), the end is reported without a code, not as a clean exit.
    let may_inspect = std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok();
    let start_ticks = Some(stat.start_ticks);
    let waiter = ProcessWaiter::new(pid, stat.start_ticks);
    let mut ticker = Ticker::new(opts.tick_ms);
    let last_stat = loop {
        if let Some(end) = waiter.wait(ticker.wait()) {
            break end;
        }
        for f in &mut followers {
            poll_follower(Some(f), &shared);
        }
        if ticker.due() {
            let sample = sample(
                &shared,
                pid,
                start_ticks,
                &command_text,
                started_at_ms,
                true,
            );
            observer.tick(&sample);
        }
    };
    let ended_at_ms = now_ms();
    for f in &mut followers {
        poll_follower(Some(f), &shared);
    }
    let exit = last_stat
        .and_then(|st| st.exit_code)
        .filter(|_| may_inspect)
        .map_or(JobExit::Ended, JobExit::from_wait_status);
    let evidence = ExitEvidence {
        killed_by_gpuwatch: observer.killed_by_gpuwatch(),
        forwarded_signal: None,
        oom_kill: (!matches!(exit, JobExit::Exited { .. }))
            .then(|| oom_watch.evidence())
            .flatten(),
    };
    Ok(finish(
        &shared,
        observer,
        FinishInfo {
            command,
            command_text,
            pid,
            start_ticks,
            mode: "attach",
            started_at_ms,
            ended_at_ms,
            exit,
            evidence,
        },
    ))
}

/// Regular files the process writes its stdout and stderr to (deduplicated).
fn output_files(pid: u32) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for fd in [1, 2] {
        if let Ok(target) = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")) {
            if target.is_absolute()
                && std::fs::metadata(&target).is_ok_and(|m| m.is_file())
                && !out.contains(&target)
            {
                out.push(target);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parsing() {
        let line = "4242 (python (train) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 1 0 0 20 0 3 0 \
                    123456 1000 100 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0 \
                    0 0 0 0 0 0 0 256";
        let st = parse_stat(line).unwrap();
        assert_eq!(st.state, 'S');
        assert_eq!(st.ppid, 1);
        assert_eq!(st.pgid, 4242);
        assert_eq!(st.start_ticks, 123_456);
        assert_eq!(st.exit_code, Some(256));
        assert_eq!(JobExit::from_wait_status(256), JobExit::Exited { code: 1 });
    }

    #[test]
    fn own_stat_and_tree() {
        let me = std::process::id();
        let st = read_stat(me).unwrap();
        assert!(st.start_ticks > 0);
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        let tree = process_tree(me);
        assert!(tree.contains(&child.id()));
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn section_validation() {
        assert!(JobSection::default().validate().is_empty());
        let bad = JobSection {
            tick: crate::values::DurationSetting::from_ms(1),
            ..JobSection::default()
        };
        assert_eq!(bad.validate()[0].key, "job.tick");
        let text = "[job]\ntail_lines = 5\nprogress = ['it=(?P<step>\\d+)', '(']\n";
        let err = crate::config::parse(text, std::path::Path::new("c.toml")).unwrap_err();
        assert_eq!(err[0].line, 3, "{err}");
        assert!(err[0].message.contains("invalid regex"), "{err}");
        let cfg = crate::config::parse("[job]\ntick = \"250ms\"\n", std::path::Path::new("c.toml"))
            .unwrap();
        assert_eq!(cfg.job.tick.ms, 250);
    }
}
