//! What a CSV log's column holds, from its header name: nvidia-smi's `--query-gpu` names (the
//! metric table's `smi` column, with or without ` [unit]`), gpuwatch's metric keys, and the
//! spellings people use in their own scripts ([`COLUMNS`]: `gpu_index`, `util`, `power_W`,
//! `memory.used (MB)`, …). One table; `docs/metrics.md` shows it.
//!
//! A name is compared normalised: lower case, `.`, ` `, `-` and `/` as `_`. Its unit is taken
//! from a bracket (`[%]`, `(MiB)`) or a suffix (`_W`, `_C`, `_percent`, `_pct`, `_MiB`, `_MB`,
//! `_GB`, …); a unit written in a cell (`81.25 W`, `2 GB`) wins over the header's. Memory
//! without a unit is MiB (nvidia-smi's; its `MB` are MiB too). A few names mean one thing or
//! another by their unit (`gpu [%]` is utilization, `gpu` alone the index; `mem` with a memory
//! unit is memory used, with `%` memory utilization, alone it is ambiguous): an ambiguous column
//! is an error that names it and `--columns`, which settles it ([`ColumnSpec`]).

use crate::model::{Metric, SmiUnit, METRICS};

/// What a column holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The sample's time.
    Time,
    /// The GPU's index.
    Index,
    /// The GPU's UUID.
    Uuid,
    /// The GPU's product name.
    Name,
    /// The GPU's PCI bus id.
    PciBusId,
    /// A metric of the metric table.
    Metric(Metric),
}

impl Target {
    /// The name `--columns` and the documentation give it.
    pub fn name(self) -> &'static str {
        match self {
            Target::Time => "timestamp",
            Target::Index => "index",
            Target::Uuid => "uuid",
            Target::Name => "name",
            Target::PciBusId => "pci_bus_id",
            Target::Metric(m) => m.key(),
        }
    }
}

/// What a name of [`COLUMNS`] reads as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Means {
    /// Always this.
    Is(Target),
    /// By the unit: with `%`, with a memory unit, with none (`None`: ambiguous).
    ByUnit {
        /// With a percent unit.
        percent: Option<Target>,
        /// With a memory unit (MiB, MB, GB, bytes …).
        memory: Option<Target>,
        /// Without a unit.
        bare: Option<Target>,
    },
}

const fn m(metric: Metric) -> Means {
    Means::Is(Target::Metric(metric))
}

