//! The only module that talks to NVML (through `nvml-wrapper`).
//!
//! [`Sampler::open`] loads the library (`--nvml-lib`, `GPUWATCH_NVML_LIB`, the simulated library
//! for `--sim`, or `libnvidia-ml.so.1`) and reads the GPUs on two pools of worker threads
//! (`worker`; one thread each until a call blocks): the fast path reads the metrics of
//! [`crate::model::METRICS`] that change from tick to tick, the slow path the process lists, the
//! settings that rarely change, the calls that block on real drivers
//! (`nvmlDeviceGetPcieThroughput` samples for 20 ms) and the counters a real driver spends CPU on
//! (total energy: 3 ms of kernel time per read on an H200; the PCIe counters 0.13 ms each) on the
//! slower process cadence — those counters on cadences of their own, multiples of it
//! (`slot::COUNTERS`: a minute and 30 s by default).
//! (A periodic sampler may read the fast path on its own thread, [`Sampler::begin`] with
//! `inline`, under a watchdog that takes its loop over when a read blocks: `worker`.)
//! [`Sampler::sample`] asks the fast path and waits for the answers until the tick's budget,
//! then produces a plain
//! [`Snapshot`]: per GPU the values in canonical units, the slow values while they are fresh
//! (older than twice the process interval they are absent), the XID events received since the
//! last tick (drained from an NVML event set without blocking, see `events`) and, when a slow
//! read finished, the process list enriched from `/proc` ([`procfs`]).
//!
//! The metric table drives the per-GPU read (`slot`): each row is read through its
//! [`Source`](crate::model::Source) — the tick path's field rows in one `nvmlDeviceGetFieldValues`
//! call, the GPM rows (Hopper and later; [`GpmStatus`] says where GPM stands per GPU, and
//! `SamplerConfig::gpm` turns it off) from one GPM sample per tick against the previous one, the slow ones in another on the slow path (PCIe throughput as the rate of the driver's
//! byte counters between two slow reads), a field the GPU lacks through its
//! row's fallback call, every [`NvmlCall`](crate::model::NvmlCall) by its reader (calls answering
//! several rows are made once per tick), derived rows last. A new row therefore needs no sampler
//! code unless it brings a new `NvmlCall` (which does not compile without a reader).
//!
//! Faults never stop sampling. A value the GPU cannot give is `None`; after the first
//! `NotSupported` (or missing symbol, or no permission) that query (or field) is not asked again
//! for that GPU (logged once at debug). `GpuLost` / `ResetRequired` make the device
//! [`DeviceState::Lost`] (all values `None`, probed again every [`LOST_PROBE_MS`]) while the
//! other GPUs keep being sampled. A call that does not return within the call timeout makes the
//! device [`DeviceState::Stalled`] with the function named; a device that is merely late at a
//! tick is left out of that snapshot (a gap). Other errors leave the value `None` and are logged
//! once per GPU and query.
//!
//! Around NVML: [`sysfs`] lists the NVIDIA GPUs on the PCI bus, [`expected`] compares them (and
//! the GPUs seen at earlier starts, and `[daemon] expected_gpus`) with NVML's list
//! ([`Sampler::check_expected`]; the missing GPUs ride in every snapshot), and [`doctor`] holds
//! the preflight checks of `gpuwatch doctor`.
//!
//! The `Nvml` handle is leaked on purpose: devices and the event set borrow it, and a sampler
//! lives as long as its process (this also avoids `nvmlShutdown` at exit, which would wait for
//! calls blocked in a wedged driver).

pub mod doctor;
pub mod embedded;
mod energy;
mod events;
pub mod expected;
pub mod kmsg;
mod mig;
mod nvlink;
pub mod procfs;
mod slot;
pub mod sysfs;
mod worker;
mod xids;

pub(crate) use worker::Busy;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use crate::model::{
    DeviceId, DeviceState, GpuSample, Metric, MetricValues, MigSample, MissingGpu, NvmlFunction,
    ProcSample, Snapshot, METRICS, METRIC_COUNT,
};
/// The counter classes and their cadences, and the GPM sample calls, for `bench/floor.rs` (which
/// makes the sampler's calls without the sampler).
pub use events::DRAIN_EVERY as XID_DRAIN_EVERY;
pub use slot::{counter_every_ms, gpm_sample_alloc, gpm_sample_get, COUNTERS};
use slot::{Slot, SlowAnswer, SlowSlot};
use worker::Pool;
pub use worker::{call_failures, CallFailures};

/// The NVML library loaded when nothing else is said.
pub const DEFAULT_NVML_LIB: &str = "libnvidia-ml.so.1";
/// File name of the simulated library that `--sim` looks for next to the executable.
pub const SIM_LIB_FILE: &str = "libnvml_sim.so";
/// Default process-list refresh period.
pub const DEFAULT_PROCESS_INTERVAL: Duration = Duration::from_secs(5);
/// How often a lost GPU is asked again whether it answers.
pub const LOST_PROBE_MS: i64 = 10_000;
/// Default time an NVML call may take before its GPU counts as stalled: 50 times the slowest
/// call a healthy driver makes on the tick path.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// How to open the sampler.
#[derive(Debug, Clone)]
pub struct SamplerConfig {
    /// Library to load; `None` = [`DEFAULT_NVML_LIB`] (or the simulated library with `sim`).
    pub nvml_lib: Option<PathBuf>,
    /// Scenario for the simulated library (`--sim`): sets `NVML_SIM_SCENARIO` before init.
    pub sim_scenario: Option<String>,
    /// Process-list refresh period (the list is also read at the first tick).
    pub process_interval: Duration,
    /// Register for XID events (drained at every tick) and follow the kernel log.
    pub xid_events: bool,
    /// The kernel log to follow for XID lines; `None` = [`kmsg::default_path`].
    pub kernel_log: Option<PathBuf>,
    /// How long an NVML call may block before its GPU is reported stalled.
    pub call_timeout: Duration,
    /// With a scenario: play it this many times faster (`NVML_SIM_TIME_SCALE`).
    pub sim_time_scale: Option<f64>,
    /// For one-shot commands (`status`): rates whose counters have no second reading yet are read
    /// through their fallback call (PCIe throughput's 20 ms window) instead of being absent.
    pub rates_now: bool,
    /// Read the GPM metrics (SM active, tensor and DRAM activity, …) on GPUs that have GPM
    /// (`[daemon] gpm`, `--no-gpm`).
    pub gpm: bool,
    /// How often a GPU's GPM sample is taken (`[daemon] gpm_interval`, `record --gpm-interval`;
    /// zero: at every tick). Between samples the last means are shown while they are current.
    pub gpm_interval: Duration,
    /// Metrics not to read, as a per-metric mask (bit `1 << metric`); only those of
    /// [`OPTIONAL_READS`] count. Shared, so the daemon can change it when its rules change
    /// ([`unread_mask`]).
    pub unread: Arc<AtomicU64>,
    /// The kubelet's PodResources socket (`[kubernetes] pod_resources`), asked while it exists:
    /// the pods the GPUs are allocated to. `None` = never (commands that show no pods).
    pub pod_resources: Option<PathBuf>,
}

