//! CSV logs: gpuwatch's own recording and nvidia-smi `--query-gpu=… --format=csv`.
//!
//! * gpuwatch CSV (COMMON.md, interface 1): header `timestamp,index,uuid,name,pci_bus_id,minor,
//!   state,<METRICS keys…>,xids,processes[,progress]`; one row per GPU per tick, rows of a tick
//!   share the RFC 3339 timestamp; empty cell = absent. Columns are matched by name.
//! * nvidia-smi CSV: header names as nvidia-smi writes them (`utilization.gpu [%]`,
//!   `memory.used [MiB]`), with or without `nounits`, in any order and any subset; a `noheader`
//!   log needs its header given (`--smi-header`). Columns map to metrics through the metric
//!   table's `smi` names and `smi_unit` conversions (MiB → bytes, `P0` → 0, hex bitmask);
//!   `[N/A]`, `[Not Supported]`, `N/A` and empty cells are absent; a `[GPU is lost]` cell marks
//!   the GPU lost. Timestamps in any form [`super::stamp`] reads. A header line met again (a
//!   second writer appending to the file) is taken as the header from there on. Without an
//!   index, UUID or bus-id column, GPUs are numbered by position in each sampling burst.
//!
//! A row with more or fewer cells than the header, a bad timestamp or a bad GPU index is a
//! malformed line (skipped); a metric cell that is not a reading is absent and counted.

use super::{Ctx, Item, Key, LineError, Progress, Reading};
use crate::model::{DeviceState, Metric, ProcSample, SmiUnit, METRICS};
use crate::trace::{quoted, split_csv};

/// Whether `line` is gpuwatch's CSV header.
pub fn is_gpuwatch_header(line: &str) -> bool {
    let l = line.trim_start_matches('\u{feff}').trim();
    l.starts_with("timestamp,index,uuid,") && l.contains("processes")
}

/// Whether `line` is an nvidia-smi CSV header (names a column nvidia-smi writes).
pub fn is_smi_header(line: &str) -> bool {
    let l = line.trim_start_matches('\u{feff}');
    // Cheap refusal first: this runs on every row of a large log, and rows start with a time
    // or an index.
    if l.trim_start().starts_with(|c: char| c.is_ascii_digit()) {
        return false;
    }
    !is_gpuwatch_header(l)
        && split_csv(l)
            .iter()
            .any(|f| matches!(smi_column(&smi_name(f)), Some(SmiColumn::Metric(_))))
        && split_csv(l)
            .first()
            .is_none_or(|f| super::stamp::parse(f).is_none())
}

/// Whether `line` looks like a data row of a header-less nvidia-smi CSV.
pub fn looks_like_headerless_smi(line: &str) -> bool {
    let cells = split_csv(line);
    cells.len() >= 2
        && matches!(
            super::stamp::parse(&cells[0]),
            Some(super::stamp::Stamp::At(_))
        )
}

/// `utilization.gpu [%]` → `utilization.gpu`.
fn smi_name(field: &str) -> String {
    let f = field.trim();
    f.split(" [")
        .next()
        .unwrap_or(f)
        .trim()
        .to_ascii_lowercase()
}

/// What an nvidia-smi column holds.
#[derive(Debug, Clone, Copy, PartialEq)]
enum SmiColumn {
    Timestamp,
    Index,
    Uuid,
    Name,
    PciBusId,
    Metric(Metric),
}

fn smi_column(name: &str) -> Option<SmiColumn> {
    let aliases: &[(&str, &str)] = &[
        ("power.draw.average", "power.draw"),
        ("power.draw.instant", "power.draw"),
        (
            "clocks_throttle_reasons.active",
            "clocks_event_reasons.active",
        ),
        ("clocks.current.sm", "clocks.sm"),
        ("clocks.current.memory", "clocks.mem"),
        ("power.limit", "enforced.power.limit"),
    ];
    let name = aliases
        .iter()
        .find(|(a, _)| *a == name)
        .map_or(name, |(_, b)| *b);
    Some(match name {
        "timestamp" => SmiColumn::Timestamp,
        "index" => SmiColumn::Index,
        "uuid" | "gpu_uuid" => SmiColumn::Uuid,
        "name" | "gpu_name" => SmiColumn::Name,
        "pci.bus_id" | "gpu_bus_id" => SmiColumn::PciBusId,
        other => SmiColumn::Metric(METRICS.iter().find(|d| d.smi == Some(other))?.id),
    })
}

