//! The running simulation: library-global state (reference-counted init), scenario time, metric
//! evaluation with derived defaults, counters from timed events, energy integration, processes
//! (scenario + control file) and fault injection.
//!
//! Everything is computed on demand from the elapsed scenario time; the only mutable state is
//! the energy integrator per GPU and the control-file cache.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Deserialize;

use crate::scenario::{
    DeviceSpec, Event, EventKind, Fault, Metric, PidSpec, ProcessMemory, Scenario, MIB,
};
use crate::signal::{hash_str, mix};

/// NVML return codes used by the simulator.
pub mod code {
    pub const SUCCESS: u32 = 0;
    pub const UNINITIALIZED: u32 = 1;
    pub const INVALID_ARGUMENT: u32 = 2;
    pub const NOT_SUPPORTED: u32 = 3;
    pub const NOT_FOUND: u32 = 6;
    pub const INSUFFICIENT_SIZE: u32 = 7;
    pub const TIMEOUT: u32 = 10;
    pub const GPU_IS_LOST: u32 = 15;
    pub const ARGUMENT_VERSION_MISMATCH: u32 = 25;
    pub const UNKNOWN: u32 = 999;
}

/// Clock event reason bit: the GPU is idle.
pub const REASON_GPU_IDLE: u64 = 0x1;
/// Clock event reason bit: applications clocks setting (also locked clocks).
pub const REASON_APPLICATIONS_CLOCKS: u64 = 0x2;

/// How often the control file's mtime is checked, at most.
const CONTROL_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// Counters accumulated from timed events up to some time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    pub ecc_corrected: u64,
    pub ecc_uncorrected: u64,
    /// (double bit?, address, scenario time of retirement)
    pub retired_pages: Vec<(bool, u64, f64)>,
    pub retired_pending: bool,
    pub remapped_correctable: u64,
    pub remapped_uncorrectable: u64,
    pub remap_pending: bool,
    pub remap_failure: bool,
    pub pcie_replay: u64,
    pub reasons_override: Option<u64>,
    pub recovery_action: Option<u32>,
}

/// A process reported on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessEntry {
    pub pid: u32,
    /// `None` = NVML_VALUE_NOT_AVAILABLE.
    pub used_bytes: Option<u64>,
    pub sm_util_pct: Option<u32>,
    /// On a MIG GPU: the MIG device (index on its GPU) it runs on.
    pub mig: Option<u32>,
}

#[derive(Debug)]
struct Energy {
    last_t_s: f64,
    energy_mj: f64,
}

