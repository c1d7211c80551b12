//! How a job ended: exit status, crash class, GPU usage, and the end-of-job report.
//!
//! [`classify`] is a pure function of the exit status, what gpuwatch itself did, OOM-killer
//! evidence and the crash markers found in the output. [`GpuUsage`] folds snapshots into peak
//! memory per GPU and mean utilization for the job's processes.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use super::scan::Markers;
use crate::model::job::ProgressState;
pub use crate::model::job::{signal_name, CrashClass, JobExit};
use crate::model::{Metric, Snapshot};

/// Facts besides the exit status that [`classify`] weighs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExitEvidence {
    /// gpuwatch's kill action signalled the job (the audit reason).
    pub killed_by_gpuwatch: Option<String>,
    /// A signal gpuwatch forwarded from its own terminal / supervisor (SIGINT, SIGTERM…).
    pub forwarded_signal: Option<i32>,
    /// Evidence of the kernel OOM killer, e.g. `memory.events oom_kill 0 → 1 (cgroup /user…)`.
    pub oom_kill: Option<String>,
}

/// Signals that end a process from outside rather than report a fault inside it.
fn is_external_signal(signal: i32) -> bool {
    matches!(
        signal,
        libc::SIGKILL | libc::SIGTERM | libc::SIGINT | libc::SIGHUP | libc::SIGQUIT
    )
}

/// Classifies how a job ended; returns the class and a one-line detail.
///
/// Order: gpuwatch's own kill, then a SIGKILL with OOM-killer evidence, then external signals
/// (SIGKILL/TERM/INT/HUP/QUIT), then output markers of failed runs (CUDA OOM, NCCL, traceback —
/// a traceback ending in a CUDA OOM is an OOM), then other signals and non-zero codes.
pub fn classify(exit: JobExit, evidence: &ExitEvidence, markers: &Markers) -> (CrashClass, String) {
    if let Some(reason) = &evidence.killed_by_gpuwatch {
        if !matches!(exit, JobExit::Exited { code: 0 }) {
            return (CrashClass::KilledByGpuwatch, reason.clone());
        }
    }
    match exit {
        JobExit::Exited { code: 0 } => return (CrashClass::CleanExit, "exit code 0".into()),
        JobExit::Ended => {
            if let Some(oom) = &evidence.oom_kill {
                return (CrashClass::KernelOomKill, format!("possibly: {oom}"));
            }
            return (
                CrashClass::Ended,
                "the kernel gives the exit status only to the parent".into(),
            );
        }
        JobExit::Signaled { signal, .. } if signal == libc::SIGKILL => {
            if let Some(oom) = &evidence.oom_kill {
                return (CrashClass::KernelOomKill, format!("SIGKILL; {oom}"));
            }
        }
        _ => {}
    }
    if let JobExit::Signaled { signal, .. } = exit {
        if is_external_signal(signal) {
            let detail = if evidence.forwarded_signal == Some(signal) {
                format!("{} forwarded by gpuwatch", signal_name(signal))
            } else if signal == libc::SIGKILL {
                "killed by SIGKILL (possibly the OOM killer)".into()
            } else {
                format!("killed by {} from outside", signal_name(signal))
            };
            return (CrashClass::KilledBySignal, detail);
        }
    }
    if let Some(m) = &markers.cuda_oom {
        return (CrashClass::CudaOom, m.line.clone());
    }
    if let Some(m) = &markers.nccl {
        return (CrashClass::NcclError, m.line.clone());
    }
    if let Some(tb) = &markers.traceback {
        let detail = markers
            .exception
            .as_ref()
            .map_or_else(|| tb.line.clone(), |e| e.line.clone());
        return (CrashClass::PythonTraceback, detail);
    }
    match exit {
        JobExit::Signaled { .. } => (CrashClass::KilledBySignal, exit.describe()),
        _ => (CrashClass::NonZeroExit, exit.describe()),
    }
}

/// GPU usage of one GPU during the job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuJobStats {
    /// NVML index.
    pub index: u32,
    /// GPU UUID.
    pub uuid: String,
    /// Peak GPU memory the job's processes used on it, bytes (`None` when NVML never said).
    pub peak_mem_used_bytes: Option<u64>,
    /// Mean GPU utilization while the job was on it, percent.
    pub mean_util_percent: Option<f64>,
    /// Snapshots in which the job was on this GPU.
    pub samples: u64,
}

