//! Plain sample data and the one metric table.
//!
//! Everything downstream of the sampler (windows, rules, recorder, importers, replay) speaks in
//! these types; none of them mention NVML. A value the GPU cannot give is `None`, never 0; a lost
//! GPU is [`DeviceState::Lost`]; a missed tick is simply a snapshot that never arrived (a gap in
//! time), which windows keep.
//!
//! Canonical units inside gpuwatch: bytes, watts, joules, degrees Celsius, MHz, percent, bytes per
//! second. The table below records, per metric, where the number comes from (a typed [`Source`]:
//! an NVML call, a field-values field, a GPM metric, a derivation or a host reading) and what
//! nvidia-smi and dcgm-exporter call it, so the sampler, the recorder, the nvidia-smi CSV importer
//! and the rule API docs all read the same list. The sampler reads every row through its source,
//! so a new row cannot ship as a column that is never filled.
//!
//! **Adding a metric** is one row in `metrics!` below (append it: recordings' columns keep their
//! order): a key (rule name, CSV column, JSON key), a canonical unit, gauge or counter, the help
//! text (Prometheus HELP and `docs/metrics.md`), its [`Source`], and the nvidia-smi and
//! dcgm-exporter names when they exist. A source the sampler can already read needs nothing
//! else: an existing [`NvmlCall`], a field ([`NvmlField`], fast or `.slow()`), a [`GpmMetric`] or
//! a [`Derivation`]; a new `NvmlCall` or `HostRead` does not compile until the sampler reads it.
//! Then regenerate `docs/metrics.md` (the `metrics_doc` test says how).

pub mod job;
pub mod nvlink;
pub mod visible;

use serde::{Deserialize, Serialize};

/// Whether a metric is a point-in-time value or a monotonically growing counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricKind {
    /// A value that goes up and down (utilization, temperature).
    Gauge,
    /// A cumulative count (ECC errors, energy); rules look at deltas.
    Counter,
}

/// How nvidia-smi writes a metric, so its CSV logs can be converted to canonical units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmiUnit {
    /// Plain number in our unit ("45", "45 %").
    Same,
    /// Mebibytes ("1024 MiB") → bytes.
    MiB,
    /// Pstate text ("P0") → number.
    Pstate,
    /// Hex bitmask ("0x0000000000000004") → number.
    Hex,
}

/// A dedicated NVML device query and the one number of its answer that a metric takes. Calls
/// that answer several numbers at once (`nvmlDeviceGetUtilizationRates`,
/// `nvmlDeviceGetMemoryInfo_v2`) are made once per GPU and tick however many rows read them. The
/// sampler has one reader per variant (an exhaustive match), so a new variant does not compile
/// until it is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NvmlCall {
    /// `nvmlDeviceGetUtilizationRates`, `.gpu` (percent).
    UtilizationGpu,
    /// `nvmlDeviceGetUtilizationRates`, `.memory` (percent).
    UtilizationMemory,
    /// `nvmlDeviceGetMemoryInfo_v2`, `.used` (bytes).
    MemoryUsed,
    /// `nvmlDeviceGetMemoryInfo_v2`, `.free` (bytes).
    MemoryFree,
    /// `nvmlDeviceGetMemoryInfo_v2`, `.total` (bytes).
    MemoryTotal,
    /// `nvmlDeviceGetMemoryInfo_v2`, `.reserved` (bytes).
    MemoryReserved,
    /// `nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)` (°C).
    TemperatureGpu,
    /// `nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)` (°C).
    TemperatureSlowdown,
    /// `nvmlDeviceGetPowerUsage` (mW).
    PowerUsage,
    /// `nvmlDeviceGetEnforcedPowerLimit` (mW).
    EnforcedPowerLimit,
    /// `nvmlDeviceGetTotalEnergyConsumption` (mJ).
    TotalEnergyConsumption,
    /// `nvmlDeviceGetClockInfo(NVML_CLOCK_SM)` (MHz).
    ClockSm,
    /// `nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)` (MHz).
    ClockMem,
    /// `nvmlDeviceGetCurrentClocksThrottleReasons` (bitmask).
    ClockEventReasons,
    /// `nvmlDeviceGetPerformanceState` (`NVML_PSTATE_0` … `_15`; unknown is no value).
    PerformanceState,
    /// `nvmlDeviceGetFanSpeed` (percent, fan 0).
    FanSpeed,
    /// `nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE)`.
    EccCorrectedVolatile,
    /// `nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE)`.
    EccUncorrectedVolatile,
    /// `nvmlDeviceGetRetiredPages(MULTIPLE_SINGLE_BIT_ECC_ERRORS)`, the page count.
    RetiredPagesSbe,
    /// `nvmlDeviceGetRetiredPages(DOUBLE_BIT_ECC_ERROR)`, the page count.
    RetiredPagesDbe,
    /// `nvmlDeviceGetRetiredPagesPendingStatus` (0 or 1).
    RetiredPagesPending,
    /// `nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_RX_BYTES)` (KB/s).
    PcieRx,
    /// `nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_TX_BYTES)` (KB/s).
    PcieTx,
    /// `nvmlDeviceGetPcieReplayCounter`.
    PcieReplayCounter,
    /// `nvmlDeviceGetEncoderUtilization` (percent).
    EncoderUtilization,
    /// `nvmlDeviceGetDecoderUtilization` (percent).
    DecoderUtilization,
}

impl NvmlCall {
    /// Whether the call is made off the tick path, on the slow (process-list) cadence: calls that
    /// block on real drivers (`nvmlDeviceGetPcieThroughput` samples for 20 ms; the retired-page
    /// lists) and settings that rarely change (power limit, slowdown temperature, performance
    /// state, fan, video engines), and the counters a real driver spends CPU on (energy: 3 ms of
    /// kernel time per call on an H200, driver 580; the PCIe replay counter 0.17 ms; see
    /// `tests/fixtures/real/`). Their values are carried into every snapshot while fresh (see the
    /// `sampler` module), so a tick makes only the cheap calls that change from tick to tick: the
    /// field values, utilization, memory, temperature, power, clocks and clock-event reasons.
    pub fn is_slow(self) -> bool {
        matches!(
            self,
            NvmlCall::PcieRx
                | NvmlCall::PcieTx
                | NvmlCall::TotalEnergyConsumption
                | NvmlCall::PcieReplayCounter
                | NvmlCall::EnforcedPowerLimit
                | NvmlCall::TemperatureSlowdown
                | NvmlCall::PerformanceState
                | NvmlCall::FanSpeed
                | NvmlCall::EncoderUtilization
                | NvmlCall::DecoderUtilization
                | NvmlCall::RetiredPagesSbe
                | NvmlCall::RetiredPagesDbe
                | NvmlCall::RetiredPagesPending
        )
    }

    /// The NVML function called (`nvmlDeviceGetClockInfo`); nvml-wrapper may call a versioned
    /// symbol of it (`…_v2`).
    pub fn function(self) -> &'static str {
        let d = self.describe();
        d.find(['(', '.']).map_or(d, |end| &d[..end])
    }

    /// The call as the docs write it: function, arguments and the part of the answer taken.
    pub fn describe(self) -> &'static str {
        match self {
            NvmlCall::UtilizationGpu => "nvmlDeviceGetUtilizationRates.gpu",
            NvmlCall::UtilizationMemory => "nvmlDeviceGetUtilizationRates.memory",
            NvmlCall::MemoryUsed => "nvmlDeviceGetMemoryInfo_v2.used",
            NvmlCall::MemoryFree => "nvmlDeviceGetMemoryInfo_v2.free",
            NvmlCall::MemoryTotal => "nvmlDeviceGetMemoryInfo_v2.total",
            NvmlCall::MemoryReserved => "nvmlDeviceGetMemoryInfo_v2.reserved",
            NvmlCall::TemperatureGpu => "nvmlDeviceGetTemperature(GPU)",
            NvmlCall::TemperatureSlowdown => "nvmlDeviceGetTemperatureThreshold(SLOWDOWN)",
            NvmlCall::PowerUsage => "nvmlDeviceGetPowerUsage",
            NvmlCall::EnforcedPowerLimit => "nvmlDeviceGetEnforcedPowerLimit",
            NvmlCall::TotalEnergyConsumption => "nvmlDeviceGetTotalEnergyConsumption",
            NvmlCall::ClockSm => "nvmlDeviceGetClockInfo(SM)",
            NvmlCall::ClockMem => "nvmlDeviceGetClockInfo(MEM)",
            NvmlCall::ClockEventReasons => "nvmlDeviceGetCurrentClocksThrottleReasons",
            NvmlCall::PerformanceState => "nvmlDeviceGetPerformanceState",
            NvmlCall::FanSpeed => "nvmlDeviceGetFanSpeed",
            NvmlCall::EccCorrectedVolatile => "nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE)",
            NvmlCall::EccUncorrectedVolatile => {
                "nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE)"
            }
            NvmlCall::RetiredPagesSbe => "nvmlDeviceGetRetiredPages(MULTIPLE_SINGLE_BIT)",
            NvmlCall::RetiredPagesDbe => "nvmlDeviceGetRetiredPages(DOUBLE_BIT)",
            NvmlCall::RetiredPagesPending => "nvmlDeviceGetRetiredPagesPendingStatus",
            NvmlCall::PcieRx => "nvmlDeviceGetPcieThroughput(RX)",
            NvmlCall::PcieTx => "nvmlDeviceGetPcieThroughput(TX)",
            NvmlCall::PcieReplayCounter => "nvmlDeviceGetPcieReplayCounter",
            NvmlCall::EncoderUtilization => "nvmlDeviceGetEncoderUtilization",
            NvmlCall::DecoderUtilization => "nvmlDeviceGetDecoderUtilization",
        }
    }
}

/// A field of `nvmlDeviceGetFieldValues`: its `NVML_FI_*` id (pre-580.82 numbering, which
/// nvml-wrapper translates for newer drivers) and name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NvmlField {
    /// The `NVML_FI_*` number.
    pub id: u32,
    /// The `NVML_FI_*` name.
    pub name: &'static str,
}

