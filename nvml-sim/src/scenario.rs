//! Scenario files: the TOML format (raw serde structs), its validation, and the resolved model
//! (`Scenario`, `DeviceSpec`, `Event`, `Fault`, `ProcessSpec`) that the simulator evaluates.
//!
//! Every error names the file, line and column (toml spans give them). See `README.md` for the
//! format reference.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use toml::Spanned;

use crate::signal::{hash_str, mix, Shape, Signal};
use crate::trace::{Trace, TraceSpec};

/// Bytes in one MiB.
pub const MIB: f64 = 1024.0 * 1024.0;

/// A scenario error, displayed as `file:line:column: message`.
#[derive(Debug, Clone, PartialEq)]
pub struct ScenarioError {
    /// File path, or `<shipped scenario NAME>`.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column (in characters).
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file, self.line, self.column, self.message
        )
    }
}

impl std::error::Error for ScenarioError {}

/// 1-based line and column of a byte offset.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
    let column = before
        .get(line_start..)
        .map(|s| s.chars().count())
        .unwrap_or(0)
        + 1;
    (line, column)
}

/// The metrics a scenario can drive with signals. The key is the TOML name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    GpuUtilPct,
    MemUtilPct,
    MemoryUsedMib,
    TemperatureC,
    MemoryTemperatureC,
    PowerW,
    SmClockMhz,
    GraphicsClockMhz,
    MemClockMhz,
    VideoClockMhz,
    FanPct,
    PcieTxKbS,
    PcieRxKbS,
    EncoderUtilPct,
    DecoderUtilPct,
    Pstate,
    ClockEventReasons,
    // GPM (profiling) activity, Hopper and later: what `nvmlGpmMetricsGet` averages between
    // two samples (see `gpm.rs`).
    GrEngineActivePct,
    SmActivePct,
    SmOccupancyPct,
    TensorActivePct,
    HmmaActivePct,
    ImmaActivePct,
    DfmaActivePct,
    IntegerActivePct,
    DramActivePct,
    Fp64ActivePct,
    Fp32ActivePct,
    Fp16ActivePct,
    NvlinkTxKbS,
    NvlinkRxKbS,
    NvdecUtilPct,
    NvjpgUtilPct,
    NvofaUtilPct,
}

impl Metric {
    /// Every metric, in table order.
    pub const ALL: [Metric; 34] = [
        Metric::GpuUtilPct,
        Metric::MemUtilPct,
        Metric::MemoryUsedMib,
        Metric::TemperatureC,
        Metric::MemoryTemperatureC,
        Metric::PowerW,
        Metric::SmClockMhz,
        Metric::GraphicsClockMhz,
        Metric::MemClockMhz,
        Metric::VideoClockMhz,
        Metric::FanPct,
        Metric::PcieTxKbS,
        Metric::PcieRxKbS,
        Metric::EncoderUtilPct,
        Metric::DecoderUtilPct,
        Metric::Pstate,
        Metric::ClockEventReasons,
        Metric::GrEngineActivePct,
        Metric::SmActivePct,
        Metric::SmOccupancyPct,
        Metric::TensorActivePct,
        Metric::HmmaActivePct,
        Metric::ImmaActivePct,
        Metric::DfmaActivePct,
        Metric::IntegerActivePct,
        Metric::DramActivePct,
        Metric::Fp64ActivePct,
        Metric::Fp32ActivePct,
        Metric::Fp16ActivePct,
        Metric::NvlinkTxKbS,
        Metric::NvlinkRxKbS,
        Metric::NvdecUtilPct,
        Metric::NvjpgUtilPct,
        Metric::NvofaUtilPct,
    ];

    /// The TOML key.
    pub fn key(self) -> &'static str {
        match self {
            Metric::GpuUtilPct => "gpu_util_pct",
            Metric::MemUtilPct => "mem_util_pct",
            Metric::MemoryUsedMib => "memory_used_mib",
            Metric::TemperatureC => "temperature_c",
            Metric::MemoryTemperatureC => "memory_temperature_c",
            Metric::PowerW => "power_w",
            Metric::SmClockMhz => "sm_clock_mhz",
            Metric::GraphicsClockMhz => "graphics_clock_mhz",
            Metric::MemClockMhz => "mem_clock_mhz",
            Metric::VideoClockMhz => "video_clock_mhz",
            Metric::FanPct => "fan_pct",
            Metric::PcieTxKbS => "pcie_tx_kb_s",
            Metric::PcieRxKbS => "pcie_rx_kb_s",
            Metric::EncoderUtilPct => "encoder_util_pct",
            Metric::DecoderUtilPct => "decoder_util_pct",
            Metric::Pstate => "pstate",
            Metric::ClockEventReasons => "clock_event_reasons",
            Metric::GrEngineActivePct => "gr_engine_active_pct",
            Metric::SmActivePct => "sm_active_pct",
            Metric::SmOccupancyPct => "sm_occupancy_pct",
            Metric::TensorActivePct => "tensor_active_pct",
            Metric::HmmaActivePct => "hmma_active_pct",
            Metric::ImmaActivePct => "imma_active_pct",
            Metric::DfmaActivePct => "dfma_active_pct",
            Metric::IntegerActivePct => "integer_active_pct",
            Metric::DramActivePct => "dram_active_pct",
            Metric::Fp64ActivePct => "fp64_active_pct",
            Metric::Fp32ActivePct => "fp32_active_pct",
            Metric::Fp16ActivePct => "fp16_active_pct",
            Metric::NvlinkTxKbS => "nvlink_tx_kb_s",
            Metric::NvlinkRxKbS => "nvlink_rx_kb_s",
            Metric::NvdecUtilPct => "nvdec_util_pct",
            Metric::NvjpgUtilPct => "nvjpg_util_pct",
            Metric::NvofaUtilPct => "nvofa_util_pct",
        }
    }

    /// Position in `ALL`.
    pub fn position(self) -> usize {
        self as usize
    }

    fn from_key(key: &str) -> Option<Metric> {
        Metric::ALL.iter().copied().find(|m| m.key() == key)
    }

    /// Whether a MIG device (a GPU instance) has the metric of its own: its utilization and the
    /// GPM activities of its SMs and memory (`nvmlGpmMigSampleGet`). Bandwidths, video engines
    /// and the rest are the GPU's.
    pub fn per_mig_device(self) -> bool {
        matches!(
            self,
            Metric::GpuUtilPct
                | Metric::MemUtilPct
                | Metric::GrEngineActivePct
                | Metric::SmActivePct
                | Metric::SmOccupancyPct
                | Metric::TensorActivePct
                | Metric::HmmaActivePct
                | Metric::ImmaActivePct
                | Metric::DfmaActivePct
                | Metric::IntegerActivePct
                | Metric::DramActivePct
                | Metric::Fp64ActivePct
                | Metric::Fp32ActivePct
                | Metric::Fp16ActivePct
        )
    }

    /// Valid range (values are clamped into it).
    pub fn range(self) -> (f64, f64) {
        match self {
            Metric::GpuUtilPct
            | Metric::MemUtilPct
            | Metric::FanPct
            | Metric::EncoderUtilPct
            | Metric::DecoderUtilPct
            | Metric::GrEngineActivePct
            | Metric::SmActivePct
            | Metric::SmOccupancyPct
            | Metric::TensorActivePct
            | Metric::HmmaActivePct
            | Metric::ImmaActivePct
            | Metric::DfmaActivePct
            | Metric::IntegerActivePct
            | Metric::DramActivePct
            | Metric::Fp64ActivePct
            | Metric::Fp32ActivePct
            | Metric::Fp16ActivePct
            | Metric::NvdecUtilPct
            | Metric::NvjpgUtilPct
            | Metric::NvofaUtilPct => (0.0, 100.0),
            Metric::Pstate => (0.0, 15.0),
            Metric::TemperatureC | Metric::MemoryTemperatureC => (-40.0, 200.0),
            _ => (0.0, f64::MAX),
        }
    }
}

/// How a device reports memory repairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryRepair {
    /// Ampere and newer: remapped rows (fields 142–145); retired pages NOT_SUPPORTED.
    RowRemap,
    /// Pre-Ampere: retired pages; remapped rows NOT_SUPPORTED.
    PageRetirement,
}

/// One simulated GPU's static description and its metric signals.
#[derive(Debug, Clone)]
pub struct DeviceSpec {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub serial: String,
    pub pci_domain: u32,
    pub pci_bus: u32,
    pub pci_device: u32,
    pub pci_device_id: u32,
    pub pci_subsystem_id: u32,
    pub minor: u32,
    pub memory_total_bytes: u64,
    pub memory_reserved_bytes: u64,
    pub power_limit_mw: u32,
    pub power_default_limit_mw: u32,
    pub power_min_limit_mw: u32,
    pub power_max_limit_mw: u32,
    pub temp_shutdown_c: u32,
    pub temp_slowdown_c: u32,
    pub temp_gpu_max_c: u32,
    pub temp_mem_max_c: u32,
    pub ecc_enabled: bool,
    pub num_fans: u32,
    pub max_sm_clock_mhz: u32,
    pub max_mem_clock_mhz: u32,
    pub max_video_clock_mhz: u32,
    pub pcie_gen: u32,
    pub pcie_width: u32,
    pub architecture: u32,
    pub cuda_cc_major: i32,
    pub cuda_cc_minor: i32,
    pub vbios_version: String,
    pub board_part_number: String,
    pub persistence_mode: bool,
    pub compute_mode: u32,
    pub memory_repair: MemoryRepair,
    pub energy_start_mj: u64,
    /// Present in the scenario and the fake sysfs, but not enumerated by NVML.
    pub hidden: bool,
    /// PCI class code for the fake sysfs (`0x030200` 3D controller, `0x030000` VGA).
    pub pci_class: u32,
    /// Current PCIe link generation and width (the max ones are `pcie_gen` / `pcie_width`).
    pub pcie_link_gen: u32,
    pub pcie_link_width: u32,
    /// Max PCIe generation of the slot / system (`GetMaxPcieLinkGeneration` = min(GPU, slot)).
    pub pcie_slot_max_gen: u32,
    /// Applications clocks (target clocks under load); defaults are the max clocks.
    pub app_sm_clock_mhz: u32,
    pub app_mem_clock_mhz: u32,
    /// Locked SM clock (`nvidia-smi -lgc`): the busy SM clock, and clock event reason 0x2.
    pub locked_sm_clock_mhz: Option<u32>,
    /// ECC mode after the next reboot.
    pub ecc_pending: bool,
    /// Fields 197/198 (PCIe byte counters) answered; false = NOT_SUPPORTED (older drivers).
    pub pcie_byte_counters: bool,
    /// GPU recovery action (field 230) before any `recovery_action` event.
    pub recovery_action: u32,
    /// Whether field 230 is answered (else NOT_SUPPORTED).
    pub recovery_action_supported: bool,
    /// GPM (`nvmlGpmQueryDeviceSupport`, the profiling metrics of `nvmlGpmMetricsGet`):
    /// Hopper and later datacenter GPUs; default from the architecture (itself from the name).
    pub gpm: bool,
    /// MIG mode and the MIG devices the GPU is split into (see `mig.rs`).
    pub mig: crate::mig::MigConfig,
    /// One optional signal per `Metric::ALL` entry.
    pub signals: Vec<Option<Signal>>,
    /// Noise seed for this device.
    pub seed: u64,
}

