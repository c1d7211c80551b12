//! One device's NVML reads: the fast path ([`Slot`]: everything read at every tick, in one
//! field-values call and the cheap getters, and on GPUs with GPM one GPM sample into one of two
//! samples allocated once and one metrics call for every GPM row — see [`Gpm`]) and the slow path ([`SlowSlot`]: process lists and
//! calls that block for long on real drivers, read on the slower process cadence). Each runs on
//! its own worker thread (see `worker`), so neither waits for the other, and every call is
//! bracketed by the thread's [`Busy`] marker so the sampler can tell a call that hangs.

use std::sync::Arc;

use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, RetirementCause, TemperatureSensor,
    TemperatureThreshold,
};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::{Device, GpmSample, Nvml};
use nvml_wrapper_sys::bindings::{
    nvmlGpmMetricsGet_t, nvmlReturn_enum_NVML_ERROR_UNKNOWN as NVML_ERROR_UNKNOWN,
    nvmlReturn_enum_NVML_SUCCESS as NVML_SUCCESS, NVML_GPM_METRICS_GET_VERSION,
};

use super::mig::{ReadSpacing, SamplePair};
use super::worker::Busy;
use super::GpmStatus;
use crate::model::{
    DeviceId, DeviceState, GpmMetric, Metric, MetricValues, NvmlCall, NvmlFunction, ProcKind,
    Source, METRICS, METRIC_COUNT,
};

/// One NVML query; the unit of "supported or not" bookkeeping (several [`NvmlCall`]s can share
/// one, e.g. both retired-page counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Query {
    Utilization,
    Memory,
    Temperature,
    TempThreshold,
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
    pub(super) fn bit(self) -> u32 {
        1 << (self as u8)
    }

    /// The NVML function this query calls.
    fn function(self) -> NvmlFunction {
        use NvmlFunction as F;
        match self {
            Query::Utilization => F::UtilizationRates,
            Query::Memory => F::MemoryInfo,
            Query::Temperature => F::Temperature,
            Query::TempThreshold => F::TemperatureThreshold,
            Query::Fields => F::FieldValues,
            Query::Power => F::PowerUsage,
            Query::PowerLimit => F::EnforcedPowerLimit,
            Query::Energy => F::TotalEnergyConsumption,
            Query::SmClock | Query::MemClock => F::ClockInfo,
            Query::Throttle => F::ClocksEventReasons,
            Query::Pstate => F::PerformanceState,
            Query::Fan => F::FanSpeed,
            Query::EccCorrected | Query::EccUncorrected => F::TotalEccErrors,
            Query::PcieRx | Query::PcieTx => F::PcieThroughput,
            Query::PcieReplay => F::PcieReplayCounter,
            Query::Encoder => F::EncoderUtilization,
            Query::Decoder => F::DecoderUtilization,
            Query::ComputeProcs => F::ComputeRunningProcesses,
            Query::GraphicsProcs => F::GraphicsRunningProcesses,
            Query::RetiredPages => F::RetiredPages,
            Query::RetiredPending => F::RetiredPagesPendingStatus,
        }
    }
}

/// Bit of metric `m` in a per-metric mask.
pub(super) fn metric_bit(m: Metric) -> u64 {
    1 << (m as u8)
}

/// The metrics of a per-metric mask, in table order, by its set bits only.
pub(super) fn mask_metrics(mask: u64) -> impl Iterator<Item = Metric> {
    let mut left = mask;
    std::iter::from_fn(move || {
        while left != 0 {
            let i = left.trailing_zeros() as usize;
            left &= left - 1;
            // (the inverse of `metric_bit`: a metric's bit is its table position)
            if let Some(d) = METRICS.get(i) {
                return Some(d.id);
            }
        }
        None
    })
}

const _: () = assert!(METRIC_COUNT <= 64, "per-metric masks are u64");

/// Which of the table's field rows a [`Slot`] reads: the tick path's, or the slow ones
/// ([`crate::model::FieldSource::slow`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Path {
    Fast,
    Slow,
}

/// The table's field rows of `path`, in table order. They are read in one
/// `nvmlDeviceGetFieldValues` call per GPU and read, which saves one library call per counter; a
/// field the GPU does not support is dropped and its row's fallback call (if any) is used instead
/// (see `Slot::read`).
pub(super) fn table_fields(path: Path) -> impl Iterator<Item = FieldRow> {
    METRICS.iter().filter_map(move |d| match d.source {
        Source::Field(f) if f.slow == (path == Path::Slow) => Some(FieldRow {
            id: FieldId(f.field.id),
            metric: d.id,
            scale: f.scale,
            rate: f.rate,
            prev: None,
        }),
        _ => None,
    })
}

/// The shortest window a counter's rate is taken over, µs. A real driver's PCIe byte counters move
/// in steps: on an H200 two readings a few ms apart gave 22 MB/s on an idle link that read
/// 0.05 MB/s over 5 s (`tests/fixtures/real/`). Half a second, so that a process interval of a
/// second always gives a window.
pub(super) const RATE_MIN_WINDOW_US: i64 = 500_000;

/// One field of the batched call.
#[derive(Debug, Clone)]
pub(super) struct FieldRow {
    pub id: FieldId,
    pub metric: Metric,
    /// Factor to the canonical unit.
    pub scale: f64,
    /// The metric is the per-second rate of this cumulative counter.
    pub rate: bool,
    /// For a rate: the previous raw reading and its timestamp (µs).
    prev: Option<(f64, i64)>,
}

impl FieldRow {
    /// The metric's value for a raw reading taken at `at_us`: the reading scaled, or for a rate
    /// the scaled per-second change since the previous reading (none for the first reading, or
    /// when the counter went backwards: it wrapped or the driver was reloaded). A reading less
    /// than [`RATE_MIN_WINDOW_US`] after the previous one gives no rate and keeps the previous
    /// one, so the next window is long enough.
    fn value(&mut self, raw: f64, at_us: i64) -> Option<f64> {
        if !self.rate {
            return Some(raw * self.scale);
        }
        if let Some((p, pt)) = self.prev {
            if raw >= p && at_us >= pt && at_us - pt < RATE_MIN_WINDOW_US {
                return None;
            }
        }
        let prev = self.prev.replace((raw, at_us));
        let (p, pt) = prev?;
        let dt = (at_us - pt) as f64 / 1e6;
        (raw >= p && dt > 0.0).then(|| (raw - p) * self.scale / dt)
    }
}