impl NvmlField {
    /// Volatile single-bit (corrected) ECC errors.
    pub const ECC_SBE_VOL_TOTAL: NvmlField = NvmlField::new(3, "NVML_FI_DEV_ECC_SBE_VOL_TOTAL");
    /// Volatile double-bit (uncorrected) ECC errors.
    pub const ECC_DBE_VOL_TOTAL: NvmlField = NvmlField::new(4, "NVML_FI_DEV_ECC_DBE_VOL_TOTAL");
    /// Pages retired after single-bit errors.
    pub const RETIRED_SBE: NvmlField = NvmlField::new(29, "NVML_FI_DEV_RETIRED_SBE");
    /// Pages retired after double-bit errors.
    pub const RETIRED_DBE: NvmlField = NvmlField::new(30, "NVML_FI_DEV_RETIRED_DBE");
    /// A page retirement is pending.
    pub const RETIRED_PENDING: NvmlField = NvmlField::new(31, "NVML_FI_DEV_RETIRED_PENDING");
    /// HBM temperature (°C).
    pub const MEMORY_TEMP: NvmlField = NvmlField::new(82, "NVML_FI_DEV_MEMORY_TEMP");
    /// Energy since driver load (mJ).
    pub const TOTAL_ENERGY_CONSUMPTION: NvmlField =
        NvmlField::new(83, "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION");
    /// PCIe replay counter.
    pub const PCIE_REPLAY_COUNTER: NvmlField =
        NvmlField::new(94, "NVML_FI_DEV_PCIE_REPLAY_COUNTER");
    /// Rows remapped after correctable errors.
    pub const REMAPPED_COR: NvmlField = NvmlField::new(142, "NVML_FI_DEV_REMAPPED_COR");
    /// Rows remapped after uncorrectable errors.
    pub const REMAPPED_UNC: NvmlField = NvmlField::new(143, "NVML_FI_DEV_REMAPPED_UNC");
    /// A row remapping is pending.
    pub const REMAPPED_PENDING: NvmlField = NvmlField::new(144, "NVML_FI_DEV_REMAPPED_PENDING");
    /// A row remapping failed.
    pub const REMAPPED_FAILURE: NvmlField = NvmlField::new(145, "NVML_FI_DEV_REMAPPED_FAILURE");
    /// Bytes sent over PCIe since driver load (cumulative, may wrap; r550 and later).
    pub const PCIE_COUNT_TX_BYTES: NvmlField =
        NvmlField::new(197, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES");
    /// Bytes received over PCIe since driver load (cumulative, may wrap; r550 and later).
    pub const PCIE_COUNT_RX_BYTES: NvmlField =
        NvmlField::new(198, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES");
    /// NVIDIA's recommended recovery action (0 none, 1 GPU reset, 2 node reboot, 3 drain P2P,
    /// 4 drain and reset; r570 and later).
    pub const GPU_RECOVERY_ACTION: NvmlField =
        NvmlField::new(230, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION");

    const fn new(id: u32, name: &'static str) -> NvmlField {
        NvmlField { id, name }
    }
}

/// A metric read through `nvmlDeviceGetFieldValues`. All field rows of the table go into one
/// field-values call per GPU and tick; a field the GPU does not support is dropped from it and,
/// from then on, read through `fallback` (when there is one).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FieldSource {
    /// Which field.
    pub field: NvmlField,
    /// Factor from NVML's unit to the canonical one (mJ → J is 0.001).
    pub scale: f64,
    /// Dedicated call that gives the same number, for GPUs and drivers without the field.
    pub fallback: Option<NvmlCall>,
    /// The field is a cumulative counter and the metric is its per-second rate between two
    /// readings (a counter that went backwards, e.g. wrapped, gives no value for that reading).
    pub rate: bool,
    /// Read off the tick path, on the slow cadence, in a field-values call of its own: fields a
    /// real driver spends CPU on (measured on an H200, driver 580: total energy 3 ms of kernel
    /// time per read, each PCIe counter 0.13–0.15 ms, while the other fields cost about a µs).
    /// Its fallback call must be slow too ([`NvmlCall::is_slow`]).
    pub slow: bool,
}

/// A metric gpuwatch computes from other metrics of the same sample (after every NVML read).
#[derive(Debug, Clone, Copy)]
pub struct Derivation {
    /// How, in words (for the docs).
    pub how: &'static str,
    /// The computation; `None` when an input is absent.
    pub compute: fn(&MetricValues) -> Option<f64>,
}

/// A GPM metric (`nvmlGpmMetricsGet`, Hopper and later): the driver computes it from two GPM
/// samples of the GPU's activity counters, here the previous tick's and this tick's, so it is
/// the average over the interval between them (absent at the first tick, and on GPUs without
/// GPM). Percentages come as 0–100, bandwidths in MiB/s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpmMetric {
    /// `NVML_GPM_METRIC_GRAPHICS_UTIL`: the graphics/compute engine had work.
    GraphicsUtil,
    /// `NVML_GPM_METRIC_SM_UTIL`: the SMs had at least one warp, averaged over the SMs.
    SmUtil,
    /// `NVML_GPM_METRIC_SM_OCCUPANCY`: warps resident vs the SMs' maximum.
    SmOccupancy,
    /// `NVML_GPM_METRIC_ANY_TENSOR_UTIL`: any tensor pipe active.
    AnyTensorUtil,
    /// `NVML_GPM_METRIC_HMMA_TENSOR_UTIL`: the fp16/bf16 tensor pipe.
    HmmaTensorUtil,
    /// `NVML_GPM_METRIC_IMMA_TENSOR_UTIL`: the integer tensor pipe.
    ImmaTensorUtil,
    /// `NVML_GPM_METRIC_DFMA_TENSOR_UTIL`: the fp64 tensor pipe.
    DfmaTensorUtil,
    /// `NVML_GPM_METRIC_DRAM_BW_UTIL`: DRAM bandwidth used vs the peak.
    DramBwUtil,
    /// `NVML_GPM_METRIC_FP64_UTIL`: the non-tensor fp64 pipe.
    Fp64Util,
    /// `NVML_GPM_METRIC_FP32_UTIL`: the non-tensor fp32 pipe.
    Fp32Util,
    /// `NVML_GPM_METRIC_FP16_UTIL`: the non-tensor fp16 pipe.
    Fp16Util,
    /// `NVML_GPM_METRIC_PCIE_TX_PER_SEC` (MiB/s).
    PcieTxPerSec,
    /// `NVML_GPM_METRIC_PCIE_RX_PER_SEC` (MiB/s).
    PcieRxPerSec,
    /// `NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC` (MiB/s, every link).
    NvlinkTotalTxPerSec,
    /// `NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC` (MiB/s, every link).
    NvlinkTotalRxPerSec,
    /// `NVML_GPM_METRIC_NVDEC_0_UTIL` … `_7_UTIL`: the mean over the decoders the GPU has.
    NvdecUtil,
    /// `NVML_GPM_METRIC_NVJPG_0_UTIL` … `_7_UTIL`: the mean over the JPEG decoders it has.
    NvjpgUtil,
    /// `NVML_GPM_METRIC_NVOFA_0_UTIL`, `_1_UTIL`: the mean over the optical-flow engines.
    NvofaUtil,
}

impl GpmMetric {
    /// The `NVML_GPM_METRIC_*` ids the metric reads (several for the video engines, one per
    /// instance: the instances the GPU has answer, and the metric is their mean).
    pub fn ids(self) -> std::ops::RangeInclusive<u32> {
        match self {
            GpmMetric::GraphicsUtil => 1..=1,
            GpmMetric::SmUtil => 2..=2,
            GpmMetric::SmOccupancy => 3..=3,
            GpmMetric::AnyTensorUtil => 5..=5,
            GpmMetric::DfmaTensorUtil => 6..=6,
            GpmMetric::HmmaTensorUtil => 7..=7,
            GpmMetric::ImmaTensorUtil => 9..=9,
            GpmMetric::DramBwUtil => 10..=10,
            GpmMetric::Fp64Util => 11..=11,
            GpmMetric::Fp32Util => 12..=12,
            GpmMetric::Fp16Util => 13..=13,
            GpmMetric::PcieTxPerSec => 20..=20,
            GpmMetric::PcieRxPerSec => 21..=21,
            GpmMetric::NvdecUtil => 30..=37,
            GpmMetric::NvjpgUtil => 40..=47,
            GpmMetric::NvofaUtil => 50..=51,
            GpmMetric::NvlinkTotalRxPerSec => 60..=60,
            GpmMetric::NvlinkTotalTxPerSec => 61..=61,
        }
    }

    /// Whether a GPU instance of a GPU with MIG on has the metric of its own
    /// (`nvmlGpmMigSampleGet`): the activities of its SMs and memory. The bandwidths (PCIe,
    /// NVLink) and the video engines are its GPU's and stay absent per instance. (nvml-sim keeps
    /// the same list as `Metric::per_mig_device`; it cannot depend on gpuwatch.)
    pub fn per_gpu_instance(self) -> bool {
        match self {
            GpmMetric::GraphicsUtil
            | GpmMetric::SmUtil
            | GpmMetric::SmOccupancy
            | GpmMetric::AnyTensorUtil
            | GpmMetric::DfmaTensorUtil
            | GpmMetric::HmmaTensorUtil
            | GpmMetric::ImmaTensorUtil
            | GpmMetric::DramBwUtil
            | GpmMetric::Fp64Util
            | GpmMetric::Fp32Util
            | GpmMetric::Fp16Util => true,
            GpmMetric::PcieTxPerSec
            | GpmMetric::PcieRxPerSec
            | GpmMetric::NvlinkTotalTxPerSec
            | GpmMetric::NvlinkTotalRxPerSec
            | GpmMetric::NvdecUtil
            | GpmMetric::NvjpgUtil
            | GpmMetric::NvofaUtil => false,
        }
    }

    /// Factor from NVML's unit to the canonical one (MiB/s → bytes per second).
    pub fn scale(self) -> f64 {
        match self {
            GpmMetric::PcieTxPerSec
            | GpmMetric::PcieRxPerSec
            | GpmMetric::NvlinkTotalTxPerSec
            | GpmMetric::NvlinkTotalRxPerSec => 1_048_576.0,
            _ => 1.0,
        }
    }

    /// The metric as the docs write it.
    pub fn describe(self) -> &'static str {
        match self {
            GpmMetric::GraphicsUtil => "NVML_GPM_METRIC_GRAPHICS_UTIL",
            GpmMetric::SmUtil => "NVML_GPM_METRIC_SM_UTIL",
            GpmMetric::SmOccupancy => "NVML_GPM_METRIC_SM_OCCUPANCY",
            GpmMetric::AnyTensorUtil => "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
            GpmMetric::HmmaTensorUtil => "NVML_GPM_METRIC_HMMA_TENSOR_UTIL",
            GpmMetric::ImmaTensorUtil => "NVML_GPM_METRIC_IMMA_TENSOR_UTIL",
            GpmMetric::DfmaTensorUtil => "NVML_GPM_METRIC_DFMA_TENSOR_UTIL",
            GpmMetric::DramBwUtil => "NVML_GPM_METRIC_DRAM_BW_UTIL",
            GpmMetric::Fp64Util => "NVML_GPM_METRIC_FP64_UTIL",
            GpmMetric::Fp32Util => "NVML_GPM_METRIC_FP32_UTIL",
            GpmMetric::Fp16Util => "NVML_GPM_METRIC_FP16_UTIL",
            GpmMetric::PcieTxPerSec => "NVML_GPM_METRIC_PCIE_TX_PER_SEC",
            GpmMetric::PcieRxPerSec => "NVML_GPM_METRIC_PCIE_RX_PER_SEC",
            GpmMetric::NvlinkTotalTxPerSec => "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC",
            GpmMetric::NvlinkTotalRxPerSec => "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC",
            GpmMetric::NvdecUtil => "NVML_GPM_METRIC_NVDEC_0…7_UTIL",
            GpmMetric::NvjpgUtil => "NVML_GPM_METRIC_NVJPG_0…7_UTIL",
            GpmMetric::NvofaUtil => "NVML_GPM_METRIC_NVOFA_0…1_UTIL",
        }
    }
}

/// A per-GPU reading taken outside NVML (sysfs, `/proc`). None exists yet; each variant added
/// here must get its reader in the sampler (an exhaustive match).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostRead {}

impl HostRead {
    /// Where the number comes from, in words (for the docs).
    pub fn describe(self) -> &'static str {
        match self {}
    }
}

/// Where a metric's value comes from. Every table row names one; the sampler reads the row
/// through it (see the `sampler` module), so a row cannot exist without being read.
#[derive(Debug, Clone, Copy)]
pub enum Source {
    /// A dedicated NVML call.
    Nvml(NvmlCall),
    /// A field of the batched `nvmlDeviceGetFieldValues` call, with an optional dedicated-call
    /// fallback.
    Field(FieldSource),
    /// A GPM metric between this tick's GPM sample and the previous one (GPUs with GPM only).
    Gpm(GpmMetric),
    /// Computed from other metrics.
    Derived(Derivation),
    /// From the GPU's NVLinks, read per link on the slow path (see [`nvlink`]).
    Nvlink(nvlink::NvlinkRead),
    /// Not from NVML.
    Host(HostRead),
}

impl Source {
    /// A dedicated NVML call.
    pub const fn nvml(call: NvmlCall) -> Source {
        Source::Nvml(call)
    }

    /// A field whose NVML unit is already the canonical one, without fallback (see
    /// [`Source::scaled`] and [`Source::or_call`]).
    pub const fn field(field: NvmlField) -> Source {
        Source::Field(FieldSource {
            field,
            scale: 1.0,
            fallback: None,
            rate: false,
            slow: false,
        })
    }

    /// This field, read off the tick path (see [`FieldSource::slow`]). Only for fields (a compile
    /// error in the table otherwise).
    pub const fn slow(self) -> Source {
        match self {
            Source::Field(fs) => Source::Field(FieldSource { slow: true, ..fs }),
            _ => panic!("only a field source is read slow"),
        }
    }

    /// Whether the value is read off the tick path, on the slow cadence.
    pub fn is_slow(&self) -> bool {
        match self {
            Source::Nvml(call) => call.is_slow(),
            Source::Field(fs) => fs.slow,
            Source::Nvlink(_) => true,
            Source::Gpm(_) | Source::Derived(_) | Source::Host(_) => false,
        }
    }

    /// This counter field's per-second rate. Only for fields (a compile error in the table
    /// otherwise).
    pub const fn rate(self) -> Source {
        match self {
            Source::Field(fs) => Source::Field(FieldSource { rate: true, ..fs }),
            _ => panic!("only a field source has a rate"),
        }
    }

    /// This field, multiplied by `scale` to reach the canonical unit. Only for fields (a
    /// compile error in the table otherwise).
    pub const fn scaled(self, scale: f64) -> Source {
        match self {
            Source::Field(fs) => Source::Field(FieldSource { scale, ..fs }),
            _ => panic!("only a field source is scaled"),
        }
    }

    /// This field, read through `call` where the GPU does not support the field. Only for
    /// fields (a compile error in the table otherwise).
    pub const fn or_call(self, call: NvmlCall) -> Source {
        match self {
            Source::Field(fs) => Source::Field(FieldSource {
                fallback: Some(call),
                ..fs
            }),
            _ => panic!("only a field source has a fallback call"),
        }
    }

    /// Whether the value comes from NVML (a call, a field or GPM), as opposed to derived or host.
    pub fn is_nvml(&self) -> bool {
        matches!(
            self,
            Source::Nvml(_) | Source::Field(_) | Source::Gpm(_) | Source::Nvlink(_)
        )
    }

    /// Whether the value comes from GPM (absent on GPUs before Hopper and with GPM off).
    pub fn is_gpm(&self) -> bool {
        matches!(self, Source::Gpm(_))
    }
}

impl std::fmt::Display for Source {
    /// How `docs/metrics.md` shows the source.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Nvml(call) => write!(f, "`{}`", call.describe()),
            Source::Field(fs) => {
                if fs.rate {
                    write!(f, "rate of ")?;
                }
                write!(f, "`nvmlDeviceGetFieldValues({})`", fs.field.name)?;
                if fs.scale != 1.0 {
                    write!(f, " × {}", fs.scale)?;
                }
                match fs.fallback {
                    Some(call) => write!(f, ", else `{}`", call.describe()),
                    None => Ok(()),
                }
            }
            Source::Gpm(m) => {
                write!(f, "`nvmlGpmMetricsGet({})`", m.describe())?;
                if m.scale() != 1.0 {
                    write!(f, " × {}", m.scale())?;
                }
                write!(f, " between two GPM samples a tick apart")
            }
            Source::Derived(d) => write!(f, "derived: {}", d.how),
            Source::Nvlink(n) => write!(f, "`{}` (read off the tick path)", n.describe()),
            Source::Host(h) => write!(f, "host: {}", h.describe()),
        }
    }
}