#[derive(Debug, Default)]
struct ControlState {
    last_check: Option<Instant>,
    stamp: Option<(SystemTime, u64)>,
    processes: Vec<(u32, ProcessEntry)>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawControl {
    #[serde(default)]
    process: Vec<RawControlProcess>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawControlProcess {
    gpu: u32,
    pid: crate::scenario::RawPid,
    used_memory_mib: Option<f64>,
    sm_util_pct: Option<f64>,
    mig: Option<u32>,
}

/// The default of an activity metric a scenario leaves unset, from the other metrics of the
/// same GPU or MIG device (`get`): GPM activity of a training step that keeps the GPU busy —
/// the graphics engine is active whenever a kernel runs, 85 % of the SMs have work, half of that
/// time in the tensor pipes (HMMA: bf16/fp16 matrix math), memory traffic follows memory
/// utilization (see the README's metrics table). `None` for the other metrics.
fn activity_default(metric: Metric, get: impl Fn(Metric) -> f64) -> Option<f64> {
    Some(match metric {
        Metric::MemUtilPct => (get(Metric::GpuUtilPct) * 0.45).round(),
        Metric::GrEngineActivePct => get(Metric::GpuUtilPct),
        Metric::SmActivePct => 0.85 * get(Metric::GrEngineActivePct),
        Metric::SmOccupancyPct => 0.45 * get(Metric::SmActivePct),
        Metric::TensorActivePct => 0.5 * get(Metric::SmActivePct),
        Metric::HmmaActivePct => get(Metric::TensorActivePct),
        Metric::ImmaActivePct | Metric::DfmaActivePct | Metric::Fp64ActivePct => 0.0,
        Metric::IntegerActivePct | Metric::Fp32ActivePct => 0.15 * get(Metric::SmActivePct),
        Metric::Fp16ActivePct => 0.05 * get(Metric::SmActivePct),
        Metric::DramActivePct => 0.8 * get(Metric::MemUtilPct),
        _ => return None,
    })
}

/// Cumulative PCIe bytes on a fixed 1 s grid of scenario time (deterministic).
#[derive(Debug, Default)]
struct PcieBytes {
    /// Whole grid cells integrated so far.
    cells: u64,
    tx: f64,
    rx: f64,
}

/// Grid step of the PCIe byte-counter integration, scenario seconds.
const PCIE_STEP_S: f64 = 1.0;

/// One loaded simulation.
#[derive(Debug)]
pub struct Sim {
    pub scenario: Scenario,
    /// Per-function call latency (applied by the FFI call guard).
    pub latency: crate::latency::Latency,
    /// Scenario indexes of the GPUs NVML enumerates, in NVML index order.
    visible: Vec<usize>,
    /// NVML index of each scenario GPU (`None` = hidden).
    nvml_index: Vec<Option<usize>>,
    pcie_bytes: Vec<Mutex<PcieBytes>>,
    start: Instant,
    wall_start_us: u64,
    time_scale: f64,
    offset_s: f64,
    self_pid: u32,
    parent_pid: u32,
    lost_at_s: Vec<f64>,
    events_by_gpu: Vec<Vec<Event>>,
    energy: Vec<Mutex<Energy>>,
    control_path: Option<PathBuf>,
    control: Mutex<ControlState>,
    metric_seeds: Vec<u64>,
}

impl Sim {
    /// Starts a simulation of `scenario` now (scenario time 0 = now + `offset_s`).
    pub fn new(
        scenario: Scenario,
        time_scale: f64,
        offset_s: f64,
        control_path: Option<PathBuf>,
    ) -> Sim {
        let n = scenario.devices.len();
        let mut events_by_gpu = vec![Vec::new(); n];
        let mut lost_at_s = vec![f64::INFINITY; n];
        for ev in &scenario.events {
            let g = ev.gpu as usize;
            if g < n {
                if ev.kind == EventKind::Lost {
                    lost_at_s[g] = lost_at_s[g].min(ev.at_s);
                }
                events_by_gpu[g].push(ev.clone());
            }
        }
        let energy = scenario
            .devices
            .iter()
            .map(|d| {
                Mutex::new(Energy {
                    last_t_s: offset_s,
                    energy_mj: d.energy_start_mj as f64,
                })
            })
            .collect();
        // SAFETY: getppid has no preconditions.
        let parent_pid = unsafe { libc::getppid() } as u32;
        let visible: Vec<usize> = (0..n).filter(|g| !scenario.devices[*g].hidden).collect();
        let mut nvml_index = vec![None; n];
        for (i, g) in visible.iter().enumerate() {
            nvml_index[*g] = Some(i);
        }
        let latency =
            crate::latency::Latency::new(scenario.latency.clone(), None).unwrap_or_default();
        Sim {
            latency,
            visible,
            nvml_index,
            pcie_bytes: (0..n).map(|_| Mutex::new(PcieBytes::default())).collect(),
            scenario,
            start: Instant::now(),
            wall_start_us: wall_now_us(),
            time_scale,
            offset_s,
            self_pid: std::process::id(),
            parent_pid,
            lost_at_s,
            events_by_gpu,
            energy,
            control_path,
            control: Mutex::new(ControlState::default()),
            metric_seeds: Metric::ALL.iter().map(|m| hash_str(m.key())).collect(),
        }
    }

    /// Current scenario time in seconds.
    pub fn now_s(&self) -> f64 {
        self.offset_s + self.start.elapsed().as_secs_f64() * self.time_scale
    }

    /// Scenario seconds per real second (0 = frozen clock).
    pub fn time_scale(&self) -> f64 {
        self.time_scale
    }

    /// Scenario time of a wall-clock timestamp in microseconds.
    pub fn scenario_time_of_wall_us(&self, wall_us: u64) -> f64 {
        self.offset_s + (wall_us as f64 - self.wall_start_us as f64) / 1e6 * self.time_scale
    }

    /// Wall-clock microseconds of a scenario time.
    pub fn wall_us_of_scenario_time(&self, t_s: f64) -> u64 {
        // a frozen clock (scale 0) maps scenario seconds to real seconds one to one here
        let scale = if self.time_scale > 0.0 {
            self.time_scale
        } else {
            1.0
        };
        let real_s = (t_s - self.offset_s) / scale;
        (self.wall_start_us as f64 + real_s * 1e6).max(0.0) as u64
    }

    /// Number of devices in the scenario (hidden ones included).
    pub fn device_count(&self) -> usize {
        self.scenario.devices.len()
    }

    /// Number of devices NVML enumerates (hidden ones excluded).
    pub fn visible_count(&self) -> usize {
        self.visible.len()
    }

    /// The scenario index of NVML index `i`.
    pub fn visible_gpu(&self, i: usize) -> Option<usize> {
        self.visible.get(i).copied()
    }

    /// The NVML index of scenario GPU `gpu` (`None` when hidden).
    pub fn nvml_index(&self, gpu: usize) -> Option<usize> {
        self.nvml_index.get(gpu).copied().flatten()
    }

    /// Real time since the simulation started.
    pub fn real_elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Scenario offset (time at start).
    pub fn start_s(&self) -> f64 {
        self.offset_s
    }

    /// Real seconds after the start at which scenario time `t_s` arrives (a frozen clock: 0 when
    /// `t_s` is at or before the start, else never).
    pub fn real_s_of(&self, t_s: f64) -> f64 {
        if self.time_scale > 0.0 {
            (t_s - self.offset_s) / self.time_scale
        } else if t_s <= self.offset_s {
            0.0
        } else {
            f64::INFINITY
        }
    }

    /// Blocks a call that matches an active hang on `gpu` until the hang ends (or forever).
    pub fn hang(&self, function: &str, gpu: usize) {
        if self.scenario.hangs.is_empty() {
            return;
        }
        loop {
            let now = self.start.elapsed().as_secs_f64();
            let mut until: Option<f64> = None;
            for h in &self.scenario.hangs {
                if h.gpu as usize != gpu || !h.matches(function) {
                    continue;
                }
                let begin = self.real_s_of(h.at_s);
                let end = if h.for_s.is_infinite() {
                    f64::INFINITY
                } else if self.time_scale > 0.0 {
                    begin + h.for_s / self.time_scale
                } else {
                    // frozen clock: for_s counts real seconds
                    begin + h.for_s
                };
                if now >= begin && now < end {
                    until = Some(until.map_or(end, |u: f64| u.max(end)));
                }
            }
            let Some(end) = until else {
                return;
            };
            if end.is_infinite() {
                // wedged for ever, like a thread stuck in the driver
                loop {
                    std::thread::sleep(Duration::from_secs(3600));
                }
            }
            std::thread::sleep(Duration::from_secs_f64((end - now).max(0.0)));
        }
    }

    /// The GPU recovery action (field 230) at `t_s`.
    pub fn recovery_action(&self, gpu: usize, t_s: f64) -> u32 {
        self.counters(gpu, t_s)
            .recovery_action
            .unwrap_or(self.device(gpu).recovery_action)
    }

    /// Cumulative PCIe bytes (TX or RX) at `t_s`: the KB/s signal × 1024 integrated over scenario
    /// time on a fixed 1 s grid (midpoint rule), so the value depends only on `t_s`.
    pub fn pcie_bytes(&self, gpu: usize, t_s: f64, tx: bool) -> u64 {
        let Some(cell) = self.pcie_bytes.get(gpu) else {
            return 0;
        };
        let t = t_s.max(0.0);
        let whole = (t / PCIE_STEP_S).floor() as u64;
        let rate = |mid: f64, m: Metric| self.metric(gpu, m, mid) * 1024.0;
        let mut st = cell.lock().unwrap_or_else(|p| p.into_inner());
        if whole < st.cells {
            // an earlier time (another thread's later call got in first): integrate afresh
            let mut fresh = PcieBytes::default();
            integrate(&mut fresh, whole, &rate);
            return partial(&fresh, whole, t, tx, &rate);
        }
        integrate(&mut st, whole, &rate);
        partial(&st, whole, t, tx, &rate)
    }

    /// The static spec of a device.
    pub fn device(&self, gpu: usize) -> &DeviceSpec {
        &self.scenario.devices[gpu]
    }

    /// Whether the GPU has fallen off the bus at time `t_s`.
    pub fn is_lost(&self, gpu: usize, t_s: f64) -> bool {
        self.lost_at_s.get(gpu).is_some_and(|at| t_s >= *at)
    }

    /// Applies fault injection for a call: sleeps for added latency, returns an injected error.
    pub fn inject(&self, function: &str, gpu: Option<usize>, t_s: f64) -> Result<(), u32> {
        if self.scenario.faults.is_empty() {
            return Ok(());
        }
        let gpu = gpu.map(|g| g as u32);
        let mut error = None;
        let mut latency_ms = 0.0;
        for f in self
            .scenario
            .faults
            .iter()
            .filter(|f| f.matches(function, gpu, t_s))
        {
            latency_ms += f.latency_ms;
            if error.is_none() {
                error = f.error;
            }
        }
        if latency_ms > 0.0 {
            std::thread::sleep(Duration::from_secs_f64(latency_ms / 1000.0));
        }
        match error {
            Some(code) if code != code::SUCCESS => Err(code),
            _ => Ok(()),
        }
    }

    /// The value of a metric at time `t_s`, in the metric's scenario unit, clamped to its range.
    pub fn metric(&self, gpu: usize, metric: Metric, t_s: f64) -> f64 {
        let dev = self.device(gpu);
        let value = match dev.signal(metric) {
            Some(signal) => signal.eval(t_s, mix(dev.seed, self.metric_seeds[metric.position()])),
            None => self.default_metric(gpu, metric, t_s),
        };
        let (lo, hi) = metric.range();
        let value = if value.is_finite() { value } else { 0.0 };
        let value = value.clamp(lo, hi);
        if metric == Metric::MemoryUsedMib {
            let cap = dev
                .memory_total_bytes
                .saturating_sub(dev.memory_reserved_bytes) as f64
                / MIB;
            value.min(cap)
        } else {
            value
        }
    }

    /// Values for metrics the scenario leaves unset, derived from the ones it sets.
    fn default_metric(&self, gpu: usize, metric: Metric, t_s: f64) -> f64 {
        let dev = self.device(gpu);
        let util = || self.metric(gpu, Metric::GpuUtilPct, t_s);
        let limit_w = f64::from(dev.power_limit_mw) / 1000.0;
        match metric {
            Metric::GpuUtilPct | Metric::MemoryUsedMib => 0.0,
            Metric::EncoderUtilPct | Metric::DecoderUtilPct | Metric::Pstate => 0.0,
            Metric::PowerW => 70.0 + (limit_w * 0.86 - 70.0).max(0.0) * util() / 100.0,
            Metric::TemperatureC => {
                let p = self.metric(gpu, Metric::PowerW, t_s);
                (30.0 + 40.0 * p / limit_w.max(1.0)).round()
            }
            Metric::MemoryTemperatureC => self.metric(gpu, Metric::TemperatureC, t_s) + 6.0,
            Metric::SmClockMhz => {
                if util() >= 1.0 {
                    f64::from(
                        dev.locked_sm_clock_mhz
                            .unwrap_or(dev.app_sm_clock_mhz)
                            .min(dev.max_sm_clock_mhz),
                    )
                } else {
                    345.0
                }
            }
            Metric::GraphicsClockMhz => self.metric(gpu, Metric::SmClockMhz, t_s),
            Metric::MemClockMhz => f64::from(dev.app_mem_clock_mhz.min(dev.max_mem_clock_mhz)),
            Metric::VideoClockMhz => {
                if util() >= 1.0 {
                    f64::from(dev.max_video_clock_mhz)
                } else {
                    765.0
                }
            }
            Metric::FanPct => {
                (self.metric(gpu, Metric::TemperatureC, t_s) - 10.0).clamp(30.0, 100.0)
            }
            Metric::PcieTxKbS => (util() * 5000.0).round(),
            Metric::PcieRxKbS => (util() * 12000.0).round(),
            Metric::ClockEventReasons => {
                if util() < 1.0 {
                    REASON_GPU_IDLE as f64
                } else {
                    0.0
                }
            }
            Metric::MemUtilPct
            | Metric::GrEngineActivePct
            | Metric::SmActivePct
            | Metric::SmOccupancyPct
            | Metric::TensorActivePct
            | Metric::HmmaActivePct
            | Metric::ImmaActivePct
            | Metric::DfmaActivePct
            | Metric::IntegerActivePct
            | Metric::Fp32ActivePct
            | Metric::Fp16ActivePct
            | Metric::Fp64ActivePct
            | Metric::DramActivePct => {
                activity_default(metric, |m| self.metric(gpu, m, t_s)).unwrap_or(0.0)
            }
            Metric::NvlinkTxKbS | Metric::NvlinkRxKbS => (util() * 20_000.0).round(),
            Metric::NvdecUtilPct => self.metric(gpu, Metric::DecoderUtilPct, t_s),
            Metric::NvjpgUtilPct | Metric::NvofaUtilPct => 0.0,
        }
    }

    /// Whether a process runs on MIG device `k` of `gpu` at `t_s` (the scenario's processes and
    /// the control file's as last read).
    pub fn mig_busy(&self, gpu: usize, k: usize, t_s: f64) -> bool {
        let k = k as u32;
        let scenario = self.scenario.processes.iter().any(|p| {
            p.gpu as usize == gpu && p.mig == Some(k) && t_s >= p.from_s && t_s < p.until_s
        });
        scenario || {
            let state = self.control.lock().unwrap_or_else(|p| p.into_inner());
            state
                .processes
                .iter()
                .any(|(g, p)| *g as usize == gpu && p.mig == Some(k))
        }
    }

    /// The activity `metric` (utilization or a GPM percentage: `Metric::per_mig_device`) of MIG
    /// device `k` of `gpu` at `t_s`: its own signal for it; else, while a process runs on it,
    /// the GPU's signal for it (with noise of its own); else derived from its own utilization
    /// the way a GPU's is (`activity_default`). An idle MIG device without signals reads 0.
    pub fn mig_metric(&self, gpu: usize, k: usize, metric: Metric, t_s: f64) -> f64 {
        let dev = self.device(gpu);
        let Some(m) = dev.mig.devices.get(k) else {
            return 0.0;
        };
        let seed = mix(
            mix(dev.seed, self.metric_seeds[metric.position()]),
            0x6d69_6761 + k as u64,
        );
        let own = m.activity.iter().find(|(x, _)| *x == metric);
        let value = match own {
            Some((_, sig)) => sig.eval(t_s, seed),
            None => {
                let busy = self.mig_busy(gpu, k, t_s);
                match dev.signal(metric) {
                    Some(sig) if busy => sig.eval(t_s, seed),
                    _ if metric == Metric::GpuUtilPct && busy => self.metric(gpu, metric, t_s),
                    // idle, unless a signal of its own says otherwise
                    _ if metric == Metric::GpuUtilPct => 0.0,
                    _ => {
                        activity_default(metric, |x| self.mig_metric(gpu, k, x, t_s)).unwrap_or(0.0)
                    }
                }
            }
        };
        let (lo, hi) = metric.range();
        if value.is_finite() {
            value.clamp(lo, hi)
        } else {
            0.0
        }
    }

    /// Memory used in bytes at `t_s`.
    /// On a GPU split into MIG devices, what its MIG devices use together.
    pub fn memory_used_bytes(&self, gpu: usize, t_s: f64) -> u64 {
        let mig = &self.device(gpu).mig;
        if mig.active() {
            return (0..mig.devices.len())
                .map(|k| self.mig_memory_used_bytes(gpu, k, t_s))
                .sum();
        }
        (self.metric(gpu, Metric::MemoryUsedMib, t_s) * MIB) as u64
    }

    /// MIG device `k`'s `memory_used_mib` signal at `t_s`, bytes, when the scenario sets one.
    fn mig_signal_bytes(&self, gpu: usize, k: usize, t_s: f64) -> Option<u64> {
        let dev = self.device(gpu);
        let m = dev.mig.devices.get(k)?;
        let sig = m.memory_used.as_ref()?;
        let v = sig.eval(t_s, mix(dev.seed, 0x6d69_6700 + k as u64));
        Some(((v.max(0.0) * MIB) as u64).min(m.memory_total_bytes))
    }

    /// Memory used on MIG device `k` of `gpu` at `t_s`, bytes: its `memory_used_mib` signal,
    /// else what its processes use; at most its total.
    pub fn mig_memory_used_bytes(&self, gpu: usize, k: usize, t_s: f64) -> u64 {
        let Some(m) = self.device(gpu).mig.devices.get(k) else {
            return 0;
        };
        if let Some(b) = self.mig_signal_bytes(gpu, k, t_s) {
            return b;
        }
        let used: u64 = self
            .processes(gpu, t_s, false)
            .iter()
            .chain(self.processes(gpu, t_s, true).iter())
            .filter(|p| p.mig == Some(k as u32))
            .filter_map(|p| p.used_bytes)
            .sum();
        used.min(m.memory_total_bytes)
    }

    /// The memory a scenario process reports at `t_s`.
    fn process_used_bytes(&self, p: &crate::scenario::ProcessSpec, t_s: f64) -> Option<u64> {
        let gpu = p.gpu as usize;
        match &p.memory {
            ProcessMemory::Device => Some(match p.mig {
                // a MIG device's signal, when it has one (its default is its processes' sum)
                Some(k) => self.mig_signal_bytes(gpu, k as usize, t_s).unwrap_or(0),
                None => self.memory_used_bytes(gpu, t_s),
            }),
            ProcessMemory::Signal(s) => {
                let mut seed = mix(self.device(gpu).seed, u64::from(p.gpu) ^ 0x70726f63);
                if let Some(k) = p.mig {
                    seed = mix(seed, u64::from(k) + 1);
                }
                Some((s.eval(t_s, seed).max(0.0) * MIB) as u64)
            }
            ProcessMemory::Unknown => None,
        }
    }

    /// Clock event (throttle) reasons at `t_s`: an event override, else the signal/default.
    /// A locked SM clock adds ApplicationsClocksSetting (0x2).
    pub fn clock_event_reasons(&self, gpu: usize, t_s: f64) -> u64 {
        let locked = if self.device(gpu).locked_sm_clock_mhz.is_some() {
            REASON_APPLICATIONS_CLOCKS
        } else {
            0
        };
        match self.counters(gpu, t_s).reasons_override {
            Some(mask) => mask | locked,
            None => self.metric(gpu, Metric::ClockEventReasons, t_s) as u64 | locked,
        }
    }

    /// Counters from every event on `gpu` up to `t_s`.
    pub fn counters(&self, gpu: usize, t_s: f64) -> Counters {
        let mut c = Counters::default();
        for ev in self.events_by_gpu.get(gpu).into_iter().flatten() {
            if ev.at_s > t_s {
                break;
            }
            match &ev.kind {
                EventKind::Ecc {
                    corrected,
                    uncorrected,
                } => {
                    c.ecc_corrected += corrected;
                    c.ecc_uncorrected += uncorrected;
                }
                EventKind::RetiredPage {
                    double_bit,
                    address,
                    pending,
                } => {
                    c.retired_pages.push((*double_bit, *address, ev.at_s));
                    c.retired_pending = *pending;
                }
                EventKind::RemappedRow {
                    correctable,
                    uncorrectable,
                    pending,
                    failure,
                } => {
                    c.remapped_correctable += correctable;
                    c.remapped_uncorrectable += uncorrectable;
                    if let Some(p) = pending {
                        c.remap_pending = *p;
                    }
                    if let Some(f) = failure {
                        c.remap_failure = *f;
                    }
                }
                EventKind::ClockEventReasons(mask) => c.reasons_override = *mask,
                EventKind::PcieReplay(n) => c.pcie_replay += n,
                EventKind::RecoveryAction(a) => c.recovery_action = Some(*a),
                EventKind::Xid(_) | EventKind::Lost | EventKind::Kmsg(_) => {}
            }
        }
        c
    }

    /// Total energy in mJ since the simulated driver load, integrating power over time.
    pub fn energy_mj(&self, gpu: usize, t_s: f64) -> u64 {
        let Some(cell) = self.energy.get(gpu) else {
            return 0;
        };
        let mut e = cell.lock().unwrap_or_else(|p| p.into_inner());
        if t_s > e.last_t_s {
            let span = t_s - e.last_t_s;
            let steps = (span.ceil() as usize).clamp(1, 10_000);
            let dt = span / steps as f64;
            let mut acc = 0.0;
            for i in 0..steps {
                let mid = e.last_t_s + (i as f64 + 0.5) * dt;
                acc += self.metric(gpu, Metric::PowerW, mid) * dt;
            }
            e.energy_mj += acc * 1000.0;
            e.last_t_s = t_s;
        }
        e.energy_mj as u64
    }

    /// The host pid a pid spec stands for.
    pub fn resolve_pid(&self, pid: PidSpec) -> u32 {
        match pid {
            PidSpec::Fixed(p) => p,
            PidSpec::SelfPid => self.self_pid,
            PidSpec::Parent => self.parent_pid,
            PidSpec::Job(p) => p,
        }
    }

    /// What NVML names `pid`: the `name` of a scenario process at that pid, else `None` (the
    /// caller reads the host's `/proc`).
    pub fn process_name(&self, pid: u32) -> Option<&str> {
        let t = self.now_s();
        self.scenario
            .processes
            .iter()
            .filter(|p| t >= p.from_s && t < p.until_s && self.resolve_pid(p.pid) == pid)
            .find_map(|p| p.name.as_deref())
    }

    /// Processes on `gpu` at `t_s`: compute (scenario + control file) or graphics.
    pub fn processes(&self, gpu: usize, t_s: f64, graphics: bool) -> Vec<ProcessEntry> {
        let mut out = Vec::new();
        for p in &self.scenario.processes {
            if p.gpu as usize != gpu || p.graphics != graphics || t_s < p.from_s || t_s >= p.until_s
            {
                continue;
            }
            out.push(ProcessEntry {
                pid: self.resolve_pid(p.pid),
                used_bytes: self.process_used_bytes(p, t_s),
                sm_util_pct: p.sm_util_pct.map(|u| u.clamp(0.0, 100.0) as u32),
                mig: p.mig,
            });
        }
        if !graphics {
            self.refresh_control();
            let state = self.control.lock().unwrap_or_else(|p| p.into_inner());
            out.extend(
                state
                    .processes
                    .iter()
                    .filter(|(g, _)| *g as usize == gpu)
                    .map(|(_, p)| *p),
            );
        }
        out
    }

    /// Re-reads the control file when its mtime or size changed (checked at most every 100 ms).
    fn refresh_control(&self) {
        let Some(path) = &self.control_path else {
            return;
        };
        let mut state = self.control.lock().unwrap_or_else(|p| p.into_inner());
        if state
            .last_check
            .is_some_and(|at| at.elapsed() < CONTROL_CHECK_INTERVAL)
        {
            return;
        }
        state.last_check = Some(Instant::now());
        let stamp = std::fs::metadata(path)
            .ok()
            .map(|m| (m.modified().unwrap_or(UNIX_EPOCH), m.len()));
        if stamp == state.stamp {
            return;
        }
        state.stamp = stamp;
        if stamp.is_none() {
            state.processes.clear();
            return;
        }
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("nvml-sim: cannot read control file {}: {e}", path.display());
                return;
            }
        };
        let migs: Vec<Option<usize>> = (0..self.device_count())
            .map(|g| {
                let m = &self.device(g).mig;
                m.active().then_some(m.devices.len())
            })
            .collect();
        match parse_control(&text, &path.display().to_string(), &migs) {
            Ok(list) => {
                state.processes = list
                    .into_iter()
                    .map(|(gpu, pid, used_bytes, sm, mig)| {
                        (
                            gpu,
                            ProcessEntry {
                                pid: self.resolve_pid(pid),
                                used_bytes,
                                sm_util_pct: sm,
                                mig,
                            },
                        )
                    })
                    .collect();
            }
            Err(msg) => eprintln!("nvml-sim: {msg} (control file ignored)"),
        }
    }
}

