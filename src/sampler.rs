//! The only module that talks to NVML (through `nvml-wrapper`).
//!
//! [`Sampler::open`] loads the library (`--nvml-lib`, `GPUWATCH_NVML_LIB`, the simulated library
//! for `--sim`, or `libnvidia-ml.so.1`), reads every GPU's identity once and keeps one handle per
//! GPU. [`Sampler::sample`] then produces a plain [`Snapshot`]: every metric of
//! [`crate::model::METRICS`] per GPU in canonical units, the XID events received since the last
//! tick (drained from an NVML event set without blocking, see `events`) and, on a slower
//! cadence, the GPU process list enriched from `/proc` ([`procfs`]).
//!
//! The metric table drives the per-GPU read: each row is read through its
//! [`Source`] — all field rows in one `nvmlDeviceGetFieldValues` call, a
//! field the GPU lacks through its row's fallback call, every [`NvmlCall`] by its reader (calls
//! answering several rows are made once per tick), derived rows last. A new row therefore needs
//! no sampler code unless it brings a new `NvmlCall` (which does not compile without a reader).
//!
//! Faults never stop sampling. A value the GPU cannot give is `None`; after the first
//! `NotSupported` (or missing symbol, or no permission) that query (or field) is not asked again
//! for that GPU (logged once at debug). `GpuLost` / `ResetRequired` make the device
//! [`DeviceState::Lost`] (all values `None`, probed again every [`LOST_PROBE_MS`]) while the
//! other GPUs keep being sampled. Other errors leave the value `None` and are logged once per
//! GPU and query.
//!
//! The `Nvml` handle is leaked on purpose: devices and the event set borrow it, and a sampler
//! lives as long as its process (this also avoids `nvmlShutdown` at exit).

mod events;
pub mod kmsg;
pub mod procfs;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, RetirementCause, TemperatureSensor,
};
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::{Device, Nvml};

use crate::model::{
    DeviceId, DeviceState, GpuSample, Metric, MetricValues, NvmlCall, ProcKind, ProcSample,
    Snapshot, Source, METRICS, METRIC_COUNT,
};

/// The NVML library loaded when nothing else is said.
pub const DEFAULT_NVML_LIB: &str = "libnvidia-ml.so.1";
/// File name of the simulated library that `--sim` looks for next to the executable.
pub const SIM_LIB_FILE: &str = "libnvml_sim.so";
/// Default process-list refresh period.
pub const DEFAULT_PROCESS_INTERVAL: Duration = Duration::from_secs(5);
/// How often a lost GPU is asked again whether it answers.
pub const LOST_PROBE_MS: i64 = 10_000;

/// How to open the sampler.
#[derive(Debug, Clone)]
pub struct SamplerConfig {
    /// Library to load; `None` = [`DEFAULT_NVML_LIB`] (or the simulated library with `sim`).
    pub nvml_lib: Option<PathBuf>,
    /// Scenario for the simulated library (`--sim`): sets `NVML_SIM_SCENARIO` before init.
    pub sim_scenario: Option<String>,
    /// Process-list refresh period (the list is also read at the first tick).
    pub process_interval: Duration,
    /// Register for XID events (drained at every tick).
    pub xid_events: bool,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            nvml_lib: None,
            sim_scenario: None,
            process_interval: DEFAULT_PROCESS_INTERVAL,
            xid_events: true,
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
    #[error("simulated NVML library not found at {}: build it with `cargo build -p nvml-sim` (or pass --nvml-lib PATH)", path.display())]
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

/// One NVML query; the unit of "supported or not" bookkeeping (several [`NvmlCall`]s can share
/// one, e.g. both retired-page counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Query {
    Utilization,
    Memory,
    Temperature,
    Fields,
    Power,
    PowerLimit,
    Energy,
    SmClock,
    MemClock,
    Throttle,
    Pstate,
    Fan,
    EccCorrected,
    EccUncorrected,
    PcieRx,
    PcieTx,
    PcieReplay,
    Encoder,
    Decoder,
    ComputeProcs,
    GraphicsProcs,
    RetiredPages,
    RetiredPending,
}

impl Query {
    fn bit(self) -> u32 {
        1 << (self as u8)
    }
}

/// Bit of metric `m` in a per-metric mask.
fn metric_bit(m: Metric) -> u64 {
    1 << (m as u8)
}