/// Column names of home-made logs (normalised) and what they hold, besides nvidia-smi's query
/// names and gpuwatch's metric keys, which are read as the metric table says.
pub const COLUMNS: &[(&[&str], Means)] = &[
    (
        &[
            "timestamp",
            "time",
            "date",
            "datetime",
            "date_time",
            "ts",
            "time_utc",
            "timestamp_utc",
            "utc",
            "epoch",
            "unix_time",
            "unixtime",
            "unix_ts",
            "elapsed",
            "elapsed_s",
            "time_s",
            "seconds",
        ],
        Means::Is(Target::Time),
    ),
    (
        &[
            "index",
            "gpu_index",
            "gpu_id",
            "gpu_idx",
            "gpuid",
            "gpu_num",
            "idx",
            "device",
            "device_id",
            "device_index",
            "cuda_device",
        ],
        Means::Is(Target::Index),
    ),
    (
        &["gpu"],
        Means::ByUnit {
            percent: Some(Target::Metric(Metric::Util)),
            memory: None,
            bare: Some(Target::Index),
        },
    ),
    (&["uuid", "gpu_uuid"], Means::Is(Target::Uuid)),
    (
        &["name", "gpu_name", "model", "gpu_model", "product"],
        Means::Is(Target::Name),
    ),
    (
        &["pci_bus_id", "gpu_bus_id", "bus_id", "pci"],
        Means::Is(Target::PciBusId),
    ),
    (
        &[
            "util",
            "utilization",
            "gpu_util",
            "gpu_utilization",
            "util_gpu",
            "utilization_gpu",
            "gpu_usage",
            "gpu_load",
            "load",
            "sm",
            "sm_util",
        ],
        m(Metric::Util),
    ),
    (
        &[
            "mem_util",
            "memory_util",
            "memory_utilization",
            "util_mem",
            "util_memory",
            "utilization_memory",
            "mem_bw_util",
        ],
        m(Metric::MemUtil),
    ),
    (
        &[
            "mem_used",
            "memory_used",
            "used_memory",
            "used_mem",
            "gpu_mem_used",
            "gpu_memory_used",
            "fb_used",
            "vram_used",
        ],
        m(Metric::MemUsed),
    ),
    (
        &[
            "mem",
            "memory",
            "gpu_mem",
            "gpu_memory",
            "vram",
            "mem_usage",
            "memory_usage",
        ],
        Means::ByUnit {
            percent: Some(Target::Metric(Metric::MemUtil)),
            memory: Some(Target::Metric(Metric::MemUsed)),
            bare: None,
        },
    ),
    (
        &[
            "mem_total",
            "memory_total",
            "total_memory",
            "total_mem",
            "gpu_mem_total",
            "gpu_memory_total",
            "vram_total",
        ],
        m(Metric::MemTotal),
    ),
    (
        &["mem_free", "memory_free", "free_memory", "free_mem"],
        m(Metric::MemFree),
    ),
    (
        &[
            "temp",
            "temperature",
            "gpu_temp",
            "gpu_temperature",
            "temp_gpu",
            "temperature_gpu",
        ],
        m(Metric::Temp),
    ),
    (
        &["mem_temp", "memory_temp", "memory_temperature", "hbm_temp"],
        m(Metric::MemTemp),
    ),
    (
        &[
            "power",
            "power_draw",
            "power_usage",
            "gpu_power",
            "power_draw_average",
            "power_draw_instant",
            "pwr",
        ],
        m(Metric::Power),
    ),
    (
        &["power_limit", "power_cap", "enforced_power_limit"],
        m(Metric::PowerLimit),
    ),
    (
        &[
            "sm_clock",
            "clocks_sm",
            "clock_sm",
            "clocks_current_sm",
            "graphics_clock",
        ],
        m(Metric::SmClock),
    ),
    (
        &[
            "mem_clock",
            "clocks_mem",
            "clock_mem",
            "memory_clock",
            "clocks_current_memory",
        ],
        m(Metric::MemClock),
    ),
    (&["fan", "fan_speed"], m(Metric::Fan)),
    (
        &["pstate", "perf_state", "performance_state"],
        m(Metric::Pstate),
    ),
    (
        &["clocks_throttle_reasons_active", "throttle_reasons"],
        m(Metric::ClockEventReasons),
    ),
];

/// A unit written in a header or a cell.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Unit {
    /// `%`, `percent`, `pct`.
    Percent,
    /// `C`, `degC`, `celsius`.
    Celsius,
    /// `W`, `watts`.
    Watts,
    /// `mW`.
    MilliWatts,
    /// `MHz`.
    MHz,
    /// Memory, this many bytes per unit (`B`, `KiB`/`KB`, `MiB`/`MB`, `GiB`/`GB`).
    Bytes(f64),
}