type ControlEntry = (u32, PidSpec, Option<u64>, Option<u32>, Option<u32>);

/// Parses control-file text into (gpu, pid, used bytes, sm util, MIG device) entries. `migs`
/// has one entry per GPU: its number of MIG devices when MIG is on (a process there runs on one:
/// `mig`, default 0), else `None`.
pub(crate) fn parse_control(
    text: &str,
    file: &str,
    migs: &[Option<usize>],
) -> Result<Vec<ControlEntry>, String> {
    let device_count = migs.len();
    let raw: RawControl = toml::from_str(text).map_err(|e| {
        let (line, col) = crate::scenario::line_col(text, e.span().map(|s| s.start).unwrap_or(0));
        format!("{file}:{line}:{col}: {}", e.message().trim())
    })?;
    let mut out = Vec::new();
    for p in raw.process {
        if p.gpu as usize >= device_count {
            return Err(format!(
                "{file}: process gpu {} is out of range ({} devices)",
                p.gpu, device_count
            ));
        }
        let pid = crate::scenario::resolve_named_pid(&p.pid).map_err(|m| format!("{file}: {m}"))?;
        let mig = match (migs[p.gpu as usize], p.mig) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(format!(
                    "{file}: process `mig`: GPU {} has MIG disabled",
                    p.gpu
                ))
            }
            (Some(n), Some(k)) if k as usize >= n => {
                return Err(format!(
                    "{file}: process mig {k} is out of range (GPU {} has {n} MIG devices)",
                    p.gpu
                ))
            }
            (Some(_), k) => Some(k.unwrap_or(0)),
        };
        out.push((
            p.gpu,
            pid,
            p.used_memory_mib.map(|m| (m.max(0.0) * MIB) as u64),
            p.sm_util_pct.map(|u| u.clamp(0.0, 100.0) as u32),
            mig,
        ));
    }
    Ok(out)
}