impl DeviceSpec {
    /// The PCI bus id in NVML's 8-digit-domain form, e.g. `00000000:18:00.0`.
    pub fn bus_id(&self) -> String {
        format!(
            "{:08X}:{:02X}:{:02X}.0",
            self.pci_domain, self.pci_bus, self.pci_device
        )
    }

    /// The kernel's form (sysfs directory name): 4-digit lower-case domain, `0000:18:00.0`.
    pub fn sysfs_name(&self) -> String {
        format!(
            "{:04x}:{:02x}:{:02x}.0",
            self.pci_domain, self.pci_bus, self.pci_device
        )
    }

    /// The NVRM kernel-log form without the function: `0000:18:00`.
    pub fn kmsg_pci(&self) -> String {
        format!(
            "{:04x}:{:02x}:{:02x}",
            self.pci_domain, self.pci_bus, self.pci_device
        )
    }

    /// The legacy 4-digit-domain form, e.g. `0000:18:00.0`.
    pub fn bus_id_legacy(&self) -> String {
        format!(
            "{:04X}:{:02X}:{:02X}.0",
            self.pci_domain, self.pci_bus, self.pci_device
        )
    }

    /// The signal for a metric, if the scenario set one.
    pub fn signal(&self, metric: Metric) -> Option<&Signal> {
        self.signals.get(metric.position()).and_then(Option::as_ref)
    }
}

/// What a timed event does.
#[derive(Debug, Clone, PartialEq)]
pub enum EventKind {
    /// An XID error, delivered through event sets (`nvmlEventTypeXidCriticalError`) unless
    /// `nvml` is false, and written to the kernel log (`NVML_SIM_KMSG`) in `kmsg`'s shape.
    Xid(Box<Xid>),
    /// A kernel-log line only (`NVML_SIM_KMSG`).
    Kmsg(String),
    /// Sets the GPU recovery action (field 230) from now on.
    RecoveryAction(u32),
    /// ECC error counter increments (volatile and aggregate).
    Ecc { corrected: u64, uncorrected: u64 },
    /// A retired page (pre-Ampere page retirement).
    RetiredPage {
        double_bit: bool,
        address: u64,
        pending: bool,
    },
    /// Row remapping counters (Ampere+); `pending`/`failure` set those flags when given.
    RemappedRow {
        correctable: u64,
        uncorrectable: u64,
        pending: Option<bool>,
        failure: Option<bool>,
    },
    /// Sets the clock event (throttle) reasons mask from now on; `None` returns to the signal.
    ClockEventReasons(Option<u64>),
    /// PCIe replay counter increment.
    PcieReplay(u64),
    /// The GPU falls off the bus: every later call on it returns GPU_IS_LOST.
    Lost,
}

/// An XID event's details.
#[derive(Debug, Clone, PartialEq)]
pub struct Xid {
    pub code: u64,
    pub kmsg: KmsgStyle,
    /// `None` = the pid of the GPU's first scenario process, or 0.
    pub pid: Option<PidSpec>,
    /// `None` = the comm of the pid, else "python3".
    pub process_name: Option<String>,
    /// `None` = the default text for the code.
    pub text: Option<String>,
    /// Delivered through NVML event sets.
    pub nvml: bool,
}

impl Xid {
    /// An XID with every default.
    pub fn code(code: u64) -> Xid {
        Xid {
            code,
            kmsg: KmsgStyle::PidName,
            pid: None,
            process_name: None,
            text: None,
            nvml: true,
        }
    }
}

/// The shape of an XID's kernel-log line (driver generations differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KmsgStyle {
    /// `79, pid=1234, name=python3, TEXT`
    PidName,
    /// `79, pid=1234, TEXT`
    Pid,
    /// `31, pid='1234', name='python3', 'TEXT'`
    Quoted,
    /// `74, pid=<unknown>, name=<unknown>, TEXT`
    Unknown,
    /// `79, TEXT`
    None,
    /// like `PidName`, with the function in the bus id: `PCI:0000:18:00.0`
    Function,
    /// no kernel-log line
    Off,
}

impl KmsgStyle {
    /// Every style with its name.
    pub const NAMES: [(&'static str, KmsgStyle); 7] = [
        ("pid_name", KmsgStyle::PidName),
        ("pid", KmsgStyle::Pid),
        ("quoted", KmsgStyle::Quoted),
        ("unknown", KmsgStyle::Unknown),
        ("none", KmsgStyle::None),
        ("function", KmsgStyle::Function),
        ("off", KmsgStyle::Off),
    ];
}

/// GPU recovery action names (field 230 values).
pub const RECOVERY_ACTIONS: [(&str, u32); 5] = [
    ("none", 0),
    ("gpu_reset", 1),
    ("node_reboot", 2),
    ("drain_p2p", 3),
    ("drain_and_reset", 4),
];

fn recovery_action_by_name(name: &str) -> Result<u32, String> {
    RECOVERY_ACTIONS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            format!(
                "recovery action `{name}` (known: {})",
                RECOVERY_ACTIONS.map(|r| r.0).join(", ")
            )
        })
}

/// A wedge: calls matching `function` on `gpu` block while it is active.
#[derive(Debug, Clone, PartialEq)]
pub struct Hang {
    pub at_s: f64,
    pub gpu: u32,
    /// Exact symbol, `prefix*` or `*`.
    pub function: String,
    /// Scenario seconds (real seconds with a frozen clock); infinite = forever.
    pub for_s: f64,
}

impl Hang {
    /// Whether the hang applies to `function`.
    pub fn matches(&self, function: &str) -> bool {
        crate::latency::specificity(&self.function, function).is_some()
    }
}

/// A timed event on one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub at_s: f64,
    pub gpu: u32,
    pub kind: EventKind,
}

/// Per-function fault injection.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// Exact symbol name, or a prefix ending in `*` (`nvmlDeviceGet*`), or `*`.
    pub function: String,
    /// Return this code instead of answering.
    pub error: Option<u32>,
    /// Sleep this long before answering.
    pub latency_ms: f64,
    /// Only these GPUs (device calls); `None` = all, and system calls too.
    pub gpus: Option<Vec<u32>>,
    pub from_s: f64,
    pub until_s: f64,
}

impl Fault {
    /// Whether this fault applies to a call.
    pub fn matches(&self, function: &str, gpu: Option<u32>, t_s: f64) -> bool {
        let name_ok = match self.function.strip_suffix('*') {
            Some(prefix) => function.starts_with(prefix),
            None => self.function == function,
        };
        let gpu_ok = match (&self.gpus, gpu) {
            (None, _) => true,
            (Some(list), Some(g)) => list.contains(&g),
            (Some(_), None) => false,
        };
        name_ok && gpu_ok && t_s >= self.from_s && t_s < self.until_s
    }
}

/// Which process id a process entry reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PidSpec {
    Fixed(u32),
    /// The process that loaded the library.
    SelfPid,
    /// Its parent.
    Parent,
    /// A training job's rank that is no host process: a PID above the kernel's largest
    /// ([`JOB_PID_BASE`] + the rank's number in the scenario), so no signal can reach it, like a
    /// process in another PID namespace. NVML names it (`nvmlSystemGetProcessName`).
    Job(u32),
}

/// The first PID of `pid = "job"` processes: above `PID_MAX_LIMIT` (4194304), the largest PID
/// a Linux kernel hands out.
pub const JOB_PID_BASE: u32 = 4_195_001;
const _: () = assert!(JOB_PID_BASE > 4_194_304);

/// The name NVML gives a `pid = "job"` process without `name`.
pub const JOB_NAME: &str = "python train.py";

/// How much memory a process entry reports.
#[derive(Debug, Clone)]
pub enum ProcessMemory {
    /// Follows the GPU's `memory_used_mib` signal.
    Device,
    /// A signal in MiB.
    Signal(Signal),
    /// NVML_VALUE_NOT_AVAILABLE.
    Unknown,
}

/// A process shown on a GPU.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    pub gpu: u32,
    pub pid: PidSpec,
    pub memory: ProcessMemory,
    pub graphics: bool,
    pub from_s: f64,
    pub until_s: f64,
    /// SM utilization reported by nvmlDeviceGetProcessUtilization (default: the GPU's).
    pub sm_util_pct: Option<f64>,
    /// On a MIG GPU: the MIG device (index on its GPU) the process runs on.
    pub mig: Option<u32>,
    /// What `nvmlSystemGetProcessName` answers for the pid (`None`: the pid's `/proc` comm).
    pub name: Option<String>,
}

/// A resolved scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    /// File path or `<shipped scenario NAME>`.
    pub source: String,
    pub time_scale: f64,
    /// Scenario time at the first `nvmlInit*` (env NVML_SIM_START_S overrides).
    pub start_s: f64,
    pub seed: u64,
    pub driver_version: String,
    pub nvml_version: String,
    pub cuda_driver_version: i32,
    pub devices: Vec<DeviceSpec>,
    /// Sorted by time.
    pub events: Vec<Event>,
    pub faults: Vec<Fault>,
    pub processes: Vec<ProcessSpec>,
    /// The `[latency]` table: (pattern, latency).
    pub latency: Vec<(String, std::time::Duration)>,
    /// Wedges (`hang`).
    pub hangs: Vec<Hang>,
    /// NVLink: links, their events and error rates (`[nvlink]`, see `nvlink.rs`).
    pub nvlink: crate::nvlink::Nvlink,
}

// ---------------------------------------------------------------------------------------------
// Raw TOML structures

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    name: Option<String>,
    description: Option<String>,
    time_scale: Option<Spanned<f64>>,
    start_s: Option<Spanned<f64>>,
    seed: Option<u64>,
    driver_version: Option<String>,
    nvml_version: Option<String>,
    cuda_driver_version: Option<i32>,
    devices: Option<Spanned<RawDevice>>,
    #[serde(default)]
    device: Vec<Spanned<RawDevice>>,
    #[serde(default)]
    event: Vec<Spanned<RawEvent>>,
    #[serde(default)]
    fault: Vec<Spanned<RawFault>>,
    #[serde(default)]
    process: Vec<Spanned<RawProcess>>,
    latency: Option<BTreeMap<String, Spanned<RawNumOrText>>>,
    hang: Option<Spanned<toml::Value>>,
    nvlink: Option<Spanned<toml::Value>>,
}