impl Unit {
    /// The unit a text names (`MiB`, `%`, `W`, `percent`; any case, except `mW` / `MB`).
    pub fn parse(text: &str) -> Option<Unit> {
        const NAMES: &[(&str, Unit)] = &[
            ("%", Unit::Percent),
            ("percent", Unit::Percent),
            ("pct", Unit::Percent),
            ("perc", Unit::Percent),
            ("c", Unit::Celsius),
            ("degc", Unit::Celsius),
            ("°c", Unit::Celsius),
            ("deg_c", Unit::Celsius),
            ("celsius", Unit::Celsius),
            ("w", Unit::Watts),
            ("watt", Unit::Watts),
            ("watts", Unit::Watts),
            ("mhz", Unit::MHz),
            ("b", Unit::Bytes(1.0)),
            ("bytes", Unit::Bytes(1.0)),
            ("kib", Unit::Bytes(1024.0)),
            ("kb", Unit::Bytes(1024.0)),
            ("mib", Unit::Bytes(1_048_576.0)),
            ("mb", Unit::Bytes(1_048_576.0)),
            ("gib", Unit::Bytes(1_073_741_824.0)),
            ("gb", Unit::Bytes(1_073_741_824.0)),
        ];
        let t = text.trim();
        if t == "mW" {
            return Some(Unit::MilliWatts);
        }
        NAMES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(t))
            .map(|(_, u)| *u)
    }
}

/// Bytes in a MiB.
const MIB: f64 = 1_048_576.0;

/// Suffixes that carry a unit (`power_W` → `power`, watts), normalised.
const SUFFIXES: &[&str] = &[
    "_percent", "_pct", "_perc", "_%", "_mib", "_mb", "_gib", "_gb", "_kib", "_kb", "_bytes",
    "_mw", "_w", "_watts", "_c", "_degc", "_celsius", "_mhz",
];

/// A header name split into its normalised base and its unit.
pub fn split_name(field: &str) -> (String, Option<Unit>) {
    let f = field
        .trim()
        .trim_start_matches('\u{feff}')
        .trim_matches('"')
        .trim();
    let mut unit = None;
    let mut base = f;
    for (open, close) in [('[', ']'), ('(', ')')] {
        if let Some(inner) = f
            .strip_suffix(close)
            .and_then(|rest| rest.rsplit_once(open))
        {
            base = inner.0;
            unit = Unit::parse(inner.1);
            break;
        }
    }
    let base = normalise(base);
    if unit.is_none() {
        for s in SUFFIXES {
            if let Some(rest) = base.strip_suffix(s).filter(|r| !r.is_empty()) {
                // `mW` is told from `MW` by its case in the original name.
                let text = &s[1..];
                let u = if *s == "_mw" {
                    (f.ends_with("mW") || f.ends_with("mw")).then_some(Unit::MilliWatts)
                } else {
                    Unit::parse(text)
                };
                if u.is_some() {
                    return (rest.to_string(), u);
                }
            }
        }
    }
    (base, unit)
}

/// Lower case; `.`, ` `, `-`, `/` as one `_`; no `_` at the ends.
fn normalise(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.trim().chars() {
        let c = if matches!(c, '.' | ' ' | '-' | '/' | '\t') {
            '_'
        } else {
            c.to_ascii_lowercase()
        };
        if !(c == '_' && out.ends_with('_')) {
            out.push(c);
        }
    }
    out.trim_matches('_').to_string()
}

/// How a column's cells are read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Conv {
    /// nvidia-smi's form (`P0`, hex bitmask, MiB).
    pub unit: SmiUnit,
    /// Factor to the canonical unit after reading it in `unit`.
    pub scale: f64,
    /// Whether the values are memory (bytes): a memory unit in a cell is honoured.
    pub memory: bool,
}

/// What a header name reads as.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    /// A known column, with how to read its cells.
    Column(Target, Conv),
    /// A name that means several things; the text says which.
    Ambiguous(String),
    /// Not a name gpuwatch knows.
    Unknown,
}

