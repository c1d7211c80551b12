//! CSV logs: gpuwatch's own recording, nvidia-smi `--query-gpu=… --format=csv`, and the CSVs
//! people's scripts write.
//!
//! * gpuwatch CSV (COMMON.md, interface 1): header `timestamp,index,uuid,name,pci_bus_id,minor,
//!   state,<METRICS keys…>,xids,processes[,progress]`; one row per GPU per tick, rows of a tick
//!   share the RFC 3339 timestamp; empty cell = absent. Columns are matched by name. A row whose
//!   `index` is `GPU/GI/CI` is a MIG device of the GPU row before it (see `record`): it becomes
//!   one of the snapshot's MIG devices.
//! * nvidia-smi and home-made CSV: any header whose names [`super::columns`] knows
//!   (`utilization.gpu [%]`, `gpu_index`, `power_W`, `memory.used (MB)`, …), with or without
//!   units, in any order and any subset; unknown columns are named in one warning and ignored,
//!   an ambiguous one is an error naming `--columns`. A `noheader` log needs its header given
//!   (`--smi-header`, or `--columns` in column order). Values through the metric table's
//!   `smi_unit` conversions and the header's or cell's unit (MiB → bytes, `P0` → 0, hex
//!   bitmask, `mW`); `[N/A]`, `[Not Supported]`, `N/A` and empty cells are absent; a
//!   `[GPU is lost]` cell marks the GPU lost. Timestamps in any form [`super::stamp`] reads. A
//!   header line met again (a second writer appending to the file) is taken as the header from
//!   there on. Without an index, UUID or bus-id column, GPUs are numbered by position in each
//!   sampling burst. The delimiter (`,`, `;` or tab) is the one most of the first lines agree on.
//! * Without a timestamp column, a row's time is the last time line before it (`==== $(date)
//!   ====`, a bare `date` line: [`super::stamp::separator`]); in a log without those, round *k*
//!   is at `--t0` + *k* × `--every` (a round ends at a repeated header, a repeated GPU index,
//!   or after `--gpus` rows; one row per round without any of them).
//!
//! A row with more or fewer cells than the header, a bad timestamp or a bad GPU index is a
//! malformed line (skipped); a metric cell that is not a reading is absent and counted.

use super::columns::{self, ColumnSpec, Conv, Found, Target};
use super::{Ctx, Item, Key, LineError, Progress, Reading};
use crate::model::{DeviceState, Metric, ProcSample, SmiUnit};
use crate::trace::{quoted, split_csv};

/// Whether `line` is gpuwatch's CSV header.
pub fn is_gpuwatch_header(line: &str) -> bool {
    let l = line.trim_start_matches('\u{feff}').trim();
    l.starts_with("timestamp,index,uuid,") && l.contains("processes")
}

/// Delimiters a CSV log may use.
const DELIMITERS: [char; 3] = [',', ';', '\t'];

/// The delimiter that splits `line` into the most cells.
fn line_delimiter(line: &str) -> char {
    DELIMITERS
        .into_iter()
        .max_by_key(|d| (line.matches(*d).count(), *d == ','))
        .unwrap_or(',')
}

/// The delimiter most of `lines` agree on: for each candidate, the lines that split into the
/// commonest cell count (at least 2); a tie goes to the comma.
pub fn majority_delimiter(lines: &[&str]) -> char {
    let score = |d: char| -> usize {
        let mut counts: Vec<(usize, usize)> = Vec::new();
        for l in lines {
            let n = l.matches(d).count() + 1;
            if n < 2 {
                continue;
            }
            match counts.iter_mut().find(|(c, _)| *c == n) {
                Some(e) => e.1 += 1,
                None => counts.push((n, 1)),
            }
        }
        counts.iter().map(|(_, k)| *k).max().unwrap_or(0)
    };
    DELIMITERS
        .into_iter()
        .max_by_key(|d| (score(*d), *d == ','))
        .unwrap_or(',')
}