/// A number or a string (durations: `"3ms"` or `3`).
#[derive(Debug, Deserialize, Clone)]
#[serde(untagged)]
enum RawNumOrText {
    Number(f64),
    Text(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHang {
    at_s: Option<f64>,
    gpu: RawGpus,
    function: Option<String>,
    for_s: Option<RawNumOrText>,
}

#[derive(Debug, Default, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct RawDevice {
    count: Option<u32>,
    index: Option<Spanned<u32>>,
    name: Option<String>,
    uuid: Option<String>,
    serial: Option<String>,
    pci_bus_id: Option<Spanned<String>>,
    pci_device_id: Option<u32>,
    pci_subsystem_id: Option<u32>,
    minor: Option<u32>,
    memory_total_mib: Option<f64>,
    memory_reserved_mib: Option<f64>,
    power_limit_w: Option<f64>,
    power_default_limit_w: Option<f64>,
    power_min_limit_w: Option<f64>,
    power_max_limit_w: Option<f64>,
    temp_shutdown_c: Option<u32>,
    temp_slowdown_c: Option<u32>,
    temp_gpu_max_c: Option<u32>,
    temp_mem_max_c: Option<u32>,
    ecc_enabled: Option<bool>,
    num_fans: Option<u32>,
    max_sm_clock_mhz: Option<u32>,
    max_mem_clock_mhz: Option<u32>,
    max_video_clock_mhz: Option<u32>,
    pcie_gen: Option<u32>,
    pcie_width: Option<u32>,
    architecture: Option<u32>,
    cuda_compute_capability: Option<Spanned<String>>,
    vbios_version: Option<String>,
    board_part_number: Option<String>,
    persistence_mode: Option<bool>,
    compute_mode: Option<u32>,
    memory_repair: Option<Spanned<String>>,
    energy_start_j: Option<f64>,
    hidden: Option<bool>,
    pci_class: Option<u32>,
    pcie_link_gen: Option<u32>,
    pcie_link_width: Option<u32>,
    pcie_slot_max_gen: Option<u32>,
    app_sm_clock_mhz: Option<u32>,
    app_mem_clock_mhz: Option<u32>,
    locked_sm_clock_mhz: Option<u32>,
    ecc_pending_enabled: Option<bool>,
    pcie_byte_counters: Option<bool>,
    recovery_action: Option<Spanned<String>>,
    recovery_action_supported: Option<bool>,
    gpm: Option<bool>,
    mig_capable: Option<bool>,
    mig_mode: Option<bool>,
    mig_pending: Option<bool>,
    mig: Option<Spanned<Vec<Spanned<RawMig>>>>,
    #[serde(default)]
    metrics: BTreeMap<String, Spanned<RawSignal>>,
}

/// A signal as written: a number (constant) or a table with a `type`.
#[derive(Debug, Clone)]
enum RawSignal {
    Number(f64),
    Table(Box<RawSignalTable>),
}

impl<'de> Deserialize<'de> for RawSignal {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SignalVisitor;
        impl<'de> Visitor<'de> for SignalVisitor {
            type Value = RawSignal;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a number or a signal table such as { type = \"noise\", mean = 95, amplitude = 3 }",
                )
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawSignal, E> {
                Ok(RawSignal::Number(v as f64))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawSignal, E> {
                Ok(RawSignal::Number(v as f64))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawSignal, E> {
                Ok(RawSignal::Number(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawSignal, A::Error> {
                RawSignalTable::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(|t| RawSignal::Table(Box::new(t)))
            }
        }
        deserializer.deserialize_any(SignalVisitor)
    }
}

#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct RawSignalTable {
    #[serde(rename = "type")]
    kind: String,
    value: Option<f64>,
    from: Option<f64>,
    to: Option<f64>,
    start_s: Option<f64>,
    duration_s: Option<f64>,
    per_s: Option<f64>,
    per_min: Option<f64>,
    period_s: Option<f64>,
    duty: Option<f64>,
    high: Option<f64>,
    low: Option<f64>,
    phase_s: Option<f64>,
    mean: Option<f64>,
    amplitude: Option<f64>,
    points: Option<Vec<(f64, RawSignal)>>,
    file: Option<String>,
    column: Option<String>,
    time_column: Option<String>,
    interval_s: Option<f64>,
    match_column: Option<String>,
    match_value: Option<String>,
    #[serde(rename = "loop")]
    looped: Option<bool>,
    scale: Option<f64>,
    offset: Option<f64>,
    noise: Option<f64>,
    noise_period_s: Option<f64>,
    min: Option<f64>,
    max: Option<f64>,
    seed: Option<u64>,
}

/// `gpu = 3`, `gpu = [1, 2]` or `gpu = "all"`.
#[derive(Debug, Deserialize, Clone)]
#[serde(untagged)]
enum RawGpus {
    One(u32),
    Many(Vec<u32>),
    Word(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEvent {
    at_s: f64,
    gpu: RawGpus,
    kind: String,
    code: Option<u64>,
    corrected: Option<u64>,
    uncorrected: Option<u64>,
    cause: Option<String>,
    address: Option<u64>,
    pending: Option<bool>,
    failure: Option<bool>,
    reasons: Option<Vec<String>>,
    mask: Option<u64>,
    count: Option<u64>,
    kmsg: Option<String>,
    pid: Option<RawPid>,
    process_name: Option<String>,
    text: Option<String>,
    nvml: Option<bool>,
    action: Option<String>,
}

/// `error = "NOT_SUPPORTED"` or `error = 15`.
#[derive(Debug, Deserialize, Clone)]
#[serde(untagged)]
enum RawCode {
    Number(u32),
    Name(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFault {
    function: String,
    error: Option<RawCode>,
    latency_ms: Option<f64>,
    gpus: Option<Vec<u32>>,
    from_s: Option<f64>,
    until_s: Option<f64>,
}

/// `pid = 1234`, `"self"`, `"parent"` or `"job"`.
#[derive(Debug, Deserialize, Clone)]
#[serde(untagged)]
pub(crate) enum RawPid {
    Number(u32),
    Word(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProcess {
    gpu: RawGpus,
    pid: RawPid,
    used_memory_mib: Option<RawSignal>,
    used_memory_unknown: Option<bool>,
    #[serde(rename = "type")]
    kind: Option<String>,
    from_s: Option<f64>,
    until_s: Option<f64>,
    sm_util_pct: Option<f64>,
    mig: Option<RawGpus>,
    name: Option<String>,
}

/// A MIG device: `"1g.10gb"` or a table.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum RawMig {
    Profile(String),
    Table(RawMigTable),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMigTable {
    profile: String,
    placement: Option<u32>,
    gpu_instance_id: Option<u32>,
    compute_instance_id: Option<u32>,
    uuid: Option<String>,
    memory_total_mib: Option<f64>,
    memory_used_mib: Option<RawSignal>,
    /// Its own activity (`gpu_util_pct`, `mem_util_pct`, the GPM percentages), by metric key.
    metrics: Option<BTreeMap<String, RawSignal>>,
}

// ---------------------------------------------------------------------------------------------
// Loading

/// Where a scenario's text came from, for error messages and relative trace paths.
struct Source<'a> {
    file: String,
    text: &'a str,
    base_dir: Option<PathBuf>,
}

impl Source<'_> {
    fn err(&self, span: std::ops::Range<usize>, message: impl Into<String>) -> ScenarioError {
        let (line, column) = line_col(self.text, span.start);
        // one line, whatever the parser's message looks like
        let message: String = message.into();
        ScenarioError {
            file: self.file.clone(),
            line,
            column,
            message: message.split_whitespace().collect::<Vec<_>>().join(" "),
        }
    }
}

/// Parses scenario text. `file` names it in errors; `base_dir` resolves relative trace paths.
pub fn parse(text: &str, file: &str, base_dir: Option<&Path>) -> Result<Scenario, ScenarioError> {
    let src = Source {
        file: file.to_string(),
        text,
        base_dir: base_dir.map(Path::to_path_buf),
    };
    let raw: RawScenario = toml::from_str(text).map_err(|e| {
        let span = e.span().unwrap_or(0..0);
        src.err(span, e.message().trim().to_string())
    })?;
    resolve(raw, &src)
}

/// Loads a scenario file from disk.
pub fn load_file(path: &Path) -> Result<Scenario, ScenarioError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ScenarioError {
        file: file.clone(),
        line: 1,
        column: 1,
        message: format!("cannot read scenario file: {e}"),
    })?;
    let mut scenario = parse(&text, &file, path.parent())?;
    if scenario.name.is_empty() {
        scenario.name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
    }
    Ok(scenario)
}

/// PCI bus numbers of the eight GPUs in a DGX H100, used for the first eight devices.
const DGX_BUSES: [u32; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

fn resolve(raw: RawScenario, src: &Source<'_>) -> Result<Scenario, ScenarioError> {
    let seed = raw.seed.unwrap_or(1);
    let time_scale = match &raw.time_scale {
        Some(ts) if !(*ts.get_ref() >= 0.0 && ts.get_ref().is_finite()) => {
            return Err(src.err(
                ts.span(),
                "time_scale must be a number >= 0 (0 freezes the clock)",
            ));
        }
        Some(ts) => *ts.get_ref(),
        None => 1.0,
    };
    let start_s = match &raw.start_s {
        Some(st) if !(*st.get_ref() >= 0.0 && st.get_ref().is_finite()) => {
            return Err(src.err(st.span(), "start_s must be a time in seconds >= 0"));
        }
        Some(st) => *st.get_ref(),
        None => 0.0,
    };
    let defaults = raw
        .devices
        .as_ref()
        .map(|d| d.get_ref().clone())
        .unwrap_or_default();
    if let Some(d) = &raw.devices {
        if let Some(ix) = &d.get_ref().index {
            return Err(src.err(
                ix.span(),
                "`index` belongs in a [[device]] entry, not [devices]",
            ));
        }
    }
    let count = defaults.count.unwrap_or(8);
    if count == 0 || count > crate::MAX_DEVICES as u32 {
        let span = raw.devices.as_ref().map(Spanned::span).unwrap_or(0..0);
        return Err(src.err(
            span,
            format!("devices.count must be between 1 and {}", crate::MAX_DEVICES),
        ));
    }
    let mut overrides: Vec<Option<RawDevice>> = vec![None; count as usize];
    for entry in &raw.device {
        let dev = entry.get_ref();
        let Some(index) = &dev.index else {
            return Err(src.err(entry.span(), "a [[device]] entry needs `index`"));
        };
        if dev.count.is_some() {
            return Err(src.err(entry.span(), "`count` belongs in [devices]"));
        }
        let i = *index.get_ref();
        if i >= count {
            return Err(src.err(
                index.span(),
                format!("device index {i} is out of range (devices.count = {count})"),
            ));
        }
        if overrides[i as usize].is_some() {
            return Err(src.err(index.span(), format!("device {i} is described twice")));
        }
        overrides[i as usize] = Some(dev.clone());
    }
    let mut devices = Vec::with_capacity(count as usize);
    for (i, ov) in overrides.into_iter().enumerate() {
        devices.push(resolve_device(i as u32, &defaults, ov.as_ref(), seed, src)?);
    }
    // unique identities
    for a in 0..devices.len() {
        for b in a + 1..devices.len() {
            if devices[a].uuid.eq_ignore_ascii_case(&devices[b].uuid) {
                return Err(src.err(0..0, format!("devices {a} and {b} have the same uuid")));
            }
            if devices[a].bus_id() == devices[b].bus_id() {
                return Err(src.err(
                    0..0,
                    format!("devices {a} and {b} have the same pci_bus_id"),
                ));
            }
        }
    }

    let mut events = Vec::new();
    for ev in &raw.event {
        let span = ev.span();
        let e = ev.get_ref();
        let gpus = resolve_gpus(&e.gpu, count, src, span.clone())?;
        let kind = resolve_event_kind(e, src, span.clone())?;
        if !(e.at_s >= 0.0 && e.at_s.is_finite()) {
            return Err(src.err(span, "at_s must be a time in seconds >= 0"));
        }
        for gpu in gpus {
            events.push(Event {
                at_s: e.at_s,
                gpu,
                kind: kind.clone(),
            });
        }
    }
    events.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));

    let mut faults = Vec::new();
    for f in &raw.fault {
        let span = f.span();
        let r = f.get_ref();
        if !r.function.starts_with("nvml") && r.function != "*" {
            return Err(src.err(
                span,
                format!("fault function `{}` is not an NVML symbol name", r.function),
            ));
        }
        let error = match &r.error {
            None => None,
            Some(RawCode::Number(n)) => Some(*n),
            Some(RawCode::Name(name)) => {
                Some(crate::errors::code_by_name(name).ok_or_else(|| {
                    src.err(span.clone(), format!("unknown NVML error name `{name}`"))
                })?)
            }
        };
        let latency_ms = r.latency_ms.unwrap_or(0.0);
        if error.is_none() && latency_ms <= 0.0 {
            return Err(src.err(span, "a fault needs `error` and/or `latency_ms`"));
        }
        if let Some(gpus) = &r.gpus {
            if let Some(bad) = gpus.iter().find(|g| **g >= count) {
                return Err(src.err(span, format!("fault gpu {bad} is out of range")));
            }
        }
        faults.push(Fault {
            function: r.function.clone(),
            error,
            latency_ms: latency_ms.max(0.0),
            gpus: r.gpus.clone(),
            from_s: r.from_s.unwrap_or(0.0),
            until_s: r.until_s.unwrap_or(f64::INFINITY),
        });
    }

    let driver_version = raw.driver_version.unwrap_or_else(|| "550.54.15".into());
    let driver_major: u32 = driver_version
        .split('.')
        .next()
        .and_then(|m| m.trim().parse().ok())
        .unwrap_or(0);
    for (i, dev) in devices.iter_mut().enumerate() {
        let explicit = raw
            .device
            .iter()
            .find(|d| d.get_ref().index.as_ref().map(|x| *x.get_ref()) == Some(i as u32))
            .and_then(|d| d.get_ref().recovery_action_supported)
            .or(defaults.recovery_action_supported);
        if explicit.is_none() && !dev.recovery_action_supported {
            dev.recovery_action_supported = driver_major >= 570
                || events
                    .iter()
                    .any(|e| e.gpu == i as u32 && matches!(e.kind, EventKind::RecoveryAction(_)));
        }
    }

    let mut latency = Vec::new();
    for (key, value) in raw.latency.iter().flatten() {
        if !crate::latency::valid_pattern(key) {
            return Err(src.err(
                value.span(),
                format!("latency key `{key}` is not an NVML symbol name, `prefix*` or `*`"),
            ));
        }
        let d = match value.get_ref() {
            RawNumOrText::Number(ms) => {
                crate::latency::millis(*ms).ok_or_else(|| format!("latency `{key}` must be >= 0"))
            }
            RawNumOrText::Text(t) => crate::latency::parse_duration(t),
        }
        .map_err(|m| src.err(value.span(), m))?;
        latency.push((key.clone(), d));
    }

    let mut hangs = Vec::new();
    if let Some(h) = &raw.hang {
        let span = h.span();
        let tables: Vec<toml::Value> = match h.get_ref() {
            toml::Value::Array(items) => items.clone(),
            other => vec![other.clone()],
        };
        for t in tables {
            let r: RawHang = t.try_into().map_err(|e: toml::de::Error| {
                src.err(span.clone(), format!("hang: {}", e.message().trim()))
            })?;
            hangs.extend(resolve_hang(&r, count, src, span.clone())?);
        }
    }

    let mut processes = Vec::new();
    let mut ranks = 0;
    for p in &raw.process {
        let span = p.span();
        let r = p.get_ref();
        let gpus = resolve_gpus(&r.gpu, count, src, span.clone())?;
        let pid = resolve_pid(&r.pid).map_err(|m| src.err(span.clone(), m))?;
        let memory = if r.used_memory_unknown == Some(true) {
            ProcessMemory::Unknown
        } else {
            match &r.used_memory_mib {
                None => ProcessMemory::Device,
                Some(sig) => ProcessMemory::Signal(resolve_signal(sig, src, span.clone())?),
            }
        };
        let graphics = match r.kind.as_deref() {
            None | Some("compute") => false,
            Some("graphics") => true,
            Some(other) => {
                return Err(src.err(
                    span,
                    format!("process type `{other}`: expected \"compute\" or \"graphics\""),
                ))
            }
        };
        for gpu in gpus {
            // a MIG GPU runs every process on one of its MIG devices; a GPU without MIG on none
            let mig = &devices[gpu as usize].mig;
            let on: Vec<Option<u32>> = match (&r.mig, mig.active()) {
                (None, false) => vec![None],
                (None, true) => {
                    return Err(src.err(
                        span,
                        format!("GPU {gpu} has MIG enabled: a process on it needs `mig` (its MIG device index, a list or \"all\")"),
                    ))
                }
                (Some(_), false) => {
                    return Err(src.err(
                        span,
                        format!("`mig`: GPU {gpu} has MIG disabled"),
                    ))
                }
                (Some(m), true) => {
                    let n = mig.devices.len() as u32;
                    resolve_gpus(m, n, src, span.clone())
                        .map_err(|e| {
                            src.err(
                                span.clone(),
                                format!("`mig` on GPU {gpu}: {}", e.message.replace("gpu", "MIG device").replace("devices.count", "MIG devices")),
                            )
                        })?
                        .into_iter()
                        .map(Some)
                        .collect()
                }
            };
            for mig in on {
                let pid = match pid {
                    PidSpec::Job(_) => {
                        ranks += 1;
                        PidSpec::Job(JOB_PID_BASE + ranks - 1)
                    }
                    other => other,
                };
                let name = match (&r.name, pid) {
                    (Some(n), _) if n.trim().is_empty() || n.len() >= 256 => {
                        return Err(src.err(
                            span,
                            "`name`: NVML names a process in 1 to 255 bytes".to_string(),
                        ))
                    }
                    (Some(n), _) => Some(n.clone()),
                    (None, PidSpec::Job(_)) => Some(JOB_NAME.to_string()),
                    (None, _) => None,
                };
                processes.push(ProcessSpec {
                    gpu,
                    pid,
                    name,
                    memory: memory.clone(),
                    graphics,
                    from_s: r.from_s.unwrap_or(0.0),
                    until_s: r.until_s.unwrap_or(f64::INFINITY),
                    sm_util_pct: r.sm_util_pct,
                    mig,
                });
            }
        }
    }

    let nvlink = match raw.nvlink {
        Some(v) => {
            let span = v.span();
            crate::nvlink::resolve(Some(v.into_inner()), &devices).map_err(|m| src.err(span, m))?
        }
        None => crate::nvlink::resolve(None, &devices).map_err(|m| src.err(0..0, m))?,
    };
    Ok(Scenario {
        name: raw.name.unwrap_or_default(),
        description: raw.description.unwrap_or_default(),
        source: src.file.clone(),
        time_scale,
        start_s,
        seed,
        driver_version,
        nvml_version: raw.nvml_version.unwrap_or_else(|| "12.550.54.15".into()),
        cuda_driver_version: raw.cuda_driver_version.unwrap_or(12040),
        devices,
        events,
        faults,
        processes,
        latency,
        hangs,
        nvlink,
    })
}

fn resolve_hang(
    r: &RawHang,
    count: u32,
    src: &Source<'_>,
    span: std::ops::Range<usize>,
) -> Result<Vec<Hang>, ScenarioError> {
    let gpus = resolve_gpus(&r.gpu, count, src, span.clone())?;
    let function = r.function.clone().unwrap_or_else(|| "*".into());
    if !crate::latency::valid_pattern(&function) {
        return Err(src.err(
            span,
            format!("hang function `{function}` is not an NVML symbol name, `prefix*` or `*`"),
        ));
    }
    let for_s = match &r.for_s {
        None => f64::INFINITY,
        Some(RawNumOrText::Number(n)) if *n >= 0.0 => *n,
        Some(RawNumOrText::Text(t)) if t == "inf" || t == "forever" => f64::INFINITY,
        Some(_) => return Err(src.err(span, "hang for_s must be seconds >= 0 or \"inf\"")),
    };
    let at_s = r.at_s.unwrap_or(0.0);
    if !(at_s >= 0.0 && at_s.is_finite()) {
        return Err(src.err(span, "hang at_s must be a time in seconds >= 0"));
    }
    Ok(gpus
        .into_iter()
        .map(|gpu| Hang {
            at_s,
            gpu,
            function: function.clone(),
            for_s,
        })
        .collect())
}

/// Hangs from `NVML_SIM_HANG`: `gpu=2,at_s=60,function=*,for_s=30` (`;` between hangs; `gpu` is a
/// scenario index or `all`).
pub fn parse_env_hangs(text: &str, count: u32) -> Result<Vec<Hang>, String> {
    let mut out = Vec::new();
    for item in text.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        let mut gpus: Option<Vec<u32>> = None;
        let mut hang = Hang {
            at_s: 0.0,
            gpu: 0,
            function: "*".into(),
            for_s: f64::INFINITY,
        };
        for kv in item.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("`{kv}`: expected KEY=VALUE"))?;
            let (k, v) = (k.trim(), v.trim());
            let num = || {
                v.parse::<f64>()
                    .ok()
                    .filter(|x| *x >= 0.0)
                    .ok_or_else(|| format!("`{k}={v}`: expected seconds >= 0"))
            };
            match k {
                "gpu" if v == "all" => gpus = Some((0..count).collect()),
                "gpu" => {
                    let g: u32 = v
                        .parse()
                        .map_err(|_| format!("`gpu={v}`: expected an index or `all`"))?;
                    if g >= count {
                        return Err(format!("gpu {g} is out of range ({count} devices)"));
                    }
                    gpus = Some(vec![g]);
                }
                "at_s" => hang.at_s = num()?,
                "for_s" if v == "inf" => hang.for_s = f64::INFINITY,
                "for_s" => hang.for_s = num()?,
                "function" => {
                    if !crate::latency::valid_pattern(v) {
                        return Err(format!(
                            "`function={v}`: not an NVML symbol name, `prefix*` or `*`"
                        ));
                    }
                    hang.function = v.to_string();
                }
                other => {
                    return Err(format!(
                        "unknown key `{other}` (gpu, at_s, function, for_s)"
                    ))
                }
            }
        }
        let gpus = gpus.ok_or_else(|| format!("`{item}`: needs gpu=N"))?;
        out.extend(gpus.into_iter().map(|gpu| Hang {
            gpu,
            ..hang.clone()
        }));
    }
    Ok(out)
}

/// Parses a `pid` value.
pub(crate) fn resolve_pid(raw: &RawPid) -> Result<PidSpec, String> {
    match raw {
        RawPid::Number(n) => Ok(PidSpec::Fixed(*n)),
        RawPid::Word(w) if w == "self" => Ok(PidSpec::SelfPid),
        RawPid::Word(w) if w == "parent" => Ok(PidSpec::Parent),
        // numbered when the process entries are expanded (one rank per GPU)
        RawPid::Word(w) if w == "job" => Ok(PidSpec::Job(0)),
        RawPid::Word(w) => Err(format!(
            "pid `{w}`: expected a number, \"self\", \"parent\" or \"job\""
        )),
    }
}

/// Parses a `pid` value that names a process (an XID's, a control file's): not `"job"`, which
/// makes a new rank.
pub(crate) fn resolve_named_pid(raw: &RawPid) -> Result<PidSpec, String> {
    match resolve_pid(raw)? {
        PidSpec::Job(_) => Err(
            "pid \"job\" makes a new rank and belongs in a [[process]] entry of a scenario; here give a number, \"self\" or \"parent\"".into(),
        ),
        other => Ok(other),
    }
}

fn resolve_gpus(
    raw: &RawGpus,
    count: u32,
    src: &Source<'_>,
    span: std::ops::Range<usize>,
) -> Result<Vec<u32>, ScenarioError> {
    let list = match raw {
        RawGpus::One(g) => vec![*g],
        RawGpus::Many(v) => v.clone(),
        RawGpus::Word(w) if w == "all" => (0..count).collect(),
        RawGpus::Word(w) => {
            return Err(src.err(
                span,
                format!("gpu `{w}`: expected an index, a list of indices or \"all\""),
            ))
        }
    };
    if let Some(bad) = list.iter().find(|g| **g >= count) {
        return Err(src.err(
            span,
            format!("gpu {bad} is out of range (devices.count = {count})"),
        ));
    }
    Ok(list)
}

/// Clock event reason names (snake_case) and their bits.
pub const REASON_BITS: [(&str, u64); 9] = [
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
];

fn resolve_event_kind(
    e: &RawEvent,
    src: &Source<'_>,
    span: std::ops::Range<usize>,
) -> Result<EventKind, ScenarioError> {
    let need = |v: Option<u64>, field: &str| {
        v.ok_or_else(|| {
            src.err(
                span.clone(),
                format!("event kind `{}` needs `{field}`", e.kind),
            )
        })
    };
    Ok(match e.kind.as_str() {
        "xid" => {
            let kmsg = match e.kmsg.as_deref() {
                None => KmsgStyle::PidName,
                Some(name) => KmsgStyle::NAMES
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, k)| *k)
                    .ok_or_else(|| {
                        src.err(
                            span.clone(),
                            format!(
                                "kmsg style `{name}` (known: {})",
                                KmsgStyle::NAMES.map(|k| k.0).join(", ")
                            ),
                        )
                    })?,
            };
            let pid = match &e.pid {
                None => None,
                Some(p) => Some(resolve_named_pid(p).map_err(|m| src.err(span.clone(), m))?),
            };
            EventKind::Xid(Box::new(Xid {
                code: need(e.code, "code")?,
                kmsg,
                pid,
                process_name: e.process_name.clone(),
                text: e.text.clone(),
                nvml: e.nvml.unwrap_or(true),
            }))
        }
        "kmsg" => EventKind::Kmsg(
            e.text
                .clone()
                .ok_or_else(|| src.err(span.clone(), "a kmsg event needs `text`"))?,
        ),
        "recovery_action" => {
            let name = e
                .action
                .as_deref()
                .ok_or_else(|| src.err(span.clone(), "a recovery_action event needs `action`"))?;
            EventKind::RecoveryAction(
                recovery_action_by_name(name).map_err(|m| src.err(span.clone(), m))?,
            )
        }
        "ecc" => {
            let corrected = e.corrected.unwrap_or(0);
            let uncorrected = e.uncorrected.unwrap_or(0);
            if corrected == 0 && uncorrected == 0 {
                return Err(src.err(span, "an ecc event needs `corrected` and/or `uncorrected`"));
            }
            EventKind::Ecc {
                corrected,
                uncorrected,
            }
        }
        "retired_page" => {
            let double_bit = match e.cause.as_deref() {
                Some("sbe") | Some("multiple_single_bit") => false,
                Some("dbe") | Some("double_bit") | None => true,
                Some(other) => {
                    return Err(src.err(
                        span,
                        format!("retired_page cause `{other}`: expected \"sbe\" or \"dbe\""),
                    ))
                }
            };
            EventKind::RetiredPage {
                double_bit,
                address: e.address.unwrap_or(0x1_2345_6000),
                pending: e.pending.unwrap_or(false),
            }
        }
        "remapped_row" => EventKind::RemappedRow {
            correctable: e.corrected.unwrap_or(0),
            uncorrectable: e.uncorrected.unwrap_or(0),
            pending: e.pending,
            failure: e.failure,
        },
        "clock_event_reasons" | "throttle" => {
            let mut mask = e.mask;
            if let Some(names) = &e.reasons {
                let mut m = mask.unwrap_or(0);
                for n in names {
                    let bit = REASON_BITS
                        .iter()
                        .find(|(k, _)| *k == n.as_str())
                        .map(|(_, b)| *b)
                        .ok_or_else(|| {
                            src.err(
                                span.clone(),
                                format!(
                                    "unknown clock event reason `{n}` (known: {})",
                                    REASON_BITS.map(|r| r.0).join(", ")
                                ),
                            )
                        })?;
                    m |= bit;
                }
                mask = Some(m);
            }
            EventKind::ClockEventReasons(mask)
        }
        "pcie_replay" => EventKind::PcieReplay(e.count.unwrap_or(1)),
        "lost" | "gpu_lost" => EventKind::Lost,
        other => {
            return Err(src.err(
                span,
                format!(
                    "unknown event kind `{other}` (known: xid, ecc, retired_page, remapped_row, \
                     clock_event_reasons, pcie_replay, lost, kmsg, recovery_action)"
                ),
            ))
        }
    })
}