/// Folds snapshots into per-GPU stats for a set of PIDs (the job's process tree).
#[derive(Debug, Clone, Default)]
pub struct GpuUsage {
    gpus: BTreeMap<u32, Acc>,
    on_gpu: HashSet<u32>,
}

#[derive(Debug, Clone, Default)]
struct Acc {
    uuid: String,
    peak: Option<u64>,
    util_sum: f64,
    util_n: u64,
    samples: u64,
}

impl GpuUsage {
    /// Folds one snapshot in; `pids` are the job's host PIDs at that time.
    pub fn observe(&mut self, snapshot: &Snapshot, pids: &HashSet<u32>) {
        if let Some(list) = &snapshot.processes {
            self.on_gpu.clear();
            let mut mem: BTreeMap<u32, (String, Option<u64>)> = BTreeMap::new();
            for p in list.iter().filter(|p| pids.contains(&p.pid)) {
                self.on_gpu.insert(p.gpu_index);
                let e = mem
                    .entry(p.gpu_index)
                    .or_insert_with(|| (p.gpu_uuid.clone(), None));
                if let Some(b) = p.used_mem_bytes {
                    e.1 = Some(e.1.unwrap_or(0) + b);
                }
            }
            for (gpu, (uuid, bytes)) in mem {
                let acc = self.gpus.entry(gpu).or_default();
                acc.uuid = uuid;
                if let Some(b) = bytes {
                    acc.peak = Some(acc.peak.map_or(b, |p| p.max(b)));
                }
            }
        }
        for g in &snapshot.gpus {
            if !self.on_gpu.contains(&g.id.index) {
                continue;
            }
            let acc = self.gpus.entry(g.id.index).or_default();
            acc.samples += 1;
            if let Some(u) = g.get(Metric::Util) {
                acc.util_sum += u;
                acc.util_n += 1;
            }
        }
    }

    /// The stats so far, by GPU index.
    pub fn stats(&self) -> Vec<GpuJobStats> {
        self.gpus
            .iter()
            .map(|(&index, a)| GpuJobStats {
                index,
                uuid: a.uuid.clone(),
                peak_mem_used_bytes: a.peak,
                mean_util_percent: (a.util_n > 0).then(|| a.util_sum / a.util_n as f64),
                samples: a.samples,
            })
            .collect()
    }
}

/// Everything gpuwatch reports when a job ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobReport {
    /// The command and its arguments.
    pub command: Vec<String>,
    /// The job's PID (host view).
    pub pid: u32,
    /// `run` or `attach`.
    pub mode: String,
    /// Host name.
    pub hostname: String,
    /// When gpuwatch started watching, UTC ms.
    pub started_at_ms: i64,
    /// When the job ended, UTC ms.
    pub ended_at_ms: i64,
    /// How it ended.
    pub exit: JobExit,
    /// The job's exit status as a shell shows it (`run` exits with it, or dies of the job's
    /// signal): the job's code, 128 + signal when a signal ended it.
    pub exit_code: i32,
    /// Why it ended.
    pub crash_class: CrashClass,
    /// One line of evidence for the class.
    pub crash_detail: String,
    /// Progress at the end.
    pub progress: ProgressState,
    /// Per-GPU usage, when a sampler was running (`None`: no GPU data).
    pub gpus: Option<Vec<GpuJobStats>>,
    /// The last output lines, oldest first.
    pub last_lines: Vec<String>,
    /// Alerts announced while the job ran (at most 200), including the end notice.
    #[serde(default)]
    pub alerts: Vec<crate::model::AlertEvent>,
}

impl JobReport {
    /// Wall-clock duration in milliseconds.
    pub fn duration_ms(&self) -> i64 {
        self.ended_at_ms - self.started_at_ms
    }

    /// One-line summary, e.g. `job failed: CUDA out of memory (exit code 1) after 1h 2m 3s:
    /// python train.py`.
    pub fn summary(&self) -> String {
        let verb = if self.crash_class.is_failure() {
            "failed"
        } else {
            "finished"
        };
        if self.exit == JobExit::Ended && self.crash_class == CrashClass::Ended {
            return format!(
                "job ended (exit status not available) after {}: {}",
                format_duration_ms(self.duration_ms()),
                shell_join(&self.command),
            );
        }
        format!(
            "job {verb}: {} ({}) after {}: {}",
            self.crash_class.label(),
            self.exit.describe(),
            format_duration_ms(self.duration_ms()),
            shell_join(&self.command),
        )
    }