/// One row of the metric table.
#[derive(Debug, Clone, Copy)]
pub struct MetricDesc {
    /// Which metric this row describes.
    pub id: Metric,
    /// Name used in rules (`gpu.util`), CSV column headers and JSON.
    pub key: &'static str,
    /// Canonical unit of the stored value.
    pub unit: &'static str,
    /// Gauge or counter.
    pub kind: MetricKind,
    /// One-line description (Prometheus HELP text).
    pub help: &'static str,
    /// Where the value comes from; the sampler reads each metric through this.
    pub source: Source,
    /// `nvidia-smi --query-gpu` name, when there is one.
    pub smi: Option<&'static str>,
    /// How nvidia-smi formats it.
    pub smi_unit: SmiUnit,
    /// dcgm-exporter field name, when there is one.
    pub dcgm: Option<&'static str>,
}

impl MetricDesc {
    /// Whether `v` can be a reading of this metric: finite, not negative, a percentage at most
    /// 100, a flag 0 or 1, a temperature at most 200 °C, a P-state at most 15. Importers treat
    /// anything else as a malformed cell (absent), never as a reading.
    pub fn plausible(&self, v: f64) -> bool {
        v.is_finite()
            && v >= 0.0
            && match self.unit {
                "percent" => v <= 100.0,
                "bool" => v == 0.0 || v == 1.0,
                "celsius" => v <= 200.0,
                "pstate" => v <= 15.0,
                "recovery_action" => v <= 4.0 && v.fract() == 0.0,
                _ => true,
            }
    }

    /// Whether a GPU instance (a MIG device's) has a value of this metric of its own: the GPM
    /// rows of its SMs and memory ([`GpmMetric::per_gpu_instance`]). The one list on gpuwatch's
    /// side: what [`MigGpm`] keeps, the sampler asks per GPU instance and the scrape importer
    /// reads from a MIG device's series.
    pub fn per_gpu_instance(&self) -> bool {
        matches!(self.source, Source::Gpm(g) if g.per_gpu_instance())
    }

    /// dcgm-exporter's unit of this metric and how a value in gpuwatch's unit reaches it:
    /// `(unit, multiply by, divide by)`: framebuffer memory in MiB, energy in mJ, DCGM's NVLink
    /// bandwidth total in MB/s, the profiling activities (`DCGM_FI_PROF_*`) as ratios 0–1 (its
    /// device utilizations stay percentages), the rest as gpuwatch keeps them; `None` without a
    /// dcgm-exporter name. `/metrics` converts with it and the scrape importer inverts it.
    pub fn dcgm_unit(&self) -> Option<(&'static str, f64, f64)> {
        let name = self.dcgm?;
        Some(match self.unit {
            "bytes" => ("MiB", 1.0, 1_048_576.0),
            "joules" => ("mJ", 1000.0, 1.0),
            "bytes_per_second" if name == "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" => {
                ("MB/s", 1.0, 1_000_000.0)
            }
            "percent" if name.starts_with("DCGM_FI_PROF_") => ("ratio", 1.0, 100.0),
            u => (u, 1.0, 1.0),
        })
    }
}