fn resolve_device(
    index: u32,
    defaults: &RawDevice,
    ov: Option<&RawDevice>,
    seed: u64,
    src: &Source<'_>,
) -> Result<DeviceSpec, ScenarioError> {
    macro_rules! pick {
        ($field:ident) => {
            ov.and_then(|o| o.$field.clone())
                .or_else(|| defaults.$field.clone())
        };
    }
    let dev_seed = mix(seed, u64::from(index) + 1);
    let uuid = pick!(uuid).unwrap_or_else(|| {
        let a = mix(dev_seed, 0x75756964);
        let b = mix(dev_seed, 0x75756965);
        format!(
            "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xffff,
            b >> 48,
            b & 0xffff_ffff_ffff
        )
    });
    let (pci_domain, pci_bus, pci_device) = match ov.and_then(|o| o.pci_bus_id.as_ref()) {
        Some(b) => parse_bus_id(b.get_ref()).ok_or_else(|| {
            src.err(
                b.span(),
                format!("cannot read pci_bus_id `{}`", b.get_ref()),
            )
        })?,
        None => (
            0,
            DGX_BUSES
                .get(index as usize)
                .copied()
                .unwrap_or(0x100u32.saturating_sub(MAX_EXTRA) + index),
            0,
        ),
    };
    if let Some(b) = defaults.pci_bus_id.as_ref() {
        return Err(src.err(
            b.span(),
            "pci_bus_id must be set per device in [[device]], not in [devices]",
        ));
    }
    let (cuda_cc_major, cuda_cc_minor) = match pick!(cuda_compute_capability) {
        Some(cc) => {
            let parsed = cc
                .get_ref()
                .split_once('.')
                .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
            parsed.ok_or_else(|| {
                src.err(cc.span(), "cuda_compute_capability must look like \"9.0\"")
            })?
        }
        None => (9, 0),
    };
    let memory_repair = match pick!(memory_repair) {
        None => MemoryRepair::RowRemap,
        Some(s) => match s.get_ref().as_str() {
            "row_remap" => MemoryRepair::RowRemap,
            "page_retirement" => MemoryRepair::PageRetirement,
            other => {
                return Err(src.err(
                    s.span(),
                    format!(
                        "memory_repair `{other}`: expected \"row_remap\" or \"page_retirement\""
                    ),
                ))
            }
        },
    };
    let recovery_action = match pick!(recovery_action) {
        None => None,
        Some(r) => Some(recovery_action_by_name(r.get_ref()).map_err(|m| src.err(r.span(), m))?),
    };
    let pcie_gen = pick!(pcie_gen).unwrap_or(5);
    let pcie_width = pick!(pcie_width).unwrap_or(16);
    let pcie_slot_max_gen = pick!(pcie_slot_max_gen).unwrap_or(pcie_gen);
    let max_sm_clock_mhz = pick!(max_sm_clock_mhz).unwrap_or(1980);
    let max_mem_clock_mhz = pick!(max_mem_clock_mhz).unwrap_or(2619);
    let ecc_enabled = pick!(ecc_enabled).unwrap_or(true);
    let mw = |w: f64| (w * 1000.0).round().max(0.0) as u32;
    let power_limit_w = pick!(power_limit_w).unwrap_or(700.0);
    let memory_total_mib = pick!(memory_total_mib).unwrap_or(81559.0);
    let name = pick!(name).unwrap_or_else(|| "NVIDIA H100 80GB HBM3".into());
    let architecture = pick!(architecture)
        .or_else(|| architecture_of(&name))
        .unwrap_or(ARCH_HOPPER);
    let mig = resolve_mig(
        pick!(mig),
        pick!(mig_mode),
        pick!(mig_pending),
        pick!(mig_capable),
        &name,
        memory_total_mib,
        dev_seed,
        src,
    )?;
    let mut signals: Vec<Option<Signal>> = vec![None; Metric::ALL.len()];
    for map in [Some(&defaults.metrics), ov.map(|o| &o.metrics)]
        .into_iter()
        .flatten()
    {
        for (key, sig) in map {
            let metric = Metric::from_key(key).ok_or_else(|| {
                src.err(
                    sig.span(),
                    format!(
                        "unknown metric `{key}` (known: {})",
                        Metric::ALL.map(Metric::key).join(", ")
                    ),
                )
            })?;
            signals[metric.position()] = Some(resolve_signal(sig.get_ref(), src, sig.span())?);
        }
    }
    Ok(DeviceSpec {
        index,
        gpm: pick!(gpm).unwrap_or_else(|| gpm_by_default(architecture, &name)),
        name,
        uuid,
        serial: match (ov.and_then(|o| o.serial.clone()), &defaults.serial) {
            (Some(serial), _) => serial,
            (None, Some(prefix)) => format!("{prefix}{index}"),
            (None, None) => format!("16542230{:05}", mix(dev_seed, 7) % 100_000),
        },
        pci_domain,
        pci_bus,
        pci_device,
        pci_device_id: pick!(pci_device_id).unwrap_or(0x2330_10DE),
        pci_subsystem_id: pick!(pci_subsystem_id).unwrap_or(0x16C1_10DE),
        minor: pick!(minor).unwrap_or(index),
        memory_total_bytes: (memory_total_mib * MIB) as u64,
        memory_reserved_bytes: (pick!(memory_reserved_mib).unwrap_or(527.0) * MIB) as u64,
        power_limit_mw: mw(power_limit_w),
        power_default_limit_mw: mw(pick!(power_default_limit_w).unwrap_or(power_limit_w)),
        power_min_limit_mw: mw(pick!(power_min_limit_w).unwrap_or(200.0)),
        power_max_limit_mw: mw(pick!(power_max_limit_w).unwrap_or(power_limit_w)),
        temp_shutdown_c: pick!(temp_shutdown_c).unwrap_or(92),
        temp_slowdown_c: pick!(temp_slowdown_c).unwrap_or(89),
        temp_gpu_max_c: pick!(temp_gpu_max_c).unwrap_or(87),
        temp_mem_max_c: pick!(temp_mem_max_c).unwrap_or(95),
        ecc_enabled,
        num_fans: pick!(num_fans).unwrap_or(0),
        max_sm_clock_mhz,
        max_mem_clock_mhz,
        max_video_clock_mhz: pick!(max_video_clock_mhz).unwrap_or(1755),
        pcie_gen,
        pcie_width,
        architecture,
        cuda_cc_major,
        cuda_cc_minor,
        vbios_version: pick!(vbios_version).unwrap_or_else(|| "96.00.74.00.0D".into()),
        board_part_number: pick!(board_part_number).unwrap_or_else(|| "692-2G520-0200-000".into()),
        persistence_mode: pick!(persistence_mode).unwrap_or(true),
        compute_mode: pick!(compute_mode).unwrap_or(0),
        memory_repair,
        energy_start_mj: (pick!(energy_start_j).unwrap_or(1_000_000.0 + f64::from(index) * 1234.5)
            * 1000.0) as u64,
        hidden: pick!(hidden).unwrap_or(false),
        pci_class: pick!(pci_class).unwrap_or(0x030200),
        pcie_link_gen: pick!(pcie_link_gen).unwrap_or(pcie_gen.min(pcie_slot_max_gen)),
        pcie_link_width: pick!(pcie_link_width).unwrap_or(pcie_width),
        pcie_slot_max_gen,
        app_sm_clock_mhz: pick!(app_sm_clock_mhz).unwrap_or(max_sm_clock_mhz),
        app_mem_clock_mhz: pick!(app_mem_clock_mhz).unwrap_or(max_mem_clock_mhz),
        locked_sm_clock_mhz: pick!(locked_sm_clock_mhz),
        ecc_pending: pick!(ecc_pending_enabled).unwrap_or(ecc_enabled),
        pcie_byte_counters: pick!(pcie_byte_counters).unwrap_or(true),
        recovery_action: recovery_action.unwrap_or(0),
        // resolved by the caller once the events and the driver version are known:
        // explicit option, else set action, else a recovery_action event, else driver >= 570
        recovery_action_supported: pick!(recovery_action_supported)
            .unwrap_or(recovery_action.is_some()),
        signals,
        seed: dev_seed,
        mig,
    })
}