/// The reads that cost the driver the most CPU and that nothing but a rule naming them, the
/// exporter or a recording uses: the PCIe byte counters (0.13 ms each) and the replay counter
/// (0.15 ms). The daemon leaves them out while no rule names them and `/metrics` is off (no stock
/// rule does); `record`, `status` and `top` read everything.
pub const OPTIONAL_READS: [Metric; 3] = [Metric::PcieRx, Metric::PcieTx, Metric::PcieReplay];

/// The mask for [`SamplerConfig::unread`]: the [`OPTIONAL_READS`] that `used` says nothing uses.
pub fn unread_mask(used: impl Fn(Metric) -> bool) -> u64 {
    OPTIONAL_READS
        .iter()
        .filter(|m| !used(**m))
        .fold(0, |mask, m| mask | slot::metric_bit(*m))
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            nvml_lib: None,
            sim_scenario: None,
            process_interval: DEFAULT_PROCESS_INTERVAL,
            xid_events: true,
            kernel_log: None,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            sim_time_scale: None,
            rates_now: false,
            gpm: true,
            gpm_interval: Duration::ZERO,
            unread: Arc::default(),
            pod_resources: None,
        }
    }
}

/// Where GPM (the profiling metrics of Hopper and later: `sm_active`, `tensor_active`,
/// `dram_active`, …) stands on one GPU: `status --json` and `doctor` say it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum GpmStatus {
    /// Not known yet (the GPU has not answered).
    #[default]
    Unknown,
    /// Turned off (`[daemon] gpm = false`, `--no-gpm`).
    Off,
    /// The GPU or its driver has no GPM (before Hopper, consumer boards, older drivers): why.
    Unsupported(Arc<str>),
    /// The GPU has GPM but its calls fail (another client holds it, the driver is in trouble):
    /// the error; the GPM metrics are absent while it lasts, and it is tried again every tick.
    Failing(Arc<str>),
    /// Read at every tick.
    Active,
}

impl GpmStatus {
    /// `unknown`, `off`, `unsupported`, `failing` or `active`.
    pub fn state(&self) -> &'static str {
        match self {
            GpmStatus::Unknown => "unknown",
            GpmStatus::Off => "off",
            GpmStatus::Unsupported(_) => "unsupported",
            GpmStatus::Failing(_) => "failing",
            GpmStatus::Active => "active",
        }
    }

    /// Why it is unsupported, or the error of a failing GPM.
    pub fn detail(&self) -> Option<&str> {
        match self {
            GpmStatus::Unsupported(why) | GpmStatus::Failing(why) => Some(why),
            _ => None,
        }
    }
}

/// Why the sampler could not start. Each displays as one line meant for the user.
#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    /// The NVML library could not be loaded (no NVIDIA driver installed).
    #[error("NVML not found: cannot load {lib} ({detail}); is the NVIDIA driver installed? To try gpuwatch on simulated GPUs run `gpuwatch --sim overnight status`")]
    NoDriver {
        /// The library that was looked for.
        lib: String,
        /// The loader's or NVML's reason.
        detail: String,
    },
    /// `--sim` was given but the simulated library is not where it should be.
    #[error("simulated NVML library not found at {}, and this build carries none (release builds embed it): build it with `cargo build -p nvml-sim` (or pass --nvml-lib PATH)", path.display())]
    NoSimLibrary {
        /// Where it was expected.
        path: PathBuf,
    },
    /// The simulated library refused to start the scenario (it prints file:line:column).
    #[error("simulated NVML could not start scenario `{scenario}` ({source}); see the scenario error above")]
    Scenario {
        /// The scenario name or path.
        scenario: String,
        /// NVML's return code.
        source: NvmlError,
    },
    /// NVML loaded but initialisation or GPU enumeration failed.
    #[error("NVML failed to initialise ({lib}): {source}")]
    Init {
        /// The library loaded.
        lib: String,
        /// NVML's error.
        source: NvmlError,
    },
}

pub use crate::sys::now_ms;

/// Samples every GPU through NVML. Not `Sync`: one thread owns it (the daemon runs it on its
/// sampling thread and sends snapshots over a channel); the NVML calls run on the worker threads
/// of two pools (see [`worker`]): the fast path at each tick (or on the owner's thread, see
/// [`Sampler::begin`]), the slow path on the process cadence.
pub struct Sampler {
    nvml: &'static Nvml,
    devices: Vec<Dev>,
    /// The kubelet's allocations, when a PodResources socket is watched.
    pods: Option<crate::sys::podresources::Watcher>,
    fast: Pool<FastState, FastAnswer>,
    slow: Pool<SlowSlot, SlowAnswer>,
    /// Per device, the slow metrics to read (from the fast path's answers), shared with the
    /// slow pool's threads.
    slow_masks: Arc<Vec<AtomicU64>>,
    /// Per device, a request for its identity again (see [`fast_pool`]).
    id_wanted: Arc<Vec<AtomicBool>>,
    xids: Option<events::XidThread>,
    /// Positions of the GPUs whose XID events are to be registered when they first answer
    /// (they did not when the event set was built).
    xid_pending: Vec<usize>,
    /// NVML's XIDs merged with the kernel log's.
    merger: xids::XidMerger,
    /// What cannot be watched (see [`Sampler::degraded`]).
    degraded: Vec<String>,
    process_interval_ms: i64,
    /// By metric, how long a slow value is shown after it was read ([`slot::max_ages_ms`]).
    slow_max_age_ms: [i64; METRIC_COUNT],
    /// How long the energy counter's last reading is corrected by integrated power: twice its
    /// cadence plus the call timeout (then the energy is absent until the counter answers).
    energy_anchor_age_ms: i64,
    /// How long a call may take before its device counts as stalled.
    call_timeout: Duration,
    /// How long a tick waits for the devices' answers.
    tick_budget: Duration,
    /// The tick begun and not yet finished: its deadline, and whether it is the first.
    tick: Option<(Instant, bool)>,
    /// When the slow read in progress started.
    round: Option<Instant>,
    last_round_ms: Option<i64>,
    proc_cache: procfs::ProcCache,
    lib: String,
    driver_version: Option<String>,
    /// The `--sim` scenario, if any (the bus of a simulated machine is `$NVML_SIM_SYSFS`).
    sim_scenario: Option<String>,
    /// Expected GPUs NVML does not enumerate ([`Sampler::check_expected`]), in every snapshot.
    missing: Vec<MissingGpu>,
}

/// One device as the sampler sees it: its last known identity and state.
struct Dev {
    id: DeviceId,
    state: DeviceState,
    /// Each slow metric's last value and when it was read (`i64::MIN`: never).
    slow_values: [(Option<f64>, i64); METRIC_COUNT],
    /// Its energy between reads of the counter (see `energy`).
    energy: energy::EnergyMeter,
    /// Where its GPM stands, as its last answer said.
    gpm: GpmStatus,
    /// The state last put in a snapshot (to log changes once).
    reported: DeviceState,
    /// Its processes as last read, and when (UTC ms): carried into a round it did not answer
    /// while younger than two process intervals plus the call timeout (like the slow values), so
    /// a late answer is not a GPU without processes.
    procs: Option<(i64, Vec<ProcSample>)>,
    /// With MIG on: its MIG devices as last read, and when (UTC ms); shown while as fresh as
    /// the processes.
    mig: Option<(i64, Vec<MigSample>)>,
    /// Its NVLinks as last read (GPUs with NVLink only).
    /// (Shared with the snapshots that carry it: a tick clones a pointer, not 18 links.)
    nvlink: Option<Arc<crate::model::nvlink::NvlinkStatus>>,
    /// Its GPU instances' GPM metrics are read (MIG on, Hopper and later), as its last slow
    /// answer said.
    mig_gpm: bool,
}