/// Answers of multi-value calls, made once per GPU and tick however many rows read them.
#[derive(Default)]
pub(super) struct TickAnswers {
    /// `(gpu, memory)` percent of `nvmlDeviceGetUtilizationRates`.
    utilization: Option<Option<[f64; 2]>>,
    /// `(used, free, total, reserved)` bytes of `nvmlDeviceGetMemoryInfo_v2`.
    memory: Option<Option<[f64; 4]>>,
    /// Queries that already failed at this tick (not asked again until the next one).
    failed: u32,
}

/// Per-GPU state kept between ticks, owned by the device's worker thread.
pub(super) struct Slot {
    pub handle: Option<Device<'static>>,
    pub id: DeviceId,
    /// Bumped whenever `id` may have changed (at each [`Slot::attach`]): whoever passes the
    /// identity on compares this, not the strings, at each tick.
    pub(super) id_version: u64,
    pub state: DeviceState,
    /// Queries that answered NotSupported (never asked again).
    pub(super) unsupported: u32,
    /// Queries whose transient failure was already logged.
    warned: u32,
    /// Field IDs still worth asking for, and the row each feeds (same order).
    fields: Vec<FieldId>,
    field_rows: Vec<FieldRow>,
    /// Metrics whose field is still in `fields` (a per-metric mask).
    field_metrics: u64,
    /// When a lost device was last probed.
    lost_probe_ms: i64,
    /// Which call this slot's thread is in (read by the sampler for its deadline).
    pub(super) busy: Arc<Busy>,
    /// GPM (the fast path only, unless turned off): its status, and its samples once set up.
    pub(super) gpm: Gpm,
}

/// Marker: the device answered GpuLost / ResetRequired.
pub(super) struct Lost;

impl Slot {
    /// A slot for device `index` reading the field rows of `path`, not attached yet.
    pub(super) fn new(index: u32, now_ms: i64, busy: Arc<Busy>, path: Path) -> Slot {
        Slot {
            handle: None,
            id: DeviceId {
                index,
                ..DeviceId::default()
            },
            id_version: 0,
            state: DeviceState::Ok,
            unsupported: 0,
            warned: 0,
            fields: table_fields(path).map(|r| r.id).collect(),
            field_rows: table_fields(path).collect(),
            field_metrics: table_fields(path).fold(0, |mask, r| mask | metric_bit(r.metric)),
            lost_probe_ms: now_ms,
            busy,
            gpm: Gpm::off(),
        }
    }

