//! The report's diagnosis: what a practitioner sees in a run's log, judged on the data itself —
//! not on whether a stock rule's hold elapsed — so a two-minute log is diagnosed as well as a
//! night.
//!
//! A pure function of each GPU's samples ([`Trace`]). The log is cut into phases first: **jobs**
//! (stretches where some GPU is in use — utilization ≥ 5 %, memory held beyond the GPU's idle
//! baseline, or a process — joined across idle pauses shorter than [`JOB_GAP_MS`] or ten sample
//! spacings) and the idle head, tail and pauses around them, which are phases, never findings.
//! Within a job each GPU has a **steady phase**: from the first to the last sample at half its
//! typical busy level (its 90th percentile), which leaves out warm-up and wind-down. Every share
//! is of *observed* time: a sample stands for the time to the next one, at most twice the log's
//! usual spacing, so a pause in the log is no time at all.
//!
//! Patterns, each on its own evidence (thresholds also in `docs/rules.md`):
//! - `low_utilization` — a rolling mean (30 s, or 5 samples) under 50 % in the steady phase: the
//!   GPU waits. At one sample a second a step-level stall looks uniform, so the shape of the
//!   samples only adds detail to the cause and never suppresses the finding.
//! - `idle_gpu_memory` — under 5 % utilization while holding more than 1 GiB beyond the idle
//!   baseline.
//! - `periodic_idle` — at least four drops to near zero (≤ 10 %, or a fifth of the steady
//!   median) between busy stretches, at a regular period of at least three samples (70 % of the
//!   intervals within ±30 % of their median, and within at least one sample spacing — the
//!   uncertainty of a drop's start — when the median is over four samples); the period is
//!   shown. Drops a median of four samples apart or fewer come about as fast as the log can
//!   time them: which sample catches a short stall then depends on the sampling's phase and
//!   jitter, so their intervals may look irregular. Ten or more of them are a finding when the
//!   drop samples recur at a lag of 2–4 samples (autocorrelation ≥ 0.15 and ≥ 3/√n, above
//!   that at one sample — random idle samples and idle stretches of random length have none);
//!   that lag is shown as the approximate period.
//! - `memory_leak` — memory used growing steadily after warm-up: warm-up ends when memory first
//!   reaches 90 % of the level of the job's last third (at the latest half-way), and the rest
//!   must grow by at least 256 MiB and 1 % of the GPU's memory, with a linear fit of R² ≥ 0.6
//!   and five of seven block-to-block steps upward. The trend in the summary is the same
//!   post-warm-up slope (a ramp that then stays flat has a trend of about zero).
//! - `small_batch` — memory far below total: the steady phase's 95th percentile of memory under
//!   40 % of the GPU's while utilization stays under 80 % (p95).
//! - `oom_risk` — memory at ≥ 95 % of total; a jump from under 80 % within a minute is "sudden"
//!   (warning), full memory from the job's start is noted as such (info: frameworks that
//!   pre-allocate look like this).
//! - From GPM (Hopper and later; a log without it has none of these): `launch_bound` —
//!   utilization ≥ 90 % while SM active < 25 % (kernels too small to fill the GPU), at a power
//!   above [`IDLE_POWER_FRAC`] of the enforced limit where the log has both: at near-idle power
//!   that is an NCCL hang (spinning kernels, one block per channel: few SMs busy), not a tuning
//!   problem — the stock rule `nccl_hang` names it in the alert timeline;
//!   `no_tensor_cores` — SM active ≥ 50 % while tensor active < 1 % (matrix math on the CUDA
//!   cores: no autocast / TF32); `memory_bound` (info) — DRAM active ≥ 80 % of the peak bandwidth.
//!   Shares are of the steady phase's time with GPM values.
//! - Across the GPUs of one job (GPUs whose work started together): `gpu_straggler` — a GPU
//!   under 60 % of its peers' median and 25 points below it while the peers work (median
//!   ≥ 50 %); `gpu_imbalance` — a GPU holding 1.3× its peers' median memory and 2 GiB more;
//!   `rank_dead` — a GPU that stops working ≥ 2 min (and 10 % of the job) before its peers;
//!   `unused_gpu` (info) — a GPU with no work and no memory for a whole job that others ran.
//!
//! Quiet on healthy runs: a pattern that holds for under 20 % of the observed time it was judged
//! on, and for under 30 minutes (or under 5 % however long), is listed as a brief episode, not
//! a finding. `periodic_idle` is a finding when its drops take ≥ 5 % of the time; `oom_risk`
//! when memory stayed full for 30 s or two samples.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{GpuSample, Metric};

/// A job's GPUs idle for this long (all of them) end the job: what follows is another job.
pub const JOB_GAP_MS: i64 = 5 * 60_000;
/// Utilization at which a GPU counts as working.
pub const ACTIVE_UTIL: f64 = 5.0;
/// Memory above the GPU's idle baseline that counts as held by a process (a CUDA context alone
/// is 250–600 MiB).
pub const HELD_MIB: f64 = 256.0;
/// Memory above the baseline that `idle_gpu_memory` calls holding memory.
pub const IDLE_HOLD_MIB: f64 = 1024.0;
/// The share of observed time from which a pattern is a finding.
pub const MIN_SHARE: f64 = 0.2;
/// ... or this long in total (with at least [`MIN_LONG_SHARE`]).
pub const MIN_LONG_MS: i64 = 30 * 60_000;
/// See [`MIN_LONG_MS`].
pub const MIN_LONG_SHARE: f64 = 0.05;
/// Samples in which a pattern must hold (a single snapshot proves nothing).
pub const MIN_SAMPLES: u32 = 3;
/// Utilization the busiest samples of a GPU (its 90th percentile) must reach for it to count as
/// a working rank in the patterns across GPUs (straggler, stopped early).
pub const WORKING_UTIL: f64 = 5.0;
/// Idle stretches shorter than this (and five samples) are part of low utilization, not a GPU
/// held idle.
pub const MIN_IDLE_RUN_MS: i64 = 60_000;
/// Samples kept per GPU; past it neighbours are merged (a 3-day log at 1 s).
const MAX_POINTS: usize = 1 << 18;
/// `launch_bound`: utilization at least this while SM active (GPM) is under [`LAUNCH_BOUND_SM`].
pub const LAUNCH_BOUND_UTIL: f64 = 90.0;
/// See [`LAUNCH_BOUND_UTIL`] (DCGM: "less than 0.5 likely indicates ineffective GPU usage";
/// KempnerPulse's "busy, low SM use": SM < 25 %).
pub const LAUNCH_BOUND_SM: f64 = 25.0;
/// Power at or below this share of the enforced limit is near idle: a GPU pinned at 100 % there
/// is hung in a collective (the stock rules `nccl_hang` and `launch_bound` split on it), so its
/// samples are no evidence of `launch_bound`.
pub const IDLE_POWER_FRAC: f64 = 0.25;
/// `no_tensor_cores`: SM active at least this (the SMs compute) while tensor active is under
/// [`NO_TENSOR_ACTIVE`].
pub const NO_TENSOR_SM: f64 = 50.0;
/// See [`NO_TENSOR_SM`]: tensor active about 0.
pub const NO_TENSOR_ACTIVE: f64 = 1.0;
/// `memory_bound`: DRAM active at least this (DCGM: ~0.8 is the practical peak).
pub const MEMORY_BOUND_DRAM: f64 = 80.0;

/// One sample of one GPU, as the diagnosis needs it (`NaN` where the log had no value).
#[derive(Debug, Clone, Copy)]
pub struct Point {
    /// Sample time, UTC ms.
    pub t: i64,
    /// Utilization, %.
    pub util: f32,
    /// Memory used, MiB.
    pub mem: f32,
    /// Processes seen on the GPU at this sample (255 = many).
    pub procs: u8,
    /// GPM's SM active, tensor active and DRAM active, % (`NaN` without GPM).
    pub sm: f32,
    pub tensor: f32,
    pub dram: f32,
    /// Power draw and the enforced power limit, W (`NaN` where the log has none).
    pub power: f32,
    pub limit: f32,
}

impl Point {
    /// Power at or below [`IDLE_POWER_FRAC`] of the enforced limit (both known).
    fn near_idle_power(&self) -> bool {
        let (p, l) = (f64::from(self.power), f64::from(self.limit));
        p.is_finite() && l.is_finite() && l > 0.0 && p <= IDLE_POWER_FRAC * l
    }
}

/// One GPU's samples over the log.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// GPU index.
    pub index: u32,
    /// Total memory, MiB, where the log had it.
    pub total_mib: Option<f64>,
    /// Samples in time order (merged in pairs past [`MAX_POINTS`]).
    pub points: Vec<Point>,
    /// Process ids seen on this GPU (at most 64).
    pub pids: Vec<u32>,
}

impl Trace {
    /// A trace for GPU `index`.
    pub fn new(index: u32) -> Trace {
        Trace {
            index,
            ..Trace::default()
        }
    }

    /// Adds a sample taken at `t`, with `procs` processes seen on the GPU.
    pub fn push(&mut self, t: i64, g: &GpuSample, procs: usize) {
        let f = |m| g.get(m).map_or(f32::NAN, |v| v as f32);
        // Total memory, or used + free where a log has memory.free instead.
        let total = g.get(Metric::MemTotal).or_else(|| {
            g.get(Metric::MemUsed)
                .zip(g.get(Metric::MemFree))
                .map(|(u, f)| u + f)
        });
        if let Some(total) = total.filter(|v| *v > 0.0) {
            self.total_mib = Some(total / 1_048_576.0);
        }
        if self.points.last().is_some_and(|p| t < p.t) {
            return;
        }
        if self.points.len() >= MAX_POINTS {
            self.halve();
        }
        self.points.push(Point {
            t,
            util: f(Metric::Util),
            mem: f(Metric::MemUsed) / 1_048_576.0,
            procs: u8::try_from(procs).unwrap_or(u8::MAX),
            sm: f(Metric::SmActive),
            tensor: f(Metric::TensorActive),
            dram: f(Metric::DramActive),
            power: f(Metric::Power),
            limit: f(Metric::PowerLimit),
        });
    }