/// A fast-path thread's state for one device.
struct FastState {
    slot: Slot,
    attached: bool,
    /// The [`Slot::id_version`] of the identity last sent with an answer.
    sent_id: Option<u64>,
}

/// A fast-path answer.
struct FastAnswer {
    /// The identity, when it changed (first answer, re-attached after loss).
    id: Option<DeviceId>,
    state: DeviceState,
    values: MetricValues,
    slow_mask: u64,
    gpm: GpmStatus,
}

/// A tick's fast-path read for the calling thread to run (see [`Sampler::begin`]).
pub struct TickRead(worker::InlineRead<FastState, FastAnswer>);

impl TickRead {
    /// Reads the GPUs on this thread; a call blocked in a wedged driver blocks it.
    pub fn run(self) {
        self.0.run();
    }

    /// Which GPU and NVML call the read is in, and since when (for a watchdog).
    pub(crate) fn busy(&self) -> Arc<Busy> {
        self.0.busy()
    }
}

/// A call on the fast path blocked this long moves the GPUs after it to another thread (healthy
/// tick-path calls take microseconds).
const FAST_SPLIT: Duration = Duration::from_millis(25);
/// The same for the slow path (`nvmlDeviceGetPcieThroughput` takes 20 ms per call).
const SLOW_SPLIT: Duration = Duration::from_millis(250);

