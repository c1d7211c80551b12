//! Plain data about a training job watched by `gpuwatch run` / `attach`: its progress, how it
//! ended, and the sample job rules see. The job machinery (the `job` module) produces these; the
//! rules engine reads them; neither needs the other.

use serde::{Deserialize, Serialize};

/// The job as rules see it at one tick (`job.step`, `job.epoch`, `job.progress_age()`, …).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSample {
    /// Sample time, UTC ms.
    pub time_ms: i64,
    /// The job's PID (our namespace).
    pub pid: u32,
    /// When the job's process started, clock ticks since boot (`/proc/PID/stat`): with `pid`,
    /// its identity across PID reuse (`None` when `/proc` did not show it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ticks: Option<u64>,
    /// The command line, shell-quoted.
    pub command: String,
    /// When watching started, UTC ms.
    pub started_at_ms: i64,
    /// Progress so far.
    pub progress: ProgressState,
    /// True while the process lives.
    pub alive: bool,
    /// Set on the last sample: how it ended.
    pub exit: Option<JobExit>,
    /// Set on the last sample: the crash class.
    pub crash_class: Option<CrashClass>,
    /// PIDs of the job's process tree (our namespace).
    pub pids: Vec<u32>,
    /// When the job should be done (`run --deadline`, `[job] deadline`), UTC ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<i64>,
    /// The local time zone's offset from UTC at sample time, seconds: lets rules show clock
    /// times (`09:40`) without asking the system.
    #[serde(default)]
    pub utc_offset_s: i32,
    /// The job's last output lines (for hang forensics; not part of the rules' view).
    #[serde(skip)]
    pub tail: Vec<String>,
}

impl JobSample {
    /// Seconds since progress last moved (`None`: never).
    pub fn progress_age_s(&self) -> Option<f64> {
        self.progress.progress_age_s(self.time_ms)
    }

    /// Seconds from now until the job ends at its recent pace (see [`ProgressState::eta_s`]).
    pub fn eta_s(&self) -> Option<f64> {
        self.progress.eta_s(self.time_ms)
    }

    /// Seconds from now until the deadline (negative once passed).
    pub fn deadline_in_s(&self) -> Option<f64> {
        self.deadline_ms.map(|d| (d - self.time_ms) as f64 / 1000.0)
    }

    /// `HH:MM` in the job's local time for UTC ms `ms`.
    pub fn clock(&self, ms: i64) -> String {
        let local_s = (ms / 1000 + i64::from(self.utc_offset_s)).rem_euclid(86_400);
        format!("{:02}:{:02}", local_s / 3600, (local_s / 60) % 60)
    }
}

/// How much recent progress [`ProgressState::eta_s`] looks at.
pub const PACE_WINDOW_MS: i64 = 5 * 60_000;
/// At most this many recent progress points are kept.
const PACE_POINTS: usize = 256;

/// The job's progress so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProgressState {
    /// Latest step seen.
    pub step: Option<i64>,
    /// Latest total steps seen.
    pub total_steps: Option<i64>,
    /// Latest epoch seen.
    pub epoch: Option<f64>,
    /// Latest total epochs seen.
    pub total_epochs: Option<i64>,
    /// When progress last moved, UTC ms (`None`: never).
    pub last_progress_ms: Option<i64>,
    /// How many times progress moved.
    pub updates: u64,
    /// The last line that carried progress.
    pub last_line: Option<String>,
    #[serde(skip)]
    last_heartbeat: Option<String>,
    /// Recent (time, fraction done) points, oldest first, for the pace.
    #[serde(skip)]
    pace: std::collections::VecDeque<(i64, f64)>,
    /// The step counter starts over at each epoch (Keras' and most per-epoch bars): seen when a
    /// new epoch brought a step lower than the one before it.
    #[serde(skip)]
    per_epoch_steps: bool,
    /// The step when the epoch last went up.
    #[serde(skip)]
    step_before_epoch: Option<i64>,
    /// The first epoch seen (0 or 1: how the job counts).
    #[serde(skip)]
    first_epoch: Option<f64>,
}