fn integrate(st: &mut PcieBytes, whole: u64, rate: &dyn Fn(f64, Metric) -> f64) {
    while st.cells < whole {
        let mid = (st.cells as f64 + 0.5) * PCIE_STEP_S;
        st.tx += rate(mid, Metric::PcieTxKbS) * PCIE_STEP_S;
        st.rx += rate(mid, Metric::PcieRxKbS) * PCIE_STEP_S;
        st.cells += 1;
    }
}

fn partial(st: &PcieBytes, whole: u64, t: f64, tx: bool, rate: &dyn Fn(f64, Metric) -> f64) -> u64 {
    let start = whole as f64 * PCIE_STEP_S;
    let mid = start + 0.5 * PCIE_STEP_S;
    let (acc, m) = if tx {
        (st.tx, Metric::PcieTxKbS)
    } else {
        (st.rx, Metric::PcieRxKbS)
    };
    (acc + rate(mid, m) * (t - start)) as u64
}

/// Wall-clock time in microseconds since the Unix epoch.
pub fn wall_now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// Library-global state

#[derive(Default)]
struct Global {
    refcount: u32,
    sim: Option<Arc<Sim>>,
}

static GLOBAL: RwLock<Global> = RwLock::new(Global {
    refcount: 0,
    sim: None,
});