const _: () = assert!(METRIC_COUNT <= 64, "per-metric masks are u64");

/// The table's field rows, in table order: `(field id, metric, scale to canonical units)`. They
/// are read in one `nvmlDeviceGetFieldValues` call per GPU and tick, which saves one library call
/// per counter; a field the GPU does not support is dropped and its row's fallback call (if any)
/// is used instead (see `Slot::read`).
fn table_fields() -> impl Iterator<Item = (FieldId, Metric, f64)> {
    METRICS.iter().filter_map(|d| match d.source {
        Source::Field(f) => Some((FieldId(f.field.id), d.id, f.scale)),
        _ => None,
    })
}

/// Answers of multi-value calls, made once per GPU and tick however many rows read them.
#[derive(Default)]
struct TickAnswers {
    /// `(gpu, memory)` percent of `nvmlDeviceGetUtilizationRates`.
    utilization: Option<Option<[f64; 2]>>,
    /// `(used, free, total, reserved)` bytes of `nvmlDeviceGetMemoryInfo_v2`.
    memory: Option<Option<[f64; 4]>>,
    /// Queries that already failed at this tick (not asked again until the next one).
    failed: u32,
}

/// Per-GPU state kept between ticks.
struct Slot {
    handle: Option<Device<'static>>,
    id: DeviceId,
    state: DeviceState,
    /// Queries that answered NotSupported (never asked again).
    unsupported: u32,
    /// Queries whose transient failure was already logged.
    warned: u32,
    /// Field IDs still worth asking for, with the metric each feeds and its scale.
    fields: Vec<FieldId>,
    field_rows: Vec<(Metric, f64)>,
    /// Metrics whose field is still in `fields` (a per-metric mask).
    field_metrics: u64,
    /// When a lost device was last probed.
    lost_probe_ms: i64,
}

/// Marker: the device answered GpuLost / ResetRequired.
struct Lost;