    /// Notes a process seen on this GPU.
    pub fn pid(&mut self, pid: u32) {
        if self.pids.len() < 64 && !self.pids.contains(&pid) {
            self.pids.push(pid);
        }
    }

    /// Merges neighbouring samples (mean utilization, larger memory): bounded memory for any
    /// log length, at half the time resolution.
    fn halve(&mut self) {
        let merged: Vec<Point> = self
            .points
            .chunks(2)
            .map(|c| match c {
                [a, b] => Point {
                    t: a.t,
                    util: mean2(a.util, b.util),
                    mem: a.mem.max(b.mem),
                    procs: a.procs.max(b.procs),
                    sm: mean2(a.sm, b.sm),
                    tensor: mean2(a.tensor, b.tensor),
                    dram: mean2(a.dram, b.dram),
                    power: mean2(a.power, b.power),
                    limit: mean2(a.limit, b.limit),
                },
                [a] => *a,
                _ => unreachable_point(),
            })
            .collect();
        self.points = merged;
    }
}

fn unreachable_point() -> Point {
    Point {
        t: 0,
        util: f32::NAN,
        mem: f32::NAN,
        procs: 0,
        sm: f32::NAN,
        tensor: f32::NAN,
        dram: f32::NAN,
        power: f32::NAN,
        limit: f32::NAN,
    }
}

fn mean2(a: f32, b: f32) -> f32 {
    match (a.is_nan(), b.is_nan()) {
        (false, false) => (a + b) / 2.0,
        (true, _) => b,
        (_, true) => a,
    }
}

/// When a finding held.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Window {
    pub start_ms: i64,
    pub end_ms: i64,
}

/// A problem pattern on one GPU: what, when, how strongly, why, and what to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// The GPU it is about.
    pub gpu: u32,
    /// The pattern (`low_utilization`, `gpu_straggler`, …: the stock rule of the same name
    /// watches for it live).
    #[serde(alias = "alert")]
    pub pattern: String,
    /// What a person sees.
    pub title: String,
    /// `info`, `warning` or `critical`.
    #[serde(default)]
    pub severity: String,
    /// Share of the observed time it was judged on (the GPU's steady phases, or its jobs).
    #[serde(alias = "share")]
    pub share_of_observed: f64,
    /// Observed time it held, seconds.
    pub seconds: f64,
    /// When it held (at most 8 windows; the first and last are kept).
    #[serde(default)]
    pub windows: Vec<Window>,
    /// The measure behind it.
    #[serde(default)]
    pub evidence: String,
    /// The likely cause.
    pub cause: String,
    /// The fix.
    pub fix: String,
    /// Its rank among the findings of its GPU (1: the strongest).
    #[serde(default)]
    pub rank: u32,
}

/// A phase of the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    /// `idle head`, `job`, `idle`, `idle tail`.
    pub kind: String,
    pub start_ms: i64,
    pub end_ms: i64,
}

impl Phase {
    /// `job 3m 40s`.
    pub fn describe(&self) -> String {
        format!(
            "{} {}",
            self.kind,
            super::human_duration((self.end_ms - self.start_ms) as f64 / 1000.0)
        )
    }
}

/// One GPU's verdict in a line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub gpu: u32,
    pub verdict: String,
}

/// The diagnosis of a log.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Diagnosis {
    pub findings: Vec<Finding>,
    /// Patterns that held too briefly to be problems.
    pub brief: Vec<Finding>,
    pub phases: Vec<Phase>,
    pub verdicts: Vec<Verdict>,
    /// Memory trend after warm-up, MiB per hour, per GPU (of its longest job).
    pub mem_trend: BTreeMap<u32, f64>,
}

/// A pattern's words.
struct Words {
    pattern: &'static str,
    title: &'static str,
    severity: &'static str,
    cause: &'static str,
    fix: &'static str,
}

const LOW_UTIL_CAUSE: &str = "the GPU waits — for its input pipeline (DataLoader workers, storage or network reads, CPU-side augmentation), for CPU work between steps, or for host-device copies. Sampled once a second, a step-level stall (100 ms of GPU work, 200 ms of waiting) reads as a steady low utilization, so the log cannot tell an input stall from a batch too small to fill the GPU";

const WORDS: &[Words] = &[
    Words {
        pattern: "rank_dead",
        title: "GPU stopped before the rest of the job",
        severity: "critical",
        cause: "its rank ended or hung (an exception, the OOM killer, an XID) while the other ranks went on — or waited in a collective",
        fix: "look at how this rank's process ended (its log, exit code, `dmesg` for the OOM killer or an XID); set TORCH_NCCL_ASYNC_ERROR_HANDLING=1 and a process-group timeout so a lost rank ends the job instead of hanging it",
    },
    Words {
        pattern: "oom_risk",
        title: "Memory suddenly full",
        severity: "warning",
        cause: "a larger batch, a longer sequence, memory fragmentation or a growing cache pushed memory to the limit: the next larger step runs out of memory",
        fix: "lower the batch size or sequence length, use gradient checkpointing, set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    },
    Words {
        pattern: "memory_leak",
        title: "Memory growing steadily",
        severity: "warning",
        cause: "tensors kept alive across steps (total_loss += loss without .item(), stored outputs or graphs, growing caches)",
        fix: "accumulate Python numbers (.item()), detach what you keep, clear lists; torch.cuda.memory_summary() shows what grows",
    },
    Words {
        pattern: "gpu_straggler",
        title: "GPU far below its peers",
        severity: "warning",
        cause: "one rank does extra work on the critical path while the others wait for it: synchronous checkpointing, evaluation or logging on rank 0, its own DataLoader, a slower link or a throttled board",
        fix: "checkpoint and evaluate asynchronously or spread across ranks, give that rank's DataLoader more workers, compare its clocks and link with `gpuwatch status` and `nvidia-smi topo -m`",
    },
    Words {
        pattern: "idle_gpu_memory",
        title: "GPU idle while holding memory",
        severity: "warning",
        cause: "a process holds the GPU's memory but gives it no work: a finished or waiting job that keeps its context, a notebook kernel, a server with no requests, or work that never reached the GPU",
        fix: "end or free what holds it (the process list in `gpuwatch status`), or check that the work is really sent to this GPU (device placement, offloaded layers)",
    },
    Words {
        pattern: "low_utilization",
        title: "Utilization long under 50 %",
        severity: "warning",
        cause: LOW_UTIL_CAUSE,
        fix: "raise num_workers, set pin_memory=True and prefetch_factor, cache or pre-process the dataset, check disk and network throughput, profile one step (torch.profiler) to see where the time goes; if the input keeps up, a larger batch fills the GPU",
    },
    Words {
        pattern: "launch_bound",
        title: "Busy, but most SMs idle (launch-bound)",
        severity: "warning",
        cause: "utilization counts the time a kernel runs, however small: kernels too small to fill the GPU, launched one after another (a small batch, unfused element-wise ops, a Python loop of launches, host synchronisations between them) read 100 % while most SMs wait",
        fix: "a larger batch; fuse kernels (torch.compile); capture the step in CUDA graphs (torch.compile mode=\"reduce-overhead\", torch.cuda.graphs); avoid .item() / .cpu() synchronisations in the loop; a step in torch.profiler shows the gaps between launches",
    },
    Words {
        pattern: "no_tensor_cores",
        title: "Tensor cores idle while the SMs work",
        severity: "warning",
        cause: "the matrix math runs in FP32 on the CUDA cores: no mixed precision (autocast) and TF32 off, or shapes the tensor cores cannot take — on a tensor-core GPU most of its throughput goes unused",
        fix: "train under torch.autocast(\"cuda\", dtype=torch.bfloat16) (or fp16 with a GradScaler); allow TF32 (torch.backends.cuda.matmul.allow_tf32 = True or torch.set_float32_matmul_precision(\"high\")); keep matrix dimensions multiples of 8",
    },
    Words {
        pattern: "periodic_idle",
        title: "Utilization periodically dropping to zero",
        severity: "warning",
        cause: "something stops the GPU again and again: stalls seconds apart are the input pipeline falling behind between steps (DataLoader workers, host-side augmentation, storage reads); stalls minutes apart are DataLoader workers restarted every epoch, synchronous evaluation or checkpointing, a CPU-side step every N iterations",
        fix: "more DataLoader workers with persistent_workers=True, pin_memory and prefetch_factor, augmentation moved to the GPU; checkpoint and evaluate asynchronously or less often",
    },
    Words {
        pattern: "gpu_imbalance",
        title: "Memory unbalanced across the job's GPUs",
        severity: "info",
        cause: "one GPU carries more than its share: nn.DataParallel gathers outputs and keeps the optimizer on GPU 0, or rank 0 keeps extra copies (metrics, an EMA model, evaluation)",
        fix: "use DistributedDataParallel, shard the optimizer state (ZeRO / FSDP), move rank-0 extras to the CPU",
    },
    Words {
        pattern: "memory_bound",
        title: "DRAM bandwidth near its peak (memory-bound)",
        severity: "info",
        cause: "the kernels wait on memory: element-wise ops, normalisation, attention without a fused kernel or embedding lookups move more bytes than they compute on; more compute will not help, less traffic will",
        fix: "fuse kernels (torch.compile; scaled_dot_product_attention / FlashAttention), keep activations in bf16, larger matrix tiles (a larger batch) raise the compute per byte; profile the top kernels' memory throughput (Nsight Compute)",
    },
    Words {
        pattern: "small_batch",
        title: "Memory far below total",
        severity: "info",
        cause: "the batch is too small for this GPU: most of its memory and throughput goes unused (frameworks that pre-allocate hide this)",
        fix: "raise the batch size (scale the learning rate), or share the GPU with another job (MPS, MIG)",
    },
    Words {
        pattern: "unused_gpu",
        title: "GPU not used by this run",
        severity: "info",
        cause: "the job asked for or saw this GPU but never used it (CUDA_VISIBLE_DEVICES wider than the job, a launcher started fewer ranks, a single-GPU script on a multi-GPU allocation)",
        fix: "give the job only the GPUs it uses, or launch one rank per GPU (torchrun --nproc_per_node)",
    },
];

fn words(pattern: &str) -> &'static Words {
    WORDS
        .iter()
        .find(|w| w.pattern == pattern)
        .unwrap_or(&WORDS[WORDS.len() - 1])
}