/// What column `field` (a header cell, or a `--columns` name) holds.
pub fn find(field: &str) -> Found {
    // gpuwatch's own key first, whole: `pcie_tx_bytes` is that row, not `pcie_tx` in bytes
    if let Some(m) = Metric::from_key(&normalise(field)) {
        let target = Target::Metric(m);
        return Found::Column(target, conv(target, None));
    }
    let (base, unit) = split_name(field);
    if base.is_empty() || matches!(base.as_str(), "_" | "ignore" | "skip") {
        return Found::Unknown;
    }
    let target = match lookup(&base) {
        Some(Means::Is(t)) => t,
        Some(Means::ByUnit {
            percent,
            memory,
            bare,
        }) => {
            let (got, said) = match unit {
                Some(Unit::Percent) => (percent, "with a % unit"),
                Some(Unit::Bytes(_)) => (memory, "with a memory unit"),
                _ => (bare, "without a unit"),
            };
            match got {
                Some(t) => t,
                None => {
                    let options: Vec<&str> = [percent, memory, bare]
                        .into_iter()
                        .flatten()
                        .map(Target::name)
                        .collect();
                    return Found::Ambiguous(format!(
                        "{said} it could be {}",
                        options.join(" or ")
                    ));
                }
            }
        }
        None => return Found::Unknown,
    };
    Found::Column(target, conv(target, unit))
}

/// The table's reading of a normalised name: nvidia-smi's names and gpuwatch's keys first.
fn lookup(base: &str) -> Option<Means> {
    if let Some(d) = METRICS
        .iter()
        .find(|d| d.key == base || d.smi.is_some_and(|s| normalise(s) == base))
    {
        return Some(m(d.id));
    }
    COLUMNS
        .iter()
        .find(|(names, _)| names.contains(&base))
        .map(|(_, means)| *means)
}

/// How to read a column of `target` whose header says `unit`.
fn conv(target: Target, unit: Option<Unit>) -> Conv {
    let Target::Metric(metric) = target else {
        return Conv {
            unit: SmiUnit::Same,
            scale: 1.0,
            memory: false,
        };
    };
    let smi_unit = metric.desc().smi_unit;
    let memory = metric.desc().unit == "bytes";
    let (unit, scale) = match (smi_unit, unit) {
        // nvidia-smi's own MiB keeps its reader (the fast path of every large log).
        (SmiUnit::MiB, Some(Unit::Bytes(b))) if b == MIB => (SmiUnit::MiB, 1.0),
        (SmiUnit::MiB, Some(Unit::Bytes(b))) => (SmiUnit::Same, b),
        (_, Some(Unit::MilliWatts)) => (SmiUnit::Same, 0.001),
        _ => (smi_unit, 1.0),
    };
    Conv {
        unit,
        scale,
        memory,
    }
}

/// Reads a cell of a column read with `conv`: a unit in the cell (`2 GB`, `75000 mW`) wins over
/// the header's; `None` for `N/A` and friends.
pub(super) fn value(raw: &str, conv: Conv) -> Result<Option<f64>, String> {
    let v = raw.trim_ascii();
    // The cells of nvidia-smi's own logs — a plain number, a percentage, N/A in brackets, or
    // the unit its header names — go straight to its reader: every cell of a large log.
    if conv.scale == 1.0
        && (v
            .as_bytes()
            .last()
            .is_none_or(|c| c.is_ascii_digit() || matches!(c, b'%' | b']'))
            || v.ends_with(" MiB")
            || v.ends_with(" W")
            || v.ends_with(" MHz"))
    {
        return super::csv::smi_value(v, conv.unit);
    }
    let unit_text = v.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &v[unit_text.len()..];
    // nvidia-smi's own cells (`MiB`, `W`, `MHz` as the header says) take the common path.
    let as_smi = conv.scale == 1.0 && matches!(suffix, "MiB" | "W" | "MHz");
    if !suffix.is_empty()
        && !as_smi
        && matches!(conv.unit, SmiUnit::Same | SmiUnit::MiB)
        && unit_text.trim_end().ends_with(|c: char| c.is_ascii_digit())
    {
        let cell_unit = if suffix == "mW" {
            Some(Unit::MilliWatts)
        } else {
            Unit::parse(suffix)
        };
        let n = || number(unit_text, raw).map(Some);
        // nvidia-smi's own `MiB` and `W` cells take the common path below.
        match cell_unit {
            Some(Unit::Bytes(b)) if conv.memory && (conv.unit != SmiUnit::MiB || b != MIB) => {
                return Ok(n()?.map(|x| x * b));
            }
            Some(Unit::MilliWatts) => return Ok(n()?.map(|x| x * 0.001)),
            Some(Unit::Watts) if conv.scale != 1.0 => return n(),
            _ => {}
        }
    }
    Ok(super::csv::smi_value(v, conv.unit)?.map(|x| x * conv.scale))
}