impl Slot {
    /// Runs one query unless it is known unsupported (or already failed at this tick), mapping
    /// errors to `None` or [`Lost`].
    fn query<T>(
        &mut self,
        q: Query,
        tick: &mut TickAnswers,
        f: impl FnOnce(&Device<'static>) -> Result<T, NvmlError>,
    ) -> Result<Option<T>, Lost> {
        if (self.unsupported | tick.failed) & q.bit() != 0 {
            return Ok(None);
        }
        let Some(dev) = self.handle.as_ref() else {
            return Err(Lost);
        };
        match f(dev) {
            Ok(v) => Ok(Some(v)),
            Err(e) => {
                tick.failed |= q.bit();
                self.failed(q, &e).map(|()| None)
            }
        }
    }

    fn failed(&mut self, q: Query, e: &NvmlError) -> Result<(), Lost> {
        match e {
            NvmlError::GpuLost | NvmlError::ResetRequired => Err(Lost),
            NvmlError::NotSupported
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::FunctionNotFound
            | NvmlError::NoPermission
            | NvmlError::InvalidArg => {
                tracing::debug!(
                    "GPU {}: {q:?} not available ({e}); not asked again",
                    self.id.index
                );
                self.unsupported |= q.bit();
                Ok(())
            }
            NvmlError::NotFound | NvmlError::NoData => Ok(()),
            _ => {
                if self.warned & q.bit() == 0 {
                    self.warned |= q.bit();
                    tracing::warn!("GPU {}: reading {q:?} failed: {e}", self.id.index);
                }
                Ok(())
            }
        }
    }

    /// Whether `m`'s field is still read through field values (else its fallback call is used).
    fn field_active(&self, m: Metric) -> bool {
        self.unsupported & Query::Fields.bit() == 0 && self.field_metrics & metric_bit(m) != 0
    }

    /// Reads every metric of the table into `values`, each through its row's [`Source`]: the
    /// batched field-values call first, then one reader per [`NvmlCall`] in table order, then
    /// the derived rows.
    fn read(&mut self, values: &mut MetricValues) -> Result<(), Lost> {
        let mut tick = TickAnswers::default();
        self.read_fields(values, &mut tick)?;
        for d in METRICS {
            match d.source {
                Source::Nvml(call) => values.set(d.id, self.read_call(call, &mut tick)?),
                Source::Field(f) => {
                    if let Some(call) = f.fallback.filter(|_| !self.field_active(d.id)) {
                        values.set(d.id, self.read_call(call, &mut tick)?);
                    }
                }
                Source::Derived(_) => {}
                Source::Host(h) => match h {},
            }
        }
        for d in METRICS {
            if let Source::Derived(how) = d.source {
                let v = (how.compute)(values);
                values.set(d.id, v);
            }
        }
        Ok(())
    }

    /// The reader of one [`NvmlCall`]: the value in canonical units, `None` when the GPU cannot
    /// give it.
    fn read_call(&mut self, call: NvmlCall, tick: &mut TickAnswers) -> Result<Option<f64>, Lost> {
        use NvmlCall as C;
        let v = match call {
            C::UtilizationGpu | C::UtilizationMemory => {
                if tick.utilization.is_none() {
                    let u = self.query(Query::Utilization, tick, Device::utilization_rates)?;
                    tick.utilization = Some(u.map(|u| [f64::from(u.gpu), f64::from(u.memory)]));
                }
                let part = usize::from(call == C::UtilizationMemory);
                tick.utilization.flatten().map(|u| u[part])
            }
            C::MemoryUsed | C::MemoryFree | C::MemoryTotal | C::MemoryReserved => {
                if tick.memory.is_none() {
                    let m = self.query(Query::Memory, tick, Device::memory_info)?;
                    tick.memory =
                        Some(m.map(|m| [m.used, m.free, m.total, m.reserved].map(|b| b as f64)));
                }
                let part = match call {
                    C::MemoryUsed => 0,
                    C::MemoryFree => 1,
                    C::MemoryTotal => 2,
                    _ => 3,
                };
                tick.memory.flatten().map(|m| m[part])
            }
            C::TemperatureGpu => self
                .query(Query::Temperature, tick, |d| {
                    d.temperature(TemperatureSensor::Gpu)
                })?
                .map(f64::from),
            C::PowerUsage => self
                .query(Query::Power, tick, Device::power_usage)?
                .map(|mw| f64::from(mw) / 1000.0),
            C::EnforcedPowerLimit => self
                .query(Query::PowerLimit, tick, Device::enforced_power_limit)?
                .map(|mw| f64::from(mw) / 1000.0),
            C::TotalEnergyConsumption => self
                .query(Query::Energy, tick, Device::total_energy_consumption)?
                .map(|mj| mj as f64 / 1000.0),
            C::ClockSm => self
                .query(Query::SmClock, tick, |d| d.clock_info(Clock::SM))?
                .map(f64::from),
            C::ClockMem => self
                .query(Query::MemClock, tick, |d| d.clock_info(Clock::Memory))?
                .map(f64::from),
            C::ClockEventReasons => self
                .query(Query::Throttle, tick, Device::current_throttle_reasons)?
                .map(|r| r.bits() as f64),
            C::PerformanceState => self
                .query(Query::Pstate, tick, Device::performance_state)?
                .map(|p| p.as_c())
                .filter(|&c| c <= 15)
                .map(f64::from),
            C::FanSpeed => self
                .query(Query::Fan, tick, |d| d.fan_speed(0))?
                .map(f64::from),
            C::EccCorrectedVolatile => self
                .query(Query::EccCorrected, tick, |d| {
                    d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
                })?
                .map(|c| c as f64),
            C::EccUncorrectedVolatile => self
                .query(Query::EccUncorrected, tick, |d| {
                    d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                })?
                .map(|c| c as f64),
            // Pre-Ampere GPUs answer; newer ones say NotSupported once (for both causes).
            C::RetiredPagesSbe => self
                .query(Query::RetiredPages, tick, |d| {
                    d.retired_pages(RetirementCause::MultipleSingleBitEccErrors)
                })?
                .map(|p| p.len() as f64),
            C::RetiredPagesDbe => self
                .query(Query::RetiredPages, tick, |d| {
                    d.retired_pages(RetirementCause::DoubleBitEccError)
                })?
                .map(|p| p.len() as f64),
            C::RetiredPagesPending => self
                .query(
                    Query::RetiredPending,
                    tick,
                    Device::are_pages_pending_retired,
                )?
                .map(|p| f64::from(u8::from(p))),
            // NVML reports PCIe throughput in KB/s; like nvitop we read KB as KiB.
            C::PcieRx => self
                .query(Query::PcieRx, tick, |d| {
                    d.pcie_throughput(PcieUtilCounter::Receive)
                })?
                .map(|kb| f64::from(kb) * 1024.0),
            C::PcieTx => self
                .query(Query::PcieTx, tick, |d| {
                    d.pcie_throughput(PcieUtilCounter::Send)
                })?
                .map(|kb| f64::from(kb) * 1024.0),
            C::PcieReplayCounter => self
                .query(Query::PcieReplay, tick, Device::pcie_replay_counter)?
                .map(f64::from),
            C::EncoderUtilization => self
                .query(Query::Encoder, tick, Device::encoder_utilization)?
                .map(|u| f64::from(u.utilization)),
            C::DecoderUtilization => self
                .query(Query::Decoder, tick, Device::decoder_utilization)?
                .map(|u| f64::from(u.utilization)),
        };
        Ok(v)
    }

    /// The one field-values call of the tick: sets every metric whose field is still asked for.
    fn read_fields(
        &mut self,
        values: &mut MetricValues,
        tick: &mut TickAnswers,
    ) -> Result<(), Lost> {
        if self.fields.is_empty() || self.unsupported & Query::Fields.bit() != 0 {
            return Ok(());
        }
        let Some(dev) = self.handle.as_ref() else {
            return Err(Lost);
        };
        let samples = match dev.field_values_for(&self.fields) {
            Ok(s) => s,
            Err(e) => {
                tick.failed |= Query::Fields.bit();
                return self.failed(Query::Fields, &e);
            }
        };
        let mut drop_mask: u64 = 0;
        for (i, sample) in samples.into_iter().enumerate() {
            let Some(&(metric, scale)) = self.field_rows.get(i) else {
                break;
            };
            let value = match sample.and_then(|s| s.value) {
                Ok(SampleValue::F64(v)) => Some(v * scale),
                Ok(SampleValue::U32(v)) => Some(f64::from(v) * scale),
                Ok(SampleValue::U64(v)) => Some(v as f64 * scale),
                Ok(SampleValue::I64(v)) => Some(v as f64 * scale),
                Err(NvmlError::GpuLost | NvmlError::ResetRequired) => return Err(Lost),
                Err(NvmlError::NotSupported | NvmlError::InvalidArg | NvmlError::NoPermission) => {
                    tracing::debug!(
                        "GPU {}: field {} ({}) not supported; not asked again",
                        self.id.index,
                        self.fields[i].0,
                        metric.key()
                    );
                    drop_mask |= 1 << i;
                    None
                }
                Err(_) => None,
            };
            values.set(metric, value);
        }
        if drop_mask != 0 {
            let mut i = 0;
            self.fields.retain(|_| {
                let keep = drop_mask & (1 << i) == 0;
                i += 1;
                keep
            });
            let mut i = 0;
            self.field_rows.retain(|_| {
                let keep = drop_mask & (1 << i) == 0;
                i += 1;
                keep
            });
            self.field_metrics = self
                .field_rows
                .iter()
                .fold(0, |mask, (m, _)| mask | metric_bit(*m));
        }
        Ok(())
    }

    fn processes(&mut self, out: &mut Vec<(ProcessInfo, ProcKind)>) -> Result<(), Lost> {
        let tick = &mut TickAnswers::default();
        if let Some(list) =
            self.query(Query::ComputeProcs, tick, Device::running_compute_processes)?
        {
            out.extend(list.into_iter().map(|p| (p, ProcKind::Compute)));
        }
        if let Some(list) = self.query(
            Query::GraphicsProcs,
            tick,
            Device::running_graphics_processes,
        )? {
            for p in list {
                if !out.iter().any(|(q, _)| q.pid == p.pid) {
                    out.push((p, ProcKind::Graphics));
                }
            }
        }
        Ok(())
    }

    fn mark_lost(&mut self, now_ms: i64) {
        if self.state != DeviceState::Lost {
            tracing::error!(
                "GPU {} ({}) is lost (fallen off the bus or needs a reset); other GPUs keep being sampled",
                self.id.index,
                self.id.uuid
            );
        }
        self.state = DeviceState::Lost;
        self.lost_probe_ms = now_ms;
    }
}

/// Samples every GPU through NVML. Not `Sync`: one thread owns it (the daemon runs it on its
/// sampling thread and sends snapshots over a channel).
pub struct Sampler {
    nvml: &'static Nvml,
    slots: Vec<Slot>,
    xids: Option<events::XidListener>,
    /// What cannot be watched (see [`Sampler::degraded`]).
    degraded: Vec<String>,
    process_interval_ms: i64,
    last_process_ms: Option<i64>,
    proc_cache: procfs::ProcCache,
    lib: String,
    driver_version: Option<String>,
    scratch: Vec<(ProcessInfo, ProcKind)>,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler")
            .field("lib", &self.lib)
            .field("devices", &self.slots.len())
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
        if !path.exists() {
            return Err(SamplerError::NoSimLibrary { path });
        }
        return Ok(path);
    }
    Ok(PathBuf::from(DEFAULT_NVML_LIB))
}