/// The cells of `line` split at `delim` (quotes honoured for the comma).
fn split_fields(line: &str, delim: char) -> Vec<String> {
    if delim == ',' {
        split_csv(line)
    } else {
        line.split(delim)
            .map(|f| f.trim().trim_matches('"').to_string())
            .collect()
    }
}

/// Whether `line` is a CSV header gpuwatch can read (nvidia-smi's or a home-made one): no cell
/// is a number, the first is no time, at least one names a metric and at least half are known.
/// A header of one cell must be an nvidia-smi query name (`utilization.gpu [%]`).
pub fn is_smi_header(line: &str) -> bool {
    let l = line.trim_start_matches('\u{feff}');
    // Cheap refusal first: this runs on every row of a large log, and rows start with a time
    // or an index.
    if l.trim_start().starts_with(|c: char| c.is_ascii_digit()) || is_gpuwatch_header(l) {
        return false;
    }
    let fields = split_fields(l, line_delimiter(l));
    if fields.iter().any(|f| f.trim().parse::<f64>().is_ok())
        || fields
            .first()
            .is_some_and(|f| super::stamp::parse(f).is_some())
    {
        return false;
    }
    let found: Vec<Found> = fields.iter().map(|f| columns::find(f)).collect();
    let metric = |f: &Found| matches!(f, Found::Column(Target::Metric(_), _) | Found::Ambiguous(_));
    let known = found.iter().filter(|f| **f != Found::Unknown).count();
    match (fields.first(), found.first()) {
        (Some(only), Some(f)) if fields.len() == 1 => metric(f) && only.contains('.'),
        _ => found.iter().any(metric) && known * 2 >= fields.len(),
    }
}

/// Whether `line` looks like a data row of a header-less nvidia-smi CSV.
pub fn looks_like_headerless_smi(line: &str) -> bool {
    let cells = split_fields(line, line_delimiter(line));
    cells.len() >= 2
        && matches!(
            super::stamp::parse(&cells[0]),
            Some(super::stamp::Stamp::At(_))
        )
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
    Metric(Metric, Conv),
    Xids,
    Processes,
    Progress,
    Ignore,
}

/// Reads gpuwatch or nvidia-smi CSV rows.
pub struct CsvParser {
    own: bool,
    columns: Option<Vec<Col>>,
    /// The layout given on the command line (`--smi-header`, `--columns` in order), read at the
    /// first line; header lines in the file are then recognised but do not replace it.
    given: Option<String>,
    /// `--columns NAME=metric`.
    spec: Option<ColumnSpec>,
    delim: char,
    /// The timestamp cell last parsed and its time (rows of a tick repeat it).
    last_time: (String, i64),
    /// The last time line's time (logs without a timestamp column).
    line_time: Option<i64>,
    /// Whether the first lines hold time lines.
    has_time_lines: bool,
    /// Round of a log without any time (see the module docs) and its rows' GPUs so far.
    round: i64,
    round_rows: Vec<Option<u32>>,
    /// A header came after rows: the next row starts a round.
    header_ends_round: bool,
    /// Headers came again between rows (they, not single rows, delimit rounds).
    repeats: bool,
    /// gpuwatch CSV: per GPU index, its last row's `processes` cell. A recording repeats each
    /// GPU's list on every row; a row whose cell is the same is read as "as before"
    /// ([`Reading::procs_same`]) instead of a new list made for every row.
    procs_cells: Vec<(u32, String)>,
}

/// GPUs whose last `processes` cell a parser remembers.
const PROCS_CELLS: usize = 1024;

impl CsvParser {
    fn new(own: bool) -> CsvParser {
        CsvParser {
            own,
            columns: None,
            given: None,
            spec: None,
            delim: ',',
            last_time: (String::new(), 0),
            line_time: None,
            has_time_lines: false,
            round: 0,
            round_rows: Vec::new(),
            header_ends_round: false,
            repeats: false,
            procs_cells: Vec::new(),
        }
    }

    /// gpuwatch's own CSV.
    pub fn gpuwatch() -> CsvParser {
        CsvParser::new(true)
    }