/// The loaded simulation, initialised or not (for the call guard's latency).
pub fn loaded() -> Option<Arc<Sim>> {
    GLOBAL.read().unwrap_or_else(|p| p.into_inner()).sim.clone()
}

/// The running simulation, or UNINITIALIZED.
pub fn current() -> Result<Arc<Sim>, u32> {
    let g = GLOBAL.read().unwrap_or_else(|p| p.into_inner());
    match (&g.sim, g.refcount) {
        (Some(sim), n) if n > 0 => Ok(Arc::clone(sim)),
        _ => Err(code::UNINITIALIZED),
    }
}

/// `nvmlInit*` (the export `name`): loads the scenario on first use, spends the init latency,
/// starts scenario time, and counts up.
pub fn init(name: &'static str) -> Result<(), u32> {
    // Initialising again after the last shutdown costs what the first init did, as it does with
    // a real driver (gpustat initialises and shuts NVML down at every query).
    let again = {
        let g = GLOBAL.read().unwrap_or_else(|p| p.into_inner());
        g.sim.clone().filter(|_| g.refcount == 0)
    };
    if let Some(sim) = again {
        crate::latency::spend_cost(sim.latency.of(name));
    }
    let mut g = GLOBAL.write().unwrap_or_else(|p| p.into_inner());
    if g.sim.is_none() {
        match crate::shipped::load_from_env() {
            Ok(mut sim) => {
                crate::latency::spend_cost(sim.latency.of(name));
                sim.start = Instant::now();
                sim.wall_start_us = wall_now_us();
                let sim = Arc::new(sim);
                if let Some(dir) = std::env::var_os("NVML_SIM_SYSFS").filter(|v| !v.is_empty()) {
                    if let Err(e) = crate::sysfs::write(&sim, std::path::Path::new(&dir)) {
                        eprintln!("nvml-sim: cannot write the fake sysfs: {e}");
                    }
                }
                if let Some(path) = std::env::var_os("NVML_SIM_KMSG").filter(|v| !v.is_empty()) {
                    crate::kmsg::start(Arc::clone(&sim), PathBuf::from(path));
                }
                g.sim = Some(sim);
            }
            Err(msg) => {
                eprintln!("nvml-sim: error: {msg}");
                return Err(code::UNKNOWN);
            }
        }
    }
    g.refcount = g.refcount.saturating_add(1);
    Ok(())
}