impl Sampler {
    /// Loads NVML, enumerates the GPUs and (if configured) registers for XID events.
    pub fn open(cfg: &SamplerConfig) -> Result<Sampler, SamplerError> {
        let path = library_path(cfg)?;
        let lib = path.display().to_string();
        if let Some(s) = &cfg.sim_scenario {
            // Set before init, while no other thread of ours reads the environment.
            std::env::set_var("NVML_SIM_SCENARIO", s);
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
        let now = now_ms();
        let mut slots = Vec::with_capacity(count as usize);
        for index in 0..count {
            slots.push(Self::open_slot(nvml, index, now));
        }
        let mut degraded = Vec::new();
        let xids = if cfg.xid_events {
            let regs: Vec<(&Device<'static>, u32, &str)> = slots
                .iter()
                .filter(|s| s.state == DeviceState::Ok)
                .filter_map(|s| Some((s.handle.as_ref()?, s.id.index, s.id.uuid.as_str())))
                .collect();
            let listener = events::XidListener::start(nvml, &regs, &mut degraded);
            for m in &degraded {
                tracing::warn!("{m}: XIDs (79 fallen off the bus, 94/95 memory errors, …) on it will not be reported");
            }
            listener
        } else {
            None
        };
        Ok(Sampler {
            nvml,
            slots,
            xids,
            degraded,
            process_interval_ms: i64::try_from(cfg.process_interval.as_millis())
                .unwrap_or(i64::MAX),
            last_process_ms: None,
            proc_cache: procfs::ProcCache::default(),
            lib,
            driver_version,
            scratch: Vec::new(),
        })
    }

    fn open_slot(nvml: &'static Nvml, index: u32, now: i64) -> Slot {
        let mut slot = Slot {
            handle: None,
            id: DeviceId {
                index,
                ..DeviceId::default()
            },
            state: DeviceState::Ok,
            unsupported: 0,
            warned: 0,
            fields: table_fields().map(|(f, _, _)| f).collect(),
            field_rows: table_fields().map(|(_, m, scale)| (m, scale)).collect(),
            field_metrics: table_fields().fold(0, |mask, (_, m, _)| mask | metric_bit(m)),
            lost_probe_ms: now,
        };
        if !Self::attach(nvml, &mut slot) {
            tracing::warn!("GPU {index} does not answer (lost); the others are sampled");
            slot.state = DeviceState::Lost;
        }
        slot
    }

    /// Gets the handle and identity of `slot`'s device; false when the device is lost.
    fn attach(nvml: &'static Nvml, slot: &mut Slot) -> bool {
        let index = slot.id.index;
        match nvml.device_by_index(index) {
            Ok(dev) => slot.handle = Some(dev),
            Err(e) => {
                tracing::debug!("GPU {index}: no handle: {e}");
                return false;
            }
        }
        let Some(dev) = slot.handle.as_ref() else {
            return false;
        };
        let mut lost = false;
        let mut note = |r: Result<(), NvmlError>| {
            if let Err(e) = r {
                if matches!(e, NvmlError::GpuLost | NvmlError::ResetRequired) {
                    lost = true;
                } else {
                    tracing::debug!("GPU {index}: identity incomplete: {e}");
                }
            }
        };
        note(dev.uuid().map(|u| slot.id.uuid = u));
        note(dev.name().map(|n| slot.id.name = n));
        note(dev.pci_info().map(|p| slot.id.pci_bus_id = p.bus_id));
        note(dev.minor_number().map(|m| slot.id.minor = Some(m)));
        !lost
    }

    /// What this sampler cannot watch, one line each (e.g. GPUs without XID events); empty when
    /// everything is monitored.
    pub fn degraded(&self) -> &[String] {
        &self.degraded
    }

    /// Identities of all GPUs, in NVML index order.
    pub fn devices(&self) -> Vec<DeviceId> {
        self.slots.iter().map(|s| s.id.clone()).collect()
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

    /// Takes one snapshot now.
    pub fn sample(&mut self) -> Snapshot {
        self.sample_at(now_ms())
    }

    /// Takes one snapshot stamped `time_ms`. The process list is refreshed at the first call and
    /// then whenever the process interval has passed.
    pub fn sample_at(&mut self, time_ms: i64) -> Snapshot {
        let xids = self
            .xids
            .as_mut()
            .map(|x| x.drain(time_ms))
            .unwrap_or_default();
        let mut gpus = Vec::with_capacity(self.slots.len());
        for slot in &mut self.slots {
            let mut values = MetricValues::default();
            if slot.state == DeviceState::Lost && time_ms - slot.lost_probe_ms >= LOST_PROBE_MS {
                slot.lost_probe_ms = time_ms;
                let answers = match slot.handle.as_ref() {
                    Some(d) => d.temperature(TemperatureSensor::Gpu).is_ok(),
                    None => Self::attach(self.nvml, slot),
                };
                if answers {
                    tracing::warn!("GPU {} answers again", slot.id.index);
                    slot.state = DeviceState::Ok;
                }
            }
            if slot.state == DeviceState::Ok && slot.read(&mut values).is_err() {
                slot.mark_lost(time_ms);
                values = MetricValues::default();
            }
            gpus.push(GpuSample {
                time_ms,
                id: slot.id.clone(),
                state: slot.state,
                values,
            });
        }
        let due = self
            .last_process_ms
            .is_none_or(|last| time_ms - last >= self.process_interval_ms);
        let processes = due.then(|| {
            self.last_process_ms = Some(time_ms);
            self.read_processes(time_ms)
        });
        // A device found lost while listing processes shows as lost from the next tick on.
        Snapshot {
            time_ms,
            gpus,
            processes,
            xids,
        }
    }

    fn read_processes(&mut self, time_ms: i64) -> Vec<ProcSample> {
        let mut out = Vec::new();
        for slot in &mut self.slots {
            if slot.state != DeviceState::Ok {
                continue;
            }
            self.scratch.clear();
            if slot.processes(&mut self.scratch).is_err() {
                slot.mark_lost(time_ms);
                continue;
            }
            for (p, kind) in self.scratch.drain(..) {
                // One process often holds every GPU: read /proc once per refresh.
                let d = match out.iter().find(|q: &&ProcSample| q.pid == p.pid) {
                    Some(q) => procfs::ProcDetails {
                        uid: q.uid,
                        user: q.user.clone(),
                        command: q.command.clone(),
                        container: q.container.clone(),
                        runtime_s: q.runtime_s,
                    },
                    None => self.proc_cache.lookup(p.pid),
                };
                out.push(ProcSample {
                    pid: p.pid,
                    gpu_index: slot.id.index,
                    gpu_uuid: slot.id.uuid.clone(),
                    used_mem_bytes: match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => Some(b),
                        UsedGpuMemory::Unavailable => None,
                    },
                    kind,
                    uid: d.uid,
                    user: d.user,
                    command: d.command,
                    container: d.container,
                    runtime_s: d.runtime_s,
                });
            }
        }
        let alive: Vec<u32> = out.iter().map(|p| p.pid).collect();
        self.proc_cache.retain(&alive);
        out
    }
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

    /// Every row is read: NVML calls by `Slot::read_call`, fields by the one field-values call
    /// (all of them batched), derived rows after the reads.
    #[test]
    fn every_row_is_read_through_its_source() {
        let fields: Vec<Metric> = table_fields().map(|(_, m, _)| m).collect();
        for d in METRICS {
            match d.source {
                Source::Field(_) => assert!(fields.contains(&d.id), "{}", d.key),
                Source::Nvml(_) | Source::Derived(_) => assert!(!fields.contains(&d.id)),
                Source::Host(h) => match h {},
            }
        }
        assert_eq!(
            fields.len(),
            METRICS
                .iter()
                .filter(|d| matches!(d.source, Source::Field(_)))
                .count()
        );
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
}