    /// Gets the handle and identity of the device; false when it is lost.
    pub(super) fn attach(&mut self, nvml: &'static Nvml) -> bool {
        let index = self.id.index;
        let busy = self.busy.clone();
        match busy.call(NvmlFunction::HandleByIndex, || nvml.device_by_index(index)) {
            Ok(dev) => self.handle = Some(dev),
            Err(e) => {
                tracing::debug!("GPU {index}: no handle: {e}");
                return false;
            }
        }
        let Some(dev) = self.handle.as_ref() else {
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
        self.id_version += 1;
        let id = &mut self.id;
        note(busy.call(NvmlFunction::Uuid, || dev.uuid().map(|u| id.uuid = u)));
        note(busy.call(NvmlFunction::Name, || dev.name().map(|n| id.name = n)));
        note(busy.call(NvmlFunction::PciInfo, || {
            dev.pci_info().map(|p| id.pci_bus_id = p.bus_id)
        }));
        note(busy.call(NvmlFunction::MinorNumber, || {
            dev.minor_number().map(|m| id.minor = Some(m))
        }));
        !lost
    }

    /// Reads the fast path into `values` at `time_ms`, probing a lost device again every
    /// [`LOST_PROBE_MS`](super::LOST_PROBE_MS). Returns the device's state.
    pub(super) fn tick(
        &mut self,
        nvml: &'static Nvml,
        time_ms: i64,
        values: &mut MetricValues,
    ) -> DeviceState {
        let since = time_ms - self.lost_probe_ms;
        // (a wall clock stepped back probes at once rather than after the step)
        if self.state == DeviceState::Lost && !(0..super::LOST_PROBE_MS).contains(&since) {
            self.lost_probe_ms = time_ms;
            let busy = self.busy.clone();
            let answers = match self.handle.as_ref() {
                Some(d) => busy
                    .call(NvmlFunction::Temperature, || {
                        d.temperature(TemperatureSensor::Gpu)
                    })
                    .is_ok(),
                None => self.attach(nvml),
            };
            if answers {
                tracing::warn!("GPU {} answers again", self.id.index);
                self.state = DeviceState::Ok;
            }
        }
        if self.state == DeviceState::Ok && self.read(nvml, values).is_err() {
            self.mark_lost(time_ms);
            // its GPM samples are of a GPU that is gone: the first reading after it answers
            // again starts afresh
            self.gpm.forget();
            *values = MetricValues::default();
        }
        self.state
    }

    /// Metrics whose value comes from the slow path (off the tick path): rows whose call is
    /// slow, slow field rows, and field rows with a slow fallback once the field is known
    /// unsupported.
    pub(super) fn slow_metrics(&self) -> u64 {
        METRICS.iter().fold(0, |mask, d| {
            let slow = d.source.is_slow()
                || matches!(d.source, Source::Field(f)
                    if f.fallback.is_some_and(NvmlCall::is_slow) && !self.field_active(d.id));
            if slow {
                mask | metric_bit(d.id)
            } else {
                mask
            }
        })
    }
    /// Runs one query unless it is known unsupported (or already failed at this tick), mapping
    /// errors to `None` or [`Lost`].
    pub(super) fn query<T>(
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
        match self.busy.call(q.function(), || f(dev)) {
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
                    tracing::warn!(
                        "GPU {}: {} failed: {e}",
                        self.id.index,
                        q.function().symbol()
                    );
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
    /// the GPM rows (one sample and one metrics call for all of them), then the derived rows.
    /// Slow calls are left to the slow path (see [`Slot::slow_metrics`]).
    fn read(&mut self, nvml: &'static Nvml, values: &mut MetricValues) -> Result<(), Lost> {
        let mut tick = TickAnswers::default();
        self.read_fields(values, &mut tick, 0)?;
        for d in METRICS {
            match d.source {
                Source::Nvml(call) if call.is_slow() => {}
                Source::Nvml(call) => values.set(d.id, self.read_call(call, &mut tick)?),
                Source::Field(f) => {
                    let fallback = f.fallback.filter(|c| !c.is_slow());
                    if let Some(call) = fallback.filter(|_| !self.field_active(d.id)) {
                        values.set(d.id, self.read_call(call, &mut tick)?);
                    }
                }
                Source::Gpm(_) | Source::Derived(_) | Source::Nvlink(_) => {}
                Source::Host(h) => match h {},
            }
        }
        self.read_gpm(nvml, values)?;
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
    pub(super) fn read_call(
        &mut self,
        call: NvmlCall,
        tick: &mut TickAnswers,
    ) -> Result<Option<f64>, Lost> {
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
            C::TemperatureSlowdown => self
                .query(Query::TempThreshold, tick, |d| {
                    d.temperature_threshold(TemperatureThreshold::Slowdown)
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

    /// The one field-values call of the read: sets every metric whose field is still asked for,
    /// except those in `skip` (a per-metric mask).
    pub(super) fn read_fields(
        &mut self,
        values: &mut MetricValues,
        tick: &mut TickAnswers,
        skip: u64,
    ) -> Result<(), Lost> {
        if self.fields.is_empty() || self.unsupported & Query::Fields.bit() != 0 {
            return Ok(());
        }
        let Some(dev) = self.handle.as_ref() else {
            return Err(Lost);
        };
        // The rows asked for, by position (all of them, without allocating, on the tick path).
        let picked: Option<Vec<usize>> = (skip & self.field_metrics != 0).then(|| {
            (0..self.field_rows.len())
                .filter(|&i| skip & metric_bit(self.field_rows[i].metric) == 0)
                .collect()
        });
        let subset: Vec<FieldId>;
        let fields: &[FieldId] = match &picked {
            None => &self.fields,
            Some(p) if p.is_empty() => return Ok(()),
            Some(p) => {
                subset = p.iter().map(|&i| FieldId(self.fields[i].0)).collect();
                &subset
            }
        };
        let answer = self
            .busy
            .call(NvmlFunction::FieldValues, || dev.field_values_for(fields));
        let now_us = crate::sys::now_ms() * 1000;
        let samples = match answer {
            Ok(s) => s,
            Err(e) => {
                tick.failed |= Query::Fields.bit();
                return self.failed(Query::Fields, &e);
            }
        };
        let mut drop_mask: u64 = 0;
        for (k, sample) in samples.into_iter().enumerate() {
            let Some(i) = picked.as_ref().map_or(Some(k), |p| p.get(k).copied()) else {
                break;
            };
            let Some(row) = self.field_rows.get_mut(i) else {
                break;
            };
            let metric = row.metric;
            let (at_us, value) = match sample {
                Ok(s) => (if s.timestamp > 0 { s.timestamp } else { now_us }, s.value),
                Err(e) => (now_us, Err(e)),
            };
            let value = match value {
                Ok(SampleValue::F64(v)) => row.value(v, at_us),
                Ok(SampleValue::U32(v)) => row.value(f64::from(v), at_us),
                Ok(SampleValue::U64(v)) => row.value(v as f64, at_us),
                Ok(SampleValue::I64(v)) => row.value(v as f64, at_us),
                Err(NvmlError::GpuLost | NvmlError::ResetRequired) => return Err(Lost),
                Err(NvmlError::NotSupported | NvmlError::InvalidArg | NvmlError::NoPermission) => {
                    tracing::debug!(
                        "GPU {}: field {} ({}) not supported; not asked again",
                        self.id.index,
                        row.id.0,
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
                .fold(0, |mask, r| mask | metric_bit(r.metric));
        }
        Ok(())
    }

    /// The GPM rows: at the first read, whether the GPU has GPM and two samples for it; then at
    /// every read one sample into the older buffer and the metrics between it and the newer
    /// one. A GPU without GPM is not asked again; a failing call (GPM held by another client, …)
    /// leaves the rows absent and is tried again at the next read.
    fn read_gpm(&mut self, nvml: &'static Nvml, values: &mut MetricValues) -> Result<(), Lost> {
        let Some(dev) = self.handle.as_ref() else {
            return Err(Lost);
        };
        let index = self.id.index;
        if self.gpm.status == GpmStatus::Unknown {
            self.gpm.set_up(nvml, dev, &self.busy, index)?;
        }
        let now = std::time::Instant::now();
        let min_window = self.gpm.min_window(now);
        // a read due within half a tick of the cadence takes its sample
        let window = min_window.max(self.gpm.every.saturating_sub(min_window));
        let keep = self.gpm.every * 2 + std::time::Duration::from_secs(1);
        let Some(st) = self.gpm.state.as_mut() else {
            return Ok(());
        };
        // too soon after the last sample (the read at the sampler's start, a late tick, a read
        // between two samples of a slower cadence): no sample; the last reading while current,
        // else the rows absent; the next sample measures from the last one
        let Some(cur) = st.samples.next(now, window) else {
            if let Some((at, last)) = &st.last {
                if now.saturating_duration_since(*at) <= keep {
                    for (metric, _) in gpm_rows() {
                        values.set(metric, last.get(metric));
                    }
                }
            }
            return Ok(());
        };
        let got = self.busy.call(NvmlFunction::GpmSampleGet, || {
            gpm_sample_get(nvml, dev, st.samples.sample(cur))
        });
        let answer = got.and_then(|()| {
            let Some(prev) = st.samples.filled(cur, now) else {
                return Ok(false);
            };
            self.busy
                .call(NvmlFunction::GpmMetricsGet, || {
                    st.request
                        .get(nvml, st.samples.sample(prev), st.samples.sample(cur))
                })
                .map(|()| true)
        });
        match answer {
            Ok(have) => {
                if have {
                    st.request.put(values);
                    if !self.gpm.every.is_zero() {
                        let mut last = MetricValues::default();
                        for (metric, _) in gpm_rows() {
                            last.set(metric, values.get(metric));
                        }
                        st.last = Some((now, last));
                    }
                }
                if matches!(self.gpm.status, GpmStatus::Failing(_)) {
                    tracing::info!("GPU {index}: GPM answers again");
                }
                self.gpm.status = GpmStatus::Active;
                Ok(())
            }
            Err(NvmlError::GpuLost | NvmlError::ResetRequired) => Err(Lost),
            Err(
                e @ (NvmlError::NotSupported
                | NvmlError::FunctionNotFound
                | NvmlError::FailedToLoadSymbol(_)),
            ) => {
                tracing::info!("GPU {index}: GPM not available ({e}); its metrics are absent");
                self.gpm.unsupported(format!("the driver answers {e}"));
                Ok(())
            }
            Err(e) => {
                st.samples.forget();
                st.last = None;
                if !matches!(self.gpm.status, GpmStatus::Failing(_)) {
                    tracing::warn!(
                        "GPU {index}: GPM failed ({e}; another GPM client, or the driver in \
                         trouble): SM active, tensor and DRAM activity are absent until it answers"
                    );
                }
                self.gpm.status = GpmStatus::Failing(e.to_string().into());
                Ok(())
            }
        }
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

/// The shortest span a GPM reading covers: a read sooner after the last sample takes none (the
/// GPM rows are absent) and the next one measures from that sample — so the read right after
/// the sampler's first one (at its start) takes none, and the first tick's GPM rows are absent.
/// Half the shortest sampling interval (100 ms), so a tick a few ms early still reads; a counter
/// snapshot over a few ms is noise. Once the reads' own spacing is known, half of it when that
/// is less (a scenario played faster reads every few ms of wall time).
pub(super) const GPM_MIN_WINDOW: std::time::Duration = std::time::Duration::from_millis(50);

/// GPM on one device: its status and, while it is read, its state.
pub(super) struct Gpm {
    pub(super) status: GpmStatus,
    state: Option<Box<GpmState>>,
    /// The spacing of the fast path's reads (for [`GPM_MIN_WINDOW`]).
    spacing: ReadSpacing,
    /// How often a sample is taken (zero: at every read); see [`Gpm::on`].
    every: std::time::Duration,
}

/// Two samples allocated once and filled in turn, and the metrics request reused every read.
struct GpmState {
    samples: SamplePair<GpmSample<'static>>,
    request: GpmRequest,
    /// The GPM rows of the last reading and when it was taken, given again at the reads
    /// between samples while current (see [`Gpm::on`]).
    last: Option<(std::time::Instant, MetricValues)>,
}

impl Gpm {
    /// GPM turned off (`[daemon] gpm = false`, `--no-gpm`, and the slow path).
    pub(super) fn off() -> Gpm {
        Gpm {
            status: GpmStatus::Off,
            state: None,
            spacing: ReadSpacing::default(),
            every: std::time::Duration::ZERO,
        }
    }

    /// GPM to be set up at the first read, a sample taken every `every` (zero: at every read).
    /// Each reading is the mean over the span between two samples, so a longer cadence loses
    /// no time, only resolution, and costs the driver's sample (hundreds of µs of CPU, see
    /// nvml-sim's latency table) that much less often; between samples the reads give the last
    /// reading again while it is younger than twice the cadence plus a second (then absent).
    pub(super) fn on(every: std::time::Duration) -> Gpm {
        Gpm {
            status: GpmStatus::Unknown,
            every,
            ..Gpm::off()
        }
    }

    /// The shortest span a reading at `now` may cover ([`GPM_MIN_WINDOW`], or half the spacing
    /// of the reads before this one when that is less); notes this read.
    fn min_window(&mut self, now: std::time::Instant) -> std::time::Duration {
        self.spacing.min_window(now)
    }

    /// Asks whether the GPU has GPM and, when it does, allocates the two samples.
    fn set_up(
        &mut self,
        nvml: &'static Nvml,
        dev: &Device<'static>,
        busy: &Busy,
        index: u32,
    ) -> Result<(), Lost> {
        match busy.call(NvmlFunction::GpmQueryDeviceSupport, || dev.gpm_support()) {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!("GPU {index}: no GPM (Hopper or later has it)");
                self.unsupported("the GPU has no GPM (Hopper and later have it)".into());
                return Ok(());
            }
            Err(NvmlError::GpuLost | NvmlError::ResetRequired) => return Err(Lost),
            Err(e) => {
                tracing::debug!("GPU {index}: GPM support unknown ({e})");
                self.unsupported(format!("nvmlGpmQueryDeviceSupport answers {e}"));
                return Ok(());
            }
        }
        let alloc = || busy.call(NvmlFunction::GpmSampleAlloc, || gpm_sample_alloc(nvml));
        match (alloc(), alloc()) {
            (Ok(a), Ok(b)) => {
                self.state = Some(Box::new(GpmState {
                    samples: SamplePair::new([a, b]),
                    request: GpmRequest::new(),
                    last: None,
                }));
                self.status = GpmStatus::Active;
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!("GPU {index}: cannot allocate GPM samples ({e}); no GPM metrics");
                self.unsupported(format!("nvmlGpmSampleAlloc answers {e}"));
            }
        }
        Ok(())
    }

    /// No GPM on this GPU: the samples are freed and it is not asked again.
    fn unsupported(&mut self, reason: String) {
        self.state = None;
        self.status = GpmStatus::Unsupported(reason.into());
    }

    /// The snapshots taken so far are forgotten (the GPU was lost): the next read takes a first
    /// sample again.
    fn forget(&mut self) {
        if let Some(st) = self.state.as_mut() {
            st.samples.forget();
            st.last = None;
        }
    }
}

/// `nvmlGpmSampleAlloc` (nvml-wrapper allocates a new sample at every `gpm_sample()`; here two
/// are allocated once and refilled).
pub fn gpm_sample_alloc(nvml: &'static Nvml) -> Result<GpmSample<'static>, NvmlError> {
    let sym = nvml
        .lib()
        .nvmlGpmSampleAlloc
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let mut raw = std::ptr::null_mut();
    // SAFETY: the symbol comes from the loaded NVML library with the declared signature; `raw`
    // is a valid out pointer.
    nvml_try(unsafe { sym(&mut raw) })?;
    // SAFETY: `raw` was just allocated by this library and is owned by nothing else; the
    // `GpmSample` frees it on drop.
    Ok(unsafe { GpmSample::from_handle(nvml, raw) })
}

/// `nvmlGpmSampleGet` into an allocated sample.
pub fn gpm_sample_get(
    nvml: &'static Nvml,
    dev: &Device<'static>,
    sample: &GpmSample<'static>,
) -> Result<(), NvmlError> {
    let sym = nvml
        .lib()
        .nvmlGpmSampleGet
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    // SAFETY: the device handle and the sample belong to this library and outlive the call;
    // the sample is used by one thread at a time.
    nvml_try(unsafe { sym(dev.handle(), sample.handle()) })
}

/// The table's GPM rows and where each one's ids sit in the request.
fn gpm_rows() -> impl Iterator<Item = (Metric, GpmMetric)> {
    METRICS.iter().filter_map(|d| match d.source {
        Source::Gpm(m) => Some((d.id, m)),
        _ => None,
    })
}

/// The `nvmlGpmMetricsGet` request of one device, with every id of the table's GPM rows
/// (allocated once: 8 KiB; also used for its GPU instances, see `mig`).
pub(super) struct GpmRequest {
    raw: Box<nvmlGpmMetricsGet_t>,
    /// Per GPM row: its metric, how it scales and the range of its ids in `raw.metrics`.
    rows: Vec<(Metric, f64, std::ops::Range<usize>)>,
}

// SAFETY: the raw pointers in the request are the handles of the two samples of the last
// `get`, set before each call and used only during it (NVML is thread-safe); the request owns
// nothing through them, and `&mut self` keeps it to one thread at a time. It moves between
// threads with its GPU's read state (a read may run on the sampling thread or a pool thread).
unsafe impl Send for GpmRequest {}

impl GpmRequest {
    pub(super) fn new() -> GpmRequest {
        // SAFETY: a plain C struct of integers, doubles and pointers; all zeros is valid.
        let mut raw: Box<nvmlGpmMetricsGet_t> = Box::new(unsafe { std::mem::zeroed() });
        let mut rows = Vec::new();
        let mut n = 0;
        for (metric, m) in gpm_rows() {
            let start = n;
            for id in m.ids() {
                if let Some(slot) = raw.metrics.get_mut(n) {
                    slot.metricId = id;
                    n += 1;
                }
            }
            rows.push((metric, m.scale(), start..n));
        }
        raw.numMetrics = u32::try_from(n).unwrap_or(0);
        GpmRequest { raw, rows }
    }

    /// `nvmlGpmMetricsGet` between two samples.
    pub(super) fn get(
        &mut self,
        nvml: &'static Nvml,
        older: &GpmSample<'static>,
        newer: &GpmSample<'static>,
    ) -> Result<(), NvmlError> {
        let sym = nvml
            .lib()
            .nvmlGpmMetricsGet
            .as_ref()
            .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
        self.raw.version = NVML_GPM_METRICS_GET_VERSION;
        // SAFETY: the handles belong to this library and the samples outlive the call.
        unsafe {
            self.raw.sample1 = older.handle();
            self.raw.sample2 = newer.handle();
        }
        for m in &mut self.raw.metrics[..self.raw.numMetrics as usize] {
            m.nvmlReturn = NVML_ERROR_UNKNOWN;
        }
        // SAFETY: the request is a valid, initialised nvmlGpmMetricsGet_t of this library's
        // bindings with numMetrics entries set.
        nvml_try(unsafe { sym(&mut *self.raw) })
    }

    /// Each GPM row's value from the last answer: the mean of its ids that answered (percentages
    /// kept within 0–100, bandwidths not negative), absent when none did.
    pub(super) fn answers(&self) -> impl Iterator<Item = (Metric, Option<f64>)> + '_ {
        self.rows.iter().map(|(metric, scale, ids)| {
            let mut sum = 0.0;
            let mut n = 0.0;
            for m in &self.raw.metrics[ids.clone()] {
                if m.nvmlReturn == NVML_SUCCESS && m.value.is_finite() {
                    sum += m.value;
                    n += 1.0;
                }
            }
            let v = (n > 0.0).then(|| {
                let mean = (sum / n).max(0.0);
                if metric.desc().unit == "percent" {
                    mean.min(100.0)
                } else {
                    mean * scale
                }
            });
            (*metric, v)
        })
    }

    /// Puts each GPM row's value from the last answer into `values` ([`GpmRequest::answers`]).
    fn put(&self, values: &mut MetricValues) {
        for (metric, v) in self.answers() {
            values.set(metric, v);
        }
    }
}

/// The slow path of one device: process lists and the slow calls (see `NvmlCall::is_slow`), on
/// the process cadence, on a thread of their own. The calls are read through a [`Slot`] of its
/// own (its not-supported bookkeeping is separate from the fast path's).
pub(super) struct SlowSlot {
    pub slot: Slot,
    /// A rate its counters cannot give yet (no reading a [`RATE_MIN_WINDOW_US`] ago) is read
    /// through its fallback call (`nvmlDeviceGetPcieThroughput`: a 20 ms window) — for one-shot
    /// commands, which take a single snapshot.
    pub rates_now: bool,
    /// When each of [`COUNTERS`] was last read (the time of that ask, UTC ms).
    counters_at: [Option<i64>; COUNTERS.len()],
    /// The sampler's process interval, ms (the counters' cadences are multiples of it).
    pub process_interval_ms: i64,
    /// The MIG devices' reads (see `mig`).
    mig: super::mig::MigReader,
    /// The NVLinks' reads (see `nvlink`).
    nvlink: super::nvlink::NvlinkReader,
    /// NVML's names of the listed processes `/proc` does not show (`None`: NVML gave none),
    /// kept while they are listed: asked once per process.
    names: Vec<(u32, Option<String>)>,
}

/// Counters the slow path reads on a cadence of their own, slower than the process interval:
/// a real driver spends CPU on them (H200, driver 580; `tests/fixtures/real/`). Energy costs 3 ms
/// per read — at the 5 s process cadence eight GPUs would spend 0.5 % of a core on it alone —:
/// it is read every 720 process intervals (an hour by default) and between reads the energy is
/// the last reading plus the tick's power readings integrated (`energy`; within 1 % of the
/// counter over a day of 1 s ticks). The PCIe replay counter (0.15 ms) every 12 (a minute). The
/// PCIe byte counters (0.13 ms each) every 6 (30 s): throughput becomes a 30 s average, and it
/// feeds no stock rule. A counter is exact over any span longer than its cadence (replays per
/// hour). `top` and `run` use a 1 s process interval: 12 min, 12 s and 6 s. No class waits
/// longer than an hour ([`counter_every_ms`]), and a class that did not answer is asked again at
/// the next round. (metrics, cadence in process intervals).
pub const COUNTERS: [(&[Metric], i64); 3] = [
    (&[Metric::Energy], ENERGY_EVERY),
    (&[Metric::PcieReplay], 12),
    (&[Metric::PcieRx, Metric::PcieTx], 6),
];

/// The energy counter's cadence, in process intervals (see [`COUNTERS`]).
pub const ENERGY_EVERY: i64 = 720;

/// The longest cadence of any counter class, whatever the process interval: an hour.
const COUNTER_EVERY_AT_MOST_MS: i64 = 3_600_000;

/// How often a class of [`COUNTERS`] read every `n` process intervals is read, ms: `n` process
/// intervals, at most an hour (but at least one process interval).
pub fn counter_every_ms(n: i64, process_interval_ms: i64) -> i64 {
    n.saturating_mul(process_interval_ms)
        .min(COUNTER_EVERY_AT_MOST_MS.max(process_interval_ms))
}

/// How long the energy counter's own reading is shown, in process intervals, when the GPU gives
/// no power to integrate between readings: twice the minute it was read at before it was
/// integrated (an hour-old reading is not current).
const ENERGY_SHOWN_ALONE: i64 = 12;

/// The NVLink rows as a per-metric mask (read together by `nvlink`).
fn nvlink_mask() -> u64 {
    METRICS
        .iter()
        .filter(|d| matches!(d.source, Source::Nvlink(_)))
        .fold(0, |m, d| m | metric_bit(d.id))
}

/// A list of metrics as a per-metric mask.
fn mask_of(metrics: &[Metric]) -> u64 {
    metrics.iter().fold(0, |m, r| m | metric_bit(*r))
}

/// How long each metric's slow value may be shown after it was read, ms, by metric: twice its
/// cadence (the process interval, or its counter class's when slower) plus the call timeout.
pub(super) fn max_ages_ms(process_interval_ms: i64, timeout_ms: i64) -> [i64; METRIC_COUNT] {
    let age = |n: i64| {
        counter_every_ms(n, process_interval_ms)
            .saturating_mul(2)
            .saturating_add(timeout_ms)
    };
    let mut ages = [age(1); METRIC_COUNT];
    for (metrics, n) in COUNTERS {
        for m in metrics {
            ages[*m as usize] = age(n);
        }
    }
    ages[Metric::Energy as usize] = age(ENERGY_SHOWN_ALONE);
    ages
}

/// What one slow read found.
#[derive(Default)]
pub(super) struct SlowAnswer {
    /// The device's processes and their kind; `None` when the lists could not be read.
    pub processes: Option<Vec<(ProcessInfo, ProcKind)>>,
    /// Values of the slow metrics asked for.
    pub values: MetricValues,
    /// The metrics read this time (a per-metric mask; the [`COUNTERS`] only when due).
    pub read: u64,
    /// When the reads were made, UTC ms.
    pub time_ms: i64,
    /// The device answered GPU_IS_LOST.
    pub lost: bool,
    /// With MIG on: its MIG devices (`None`: MIG off, or not known).
    pub mig: Option<Vec<super::mig::MigReading>>,
    /// When the energy counter was read, UTC ms (right after the call that read it).
    pub energy_ms: i64,
    /// Its NVLinks when they were read (`None`: no NVLink, not asked, or no answer).
    pub nvlink: Option<Vec<crate::model::nvlink::NvlinkLink>>,
    /// Its GPU instances' GPM metrics are read (see `mig::MigGpmReader`).
    pub mig_gpm: bool,
    /// What NVML names the listed processes `/proc` does not show (another PID namespace):
    /// `(pid, name)`, for the command they would otherwise lack.
    pub names: Vec<(u32, String)>,
}

impl SlowSlot {
    /// Names the listed processes that `/proc` does not show — processes in another PID
    /// namespace (gpuwatch in a container, a job in one without the host's PIDs) — by NVML's
    /// `nvmlSystemGetProcessName`, once per process while it is listed; a process `/proc` shows
    /// costs one `stat` when it first appears.
    fn name_hidden(&mut self, lists: &[(ProcessInfo, ProcKind)], answer: &mut SlowAnswer) {
        self.names
            .retain(|(pid, _)| lists.iter().any(|(p, _)| p.pid == *pid));
        for (p, _) in lists {
            let known = self.names.iter().find(|(pid, _)| *pid == p.pid);
            let name = match known {
                Some((_, name)) => name.clone(),
                None => {
                    let shown = std::fs::symlink_metadata(format!("/proc/{}", p.pid)).is_ok();
                    let asked = match (&self.slot.handle, shown) {
                        (Some(dev), false) => {
                            self.slot.busy.call(NvmlFunction::ProcessName, || {
                                dev.nvml().sys_process_name(p.pid, 256)
                            })
                        }
                        _ => Ok(String::new()),
                    };
                    let name = asked
                        .as_ref()
                        .ok()
                        .map(|n| n.trim().to_string())
                        .filter(|n| !n.is_empty());
                    // An answer, or one that will not change, is kept; another error (a
                    // timeout, UNKNOWN) is asked again at the next round.
                    let last = asked.as_ref().map_or_else(
                        |e| super::mig::permanent(e) || matches!(e, NvmlError::NotFound),
                        |_| true,
                    );
                    if last {
                        self.names.push((p.pid, name.clone()));
                    }
                    name
                }
            };
            if let Some(name) = name {
                answer.names.push((p.pid, name));
            }
        }
    }

    /// Reads the MIG devices into `answer` (see `mig`); processes that only a MIG device's own
    /// list shows join the GPU's `lists`.
    fn read_mig(
        &mut self,
        answer: &mut SlowAnswer,
        lists: Option<&mut Vec<(ProcessInfo, ProcKind)>>,
    ) {
        let Some(dev) = self.slot.handle.as_ref() else {
            return;
        };
        let gpu_procs: Option<Vec<ProcessInfo>> = lists
            .as_ref()
            .map(|l| l.iter().map(|(p, _)| p.clone()).collect());
        match self.mig.read(
            self.slot.id.index,
            &self.slot.busy,
            dev,
            gpu_procs.as_deref(),
        ) {
            Ok(mig) => {
                if let (Some(lists), Some(devices)) = (lists, mig.as_ref()) {
                    for p in devices
                        .iter()
                        .filter_map(|m| m.processes.as_ref())
                        .flatten()
                    {
                        if !lists.iter().any(|(q, _)| q.pid == p.pid) {
                            lists.push((p.clone(), ProcKind::Compute));
                        }
                    }
                }
                answer.mig = mig;
            }
            Err(super::mig::Gone) => answer.lost = true,
        }
        answer.mig_gpm = self.mig.gpm.active();
    }

    /// Turns GPM per GPU instance on or off (`[daemon] gpm`, `--no-gpm`; on by default).
    pub(super) fn set_gpm(&mut self, on: bool) {
        self.mig.gpm.off = !on;
    }

    pub(super) fn new(index: u32, busy: Arc<Busy>) -> SlowSlot {
        SlowSlot {
            slot: Slot::new(index, crate::sys::now_ms(), busy, Path::Slow),
            rates_now: false,
            counters_at: [None; COUNTERS.len()],
            process_interval_ms: 5_000,
            names: Vec::new(),
            mig: super::mig::MigReader::default(),
            nvlink: super::nvlink::NvlinkReader::default(),
        }
    }

    /// Gets the device handle if it has none yet.
    pub(super) fn ensure_handle(&mut self, nvml: &'static Nvml) {
        if self.slot.handle.is_none() {
            let index = self.slot.id.index;
            self.slot.handle = self
                .slot
                .busy
                .call(NvmlFunction::HandleByIndex, || nvml.device_by_index(index))
                .ok();
        }
    }

    /// The metrics to leave out of the read at `time_ms`: each class of [`COUNTERS`] until its
    /// cadence has passed since it was last read (or the clock went back).
    fn counters_skip(&self, time_ms: i64) -> u64 {
        let mut skip = 0;
        for (at, (metrics, n)) in self.counters_at.iter().zip(COUNTERS) {
            // a little early is due: a round can start a few ms short of its interval
            let every =
                counter_every_ms(n, self.process_interval_ms) - self.process_interval_ms / 2;
            if !at.is_none_or(|t| time_ms - t >= every || time_ms < t) {
                skip |= mask_of(metrics);
            }
        }
        skip
    }

    /// Books the counter classes this read asked for and got (`asked`: a per-metric mask): a
    /// class that did not answer (an error, a GPU that did not answer) is asked again at the next
    /// round, not a cadence later.
    fn counters_read(&mut self, time_ms: i64, asked: u64, values: &MetricValues) {
        for (at, (metrics, _)) in self.counters_at.iter_mut().zip(COUNTERS) {
            if asked & mask_of(metrics) != 0 && metrics.iter().any(|m| values.get(*m).is_some()) {
                *at = Some(time_ms);
            }
        }
    }

    /// Reads the process lists and the slow metrics in `mask` (the [`COUNTERS`] when their
    /// interval has passed since they were last read), leaving out those in `unread` (see
    /// [`super::SamplerConfig::unread`]).
    pub(super) fn read(&mut self, mask: u64, unread: u64, time_ms: i64) -> SlowAnswer {
        let mut answer = SlowAnswer::default();
        if self.slot.handle.is_none() {
            answer.time_ms = crate::sys::now_ms();
            return answer;
        }
        let skip = self.counters_skip(time_ms) | unread;
        let mask = mask & !skip;
        answer.read = mask;
        answer.energy_ms = i64::MIN;
        let mut tick = TickAnswers::default();
        let mut lists: Vec<(ProcessInfo, ProcKind)> = Vec::new();
        let mut ok = true;
        for (q, kind) in [
            (Query::ComputeProcs, ProcKind::Compute),
            (Query::GraphicsProcs, ProcKind::Graphics),
        ] {
            let listed = self.slot.query(q, &mut tick, |d| match q {
                Query::ComputeProcs => d.running_compute_processes(),
                _ => d.running_graphics_processes(),
            });
            match listed {
                Ok(Some(list)) => {
                    for p in list {
                        if !lists.iter().any(|(x, _)| x.pid == p.pid) {
                            lists.push((p, kind));
                        }
                    }
                }
                // Not supported (asked no more) or nothing to list: an empty answer.
                Ok(None) if tick.failed & q.bit() == 0 || self.slot.unsupported & q.bit() != 0 => {}
                Ok(None) => ok = false,
                Err(Lost) => {
                    answer.lost = true;
                    ok = false;
                }
            }
        }
        if !answer.lost {
            self.read_mig(&mut answer, ok.then_some(&mut lists));
        }
        if ok {
            self.name_hidden(&lists, &mut answer);
        }
        answer.processes = ok.then_some(lists);
        if !answer.lost
            && self
                .slot
                .read_fields(&mut answer.values, &mut tick, skip)
                .is_err()
        {
            answer.lost = true;
        }
        if answer.values.get(Metric::Energy).is_some() {
            answer.energy_ms = crate::sys::now_ms();
        }
        if !answer.lost && mask & nvlink_mask() != 0 && !self.nvlink.absent() {
            if let Some(dev) = self.slot.handle.as_ref() {
                match self.nvlink.read(&self.slot.busy, dev, &mut answer.values) {
                    Ok(links) => answer.nvlink = links,
                    Err(Lost) => answer.lost = true,
                }
            }
        }

        for d in METRICS {
            if mask & metric_bit(d.id) == 0 || answer.lost {
                continue;
            }
            let call = match d.source {
                Source::Nvml(c) => c,
                // a rate its counters cannot give yet, for a one-shot command
                Source::Field(f)
                    if self.rates_now && f.rate && answer.values.get(d.id).is_none() =>
                {
                    match f.fallback {
                        Some(c) => c,
                        None => continue,
                    }
                }
                // a slow field read above, or its fallback once the field is unsupported
                Source::Field(_) if self.slot.field_active(d.id) => continue,
                Source::Field(f) => match f.fallback {
                    Some(c) => c,
                    None => continue,
                },
                _ => continue,
            };
            match self.slot.read_call(call, &mut tick) {
                Ok(v) => answer.values.set(d.id, v),
                Err(Lost) => answer.lost = true,
            }
        }
        if answer.lost {
            // its GPU instances' samples are of a GPU that is gone
            self.mig.gpm.clear();
            // and its counters are read at once when it answers again (a driver reload starts
            // them again)
            self.counters_at = [None; COUNTERS.len()];
        } else {
            self.counters_read(time_ms, mask, &answer.values);
        }
        answer.time_ms = crate::sys::now_ms();
        if answer.energy_ms == i64::MIN {
            answer.energy_ms = answer.time_ms;
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_masks_metrics_are_its_bits_in_table_order() {
        let all: Vec<Metric> = Metric::all().collect();
        assert_eq!(
            mask_metrics(all.iter().fold(0, |m, x| m | metric_bit(*x))).collect::<Vec<_>>(),
            all
        );
        let some = [Metric::Energy, Metric::Power, Metric::PcieRx];
        let mask = some.iter().fold(0, |m, x| m | metric_bit(*x));
        let mut want = some.to_vec();
        want.sort_by_key(|m| *m as u8);
        assert_eq!(mask_metrics(mask).collect::<Vec<_>>(), want);
        assert_eq!(mask_metrics(0).count(), 0);
    }

    #[test]
    fn a_rate_needs_a_window_of_half_a_second() {
        let mut row = table_fields(Path::Slow)
            .find(|r| r.metric == Metric::PcieRx)
            .unwrap();
        let t0 = 1_700_000_000_000_000;
        assert_eq!(row.value(1_000.0, t0), None, "first reading");
        assert_eq!(
            row.value(9_000.0, t0 + 3_000),
            None,
            "3 ms later: too short"
        );
        assert_eq!(row.value(2_000.0, t0 + 499_999), None, "still too short");
        assert_eq!(row.value(3_000.0, t0 + 1_000_000), Some(2_000.0));
        assert_eq!(row.value(2_000.0, t0 + 2_000_000), None, "went backwards");
        assert_eq!(row.value(4_000.0, t0 + 4_000_000), Some(1_000.0));
    }

    /// A GPM reading covers at least 50 ms — half the reads' own spacing once that is known and
    /// shorter (a scenario played faster): the read just after the start one takes no sample.
    #[test]
    fn gpm_min_window_follows_the_reads() {
        use std::time::{Duration, Instant};
        let ms = Duration::from_millis;
        let mut g = Gpm::on(std::time::Duration::ZERO);
        let t0 = Instant::now();
        assert_eq!(g.min_window(t0), GPM_MIN_WINDOW, "the start");
        assert_eq!(
            g.min_window(t0 + ms(3)),
            GPM_MIN_WINDOW,
            "the first tick: 3 ms later"
        );
        assert_eq!(
            g.min_window(t0 + ms(36)),
            Duration::from_micros(1500),
            "half of 3 ms"
        );
        assert_eq!(
            g.min_window(t0 + ms(69)),
            ms(16) + Duration::from_micros(500)
        );
        assert_eq!(
            g.min_window(t0 + ms(1069)),
            ms(16) + Duration::from_micros(500)
        );
        assert_eq!(
            g.min_window(t0 + ms(2069)),
            GPM_MIN_WINDOW,
            "1 s apart: 50 ms"
        );
    }

    /// One request holds every id of the GPM rows; a row is the mean of its ids that answered
    /// (the decoders a GPU has), percentages within 0–100, MiB/s as bytes per second, and
    /// absent when none answered.
    #[test]
    fn gpm_rows_from_one_request() {
        let mut req = GpmRequest::new();
        let n = req.raw.numMetrics as usize;
        let ids: Vec<u32> = req.raw.metrics[..n].iter().map(|m| m.metricId).collect();
        assert!(
            ids.contains(&2) && ids.contains(&37) && ids.contains(&61),
            "{ids:?}"
        );
        assert_eq!(
            req.rows.len(),
            METRICS.iter().filter(|d| d.source.is_gpm()).count()
        );
        for m in &mut req.raw.metrics[..n] {
            m.nvmlReturn = NVML_ERROR_UNKNOWN;
        }
        let mut answer = |id: u32, v: f64| {
            let m = req.raw.metrics[..n]
                .iter_mut()
                .find(|m| m.metricId == id)
                .unwrap();
            m.nvmlReturn = NVML_SUCCESS;
            m.value = v;
        };
        answer(2, 12.5); // SM active
        answer(30, 10.0); // NVDEC 0 and 1 of 8: the others did not answer
        answer(31, 30.0);
        answer(3, 100.4); // occupancy a little over 100 (counter race)
        answer(61, 2.0); // NVLink TX, MiB/s
        let mut values = MetricValues::default();
        req.put(&mut values);
        assert_eq!(values.get(Metric::SmActive), Some(12.5));
        assert_eq!(values.get(Metric::NvdecUtil), Some(20.0));
        assert_eq!(values.get(Metric::SmOccupancy), Some(100.0));
        assert_eq!(values.get(Metric::NvlinkTxBytes), Some(2.0 * 1_048_576.0));
        assert_eq!(
            values.get(Metric::TensorActive),
            None,
            "not answered: absent"
        );
    }

    #[test]
    fn counters_are_read_on_their_own_cadence() {
        let mut slow = SlowSlot::new(0, Arc::new(Busy::default()));
        let t0 = 1_700_000_000_000;
        let minute = metric_bit(Metric::PcieReplay);
        let pcie = metric_bit(Metric::PcieRx) | metric_bit(Metric::PcieTx);
        let energy = metric_bit(Metric::Energy);
        // process rounds every 5 s (a few ms late or early) for two hours: which counters each
        // one reads
        let (mut minutely, mut pcie_reads, mut hourly) = (vec![], vec![], vec![]);
        let mut values = MetricValues::default();
        for m in [Metric::Energy, Metric::PcieReplay, Metric::PcieRx] {
            values.set(m, Some(1.0));
        }
        for k in 0..=1440 {
            let t = t0 + k * 5_000 + [3, -2, 0][k as usize % 3];
            let skip = slow.counters_skip(t);
            slow.counters_read(t, !skip, &values);
            if skip & minute == 0 && k <= 24 {
                minutely.push(k * 5);
            }
            if skip & pcie == 0 && k <= 24 {
                pcie_reads.push(k * 5);
            }
            if skip & energy == 0 {
                hourly.push(k * 5);
            }
        }
        assert_eq!(minutely, [0, 60, 120]);
        assert_eq!(pcie_reads, [0, 30, 60, 90, 120]);
        assert_eq!(hourly, [0, 3_600, 7_200]);
        assert_eq!(slow.counters_skip(t0), 0, "the clock went back");
        // a class that did not answer is asked again at the next round
        let mut slow = SlowSlot::new(0, Arc::new(Busy::default()));
        slow.counters_read(t0, !0, &MetricValues::default());
        assert_eq!(
            slow.counters_skip(t0 + 5_000),
            0,
            "nothing answered: all asked again"
        );
        slow.counters_read(t0 + 5_000, !0, &values);
        assert_eq!(slow.counters_skip(t0 + 10_000) & energy, energy);
        // shown for twice the cadence (plus the timeout), the others for twice the process interval
        let ages = max_ages_ms(5_000, 1_000);
        // the energy counter alone (no power to integrate): as when it was read every minute
        assert_eq!(ages[Metric::Energy as usize], 121_000);
        assert_eq!(ages[Metric::PcieReplay as usize], 121_000);
        assert_eq!(ages[Metric::PcieRx as usize], 61_000);
        assert_eq!(ages[Metric::Fan as usize], 11_000);
    }
}