impl ProgressState {
    /// Applies an update seen at `now_ms`; returns true when progress moved.
    pub fn apply(&mut self, update: &ProgressUpdate, line: &str, now_ms: i64) -> bool {
        let mut moved = false;
        if let Some(epoch) = update.epoch {
            if self.epoch.is_some_and(|e| epoch > e) {
                self.step_before_epoch = self.step;
            }
            self.first_epoch.get_or_insert(epoch);
        }
        if let (Some(step), Some(before)) = (update.step, self.step_before_epoch) {
            if step < before {
                self.per_epoch_steps = true;
            }
        }
        if let Some(step) = update.step {
            if self.step != Some(step) {
                moved = true;
            }
            self.step = Some(step);
            if update.total_steps.is_some() {
                self.total_steps = update.total_steps;
            }
        }
        if let Some(epoch) = update.epoch {
            if self.epoch != Some(epoch) {
                moved = true;
            }
            self.epoch = Some(epoch);
            if update.total_epochs.is_some() {
                self.total_epochs = update.total_epochs;
            }
        }
        if let Some(hb) = &update.heartbeat {
            // A heartbeat pattern without groups: any match counts.
            moved = true;
            self.last_heartbeat = Some(hb.clone());
        }
        if moved {
            self.last_progress_ms = Some(now_ms);
            self.updates += 1;
            self.last_line = Some(cut(line.trim(), 300).to_string());
            if let Some(f) = self.fraction() {
                // A restart from a checkpoint (the fraction goes back) starts a new pace.
                if self.pace.back().is_some_and(|&(_, last)| f < last) {
                    self.pace.clear();
                }
                self.pace.push_back((now_ms, f));
                while self.pace.len() > PACE_POINTS
                    || self
                        .pace
                        .front()
                        .is_some_and(|&(t, _)| now_ms - t > PACE_WINDOW_MS)
                        && self.pace.len() > 2
                {
                    self.pace.pop_front();
                }
            }
        }
        moved
    }

    /// How much of the job is done, 0–1: step / total steps, else epoch / total epochs; when the
    /// steps count within each epoch, the epochs done plus this epoch's share.
    pub fn fraction(&self) -> Option<f64> {
        match (self.step, self.total_steps, self.epoch, self.total_epochs) {
            (Some(s), Some(t), Some(e), Some(te)) if self.per_epoch_steps && t > 0 && te > 0 => {
                let done = if self.first_epoch == Some(0.0) {
                    e
                } else {
                    e - 1.0
                };
                let f = (done.max(0.0) + s as f64 / t as f64) / te as f64;
                Some(f.clamp(0.0, 1.0))
            }
            (Some(s), Some(t), _, _) if t > 0 => Some((s as f64 / t as f64).clamp(0.0, 1.0)),
            (_, _, Some(e), Some(t)) if t > 0 => Some((e / t as f64).clamp(0.0, 1.0)),
            _ => None,
        }
    }

    /// What the job counts to: `epoch 10/10` or `step 5000/5000`.
    pub fn target(&self) -> Option<String> {
        match (self.total_steps, self.total_epochs) {
            (_, Some(e)) if self.epoch.is_some() => Some(format!("epoch {e}/{e}")),
            (Some(t), _) => Some(format!("step {t}/{t}")),
            _ => None,
        }
    }

    /// Seconds from `now_ms` until the job is done at the pace of its last
    /// [`PACE_WINDOW_MS`] of progress; `None` until progress has been seen over at least 30 s,
    /// or when it does not move forward. Time since the last progress counts as no progress.
    pub fn eta_s(&self, now_ms: i64) -> Option<f64> {
        let (&(t0, f0), &(t1, f1)) = (self.pace.front()?, self.pace.back()?);
        let span_ms = now_ms.max(t1) - t0;
        if t1 - t0 < 30_000 || f1 <= f0 {
            return None;
        }
        let per_ms = (f1 - f0) / span_ms as f64;
        Some((1.0 - f1) / per_ms / 1000.0)
    }

    /// Seconds since progress last moved, `None` when it never did.
    pub fn progress_age_s(&self, now_ms: i64) -> Option<f64> {
        self.last_progress_ms
            .map(|t| (now_ms.saturating_sub(t)).max(0) as f64 / 1000.0)
    }

    /// Short human text: `epoch 3/10, step 1200/5000`, or `no progress seen`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(e) = self.epoch {
            let e = if e.fract() == 0.0 {
                format!("{e:.0}")
            } else {
                format!("{e}")
            };
            match self.total_epochs {
                Some(t) => parts.push(format!("epoch {e}/{t}")),
                None => parts.push(format!("epoch {e}")),
            }
        }
        if let Some(s) = self.step {
            match self.total_steps {
                Some(t) => parts.push(format!("step {s}/{t}")),
                None => parts.push(format!("step {s}")),
            }
        }
        if parts.is_empty() {
            if self.updates > 0 {
                return format!("{} progress lines", self.updates);
            }
            return "no progress seen".into();
        }
        parts.join(", ")
    }
}

/// What one line said about progress.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProgressUpdate {
    /// Step (or iteration, or tqdm position) number.
    pub step: Option<i64>,
    /// Total steps, when the line gives one.
    pub total_steps: Option<i64>,
    /// Epoch (may be fractional, as in the Hugging Face Trainer).
    pub epoch: Option<f64>,
    /// Total epochs, when the line gives one.
    pub total_epochs: Option<i64>,
    /// The text a heartbeat pattern matched.
    pub heartbeat: Option<String>,
}

impl ProgressUpdate {
    /// True when the line said nothing about progress.
    pub fn is_empty(&self) -> bool {
        self.step.is_none() && self.epoch.is_none() && self.heartbeat.is_none()
    }
}