/// Parses an nvidia-smi value in the metric's canonical unit; `None` for N/A and friends.
pub(super) fn smi_value(raw: &str, unit: SmiUnit) -> Result<Option<f64>, String> {
    let v = raw.trim_ascii();
    // Fast path for the common cells of a large log: an unsigned integer, optionally followed
    // by a unit (`54 %`, `72995 MiB`, `55`).
    if matches!(unit, SmiUnit::Same | SmiUnit::MiB) {
        let digits = v.bytes().take_while(u8::is_ascii_digit).count();
        let unit_part = v[digits..].trim_ascii_start();
        if digits > 0
            && digits <= 15
            && unit_part
                .bytes()
                .all(|b| b.is_ascii_alphabetic() || b == b'%')
        {
            let n = v.as_bytes()[..digits]
                .iter()
                .fold(0u64, |n, b| n * 10 + u64::from(b - b'0'));
            #[expect(clippy::cast_precision_loss, reason = "at most 15 digits: exact")]
            let n = n as f64;
            return Ok(Some(if unit == SmiUnit::MiB {
                n * 1_048_576.0
            } else {
                n
            }));
        }
    }
    if v.is_empty()
        || v == "-"
        || v.starts_with('[')
        || v.eq_ignore_ascii_case("n/a")
        || v.eq_ignore_ascii_case("not supported")
    {
        return Ok(None);
    }
    let number = |s: &str| -> Result<f64, String> {
        let s = s
            .trim()
            .trim_end_matches(|c: char| c.is_ascii_alphabetic() || c == '%' || c == ' ')
            .trim();
        s.parse::<f64>()
            .map_err(|_| format!("cannot read {} as a number", quoted(raw)))
    };
    Ok(Some(match unit {
        SmiUnit::Same => number(v)?,
        SmiUnit::MiB => number(v)? * 1_048_576.0,
        SmiUnit::Pstate => {
            let p = v.trim_start_matches(['P', 'p']);
            p.parse::<f64>()
                .map_err(|_| format!("cannot read {} as a pstate", quoted(raw)))?
        }
        SmiUnit::Hex => {
            let h = v.trim_start_matches("0x").trim_start_matches("0X");
            #[expect(clippy::cast_precision_loss, reason = "bitmask below 2^53")]
            let x = u64::from_str_radix(h, 16)
                .map_err(|_| format!("cannot read {} as a hex bitmask", quoted(raw)))?
                as f64;
            x
        }
    }))
}