/// The kubelet's allocations of the GPUs in `gpus` and their MIG devices in `mig`, by UUID.
fn gpu_pods(
    allocations: &[crate::sys::podresources::Allocation],
    gpus: &[GpuSample],
    mig: &[crate::model::MigSample],
) -> Vec<crate::model::GpuPod> {
    let mut out: Vec<crate::model::GpuPod> = allocations
        .iter()
        .filter_map(|a| {
            let (gpu_index, mig_uuid) = match gpus.iter().find(|g| g.id.uuid == a.uuid) {
                Some(g) => (g.id.index, None),
                None => {
                    let m = mig.iter().find(|m| m.uuid == a.uuid)?;
                    (m.gpu_index, Some(m.uuid.clone()))
                }
            };
            Some(crate::model::GpuPod {
                gpu_index,
                mig_uuid,
                namespace: a.namespace.clone(),
                pod: a.pod.clone(),
                container: a.container.clone(),
            })
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Names the pod of each process in a pod (`k8s pod <uid>` from its cgroup) on a GPU, or MIG
/// device, allocated to one pod only, when the processes in pods there all have one pod uid:
/// `k8s pod <namespace>/<name>`. The API gives no uid, so a second pod's process on the device
/// (one that bypasses the device plugin, as monitors do with NVIDIA_VISIBLE_DEVICES=all) leaves
/// them all by uid; a host process on an allocated GPU stays a host process.
fn name_pods(
    procs: &mut [ProcSample],
    pods: &[crate::model::GpuPod],
    mig: &[crate::model::MigSample],
) {
    use crate::model::K8S_POD_PREFIX;
    let uid_of = |p: &ProcSample| {
        p.container
            .as_deref()
            .and_then(|c| c.strip_prefix(K8S_POD_PREFIX))
            .filter(|uid| !uid.contains('/'))
            .map(str::to_string)
    };
    let device_of = |p: &ProcSample| {
        let on_mig = mig
            .iter()
            .find(|m| m.gpu_index == p.gpu_index && m.pids.contains(&p.pid))
            .map(|m| m.uuid.clone());
        (p.gpu_index, on_mig)
    };
    // per device (GPU index, MIG UUID): the name its pod processes take, if any
    type Device = (u32, Option<String>);
    let mut names: Vec<(Device, Option<String>)> = Vec::new();
    for p in procs.iter() {
        let Some(uid) = uid_of(p) else { continue };
        let device = device_of(p);
        let mut holders = pods.iter().filter(|a| {
            a.gpu_index == device.0 && (a.mig_uuid.is_none() || a.mig_uuid == device.1)
        });
        let Some(first) = holders.next() else {
            continue;
        };
        let one_pod = holders.all(|a| a.namespace == first.namespace && a.pod == first.pod);
        let name = one_pod.then(|| format!("{K8S_POD_PREFIX}{}/{}", first.namespace, first.pod));
        // every process in a pod on the device must have the same uid
        let same_uid = procs
            .iter()
            .filter(|q| device_of(q) == device)
            .filter_map(uid_of)
            .all(|u| u == uid);
        names.push((device, name.filter(|_| same_uid)));
    }
    for p in procs.iter_mut() {
        if uid_of(p).is_none() {
            continue;
        }
        let device = device_of(p);
        if let Some((_, Some(name))) = names.iter().find(|(d, _)| *d == device) {
            p.container = Some(name.clone());
        }
    }
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler")
            .field("lib", &self.lib)
            .field("devices", &self.devices.len())
            .finish_non_exhaustive()
    }
}

/// Resolves which library to load: `(path, is_sim)`.
fn library_path(cfg: &SamplerConfig) -> Result<PathBuf, SamplerError> {
    if let Some(p) = &cfg.nvml_lib {
        return Ok(p.clone());
    }
    if cfg.sim_scenario.is_some() {
        let exe = std::env::current_exe().ok();
        let dir = exe
            .as_deref()
            .and_then(Path::parent)
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        let path = dir.join(SIM_LIB_FILE);
        if path.exists() {
            return Ok(path);
        }
        // (a library beside the executable first: a development build's own)
        return match embedded::path() {
            Ok(Some(p)) => Ok(p),
            Ok(None) => Err(SamplerError::NoSimLibrary { path }),
            Err(e) => Err(SamplerError::NoDriver {
                lib: format!("{SIM_LIB_FILE} (embedded in gpuwatch)"),
                detail: format!("cannot put it in a memory file to load it: {e}"),
            }),
        };
    }
    Ok(PathBuf::from(DEFAULT_NVML_LIB))
}

/// The fast path for `n` devices: a device is attached (handle and identity) at its first read.
/// `id_wanted[pos]` asks device `pos`'s worker to send its identity again (the answer that
/// carried it came after its tick's deadline and was discarded: a GPU stalled at start).
fn fast_pool(
    nvml: &'static Nvml,
    n: usize,
    id_wanted: Arc<Vec<AtomicBool>>,
    gpm: Option<Duration>,
) -> Pool<FastState, FastAnswer> {
    let factory: worker::Factory<FastState> = Arc::new(move |pos, busy| {
        let mut slot = Slot::new(
            u32::try_from(pos).unwrap_or(u32::MAX),
            now_ms(),
            busy,
            slot::Path::Fast,
        );
        if let Some(every) = gpm {
            slot.gpm = slot::Gpm::on(every);
        }
        FastState {
            slot,
            attached: false,
            sent_id: None,
        }
    });
    let work: worker::Work<FastState, FastAnswer> = Arc::new(move |st, _, time_ms| {
        if !st.attached {
            st.attached = true;
            if !st.slot.attach(nvml) {
                tracing::warn!(
                    "GPU {} does not answer (lost); the others are sampled",
                    st.slot.id.index
                );
                st.slot.state = DeviceState::Lost;
            }
        }
        let mut values = MetricValues::default();
        let state = st.slot.tick(nvml, time_ms, &mut values);
        if id_wanted
            .get(st.slot.id.index as usize)
            .is_some_and(|w| w.swap(false, Ordering::Relaxed))
        {
            st.sent_id = None;
        }
        let id = (st.sent_id != Some(st.slot.id_version)).then(|| {
            st.sent_id = Some(st.slot.id_version);
            st.slot.id.clone()
        });
        FastAnswer {
            id,
            state,
            values,
            slow_mask: st.slot.slow_metrics(),
            gpm: st.slot.gpm.status.clone(),
        }
    });
    Pool::new("gpuwatch-nvml", n, FAST_SPLIT, factory, work)
}

/// The slow path for `n` devices: process lists and the slow metrics in `masks`.
fn slow_pool(
    nvml: &'static Nvml,
    n: usize,
    masks: Arc<Vec<AtomicU64>>,
    cfg: &SamplerConfig,
) -> Pool<SlowSlot, SlowAnswer> {
    let rates_now = cfg.rates_now;
    let gpm = cfg.gpm;
    let unread = cfg.unread.clone();
    let process_interval_ms = duration_ms(cfg.process_interval).max(1);
    let factory: worker::Factory<SlowSlot> = Arc::new(move |pos, busy| {
        let mut slot = SlowSlot::new(u32::try_from(pos).unwrap_or(u32::MAX), busy);
        slot.rates_now = rates_now;
        slot.process_interval_ms = process_interval_ms;
        slot.set_gpm(gpm);
        slot
    });
    let work: worker::Work<SlowSlot, SlowAnswer> = Arc::new(move |slot, _, time_ms| {
        slot.ensure_handle(nvml);
        let pos = slot.slot.id.index as usize;
        let mask = masks.get(pos).map_or(0, |m| m.load(Ordering::Relaxed));
        slot.read(mask, unread.load(Ordering::Relaxed), time_ms)
    });
    Pool::new("gpuwatch-nvml-slow", n, SLOW_SPLIT, factory, work)
}

impl Sampler {
    /// Loads NVML, enumerates the GPUs (a GPU that does not answer within the call timeout
    /// starts out stalled) and, if configured, registers for XID events and follows the kernel
    /// log.
    pub fn open(cfg: &SamplerConfig) -> Result<Sampler, SamplerError> {
        let path = library_path(cfg)?;
        let lib = if path.starts_with("/proc/self/fd") {
            format!("{SIM_LIB_FILE} (embedded in gpuwatch)")
        } else {
            path.display().to_string()
        };
        if let Some(s) = &cfg.sim_scenario {
            // Set before init, while no other thread of ours reads the environment.
            std::env::set_var("NVML_SIM_SCENARIO", s);
            if let Some(scale) = cfg.sim_time_scale {
                std::env::set_var("NVML_SIM_TIME_SCALE", scale.to_string());
            }
        }
        let os_path: OsString = path.into_os_string();
        let nvml = match Nvml::builder().lib_path(&os_path).init() {
            Ok(n) => n,
            Err(NvmlError::LibloadingError(e)) => {
                if cfg.sim_scenario.is_some() && cfg.nvml_lib.is_some() {
                    return Err(SamplerError::NoSimLibrary {
                        path: PathBuf::from(&os_path),
                    });
                }
                return Err(SamplerError::NoDriver {
                    lib,
                    detail: e.to_string(),
                });
            }
            Err(e @ (NvmlError::DriverNotLoaded | NvmlError::LibraryNotFound)) => {
                return Err(SamplerError::NoDriver {
                    lib,
                    detail: e.to_string(),
                })
            }
            Err(e) => {
                return Err(match &cfg.sim_scenario {
                    Some(s) => SamplerError::Scenario {
                        scenario: s.clone(),
                        source: e,
                    },
                    None => SamplerError::Init { lib, source: e },
                })
            }
        };
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        let count = nvml.device_count().map_err(|e| SamplerError::Init {
            lib: lib.clone(),
            source: e,
        })?;
        let driver_version = nvml.sys_driver_version().ok();
        let n = count as usize;
        let devices: Vec<Dev> = (0..count)
            .map(|index| Dev {
                id: DeviceId {
                    index,
                    ..DeviceId::default()
                },
                state: DeviceState::Ok,
                slow_values: [(None, i64::MIN); METRIC_COUNT],
                energy: energy::EnergyMeter::default(),
                gpm: if cfg.gpm {
                    GpmStatus::Unknown
                } else {
                    GpmStatus::Off
                },
                reported: DeviceState::Ok,
                procs: None,
                mig: None,
                nvlink: None,
                mig_gpm: false,
            })
            .collect();
        let slow_masks: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
        let id_wanted: Arc<Vec<AtomicBool>> =
            Arc::new((0..n).map(|_| AtomicBool::new(false)).collect());
        let mut sampler = Sampler {
            nvml,
            devices,
            pods: cfg
                .pod_resources
                .clone()
                .map(crate::sys::podresources::Watcher::start),
            fast: fast_pool(
                nvml,
                n,
                id_wanted.clone(),
                cfg.gpm.then_some(cfg.gpm_interval),
            ),
            id_wanted,
            slow: slow_pool(nvml, n, slow_masks.clone(), cfg),
            slow_masks,
            xids: None,
            xid_pending: Vec::new(),
            merger: xids::XidMerger::new(None),
            degraded: Vec::new(),
            process_interval_ms: i64::try_from(cfg.process_interval.as_millis())
                .unwrap_or(i64::MAX),
            slow_max_age_ms: slot::max_ages_ms(
                duration_ms(cfg.process_interval),
                duration_ms(cfg.call_timeout),
            ),
            energy_anchor_age_ms: slot::counter_every_ms(
                slot::ENERGY_EVERY,
                duration_ms(cfg.process_interval).max(1),
            )
            .saturating_mul(2)
            .saturating_add(duration_ms(cfg.call_timeout)),
            call_timeout: cfg.call_timeout,
            tick_budget: cfg.call_timeout,
            tick: None,
            round: None,
            last_round_ms: None,
            proc_cache: procfs::ProcCache::default(),
            lib,
            driver_version,
            sim_scenario: cfg.sim_scenario.clone(),
            missing: Vec::new(),
        };
        sampler.attach_all();
        if cfg.xid_events {
            sampler.watch_xids(cfg);
        }
        Ok(sampler)
    }

    /// Attaches every device (a first fast read), waiting up to the call timeout.
    fn attach_all(&mut self) {
        self.fast.ask(now_ms(), |_| true);
        self.fast.collect(Instant::now() + self.call_timeout, None);
        for pos in 0..self.devices.len() {
            match self.fast.take(pos) {
                Some(answer) => {
                    self.take(pos, answer);
                }
                None => {
                    let f = self.fast.stalled(pos, Instant::now(), Duration::ZERO);
                    let what = f.map_or("NVML", NvmlFunction::symbol);
                    let line = format!(
                        "GPU {pos}: {what} did not return within {} ms at start; it is reported stalled until it answers",
                        self.call_timeout.as_millis()
                    );
                    tracing::error!("{line}");
                    self.degraded.push(line);
                }
            }
        }
    }

    /// Registers for NVML XID events on the devices that answered (the others when they first
    /// do), and follows the kernel log.
    fn watch_xids(&mut self, cfg: &SamplerConfig) {
        let (ready, pending): (Vec<usize>, Vec<usize>) =
            (0..self.devices.len()).partition(|&p| self.xid_ready(p));
        let regs = ready
            .iter()
            .map(|&p| (self.devices[p].id.index, self.devices[p].id.uuid.clone()))
            .collect();
        self.xid_pending = pending;
        let mut missing = Vec::new();
        self.xids = events::XidThread::start(self.nvml, regs, self.call_timeout, &mut missing);
        for m in &missing {
            tracing::warn!("{m}: XIDs (79 fallen off the bus, 94/95 memory errors, …) on it will not be reported");
        }
        self.degraded.extend(missing);
        let path = cfg.kernel_log.clone().unwrap_or_else(kmsg::default_path);
        match kmsg::KmsgReader::start(&path) {
            Ok(k) => self.merger = xids::XidMerger::new(Some(k)),
            Err(e) => {
                // Not degraded monitoring (NVML events still come): the XIDs lack the process
                // that raised them.
                tracing::info!("kernel log not followed ({e}); XIDs come from NVML events only, without the process that raised them");
            }
        }
    }

    /// Compares the enumerated GPUs with the expected set (the PCI bus, the GPUs seen before,
    /// `expected_gpus`; see [`expected`]), records the present ones when `opts.record`, and
    /// carries the missing GPUs in every snapshot from now on. Returns them.
    pub fn check_expected(&mut self, opts: &expected::ExpectedOptions) -> &[MissingGpu] {
        self.missing = expected::check(
            &self.devices(),
            opts,
            self.sim_scenario.as_deref(),
            now_ms(),
        );
        &self.missing
    }

    /// The missing GPUs found by [`Sampler::check_expected`] (empty before it ran).
    pub fn missing(&self) -> &[MissingGpu] {
        &self.missing
    }

    /// Whether this sampler runs on the simulated library (`--sim`).
    pub fn is_sim(&self) -> bool {
        self.sim_scenario.is_some()
    }

    /// What this sampler cannot watch, one line each (e.g. GPUs without XID events); empty when
    /// everything is monitored.
    pub fn degraded(&self) -> &[String] {
        &self.degraded
    }

    /// Identities of all GPUs, in NVML index order.
    pub fn devices(&self) -> Vec<DeviceId> {
        self.devices.iter().map(|d| d.id.clone()).collect()
    }

    /// Where GPM stands on each GPU, in NVML index order (as of the last snapshot).
    pub fn gpm(&self) -> Vec<GpmStatus> {
        self.devices.iter().map(|d| d.gpm.clone()).collect()
    }

    /// How long what a slow round read (process lists, MIG devices, NVLinks) is shown: twice
    /// the process interval plus the call timeout; and the call timeout, ms.
    fn slow_age_ms(&self) -> (i64, i64) {
        let timeout_ms = duration_ms(self.call_timeout);
        (
            (2 * self.process_interval_ms).saturating_add(timeout_ms),
            timeout_ms,
        )
    }

    /// Whether any GPU reads GPM (the GPM metrics then need two snapshots a tick apart).
    pub fn gpm_active(&self) -> bool {
        self.devices.iter().any(|d| d.gpm == GpmStatus::Active)
    }

    /// Whether any GPU reads the GPM metrics of its GPU instances (MIG on, Hopper and later):
    /// they are read on the slow path, so they need two slow reads ([`Sampler::read_slow_next`]).
    pub fn mig_gpm_active(&self) -> bool {
        self.devices.iter().any(|d| d.mig_gpm)
    }

    /// Makes the next snapshot start a slow read (processes, MIG devices and their GPM, slow
    /// metrics) and wait for it, as the first one does — for a one-shot command's second
    /// snapshot, whose GPU instances' GPM metrics need a second slow read. Nothing while a slow
    /// read is under way.
    pub fn read_slow_next(&mut self) {
        if self.round.is_none() {
            self.last_round_ms = None;
        }
    }

    /// The library that was loaded (path or name).
    pub fn library(&self) -> &str {
        &self.lib
    }

    /// The driver version NVML reports, if any.
    pub fn driver_version(&self) -> Option<&str> {
        self.driver_version.as_deref()
    }

    /// NVML's own version string, if any.
    pub fn nvml_version(&self) -> Option<String> {
        self.nvml.sys_nvml_version().ok()
    }

    /// The NVML library handle (for one-shot queries such as `doctor`'s).
    pub fn nvml(&self) -> &'static Nvml {
        self.nvml
    }

    /// How long a tick waits for the devices' answers (default: the call timeout, right for a
    /// one-shot sample; a periodic sampler sets about half its interval).
    pub fn set_tick_budget(&mut self, budget: Duration) {
        self.tick_budget = budget.min(self.call_timeout);
    }

    /// Takes one snapshot now.
    pub fn sample(&mut self) -> Snapshot {
        self.sample_at(now_ms())
    }

    /// Takes one snapshot stamped `time_ms`: asks the fast path for every device and waits for
    /// the answers up to the tick budget. A device that did not answer in time is left out of
    /// the snapshot (a gap), or shown stalled once its call has been blocked for the call
    /// timeout. The process list (and the slow metrics) are read on the process cadence by the
    /// slow path and come in the first snapshot after they answered; the first snapshot waits
    /// for them.
    pub fn sample_at(&mut self, time_ms: i64) -> Snapshot {
        self.begin(time_ms, false);
        self.finish(time_ms)
    }

    /// How long a read call may block before the other GPUs move to another thread.
    pub fn split_after(&self) -> Duration {
        FAST_SPLIT
    }

    /// The deadline of the tick begun and not yet finished: its answers are waited for until
    /// then (a GPU that has not answered is a gap).
    pub fn deadline(&self) -> Option<Instant> {
        self.tick.map(|(d, _)| d)
    }

    /// Starts the tick stamped `time_ms`, to be ended by [`Sampler::finish`]. With `inline`, the
    /// calling thread reads the GPUs itself where it can: the fast path's request is returned
    /// instead of sent to its thread (see `worker::Pool::ask_inline`), to be run on this thread
    /// with [`TickRead::run`] before [`Sampler::finish`]. `None` when the fast path's threads
    /// were asked (always without `inline`; after a call blocked, a GPU's reads stay on threads
    /// of their own until the pool rejoins, see `worker`). A caller reading inline must arrange for the tick to be finished by
    /// another thread if a call in the read blocks past [`Sampler::split_after`]
    /// (`pipeline::SamplerThread` does): the read may never return.
    pub fn begin(&mut self, time_ms: i64, inline: bool) -> Option<TickRead> {
        let deadline = Instant::now() + self.tick_budget;
        // The devices are read and the XID events drained at once; the drain's answer is taken
        // after the devices' (see `XidThread::ask_drain`).
        let read = if inline {
            self.fast.ask_inline(time_ms)
        } else {
            self.fast.ask(time_ms, |_| true);
            None
        };
        if let Some(x) = self.xids.as_mut() {
            x.ask_drain(time_ms);
        }
        let first = self.last_round_ms.is_none();
        self.start_round(time_ms);
        self.tick = Some((deadline, first));
        read.map(TickRead)
    }

    /// Ends the tick [`Sampler::begin`] started (its read run or not): collects the
    /// answers until the tick's deadline and produces the snapshot, as [`Sampler::sample_at`].
    pub fn finish(&mut self, time_ms: i64) -> Snapshot {
        let (deadline, first) = self
            .tick
            .take()
            .unwrap_or((Instant::now() + self.tick_budget, false));
        // Blocked calls that reach the timeout within the budget are waited for, so a stall is
        // reported at this tick rather than the next.
        let timeout = self.call_timeout;
        let timeout_ms = duration_ms(timeout);
        let stall_at = (0..self.devices.len())
            .filter_map(|p| self.fast.stall_instant(p, timeout))
            .filter(|t| *t <= deadline)
            .max();
        self.fast.collect(deadline, stall_at);
        let nvml_xids = self
            .xids
            .as_mut()
            .map(|x| x.take(deadline, first))
            .unwrap_or_default();
        let ids = self.devices.iter().map(|d| &d.id);
        // An NVML XID waits for its kernel-log line as long as when the devices answer at once
        // even when they took the whole budget (a stall, when XIDs matter most): at most one
        // budget more, so the tick stays within its interval.
        let twin_until = deadline.max(Instant::now() + self.tick_budget.min(xids::TWIN_WAIT));
        let xids = self.merger.merge(time_ms, nvml_xids, ids, twin_until);
        let processes = self.collect_round(first.then_some(deadline));
        let now = Instant::now();
        let mut gpus = Vec::with_capacity(self.devices.len());
        for pos in 0..self.devices.len() {
            let fresh = self.fast.take(pos).map(|a| self.take(pos, a));
            let d = &self.devices[pos];
            let (state, mut values) = match (self.fast.stalled(pos, now, timeout), fresh) {
                (Some(f), _) => (DeviceState::Stalled(f), MetricValues::default()),
                (None, Some(v)) => match self.slow.stalled(pos, now, timeout) {
                    Some(f) if d.state == DeviceState::Ok => (DeviceState::Stalled(f), v),
                    _ => (d.state, v),
                },
                // Late but not yet stalled: a gap for this GPU at this tick.
                (None, None) => continue,
            };
            let mask = self.slow_masks[pos].load(Ordering::Relaxed);
            // Not for a lost or stalled GPU: what the slow path read before is not current.
            if state == DeviceState::Ok {
                for m in slot::mask_metrics(mask) {
                    // shown while younger than twice its cadence (then it is absent)
                    let (v, at) = d.slow_values[m as usize];
                    let age = self.slow_max_age_ms[m as usize];
                    if at != i64::MIN && is_current(time_ms, at, age, timeout_ms) {
                        values.set(m, v);
                    }
                }
            }
            let d = &mut self.devices[pos];
            if state == DeviceState::Ok {
                // the counter's last reading plus the power since (see `energy`); without power
                // readings, the reading alone while it is current (set above)
                if let (Some(j), at) = d.slow_values[Metric::Energy as usize] {
                    d.energy.anchor(j, at);
                    if let Some(e) = d.energy.last_error.take() {
                        tracing::debug!(
                            "GPU {}: energy estimate corrected by the counter ({:+.3} % of the \
                             energy since the reading before)",
                            d.id.index,
                            e * 100.0
                        );
                    }
                }
                let energy = match d.energy.tick(
                    values.get(Metric::Power),
                    time_ms,
                    self.energy_anchor_age_ms,
                ) {
                    Some(e) => Some(e),
                    None => values.get(Metric::Energy).and_then(|j| d.energy.alone(j)),
                };
                values.set(Metric::Energy, energy);
            }
            d.report(state, timeout);
            gpus.push(GpuSample {
                time_ms,
                id: d.id.clone(),
                state,
                values,
            });
        }
        self.register_late_xids();
        let mig = self.mig_now(time_ms, &gpus);
        let nvlink = self.nvlink_now(time_ms, &gpus);
        let mut processes = processes;
        let pods = match self.pods.as_ref().and_then(|w| w.current()) {
            Some(allocations) => {
                let pods = gpu_pods(&allocations, &gpus, &mig);
                if let Some(procs) = &mut processes {
                    name_pods(procs, &pods, &mig);
                }
                pods
            }
            None => Vec::new(),
        };
        Snapshot {
            time_ms,
            gpus,
            processes,
            xids,
            missing: self.missing.clone(),
            mig,
            nvlink,
            pods,
        }
    }

    /// The NVLinks of the GPUs in this snapshot that answer, while their last read is as fresh
    /// as a process list may be (like [`Sampler::mig_now`]).
    fn nvlink_now(
        &self,
        time_ms: i64,
        gpus: &[GpuSample],
    ) -> Vec<Arc<crate::model::nvlink::NvlinkStatus>> {
        let (max_age, timeout_ms) = self.slow_age_ms();
        gpus.iter()
            .filter(|g| g.state == DeviceState::Ok)
            .filter_map(|g| self.devices.iter().find(|d| d.id.index == g.id.index))
            .filter_map(|d| d.nvlink.as_ref())
            .filter(|n| is_current(time_ms, n.time_ms, max_age, timeout_ms))
            .cloned()
            .collect()
    }

    /// The MIG devices of the GPUs in this snapshot that answer, while their last read is as
    /// fresh as a process list may be (twice the process interval plus the call timeout).
    fn mig_now(&self, time_ms: i64, gpus: &[GpuSample]) -> Vec<MigSample> {
        let (max_age, timeout_ms) = self.slow_age_ms();
        let mut out = Vec::new();
        for g in gpus.iter().filter(|g| g.state == DeviceState::Ok) {
            let Some(d) = self.devices.iter().find(|d| d.id.index == g.id.index) else {
                continue;
            };
            if let Some((at, list)) = &d.mig {
                if is_current(time_ms, *at, max_age, timeout_ms) {
                    out.extend(list.iter().cloned());
                }
            }
        }
        out
    }

    /// Whether device `pos` answers and can be registered for XID events.
    fn xid_ready(&self, pos: usize) -> bool {
        let d = &self.devices[pos];
        d.state == DeviceState::Ok && !d.id.uuid.is_empty()
    }

    /// Registers the XID events of GPUs that were stalled when the event set was built, once
    /// they answer.
    fn register_late_xids(&mut self) {
        if self.xid_pending.is_empty() {
            return;
        }
        let (ready, pending): (Vec<usize>, Vec<usize>) = std::mem::take(&mut self.xid_pending)
            .into_iter()
            .partition(|&p| self.xid_ready(p));
        self.xid_pending = pending;
        if let (Some(x), false) = (self.xids.as_mut(), ready.is_empty()) {
            let devices = ready
                .iter()
                .map(|&p| (self.devices[p].id.index, self.devices[p].id.uuid.clone()))
                .collect();
            x.register(devices);
        }
    }

    /// Books a fast answer's identity, state and slow mask for device `pos`; returns its values.
    fn take(&mut self, pos: usize, a: FastAnswer) -> MetricValues {
        let d = &mut self.devices[pos];
        match a.id {
            Some(id) => d.id = id,
            // It answers, but the answer that carried its identity was discarded (late).
            None if d.id.uuid.is_empty() && a.state == DeviceState::Ok => {
                self.id_wanted[pos].store(true, Ordering::Relaxed);
            }
            None => {}
        }
        d.state = a.state;
        d.gpm = a.gpm;
        self.slow_masks[pos].store(a.slow_mask, Ordering::Relaxed);
        a.values
    }

    /// Starts a slow read of every device when the process cadence says so and none is running.
    fn start_round(&mut self, time_ms: i64) {
        let due = self
            .last_round_ms
            // (a wall clock stepped back makes it due at once, not after the step)
            .is_none_or(|last| time_ms < last || time_ms - last >= self.process_interval_ms);
        if !due || self.round.is_some() {
            return;
        }
        self.last_round_ms = Some(time_ms);
        let devices = &self.devices;
        self.slow
            .ask(time_ms, |p| devices[p].state != DeviceState::Lost);
        self.round = Some(Instant::now());
    }

    /// Takes the slow answers that came (waiting for them until `wait_until` when given); when
    /// every device answered, or the call timeout passed, the round ends with a process list.
    fn collect_round(&mut self, wait_until: Option<Instant>) -> Option<Vec<ProcSample>> {
        let started = self.round?;
        self.slow
            .collect(wait_until.unwrap_or_else(Instant::now), None);
        if self.slow.waiting() && started.elapsed() < self.call_timeout {
            return None;
        }
        self.round = None;
        let round_ms = self.last_round_ms.unwrap_or(i64::MIN);
        let (max_age, timeout_ms) = self.slow_age_ms();
        let mut out = Vec::new();
        for pos in 0..self.devices.len() {
            let answer = self.slow.take(pos);
            let d = &mut self.devices[pos];
            let list = match answer {
                Some(a) => {
                    for m in METRICS {
                        if a.read & slot::metric_bit(m.id) != 0 {
                            // (the energy counter at the time of its own call: see `energy`)
                            let at = if m.id == Metric::Energy {
                                a.energy_ms
                            } else {
                                a.time_ms
                            };
                            d.slow_values[m.id as usize] = (a.values.get(m.id), at);
                        }
                    }
                    if let Some(links) = a.nvlink {
                        d.nvlink = Some(Arc::new(crate::model::nvlink::NvlinkStatus {
                            gpu: d.id.index,
                            time_ms: a.time_ms,
                            links,
                        }));
                    }
                    d.mig_gpm = a.mig_gpm;
                    d.mig = a.mig.map(|readings| {
                        let procs = a.processes.as_deref().unwrap_or_default();
                        (a.time_ms, mig::samples(&d.id, readings, procs))
                    });
                    a.processes.map(|list| (a.time_ms, list, a.names))
                }
                None => None,
            };
            let Some((read_ms, list, names)) = list else {
                // No list this round: the last one while fresh (not for a lost GPU: its
                // processes are gone with it).
                if let Some((at, carried)) = &d.procs {
                    if d.state != DeviceState::Lost
                        && is_current(round_ms, *at, max_age, timeout_ms)
                    {
                        out.extend(carried.iter().cloned());
                    }
                }
                continue;
            };
            let first = out.len();
            for (p, kind) in list {
                // One process often holds every GPU: read /proc once per refresh.
                let det = match out.iter().find(|q: &&ProcSample| q.pid == p.pid) {
                    Some(q) => procfs::ProcDetails {
                        uid: q.uid,
                        user: q.user.clone(),
                        command: q.command.clone(),
                        container: q.container.clone(),
                        runtime_s: q.runtime_s,
                        start_ticks: q.start_ticks,
                    },
                    None => {
                        let mut det = self.proc_cache.lookup(p.pid);
                        // not in this PID namespace: the name NVML gives
                        if det.command.is_none() {
                            det.command = names
                                .iter()
                                .find(|(pid, _)| *pid == p.pid)
                                .map(|(_, n)| n.clone());
                        }
                        det
                    }
                };
                out.push(ProcSample {
                    pid: p.pid,
                    gpu_index: d.id.index,
                    gpu_uuid: d.id.uuid.clone(),
                    used_mem_bytes: match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => Some(b),
                        UsedGpuMemory::Unavailable => None,
                    },
                    kind,
                    uid: det.uid,
                    user: det.user,
                    command: det.command,
                    container: det.container,
                    runtime_s: det.runtime_s,
                    start_ticks: det.start_ticks,
                });
            }
            d.procs = Some((read_ms, out[first..].to_vec()));
        }
        let alive: Vec<u32> = out.iter().map(|p| p.pid).collect();
        self.proc_cache.retain(&alive);
        Some(out)
    }
}