/// `nvmlShutdown`: counts down; UNINITIALIZED when not initialised.
pub fn shutdown() -> Result<(), u32> {
    let mut g = GLOBAL.write().unwrap_or_else(|p| p.into_inner());
    if g.refcount == 0 {
        return Err(code::UNINITIALIZED);
    }
    g.refcount -= 1;
    Ok(())
}

/// Faults from `NVML_SIM_NOT_SUPPORTED` (comma-separated symbol names or `prefix*`).
pub fn env_faults(list: &str) -> Vec<Fault> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|name| Fault {
            function: name.to_string(),
            error: Some(code::NOT_SUPPORTED),
            latency_ms: 0.0,
            gpus: None,
            from_s: 0.0,
            until_s: f64::INFINITY,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sim(text: &str, scale: f64) -> Sim {
        Sim::new(
            crate::scenario::parse(text, "t.toml", None).unwrap(),
            scale,
            0.0,
            None,
        )
    }

    #[test]
    fn pcie_byte_counters_integrate_the_signal() {
        let s = sim(
            "[devices]\ncount = 1\n[devices.metrics]\npcie_tx_kb_s = 100\n\
             pcie_rx_kb_s = { type = \"steps\", points = [[0, 10], [5, 20]] }\n",
            1.0,
        );
        assert_eq!(s.pcie_bytes(0, 0.0, true), 0);
        assert_eq!(s.pcie_bytes(0, 2.5, true), 256_000);
        assert_eq!(s.pcie_bytes(0, 10.0, false), (5 * 10 + 5 * 20) * 1024);
        // deterministic: an earlier time after a later one gives the same as a fresh integration
        assert_eq!(s.pcie_bytes(0, 2.5, true), 256_000);
        let mut last = 0;
        for i in 0..200 {
            let v = s.pcie_bytes(0, f64::from(i) * 0.05, false);
            assert!(v >= last);
            last = v;
        }
    }

    #[test]
    fn hidden_gpus_are_renumbered_densely() {
        let s = sim(
            "[devices]\ncount = 4\n[[device]]\nindex = 1\nhidden = true\n",
            1.0,
        );
        assert_eq!(s.visible_count(), 3);
        assert_eq!(s.visible_gpu(1), Some(2));
        assert_eq!(s.visible_gpu(3), None);
        assert_eq!(s.nvml_index(1), None);
        assert_eq!(s.nvml_index(3), Some(2));
    }

    #[test]
    fn recovery_action_and_locked_clocks() {
        let s = sim(
            "[devices]\ncount = 1\nlocked_sm_clock_mhz = 1500\n[devices.metrics]\ngpu_util_pct = 90\n\
             [[event]]\nat_s = 10\ngpu = 0\nkind = \"recovery_action\"\naction = \"node_reboot\"\n",
            1.0,
        );
        assert_eq!(s.recovery_action(0, 5.0), 0);
        assert_eq!(s.recovery_action(0, 10.0), 2);
        assert_eq!(s.clock_event_reasons(0, 1.0), REASON_APPLICATIONS_CLOCKS);
        assert_eq!(s.metric(0, Metric::SmClockMhz, 1.0), 1500.0);
    }

    #[test]
    fn a_finite_hang_blocks_matching_calls_until_it_ends() {
        let s = sim(
            "hang = { gpu = 1, function = \"nvmlDeviceGetName\", for_s = 0.3 }\n[devices]\ncount = 2\n",
            1.0,
        );
        let start = Instant::now();
        s.hang("nvmlDeviceGetUUID", 1);
        s.hang("nvmlDeviceGetName", 0);
        assert!(start.elapsed() < Duration::from_millis(100));
        s.hang("nvmlDeviceGetName", 1);
        assert!(start.elapsed() >= Duration::from_millis(250));
        let again = Instant::now();
        s.hang("nvmlDeviceGetName", 1);
        assert!(again.elapsed() < Duration::from_millis(50));
    }
}