    /// nvidia-smi or home-made CSV; `header` for a log written without one (`--smi-header`),
    /// `spec` from `--columns`.
    pub fn smi(header: Option<&str>, spec: Option<&ColumnSpec>) -> CsvParser {
        let mut p = CsvParser::new(false);
        p.spec = spec.cloned();
        p.given = spec
            .and_then(ColumnSpec::header)
            .or_else(|| header.map(str::to_string));
        p
    }

    /// Takes `header` as the layout from here on.
    fn take_header(&mut self, header: &str, ctx: &Ctx) -> Result<(), LineError> {
        let cols = self.smi_columns(header, ctx)?;
        check_duplicates(header, self.delim, &cols)?;
        self.columns = Some(cols);
        if !self.round_rows.is_empty() {
            self.header_ends_round = true;
            self.repeats = true;
        }
        Ok(())
    }

    /// The columns of an nvidia-smi or home-made header.
    fn smi_columns(&self, header: &str, ctx: &Ctx) -> Result<Vec<Col>, LineError> {
        let mut unknown = Vec::new();
        let mut cols = Vec::new();
        for field in split_fields(header.trim_start_matches('\u{feff}'), self.delim) {
            let name = self
                .spec
                .as_ref()
                .and_then(|s| s.rename(&field))
                .unwrap_or(&field);
            cols.push(match columns::find(name) {
                Found::Column(t, conv) => match t {
                    Target::Time => Col::Time,
                    Target::Index => Col::Index,
                    Target::Uuid => Col::Uuid,
                    Target::Name => Col::Name,
                    Target::PciBusId => Col::Pci,
                    Target::Metric(m) => Col::Metric(m, conv),
                },
                Found::Ambiguous(why) => {
                    let bare = field.trim();
                    return Err(LineError::Fatal(format!(
                        "header column {} is ambiguous ({why}): say what it holds with --columns, \
                         e.g. --columns '{bare}=mem_used' (or list every column in order: \
                         --columns timestamp,index,util,mem_used)",
                        quoted(bare)
                    )));
                }
                Found::Unknown => {
                    let name = field.trim();
                    if !name.is_empty() && !matches!(name, "-" | "_") {
                        unknown.push(format!("`{name}`"));
                    }
                    Col::Ignore
                }
            });
        }
        if !unknown.is_empty() {
            ctx.note(format!(
                "column{} {} ignored (not a name gpuwatch knows, see docs/metrics.md; read one with --columns NAME=metric)",
                if unknown.len() == 1 { "" } else { "s" },
                unknown.join(", ")
            ));
        }
        Ok(cols)
    }

    /// A row's time in a log without a timestamp column: the last time line, else its round.
    fn row_time(&mut self, index: Option<u32>, ctx: &Ctx) -> Result<i64, LineError> {
        if let Some(t) = self.line_time {
            return Ok(t);
        }
        if self.has_time_lines {
            return Err(LineError::Skip("a row before the first time line".into()));
        }
        let t0 = ctx.t0_ms.ok_or_else(|| {
            LineError::Fatal(
                "the log has no timestamps (no timestamp column, no time lines): pass --t0 TIME \
                 (and --every, the time between samples; 1s by default)"
                    .into(),
            )
        })?;
        let full = ctx
            .gpus
            .is_some_and(|n| self.round_rows.len() >= n as usize);
        let repeated = index.is_some() && self.round_rows.contains(&index);
        let alone =
            index.is_none() && ctx.gpus.is_none() && !self.repeats && !self.round_rows.is_empty();
        if self.header_ends_round || full || repeated || alone {
            self.round += 1;
            self.round_rows.clear();
            self.header_ends_round = false;
        }
        self.round_rows.push(index);
        Ok(t0 + self.round * ctx.every_ms)
    }
}

/// A GPU index as people write it: `0`, `GPU0`, `gpu 1`, `cuda:2`.
fn gpu_index(v: &str) -> Option<u32> {
    v.parse().ok().or_else(|| {
        let digits = v.trim_start_matches(|c: char| !c.is_ascii_digit());
        let prefix = &v[..v.len() - digits.len()];
        (!prefix.is_empty()
            && prefix
                .chars()
                .all(|c| c.is_ascii_alphabetic() || matches!(c, ':' | ' ' | '#' | '_')))
        .then(|| digits.parse().ok())
        .flatten()
    })
}