/// A value as the metric table allows it; an implausible one (negative utilization, NaN,
/// infinite) is a malformed cell.
pub(super) fn checked(
    m: Metric,
    v: Result<Option<f64>, String>,
    raw: &str,
    col: usize,
    ctx: &Ctx,
) -> Option<f64> {
    match v {
        Ok(Some(x)) if !m.desc().plausible(x) => {
            ctx.malformed_cell(col, || {
                format!("{} value {} out of range", m.key(), quoted(raw))
            });
            None
        }
        Ok(x) => x,
        Err(_) => {
            ctx.malformed_cell(col, || {
                format!("{} value {} is not a number", m.key(), quoted(raw))
            });
            None
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Col {
    Time,
    Index,
    Uuid,
    Name,
    Pci,
    Minor,
    State,
    Metric(Metric, SmiUnit),
    Xids,
    Processes,
    Progress,
    Ignore,
}

/// Reads gpuwatch or nvidia-smi CSV rows.
pub struct CsvParser {
    own: bool,
    columns: Option<Vec<Col>>,
    /// The timestamp cell last parsed and its time (rows of a tick repeat it).
    last_time: (String, i64),
}

impl CsvParser {
    /// gpuwatch's own CSV.
    pub fn gpuwatch() -> CsvParser {
        CsvParser {
            own: true,
            columns: None,
            last_time: (String::new(), 0),
        }
    }

    /// nvidia-smi CSV; `header` for a log written without one.
    pub fn smi(header: Option<&str>) -> CsvParser {
        let mut p = CsvParser {
            own: false,
            columns: None,
            last_time: (String::new(), 0),
        };
        if let Some(h) = header {
            p.columns = Some(smi_columns(h));
        }
        p
    }
}

fn smi_columns(header: &str) -> Vec<Col> {
    split_csv(header.trim_start_matches('\u{feff}'))
        .iter()
        .map(|h| match smi_column(&smi_name(h)) {
            Some(SmiColumn::Timestamp) => Col::Time,
            Some(SmiColumn::Index) => Col::Index,
            Some(SmiColumn::Uuid) => Col::Uuid,
            Some(SmiColumn::Name) => Col::Name,
            Some(SmiColumn::PciBusId) => Col::Pci,
            Some(SmiColumn::Metric(m)) => Col::Metric(m, m.desc().smi_unit),
            None => Col::Ignore,
        })
        .collect()
}

fn own_columns(header: &str) -> Vec<Col> {
    split_csv(header.trim_start_matches('\u{feff}'))
        .iter()
        .map(|h| match h.trim() {
            "timestamp" => Col::Time,
            "index" => Col::Index,
            "uuid" => Col::Uuid,
            "name" => Col::Name,
            "pci_bus_id" => Col::Pci,
            "minor" => Col::Minor,
            "state" => Col::State,
            "xids" => Col::Xids,
            "processes" => Col::Processes,
            "progress" => Col::Progress,
            k => Metric::from_key(k).map_or(Col::Ignore, |m| Col::Metric(m, SmiUnit::Same)),
        })
        .collect()
}

/// A header that names one column twice (two `index` columns, or `temperature.gpu` twice) is an
/// error naming both.
fn check_duplicates(header: &str, columns: &[Col]) -> Result<(), LineError> {
    let names = split_csv(header);
    let what = |c: &Col| match c {
        Col::Metric(m, _) => Some(m.key().to_string()),
        Col::Ignore => None,
        other => Some(format!("{other:?}")),
    };
    let mut seen: Vec<(String, String)> = Vec::new();
    for (i, c) in columns.iter().enumerate() {
        let name = names.get(i).map_or("", |n| n.trim());
        let Some(key) = what(c) else { continue };
        if let Some((_, first)) = seen.iter().find(|(k, _)| *k == key) {
            return Err(LineError::Fatal(format!(
                "header column {} repeats column {}: both are {}",
                quoted(name),
                quoted(first),
                key.to_lowercase()
            )));
        }
        seen.push((key, name.to_string()));
    }
    if !columns.contains(&Col::Time) {
        return Err(LineError::Fatal(
            "the header has no `timestamp` column".into(),
        ));
    }
    Ok(())
}

impl super::Parse for CsvParser {
    fn line(&mut self, line: &str, ctx: &Ctx, out: &mut Vec<Item>) -> Result<(), LineError> {
        // A header, first or again.
        if is_gpuwatch_header(line) {
            if !self.own {
                return Err(LineError::Skip(
                    "a gpuwatch CSV header in an nvidia-smi log".into(),
                ));
            }
            let cols = own_columns(line);
            check_duplicates(line, &cols)?;
            self.columns = Some(cols);
            return Ok(());
        }
        if !self.own && is_smi_header(line) {
            let cols = smi_columns(line);
            check_duplicates(line, &cols)?;
            self.columns = Some(cols);
            return Ok(());
        }
        let Some(columns) = &self.columns else {
            return Err(LineError::Skip("a row before the header".into()));
        };
        let quotes = line.contains('"');
        let owned;
        let mut fields: smallvec_like::Fields<'_> = if quotes {
            owned = split_csv(line);
            smallvec_like::Fields::Owned(
                owned
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .into_iter(),
            )
        } else {
            smallvec_like::Fields::Borrowed(line.split(','))
        };
        let mut r = Reading::new(0, Key::Position, 0);
        let mut time = None;
        let mut has_index = false;
        let mut named = None;
        let mut offset = 1;
        for (n, kind) in columns.iter().enumerate() {
            let Some(raw) = fields.next() else {
                return Err(LineError::Skip(format!(
                    "{n} cells where the header has {}",
                    columns.len()
                )));
            };
            let col = offset + (raw.len() - raw.trim_ascii_start().len());
            offset += raw.len() + 1;
            let v = raw.trim_ascii();
            match kind {
                Col::Time => {
                    if self.last_time.0 != v {
                        let t = ctx.time(v)?;
                        self.last_time.0.clear();
                        self.last_time.0.push_str(v);
                        self.last_time.1 = t;
                    }
                    time = Some(self.last_time.1);
                }
                Col::Index => {
                    r.sample.id.index = v
                        .parse()
                        .map_err(|_| format!("bad GPU index {}", quoted(v)))?;
                    has_index = true;
                }
                Col::Uuid => {
                    r.sample.id.uuid = v.to_string();
                    named.get_or_insert_with(|| v.to_string());
                }
                Col::Name => r.sample.id.name = v.to_string(),
                Col::Pci => {
                    r.sample.id.pci_bus_id = v.to_string();
                    if named.is_none() {
                        named = Some(v.to_string());
                    }
                }
                Col::Minor => r.sample.id.minor = v.parse().ok(),
                Col::State => {
                    r.sample.state = DeviceState::from_label(v)
                        .ok_or_else(|| format!("bad state {}", quoted(v)))?;
                }
                Col::Metric(m, unit) => {
                    let value = if self.own {
                        if v.is_empty() {
                            Ok(None)
                        } else {
                            v.parse::<f64>().map(Some).map_err(|_| String::new())
                        }
                    } else {
                        if v.eq_ignore_ascii_case("[GPU is lost]") {
                            r.sample.state = DeviceState::Lost;
                        }
                        smi_value(v, *unit)
                    };
                    r.sample.values.set(*m, checked(*m, value, v, col, ctx));
                }
                Col::Xids => {
                    for x in v.split(';').filter(|x| !x.trim().is_empty()) {
                        r.xids.push(
                            x.trim()
                                .parse()
                                .map_err(|_| format!("bad XID {}", quoted(x)))?,
                        );
                    }
                }
                Col::Processes => {
                    let mut list = Vec::new();
                    for p in v.split(';').filter(|x| !x.trim().is_empty()) {
                        let (pid, used) = p.split_once(':').unwrap_or((p, ""));
                        let pid = pid
                            .trim()
                            .parse()
                            .map_err(|_| format!("bad process {}", quoted(p)))?;
                        list.push(ProcSample::compute(
                            pid,
                            0,
                            String::new(),
                            used.trim().parse().ok(),
                        ));
                    }
                    r.procs = Some(list);
                }
                Col::Progress => {
                    if !v.is_empty() {
                        r.progress = Some(Progress::parse(v));
                    }
                }
                Col::Ignore => {}
            }
        }
        if fields.next().is_some() {
            return Err(LineError::Skip(format!(
                "more cells than the header's {}",
                columns.len()
            )));
        }
        let time = time.ok_or_else(|| LineError::Skip("row without a timestamp".into()))?;
        r.time_ms = time;
        r.sample.time_ms = time;
        r.key = if has_index {
            Key::Index
        } else if let Some(n) = named {
            Key::Named(n)
        } else {
            Key::Position
        };
        if r.sample.state == DeviceState::Lost {
            r.sample.values = crate::model::MetricValues::default();
        }
        out.push(Item::Reading(r));
        Ok(())
    }

    fn has_progress(&self) -> bool {
        self.columns
            .as_ref()
            .is_some_and(|c| c.contains(&Col::Progress))
    }
}

/// The cells of a row: borrowed from the line when it has no quotes.
mod smallvec_like {
    pub enum Fields<'a> {
        Borrowed(std::str::Split<'a, char>),
        Owned(std::vec::IntoIter<&'a str>),
    }

    impl<'a> Iterator for Fields<'a> {
        type Item = &'a str;

        fn next(&mut self) -> Option<&'a str> {
            match self {
                Fields::Borrowed(s) => s.next(),
                Fields::Owned(v) => v.next(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smi_values() {
        assert_eq!(
            smi_value("1024 MiB", SmiUnit::MiB),
            Ok(Some(1_073_741_824.0))
        );
        assert_eq!(smi_value("1024", SmiUnit::MiB), Ok(Some(1_073_741_824.0)));
        assert_eq!(smi_value("250.50 W", SmiUnit::Same), Ok(Some(250.5)));
        assert_eq!(smi_value("87 %", SmiUnit::Same), Ok(Some(87.0)));
        assert_eq!(smi_value("[N/A]", SmiUnit::Same), Ok(None));
        assert_eq!(smi_value("-", SmiUnit::Same), Ok(None));
        assert_eq!(smi_value("[Not Supported]", SmiUnit::Same), Ok(None));
        assert_eq!(smi_value("P2", SmiUnit::Pstate), Ok(Some(2.0)));
        assert_eq!(
            smi_value("0x0000000000000024", SmiUnit::Hex),
            Ok(Some(36.0))
        );
        assert!(smi_value("abc", SmiUnit::Same).is_err());
    }

    #[test]
    fn headers() {
        assert!(is_gpuwatch_header(
            "timestamp,index,uuid,name,pci_bus_id,minor,state,util,xids,processes"
        ));
        assert!(is_smi_header(
            "timestamp, index, utilization.gpu [%], memory.used [MiB]"
        ));
        assert!(is_smi_header("index, timestamp, temperature.gpu"));
        assert!(!is_smi_header("2026/12/02 15:00:00.000, 0, 45 %"));
        assert!(looks_like_headerless_smi("2026/12/02 15:00:00.000, 0, 45"));
    }
}