impl Dev {
    /// Logs a change between stalled and not stalled.
    fn report(&mut self, state: DeviceState, timeout: Duration) {
        let was = self.reported.stalled_in();
        self.reported = state;
        match (was, state.stalled_in()) {
            (None, Some(f)) => {
                worker::call_failures().timeout(f);
                tracing::error!(
                "GPU {}{}: {} has not returned for {} ms (driver wedged or GPU in reset); the other GPUs keep being sampled",
                self.id.index,
                if self.id.uuid.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", self.id.uuid)
                },
                f.symbol(),
                timeout.as_millis()
            )
            }
            (Some(f), None) => tracing::warn!(
                "GPU {}: {} returned; the GPU answers again",
                self.id.index,
                f.symbol()
            ),
            _ => {}
        }
    }
}

/// Whether a value read at `at` (UTC ms) is current at `now`: read at most `max_age` before it,
/// or within `slack` after it (slow reads end after the tick they were asked at); one read
/// later than that is from before the wall clock was stepped back.
fn is_current(now: i64, at: i64, max_age: i64, slack: i64) -> bool {
    let age = now.saturating_sub(at);
    age <= max_age && age >= -slack
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Absolute-time tick schedule: tick `k` is due at `start + k × interval`. A tick that could
/// not be taken within half an interval of its time is skipped (a gap), never made up in a
/// burst.
#[derive(Debug, Clone)]
pub struct Ticker {
    start: Instant,
    interval: Duration,
    next_k: u64,
    missed: u64,
}

impl Ticker {
    /// A schedule whose first tick is due at `start`.
    pub fn new(start: Instant, interval: Duration) -> Ticker {
        Ticker {
            start,
            interval,
            next_k: 0,
            missed: 0,
        }
    }

    fn due(&self, k: u64) -> Instant {
        let nanos = self.interval.as_nanos().saturating_mul(u128::from(k));
        self.start + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// When the next tick is due, given the time `now`; ticks already too late are skipped.
    pub fn next(&mut self, now: Instant) -> Instant {
        loop {
            let t = self.due(self.next_k);
            self.next_k += 1;
            if now <= t + self.interval / 2 {
                return t;
            }
            self.missed += 1;
        }
    }

    /// Ticks skipped so far because they were late.
    pub fn missed(&self) -> u64 {
        self.missed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Metric, NvmlCall, Source};

    /// A slow value is current from a little after the tick (a slow read ends after the tick it
    /// was asked at) back to its maximum age; one read long "after" the tick predates a step
    /// back of the wall clock.
    #[test]
    fn slow_values_are_current_within_their_age() {
        assert!(
            is_current(10_000, 10_003, 5_000, 1_000),
            "read just after the tick"
        );
        assert!(is_current(10_000, 5_000, 5_000, 1_000));
        assert!(!is_current(10_000, 4_999, 5_000, 1_000), "too old");
        assert!(
            !is_current(10_000, 3_610_000, 5_000, 1_000),
            "the clock stepped back"
        );
    }

    #[test]
    fn ticker_keeps_absolute_schedule_and_skips_late_ticks() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut t = Ticker::new(t0, ms(100));
        assert_eq!(t.next(t0), t0);
        assert_eq!(t.next(t0 + ms(10)), t0 + ms(100));
        // Woke 30 ms late for tick 2: still taken (within half an interval).
        assert_eq!(t.next(t0 + ms(130)), t0 + ms(200));
        // Work took long: ticks 3 and 4 are gone, the next due is 5.
        assert_eq!(t.next(t0 + ms(460)), t0 + ms(500));
        assert_eq!(t.missed(), 2);
    }

    /// The table's field ids are the pre-580.82 numbers nvml-wrapper uses (and translates for
    /// newer drivers).
    #[test]
    fn table_field_ids_are_nvml_wrappers() {
        use crate::model::NvmlField as F;
        use nvml_wrapper::sys_exports::field_id as fi;
        for (ours, theirs) in [
            (F::ECC_SBE_VOL_TOTAL, fi::NVML_FI_DEV_ECC_SBE_VOL_TOTAL),
            (F::ECC_DBE_VOL_TOTAL, fi::NVML_FI_DEV_ECC_DBE_VOL_TOTAL),
            (F::RETIRED_SBE, fi::NVML_FI_DEV_RETIRED_SBE),
            (F::RETIRED_DBE, fi::NVML_FI_DEV_RETIRED_DBE),
            (F::RETIRED_PENDING, fi::NVML_FI_DEV_RETIRED_PENDING),
            (F::MEMORY_TEMP, fi::NVML_FI_DEV_MEMORY_TEMP),
            (
                F::TOTAL_ENERGY_CONSUMPTION,
                fi::NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
            ),
            (F::PCIE_REPLAY_COUNTER, fi::NVML_FI_DEV_PCIE_REPLAY_COUNTER),
            (F::REMAPPED_COR, fi::NVML_FI_DEV_REMAPPED_COR),
            (F::REMAPPED_UNC, fi::NVML_FI_DEV_REMAPPED_UNC),
            (F::REMAPPED_PENDING, fi::NVML_FI_DEV_REMAPPED_PENDING),
            (F::REMAPPED_FAILURE, fi::NVML_FI_DEV_REMAPPED_FAILURE),
        ] {
            assert_eq!(ours.id, theirs, "{}", ours.name);
        }
    }

    /// Every row is read: NVML calls by `Slot::read_call`, fields by one field-values call per
    /// path (the tick path's fields batched in one, the slow fields in the slow path's), derived
    /// rows after the reads. A slow field's fallback call is slow too (else the tick path would
    /// make the expensive call the field was moved off it for).
    #[test]
    fn every_row_is_read_through_its_source() {
        let fast: Vec<Metric> = slot::table_fields(slot::Path::Fast)
            .map(|r| r.metric)
            .collect();
        let slow: Vec<Metric> = slot::table_fields(slot::Path::Slow)
            .map(|r| r.metric)
            .collect();
        for d in METRICS {
            match d.source {
                Source::Field(f) => {
                    assert_eq!(fast.contains(&d.id), !f.slow, "{}", d.key);
                    assert_eq!(slow.contains(&d.id), f.slow, "{}", d.key);
                    if f.slow {
                        assert!(f.fallback.is_none_or(NvmlCall::is_slow), "{}", d.key);
                    }
                }
                Source::Nvml(_) | Source::Gpm(_) | Source::Derived(_) | Source::Nvlink(_) => {
                    assert!(!fast.contains(&d.id) && !slow.contains(&d.id))
                }
                Source::Host(h) => match h {},
            }
        }
        // GPM is read on the tick path, all rows by one request with every id of theirs
        assert!(METRICS
            .iter()
            .filter(|d| d.source.is_gpm())
            .all(|d| !d.source.is_slow()));
        // energy and the PCIe counters cost the driver CPU: never on the tick path
        for key in ["energy", "pcie_rx", "pcie_tx", "pcie_replay"] {
            let m = METRICS.iter().find(|d| d.key == key).unwrap();
            assert!(m.source.is_slow() && slow.contains(&m.id), "{key}");
        }
    }

    #[test]
    fn sampler_can_move_to_its_own_thread() {
        fn assert_send<T: Send>() {}
        assert_send::<Sampler>();
    }

    #[test]
    fn missing_library_is_a_no_driver_error() {
        let cfg = SamplerConfig {
            nvml_lib: Some(PathBuf::from("/nonexistent/libnvidia-ml.so.1")),
            ..SamplerConfig::default()
        };
        let err = Sampler::open(&cfg).unwrap_err();
        assert!(matches!(err, SamplerError::NoDriver { .. }), "{err:?}");
        let line = err.to_string();
        assert!(!line.contains('\n'));
        assert!(line.contains("--sim overnight"), "{line}");
    }

    #[test]
    fn pod_processes_are_named_only_when_one_pod_uid_is_on_the_device() {
        let pod = |gpu: u32, name: &str| crate::model::GpuPod {
            gpu_index: gpu,
            mig_uuid: None,
            namespace: "ml".into(),
            pod: name.into(),
            container: "c".into(),
        };
        let proc_in = |pid: u32, gpu: u32, container: Option<&str>| ProcSample {
            container: container.map(str::to_string),
            ..ProcSample::compute(pid, gpu, format!("GPU-{gpu}"), None)
        };
        let pods = vec![
            pod(0, "trainer-0"),
            pod(1, "a"),
            pod(1, "b"),
            pod(2, "solo"),
        ];
        let mut procs = vec![
            proc_in(10, 0, Some("k8s pod u1")),
            proc_in(11, 0, Some("k8s pod u1")),
            proc_in(12, 0, None),               // a host process on the GPU
            proc_in(20, 1, Some("k8s pod u2")), // GPU 1 shared by two pods
            proc_in(30, 2, Some("k8s pod u3")),
            proc_in(31, 2, Some("k8s pod u4")), // a second pod on GPU 2 bypassing the plugin
            proc_in(40, 3, Some("k8s pod u5")), // GPU 3 allocated to no pod
        ];
        name_pods(&mut procs, &pods, &[]);
        let got: Vec<Option<&str>> = procs.iter().map(|p| p.container.as_deref()).collect();
        assert_eq!(
            got,
            vec![
                Some("k8s pod ml/trainer-0"),
                Some("k8s pod ml/trainer-0"),
                None,
                Some("k8s pod u2"),
                Some("k8s pod u3"),
                Some("k8s pod u4"),
                Some("k8s pod u5"),
            ]
        );
        // named already: left as it is
        name_pods(&mut procs, &pods, &[]);
        assert_eq!(procs[0].container.as_deref(), Some("k8s pod ml/trainer-0"));
    }
}