/// A device's MIG keys: `mig` (the MIG devices: profile names or tables), `mig_mode` (default:
/// on when `mig` lists devices), `mig_pending` (default: `mig_mode`), `mig_capable` (default:
/// from the name: A100, A30, H100, H200, B200, …).
#[allow(clippy::too_many_arguments)]
fn resolve_mig(
    raw: Option<Spanned<Vec<Spanned<RawMig>>>>,
    mode: Option<bool>,
    pending: Option<bool>,
    capable: Option<bool>,
    name: &str,
    memory_total_mib: f64,
    dev_seed: u64,
    src: &Source<'_>,
) -> Result<crate::mig::MigConfig, ScenarioError> {
    let span = raw.as_ref().map_or(0..0, Spanned::span);
    let entries = raw.map(Spanned::into_inner).unwrap_or_default();
    let enabled = mode.unwrap_or(!entries.is_empty());
    let capable = capable.unwrap_or_else(|| crate::mig::capable_by_name(name));
    if !entries.is_empty() && !enabled {
        return Err(src.err(span, "`mig` lists MIG devices but `mig_mode` is false"));
    }
    if enabled && !capable {
        return Err(src.err(
            span,
            format!("{name} does not support MIG (set `mig_capable = true`)"),
        ));
    }
    let mut requests = Vec::with_capacity(entries.len());
    let mut spans = Vec::with_capacity(entries.len());
    for e in &entries {
        spans.push(e.span());
        requests.push(match e.get_ref() {
            RawMig::Profile(p) => crate::mig::MigRequest {
                profile: p.clone(),
                ..Default::default()
            },
            RawMig::Table(t) => crate::mig::MigRequest {
                profile: t.profile.clone(),
                placement: t.placement,
                gpu_instance_id: t.gpu_instance_id,
                compute_instance_id: t.compute_instance_id,
                uuid: t.uuid.clone(),
                memory_total_mib: t.memory_total_mib,
                memory_used: match &t.memory_used_mib {
                    Some(sig) => Some(resolve_signal(sig, src, e.span())?),
                    None => None,
                },
                activity: match &t.metrics {
                    Some(map) => mig_activity(map, src, e.span())?,
                    None => Vec::new(),
                },
            },
        });
    }
    let devices = crate::mig::layout(name, memory_total_mib, dev_seed, requests)
        .map_err(|(k, m)| src.err(spans.get(k).cloned().unwrap_or(span.clone()), m))?;
    Ok(crate::mig::MigConfig {
        capable,
        enabled,
        pending: pending.unwrap_or(enabled),
        devices,
    })
}