/// How the process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum JobExit {
    /// It exited with this code.
    Exited {
        /// The exit code.
        code: i32,
    },
    /// A signal ended it.
    Signaled {
        /// Signal number.
        signal: i32,
        /// Whether it dumped core.
        core_dumped: bool,
    },
    /// It ended, and the kernel did not tell us how (an attached process that is not our child).
    Ended,
}

impl JobExit {
    /// The exit code gpuwatch itself returns: the job's code, 128 + signal, or 0 for `Ended`.
    pub fn exit_code(self) -> i32 {
        match self {
            JobExit::Exited { code } => code,
            JobExit::Signaled { signal, .. } => 128 + signal,
            JobExit::Ended => 0,
        }
    }

    /// Decodes a raw `wait` status (as in `/proc/PID/stat` field 52).
    pub fn from_wait_status(status: i32) -> JobExit {
        if libc::WIFEXITED(status) {
            JobExit::Exited {
                code: libc::WEXITSTATUS(status),
            }
        } else if libc::WIFSIGNALED(status) {
            JobExit::Signaled {
                signal: libc::WTERMSIG(status),
                core_dumped: libc::WCOREDUMP(status),
            }
        } else {
            JobExit::Ended
        }
    }

    /// `exit code 3`, `signal 9 (SIGKILL)`, `ended (exit status not available)`.
    pub fn describe(self) -> String {
        match self {
            JobExit::Exited { code } => format!("exit code {code}"),
            JobExit::Signaled {
                signal,
                core_dumped,
            } => format!(
                "signal {signal} ({}){}",
                signal_name(signal),
                if core_dumped { ", core dumped" } else { "" }
            ),
            JobExit::Ended => "ended (exit status not available)".into(),
        }
    }
}

/// `SIGKILL` for 9, … (`SIG?` for unknown numbers).
pub fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        _ => "SIG?",
    }
}

/// Why the job ended, as gpuwatch understands it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CrashClass {
    /// Exit code 0.
    CleanExit,
    /// Ran out of GPU memory (`CUDA out of memory` in the output).
    CudaOom,
    /// An NCCL error or collective timeout in the output.
    NcclError,
    /// A Python traceback in the output, without a more specific cause.
    PythonTraceback,
    /// SIGKILL with evidence of the kernel OOM killer (cgroup `oom_kill` counter, kernel log).
    KernelOomKill,
    /// gpuwatch's kill action ended it.
    KilledByGpuwatch,
    /// A signal from elsewhere ended it (including a SIGKILL without OOM evidence).
    KilledBySignal,
    /// Non-zero exit code without a recognised cause.
    NonZeroExit,
    /// An attached process ended; the kernel did not say how.
    Ended,
}

impl CrashClass {
    /// Human label.
    pub fn label(self) -> &'static str {
        match self {
            CrashClass::CleanExit => "clean exit",
            CrashClass::CudaOom => "CUDA out of memory",
            CrashClass::NcclError => "NCCL error",
            CrashClass::PythonTraceback => "Python traceback",
            CrashClass::KernelOomKill => "killed by the kernel OOM killer",
            CrashClass::KilledByGpuwatch => "killed by gpuwatch",
            CrashClass::KilledBySignal => "killed by signal",
            CrashClass::NonZeroExit => "non-zero exit",
            CrashClass::Ended => "ended",
        }
    }

    /// True for every class except a clean exit and an unknown end.
    pub fn is_failure(self) -> bool {
        !matches!(self, CrashClass::CleanExit | CrashClass::Ended)
    }
}

/// `s` cut to at most `max` bytes at a character boundary.
pub fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(epoch: Option<f64>, step: Option<i64>) -> ProgressUpdate {
        ProgressUpdate {
            step,
            total_steps: step.map(|_| 100),
            epoch,
            total_epochs: epoch.map(|_| 10),
            heartbeat: None,
        }
    }

    /// Keras-style output: `Epoch 3/10` then a 1..100 step bar per epoch. Once the steps are seen
    /// to start over, the fraction is the epochs done plus this epoch's share (not the share of
    /// the current epoch alone, which made the ETA the end of the epoch).
    #[test]
    fn steps_within_epochs_count_toward_the_whole_run() {
        let mut p = ProgressState::default();
        p.apply(&update(Some(1.0), None), "Epoch 1/10", 0);
        p.apply(&update(None, Some(100)), "100/100", 1);
        p.apply(&update(Some(2.0), None), "Epoch 2/10", 2);
        p.apply(&update(None, Some(50)), "50/100", 3);
        let f = p.fraction().unwrap();
        assert!((f - 0.15).abs() < 1e-9, "{f}");
        // Global steps (they never start over) keep step / total.
        let mut g = ProgressState::default();
        g.apply(&update(Some(1.0), Some(10)), "epoch 1 step 10/100", 0);
        g.apply(&update(Some(2.0), Some(60)), "epoch 2 step 60/100", 1);
        assert!((g.fraction().unwrap() - 0.6).abs() < 1e-9);
    }
}