/// A MIG device's index in a gpuwatch recording: `GPU/GI/CI`.
fn mig_address(v: &str) -> Option<(u32, u32, u32)> {
    let mut parts = v.split('/');
    let (Some(g), Some(gi), Some(ci), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    Some((g.parse().ok()?, gi.parse().ok()?, ci.parse().ok()?))
}

/// The MIG device a MIG row describes (its GPU's index and UUID are set when it joins its GPU's
/// row).
fn mig_row(r: &Reading, gi: u32, ci: u32) -> crate::model::MigSample {
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "bytes read back from a recording"
    )]
    let bytes = |m: Metric| r.sample.get(m).filter(|v| *v >= 0.0).map(|v| v as u64);
    crate::model::MigSample {
        gpu_index: r.sample.id.index,
        gpu_uuid: String::new(),
        index: 0,
        uuid: r.sample.id.uuid.clone(),
        gpu_instance_id: gi,
        compute_instance_id: ci,
        profile: crate::model::mig_profile_of_name(&r.sample.id.name),
        placement: None,
        mem_used_bytes: bytes(Metric::MemUsed),
        mem_total_bytes: bytes(Metric::MemTotal),
        pids: r.procs.iter().flatten().map(|p| p.pid).collect(),
        gpm: crate::model::MigGpm::of(|m| r.sample.get(m)),
    }
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
            k => Metric::from_key(k).map_or(Col::Ignore, |m| {
                Col::Metric(
                    m,
                    Conv {
                        unit: SmiUnit::Same,
                        scale: 1.0,
                        memory: false,
                    },
                )
            }),
        })
        .collect()
}

/// A header that names one column twice (two `index` columns, or `temperature.gpu` and `temp`)
/// is an error naming both and `--columns`.
fn check_duplicates(header: &str, delim: char, columns: &[Col]) -> Result<(), LineError> {
    let names = split_fields(header, delim);
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
                "header column {} repeats column {}: both are {}; say which to read with \
                 --columns, e.g. --columns '{}=-' to ignore the second",
                quoted(name),
                quoted(first),
                key.to_lowercase(),
                name
            )));
        }
        seen.push((key, name.to_string()));
    }
    Ok(())
}

impl super::Parse for CsvParser {
    fn survey(&mut self, lines: &[&str]) {
        if self.own {
            return;
        }
        self.delim = majority_delimiter(lines);
        self.has_time_lines = lines
            .iter()
            .any(|l| !l.contains(self.delim) && super::stamp::separator(l).is_some());
    }