    /// The multi-line report printed at the end and used as notification text. The job's
    /// output (its last lines, the crash evidence) and its command line are shown with control
    /// characters escaped ([`crate::values::escape_control`]): a colourised log or a hostile
    /// line cannot drive the terminal, an e-mail or a chat message it ends up in.
    pub fn render_text(&self) -> String {
        use crate::values::escape_control;
        let mut out = String::new();
        out.push_str(&escape_control(&self.summary()));
        out.push('\n');
        let mut field = |k: &str, v: String| {
            out.push_str(&format!("  {k:<10} {}\n", escape_control(&v)));
        };
        field("command", shell_join(&self.command));
        field("pid", self.pid.to_string());
        field("host", self.hostname.clone());
        field("status", self.exit.describe());
        field(
            "class",
            format!("{}: {}", self.crash_class.label(), self.crash_detail),
        );
        field("duration", format_duration_ms(self.duration_ms()));
        field("progress", self.progress.describe());
        match &self.gpus {
            None => field("gpus", "no GPU data".into()),
            Some(g) if g.is_empty() => field("gpus", "the job was never seen on a GPU".into()),
            Some(g) => {
                for s in g {
                    let mem = s.peak_mem_used_bytes.map_or_else(
                        || "unknown".into(),
                        |b| format!("{:.0} MiB", b as f64 / 1_048_576.0),
                    );
                    let util = s
                        .mean_util_percent
                        .map_or_else(|| "unknown".into(), |u| format!("{u:.0} %"));
                    field(
                        &format!("gpu {}", s.index),
                        format!("peak memory {mem}, mean utilization {util}"),
                    );
                }
            }
        }
        if !self.last_lines.is_empty() {
            out.push_str(&format!("  last {} lines:\n", self.last_lines.len()));
            for l in &self.last_lines {
                out.push_str("    | ");
                out.push_str(&escape_control(l));
                out.push('\n');
            }
        }
        out
    }
}