fn number(text: &str, raw: &str) -> Result<f64, String> {
    text.trim()
        .parse::<f64>()
        .map_err(|_| format!("cannot read {} as a number", crate::trace::quoted(raw)))
}

/// `--columns`: what the columns of a CSV log hold, in order (`timestamp,gpu,util,mem_used`),
/// or for some of them by header name (`temp=temp,vram=mem_used`). Each metric name is any name
/// [`find`] knows (so `mem_used_GB` says the unit); `-` or `_` ignores a column.
#[derive(Debug, Clone, PartialEq)]
pub enum ColumnSpec {
    /// One name per column, in order (the file's header, if any, is not read).
    InOrder(Vec<String>),
    /// `NAME=metric` pairs: the header's column `NAME` reads as `metric`.
    Named(Vec<(String, String)>),
}

impl ColumnSpec {
    /// Parses `--columns`; an error names the part it could not read.
    pub fn parse(s: &str) -> Result<ColumnSpec, String> {
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        let named = parts.iter().filter(|p| p.contains('=')).count();
        let check = |name: &str| -> Result<(), String> {
            match find(name) {
                Found::Column(..) => Ok(()),
                _ if matches!(name, "-" | "_" | "ignore" | "skip") => Ok(()),
                Found::Ambiguous(why) => Err(format!(
                    "`{name}` is ambiguous ({why}): use a metric key (util, mem_used, mem_util, …)"
                )),
                Found::Unknown => Err(format!(
                    "`{name}` is no column gpuwatch knows (a metric key such as util, mem_used, power, or timestamp, index, uuid, name, pci_bus_id, or - to ignore)"
                )),
            }
        };
        if named == 0 {
            for p in &parts {
                check(p)?;
            }
            Ok(ColumnSpec::InOrder(
                parts.iter().map(|p| (*p).to_string()).collect(),
            ))
        } else if named == parts.len() {
            let mut pairs = Vec::new();
            for p in &parts {
                let (name, metric) = p.split_once('=').unwrap_or((p, ""));
                check(metric.trim())?;
                pairs.push((name.trim().to_string(), metric.trim().to_string()));
            }
            Ok(ColumnSpec::Named(pairs))
        } else {
            Err("either every part is NAME=metric or none is (names in column order)".into())
        }
    }

    /// The header line standing for an in-order spec.
    pub fn header(&self) -> Option<String> {
        match self {
            ColumnSpec::InOrder(names) => Some(names.join(",")),
            ColumnSpec::Named(_) => None,
        }
    }