/// The patterns the diagnosis names, strongest first (their order ranks ties).
pub fn patterns() -> impl Iterator<Item = &'static str> {
    WORDS.iter().map(|w| w.pattern)
}

/// What one GPU's samples say about their timing.
struct Gpu<'a> {
    tr: &'a Trace,
    /// Time each sample stands for, ms.
    credit: Vec<i64>,
    /// Memory at or above which the GPU counts as held (baseline + [`HELD_MIB`]).
    held_mib: f64,
    base_mib: f64,
    spacing: i64,
}

impl<'a> Gpu<'a> {
    fn new(tr: &'a Trace) -> Gpu<'a> {
        let mut dts: Vec<i64> = tr
            .points
            .windows(2)
            .map(|w| w[1].t - w[0].t)
            .filter(|d| *d > 0)
            .collect();
        dts.sort_unstable();
        let spacing = dts.get(dts.len() / 2).copied().unwrap_or(1000).max(1);
        let credit = (0..tr.points.len())
            .map(|i| {
                tr.points
                    .get(i + 1)
                    .map_or(spacing, |n| (n.t - tr.points[i].t).clamp(0, 2 * spacing))
            })
            .collect();
        let base_mib = tr
            .points
            .iter()
            .map(|p| f64::from(p.mem))
            .filter(|m| m.is_finite())
            .fold(f64::INFINITY, f64::min)
            .min(512.0);
        let base_mib = if base_mib.is_finite() { base_mib } else { 0.0 };
        Gpu {
            tr,
            credit,
            held_mib: base_mib + HELD_MIB,
            base_mib,
            spacing,
        }
    }

    fn in_use(&self, p: &Point) -> bool {
        f64::from(p.util) >= ACTIVE_UTIL || f64::from(p.mem) >= self.held_mib || p.procs > 0
    }

    /// Indices of the samples in `[from, to)`.
    fn range(&self, from: i64, to: i64) -> std::ops::Range<usize> {
        let pts = &self.tr.points;
        pts.partition_point(|p| p.t < from)..pts.partition_point(|p| p.t < to)
    }

    fn has_util(&self, r: std::ops::Range<usize>) -> bool {
        self.tr.points[r].iter().any(|p| !p.util.is_nan())
    }
}

/// Per (GPU, pattern): what the jobs added up to.
#[derive(Default)]
struct Acc {
    held_ms: i64,
    /// Samples (or buckets) in which it held: a pattern needs [`MIN_SAMPLES`] of them.
    held_n: u32,
    observed_ms: i64,
    windows: Vec<Window>,
    evidence: Vec<String>,
    severity: Option<&'static str>,
    title: Option<&'static str>,
    cause: Option<String>,
    /// Decided significant by the pattern's own test.
    decided: Option<bool>,
    /// Utilization × time and time over the jobs (for one summary of several jobs).
    util_sum: f64,
    util_ms: i64,
}

impl Acc {
    fn window(&mut self, start_ms: i64, end_ms: i64) {
        self.held_n += 1;
        if let Some(last) = self.windows.last_mut() {
            if start_ms <= last.end_ms {
                last.end_ms = last.end_ms.max(end_ms);
                return;
            }
        }
        self.windows.push(Window { start_ms, end_ms });
    }
}

type Accs = BTreeMap<(u32, &'static str), Acc>;

/// Percentile `q` (0–1) of `v` (sorted in place); `None` when empty.
fn pct(v: &mut [f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    Some(v[i])
}

fn weighted_mean(xs: impl Iterator<Item = (f64, i64)>) -> Option<f64> {
    let (mut s, mut w) = (0.0, 0i64);
    for (x, c) in xs {
        if x.is_finite() {
            s += x * c.max(1) as f64;
            w += c.max(1);
        }
    }
    (w > 0).then(|| s / w as f64)
}

fn hm(ms: i64) -> String {
    super::human_duration(ms as f64 / 1000.0)
}

fn gib(mib: f64) -> String {
    format!("{:.1} GiB", mib / 1024.0)
}

/// The diagnosis of `traces` (one per GPU). `steps`: training steps over the log, when known.
pub fn diagnose(traces: &[Trace], steps: Option<u64>) -> Diagnosis {
    let gpus: Vec<Gpu<'_>> = traces.iter().map(Gpu::new).collect();
    let jobs = jobs(&gpus);
    let mut d = Diagnosis {
        phases: phases(&gpus, &jobs),
        ..Diagnosis::default()
    };
    let mut accs: Accs = BTreeMap::new();
    let mut trend_len: BTreeMap<u32, i64> = BTreeMap::new();
    let log_span: i64 = gpus
        .iter()
        .filter_map(|g| Some(g.tr.points.last()?.t - g.tr.points.first()?.t))
        .max()
        .unwrap_or(0);
    for &(start, end) in &jobs {
        let mut steady: BTreeMap<u32, (i64, i64, f64)> = BTreeMap::new();
        for g in &gpus {
            let r = g.range(start, end);
            if r.is_empty() {
                continue;
            }
            if let Some(s) = per_gpu(g, r.clone(), &mut accs) {
                steady.insert(g.tr.index, s);
            }
            if let Some((trend, measured)) = memory(g, r, steps, log_span, &mut accs) {
                if trend_len.get(&g.tr.index).is_none_or(|m| measured > *m) {
                    trend_len.insert(g.tr.index, measured);
                    d.mem_trend.insert(g.tr.index, trend);
                }
            }
        }
        across(&gpus, start, end, &steady, &mut accs);
    }
    let (findings, brief) = finish(accs);
    d.verdicts = verdicts(&gpus, &jobs, &findings);
    d.findings = findings;
    d.brief = brief;
    d
}

/// The jobs: node-level stretches where some GPU is in use, joined across short pauses.
fn jobs(gpus: &[Gpu<'_>]) -> Vec<(i64, i64)> {
    let mut spans: Vec<(i64, i64)> = Vec::new();
    let max_spacing = gpus.iter().map(|g| g.spacing).max().unwrap_or(1000);
    let join = JOB_GAP_MS.max(10 * max_spacing);
    for g in gpus {
        for (i, p) in g.tr.points.iter().enumerate() {
            if g.in_use(p) {
                spans.push((p.t, p.t + g.credit[i].max(1)));
            }
        }
    }
    spans.sort_unstable();
    let mut out: Vec<(i64, i64)> = Vec::new();
    for (s, e) in spans {
        match out.last_mut() {
            Some(last) if s <= last.1 + join => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

fn phases(gpus: &[Gpu<'_>], jobs: &[(i64, i64)]) -> Vec<Phase> {
    let first = gpus
        .iter()
        .filter_map(|g| g.tr.points.first())
        .map(|p| p.t)
        .min();
    let last = gpus
        .iter()
        .filter_map(|g| g.tr.points.last().map(|p| p.t + g.spacing))
        .max();
    let (Some(first), Some(last)) = (first, last) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut at = first;
    for (i, &(s, e)) in jobs.iter().enumerate() {
        if s > at {
            out.push(Phase {
                kind: if i == 0 { "idle head" } else { "idle" }.into(),
                start_ms: at,
                end_ms: s,
            });
        }
        out.push(Phase {
            kind: "job".into(),
            start_ms: s,
            end_ms: e.min(last),
        });
        at = e;
    }
    if last > at {
        out.push(Phase {
            kind: if jobs.is_empty() { "idle" } else { "idle tail" }.into(),
            start_ms: at,
            end_ms: last,
        });
    }
    out
}

/// One GPU's patterns within one job (`r`: its samples in the job). Returns its steady phase.
fn per_gpu(g: &Gpu<'_>, r: std::ops::Range<usize>, accs: &mut Accs) -> Option<(i64, i64, f64)> {
    let idx = g.tr.index;
    let pts = &g.tr.points;
    if !g.has_util(r.clone()) || r.len() < MIN_SAMPLES as usize {
        return None;
    }
    let mut utils: Vec<f64> = pts[r.clone()]
        .iter()
        .map(|p| f64::from(p.util))
        .filter(|u| u.is_finite())
        .collect();
    let p90 = pct(&mut utils, 0.9).unwrap_or(0.0);
    let level = (0.5 * p90).max(ACTIVE_UTIL);
    let active: Vec<usize> = r
        .clone()
        .filter(|i| f64::from(pts[*i].util) >= level)
        .collect();
    let in_use: Vec<usize> = r.clone().filter(|i| g.in_use(&pts[*i])).collect();
    // The steady phase: from the first sample at half the busy level (the end of warm-up) to
    // the last sample with work; a GPU that never works is judged over the time it is held.
    // It ends at the last sample with any work: a GPU that slows down mid-run stays judged.
    let last_work = r
        .clone()
        .rev()
        .find(|i| f64::from(pts[*i].util) >= ACTIVE_UTIL);
    let (lo, hi) = match (active.first(), last_work) {
        (Some(a), Some(b)) if b >= *a => (*a, b),
        _ => match (in_use.first(), in_use.last()) {
            (Some(a), Some(b)) => (*a, *b),
            _ => return None,
        },
    };
    let st = lo..hi + 1;
    let observed: i64 = st.clone().map(|i| g.credit[i]).sum();
    if observed <= 0 {
        return None;
    }
    let steady_span = (pts[lo].t, pts[hi].t + g.credit[hi]);
    let mean = weighted_mean(st.clone().map(|i| (f64::from(pts[i].util), g.credit[i])));
    let mut su: Vec<f64> = st
        .clone()
        .map(|i| f64::from(pts[i].util))
        .filter(|u| u.is_finite())
        .collect();
    let p95 = pct(&mut su, 0.95).unwrap_or(0.0);
    let median = pct(&mut su, 0.5).unwrap_or(0.0);
    let idle_ms: i64 = st
        .clone()
        .filter(|i| f64::from(pts[*i].util) < ACTIVE_UTIL)
        .map(|i| g.credit[i])
        .sum();
    let idle_share = idle_ms as f64 / observed as f64;

    // low_utilization: rolling mean under 50 %.
    let w = (30_000i64).max(5 * g.spacing);
    let mut low_ms = 0;
    let acc = accs.entry((idx, "low_utilization")).or_default();
    let (mut j0, mut j1) = (lo, lo);
    let (mut sum, mut wsum) = (0.0f64, 0i64);
    for i in st.clone() {
        let t = pts[i].t;
        while j1 <= hi && pts[j1].t <= t + w / 2 {
            let u = f64::from(pts[j1].util);
            if u.is_finite() {
                sum += u * g.credit[j1].max(1) as f64;
                wsum += g.credit[j1].max(1);
            }
            j1 += 1;
        }
        while j0 < j1 && pts[j0].t < t - w / 2 {
            let u = f64::from(pts[j0].util);
            if u.is_finite() {
                sum -= u * g.credit[j0].max(1) as f64;
                wsum -= g.credit[j0].max(1);
            }
            j0 += 1;
        }
        if wsum > 0 && sum / (wsum as f64) < 50.0 {
            low_ms += g.credit[i];
            acc.window(t, t + g.credit[i]);
        }
    }
    acc.held_ms += low_ms;
    acc.observed_ms += observed;
    if let Some(m) = mean {
        acc.util_sum += m * observed as f64;
        acc.util_ms += observed;
        acc.evidence.push(format!(
            "mean {m:.0} % (p50 {median:.0}, p95 {p95:.0}) over {} of work; under 50 % for {:.0} % of it",
            hm(observed),
            100.0 * low_ms as f64 / observed as f64
        ));
        let shape = if idle_share >= 0.8 {
            format!("; here the GPU is idle {:.0} % of the time and works in short bursts (federated rounds, evaluation, a CPU-bound loop between GPU calls)", idle_share * 100.0)
        } else if p95 >= 60.0 {
            "; here work comes in bursts between waits — the input-stall shape".to_string()
        } else {
            String::new()
        };
        acc.cause = Some(format!("{LOW_UTIL_CAUSE}{shape}"));
    }

    // idle_gpu_memory: idle while holding memory, in stretches of a minute (and five samples)
    // or more; shorter pauses between bursts are low utilization.
    let hold = g.base_mib + IDLE_HOLD_MIB;
    let min_run = MIN_IDLE_RUN_MS.max(5 * g.spacing);
    let mut runs: Vec<(i64, i64, i64, Vec<f64>)> = Vec::new();
    let mut open: Option<(i64, i64, i64, Vec<f64>)> = None;
    for i in st.clone() {
        let p = pts[i];
        if f64::from(p.util) < ACTIVE_UTIL && f64::from(p.mem) >= hold {
            let r = open.get_or_insert_with(|| (p.t, p.t, 0, Vec::new()));
            r.1 = p.t + g.credit[i];
            r.2 += g.credit[i];
            r.3.push(f64::from(p.mem));
        } else if let Some(r) = open.take() {
            runs.push(r);
        }
    }
    runs.extend(open);
    let acc = accs.entry((idx, "idle_gpu_memory")).or_default();
    let mut idle_hold = 0;
    let mut held: Vec<f64> = Vec::new();
    for (a, b, ms, mems) in runs {
        if b - a >= min_run && mems.len() >= 5 {
            idle_hold += ms;
            acc.window(a, b);
            acc.held_n += u32::try_from(mems.len()).unwrap_or(u32::MAX);
            held.extend(mems);
        }
    }
    acc.held_ms += idle_hold;
    acc.observed_ms += observed;
    if let Some(m) = pct(&mut held, 0.5) {
        acc.evidence.push(format!(
            "under {ACTIVE_UTIL:.0} % utilization while holding {} (median), {} in stretches of a minute or more",
            gib(m),
            hm(idle_hold)
        ));
    }

    periodic(g, st.clone(), observed, median, accs);
    gpm_patterns(g, st.clone(), accs);

    // small_batch: memory far below total while the GPU is not saturated.
    if let Some(total) = g.tr.total_mib {
        let mut mems: Vec<f64> = st
            .clone()
            .map(|i| f64::from(pts[i].mem))
            .filter(|m| m.is_finite())
            .collect();
        if let Some(m95) = pct(&mut mems, 0.95) {
            let acc = accs.entry((idx, "small_batch")).or_default();
            acc.observed_ms += observed;
            if m95 < 0.4 * total && p95 < 80.0 && mean.is_some_and(|m| m >= 1.0) {
                acc.held_ms += observed;
                acc.window(steady_span.0, steady_span.1);
                acc.held_n += u32::try_from(st.len()).unwrap_or(u32::MAX);
                acc.evidence.push(format!(
                    "memory p95 {} of {} ({:.0} %) while utilization p95 is {p95:.0} %",
                    gib(m95),
                    gib(total),
                    100.0 * m95 / total
                ));
            }
        }
    }
    Some((steady_span.0, steady_span.1, p90))
}

/// The GPM patterns over the steady phase `st`, each judged on the samples that have its
/// GPM values (none in a log without GPM).
fn gpm_patterns(g: &Gpu<'_>, st: std::ops::Range<usize>, accs: &mut Accs) {
    let pts = &g.tr.points;
    let idx = g.tr.index;
    let mean_of = |sel: &[usize], f: fn(&Point) -> f32| {
        weighted_mean(sel.iter().map(|&i| (f64::from(f(&pts[i])), g.credit[i])))
    };
    let mut judge = |pattern: &'static str,
                     has: fn(&Point) -> bool,
                     holds: &dyn Fn(&Point) -> bool,
                     evidence: &dyn Fn(&[usize], i64) -> String| {
        let with: Vec<usize> = st.clone().filter(|&i| has(&pts[i])).collect();
        let observed: i64 = with.iter().map(|&i| g.credit[i]).sum();
        if observed <= 0 {
            return;
        }
        let acc = accs.entry((idx, pattern)).or_default();
        acc.observed_ms += observed;
        let held: Vec<usize> = with.into_iter().filter(|&i| holds(&pts[i])).collect();
        let ms: i64 = held.iter().map(|&i| g.credit[i]).sum();
        for &i in &held {
            acc.window(pts[i].t, pts[i].t + g.credit[i]);
        }
        acc.held_ms += ms;
        if ms > 0 {
            acc.evidence.push(evidence(&held, ms));
        }
    };
    let pct_of = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |x| format!("{x:.0} %"));
    judge(
        "launch_bound",
        |p| p.sm.is_finite() && p.util.is_finite(),
        // at near-idle power few busy SMs are an NCCL hang's spinning kernels, not launch-bound
        &|p| {
            f64::from(p.util) >= LAUNCH_BOUND_UTIL
                && f64::from(p.sm) < LAUNCH_BOUND_SM
                && !p.near_idle_power()
        },
        &|held, ms| {
            format!(
                "utilization {} while SM active {} (means over the {} it held)",
                pct_of(mean_of(held, |p| p.util)),
                pct_of(mean_of(held, |p| p.sm)),
                hm(ms)
            )
        },
    );
    judge(
        "no_tensor_cores",
        |p| p.sm.is_finite() && p.tensor.is_finite(),
        &|p| f64::from(p.sm) >= NO_TENSOR_SM && f64::from(p.tensor) < NO_TENSOR_ACTIVE,
        &|held, ms| {
            let tensor = mean_of(held, |p| p.tensor).unwrap_or(0.0);
            format!(
                "SM active {} while tensor active {tensor:.1} % (means over the {} it held)",
                pct_of(mean_of(held, |p| p.sm)),
                hm(ms)
            )
        },
    );
    judge(
        "memory_bound",
        |p| p.dram.is_finite(),
        &|p| f64::from(p.dram) >= MEMORY_BOUND_DRAM,
        &|held, ms| {
            format!(
                "DRAM active {} of the peak bandwidth, SM active {} (means over the {} it held)",
                pct_of(mean_of(held, |p| p.dram)),
                pct_of(mean_of(held, |p| p.sm)),
                hm(ms)
            )
        },
    );
}

/// `periodic_idle`: drops whose median interval is at most this many sample spacings come about
/// as fast as the log can time them.
const FAST_DIP_SPACINGS: f64 = 4.0;
/// `periodic_idle`: how many such fast drops a finding needs when their intervals look irregular
/// (regular ones need four).
const FAST_DIP_MIN: usize = 10;

/// `periodic_idle` over the steady phase `st`.
fn periodic(g: &Gpu<'_>, st: std::ops::Range<usize>, observed: i64, median: f64, accs: &mut Accs) {
    let pts = &g.tr.points;
    let dip_level = (0.2 * median).max(10.0);
    let mut dips: Vec<(i64, i64, i64)> = Vec::new(); // (start, end, credit)
    let mut busy: Vec<f64> = Vec::new();
    for i in st.clone() {
        let u = f64::from(pts[i].util);
        if !u.is_finite() {
            continue;
        }
        if u <= dip_level {
            let end = pts[i].t + g.credit[i];
            match dips.last_mut() {
                Some(d) if pts[i].t <= d.1 + g.spacing / 2 => {
                    d.1 = end;
                    d.2 += g.credit[i];
                }
                _ => dips.push((pts[i].t, end, g.credit[i])),
            }
        } else {
            busy.push(u);
        }
    }
    let busy_median = pct(&mut busy, 0.5).unwrap_or(0.0);
    if dips.len() < 4 || busy_median < 40.0 {
        return;
    }
    let mut intervals: Vec<f64> = dips.windows(2).map(|w| (w[1].0 - w[0].0) as f64).collect();
    let period = pct(&mut intervals, 0.5).unwrap_or(0.0);
    let spacing = g.spacing as f64;
    // Regular: most intervals near their median. A drop's start is known only to within one
    // sample, so a slow period's tolerance is at least one spacing; a fast one keeps ±30 %
    // (more would let every interval of a few samples count as regular).
    let fast = period <= FAST_DIP_SPACINGS * spacing;
    let tolerance = if fast {
        0.3 * period
    } else {
        (0.3 * period).max(spacing)
    };
    let near = intervals
        .iter()
        .filter(|x| (*x - period).abs() <= tolerance)
        .count();
    let regular = period >= 3.0 * spacing && near as f64 >= 0.7 * (dips.len() - 1) as f64;
    // Drops a few samples apart come faster than the log can time them: which sample lands in
    // a short stall then depends on the sampling's phase and jitter, so their intervals vary by
    // whole samples however regular the stalls are. Their recurrence shows in the samples
    // themselves instead: at a drop, the sample a few later is at a drop more often than
    // chance (random idle samples, or idle stretches of random length, show no such lag).
    let mut recurs = None;
    if !regular {
        if !fast || dips.len() < FAST_DIP_MIN {
            return;
        }
        let down = st
            .map(|i| f64::from(pts[i].util))
            .filter(|u| u.is_finite())
            .map(|u| u <= dip_level);
        let Some(lag) = recurrence(down) else {
            return;
        };
        recurs = Some(lag);
    }
    let dip_ms: i64 = dips.iter().map(|d| d.2).sum();
    let acc = accs.entry((g.tr.index, "periodic_idle")).or_default();
    acc.held_ms += dip_ms;
    acc.observed_ms += observed;
    acc.decided = Some(dip_ms as f64 >= 0.05 * observed as f64);
    for d in &dips {
        acc.window(d.0, d.1);
    }
    let lost = 100.0 * dip_ms as f64 / observed as f64;
    let each = hm(dip_ms / dips.len() as i64);
    acc.evidence.push(match recurs {
        Some(lag) => format!(
            "drops to ≤ {dip_level:.0} % {} times ({each} each on average), recurring about every {} between stretches at {busy_median:.0} % — near the limit of what a log sampled every {} can time, so the stalls may come faster; {lost:.0} % of the time lost",
            dips.len(),
            hm(lag as i64 * g.spacing),
            hm(g.spacing),
        ),
        None => format!(
            "drops to ≤ {dip_level:.0} % every {} ({} times, {each} each on average) between stretches at {busy_median:.0} %; {lost:.0} % of the time lost",
            hm(period as i64),
            dips.len(),
        ),
    });
}

/// The lag (2 to [`FAST_DIP_SPACINGS`] samples) at which the drop samples recur (`down`: per
/// sample, whether it is at a drop): their autocorrelation there is at least 0.15 and three
/// standard errors of chance (3/√n), and above the autocorrelation at one sample (which idle
/// stretches of some length have without any period). `None` when no lag qualifies.
fn recurrence(down: impl Iterator<Item = bool>) -> Option<usize> {
    let x: Vec<f64> = down.map(|d| if d { 1.0 } else { 0.0 }).collect();
    let n = x.len();
    let mean = x.iter().sum::<f64>() / n as f64;
    let var: f64 = x.iter().map(|v| (v - mean) * (v - mean)).sum();
    if var <= 0.0 {
        return None;
    }
    let r = |lag: usize| {
        x.iter()
            .zip(&x[lag.min(n)..])
            .map(|(a, b)| (a - mean) * (b - mean))
            .sum::<f64>()
            / var
    };
    let (lag, best) = (2..=FAST_DIP_SPACINGS as usize)
        .map(|lag| (lag, r(lag)))
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    let floor = 0.15f64.max(3.0 / (n as f64).sqrt());
    (best >= floor && best > r(1)).then_some(lag)
}

/// Memory growth and full memory over one job (`r`). Returns the post-warm-up trend (MiB/h) and
/// the time it was measured over.
fn memory(
    g: &Gpu<'_>,
    r: std::ops::Range<usize>,
    steps: Option<u64>,
    log_span: i64,
    accs: &mut Accs,
) -> Option<(f64, i64)> {
    let idx = g.tr.index;
    let pts: Vec<(i64, f64, i64)> = r
        .clone()
        .filter(|i| g.in_use(&g.tr.points[*i]))
        .map(|i| {
            let p = g.tr.points[i];
            (p.t, f64::from(p.mem), g.credit[i])
        })
        .filter(|p| p.1.is_finite())
        .collect();
    if pts.is_empty() {
        return None;
    }
    if let Some(total) = g.tr.total_mib {
        full(g, &pts, total, accs);
    }
    let (t0, t1) = (pts[0].0, pts[pts.len() - 1].0);
    let span = t1 - t0;
    if pts.len() < 10 || span <= 0 {
        return None;
    }
    let mut third: Vec<f64> = pts[pts.len() * 2 / 3..].iter().map(|p| p.1).collect();
    let level = pct(&mut third, 0.5)?;
    let warm_end = pts
        .iter()
        .find(|p| p.1 >= 0.9 * level)
        .map_or(t0, |p| p.0)
        .min(t0 + span / 2);
    let m: Vec<(f64, f64)> = pts
        .iter()
        .filter(|p| p.0 >= warm_end)
        .map(|p| ((p.0 - warm_end) as f64, p.1))
        .collect();
    let measured = t1 - warm_end;
    if m.len() < 5 || measured <= 0 {
        return None;
    }
    let n = m.len() as f64;
    let (sx, sy) = m.iter().fold((0.0, 0.0), |a, p| (a.0 + p.0, a.1 + p.1));
    let (mx, my) = (sx / n, sy / n);
    let (mut sxx, mut sxy, mut syy) = (0.0, 0.0, 0.0);
    for (x, y) in &m {
        sxx += (x - mx) * (x - mx);
        sxy += (x - mx) * (y - my);
        syy += (y - my) * (y - my);
    }
    if sxx <= 0.0 {
        return None;
    }
    let slope = sxy / sxx; // MiB per ms
    let r2 = if syy > 0.0 {
        sxy * sxy / (sxx * syy)
    } else {
        0.0
    };
    let trend = slope * 3.6e6;
    // Block medians: steady growth rises block after block.
    let blocks: Vec<f64> = (0..8)
        .filter_map(|b| {
            let mut chunk: Vec<f64> = m[m.len() * b / 8..m.len() * (b + 1) / 8]
                .iter()
                .map(|p| p.1)
                .collect();
            pct(&mut chunk, 0.5)
        })
        .collect();
    let ups = blocks.windows(2).filter(|w| w[1] > w[0]).count();
    let q = m.len() / 4;
    let first = pct(
        &mut m[..q.max(1)].iter().map(|p| p.1).collect::<Vec<_>>(),
        0.5,
    )?;
    let last = pct(
        &mut m[m.len() - q.max(1)..]
            .iter()
            .map(|p| p.1)
            .collect::<Vec<_>>(),
        0.5,
    )?;
    let growth = last - first;
    let total = g.tr.total_mib.unwrap_or(0.0);
    let leak = measured >= 5 * 60_000
        && slope > 0.0
        && growth >= 256f64.max(0.01 * total)
        && r2 >= 0.6
        && blocks.len() == 8
        && ups >= 5;
    let acc = accs.entry((idx, "memory_leak")).or_default();
    let observed: i64 = pts.iter().map(|p| p.2).sum();
    acc.observed_ms += observed;
    if leak {
        acc.held_ms += measured;
        acc.decided = Some(true);
        acc.window(warm_end, t1);
        acc.held_n += u32::try_from(m.len()).unwrap_or(u32::MAX);
        let per_step = steps.filter(|s| *s > 0 && log_span > 0).map(|s| {
            // Steps are counted over the whole log; the job's share of them by time.
            let steps_here = s as f64 * measured as f64 / log_span as f64;
            slope * measured as f64 / steps_here.max(1.0)
        });
        let per_step = per_step.map_or_else(String::new, |p| {
            if p >= 1.0 {
                format!(", {p:.1} MiB per step")
            } else {
                format!(", {:.0} MiB per 1000 steps", p * 1000.0)
            }
        });
        let fills = (total > 0.0 && slope > 0.0)
            .then(|| (total - last) / slope)
            .filter(|ms| *ms > 0.0)
            .map_or_else(String::new, |ms| {
                format!("; at this rate it fills the GPU in {}", hm(ms as i64))
            });
        acc.evidence.push(format!(
            "+{trend:.0} MiB/h after warm-up ({} → {} over {}, R² {r2:.2}){per_step}{fills}",
            gib(first),
            gib(last),
            hm(measured)
        ));
    }
    Some((trend, measured))
}

/// `oom_risk`: memory at ≥ 95 % of total within one job.
fn full(g: &Gpu<'_>, pts: &[(i64, f64, i64)], total: f64, accs: &mut Accs) {
    let limit = 0.95 * total;
    let mut full_ms = 0;
    let mut samples = 0;
    let mut sudden = false;
    let mut peak: f64 = 0.0;
    let acc = accs.entry((g.tr.index, "oom_risk")).or_default();
    for (i, p) in pts.iter().enumerate() {
        if p.1 >= limit {
            full_ms += p.2;
            samples += 1;
            peak = peak.max(p.1);
            acc.window(p.0, p.0 + p.2);
            // A jump: under 80 % within the minute before.
            if pts[..i]
                .iter()
                .rev()
                .take_while(|q| p.0 - q.0 <= 60_000)
                .any(|q| q.1 < 0.8 * total)
            {
                sudden = true;
            }
        }
    }
    acc.observed_ms += pts.iter().map(|p| p.2).sum::<i64>();
    acc.held_ms += full_ms;
    if samples == 0 {
        return;
    }
    let significant = full_ms >= 30_000 || samples >= 2;
    acc.decided = Some(acc.decided.unwrap_or(false) || significant);
    let from_start = pts.first().is_some_and(|p| p.1 >= limit);
    if sudden {
        acc.severity = Some("warning");
        acc.title = None;
    } else if from_start && acc.severity.is_none() {
        acc.title = Some("Memory nearly full");
        acc.severity = Some("info");
        acc.cause = Some("memory was nearly full from the job's start: frameworks that pre-allocate (TensorFlow, JAX) look like this; with PyTorch the job runs at its limit, and a longer sequence or larger batch will not fit".into());
    }
    acc.evidence.push(format!(
        "memory at {:.0} % of {} ({}) for {}{}",
        100.0 * peak / total,
        gib(total),
        gib(peak),
        hm(full_ms),
        if sudden {
            ", reached by a jump from under 80 % within a minute"
        } else {
            ""
        }
    ));
}

/// Patterns across the GPUs of one job `[start, end)`; `steady`: each GPU's steady phase.
fn across(
    gpus: &[Gpu<'_>],
    start: i64,
    end: i64,
    steady: &BTreeMap<u32, (i64, i64, f64)>,
    accs: &mut Accs,
) {
    let dur = end - start;
    // unused_gpu: util known, never in use in this job, while another GPU works.
    let used: Vec<&Gpu<'_>> = gpus
        .iter()
        .filter(|g| {
            let r = g.range(start, end);
            g.tr.points[r].iter().any(|p| g.in_use(p))
        })
        .collect();
    if !used.is_empty() {
        for g in gpus {
            let r = g.range(start, end);
            if r.is_empty()
                || !g.has_util(r.clone())
                || used.iter().any(|u| u.tr.index == g.tr.index)
            {
                continue;
            }
            let observed: i64 = r.clone().map(|i| g.credit[i]).sum();
            let acc = accs.entry((g.tr.index, "unused_gpu")).or_default();
            acc.held_ms += observed;
            acc.observed_ms += observed;
            acc.decided = Some(true);
            acc.window(start, end);
            acc.held_n += u32::try_from(r.len()).unwrap_or(u32::MAX);
            let others: Vec<String> = used.iter().map(|u| u.tr.index.to_string()).collect();
            acc.evidence.push(format!(
                "no work and no memory held for {} while GPU {} worked",
                hm(observed),
                others.join(", ")
            ));
        }
    }
    // Members: GPUs with a steady phase that started together (an unrelated job started at
    // another time is no peer).
    // Working ranks only: a GPU that never really worked (idle, or memory held at 0 %) is no
    // rank to compare with (idle_gpu_memory and unused_gpu speak for it).
    let working: BTreeMap<u32, (i64, i64)> = steady
        .iter()
        .filter(|(_, s)| s.2 >= WORKING_UTIL)
        .map(|(k, s)| (*k, (s.0, s.1)))
        .collect();
    let steady = &working;
    let mut starts: Vec<f64> = steady.values().map(|s| s.0 as f64).collect();
    let Some(mid) = pct(&mut starts, 0.5) else {
        return;
    };
    let tol = (180_000f64).max(0.1 * dur as f64);
    let members: Vec<(&Gpu<'_>, (i64, i64))> = gpus
        .iter()
        .filter_map(|g| steady.get(&g.tr.index).map(|s| (g, *s)))
        .filter(|(_, s)| (s.0 as f64 - mid).abs() <= tol)
        .collect();
    if members.len() < 2 {
        return;
    }
    // Two GPUs, each with processes of its own: possibly two unrelated jobs.
    if members.len() == 2 {
        let (a, b) = (&members[0].0.tr.pids, &members[1].0.tr.pids);
        if !a.is_empty() && !b.is_empty() && !a.iter().any(|p| b.contains(p)) {
            return;
        }
    }
    let spacing = members.iter().map(|m| m.0.spacing).max().unwrap_or(1000);
    let bucket = (dur / 30).clamp(5 * spacing, 60_000.max(5 * spacing));
    let nb = usize::try_from((dur + bucket - 1) / bucket)
        .unwrap_or(0)
        .min(10_000);
    // Per member and bucket: mean utilization and median memory.
    let mut util = vec![vec![f64::NAN; nb]; members.len()];
    let mut mem = vec![vec![f64::NAN; nb]; members.len()];
    for (k, (g, _)) in members.iter().enumerate() {
        for b in 0..nb {
            let from = start + b as i64 * bucket;
            let r = g.range(from, from + bucket);
            if r.is_empty() {
                continue;
            }
            if let Some(u) = weighted_mean(
                r.clone()
                    .map(|i| (f64::from(g.tr.points[i].util), g.credit[i])),
            ) {
                util[k][b] = u;
            }
            let mut ms: Vec<f64> = r
                .map(|i| f64::from(g.tr.points[i].mem))
                .filter(|m| m.is_finite())
                .collect();
            if let Some(m) = pct(&mut ms, 0.5) {
                mem[k][b] = m;
            }
        }
    }
    let median_of = |xs: Vec<f64>| {
        let mut v: Vec<f64> = xs.into_iter().filter(|x| x.is_finite()).collect();
        pct(&mut v, 0.5)
    };
    let last_active: Vec<i64> = members.iter().map(|m| m.1 .1).collect();
    let latest = last_active.iter().copied().max().unwrap_or(end);
    for (k, (g, s)) in members.iter().enumerate() {
        let (mut work_ms, mut slow_ms, mut heavy_ms) = (0i64, 0i64, 0i64);
        let (mut mine, mut theirs, mut my_mem, mut their_mem) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut slow_windows = Vec::new();
        for b in 0..nb {
            let from = start + b as i64 * bucket;
            let peers: Vec<f64> = (0..members.len())
                .filter(|j| *j != k)
                .map(|j| util[j][b])
                .collect();
            let Some(peer) = median_of(peers) else {
                continue;
            };
            let u = util[k][b];
            if peer < 50.0 || !u.is_finite() || from > s.1 {
                continue;
            }
            work_ms += bucket;
            mine.push(u);
            theirs.push(peer);
            if u < 0.6 * peer && peer - u >= 25.0 {
                slow_ms += bucket;
                slow_windows.push((from, from + bucket));
            }
            let peer_mem = median_of(
                (0..members.len())
                    .filter(|j| *j != k)
                    .map(|j| mem[j][b])
                    .collect(),
            );
            if let (Some(pm), m) = (peer_mem, mem[k][b]) {
                if m.is_finite() {
                    my_mem.push(m);
                    their_mem.push(pm);
                    if m >= 1.3 * pm && m - pm >= 2048.0 {
                        heavy_ms += bucket;
                    }
                }
            }
        }
        let acc = accs.entry((g.tr.index, "gpu_straggler")).or_default();
        for (a, b) in slow_windows {
            acc.window(a, b);
        }
        acc.held_ms += slow_ms;
        acc.observed_ms += work_ms;
        if slow_ms > 0 {
            let peers: Vec<String> = members
                .iter()
                .filter(|m| m.0.tr.index != g.tr.index)
                .map(|m| m.0.tr.index.to_string())
                .collect();
            acc.evidence.push(format!(
                "mean {:.0} % while its peers (GPU {}) ran at {:.0} % (median) for {:.0} % of the job's working time",
                mean_of(&mine),
                peers.join(", "),
                mean_of(&theirs),
                100.0 * slow_ms as f64 / work_ms.max(1) as f64
            ));
        }
        let acc = accs.entry((g.tr.index, "gpu_imbalance")).or_default();
        acc.observed_ms += work_ms;
        acc.held_ms += heavy_ms;
        acc.decided = Some(work_ms > 0 && heavy_ms as f64 >= 0.5 * work_ms as f64);
        if heavy_ms > 0 {
            acc.window(s.0, s.1);
            acc.evidence.push(format!(
                "holds {} (median) while its peers hold {}",
                gib(mean_of(&my_mem)),
                gib(mean_of(&their_mem))
            ));
        }
        // rank_dead: stopped working well before its peers.
        let early = latest - s.1;
        if early >= 120_000 && early as f64 >= 0.1 * dur as f64 {
            let still: Vec<String> = members
                .iter()
                .filter(|m| m.1 .1 >= latest - early / 2)
                .map(|m| m.0.tr.index.to_string())
                .collect();
            let acc = accs.entry((g.tr.index, "rank_dead")).or_default();
            acc.held_ms += early;
            acc.observed_ms += dur;
            acc.decided = Some(true);
            acc.window(s.1, latest);
            acc.held_n += u32::try_from(g.range(s.1, latest).len()).unwrap_or(u32::MAX);
            acc.evidence.push(format!(
                "stopped working at {} while GPU {} went on for {}",
                crate::trace::format_time_ms(s.1),
                still.join(", "),
                hm(early)
            ));
        }
    }
}

fn mean_of(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn significant(a: &Acc) -> bool {
    if a.held_n < MIN_SAMPLES {
        return false;
    }
    if let Some(d) = a.decided {
        return d;
    }
    if a.held_ms <= 0 || a.observed_ms <= 0 {
        return false;
    }
    let share = a.held_ms as f64 / a.observed_ms as f64;
    share >= MIN_SHARE || (a.held_ms >= MIN_LONG_MS && share >= MIN_LONG_SHARE)
}

/// Findings and brief episodes, ranked per GPU.
fn finish(accs: Accs) -> (Vec<Finding>, Vec<Finding>) {
    let mut findings = Vec::new();
    let mut brief = Vec::new();
    for ((gpu, pattern), a) in accs {
        if a.held_ms <= 0 || a.observed_ms <= 0 || a.evidence.is_empty() {
            continue;
        }
        let w = words(pattern);
        let share = (a.held_ms as f64 / a.observed_ms as f64).min(1.0);
        let mut windows = a.windows.clone();
        if windows.len() > 8 {
            let last = windows[windows.len() - 1];
            windows.truncate(7);
            windows.push(last);
        }
        let evidence = match a.evidence.len() {
            0 | 1 => a.evidence.join(""),
            n if a.util_ms > 0 => format!(
                "mean {:.0} % over {} of work in {n} jobs; under 50 % for {:.0} % of it",
                a.util_sum / a.util_ms as f64,
                hm(a.util_ms),
                100.0 * share
            ),
            n if n > 2 => format!(
                "{}; {}; and in {} more jobs",
                a.evidence[0],
                a.evidence[1],
                n - 2
            ),
            _ => a.evidence.join("; "),
        };
        let f = Finding {
            gpu,
            pattern: pattern.to_string(),
            title: a.title.unwrap_or(w.title).to_string(),
            severity: a.severity.unwrap_or(w.severity).to_string(),
            share_of_observed: share,
            seconds: a.held_ms as f64 / 1000.0,
            windows,
            evidence,
            cause: a.cause.clone().unwrap_or_else(|| w.cause.to_string()),
            fix: w.fix.to_string(),
            rank: 0,
        };
        if significant(&a) {
            findings.push(f);
        } else if a.held_n >= MIN_SAMPLES {
            // Held in too few samples: no evidence either way, not even of an episode.
            brief.push(f);
        }
    }
    let sev = |s: &str| match s {
        "critical" => 3.0,
        "warning" => 2.0,
        _ => 1.0,
    };
    let order = |p: &str| patterns().position(|x| x == p).unwrap_or(99);
    findings.sort_by(|a, b| {
        a.gpu.cmp(&b.gpu).then(
            (sev(&b.severity) * (0.5 + b.share_of_observed))
                .total_cmp(&(sev(&a.severity) * (0.5 + a.share_of_observed)))
                .then(order(&a.pattern).cmp(&order(&b.pattern))),
        )
    });
    let mut last = None;
    let mut rank = 0;
    for f in &mut findings {
        if last != Some(f.gpu) {
            rank = 0;
            last = Some(f.gpu);
        }
        rank += 1;
        f.rank = rank;
    }
    brief.sort_by(|a, b| {
        a.gpu
            .cmp(&b.gpu)
            .then(order(&a.pattern).cmp(&order(&b.pattern)))
    });
    (findings, brief)
}

fn verdicts(gpus: &[Gpu<'_>], jobs: &[(i64, i64)], findings: &[Finding]) -> Vec<Verdict> {
    gpus.iter()
        .map(|g| {
            let idx = g.tr.index;
            let mine: Vec<&Finding> = findings.iter().filter(|f| f.gpu == idx).collect();
            let verdict = if let Some(top) = mine.first() {
                let more = if mine.len() > 1 {
                    let rest: Vec<&str> = mine[1..].iter().map(|f| f.pattern.as_str()).collect();
                    format!("; also {}", rest.join(", "))
                } else {
                    String::new()
                };
                format!("{} — {}{more}", top.title, top.evidence)
            } else if jobs.is_empty() || !g.tr.points.iter().any(|p| g.in_use(p)) {
                "idle: no work seen".to_string()
            } else {
                let mean = weighted_mean(
                    g.tr.points
                        .iter()
                        .zip(&g.credit)
                        .filter(|(p, _)| g.in_use(p))
                        .map(|(p, c)| (f64::from(p.util), *c)),
                );
                match mean {
                    Some(m) => format!("no problem pattern (utilization {m:.0} % while in use)"),
                    None => "no problem pattern".to_string(),
                }
            };
            Verdict { gpu: idx, verdict }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A trace sampled every `dt` ms from `f(t_s) -> (util, mem MiB)`.
    fn trace(
        index: u32,
        total: f64,
        n: i64,
        dt: i64,
        mut f: impl FnMut(f64) -> (f64, f64),
    ) -> Trace {
        let mut t = Trace::new(index);
        t.total_mib = Some(total);
        for i in 0..n {
            let (u, m) = f((i * dt) as f64 / 1000.0);
            t.points.push(Point {
                t: i * dt,
                util: u as f32,
                mem: m as f32,
                procs: 0,
                sm: f32::NAN,
                tensor: f32::NAN,
                dram: f32::NAN,
                power: f32::NAN,
                limit: f32::NAN,
            });
        }
        t
    }

    /// The first finding of `pattern` (any GPU).
    fn finding<'a>(d: &'a Diagnosis, pattern: &str) -> &'a Finding {
        d.findings.iter().find(|f| f.pattern == pattern).unwrap()
    }

    /// Whether `pattern` is named at all, as a finding or a brief episode.
    fn names(d: &Diagnosis, pattern: &str) -> bool {
        d.findings
            .iter()
            .chain(&d.brief)
            .any(|f| f.pattern == pattern)
    }

    fn has(d: &Diagnosis, gpu: u32, pattern: &str) -> bool {
        d.findings
            .iter()
            .any(|f| f.gpu == gpu && f.pattern == pattern)
    }

    /// The next of a fixed sequence of numbers uniform in [0, 1) (`state`: the sequence's place).
    fn uniform(state: &mut u64) -> f64 {
        *state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (*state >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A trace stamped every `dt` ms whose utilization is `util(t_s)` read `jitter` seconds
    /// (uniform in ±jitter, a fixed sequence per `seed`) off its stamp — a sampler preempted
    /// between GPUs, or a driver averaging over a window that is not the stamp's.
    fn jittered(
        index: u32,
        n: i64,
        dt: i64,
        jitter: f64,
        seed: u64,
        util: impl Fn(f64) -> f64,
    ) -> Trace {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        trace(index, 81_920.0, n, dt, |s| {
            let u = uniform(&mut x);
            (util(s + jitter * (2.0 * u - 1.0)), 48_000.0)
        })
    }

    /// A square wave: `high` except for `low_s` of every `period_s` (phase `phase_s`).
    fn stalls(period_s: f64, low_s: f64, phase_s: f64, high: f64) -> impl Fn(f64) -> f64 {
        move |s| {
            if (s + phase_s).rem_euclid(period_s) < low_s {
                0.0
            } else {
                high
            }
        }
    }

    #[test]
    fn short_stalls_are_periodic_idle_whatever_phase_the_sampling_catches() {
        // The shipped dataloader-stall scenario (1 s of every 3 s) seen every 4 s, each GPU
        // read up to 0.6 s off its stamp: which sample lands in a stall drifts.
        let all: Vec<Trace> = (0..8)
            .map(|g| {
                let phase = 0.37 * f64::from(g);
                jittered(
                    g,
                    250,
                    4000,
                    0.6,
                    u64::from(g),
                    stalls(3.0, 1.0, phase, 68.0),
                )
            })
            .collect();
        let d = diagnose(&all, None);
        for g in 0..8 {
            assert!(has(&d, g, "periodic_idle"), "GPU {g}: {:?}", d.findings);
        }
        let f = finding(&d, "periodic_idle");
        assert!(
            f.evidence.contains("a log sampled every 4s can time"),
            "{f:?}"
        );
        // nvidia-smi -l 1 over 0.8 s stalls every 2.3 s: drops every second or third sample.
        let t = jittered(0, 900, 1000, 0.05, 7, stalls(2.3, 0.8, 0.0, 95.0));
        let d = diagnose(&[t], None);
        assert!(has(&d, 0, "periodic_idle"), "{:?}", d.findings);
    }

    #[test]
    fn a_checkpoint_every_ten_minutes_is_periodic_idle_and_irregular_drops_are_not() {
        // 2 h at 1 s: a 60 s drop every 10 min, each read up to a second off.
        let t = jittered(0, 7200, 1000, 1.0, 3, stalls(600.0, 60.0, 0.0, 97.0));
        let d = diagnose(&[t], None);
        assert!(has(&d, 0, "periodic_idle"), "{:?}", d.findings);
        let f = finding(&d, "periodic_idle");
        assert!(f.evidence.contains("every 10m"), "{f:?}");
        // The same time lost in drops of 40 s at intervals from 1 to 14 minutes.
        let starts = [
            300.0, 360.0, 1200.0, 1350.0, 2200.0, 2320.0, 3100.0, 3900.0, 4000.0, 4800.0, 5700.0,
            6600.0,
        ];
        let t = jittered(0, 7200, 1000, 0.0, 0, |s| {
            if starts.iter().any(|&a| (a..a + 40.0).contains(&s)) {
                0.0
            } else {
                97.0
            }
        });
        let d = diagnose(&[t], None);
        assert!(!names(&d, "periodic_idle"), "{:?}", d.findings);
    }

    #[test]
    fn idle_samples_without_a_period_are_no_periodic_idle() {
        // At 1 s for an hour: (a) a third of the samples idle at random; (b) one-sample drops
        // 5 to 15 samples apart; (c) idle stretches of random length (a bursty server).
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || uniform(&mut x);
        let random: Vec<bool> = (0..3600).map(|_| next() < 0.33).collect();
        let mut spaced = vec![false; 3600];
        let mut i = 0;
        while i < spaced.len() {
            spaced[i] = true;
            i += 5 + (next() * 11.0) as usize;
        }
        let mut bursty = Vec::new();
        let mut idle = false;
        while bursty.len() < 3600 {
            idle = next() < if idle { 0.5 } else { 0.25 };
            bursty.push(idle);
        }
        for (what, down) in [("random", random), ("spaced", spaced), ("bursty", bursty)] {
            let t = trace(0, 81_920.0, 3600, 1000, |s| {
                (if down[s as usize] { 0.0 } else { 90.0 }, 48_000.0)
            });
            let d = diagnose(&[t], None);
            assert!(!names(&d, "periodic_idle"), "{what}: {:?}", d.findings);
        }
    }

    #[test]
    fn a_ramp_then_flat_run_has_no_memory_trend() {
        // 0 → 40 GB in 90 s, then flat for an hour.
        let t = trace(0, 81_920.0, 3690, 1000, |s| {
            (
                95.0,
                if s < 90.0 {
                    40_960.0 * s / 90.0
                } else {
                    40_960.0
                },
            )
        });
        let d = diagnose(&[t], None);
        assert!(d.mem_trend[&0].abs() < 50.0, "{:?}", d.mem_trend);
        assert!(d.findings.is_empty(), "{:?}", d.findings);
    }

    #[test]
    fn a_two_minute_log_at_20_percent_is_input_bound_and_unused_gpus_are_named() {
        let busy = trace(0, 24_576.0, 120, 1000, |_| (20.0, 8_000.0));
        let idle: Vec<Trace> = (1..4)
            .map(|i| trace(i, 24_576.0, 120, 1000, |_| (0.0, 1.0)))
            .collect();
        let mut all = vec![busy];
        all.extend(idle);
        let d = diagnose(&all, None);
        assert!(has(&d, 0, "low_utilization"), "{:?}", d.findings);
        for g in 1..4 {
            assert!(has(&d, g, "unused_gpu"), "{:?}", d.findings);
        }
    }

    #[test]
    fn a_steady_35_percent_gpu_beside_a_97_percent_one_is_input_bound() {
        let a = trace(0, 81_920.0, 600, 1000, |s| (35.0 + (s % 5.0), 30_000.0));
        let b = trace(1, 81_920.0, 600, 1000, |_| (97.0, 30_000.0));
        let d = diagnose(&[a, b], None);
        assert!(has(&d, 0, "low_utilization"), "{:?}", d.findings);
        assert!(!d.findings.iter().any(|f| f.gpu == 1), "{:?}", d.findings);
    }

    #[test]
    fn rank_zero_checkpointing_is_a_straggler_on_gpu_0() {
        let mut all = vec![trace(0, 81_920.0, 900, 1000, |_| (10.0, 60_000.0))];
        for i in 1..8 {
            all.push(trace(i, 81_920.0, 900, 1000, |_| (79.0, 60_000.0)));
        }
        let d = diagnose(&all, None);
        assert!(has(&d, 0, "gpu_straggler"), "{:?}", d.findings);
        assert!(!d.findings.iter().any(|f| f.gpu != 0), "{:?}", d.findings);
    }

    #[test]
    fn a_one_off_dip_in_a_long_run_is_a_brief_episode() {
        // 15 h at 90 %, one 9-minute dip to 5 %.
        let t = trace(0, 81_920.0, 15 * 360, 10_000, |s| {
            let dip = (30_000.0..30_540.0).contains(&s);
            (if dip { 5.0 } else { 90.0 }, 40_000.0)
        });
        let d = diagnose(&[t], None);
        assert!(d.findings.is_empty(), "{:?}", d.findings);
        assert!(
            d.brief.iter().any(|f| f.pattern == "low_utilization"),
            "{:?}",
            d.brief
        );
    }

    #[test]
    fn a_gap_is_not_observed_time() {
        // Two 10-minute runs at 95 % twenty hours apart, the second with a 30 % stretch of
        // 4 minutes: 20 % of the observed time, however long the gap.
        let mut t = trace(0, 81_920.0, 600, 1000, |_| (95.0, 40_000.0));
        let off = 20 * 3_600_000;
        for i in 0..600 {
            let low = (100..340).contains(&i);
            t.points.push(Point {
                t: off + i * 1000,
                util: if low { 30.0 } else { 95.0 },
                mem: 40_000.0,
                procs: 0,
                sm: f32::NAN,
                tensor: f32::NAN,
                dram: f32::NAN,
                power: f32::NAN,
                limit: f32::NAN,
            });
        }
        let d = diagnose(&[t], None);
        assert_eq!(d.phases.iter().filter(|p| p.kind == "job").count(), 2);
        let f = d
            .findings
            .iter()
            .chain(&d.brief)
            .find(|f| f.pattern == "low_utilization")
            .unwrap();
        assert!(f.share_of_observed < 0.25, "{f:?}");
    }

    /// The GPM patterns: each on the samples with its GPM values; a log without GPM has none.
    #[test]
    fn gpm_patterns_launch_bound_no_tensor_cores_memory_bound() {
        let gpm = |sm: f32, tensor: f32, dram: f32, util: f32| {
            let mut t = Trace::new(0);
            t.total_mib = Some(81_559.0);
            for i in 0..600 {
                t.points.push(Point {
                    t: i * 1000,
                    util,
                    mem: 60_000.0,
                    procs: 1,
                    sm,
                    tensor,
                    dram,
                    power: 230.0,
                    limit: 700.0,
                });
            }
            diagnose(&[t], None)
        };
        let d = gpm(10.0, 1.0, 3.0, 100.0);
        assert!(has(&d, 0, "launch_bound"), "{:?}", d.findings);
        let f = finding(&d, "launch_bound");
        assert!(f.evidence.contains("SM active 10 %"), "{}", f.evidence);
        assert!(f.fix.contains("CUDA graphs") && f.fix.contains("torch.compile"));
        assert!(!has(&d, 0, "no_tensor_cores") && !has(&d, 0, "low_utilization"));
        let d = gpm(88.0, 0.2, 40.0, 97.0);
        assert!(has(&d, 0, "no_tensor_cores"), "{:?}", d.findings);
        assert!(!has(&d, 0, "launch_bound") && !has(&d, 0, "memory_bound"));
        let d = gpm(45.0, 8.0, 95.0, 99.0);
        assert!(has(&d, 0, "memory_bound"), "{:?}", d.findings);
        // healthy training: nothing
        let d = gpm(80.0, 40.0, 34.0, 95.0);
        assert!(d.findings.is_empty(), "{:?}", d.findings);
        // no GPM (an A100): nothing, whatever the utilization
        let d = gpm(f32::NAN, f32::NAN, f32::NAN, 100.0);
        assert!(d.findings.is_empty(), "{:?}", d.findings);
    }

    /// An NCCL hang (nvml-sim's nccl-hang): training, then 100 % utilization at ~90 W of 700 W
    /// with ~12 % of the SMs active (one spinning block per channel). Not launch-bound — a hang
    /// is not a tuning problem (`nccl_hang` names it) — while the same SM activity at 230 W is.
    #[test]
    fn a_hang_at_idle_power_is_not_launch_bound() {
        let run = |hang_power: f32, limit: f32| {
            let mut t = Trace::new(0);
            t.total_mib = Some(81_559.0);
            for i in 0..600 {
                let hung = i >= 30;
                t.points.push(Point {
                    t: i * 1000,
                    util: if hung { 100.0 } else { 95.0 },
                    mem: 62_000.0,
                    procs: 1,
                    sm: if hung { 12.0 } else { 80.0 },
                    tensor: if hung { 0.0 } else { 40.0 },
                    dram: if hung { 0.3 } else { 34.0 },
                    power: if hung { hang_power } else { 600.0 },
                    limit,
                });
            }
            diagnose(&[t], None)
        };
        let d = run(90.0, 700.0);
        assert!(
            !d.findings
                .iter()
                .chain(&d.brief)
                .any(|f| f.pattern == "launch_bound"),
            "{:?} {:?}",
            d.findings,
            d.brief
        );
        assert!(d.findings.is_empty(), "{:?}", d.findings);
        let d = run(230.0, 700.0);
        assert!(has(&d, 0, "launch_bound"), "{:?}", d.findings);
        // a log without the power limit cannot tell: judged on utilization and SM active alone
        let d = run(90.0, f32::NAN);
        assert!(has(&d, 0, "launch_bound"), "{:?}", d.findings);
    }
}