macro_rules! metrics {
    ($( $variant:ident => { key: $key:literal, unit: $unit:literal, kind: $kind:ident, help: $help:literal,
        source: $source:expr, smi: $smi:expr, smi_unit: $smiu:ident, dcgm: $dcgm:expr } ),* $(,)?) => {
        /// Every metric gpuwatch samples per GPU. The discriminant indexes [`METRICS`] and
        /// [`MetricValues`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        #[repr(u8)]
        pub enum Metric { $( #[doc = $help] $variant ),* }

        /// The metric table: one row per [`Metric`], in discriminant order.
        pub const METRICS: &[MetricDesc] = &[ $( MetricDesc {
            id: Metric::$variant, key: $key, unit: $unit, kind: MetricKind::$kind, help: $help,
            source: $source, smi: $smi, smi_unit: SmiUnit::$smiu, dcgm: $dcgm,
        } ),* ];
    };
}

metrics! {
    Util => { key: "util", unit: "percent", kind: Gauge,
        help: "Percent of time over the past sample period during which one or more kernels ran on the GPU",
        source: Source::nvml(NvmlCall::UtilizationGpu),
        smi: Some("utilization.gpu"), smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_GPU_UTIL") },
    MemUtil => { key: "mem_util", unit: "percent", kind: Gauge,
        help: "Percent of time over the past sample period during which device memory was read or written",
        source: Source::nvml(NvmlCall::UtilizationMemory),
        smi: Some("utilization.memory"), smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_MEM_COPY_UTIL") },
    MemUsed => { key: "mem_used", unit: "bytes", kind: Gauge,
        help: "Device memory allocated by active contexts",
        source: Source::nvml(NvmlCall::MemoryUsed), smi: Some("memory.used"), smi_unit: MiB,
        dcgm: Some("DCGM_FI_DEV_FB_USED") },
    MemFree => { key: "mem_free", unit: "bytes", kind: Gauge,
        help: "Device memory not allocated",
        source: Source::nvml(NvmlCall::MemoryFree), smi: Some("memory.free"), smi_unit: MiB,
        dcgm: Some("DCGM_FI_DEV_FB_FREE") },
    MemTotal => { key: "mem_total", unit: "bytes", kind: Gauge,
        help: "Total installed device memory",
        source: Source::nvml(NvmlCall::MemoryTotal), smi: Some("memory.total"), smi_unit: MiB,
        dcgm: Some("DCGM_FI_DEV_FB_TOTAL") },
    MemReserved => { key: "mem_reserved", unit: "bytes", kind: Gauge,
        help: "Device memory reserved by the driver and firmware",
        source: Source::nvml(NvmlCall::MemoryReserved), smi: Some("memory.reserved"), smi_unit: MiB,
        dcgm: Some("DCGM_FI_DEV_FB_RESERVED") },
    Temp => { key: "temp", unit: "celsius", kind: Gauge,
        help: "GPU core temperature",
        source: Source::nvml(NvmlCall::TemperatureGpu),
        smi: Some("temperature.gpu"), smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_GPU_TEMP") },
    MemTemp => { key: "mem_temp", unit: "celsius", kind: Gauge,
        help: "HBM memory temperature",
        source: Source::field(NvmlField::MEMORY_TEMP),
        smi: Some("temperature.memory"), smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_MEMORY_TEMP") },
    TempSlowdown => { key: "temp_slowdown", unit: "celsius", kind: Gauge,
        help: "Temperature at which the GPU slows its clocks (NVML's slowdown threshold, T.Limit 0); fixed per board (read off the tick path)",
        source: Source::nvml(NvmlCall::TemperatureSlowdown),
        smi: None, smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_SLOWDOWN_TEMP") },
    Power => { key: "power", unit: "watts", kind: Gauge,
        help: "Power draw of the board",
        source: Source::nvml(NvmlCall::PowerUsage), smi: Some("power.draw"), smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_POWER_USAGE") },
    PowerLimit => { key: "power_limit", unit: "watts", kind: Gauge,
        help: "Enforced power limit",
        source: Source::nvml(NvmlCall::EnforcedPowerLimit),
        smi: Some("enforced.power.limit"), smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_ENFORCED_POWER_LIMIT") },
    Energy => { key: "energy", unit: "joules", kind: Counter,
        help: "Energy consumed since the driver was loaded: the driver's counter, read every 720 process intervals and at most hourly (it costs the driver milliseconds of CPU), plus the power readings integrated since",
        source: Source::field(NvmlField::TOTAL_ENERGY_CONSUMPTION)
            .scaled(0.001)
            .slow()
            .or_call(NvmlCall::TotalEnergyConsumption),
        smi: None, smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") },
    SmClock => { key: "sm_clock", unit: "MHz", kind: Gauge,
        help: "Current SM clock",
        source: Source::nvml(NvmlCall::ClockSm), smi: Some("clocks.sm"), smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_SM_CLOCK") },
    MemClock => { key: "mem_clock", unit: "MHz", kind: Gauge,
        help: "Current memory clock",
        source: Source::nvml(NvmlCall::ClockMem), smi: Some("clocks.mem"), smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_MEM_CLOCK") },
    ClockEventReasons => { key: "clock_event_reasons", unit: "bitmask", kind: Gauge,
        help: "Active clock event (throttle) reasons, NVML bitmask",
        source: Source::nvml(NvmlCall::ClockEventReasons),
        smi: Some("clocks_event_reasons.active"), smi_unit: Hex,
        dcgm: Some("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS") },
    Pstate => { key: "pstate", unit: "pstate", kind: Gauge,
        help: "Performance state, 0 (maximum) to 15 (minimum)",
        source: Source::nvml(NvmlCall::PerformanceState), smi: Some("pstate"), smi_unit: Pstate,
        dcgm: None },
    Fan => { key: "fan", unit: "percent", kind: Gauge,
        help: "Intended fan speed as a percent of maximum",
        source: Source::nvml(NvmlCall::FanSpeed), smi: Some("fan.speed"), smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_FAN_SPEED") },
    EccCorrected => { key: "ecc_corrected", unit: "errors", kind: Counter,
        help: "Corrected (single-bit) volatile ECC errors since the last driver load",
        source: Source::field(NvmlField::ECC_SBE_VOL_TOTAL).or_call(NvmlCall::EccCorrectedVolatile),
        smi: Some("ecc.errors.corrected.volatile.total"), smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL") },
    EccUncorrected => { key: "ecc_uncorrected", unit: "errors", kind: Counter,
        help: "Uncorrected (double-bit) volatile ECC errors since the last driver load",
        source: Source::field(NvmlField::ECC_DBE_VOL_TOTAL)
            .or_call(NvmlCall::EccUncorrectedVolatile),
        smi: Some("ecc.errors.uncorrected.volatile.total"), smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") },
    RetiredSbe => { key: "retired_sbe", unit: "pages", kind: Counter,
        help: "Pages retired after single-bit ECC errors (pre-Ampere)",
        source: Source::field(NvmlField::RETIRED_SBE).or_call(NvmlCall::RetiredPagesSbe),
        smi: Some("retired_pages.single_bit_ecc.count"), smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_RETIRED_SBE") },
    RetiredDbe => { key: "retired_dbe", unit: "pages", kind: Counter,
        help: "Pages retired after double-bit ECC errors (pre-Ampere)",
        source: Source::field(NvmlField::RETIRED_DBE).or_call(NvmlCall::RetiredPagesDbe),
        smi: Some("retired_pages.double_bit.count"), smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_RETIRED_DBE") },
    RetiredPending => { key: "retired_pending", unit: "bool", kind: Gauge,
        help: "1 when a page retirement waits for the next driver reload (pre-Ampere)",
        source: Source::field(NvmlField::RETIRED_PENDING)
            .or_call(NvmlCall::RetiredPagesPending),
        smi: Some("retired_pages.pending"), smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_RETIRED_PENDING") },
    RemappedCorrectable => { key: "remapped_correctable", unit: "rows", kind: Counter,
        help: "Rows remapped after correctable errors (Ampere and later)",
        source: Source::field(NvmlField::REMAPPED_COR),
        smi: Some("remapped_rows.correctable"), smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS") },
    RemappedUncorrectable => { key: "remapped_uncorrectable", unit: "rows", kind: Counter,
        help: "Rows remapped after uncorrectable errors (Ampere and later)",
        source: Source::field(NvmlField::REMAPPED_UNC),
        smi: Some("remapped_rows.uncorrectable"), smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS") },
    RemapPending => { key: "remap_pending", unit: "bool", kind: Gauge,
        help: "1 when a row remapping waits for a GPU reset (Ampere and later)",
        source: Source::field(NvmlField::REMAPPED_PENDING),
        smi: Some("remapped_rows.pending"), smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_ROW_REMAP_PENDING") },
    RemapFailure => { key: "remap_failure", unit: "bool", kind: Gauge,
        help: "1 when a row remapping failed (Ampere and later); the GPU needs service",
        source: Source::field(NvmlField::REMAPPED_FAILURE),
        smi: Some("remapped_rows.failure"), smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_ROW_REMAP_FAILURE") },
    RecoveryAction => { key: "recovery_action", unit: "recovery_action", kind: Gauge,
        help: "NVIDIA's recommended recovery action: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset (r570 and later)",
        source: Source::field(NvmlField::GPU_RECOVERY_ACTION),
        smi: None, smi_unit: Same,
        dcgm: None },
    PcieRx => { key: "pcie_rx", unit: "bytes_per_second", kind: Gauge,
        help: "PCIe receive throughput: the rate of the driver's byte counter between two slow reads at least 0.5 s apart (absent until then; `status` uses the 20 ms window), else its 20 ms window (read off the tick path)",
        source: Source::field(NvmlField::PCIE_COUNT_RX_BYTES).rate().slow().or_call(NvmlCall::PcieRx),
        smi: None, smi_unit: Same,
        dcgm: None },
    PcieTx => { key: "pcie_tx", unit: "bytes_per_second", kind: Gauge,
        help: "PCIe transmit throughput: the rate of the driver's byte counter between two slow reads at least 0.5 s apart (absent until then; `status` uses the 20 ms window), else its 20 ms window (read off the tick path)",
        source: Source::field(NvmlField::PCIE_COUNT_TX_BYTES).rate().slow().or_call(NvmlCall::PcieTx),
        smi: None, smi_unit: Same,
        dcgm: None },
    PcieReplay => { key: "pcie_replay", unit: "replays", kind: Counter,
        help: "PCIe replay counter (link retransmissions; read off the tick path)",
        source: Source::field(NvmlField::PCIE_REPLAY_COUNTER)
            .slow()
            .or_call(NvmlCall::PcieReplayCounter),
        smi: None, smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_PCIE_REPLAY_COUNTER") },
    EncUtil => { key: "enc_util", unit: "percent", kind: Gauge,
        help: "Video encoder utilization",
        source: Source::nvml(NvmlCall::EncoderUtilization),
        smi: Some("utilization.encoder"), smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_ENC_UTIL") },
    DecUtil => { key: "dec_util", unit: "percent", kind: Gauge,
        help: "Video decoder utilization",
        source: Source::nvml(NvmlCall::DecoderUtilization),
        smi: Some("utilization.decoder"), smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_DEC_UTIL") },
    // GPM rows (Hopper and later): averages over the interval between two ticks, absent at the
    // first tick, on older GPUs and with GPM off. Exported as DCGM's profiling fields, whose
    // activities are ratios 0–1 (the exporter divides percentages by 100).
    GrEngineActive => { key: "gr_engine_active", unit: "percent", kind: Gauge,
        help: "Percent of time the graphics/compute engine had work (GPM; Hopper and later)",
        source: Source::Gpm(GpmMetric::GraphicsUtil), smi: None, smi_unit: Same,
        dcgm: Some("DCGM_FI_PROF_GR_ENGINE_ACTIVE") },
    SmActive => { key: "sm_active", unit: "percent", kind: Gauge,
        help: "Percent of time the SMs had at least one warp, averaged over the SMs: utilization 100 % with SM active low is a GPU busy with kernels too small to fill it (GPM; Hopper and later)",
        source: Source::Gpm(GpmMetric::SmUtil), smi: None, smi_unit: Same,
        dcgm: Some("DCGM_FI_PROF_SM_ACTIVE") },
    SmOccupancy => { key: "sm_occupancy", unit: "percent", kind: Gauge,
        help: "Warps resident on the SMs as a percent of their maximum (GPM; Hopper and later)",
        source: Source::Gpm(GpmMetric::SmOccupancy), smi: None, smi_unit: Same,
        dcgm: Some("DCGM_FI_PROF_SM_OCCUPANCY") },
    TensorActive => { key: "tensor_active", unit: "percent", kind: Gauge,
        help: "Percent of time any tensor pipe was active (GPM; Hopper and later)",
        source: Source::Gpm(GpmMetric::AnyTensorUtil), smi: None, smi_unit: Same,
        dcgm: Some("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE") },
    HmmaActive => { key: "hmma_active", unit: "percent", kind: Gauge,
        help: "Percent of time the fp16/bf16 (HMMA) tensor pipe was active (GPM; Hopper and later)",
        source: Source::Gpm(GpmMetric::HmmaTensorUtil), smi: None, smi_unit: Same,
        dcgm: Some("DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE") },
    ImmaActive => { key: "imma_active", unit: "percent", kind: Gauge,
        help: "Percent of time the integer (IMMA) tensor pipe was active (GPM; Hopper and later)",
        source: Source::Gpm(GpmMetric::ImmaTensorUtil), smi: None, smi_unit: Same,
        dcgm: Some("DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE") },
    DfmaActive => { key: "dfma_active", unit: "percent", kind: Gauge,
        help: "Percent of time the fp64 (DFMA) tensor pipe was active (GPM; Hopper and later)",
        source: Source::Gpm(GpmMetric::DfmaTensorUtil), smi: None, smi_unit: Same,
        dcgm: Some("DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE") },
    DramActive => { key: "dram_active", unit: "percent", kind: Gauge,
        help: "DRAM bandwidth used as a percent of the peak; near 100 % the work is memory-bound (GPM; Hopper and later)",
        source: Source::Gpm(GpmMetric::DramBwUtil), smi: None, smi_unit: Same,
        dcgm: Some("DCGM_FI_PROF_DRAM_ACTIVE") },
    Fp64Active => { key: "fp64_active", unit: "percent", kind: Gauge,
        help: "Percent of time the non-tensor fp64 pipe was active (GPM; Hopper and later)",
        source: Source::Gpm(GpmMetric::Fp64Util), smi: None, smi_unit: Same,
        dcgm: Some("DCGM_FI_PROF_PIPE_FP64_ACTIVE") },
    Fp32Active => { key: "fp32_active", unit: "percent", kind: Gauge,
        help: "Percent of time the non-tensor fp32 pipe was active (GPM; Hopper and later)",
        source: Source::Gpm(GpmMetric::Fp32Util), smi: None, smi_unit: Same,
        dcgm: Some("DCGM_FI_PROF_PIPE_FP32_ACTIVE") },
    Fp16Active => { key: "fp16_active", unit: "percent", kind: Gauge,
        help: "Percent of time the non-tensor fp16 pipe was active (GPM; Hopper and later)",
        source: Source::Gpm(GpmMetric::Fp16Util), smi: None, smi_unit: Same,
        dcgm: Some("DCGM_FI_PROF_PIPE_FP16_ACTIVE") },
    PcieTxBytes => { key: "pcie_tx_bytes", unit: "bytes_per_second", kind: Gauge,
        help: "PCIe transmit throughput between two ticks, from GPM (Hopper and later; `pcie_tx` is the driver's byte counter)",
        source: Source::Gpm(GpmMetric::PcieTxPerSec), smi: None, smi_unit: Same,
        dcgm: Some("DCGM_FI_PROF_PCIE_TX_BYTES") },
    PcieRxBytes => { key: "pcie_rx_bytes", unit: "bytes_per_second", kind: Gauge,
        help: "PCIe receive throughput between two ticks, from GPM (Hopper and later; `pcie_rx` is the driver's byte counter)",
        source: Source::Gpm(GpmMetric::PcieRxPerSec), smi: None, smi_unit: Same,
        dcgm: Some("DCGM_FI_PROF_PCIE_RX_BYTES") },
    NvlinkTxBytes => { key: "nvlink_tx_bytes", unit: "bytes_per_second", kind: Gauge,
        help: "NVLink transmit throughput over every link between two ticks (GPM; Hopper and later)",
        source: Source::Gpm(GpmMetric::NvlinkTotalTxPerSec), smi: None, smi_unit: Same,
        dcgm: Some("DCGM_FI_PROF_NVLINK_TX_BYTES") },
    NvlinkRxBytes => { key: "nvlink_rx_bytes", unit: "bytes_per_second", kind: Gauge,
        help: "NVLink receive throughput over every link between two ticks (GPM; Hopper and later)",
        source: Source::Gpm(GpmMetric::NvlinkTotalRxPerSec), smi: None, smi_unit: Same,
        dcgm: Some("DCGM_FI_PROF_NVLINK_RX_BYTES") },
    NvdecUtil => { key: "nvdec_util", unit: "percent", kind: Gauge,
        help: "Video decoder (NVDEC) utilization, the mean over the GPU's decoders (GPM; Hopper and later)",
        source: Source::Gpm(GpmMetric::NvdecUtil), smi: None, smi_unit: Same,
        dcgm: None },
    NvjpgUtil => { key: "nvjpg_util", unit: "percent", kind: Gauge,
        help: "JPEG decoder (NVJPG) utilization, the mean over the GPU's decoders (GPM; Hopper and later)",
        source: Source::Gpm(GpmMetric::NvjpgUtil), smi: None, smi_unit: Same,
        dcgm: None },
    NvofaUtil => { key: "nvofa_util", unit: "percent", kind: Gauge,
        help: "Optical flow accelerator (NVOFA) utilization (GPM; Hopper and later)",
        source: Source::Gpm(GpmMetric::NvofaUtil), smi: None, smi_unit: Same,
        dcgm: None },
    // NVLink rows (GPUs with NVLink; absent on PCIe boards): the links read on the slow path,
    // summed per GPU. Per-link details are in `status --json` and `doctor`.
    NvlinkCrcFlitErrors => { key: "nvlink_crc_flit_errors", unit: "errors", kind: Counter,
        help: "NVLink CRC flit errors since the driver loaded, every link (read off the tick path)",
        source: Source::Nvlink(nvlink::NvlinkRead::CrcFlitErrors), smi: None, smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL") },
    NvlinkCrcDataErrors => { key: "nvlink_crc_data_errors", unit: "errors", kind: Counter,
        help: "NVLink CRC data errors since the driver loaded, every link (read off the tick path)",
        source: Source::Nvlink(nvlink::NvlinkRead::CrcDataErrors), smi: None, smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL") },
    NvlinkReplayErrors => { key: "nvlink_replay_errors", unit: "errors", kind: Counter,
        help: "NVLink replay (retransmission) errors since the driver loaded, every link (read off the tick path)",
        source: Source::Nvlink(nvlink::NvlinkRead::ReplayErrors), smi: None, smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL") },
    NvlinkRecoveryErrors => { key: "nvlink_recovery_errors", unit: "errors", kind: Counter,
        help: "NVLink recovery errors (link retrained) since the driver loaded, every link (read off the tick path)",
        source: Source::Nvlink(nvlink::NvlinkRead::RecoveryErrors), smi: None, smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL") },
    NvlinkBandwidth => { key: "nvlink_bandwidth", unit: "bytes_per_second", kind: Gauge,
        help: "NVLink data sent plus received per second, every link, between two slow reads (read off the tick path)",
        source: Source::Nvlink(nvlink::NvlinkRead::Bandwidth), smi: None, smi_unit: Same,
        dcgm: Some("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL") },
    NvlinkLinksDown => { key: "nvlink_links_down", unit: "links", kind: Gauge,
        help: "NVLinks that are down (read off the tick path)",
        source: Source::Nvlink(nvlink::NvlinkRead::LinksDown), smi: None, smi_unit: Same,
        dcgm: None },
    NvlinkDownPeers => { key: "nvlink_down_peers", unit: "bitmask", kind: Gauge,
        help: "The GPUs at the far end of the NVLinks that are down, bit N = GPU N (0 when none is down or the far end is an NVSwitch; read off the tick path)",
        source: Source::Nvlink(nvlink::NvlinkRead::DownPeers), smi: None, smi_unit: Same,
        dcgm: None },
}

/// Number of metrics in the table.
pub const METRIC_COUNT: usize = METRICS.len();

impl Metric {
    /// This metric's row in the table.
    pub fn desc(self) -> &'static MetricDesc {
        &METRICS[self as usize]
    }

    /// The rule/CSV name of this metric.
    pub fn key(self) -> &'static str {
        self.desc().key
    }

    /// Looks a metric up by its rule/CSV name.
    pub fn from_key(key: &str) -> Option<Metric> {
        METRICS.iter().find(|d| d.key == key).map(|d| d.id)
    }

    /// Every metric, in table order.
    pub fn all() -> impl Iterator<Item = Metric> {
        METRICS.iter().map(|d| d.id)
    }

    /// Whether a GPU instance has a value of this metric of its own
    /// ([`MetricDesc::per_gpu_instance`]).
    pub fn per_gpu_instance(self) -> bool {
        self.desc().per_gpu_instance()
    }
}

/// NVML clock event (throttle) reason bits, with the names rules use in `gpu.throttled(..)`.
pub const CLOCK_EVENT_REASONS: &[(&str, u64)] = &[
    ("gpu_idle", 0x1),
    ("applications_clocks", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal", 0x20),
    ("hw_thermal", 0x40),
    ("hw_power_brake", 0x80),
    ("display_clocks", 0x100),
];

/// Reason groups: `thermal` is either thermal slowdown, `power` is the software power cap or the
/// hardware power brake.
pub const CLOCK_EVENT_GROUPS: &[(&str, u64)] = &[("thermal", 0x20 | 0x40), ("power", 0x4 | 0x80)];

/// The bitmask for a reason or group name (`"thermal"`, `"sw_power_cap"`, …).
pub fn clock_event_mask(name: &str) -> Option<u64> {
    CLOCK_EVENT_REASONS
        .iter()
        .chain(CLOCK_EVENT_GROUPS)
        .find(|(n, _)| *n == name)
        .map(|(_, m)| *m)
}

/// Names of the reason bits set in `mask` (groups not included).
pub fn clock_event_names(mask: u64) -> Vec<&'static str> {
    CLOCK_EVENT_REASONS
        .iter()
        .filter(|(_, bit)| mask & bit != 0)
        .map(|(n, _)| *n)
        .collect()
}

/// One value per metric, `None` where the GPU could not give it.
///
/// Stored as plain `f64`s with one NaN bit pattern ([`ABSENT`]) standing for "no value": half
/// the size of `Option<f64>`s (8 bytes a metric instead of 16). Snapshots are built, moved
/// and copied at every tick and every imported row, so their size is much of what those cost.
#[derive(Clone)]
pub struct MetricValues([f64; METRIC_COUNT]);

/// The bits of an absent value: a NaN no arithmetic produces (NaNs that arithmetic makes are
/// quiet with an empty payload); a value given as this NaN is kept as the ordinary NaN. (A
/// signalling NaN: on 32-bit x86 with x87 floats a copy could quieten it; gpuwatch builds for
/// x86-64 and aarch64, which copy it bit for bit.)
const ABSENT: u64 = 0x7ff4_6177_6174_6368;

impl Default for MetricValues {
    fn default() -> Self {
        MetricValues([f64::from_bits(ABSENT); METRIC_COUNT])
    }
}

impl MetricValues {
    /// The value of `m`, if the GPU gave one.
    pub fn get(&self, m: Metric) -> Option<f64> {
        Self::value(self.0[m as usize])
    }

    /// Sets (or clears) the value of `m`.
    pub fn set(&mut self, m: Metric, v: Option<f64>) {
        self.0[m as usize] = match v {
            Some(x) if x.to_bits() == ABSENT => f64::NAN,
            Some(x) => x,
            None => f64::from_bits(ABSENT),
        };
    }

    /// The value of the metric at position `i` of [`METRICS`] (`None` past the end).
    pub fn at(&self, i: usize) -> Option<f64> {
        self.0.get(i).and_then(|v| Self::value(*v))
    }

    /// Every metric's value, in the order of [`METRICS`].
    pub fn iter(&self) -> impl Iterator<Item = Option<f64>> + '_ {
        self.0.iter().map(|v| Self::value(*v))
    }

    fn value(v: f64) -> Option<f64> {
        (v.to_bits() != ABSENT).then_some(v)
    }
}

impl PartialEq for MetricValues {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl std::fmt::Debug for MetricValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for MetricValues {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        for d in METRICS {
            if let Some(v) = self.get(d.id) {
                map.serialize_entry(d.key, &v)?;
            }
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for MetricValues {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = std::collections::BTreeMap::<String, f64>::deserialize(d)?;
        let mut out = MetricValues::default();
        for (k, v) in raw {
            if let Some(m) = Metric::from_key(&k) {
                out.set(m, Some(v));
            }
        }
        Ok(out)
    }
}

/// What gpuwatch knows about a device's health as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceState {
    /// Answering NVML calls.
    #[default]
    Ok,
    /// NVML said `GPU_IS_LOST` (fallen off the bus); the device gives no more values.
    Lost,
    /// A call on this device has not returned within the sampler's deadline (a wedged driver,
    /// a GPU in reset): the function named has been blocked since. Values the device still
    /// gives on its other path are kept; the blocked ones are absent.
    Stalled(NvmlFunction),
}

impl DeviceState {
    /// `ok`, `lost` or `stalled:FUNCTION`, as recordings write it.
    pub fn label(self) -> std::borrow::Cow<'static, str> {
        match self {
            DeviceState::Ok => "ok".into(),
            DeviceState::Lost => "lost".into(),
            DeviceState::Stalled(f) => format!("stalled:{}", f.symbol()).into(),
        }
    }

    /// Reads [`DeviceState::label`] back (`stalled` alone names no function).
    pub fn from_label(s: &str) -> Option<DeviceState> {
        match s {
            "" | "ok" => Some(DeviceState::Ok),
            "lost" => Some(DeviceState::Lost),
            "stalled" => Some(DeviceState::Stalled(NvmlFunction::Unknown)),
            _ => {
                let f = s.strip_prefix("stalled:")?;
                Some(DeviceState::Stalled(
                    NvmlFunction::from_symbol(f).unwrap_or(NvmlFunction::Unknown),
                ))
            }
        }
    }

    /// The function a stalled device is blocked in.
    pub fn stalled_in(self) -> Option<NvmlFunction> {
        match self {
            DeviceState::Stalled(f) => Some(f),
            _ => None,
        }
    }
}

macro_rules! nvml_functions {
    ($( $variant:ident => $symbol:literal ),* $(,)?) => {
        /// An NVML function the sampler calls on a device, to name a call that hung.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum NvmlFunction {
            $( #[doc = $symbol] #[serde(rename = $symbol)] $variant, )*
            /// A function not named (e.g. read back from a recording that said only `stalled`).
            #[serde(rename = "unknown")]
            Unknown,
        }

        impl NvmlFunction {
            /// Every named function.
            pub const ALL: &'static [NvmlFunction] = &[$(NvmlFunction::$variant),*];

            /// Its position in [`NvmlFunction::ALL`] (`ALL.len()` for `Unknown`): the
            /// declaration order, so no search.
            pub const fn pos(self) -> usize {
                self as usize
            }

            /// The C symbol (without nvml-wrapper's version suffix).
            pub fn symbol(self) -> &'static str {
                match self {
                    $( NvmlFunction::$variant => $symbol, )*
                    NvmlFunction::Unknown => "unknown",
                }
            }
        }
    };
}

nvml_functions! {
    HandleByIndex => "nvmlDeviceGetHandleByIndex",
    Uuid => "nvmlDeviceGetUUID",
    Name => "nvmlDeviceGetName",
    PciInfo => "nvmlDeviceGetPciInfo",
    MinorNumber => "nvmlDeviceGetMinorNumber",
    FieldValues => "nvmlDeviceGetFieldValues",
    UtilizationRates => "nvmlDeviceGetUtilizationRates",
    MemoryInfo => "nvmlDeviceGetMemoryInfo",
    Temperature => "nvmlDeviceGetTemperature",
    TemperatureThreshold => "nvmlDeviceGetTemperatureThreshold",
    PowerUsage => "nvmlDeviceGetPowerUsage",
    EnforcedPowerLimit => "nvmlDeviceGetEnforcedPowerLimit",
    TotalEnergyConsumption => "nvmlDeviceGetTotalEnergyConsumption",
    ClockInfo => "nvmlDeviceGetClockInfo",
    ClocksEventReasons => "nvmlDeviceGetCurrentClocksEventReasons",
    PerformanceState => "nvmlDeviceGetPerformanceState",
    FanSpeed => "nvmlDeviceGetFanSpeed",
    TotalEccErrors => "nvmlDeviceGetTotalEccErrors",
    RetiredPages => "nvmlDeviceGetRetiredPages",
    RetiredPagesPendingStatus => "nvmlDeviceGetRetiredPagesPendingStatus",
    PcieThroughput => "nvmlDeviceGetPcieThroughput",
    PcieReplayCounter => "nvmlDeviceGetPcieReplayCounter",
    EncoderUtilization => "nvmlDeviceGetEncoderUtilization",
    DecoderUtilization => "nvmlDeviceGetDecoderUtilization",
    ComputeRunningProcesses => "nvmlDeviceGetComputeRunningProcesses",
    GraphicsRunningProcesses => "nvmlDeviceGetGraphicsRunningProcesses",
    ProcessName => "nvmlSystemGetProcessName",
    MigMode => "nvmlDeviceGetMigMode",
    MaxMigDeviceCount => "nvmlDeviceGetMaxMigDeviceCount",
    MigDeviceHandleByIndex => "nvmlDeviceGetMigDeviceHandleByIndex",
    GpuInstanceId => "nvmlDeviceGetGpuInstanceId",
    ComputeInstanceId => "nvmlDeviceGetComputeInstanceId",
    GpuInstanceById => "nvmlDeviceGetGpuInstanceById",
    GpuInstanceGetInfo => "nvmlGpuInstanceGetInfo",
    GpmQueryDeviceSupport => "nvmlGpmQueryDeviceSupport",
    GpmSampleAlloc => "nvmlGpmSampleAlloc",
    GpmSampleGet => "nvmlGpmSampleGet",
    GpmMigSampleGet => "nvmlGpmMigSampleGet",
    GpmMetricsGet => "nvmlGpmMetricsGet",
    NvLinkState => "nvmlDeviceGetNvLinkState",
    NvLinkVersion => "nvmlDeviceGetNvLinkVersion",
    NvLinkErrorCounter => "nvmlDeviceGetNvLinkErrorCounter",
    NvLinkRemotePciInfo => "nvmlDeviceGetNvLinkRemotePciInfo",
    NvLinkRemoteDeviceType => "nvmlDeviceGetNvLinkRemoteDeviceType",
    HandleByPciBusId => "nvmlDeviceGetHandleByPciBusId",
    Index => "nvmlDeviceGetIndex",
}

impl NvmlFunction {
    /// The function with this symbol (a version suffix such as `_v3` is ignored).
    pub fn from_symbol(s: &str) -> Option<NvmlFunction> {
        let base = match s.rsplit_once("_v") {
            Some((b, v)) if !v.is_empty() && v.bytes().all(|c| c.is_ascii_digit()) => b,
            _ => s,
        };
        NvmlFunction::ALL
            .iter()
            .copied()
            .find(|f| f.symbol() == base)
    }
}

/// Stable identity of a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DeviceId {
    /// NVML index (enumeration order, PCI bus order by default).
    pub index: u32,
    /// Minor number: `/dev/nvidiaN`, the host's numbering even inside a container.
    pub minor: Option<u32>,
    /// `GPU-xxxxxxxx-…` UUID.
    pub uuid: String,
    /// `00000000:07:00.0` style PCI bus id.
    pub pci_bus_id: String,
    /// Marketing name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
}

/// One GPU at one tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuSample {
    /// Sample time, UTC milliseconds since the Unix epoch.
    pub time_ms: i64,
    /// Which GPU.
    #[serde(flatten)]
    pub id: DeviceId,
    /// Whether the device answered.
    pub state: DeviceState,
    /// Metric values (absent = not supported / not available).
    pub values: MetricValues,
}

impl GpuSample {
    /// The value of `m`, if present.
    pub fn get(&self, m: Metric) -> Option<f64> {
        self.values.get(m)
    }
}

/// A process using a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcSample {
    /// Host PID as NVML reports it.
    pub pid: u32,
    /// Index of the GPU it runs on.
    pub gpu_index: u32,
    /// UUID of that GPU.
    pub gpu_uuid: String,
    /// Used GPU memory in bytes; `None` when NVML cannot tell (e.g. under some containers).
    pub used_mem_bytes: Option<u64>,
    /// `compute` or `graphics`.
    pub kind: ProcKind,
    /// Owner's uid, from `/proc/PID/status` when visible.
    pub uid: Option<u32>,
    /// Owner's user name.
    pub user: Option<String>,
    /// Command line from `/proc/PID/cmdline`, arguments joined by spaces.
    pub command: Option<String>,
    /// Container id from `/proc/PID/cgroup`, when in a container.
    pub container: Option<String>,
    /// Seconds since the process started, from `/proc/PID/stat`.
    pub runtime_s: Option<f64>,
    /// When the process started, clock ticks since boot (`/proc/PID/stat` field 22): with the
    /// pid, the process's identity across PID reuse. `None` when `/proc` does not show it
    /// (another PID namespace, imported logs, recordings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ticks: Option<u64>,
}

/// How [`ProcSample::container`] names a Slurm job: `slurm job 77`.
pub const SLURM_JOB_PREFIX: &str = "slurm job ";

/// The Slurm jobs of `procs` (their cgroups' `job_N`), distinct, in numeric order and joined
/// with commas: the `hpc_job` label of a GPU, as dcgm-exporter names it. `None` without any.
pub fn hpc_jobs<'a>(procs: impl Iterator<Item = &'a ProcSample>) -> Option<String> {
    let mut jobs: Vec<&str> = procs.filter_map(ProcSample::slurm_job).collect();
    jobs.sort_by_key(|j| (j.len(), *j));
    jobs.dedup();
    (!jobs.is_empty()).then(|| jobs.join(","))
}

impl ProcSample {
    /// The job the process belongs to, as far as gpuwatch can tell: its container (a Docker or
    /// Kubernetes container, a Slurm job's cgroup: `slurm job 77`), else its user (`user
    /// alice`, or `uid 1000`); `None` when neither is known (a log that names no owner). Two
    /// processes with different keys are not ranks of one job: another user's run, another
    /// container (`gpu_straggler` compares a GPU only with GPUs of its own job).
    pub fn job_key(&self) -> Option<String> {
        if let Some(c) = &self.container {
            return Some(c.clone());
        }
        match (&self.user, self.uid) {
            (Some(u), _) => Some(format!("user {u}")),
            (None, Some(uid)) => Some(format!("uid {uid}")),
            (None, None) => None,
        }
    }

    /// The Slurm job the process runs in (from its cgroup), e.g. `77`.
    pub fn slurm_job(&self) -> Option<&str> {
        self.container.as_deref()?.strip_prefix(SLURM_JOB_PREFIX)
    }

    /// A compute process known only by what NVML says (pid, GPU, used memory); the `/proc`
    /// details (user, command, container, runtime) are unknown.
    pub fn compute(
        pid: u32,
        gpu_index: u32,
        gpu_uuid: impl Into<String>,
        used_mem_bytes: Option<u64>,
    ) -> ProcSample {
        ProcSample {
            pid,
            gpu_index,
            gpu_uuid: gpu_uuid.into(),
            used_mem_bytes,
            kind: ProcKind::Compute,
            uid: None,
            user: None,
            command: None,
            container: None,
            runtime_s: None,
            start_ticks: None,
        }
    }
}

/// Kind of GPU context a process holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcKind {
    /// CUDA / compute context.
    Compute,
    /// Graphics context.
    Graphics,
}

/// Where a GPU instance sits on its GPU, in memory slices (`nvmlGpuInstancePlacement_t`; an
/// A100 or H100 has 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigPlacement {
    /// First memory slice.
    pub start: u32,
    /// Memory slices.
    pub size: u32,
}

/// One MIG device of a GPU with MIG on: a GPU instance and the compute instance in it, which
/// is what CUDA runs on and what `CUDA_VISIBLE_DEVICES=MIG-…` names. Read on the slow path (see
/// `sampler::mig`); carried in every snapshot while fresh ([`Snapshot::mig`]). Unknown values
/// are `None`, never 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigSample {
    /// Index of its GPU.
    pub gpu_index: u32,
    /// UUID of its GPU.
    pub gpu_uuid: String,
    /// Its index on the GPU (`nvmlDeviceGetMigDeviceHandleByIndex`).
    pub index: u32,
    /// `MIG-…` UUID.
    pub uuid: String,
    /// GPU instance id (dcgm-exporter's `GPU_I_ID`).
    pub gpu_instance_id: u32,
    /// Compute instance id.
    pub compute_instance_id: u32,
    /// Profile, e.g. `1g.10gb` (dcgm-exporter's `GPU_I_PROFILE`), from the name NVML gives the
    /// MIG device (`NVIDIA A100-SXM4-80GB MIG 1g.10gb`).
    pub profile: Option<String>,
    /// Placement, where the driver says (it asks for root on real drivers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<MigPlacement>,
    /// Memory used on it, bytes.
    pub mem_used_bytes: Option<u64>,
    /// Its memory, bytes.
    pub mem_total_bytes: Option<u64>,
    /// The processes running on it (their entries are in the GPU's process list).
    #[serde(default)]
    pub pids: Vec<u32>,
    /// The GPM metrics of its GPU instance (`nvmlGpmMigSampleGet`, Hopper and later): the
    /// averages between the last two slow reads; empty on GPUs without GPM, until the second
    /// read, and in recordings made before they were read.
    #[serde(default, skip_serializing_if = "MigGpm::is_empty")]
    pub gpm: MigGpm,
}

/// The GPM values of one GPU instance, by metric (rows of the table a GPU instance has:
/// [`MetricDesc::per_gpu_instance`]): only those the driver gave — a GPU instance has the
/// activities of its SMs and memory, while the bandwidths and video engines are its GPU's.
/// Absent values are not stored (never 0). Kept in table order; serialized as a map of table
/// keys, whose unknown keys, rows a GPU instance does not have and values that are no reading
/// (`null`, not a number, not `MetricDesc::plausible`) are skipped when read back. Equality compares the values
/// bit for bit (a rule's inputs are the same only when the script could not tell them apart).
#[derive(Debug, Clone, Default)]
pub struct MigGpm(Vec<(Metric, f64)>);

impl MigGpm {
    /// The GPM rows' values that `get` gives (e.g. a MIG device's row read back from a
    /// recording).
    pub fn of(get: impl Fn(Metric) -> Option<f64>) -> MigGpm {
        let mut out = MigGpm::default();
        for d in METRICS.iter().filter(|d| d.per_gpu_instance()) {
            out.set(d.id, get(d.id));
        }
        out
    }

    /// The value of `m`, when the driver gave one.
    pub fn get(&self, m: Metric) -> Option<f64> {
        self.0.iter().find(|(k, _)| *k == m).map(|(_, v)| *v)
    }

    /// Sets (or, with `None`, clears) the value of `m`; only the rows a GPU instance has
    /// ([`Metric::per_gpu_instance`]) and plausible values are kept.
    pub fn set(&mut self, m: Metric, v: Option<f64>) {
        self.0.retain(|(k, _)| *k != m);
        if let Some(v) = v.filter(|v| m.per_gpu_instance() && m.desc().plausible(*v)) {
            let at = self.0.partition_point(|(k, _)| *k < m);
            self.0.insert(at, (m, v));
        }
    }

    /// The values, in table order.
    pub fn iter(&self) -> impl Iterator<Item = (Metric, f64)> + '_ {
        self.0.iter().copied()
    }

    /// No value at all.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl PartialEq for MigGpm {
    fn eq(&self, other: &MigGpm) -> bool {
        self.0.len() == other.0.len()
            && self
                .0
                .iter()
                .zip(&other.0)
                .all(|((a, x), (b, y))| a == b && x.to_bits() == y.to_bits())
    }
}

impl Eq for MigGpm {}

impl Serialize for MigGpm {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (m, v) in &self.0 {
            map.serialize_entry(m.desc().key, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for MigGpm {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// A value as written: a number, or anything else (`null`, a string, …), skipped.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Value {
            Number(f64),
            Other(serde::de::IgnoredAny),
        }
        let raw = std::collections::BTreeMap::<String, Value>::deserialize(d)?;
        let mut out = MigGpm::default();
        for (k, v) in raw {
            if let (Some(m), Value::Number(v)) = (Metric::from_key(&k), v) {
                out.set(m, Some(v));
            }
        }
        Ok(out)
    }
}

impl MigSample {
    /// For tests: the `k`-th `1g.10gb` slice of GPU `gpu_index` (GPU instance `7 + k`, UUID
    /// `MIG-k`), its memory and processes unknown.
    #[cfg(test)]
    pub fn one_g(gpu_index: u32, k: u32) -> MigSample {
        MigSample {
            gpu_index,
            gpu_uuid: String::new(),
            index: k,
            uuid: format!("MIG-{k}"),
            gpu_instance_id: 7 + k,
            compute_instance_id: 0,
            profile: Some("1g.10gb".into()),
            placement: None,
            mem_used_bytes: None,
            mem_total_bytes: None,
            pids: Vec::new(),
            gpm: MigGpm::default(),
        }
    }

    /// `GPU/GI/CI`, e.g. `0/7/0`: how recordings, alerts and `status` name it.
    pub fn address(&self) -> String {
        format!(
            "{}/{}/{}",
            self.gpu_index, self.gpu_instance_id, self.compute_instance_id
        )
    }

    /// The legacy `CUDA_VISIBLE_DEVICES` form, `MIG-GPU-<GPU UUID>/<GI>/<CI>`.
    pub fn legacy_id(&self) -> String {
        format!(
            "MIG-{}/{}/{}",
            self.gpu_uuid, self.gpu_instance_id, self.compute_instance_id
        )
    }

    /// For people: `MIG 1g.10gb 0/7/0`.
    pub fn describe(&self) -> String {
        format!(
            "MIG {} {}",
            self.profile.as_deref().unwrap_or("?"),
            self.address()
        )
    }

    /// Compute slices of its profile (`3g.40gb` → 3), of the GPU's 7; `None` for a number no
    /// GPU has (a broken driver's `4294967295g.10gb` would outweigh the GPU in usage).
    pub fn compute_slices(&self) -> Option<u32> {
        let p = self.profile.as_deref()?;
        p.split_once("g.")?
            .0
            .parse()
            .ok()
            .filter(|n| (1..=MIG_COMPUTE_SLICES).contains(n))
    }
}

/// Compute slices of a MIG-capable GPU (A100, A30 4, H100, H200, B200: at most 7).
pub const MIG_COMPUTE_SLICES: u32 = 7;

/// The profile in a MIG device's NVML name: `NVIDIA A100-SXM4-80GB MIG 1g.10gb` → `1g.10gb`
/// (also `MIG 1g.10gb`, as the GPU-instance profile names it; `1g.10gb+me`, `1c.3g.40gb`). A
/// profile is a short word of letters, digits, `.`, `+`, `-` and `_`: anything else (control
/// characters, markup, quotes, spaces, a name longer than 32 characters) from a broken driver
/// or a crafted recording is no profile, so it never reaches a terminal, a label or a page.
pub fn mig_profile_of_name(name: &str) -> Option<String> {
    let (_, rest) = name.rsplit_once("MIG ")?;
    let p = rest.trim();
    (!p.is_empty()
        && p.len() <= 32
        && p.contains("g.")
        && p.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-' | '_')))
    .then(|| p.to_string())
}

/// An XID error event delivered by the driver (an NVML event, a kernel-log line, or both
/// merged into one).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct XidEvent {
    /// When gpuwatch received it, UTC ms.
    pub time_ms: i64,
    /// Index of the GPU that reported it.
    pub gpu_index: u32,
    /// UUID of that GPU.
    pub gpu_uuid: String,
    /// The XID code.
    pub xid: u64,
    /// The process that triggered it, when the kernel log names one (`pid=…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// That process's name (`name=…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
    /// The driver's description from the kernel log, control characters escaped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Where it was seen.
    #[serde(default)]
    pub source: XidSource,
}

impl XidEvent {
    /// An event with no process details, from NVML.
    pub fn new(time_ms: i64, gpu_index: u32, gpu_uuid: impl Into<String>, xid: u64) -> XidEvent {
        XidEvent {
            time_ms,
            gpu_index,
            gpu_uuid: gpu_uuid.into(),
            xid,
            ..XidEvent::default()
        }
    }
}

/// An XID as the engine keeps it in a GPU's history: the event, what the kernel log said about
/// it, and how it stands in the XID ledger (`engine::ledger`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct XidNote {
    /// When it was received, UTC ms.
    pub time_ms: i64,
    /// The XID code.
    pub code: u64,
    /// The process that raised it, when the kernel log names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// That process's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
    /// The driver's description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// How many times (incidents: reports within the burst window count once) this code was
    /// seen on this GPU within the ledger's repeat window (24 h), this one included.
    #[serde(default = "one")]
    pub repeats: u32,
    /// How many GPUs reported this code within the burst window (15 s for XID 13, else 3 min),
    /// this one included.
    #[serde(default = "one")]
    pub gpus: u32,
}

fn one() -> u32 {
    1
}

impl XidNote {
    /// A bare note (no process, first of its kind).
    pub fn new(time_ms: i64, code: u64) -> XidNote {
        XidNote {
            time_ms,
            code,
            pid: None,
            process: None,
            detail: None,
            repeats: 1,
            gpus: 1,
        }
    }
}

/// One entry of the persisted XID ledger: which GPU, and the XID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// The GPU's UUID (indexes change across reboots).
    pub uuid: String,
    /// The GPU's index when it happened.
    pub gpu: u32,
    /// When, UTC ms.
    pub time_ms: i64,
    /// The XID code.
    pub code: u64,
    /// The process that raised it, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
}

/// Where an XID was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum XidSource {
    /// An NVML event (`nvmlEventSetWait`).
    #[default]
    Nvml,
    /// A kernel-log line (`/dev/kmsg`).
    Kernel,
    /// Both, merged.
    Both,
}

/// Everything sampled at one tick. Snapshots arrive in time order; a missing tick is a gap.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Snapshot {
    /// Tick time, UTC ms.
    pub time_ms: i64,
    /// One sample per GPU, lost GPUs included (state `Lost`, no values).
    pub gpus: Vec<GpuSample>,
    /// The process list, when it was refreshed at this tick (it is refreshed on a slower cadence);
    /// `None` means "unchanged since the last list".
    pub processes: Option<Vec<ProcSample>>,
    /// XID events received since the previous tick.
    pub xids: Vec<XidEvent>,
    /// GPUs this machine should have that NVML does not enumerate (found when the sampler
    /// opened; carried in every snapshot so host rules such as `gpu_missing` see them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<MissingGpu>,
    /// The MIG devices of the GPUs with MIG on, by GPU index then MIG index (read on the slow
    /// path, carried in every snapshot while fresh; empty without MIG).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<MigSample>,
    /// The NVLinks of the GPUs that have them, by GPU index (read on the slow path, carried in
    /// every snapshot while fresh; empty without NVLink). Rules read them as `gpu.nvlinks`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlink: Vec<std::sync::Arc<nvlink::NvlinkStatus>>,
    /// The Kubernetes containers the GPUs are allocated to (the kubelet's PodResources API,
    /// carried in every snapshot while it answers; empty elsewhere).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<GpuPod>,
}

/// A Kubernetes container a GPU, or one of its MIG devices, is allocated to (the kubelet's
/// PodResources API): dcgm-exporter's `pod`, `namespace` and `container` labels.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GpuPod {
    pub gpu_index: u32,
    /// The MIG device's UUID when the allocation is one MIG device of the GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_uuid: Option<String>,
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// How [`ProcSample::container`] names a Kubernetes pod: `k8s pod <uid>` from the cgroup, `k8s
/// pod <namespace>/<name>` once the kubelet named it.
pub const K8S_POD_PREFIX: &str = "k8s pod ";

/// The `pod`, `namespace` and `container` labels of GPU `gpu`: each one's distinct values in
/// order, joined with commas (several only on a shared GPU: time-slicing, MPS, MIG). `None`
/// when it is allocated to no container.
pub fn pod_labels(pods: &[GpuPod], gpu: u32) -> Option<[String; 3]> {
    let mine: Vec<&GpuPod> = pods.iter().filter(|p| p.gpu_index == gpu).collect();
    if mine.is_empty() {
        return None;
    }
    let join = |f: fn(&GpuPod) -> &str| {
        let mut v: Vec<&str> = mine.iter().map(|p| f(p)).collect();
        v.sort_unstable();
        v.dedup();
        v.join(",")
    };
    Some([
        join(|p| p.pod.as_str()),
        join(|p| p.namespace.as_str()),
        join(|p| p.container.as_str()),
    ])
}

impl Snapshot {
    /// The MIG devices of GPU `gpu_index`.
    pub fn mig_of(&self, gpu_index: u32) -> impl Iterator<Item = &MigSample> {
        self.mig.iter().filter(move |m| m.gpu_index == gpu_index)
    }

    /// The MIG device process `pid` runs on, on GPU `gpu_index`.
    pub fn mig_of_process(&self, gpu_index: u32, pid: u32) -> Option<&MigSample> {
        self.mig_of(gpu_index).find(|m| m.pids.contains(&pid))
    }
}

/// Why a GPU counts as expected although NVML does not enumerate it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MissingWhy {
    /// An NVIDIA display/3D controller on the PCI bus (sysfs) that NVML does not list.
    OnBus,
    /// A GPU (by UUID) seen at an earlier start (`state_dir/gpus.json`) and absent now.
    SeenBefore,
    /// `[daemon] expected_gpus` says there should be more GPUs than NVML lists.
    ExpectedCount,
}

impl MissingWhy {
    /// `on_bus`, `seen_before` or `expected_count`.
    pub fn as_str(self) -> &'static str {
        match self {
            MissingWhy::OnBus => "on_bus",
            MissingWhy::SeenBefore => "seen_before",
            MissingWhy::ExpectedCount => "expected_count",
        }
    }

    /// One phrase for messages.
    pub fn describe(self) -> &'static str {
        match self {
            MissingWhy::OnBus => "on the PCI bus but not enumerated by NVML",
            MissingWhy::SeenBefore => "seen at an earlier start but not enumerated by NVML now",
            MissingWhy::ExpectedCount => "fewer GPUs enumerated than [daemon] expected_gpus",
        }
    }
}

/// A GPU this machine should have that NVML does not enumerate.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MissingGpu {
    /// NVML-style bus id (`00000000:3A:00.0`) when known; empty for a count shortfall.
    #[serde(default)]
    pub pci_bus_id: String,
    /// Its UUID when it was seen before; empty when unknown.
    #[serde(default)]
    pub uuid: String,
    /// Its marketing name when it was seen before; empty when unknown.
    #[serde(default)]
    pub name: String,
    /// Why it is expected.
    pub why: Option<MissingWhy>,
}

impl MissingGpu {
    /// One line for people: `00000000:3A:00.0 (GPU-…, NVIDIA H100): on the PCI bus but not …`.
    pub fn describe(&self) -> String {
        let mut who = if self.pci_bus_id.is_empty() {
            "a GPU".to_string()
        } else {
            self.pci_bus_id.clone()
        };
        let extra: Vec<&str> = [self.uuid.as_str(), self.name.as_str()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect();
        if !extra.is_empty() {
            who = format!("{who} ({})", extra.join(", "));
        }
        let why = self
            .why
            .map_or("not enumerated by NVML", MissingWhy::describe);
        format!("{who}: {why}")
    }
}

/// How bad an alert is.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Worth knowing, not worth waking anyone.
    Info,
    /// Needs attention soon.
    #[default]
    Warning,
    /// Needs attention now.
    Critical,
}

impl Severity {
    /// `info`, `warning` or `critical`.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }

    /// Parses `info`, `warning` or `critical`.
    pub fn parse(s: &str) -> Option<Severity> {
        match s {
            "info" => Some(Severity::Info),
            "warning" => Some(Severity::Warning),
            "critical" => Some(Severity::Critical),
            _ => None,
        }
    }
}

/// Whether a notification announces a problem or its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AlertStatus {
    /// The condition holds (or held within `keep_firing_for`).
    Firing,
    /// The condition ended.
    Resolved,
}

impl AlertStatus {
    /// `firing` or `resolved`.
    pub fn as_str(self) -> &'static str {
        match self {
            AlertStatus::Firing => "firing",
            AlertStatus::Resolved => "resolved",
        }
    }
}

/// A notification-worthy alert transition produced by the (pure) alert engine and consumed by
/// the dispatcher: a new firing alert, a repeat while firing, or a resolution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlertEvent {
    /// Stable hash of the alert's identity labels (same alert → same fingerprint across restarts).
    pub fingerprint: String,
    /// Rule name (`alertname` label).
    pub name: String,
    /// Severity of the rule.
    pub severity: Severity,
    /// Firing or resolved.
    pub status: AlertStatus,
    /// Identity labels: `alertname`, `severity`, `gpu`, `uuid`, `hostname`, rule labels.
    pub labels: std::collections::BTreeMap<String, String>,
    /// Presentation only: `summary`, `description`, `rule_file`, `values`, `next_steps`.
    pub annotations: std::collections::BTreeMap<String, String>,
    /// When the alert started firing, UTC ms.
    pub starts_at_ms: i64,
    /// When it resolved, UTC ms (`None` while firing).
    pub ends_at_ms: Option<i64>,
    /// When this transition happened (engine clock), UTC ms.
    pub at_ms: i64,
    /// True when this is a `repeat` re-notification of an alert already announced.
    pub repeat: bool,
    /// GPU index for per-GPU alerts.
    pub gpu: Option<u32>,
    /// What gpuwatch does besides notifying, as the rule declared it (`action:`). Only a rule's
    /// declaration sets this; nothing a check returns can.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub actions: Vec<Action>,
    /// The process an action targets: set only by process- and job-scope rules (the process or
    /// job the instance is about), never from labels or annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_pid: Option<u32>,
    /// When that process started (clock ticks since boot), when known: with `target_pid`, the
    /// process's identity (a kill never reaches a process that reused the PID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_start: Option<u64>,
    /// Whether `target_pid` is a PID of gpuwatch's own PID namespace (a job `run`/`attach`
    /// watches) rather than one NVML reports (the host's, mapped through
    /// `actions.kill.host_proc` inside a container).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub target_local: bool,
    /// The rule's metric over its window when it fired (GPU-scope rules), for a chart in the
    /// notification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chart: Option<AlertChart>,
    /// A one-shot notice (`kill_action`, `usage_digest`, `collector_degraded`): announced once,
    /// never repeated, never resolved, and no inhibition source.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub once: bool,
    /// Why a resolved alert ended (`None` on firing events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<EndReason>,
}

/// Why an alert ended. Only [`EndReason::Cleared`] means the condition went away; the others
/// say what stopped it instead (its events stopped, its GPU or process went, the job ended), so
/// no line calls a fault that is still there resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "why")]
pub enum EndReason {
    /// The condition cleared; `note`: what the rule said of it (`#{ cleared: "…" }`).
    Cleared {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
    /// An event alert (XID, ECC) whose events stopped coming; the fault itself may remain, and
    /// `note` (the rule's `#{ stopped: "…" }`) says what is known of it.
    StoppedRepeating { note: String },
    /// The rule saw no data for 10 minutes: it can no longer tell.
    NoData,
    /// Its GPU is lost: nothing can be read from it (`gpu_lost` tells of that).
    GpuLost,
    /// After a restart, its GPU is no longer at that index (another board, or none).
    GpuGone,
    /// The process it was about left the GPU, or its PID now names another process.
    ProcessGone,
    /// The job `run`/`attach` watched ended; `exit`: how.
    JobEnded {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit: Option<String>,
    },
    /// A reload removed its rule.
    RuleRemoved,
}

impl EndReason {
    /// Why, in words; `None` for a plain clearing (nothing to add to "resolved").
    pub fn describe(&self) -> Option<String> {
        Some(match self {
            EndReason::Cleared { note: None } => return None,
            EndReason::Cleared { note: Some(n) } => format!("cleared: {n}"),
            EndReason::StoppedRepeating { note } => format!("stopped repeating: {note}"),
            EndReason::NoData => {
                "no data for 10 min: the rule can no longer tell (not a recovery)".into()
            }
            EndReason::GpuLost => {
                "its GPU is lost: nothing can be read from it (gpu_lost stays firing); not a \
                 recovery"
                    .into()
            }
            EndReason::GpuGone => "its GPU is no longer at this index since the restart".into(),
            EndReason::ProcessGone => {
                "its process left the GPU or ended, or its PID now names another process".into()
            }
            EndReason::JobEnded { exit: Some(e) } => format!("the job ended ({e})"),
            EndReason::JobEnded { exit: None } => "the job ended".into(),
            EndReason::RuleRemoved => "its rule was removed by a reload".into(),
        })
    }
}

/// A metric's recent history attached to a firing alert: what its chart draws.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlertChart {
    /// Metric key (`temp`, `mem_used`).
    pub metric: String,
    /// Its unit (`celsius`, `bytes`).
    pub unit: String,
    /// The window the rule looked at, ms.
    pub window_ms: i64,
    /// (UTC ms, value), oldest first, at most [`AlertChart::MAX_POINTS`].
    pub points: Vec<(i64, f64)>,
}

impl AlertChart {
    /// Points kept (the mean of each stretch when the window has more samples).
    pub const MAX_POINTS: usize = 120;

    /// A chart of `points` (oldest first), averaged down to [`AlertChart::MAX_POINTS`].
    pub fn new(metric: Metric, window_ms: i64, points: &[(i64, f64)]) -> AlertChart {
        let per = points.len().div_ceil(Self::MAX_POINTS).max(1);
        let points = points
            .chunks(per)
            .map(|c| {
                let n = c.len() as f64;
                (c[c.len() - 1].0, c.iter().map(|p| p.1).sum::<f64>() / n)
            })
            .collect();
        AlertChart {
            metric: metric.key().to_string(),
            unit: metric.desc().unit.to_string(),
            window_ms,
            points,
        }
    }
}

impl AlertEvent {
    /// An event gpuwatch raises itself rather than a rule (`notifier_failing`,
    /// `collector_degraded`, `kill_action`, the `notify-test` message): its transition happens
    /// at `now_ms` (a resolution ends then too), on no GPU, asking for no action.
    pub fn notice(
        fingerprint: String,
        name: &str,
        severity: Severity,
        status: AlertStatus,
        labels: std::collections::BTreeMap<String, String>,
        annotations: std::collections::BTreeMap<String, String>,
        now_ms: i64,
    ) -> AlertEvent {
        AlertEvent {
            fingerprint,
            name: name.to_string(),
            severity,
            status,
            labels,
            annotations,
            starts_at_ms: now_ms,
            ends_at_ms: (status == AlertStatus::Resolved).then_some(now_ms),
            at_ms: now_ms,
            repeat: false,
            gpu: None,
            actions: Vec::new(),
            target_pid: None,
            target_start: None,
            target_local: false,
            chart: None,
            once: false,
            ended: None,
        }
    }

    /// A firing one-shot notice about `gpu` (an action's record: `kill_action`, `node_drain`).
    pub fn action_notice(
        fingerprint: String,
        name: &str,
        severity: Severity,
        labels: std::collections::BTreeMap<String, String>,
        annotations: std::collections::BTreeMap<String, String>,
        now_ms: i64,
        gpu: Option<u32>,
    ) -> AlertEvent {
        AlertEvent {
            gpu,
            ..AlertEvent::notice(
                fingerprint,
                name,
                severity,
                AlertStatus::Firing,
                labels,
                annotations,
                now_ms,
            )
            .once()
        }
    }

    /// The same event as a one-shot notice (see [`AlertEvent::once`]).
    #[must_use]
    pub fn once(self) -> AlertEvent {
        AlertEvent { once: true, ..self }
    }

    /// Marks this resolved event as ended for `why`: typed, and where the reason adds
    /// something, in its `ended` annotation (what webhooks, Alertmanager and exec actions see).
    pub fn set_ended(&mut self, why: EndReason) {
        if let Some(text) = why.describe() {
            self.annotations
                .insert("ended".into(), crate::values::escape_control(&text));
        }
        self.ended = Some(why);
    }

    /// Whether it is an end for another reason than a clearing (read ENDED, not RESOLVED).
    pub fn ended_otherwise(&self) -> bool {
        self.status == AlertStatus::Resolved
            && self
                .ended
                .as_ref()
                .is_some_and(|e| !matches!(e, EndReason::Cleared { .. }))
    }

    /// Its state as a person reads it: `FIRING`, `STILL` (a repeat), `RESOLVED` (the condition
    /// cleared) or `ENDED` (it ended for another reason: [`EndReason`]).
    pub fn state_word(&self) -> &'static str {
        match self.status {
            AlertStatus::Firing if self.repeat => "STILL",
            AlertStatus::Firing => "FIRING",
            AlertStatus::Resolved if self.ended_otherwise() => "ENDED",
            AlertStatus::Resolved => "RESOLVED",
        }
    }

    /// Its summary as a person reads it (control characters escaped): on an end with a reason,
    /// the reason first, then what the alert had said — "stopped repeating: no new XID for 1 h;
    /// GPU 3 is still lost; it said: GPU 3: XID 79 …", never the firing text alone as if it
    /// were still news, or as if the fault were gone.
    pub fn told_summary(&self) -> String {
        self.told(
            self.annotations.get("summary").map_or("", String::as_str),
            crate::values::escape_control,
        )
    }

    /// `said` (its summary, or what stands for it) as [`AlertEvent::told_summary`] tells it,
    /// escaped by `escape`.
    pub fn told(&self, said: &str, escape: fn(&str) -> String) -> String {
        let said = escape(said);
        match self.ended.as_ref().and_then(EndReason::describe) {
            Some(why) if self.status == AlertStatus::Resolved => {
                format!("{}; it said: {said}", escape(&why))
            }
            _ => said,
        }
    }
}

/// A control decision a rule declares with `action:`. Travels as this type from the rule to the
/// action runner; annotations and labels are presentation only and can never request one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Stop the target process through `[actions.kill]` (process and job rules only).
    Kill,
    /// Drain this node in Slurm through `[actions.drain]` (critical firing events only).
    Drain,
    /// Taint this node in Kubernetes through `[actions.taint]` (critical firing events only).
    Taint,
    /// Run the `[[actions.exec]]` entry with this name.
    Exec(String),
}

impl Action {
    /// Parses one part of a rule's `action:` (`"kill"`, `"drain"` or `"exec:NAME"`).
    pub fn parse(s: &str) -> Option<Action> {
        match s.trim() {
            "kill" => Some(Action::Kill),
            "drain" => Some(Action::Drain),
            "taint" => Some(Action::Taint),
            other => other
                .strip_prefix("exec:")
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(|n| Action::Exec(n.to_string())),
        }
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Action::Kill => f.write_str("kill"),
            Action::Drain => f.write_str("drain"),
            Action::Taint => f.write_str("taint"),
            Action::Exec(name) => write!(f, "exec:{name}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_values_tell_absent_from_every_value_nan_included() {
        let mut v = MetricValues::default();
        assert!(v.iter().all(|x| x.is_none()));
        assert_eq!(v, MetricValues::default());
        for x in [0.0, -0.0, 1.5, f64::MAX, f64::INFINITY, f64::NEG_INFINITY] {
            v.set(Metric::Power, Some(x));
            assert_eq!(v.get(Metric::Power).map(f64::to_bits), Some(x.to_bits()));
        }
        // a NaN, even one with the absent value's bits, is a value (NaN), not an absence
        for x in [f64::NAN, f64::from_bits(ABSENT)] {
            v.set(Metric::Power, Some(x));
            assert!(v.get(Metric::Power).is_some_and(f64::is_nan));
        }
        v.set(Metric::Power, None);
        assert_eq!(v.get(Metric::Power), None);
        assert_eq!(v, MetricValues::default());
        v.set(Metric::Temp, Some(40.0));
        assert_eq!(v.at(Metric::Temp as usize), Some(40.0));
        assert_eq!(v.at(METRIC_COUNT), None);
        assert_ne!(v, MetricValues::default());
        assert_eq!(size_of::<MetricValues>(), 8 * METRIC_COUNT);
    }

    #[test]
    fn mig_profiles_from_a_hostile_name_are_no_profile() {
        for (name, want) in [
            ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", Some("1g.10gb")),
            ("NVIDIA H100 MIG 1g.12gb+me", Some("1g.12gb+me")),
            ("NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb", Some("1c.3g.20gb")),
            ("MIG 7g.80gb ", Some("7g.80gb")),
            ("NVIDIA A100 MIG 1g.10gb<b>\u{1b}[2J", None),
            ("NVIDIA A100 MIG 1g.10gb\u{7}", None),
            ("NVIDIA A100 MIG 1g.10gb\n1g.5gb", None),
            ("NVIDIA A100 MIG 1g.\"x\"", None),
            ("NVIDIA A100 MIG 1g.10gb 2g.20gb", None),
            ("NVIDIA A100 MIG 1g.aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", None),
            ("NVIDIA A100 MIG ", None),
        ] {
            assert_eq!(mig_profile_of_name(name).as_deref(), want, "{name:?}");
        }
    }

    /// A GPU instance's GPM values: GPM rows only, in table order, absent never 0; serialized
    /// by table key and read back; a MIG device of an older recording (no `gpm`) still loads.
    #[test]
    fn mig_gpm_values_keep_gpm_rows_only() {
        let mut g = MigGpm::default();
        g.set(Metric::TensorActive, Some(40.0));
        g.set(Metric::SmActive, Some(81.5));
        g.set(Metric::Util, Some(90.0));
        g.set(Metric::DramActive, Some(f64::NAN));
        g.set(Metric::Fp16Active, Some(120.0));
        assert_eq!(
            g.iter().collect::<Vec<_>>(),
            [(Metric::SmActive, 81.5), (Metric::TensorActive, 40.0)]
        );
        assert_eq!(g.get(Metric::Util), None, "not a GPM row");
        g.set(Metric::TensorActive, None);
        assert_eq!(g.get(Metric::TensorActive), None);
        let m = MigSample {
            gpm: g.clone(),
            ..MigSample::one_g(1, 2)
        };
        let j = serde_json::to_value(&m).unwrap();
        assert_eq!(j["gpm"], serde_json::json!({"sm_active": 81.5}));
        let back: MigSample = serde_json::from_value(j).unwrap();
        assert_eq!(back, m);
        let mut old = serde_json::to_value(MigSample::one_g(1, 2)).unwrap();
        assert!(old.get("gpm").is_none(), "nothing written when empty");
        old["gpm"] = serde_json::json!({"sm_active": 50.0, "bogus": 1.0, "util": 3.0});
        let read: MigSample = serde_json::from_value(old).unwrap();
        assert_eq!(
            read.gpm.iter().collect::<Vec<_>>(),
            [(Metric::SmActive, 50.0)]
        );
        // a value that is no number (`null`, a string, an array) is skipped, not the whole map
        let mut odd = serde_json::to_value(MigSample::one_g(1, 2)).unwrap();
        odd["gpm"] = serde_json::json!({"sm_active": null, "tensor_active": "40", "dram_active": [1],
            "fp32_active": {"a": 1}, "fp16_active": 12, "hmma_active": 7.5});
        let read: MigSample = serde_json::from_value(odd).unwrap();
        assert_eq!(
            read.gpm.iter().collect::<Vec<_>>(),
            [(Metric::HmmaActive, 7.5), (Metric::Fp16Active, 12.0)]
        );
        let mut z = MigGpm::default();
        z.set(Metric::SmActive, Some(0.0));
        let mut nz = MigGpm::default();
        nz.set(Metric::SmActive, Some(-0.0));
        assert_ne!(z, nz, "bit for bit");
    }

    /// A GPU instance has the activities of its SMs and memory; the bandwidths and video
    /// engines are its GPU's: never kept per instance.
    #[test]
    fn a_gpu_instance_has_the_gpm_activities_only() {
        let per: Vec<&str> = METRICS
            .iter()
            .filter(|d| d.per_gpu_instance())
            .map(|d| d.key)
            .collect();
        assert_eq!(
            per,
            [
                "gr_engine_active",
                "sm_active",
                "sm_occupancy",
                "tensor_active",
                "hmma_active",
                "imma_active",
                "dfma_active",
                "dram_active",
                "fp64_active",
                "fp32_active",
                "fp16_active"
            ]
        );
        assert!(METRICS
            .iter()
            .filter(|d| d.per_gpu_instance())
            .all(|d| d.source.is_gpm()));
        let mut g = MigGpm::default();
        for m in [
            Metric::PcieTxBytes,
            Metric::PcieRxBytes,
            Metric::NvlinkTxBytes,
            Metric::NvlinkRxBytes,
            Metric::NvdecUtil,
            Metric::NvjpgUtil,
            Metric::NvofaUtil,
        ] {
            assert!(m.desc().source.is_gpm() && !m.per_gpu_instance(), "{m:?}");
            g.set(m, Some(5.0));
        }
        assert!(g.is_empty(), "{g:?}");
        assert!(MigGpm::of(|_| Some(1.0))
            .iter()
            .all(|(m, _)| m.per_gpu_instance()));
        let read: MigGpm =
            serde_json::from_value(serde_json::json!({"pcie_tx_bytes": 1e9, "sm_active": 3.0}))
                .unwrap();
        assert_eq!(read.iter().collect::<Vec<_>>(), [(Metric::SmActive, 3.0)]);
    }

    #[test]
    fn mig_compute_slices_beyond_a_gpu_are_unknown() {
        let mut m = MigSample {
            profile: Some("3g.40gb".into()),
            ..MigSample::one_g(0, 0)
        };
        assert_eq!(m.compute_slices(), Some(3));
        for p in ["4294967295g.10gb", "0g.10gb", "8g.90gb"] {
            m.profile = Some(p.into());
            assert_eq!(m.compute_slices(), None, "{p}");
        }
    }

    #[test]
    fn table_is_in_discriminant_order_with_unique_keys() {
        for (i, d) in METRICS.iter().enumerate() {
            assert_eq!(d.id as usize, i, "{} out of order", d.key);
            assert_eq!(Metric::from_key(d.key), Some(d.id));
        }
        let mut keys: Vec<_> = METRICS.iter().map(|d| d.key).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), METRIC_COUNT);
    }

    /// A row cannot be written without `source:` (the macro requires it); this checks that each
    /// row's source really names something the sampler reads, and that no two rows read the
    /// same number (a copy-pasted source would give two columns one value).
    #[test]
    fn every_row_has_a_source() {
        let mut calls = Vec::new();
        let mut fields = Vec::new();
        let mut gpm = Vec::new();
        for d in METRICS {
            let shown = d.source.to_string();
            assert!(!shown.trim().is_empty(), "{} has no source", d.key);
            match d.source {
                Source::Nvml(call) => {
                    assert!(call.function().starts_with("nvmlDeviceGet"), "{}", d.key);
                    assert!(!call.function().contains(['(', '.', ' ']), "{}", d.key);
                    calls.push(call);
                }
                Source::Field(f) => {
                    assert!(f.field.id > 0, "{}: no field id", d.key);
                    assert!(f.field.name.starts_with("NVML_FI_DEV_"), "{}", d.key);
                    assert!(f.scale.is_finite() && f.scale > 0.0, "{}", d.key);
                    fields.push(f.field.id);
                    calls.extend(f.fallback);
                }
                Source::Gpm(m) => {
                    assert!(!m.ids().is_empty() && *m.ids().end() < 210, "{}", d.key);
                    gpm.push(m);
                }
                Source::Derived(how) => {
                    assert!(!how.how.trim().is_empty(), "{}: derived how?", d.key);
                }
                Source::Nvlink(n) => assert!(!n.describe().is_empty(), "{}", d.key),
                Source::Host(h) => match h {},
            }
        }
        let n = gpm.len();
        gpm.sort_by_key(|m| m.describe());
        gpm.dedup();
        assert_eq!(gpm.len(), n, "two rows read the same GPM metric");
        let n = calls.len();
        calls.sort_by_key(|c| c.describe());
        calls.dedup();
        assert_eq!(calls.len(), n, "two rows read the same NVML call");
        let n = fields.len();
        fields.sort_unstable();
        fields.dedup();
        assert_eq!(fields.len(), n, "two rows read the same field");
    }

    #[test]
    fn sources_render_for_the_docs() {
        assert_eq!(
            Metric::Util.desc().source.to_string(),
            "`nvmlDeviceGetUtilizationRates.gpu`"
        );
        assert_eq!(
            Metric::Energy.desc().source.to_string(),
            "`nvmlDeviceGetFieldValues(NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION)` × 0.001, \
             else `nvmlDeviceGetTotalEnergyConsumption`"
        );
        let derived = Source::Derived(Derivation {
            how: "mem_used / mem_total",
            compute: |v| Some(v.get(Metric::MemUsed)? / v.get(Metric::MemTotal)?),
        });
        assert_eq!(derived.to_string(), "derived: mem_used / mem_total");
        assert_eq!(
            Metric::SmActive.desc().source.to_string(),
            "`nvmlGpmMetricsGet(NVML_GPM_METRIC_SM_UTIL)` between two GPM samples a tick apart"
        );
        assert_eq!(
            Metric::NvlinkTxBytes.desc().source.to_string(),
            "`nvmlGpmMetricsGet(NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC)` × 1048576 between two \
             GPM samples a tick apart"
        );
        assert!(
            Metric::SmActive.desc().source.is_nvml() && Metric::SmActive.desc().source.is_gpm()
        );
        assert!(!derived.is_nvml());
        assert!(Metric::MemTemp.desc().source.is_nvml());
    }

    #[test]
    fn values_serialize_only_present_metrics() {
        let mut v = MetricValues::default();
        v.set(Metric::Util, Some(42.0));
        let json = serde_json::to_string(&v).unwrap();
        assert_eq!(json, r#"{"util":42.0}"#);
        let back: MetricValues = serde_json::from_str(&json).unwrap();
        assert_eq!(back, v);
    }

    #[test]
    fn clock_event_masks() {
        assert_eq!(clock_event_mask("thermal"), Some(0x60));
        assert_eq!(clock_event_mask("hw_slowdown"), Some(0x8));
        assert_eq!(clock_event_names(0x44), vec!["sw_power_cap", "hw_thermal"]);
    }
}