    /// What `--columns NAME=metric` says header column `name` holds.
    pub fn rename(&self, name: &str) -> Option<&str> {
        let ColumnSpec::Named(pairs) = self else {
            return None;
        };
        let bare = name.trim().trim_matches('"').trim();
        pairs
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(bare))
            .map(|(_, m)| m.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(name: &str) -> Target {
        match find(name) {
            Found::Column(t, _) => t,
            other => panic!("{name}: {other:?}"),
        }
    }

    #[test]
    fn names_people_use() {
        let util = Target::Metric(Metric::Util);
        let used = Target::Metric(Metric::MemUsed);
        for (name, want) in [
            ("timestamp", Target::Time),
            ("gpu", Target::Index),
            ("GPU", Target::Index),
            ("gpu_id", Target::Index),
            ("gpu_index", Target::Index),
            ("index", Target::Index),
            ("util", util),
            ("gpu_util", util),
            ("utilization_gpu_percent", util),
            ("utilization.gpu [%]", util),
            ("gpu [%]", util),
            ("mem_used_mb", used),
            ("memory_used_MiB", used),
            ("memory.used (MB)", used),
            ("mem (MiB)", used),
            ("memory.free [MiB]", Target::Metric(Metric::MemFree)),
            ("mem [%]", Target::Metric(Metric::MemUtil)),
            ("power_W", Target::Metric(Metric::Power)),
            ("power_draw", Target::Metric(Metric::Power)),
            ("power.draw.average [W]", Target::Metric(Metric::Power)),
            ("temperature_C", Target::Metric(Metric::Temp)),
            ("temp", Target::Metric(Metric::Temp)),
            ("clocks.current.sm [MHz]", Target::Metric(Metric::SmClock)),
            ("pci.bus_id", Target::PciBusId),
            // gpuwatch's keys whole, even where they end like a unit
            ("sm_active", Target::Metric(Metric::SmActive)),
            ("pcie_tx_bytes", Target::Metric(Metric::PcieTxBytes)),
            ("nvlink_rx_bytes", Target::Metric(Metric::NvlinkRxBytes)),
            ("pcie_tx", Target::Metric(Metric::PcieTx)),
        ] {
            assert_eq!(target(name), want, "{name}");
        }
        assert!(matches!(find("mem"), Found::Ambiguous(_)));
        assert!(matches!(find("memory"), Found::Ambiguous(_)));
        assert_eq!(find("loss"), Found::Unknown);
        assert_eq!(find("step"), Found::Unknown);
    }

    #[test]
    fn units_from_headers_and_cells() {
        let conv = |name: &str| match find(name) {
            Found::Column(_, c) => c,
            other => panic!("{name}: {other:?}"),
        };
        let mib = 1_048_576.0;
        assert_eq!(value("1024", conv("mem_used_mb")), Ok(Some(1024.0 * mib)));
        assert_eq!(value("2", conv("mem_used_GB")), Ok(Some(2048.0 * mib)));
        assert_eq!(value("1024", conv("mem_used_bytes")), Ok(Some(1024.0)));
        assert_eq!(value("2 GB", conv("mem_used")), Ok(Some(2048.0 * mib)));
        assert_eq!(value("2 GiB", conv("mem_used_MiB")), Ok(Some(2048.0 * mib)));
        assert_eq!(
            value("1024 MiB", conv("memory.used [MiB]")),
            Ok(Some(1024.0 * mib))
        );
        assert_eq!(value("81.25 W", conv("power")), Ok(Some(81.25)));
        assert_eq!(value("81250", conv("power_mW")), Ok(Some(81.25)));
        assert_eq!(value("81250 mW", conv("power")), Ok(Some(81.25)));
        assert_eq!(value(" 45 %", conv("util")), Ok(Some(45.0)));
        assert_eq!(value("[N/A]", conv("util")), Ok(None));
        assert_eq!(value("P2", conv("pstate")), Ok(Some(2.0)));
    }

    #[test]
    fn column_specs() {
        assert_eq!(
            ColumnSpec::parse("timestamp,gpu,util,mem_used,power").map(|s| s.header()),
            Ok(Some("timestamp,gpu,util,mem_used,power".into()))
        );
        let named = ColumnSpec::parse("mem=mem_used, vram = mem_total").expect("pairs");
        assert_eq!(named.rename(" MEM "), Some("mem_used"));
        assert_eq!(named.rename("vram"), Some("mem_total"));
        assert!(ColumnSpec::parse("timestamp,mem").is_err());
        assert!(ColumnSpec::parse("timestamp,loss").is_err());
        assert!(ColumnSpec::parse("a=util,power").is_err());
        assert!(ColumnSpec::parse("timestamp,-,util").is_ok());
    }
}