/// A MIG device's `metrics` table: its own activity signals, by metric (only the metrics a GPU
/// instance has: utilization and the GPM percentages; see `Metric::per_mig_device`).
fn mig_activity(
    map: &BTreeMap<String, RawSignal>,
    src: &Source<'_>,
    span: std::ops::Range<usize>,
) -> Result<Vec<(Metric, Signal)>, ScenarioError> {
    let mut out = Vec::with_capacity(map.len());
    for (key, sig) in map {
        let metric = Metric::from_key(key)
            .filter(|m| m.per_mig_device())
            .ok_or_else(|| {
                src.err(
                    span.clone(),
                    format!(
                        "`metrics.{key}` is not a MIG device's metric (known: {})",
                        Metric::ALL
                            .iter()
                            .filter(|m| m.per_mig_device())
                            .map(|m| m.key())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })?;
        out.push((metric, resolve_signal(sig, src, span.clone())?));
    }
    Ok(out)
}

/// `NVML_DEVICE_ARCH_HOPPER`.
pub const ARCH_HOPPER: u32 = 9;

/// The `NVML_DEVICE_ARCH_*` of a marketing name, when the name says it (`NVIDIA A100-SXM4-80GB`
/// → 7 Ampere, `Tesla V100-SXM2-16GB` → 5 Volta, `NVIDIA GeForce RTX 4090` → 8 Ada, `NVIDIA
/// B200` → 10 Blackwell), so a scenario that names an older GPU gets its architecture (and no
/// GPM) without saying so.
pub fn architecture_of(name: &str) -> Option<u32> {
    let upper = name.to_ascii_uppercase();
    let tokens: Vec<&str> = upper
        .split([' ', '-', '_'])
        .filter(|t| !t.is_empty())
        .collect();
    let has = |list: &[&str]| tokens.iter().any(|t| list.contains(t));
    if has(&["BLACKWELL", "B100", "B200", "B300", "GB200", "GB300"]) {
        return Some(10);
    }
    if has(&["H100", "H200", "H800", "H20", "GH200"]) {
        return Some(9);
    }
    if has(&["ADA", "L4", "L20", "L40", "L40S", "L40G"]) {
        return Some(8);
    }
    if has(&[
        "A100", "A800", "A30", "A40", "A10", "A10G", "A16", "A2", "A6000", "A5000", "A4000",
    ]) {
        return Some(7);
    }
    if has(&["T4", "T4G"]) {
        return Some(6);
    }
    if has(&["V100", "V100S"]) {
        return Some(5);
    }
    if has(&["P100", "P40", "P4"]) {
        return Some(4);
    }
    // GeForce / RTX by series number: RTX 5090 → Blackwell … RTX 2080 → Turing
    if has(&["GEFORCE", "RTX"]) {
        let series = tokens
            .iter()
            .filter(|t| t.len() == 4 && t.bytes().all(|b| b.is_ascii_digit()))
            .find_map(|t| t.chars().next()?.to_digit(10));
        return match series? {
            5 => Some(10),
            4 => Some(8),
            3 => Some(7),
            2 => Some(6),
            _ => None,
        };
    }
    None
}

/// Whether a GPU answers GPM by default: Hopper (9) or later, not a GeForce board.
pub fn gpm_by_default(architecture: u32, name: &str) -> bool {
    architecture >= ARCH_HOPPER && !name.to_ascii_uppercase().contains("GEFORCE")
}

/// Bus numbers for devices beyond the eighth count down from 0xff.
const MAX_EXTRA: u32 = crate::MAX_DEVICES as u32;

/// Parses `00000000:18:00.0`, `0000:18:00.0` or `18:00.0` into (domain, bus, device).
pub fn parse_bus_id(s: &str) -> Option<(u32, u32, u32)> {
    let s = s.trim();
    let (rest, _function) = s.rsplit_once('.')?;
    let parts: Vec<&str> = rest.split(':').collect();
    let hex = |p: &str| u32::from_str_radix(p, 16).ok();
    match parts.as_slice() {
        [domain, bus, device] => Some((hex(domain)?, hex(bus)?, hex(device)?)),
        [bus, device] => Some((0, hex(bus)?, hex(device)?)),
        _ => None,
    }
}

/// The first field set in a signal table that its type does not use.
fn misplaced_field(t: &RawSignalTable) -> Option<&'static str> {
    let set: [(&'static str, bool); 23] = [
        ("value", t.value.is_some()),
        ("from", t.from.is_some()),
        ("to", t.to.is_some()),
        ("start_s", t.start_s.is_some()),
        ("duration_s", t.duration_s.is_some()),
        ("per_s", t.per_s.is_some()),
        ("per_min", t.per_min.is_some()),
        ("period_s", t.period_s.is_some()),
        ("duty", t.duty.is_some()),
        ("high", t.high.is_some()),
        ("low", t.low.is_some()),
        ("phase_s", t.phase_s.is_some()),
        ("mean", t.mean.is_some()),
        ("amplitude", t.amplitude.is_some()),
        ("points", t.points.is_some()),
        ("file", t.file.is_some()),
        ("column", t.column.is_some()),
        ("time_column", t.time_column.is_some()),
        ("interval_s", t.interval_s.is_some()),
        ("match_column", t.match_column.is_some()),
        ("match_value", t.match_value.is_some()),
        ("loop", t.looped.is_some()),
        ("scale", t.scale.is_some() || t.offset.is_some()),
    ];
    let allowed: &[&str] = match t.kind.as_str() {
        "constant" => &["value"],
        "ramp" | "linear" => &["from", "to", "start_s", "duration_s", "per_s", "per_min"],
        "square" => &["period_s", "duty", "high", "low", "phase_s"],
        "sine" => &["mean", "amplitude", "period_s", "phase_s"],
        "noise" => &["mean", "amplitude", "period_s"],
        "steps" => &["points"],
        "trace" | "csv" => &[
            "file",
            "column",
            "time_column",
            "interval_s",
            "match_column",
            "match_value",
            "loop",
            "scale",
        ],
        // unknown types are reported by the caller
        _ => return None,
    };
    set.iter()
        .find(|(name, is_set)| *is_set && !allowed.contains(name))
        .map(|(name, _)| *name)
}

fn resolve_signal(
    raw: &RawSignal,
    src: &Source<'_>,
    span: std::ops::Range<usize>,
) -> Result<Signal, ScenarioError> {
    let t = match raw {
        RawSignal::Number(v) => return Ok(Signal::constant(*v)),
        RawSignal::Table(t) => t,
    };
    let err = |m: String| src.err(span.clone(), m);
    if let Some(field) = misplaced_field(t) {
        return Err(err(format!(
            "`{field}` does not apply to a `{}` signal",
            t.kind
        )));
    }
    let need = |v: Option<f64>, field: &str| {
        v.ok_or_else(|| err(format!("signal type `{}` needs `{field}`", t.kind)))
    };
    let shape = match t.kind.as_str() {
        "constant" => Shape::Constant(need(t.value, "value")?),
        "ramp" | "linear" => {
            let from = t.from.unwrap_or(0.0);
            let start_s = t.start_s.unwrap_or(0.0);
            let per_s = match (t.per_s, t.per_min, t.to, t.duration_s) {
                (Some(p), None, _, _) => p,
                (None, Some(p), _, _) => p / 60.0,
                (None, None, Some(to), Some(d)) if d > 0.0 => (to - from) / d,
                _ => {
                    return Err(err(
                        "a ramp needs `per_s` or `per_min`, or `to` and `duration_s` > 0".into(),
                    ))
                }
            };
            Shape::Ramp {
                from,
                to: t.to,
                start_s,
                per_s,
            }
        }
        "square" => {
            let period_s = need(t.period_s, "period_s")?;
            let duty = t.duty.unwrap_or(0.5);
            if period_s <= 0.0 || !(0.0..=1.0).contains(&duty) {
                return Err(err("a square wave needs period_s > 0 and 0 <= duty <= 1".into()));
            }
            Shape::Square {
                period_s,
                duty,
                high: need(t.high, "high")?,
                low: t.low.unwrap_or(0.0),
                phase_s: t.phase_s.unwrap_or(0.0),
            }
        }
        "sine" => {
            let period_s = need(t.period_s, "period_s")?;
            if period_s <= 0.0 {
                return Err(err("a sine needs period_s > 0".into()));
            }
            Shape::Sine {
                mean: need(t.mean, "mean")?,
                amplitude: need(t.amplitude, "amplitude")?,
                period_s,
                phase_s: t.phase_s.unwrap_or(0.0),
            }
        }
        "noise" => Shape::Noise {
            mean: need(t.mean, "mean")?,
            amplitude: need(t.amplitude, "amplitude")?,
            period_s: t.period_s.unwrap_or(1.0).max(1e-3),
        },
        "steps" => {
            let points = t
                .points
                .as_ref()
                .ok_or_else(|| err("a steps signal needs `points = [[time_s, value], ...]`".into()))?;
            if points.is_empty() {
                return Err(err("`points` is empty".into()));
            }
            let mut out = Vec::with_capacity(points.len());
            for (at, sig) in points {
                out.push((*at, resolve_signal(sig, src, span.clone())?));
            }
            out.sort_by(|a, b| a.0.total_cmp(&b.0));
            Shape::Steps(out)
        }
        "trace" | "csv" => {
            let file = t
                .file
                .as_ref()
                .ok_or_else(|| err("a trace signal needs `file`".into()))?;
            let column = t
                .column
                .as_ref()
                .ok_or_else(|| err("a trace signal needs `column`".into()))?;
            let mut path = PathBuf::from(file);
            if path.is_relative() {
                if let Some(dir) = &src.base_dir {
                    path = dir.join(path);
                }
            }
            let text = std::fs::read_to_string(&path)
                .map_err(|e| err(format!("cannot read trace `{}`: {e}", path.display())))?;
            let spec = TraceSpec {
                column: column.clone(),
                time_column: t.time_column.clone(),
                interval_s: t.interval_s.unwrap_or(1.0),
                match_column: t.match_column.clone(),
                match_value: t.match_value.clone(),
            };
            let trace = Trace::parse(&text, &spec)
                .map_err(|m| err(format!("trace `{}`: {m}", path.display())))?;
            Shape::Trace {
                trace: Arc::new(trace),
                looped: t.looped.unwrap_or(false),
                scale: t.scale.unwrap_or(1.0),
                offset: t.offset.unwrap_or(0.0),
            }
        }
        other => {
            return Err(err(format!(
                "unknown signal type `{other}` (known: constant, ramp, square, sine, noise, steps, trace)"
            )))
        }
    };
    Ok(Signal {
        shape,
        noise: t.noise.unwrap_or(0.0),
        noise_period_s: t.noise_period_s.unwrap_or(1.0),
        min: t.min,
        max: t.max,
        seed: t.seed.map(|s| mix(s, 0x5eed)).unwrap_or(0) ^ hash_str(&t.kind),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> ScenarioError {
        parse(text, "bad.toml", None).unwrap_err()
    }

    #[test]
    fn minimal_scenario_gets_eight_h100s() {
        let s = parse("", "empty.toml", None).unwrap();
        assert_eq!(s.devices.len(), 8);
        assert_eq!(s.time_scale, 1.0);
        assert_eq!(s.devices[0].name, "NVIDIA H100 80GB HBM3");
        assert_eq!(s.devices[0].bus_id(), "00000000:18:00.0");
        assert_eq!(s.devices[0].bus_id_legacy(), "0000:18:00.0");
        assert!(s.devices[3].uuid.starts_with("GPU-") && s.devices[3].uuid.len() == 40);
        assert_ne!(s.devices[0].uuid, s.devices[1].uuid);
        assert_eq!(s.devices[5].minor, 5);
    }

    #[test]
    fn gpm_follows_the_architecture_and_the_name() {
        for (name, arch) in [
            ("NVIDIA H100 80GB HBM3", Some(9)),
            ("NVIDIA H200", Some(9)),
            ("NVIDIA H20", Some(9)),
            ("NVIDIA GH200 480GB", Some(9)),
            ("NVIDIA B200", Some(10)),
            ("NVIDIA A100-SXM4-80GB", Some(7)),
            ("NVIDIA A10G", Some(7)),
            ("Tesla V100-SXM2-16GB", Some(5)),
            ("Tesla T4", Some(6)),
            ("NVIDIA L40S", Some(8)),
            ("NVIDIA GeForce RTX 4090", Some(8)),
            ("NVIDIA GeForce RTX 5090", Some(10)),
            ("Something New", None),
        ] {
            assert_eq!(architecture_of(name), arch, "{name}");
        }
        assert!(gpm_by_default(9, "NVIDIA H100 80GB HBM3"));
        assert!(!gpm_by_default(7, "NVIDIA A100-SXM4-80GB"));
        assert!(!gpm_by_default(10, "NVIDIA GeForce RTX 5090"));
        let s = parse(
            "[devices]\ncount = 4\n\
             [[device]]\nindex = 1\nname = \"NVIDIA A100-SXM4-80GB\"\n\
             [[device]]\nindex = 2\nname = \"NVIDIA A100-SXM4-80GB\"\narchitecture = 9\n\
             [[device]]\nindex = 3\ngpm = false\n",
            "t.toml",
            None,
        )
        .unwrap();
        let d = &s.devices;
        assert!(d[0].gpm && d[0].architecture == 9, "an H100 by default");
        assert!(!d[1].gpm && d[1].architecture == 7, "the name says Ampere");
        assert!(d[2].gpm, "an explicit architecture wins");
        assert!(!d[3].gpm, "an explicit gpm = false wins");
    }

    #[test]
    fn device_overrides_and_signals() {
        let s = parse(
            r#"
time_scale = 60
driver_version = "580.82.07"
[devices]
count = 2
name = "NVIDIA A100-SXM4-40GB"
serial = "ABC"
[devices.metrics]
gpu_util_pct = 50
[[device]]
index = 1
uuid = "GPU-11111111-2222-3333-4444-555555555555"
pci_bus_id = "0000:07:00.0"
minor = 4
memory_repair = "page_retirement"
[device.metrics]
power_w = { type = "ramp", from = 100, to = 200, duration_s = 10 }
[[event]]
at_s = 5
gpu = "all"
kind = "xid"
code = 13
[[fault]]
function = "nvmlDeviceGetPowerUsage"
error = "NOT_SUPPORTED"
gpus = [1]
[[process]]
gpu = [0, 1]
pid = "self"
used_memory_mib = 512
"#,
            "ok.toml",
            None,
        )
        .unwrap();
        assert_eq!(s.time_scale, 60.0);
        assert_eq!(s.driver_version, "580.82.07");
        assert_eq!(s.devices.len(), 2);
        assert_eq!(s.devices[0].serial, "ABC0");
        assert_eq!(s.devices[1].bus_id(), "00000000:07:00.0");
        assert_eq!(s.devices[1].minor, 4);
        assert_eq!(s.devices[1].memory_repair, MemoryRepair::PageRetirement);
        assert!(s.devices[1].signal(Metric::PowerW).is_some());
        assert!(s.devices[0].signal(Metric::PowerW).is_none());
        assert!(s.devices[1].signal(Metric::GpuUtilPct).is_some());
        assert_eq!(s.events.len(), 2);
        assert!(s.faults[0].matches("nvmlDeviceGetPowerUsage", Some(1), 0.0));
        assert!(!s.faults[0].matches("nvmlDeviceGetPowerUsage", Some(0), 0.0));
        assert_eq!(s.processes.len(), 2);
        assert_eq!(s.processes[0].pid, PidSpec::SelfPid);
    }

    /// `pid = "job"` makes one rank per GPU at PIDs no kernel hands out, named by NVML as a
    /// training job; a process's own `name` wins; an XID cannot name a rank that way.
    #[test]
    fn job_processes_are_ranks_above_the_largest_pid() {
        let s = parse(
            "name = \"x\"\n[devices]\ncount = 3\n\
             [[process]]\ngpu = \"all\"\npid = \"job\"\n\
             [[process]]\ngpu = 1\npid = \"job\"\nname = \"torchrun eval.py\"\n\
             [[process]]\ngpu = 2\npid = \"self\"\n",
            "job.toml",
            None,
        )
        .unwrap();
        let pids: Vec<PidSpec> = s.processes.iter().map(|p| p.pid).collect();
        assert_eq!(
            pids,
            [
                PidSpec::Job(4_195_001),
                PidSpec::Job(4_195_002),
                PidSpec::Job(4_195_003),
                PidSpec::Job(4_195_004),
                PidSpec::SelfPid
            ]
        );
        let names: Vec<Option<&str>> = s.processes.iter().map(|p| p.name.as_deref()).collect();
        assert_eq!(
            names,
            [
                Some(JOB_NAME),
                Some(JOB_NAME),
                Some(JOB_NAME),
                Some("torchrun eval.py"),
                None
            ]
        );
        let e = err("name = \"x\"\n[devices]\ncount = 1\n[[event]]\ngpu = 0\nat_s = 1\nkind = \"xid\"\ncode = 13\npid = \"job\"\n");
        assert!(e.message.contains("[[process]]"), "{e}");
        let long = "x".repeat(256);
        for name in ["", long.as_str()] {
            let e = err(&format!(
                "name = \"x\"\n[devices]\ncount = 1\n[[process]]\ngpu = 0\npid = \"job\"\nname = \"{name}\"\n"
            ));
            assert!(e.message.contains("1 to 255 bytes"), "{e}");
        }
    }

    #[test]
    fn syntax_error_position() {
        let e = err("name = \"x\"\n[devices]\ncount = = 3\n");
        assert_eq!((e.line, e.column), (3, 9), "{e}");
        assert!(e.to_string().starts_with("bad.toml:3:9: "), "{e}");
    }

    #[test]
    fn unknown_field_position() {
        let e = err("[devices]\ncount = 2\nmemroy_total_mib = 5\n");
        assert_eq!(e.line, 3, "{e}");
        assert!(e.message.contains("memroy_total_mib"), "{e}");
    }

    #[test]
    fn unknown_metric_and_signal_errors_point_at_the_value() {
        let e = err("[devices.metrics]\ngpu_util_pct = 5\nwatts = 3\n");
        assert_eq!((e.line, e.column), (3, 9), "{e}");
        assert!(e.message.contains("unknown metric `watts`"), "{e}");
        let e = err("[devices.metrics]\n\npower_w = { type = \"sqare\", period_s = 3 }\n");
        assert_eq!((e.line, e.column), (3, 11), "{e}");
        assert!(e.message.contains("unknown signal type `sqare`"), "{e}");
        let e = err("[devices.metrics]\npower_w = { type = \"square\", high = 3 }\n");
        assert!(e.message.contains("needs `period_s`"), "{e}");
        let e = err("[devices.metrics]\npower_w = { type = \"noise\", mean = 3, amplitude = 1, high = 4 }\n");
        assert!(
            e.message
                .contains("`high` does not apply to a `noise` signal"),
            "{e}"
        );
        let e = err("[devices.metrics]\npower_w = { type = \"noise\", mean = 3, amplitude = 1, bogus = 1 }\n");
        assert_eq!(e.line, 2, "{e}");
        assert!(e.message.contains("bogus"), "{e}");
    }

    #[test]
    fn semantic_errors_have_positions() {
        let e =
            err("[devices]\ncount = 2\n\n[[event]]\nat_s = 1\ngpu = 5\nkind = \"xid\"\ncode = 1\n");
        assert_eq!(e.line, 4, "{e}");
        assert!(e.message.contains("gpu 5 is out of range"), "{e}");
        let e = err("[[event]]\nat_s = 1\ngpu = 0\nkind = \"boom\"\n");
        assert!(e.message.contains("unknown event kind `boom`"), "{e}");
        let e = err("[[fault]]\nfunction = \"nvmlDeviceGetName\"\nerror = \"NOPE\"\n");
        assert!(e.message.contains("unknown NVML error name `NOPE`"), "{e}");
        let e = err("[[device]]\nindex = 9\n");
        assert_eq!((e.line, e.column), (2, 9), "{e}");
        assert_eq!(
            parse("time_scale = 0\n", "f.toml", None)
                .unwrap()
                .time_scale,
            0.0
        );
        let e = err("time_scale = -1\n");
        assert_eq!((e.line, e.column), (1, 14), "{e}");
        let e = err("[[process]]\ngpu = 0\npid = \"me\"\n");
        assert!(e.message.contains("pid `me`"), "{e}");
    }

    #[test]
    fn real_driver_keys() {
        let s = parse(
            r#"
hang = { at_s = 60, gpu = 2, function = "nvmlDeviceGet*", for_s = 5 }
[latency]
nvmlDeviceGetPcieThroughput = "20ms"
"nvmlDeviceGet*" = 0.5
"*" = "40us"
[devices]
count = 3
pcie_slot_max_gen = 4
[[device]]
index = 1
hidden = true
recovery_action = "drain_and_reset"
pcie_byte_counters = false
[[device]]
index = 2
pcie_link_width = 8
app_sm_clock_mhz = 1500
locked_sm_clock_mhz = 1400
ecc_pending_enabled = false
[[event]]
at_s = 3
gpu = 2
kind = "recovery_action"
action = "gpu_reset"
[[event]]
at_s = 3
gpu = 0
kind = "kmsg"
text = "NVRM: hello"
"#,
            "rd.toml",
            None,
        )
        .unwrap();
        assert_eq!(s.latency.len(), 3);
        assert!(s
            .latency
            .contains(&("*".to_string(), std::time::Duration::from_micros(40))));
        assert_eq!(
            s.hangs,
            vec![Hang {
                at_s: 60.0,
                gpu: 2,
                function: "nvmlDeviceGet*".into(),
                for_s: 5.0
            }]
        );
        let d = &s.devices;
        assert!(!d[0].hidden && d[1].hidden);
        assert_eq!(
            (d[0].pcie_gen, d[0].pcie_link_gen, d[0].pcie_slot_max_gen),
            (5, 4, 4)
        );
        assert_eq!((d[2].pcie_link_width, d[2].pcie_width), (8, 16));
        assert_eq!(d[2].app_sm_clock_mhz, 1500);
        assert_eq!(d[2].app_mem_clock_mhz, 2619);
        assert_eq!(d[2].locked_sm_clock_mhz, Some(1400));
        assert!(d[2].ecc_enabled && !d[2].ecc_pending);
        assert!(!d[1].pcie_byte_counters && d[0].pcie_byte_counters);
        assert_eq!(d[1].recovery_action, 4);
        // supported: explicit action (1), a recovery_action event (2); not on driver 550 (0)
        assert!(!d[0].recovery_action_supported);
        assert!(d[1].recovery_action_supported);
        assert!(d[2].recovery_action_supported);
        let s = parse(
            "driver_version = \"570.86.10\"\n[[hang]]\ngpu = \"all\"\n[[hang]]\ngpu = 0\nfor_s = \"inf\"\n\
             [[device]]\nindex = 0\nrecovery_action_supported = false\n",
            "h.toml",
            None,
        )
        .unwrap();
        assert_eq!(s.hangs.len(), 9);
        assert!(s
            .hangs
            .iter()
            .all(|h| h.for_s.is_infinite() && h.function == "*"));
        assert!(!s.devices[0].recovery_action_supported);
        assert!(s.devices[1].recovery_action_supported);
    }

    #[test]
    fn real_driver_key_errors() {
        let e = err("[latency]\nnvmlDeviceGetName = \"3 weeks\"\n");
        assert_eq!((e.line, e.column), (2, 21), "{e}");
        assert!(e.message.contains("unknown unit"), "{e}");
        let e = err("[latency]\nGetName = 3\n");
        assert!(e.message.contains("not an NVML symbol"), "{e}");
        let e = err("\nhang = { gpu = 9 }\n");
        assert_eq!(e.line, 2, "{e}");
        assert!(e.message.contains("out of range"), "{e}");
        let e = err("hang = { gpu = 0, for_s = \"soon\" }\n");
        assert!(e.message.contains("for_s"), "{e}");
        let e = err("hang = { gpu = 0, bogus = 1 }\n");
        assert!(e.message.contains("bogus"), "{e}");
        let e = err("[[device]]\nindex = 0\nrecovery_action = \"panic\"\n");
        assert!(e.message.contains("recovery action `panic`"), "{e}");
        let e = err("[[event]]\nat_s = 1\ngpu = 0\nkind = \"xid\"\ncode = 79\nkmsg = \"fancy\"\n");
        assert!(e.message.contains("kmsg style `fancy`"), "{e}");
        let e = err("[[event]]\nat_s = 1\ngpu = 0\nkind = \"kmsg\"\n");
        assert!(e.message.contains("needs `text`"), "{e}");
    }

    #[test]
    fn env_hangs() {
        let h = parse_env_hangs("gpu=2,at_s=60,function=*; gpu=all,for_s=1.5", 4).unwrap();
        assert_eq!(h.len(), 5);
        assert_eq!((h[0].gpu, h[0].at_s, h[0].for_s), (2, 60.0, f64::INFINITY));
        assert_eq!((h[4].gpu, h[4].for_s), (3, 1.5));
        assert!(parse_env_hangs("gpu=9", 4).is_err());
        assert!(parse_env_hangs("at_s=1", 4).is_err());
        assert!(parse_env_hangs("gpu=1,colour=red", 4).is_err());
        assert!(parse_env_hangs("gpu=1,function=GetName", 4).is_err());
    }

    #[test]
    fn bus_ids() {
        assert_eq!(parse_bus_id("00000000:18:00.0"), Some((0, 0x18, 0)));
        assert_eq!(parse_bus_id("0000:DB:00.0"), Some((0, 0xdb, 0)));
        assert_eq!(parse_bus_id("07:00.0"), Some((0, 7, 0)));
        assert_eq!(parse_bus_id("garbage"), None);
    }

    #[test]
    fn trace_signal_relative_to_scenario_dir() {
        let dir = std::env::temp_dir().join(format!("nvml-sim-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("t.csv"), "time,util\n0,10\n5,90\n").unwrap();
        let s = parse(
            "[devices.metrics]\ngpu_util_pct = { type = \"trace\", file = \"t.csv\", column = \"util\", time_column = \"time\" }\n",
            "x.toml",
            Some(&dir),
        )
        .unwrap();
        let sig = s.devices[0].signal(Metric::GpuUtilPct).unwrap();
        assert_eq!(sig.eval(1.0, 0), 10.0);
        assert_eq!(sig.eval(6.0, 0), 90.0);
        let e = parse(
            "[devices.metrics]\ngpu_util_pct = { type = \"trace\", file = \"missing.csv\", column = \"u\" }\n",
            "x.toml",
            Some(&dir),
        )
        .unwrap_err();
        assert!(e.message.contains("cannot read trace"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