    fn line(&mut self, line: &str, ctx: &Ctx, out: &mut Vec<Item>) -> Result<(), LineError> {
        // A header, first or again.
        if is_gpuwatch_header(line) {
            if !self.own {
                return Err(LineError::Skip(
                    "a gpuwatch CSV header in an nvidia-smi log".into(),
                ));
            }
            let cols = own_columns(line);
            check_duplicates(line, ',', &cols)?;
            self.columns = Some(cols);
            return Ok(());
        }
        if let Some(given) = self.given.take() {
            self.take_header(&given, ctx)?;
        }
        if !self.own && is_smi_header(line) {
            if self.columns.is_none() || self.spec.as_ref().and_then(ColumnSpec::header).is_none() {
                self.take_header(line, ctx)?;
            } else if !self.round_rows.is_empty() {
                self.header_ends_round = true;
                self.repeats = true;
            }
            return Ok(());
        }
        // A time line between samples (`==== $(date) ====`).
        if !self.own
            && (!line.contains(self.delim)
                || !line.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        {
            if let Some((stamp, zone)) = super::stamp::separator(line) {
                self.line_time = Some(ctx.resolve(stamp, zone, line.trim())?);
                return Ok(());
            }
        }
        let Some(columns) = &self.columns else {
            return Err(LineError::Skip("a row before the header".into()));
        };
        // The cells, split once (on the stack for up to 128 cells): their count first — a
        // glued or cut line is malformed whatever its first cell says.
        const MAX_CELLS: usize = 128;
        let owned: Vec<String>;
        let owned_refs: Vec<&str>;
        let mut stack: [&str; MAX_CELLS] = [""; MAX_CELLS];
        let (cells, count): (&[&str], usize) = if line.contains('"') {
            owned = split_fields(line, self.delim);
            owned_refs = owned.iter().map(String::as_str).collect();
            (&owned_refs, owned_refs.len())
        } else {
            let mut n = 0;
            for f in line.split(self.delim) {
                if let Some(slot) = stack.get_mut(n) {
                    *slot = f;
                }
                n += 1;
            }
            if n <= MAX_CELLS {
                (&stack[..n], n)
            } else {
                // more cells than the stack holds: all of them, on the heap
                owned_refs = line.split(self.delim).collect();
                (&owned_refs, n)
            }
        };
        if count != columns.len() {
            return Err(LineError::Skip(format!(
                "{count} cells where the header has {}",
                columns.len()
            )));
        }
        let mut fields = cells.iter().copied();
        let mut r = Reading::new(0, Key::Position, 0);
        let mut time = None;
        let mut has_index = false;
        // a MIG device's row of a gpuwatch recording: (GPU instance, compute instance)
        let mut mig_ids: Option<(u32, u32)> = None;
        let mut named = None;
        // (a new `processes` cell of an indexed GPU row, remembered once the row is read)
        let mut new_procs_cell = None;
        let mut offset = 1;
        for kind in columns {
            let Some(raw) = fields.next() else {
                break;
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
                    match mig_address(v).filter(|_| self.own) {
                        Some((gpu, gi, ci)) => {
                            r.sample.id.index = gpu;
                            mig_ids = Some((gi, ci));
                        }
                        None => {
                            r.sample.id.index = gpu_index(v)
                                .ok_or_else(|| format!("bad GPU index {}", quoted(v)))?;
                        }
                    }
                    has_index = true;
                }
                Col::Uuid => {
                    r.sample.id.uuid = v.to_string();
                    named.get_or_insert(v);
                }
                Col::Name => r.sample.id.name = v.to_string(),
                Col::Pci => {
                    r.sample.id.pci_bus_id = v.to_string();
                    named.get_or_insert(v);
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
                        columns::value(v, *unit)
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
                    if self.own && has_index && mig_ids.is_none() {
                        let index = r.sample.id.index;
                        if self.procs_cells.iter().any(|(i, c)| *i == index && c == v) {
                            r.procs_same = true;
                            continue;
                        }
                        new_procs_cell = Some(v);
                    }
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
        if let Some((gi, ci)) = mig_ids {
            let Some(t) = time else {
                return Err(LineError::Skip(
                    "a MIG device row without a timestamp".into(),
                ));
            };
            r.time_ms = t;
            r.key = Key::Mig;
            r.mig.push(mig_row(&r, gi, ci));
            r.procs = None;
            r.xids.clear();
            out.push(Item::Reading(r));
            return Ok(());
        }
        let time = match time {
            Some(t) => t,
            None => self.row_time(has_index.then_some(r.sample.id.index), ctx)?,
        };
        r.time_ms = time;
        r.sample.time_ms = time;
        r.key = if has_index {
            Key::Index
        } else if let Some(n) = named {
            Key::Named(n.to_string())
        } else {
            Key::Position
        };
        if r.sample.state == DeviceState::Lost {
            r.sample.values = crate::model::MetricValues::default();
        }
        if let Some(cell) = new_procs_cell {
            let index = r.sample.id.index;
            let full = self.procs_cells.len() >= PROCS_CELLS;
            match self.procs_cells.iter_mut().find(|(i, _)| *i == index) {
                Some((_, c)) => {
                    c.clear();
                    c.push_str(cell);
                }
                None if !full => self.procs_cells.push((index, cell.to_string())),
                None => {}
            }
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