/// Joins arguments for display, quoting those with spaces or quotes.
pub fn shell_join(args: &[String]) -> String {
    args.iter()
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

pub use crate::values::format_duration_ms;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::scan::Marker;
    use crate::model::{DeviceId, GpuSample, MetricValues, ProcSample};

    fn marker(line: &str) -> Option<Marker> {
        Some(Marker {
            line: line.into(),
            at_ms: 0,
        })
    }

    #[test]
    fn exit_codes() {
        assert_eq!(JobExit::Exited { code: 3 }.exit_code(), 3);
        let killed = JobExit::Signaled {
            signal: 9,
            core_dumped: false,
        };
        assert_eq!(killed.exit_code(), 137);
        assert_eq!(killed.describe(), "signal 9 (SIGKILL)");
        assert_eq!(
            JobExit::from_wait_status(3 << 8),
            JobExit::Exited { code: 3 }
        );
        assert_eq!(
            JobExit::from_wait_status(libc::SIGTERM),
            JobExit::Signaled {
                signal: 15,
                core_dumped: false
            }
        );
    }

    #[test]
    fn classification_order() {
        let none = ExitEvidence::default();
        let mut m = Markers::default();
        let kill = JobExit::Signaled {
            signal: libc::SIGKILL,
            core_dumped: false,
        };
        assert_eq!(
            classify(JobExit::Exited { code: 0 }, &none, &m).0,
            CrashClass::CleanExit
        );
        assert_eq!(
            classify(JobExit::Exited { code: 2 }, &none, &m).0,
            CrashClass::NonZeroExit
        );
        let (c, d) = classify(kill, &none, &m);
        assert_eq!(c, CrashClass::KilledBySignal);
        assert_eq!(d, "killed by SIGKILL (possibly the OOM killer)");
        let oom = ExitEvidence {
            oom_kill: Some("memory.events oom_kill 0 → 1".into()),
            ..ExitEvidence::default()
        };
        assert_eq!(classify(kill, &oom, &m).0, CrashClass::KernelOomKill);
        let ours = ExitEvidence {
            killed_by_gpuwatch: Some("rule gpu_memory_quota".into()),
            ..oom.clone()
        };
        assert_eq!(classify(kill, &ours, &m).0, CrashClass::KilledByGpuwatch);

        m.traceback = marker("Traceback (most recent call last):");
        m.exception = marker("ValueError: x");
        let (c, d) = classify(JobExit::Exited { code: 1 }, &none, &m);
        assert_eq!(
            (c, d.as_str()),
            (CrashClass::PythonTraceback, "ValueError: x")
        );
        m.cuda_oom = marker("torch.OutOfMemoryError: CUDA out of memory.");
        assert_eq!(
            classify(JobExit::Exited { code: 1 }, &none, &m).0,
            CrashClass::CudaOom
        );
        // An abort after an NCCL watchdog timeout is an NCCL error, not just a signal.
        let n = Markers {
            nccl: marker("Watchdog caught collective operation timeout"),
            ..Markers::default()
        };
        let abort = JobExit::Signaled {
            signal: libc::SIGABRT,
            core_dumped: true,
        };
        assert_eq!(classify(abort, &none, &n).0, CrashClass::NcclError);
        // Markers do not matter when the job exited 0.
        assert_eq!(
            classify(JobExit::Exited { code: 0 }, &none, &m).0,
            CrashClass::CleanExit
        );
    }

    #[test]
    fn gpu_usage_peak_and_mean() {
        let gpu = |util: f64| {
            let mut values = MetricValues::default();
            values.set(Metric::Util, Some(util));
            GpuSample {
                time_ms: 0,
                id: DeviceId {
                    index: 1,
                    ..DeviceId::default()
                },
                state: crate::model::DeviceState::Ok,
                values,
            }
        };
        let proc_ = |pid: u32, mib: u64| ProcSample::compute(pid, 1, "GPU-1", Some(mib << 20));
        let pids: HashSet<u32> = [10, 11].into();
        let mut usage = GpuUsage::default();
        usage.observe(
            &Snapshot {
                time_ms: 0,
                gpus: vec![gpu(80.0)],
                processes: Some(vec![proc_(10, 100), proc_(11, 50), proc_(99, 1000)]),
                xids: vec![],
                ..Snapshot::default()
            },
            &pids,
        );
        usage.observe(
            &Snapshot {
                time_ms: 1000,
                gpus: vec![gpu(40.0)],
                processes: None,
                xids: vec![],
                ..Snapshot::default()
            },
            &pids,
        );
        let s = usage.stats();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].peak_mem_used_bytes, Some(150 << 20));
        assert_eq!(s[0].mean_util_percent, Some(60.0));
        assert_eq!(s[0].samples, 2);
    }

    /// Issue 25 §3: the job's output reaches the terminal, e-mails and chats through the
    /// report: no raw escape sequence (an OSC 52 clipboard write, a screen clear, colours) and
    /// no C1 control in it; the report's own line layout stays.
    #[test]
    fn report_text_escapes_control_characters_from_the_job() {
        let report = JobReport {
            command: vec!["python".into(), "train\u{1b}[2J.py".into()],
            pid: 4242,
            mode: "run".into(),
            hostname: "node7".into(),
            started_at_ms: 0,
            ended_at_ms: 1_000,
            exit: JobExit::Exited { code: 1 },
            exit_code: 1,
            crash_class: CrashClass::PythonTraceback,
            crash_detail: "\u{1b}[31mRuntimeError\u{1b}[0m: boom".into(),
            progress: ProgressState::default(),
            gpus: None,
            last_lines: vec![
                "\u{1b}]52;c;cm0gLXJmIH4=\u{7}copied".into(),
                "\u{1b}[2Jcleared\u{9b}31m\u{7f}".into(),
                "plain line".into(),
            ],
            alerts: Vec::new(),
        };
        let text = report.render_text();
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        assert!(
            text.contains("    | \\u{1b}]52;c;cm0gLXJmIH4=\\u{7}copied\n"),
            "{text}"
        );
        assert!(
            text.contains("    | \\u{1b}[2Jcleared\\u{9b}31m\\u{7f}\n"),
            "{text}"
        );
        assert!(text.contains("    | plain line\n"), "{text}");
        assert!(text.contains("\\u{1b}[31mRuntimeError"), "{text}");
        assert!(text.starts_with("job failed: "), "{text}");
        assert_eq!(text.lines().count(), 13, "{text}");
    }

    #[test]
    fn text_helpers() {
        assert_eq!(
            shell_join(&["sh".into(), "-c".into(), "echo hi; exit 3".into()]),
            "sh -c 'echo hi; exit 3'"
        );
        assert_eq!(format_duration_ms(4_200), "4.2s");
        assert_eq!(format_duration_ms(3_723_000), "1h 2m 3s");
    }
}
