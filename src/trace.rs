//! Trace readers for `replay`: gpuwatch's own CSV recordings and nvidia-smi
//! `--query-gpu=… --format=csv` logs, both turned into [`Snapshot`]s in time order.
//!
//! * gpuwatch CSV (COMMON.md, interface 1): header `timestamp,index,uuid,name,pci_bus_id,minor,
//!   state,<METRICS keys…>,xids,processes`; one row per GPU per tick, rows of a tick share the
//!   RFC 3339 timestamp; empty cell = absent. Columns are matched by name.
//! * nvidia-smi CSV: header names as nvidia-smi writes them (`utilization.gpu [%]`,
//!   `memory.used [MiB]`), with or without `nounits`; `noheader` logs need the header given
//!   separately (`replay --smi-header`). Columns map to metrics through the metric table's `smi`
//!   names and `smi_unit` conversions (MiB → bytes, `P0` → 0, hex bitmask); `[N/A]`,
//!   `[Not Supported]`, `N/A` and empty cells are absent; a `[GPU is lost]` cell marks the GPU
//!   lost. nvidia-smi logs carry no XIDs and no process lists. Timestamps are nvidia-smi's local
//!   `2026/12/02 15:00:00.123` form, read as UTC. A tick is the run of rows until a GPU repeats
//!   (nvidia-smi `-l` writes every GPU once per loop, with slightly different timestamps).
//!
//! Format detection ([`detect`]): a first line starting `timestamp,index,uuid,` and containing
//! `processes` is gpuwatch's; anything else with a known nvidia-smi column is nvidia-smi's.

use std::io::{BufRead, Read as _};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};

use crate::model::{
    DeviceId, DeviceState, GpuSample, Metric, MetricValues, ProcSample, SmiUnit, Snapshot,
    XidEvent, METRICS,
};

/// Which kind of log a file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceFormat {
    /// gpuwatch's own recording.
    Gpuwatch,
    /// nvidia-smi `--format=csv`.
    NvidiaSmi,
}

/// Splits one CSV line (RFC 4180 quoting) into fields.
pub fn split_csv(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if quoted {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    cur.push('"');
                    chars.next();
                } else {
                    quoted = false;
                }
            } else {
                cur.push(c);
            }
        } else if c == '"' {
            quoted = true;
        } else if c == ',' {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    out.push(cur);
    out
}

/// Guesses the format from the first line.
pub fn detect(first_line: &str) -> Option<TraceFormat> {
    let l = first_line.trim_start_matches('\u{feff}').trim();
    if l.starts_with("timestamp,index,uuid,") && l.contains("processes") {
        return Some(TraceFormat::Gpuwatch);
    }
    let names: Vec<String> = split_csv(l).iter().map(|f| smi_name(f)).collect();
    if names.iter().any(|n| smi_column(n).is_some()) {
        return Some(TraceFormat::NvidiaSmi);
    }
    None
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

/// Parses a gpuwatch timestamp (RFC 3339) or an nvidia-smi one (`2026/12/02 15:00:00.123`, UTC).
pub fn parse_time_ms(s: &str) -> Option<i64> {
    let s = s.trim();
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Some(t.timestamp_millis());
    }
    for fmt in [
        "%Y/%m/%d %H:%M:%S%.f",
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y/%m/%d %H:%M:%S",
    ] {
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(s, fmt) {
            return Some(t.and_utc().timestamp_millis());
        }
    }
    None
}

/// Formats UTC ms as RFC 3339 with milliseconds (`2026-12-02T15:00:00.123Z`).
pub fn format_time_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(
        || ms.to_string(),
        |t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
    )
}

/// Parses an nvidia-smi value in the metric's canonical unit; `None` for N/A and friends.
fn smi_value(raw: &str, unit: SmiUnit) -> Result<Option<f64>, String> {
    let v = raw.trim();
    if v.is_empty()
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

/// The longest line a log may have: a longer one (a file that is not a CSV log, or one that lost
/// its newlines) is an error rather than a read of the whole file into memory.
pub const MAX_LINE: usize = 1 << 20;

/// At most this many malformed cells are reported one by one; the rest are only counted.
const REPORTED_CELLS: u64 = 5;

/// `v` for an error message: quoted with control characters escaped, at most 80 characters.
pub fn quoted(v: &str) -> String {
    let n = v.chars().count();
    if n <= 80 {
        format!("{v:?}")
    } else {
        format!(
            "{:?} ({n} characters)",
            crate::values::truncate_chars(v, 81)
        )
    }
}

/// A reader of snapshots from a trace file.
pub struct TraceReader {
    input: std::io::BufReader<std::fs::File>,
    /// Cells that could not be a reading (unparsable, NaN, infinite, out of range): read as
    /// absent and counted here.
    malformed: Arc<AtomicU64>,
    path: String,
    line_no: usize,
    format: TraceFormat,
    columns: Vec<Col>,
    pending: Option<Row>,
    done: bool,
    last_time: (String, i64),
}

#[derive(Debug, Clone, Copy)]
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
    Ignore,
}

struct Row {
    time_ms: i64,
    sample: GpuSample,
    xids: Vec<u64>,
    procs: Option<Vec<ProcSample>>,
    key: String,
}

impl TraceReader {
    /// Opens `path`, detecting its format. `smi_header` supplies the header of a `noheader`
    /// nvidia-smi log.
    pub fn open(path: &Path, smi_header: Option<&str>) -> anyhow::Result<TraceReader> {
        let f =
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let mut input = std::io::BufReader::new(f);
        let pathname = path.display().to_string();
        let mut line_no = 0;
        let header = if let Some(h) = smi_header {
            h.to_string()
        } else {
            read_line(&mut input, &pathname, &mut line_no)?
                .ok_or_else(|| anyhow!("{pathname}:1:1: empty file"))?
        };
        let format = if smi_header.is_some() {
            TraceFormat::NvidiaSmi
        } else {
            detect(&header).ok_or_else(|| {
                anyhow!(
                    "{pathname}:1:1: not a gpuwatch CSV recording nor an nvidia-smi CSV log with a \
                     header (for `--format=csv,noheader` logs pass the header with --smi-header)"
                )
            })?
        };
        let header = header.trim_start_matches('\u{feff}');
        let columns = split_csv(header)
            .iter()
            .map(|h| match format {
                TraceFormat::Gpuwatch => match h.trim() {
                    "timestamp" => Col::Time,
                    "index" => Col::Index,
                    "uuid" => Col::Uuid,
                    "name" => Col::Name,
                    "pci_bus_id" => Col::Pci,
                    "minor" => Col::Minor,
                    "state" => Col::State,
                    "xids" => Col::Xids,
                    "processes" => Col::Processes,
                    k => Metric::from_key(k).map_or(Col::Ignore, |m| Col::Metric(m, SmiUnit::Same)),
                },
                TraceFormat::NvidiaSmi => match smi_column(&smi_name(h)) {
                    Some(SmiColumn::Timestamp) => Col::Time,
                    Some(SmiColumn::Index) => Col::Index,
                    Some(SmiColumn::Uuid) => Col::Uuid,
                    Some(SmiColumn::Name) => Col::Name,
                    Some(SmiColumn::PciBusId) => Col::Pci,
                    Some(SmiColumn::Metric(m)) => Col::Metric(m, m.desc().smi_unit),
                    None => Col::Ignore,
                },
            })
            .collect::<Vec<_>>();
        if !columns.iter().any(|c| matches!(c, Col::Time)) {
            bail!("{pathname}:1:1: the header has no `timestamp` column");
        }
        if smi_header.is_none() {
            check_duplicates(header, &columns, &pathname)?;
        }
        Ok(TraceReader {
            input,
            malformed: Arc::new(AtomicU64::new(0)),
            path: pathname,
            line_no,
            format,
            columns,
            pending: None,
            done: false,
            last_time: (String::new(), 0),
        })
    }

    /// The detected format.
    pub fn format(&self) -> TraceFormat {
        self.format
    }

    /// The count of malformed cells read so far (shared: it keeps counting while the reader
    /// runs on another thread, see [`read_ahead`]).
    pub fn malformed_cells(&self) -> Arc<AtomicU64> {
        self.malformed.clone()
    }

    /// Counts a malformed cell (read as absent); the first few are reported with their place.
    fn malformed_cell(&self, col: usize, what: &str) {
        let n = self.malformed.fetch_add(1, Ordering::Relaxed) + 1;
        if n <= REPORTED_CELLS {
            tracing::warn!(
                "{}:{}:{}: {what}: read as absent",
                self.path,
                self.line_no,
                col + 1
            );
        }
        if n == REPORTED_CELLS {
            tracing::warn!("{}: further malformed cells are only counted", self.path);
        }
    }

    fn err(&self, col: usize, msg: impl std::fmt::Display) -> anyhow::Error {
        anyhow!("{}:{}:{}: {msg}", self.path, self.line_no, col + 1)
    }

    fn next_row(&mut self) -> anyhow::Result<Option<Row>> {
        loop {
            let Some(line) = read_line(&mut self.input, &self.path, &mut self.line_no)? else {
                return Ok(None);
            };
            if line.trim().is_empty() {
                continue;
            }
            return self.parse_row(&line).map(Some);
        }
    }

    fn parse_row(&mut self, line: &str) -> anyhow::Result<Row> {
        let fields: Vec<std::borrow::Cow<'_, str>> = if line.contains('"') {
            split_csv(line)
                .into_iter()
                .map(std::borrow::Cow::Owned)
                .collect()
        } else {
            line.split(',').map(std::borrow::Cow::Borrowed).collect()
        };
        let mut time_ms = None;
        let mut id = DeviceId::default();
        let mut has_index = false;
        let mut state = DeviceState::Ok;
        let mut values = MetricValues::default();
        let mut xids = Vec::new();
        let mut procs = None;
        // column offset of each field, for error messages
        let mut offset = 0;
        for (i, raw) in fields.iter().enumerate() {
            let col = offset;
            offset += raw.len() + 1;
            let Some(kind) = self.columns.get(i) else {
                break;
            };
            let v = raw.trim();
            match kind {
                Col::Time => {
                    if self.last_time.0 != v {
                        let t = parse_time_ms(v)
                            .ok_or_else(|| self.err(col, format!("bad timestamp {}", quoted(v))))?;
                        self.last_time = (v.to_string(), t);
                    }
                    time_ms = Some(self.last_time.1);
                }
                Col::Index => {
                    id.index = v
                        .parse()
                        .map_err(|_| self.err(col, format!("bad GPU index {}", quoted(v))))?;
                    has_index = true;
                }
                Col::Uuid => id.uuid = v.to_string(),
                Col::Name => id.name = v.to_string(),
                Col::Pci => id.pci_bus_id = v.to_string(),
                Col::Minor => id.minor = v.parse().ok(),
                Col::State => {
                    state = DeviceState::from_label(v)
                        .ok_or_else(|| self.err(col, format!("bad state {}", quoted(v))))?;
                }
                Col::Metric(m, unit) => {
                    let value = if self.format == TraceFormat::Gpuwatch {
                        if v.is_empty() {
                            Ok(None)
                        } else {
                            v.parse::<f64>().map(Some).map_err(|_| {
                                format!("{} value {} is not a number", m.key(), quoted(v))
                            })
                        }
                    } else {
                        if v.eq_ignore_ascii_case("[GPU is lost]") {
                            state = DeviceState::Lost;
                        }
                        smi_value(v, *unit)
                    };
                    let value = match value {
                        Ok(Some(x)) if !m.desc().plausible(x) => {
                            let what = format!("{} value {} out of range", m.key(), quoted(v));
                            self.malformed_cell(col, &what);
                            None
                        }
                        Ok(x) => x,
                        Err(e) => {
                            self.malformed_cell(col, &e);
                            None
                        }
                    };
                    values.set(*m, value);
                }
                Col::Xids => {
                    for x in v.split(';').filter(|x| !x.trim().is_empty()) {
                        xids.push(
                            x.trim()
                                .parse()
                                .map_err(|_| self.err(col, format!("bad XID {}", quoted(x))))?,
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
                            .map_err(|_| self.err(col, format!("bad process {}", quoted(p))))?;
                        list.push(ProcSample::compute(
                            pid,
                            0,
                            String::new(),
                            used.trim().parse().ok(),
                        ));
                    }
                    procs = Some(list);
                }
                Col::Ignore => {}
            }
        }
        let time_ms = time_ms.ok_or_else(|| self.err(0, "row without a timestamp"))?;
        let key = if has_index {
            id.index.to_string()
        } else if !id.uuid.is_empty() {
            id.uuid.clone()
        } else {
            id.pci_bus_id.clone()
        };
        if let Some(list) = &mut procs {
            for p in list {
                p.gpu_index = id.index;
                p.gpu_uuid.clone_from(&id.uuid);
            }
        }
        if state == DeviceState::Lost {
            values = MetricValues::default();
        }
        Ok(Row {
            time_ms,
            sample: GpuSample {
                time_ms,
                id,
                state,
                values,
            },
            xids,
            procs,
            key,
        })
    }

    fn next_snapshot(&mut self) -> anyhow::Result<Option<Snapshot>> {
        let first = match self.pending.take() {
            Some(r) => r,
            None => match self.next_row()? {
                Some(r) => r,
                None => return Ok(None),
            },
        };
        let tick_time = first.time_ms;
        let mut rows = vec![first];
        let mut keys_seen: Vec<String> = vec![rows[0].key.clone()];
        while let Some(row) = self.next_row()? {
            let same_tick = match self.format {
                TraceFormat::Gpuwatch => row.time_ms == tick_time,
                TraceFormat::NvidiaSmi => {
                    !keys_seen.contains(&row.key) && row.time_ms - tick_time < 60_000
                }
            };
            if same_tick {
                keys_seen.push(row.key.clone());
                rows.push(row);
            } else {
                if row.time_ms < tick_time {
                    return Err(self.err(0, "timestamps go backwards"));
                }
                self.pending = Some(row);
                break;
            }
        }
        // Without index columns, number GPUs in order of appearance.
        let mut snap = Snapshot {
            time_ms: tick_time,
            ..Snapshot::default()
        };
        let mut procs: Option<Vec<ProcSample>> = None;
        for (pos, mut row) in rows.into_iter().enumerate() {
            if !self.columns.iter().any(|c| matches!(c, Col::Index)) {
                row.sample.id.index = u32::try_from(pos).unwrap_or(u32::MAX);
            }
            row.sample.time_ms = tick_time;
            for x in row.xids {
                snap.xids.push(XidEvent::new(
                    tick_time,
                    row.sample.id.index,
                    row.sample.id.uuid.clone(),
                    x,
                ));
            }
            if let Some(list) = row.procs {
                let all = procs.get_or_insert_with(Vec::new);
                all.extend(list.into_iter().map(|mut p| {
                    p.gpu_index = row.sample.id.index;
                    p
                }));
            }
            snap.gpus.push(row.sample);
        }
        snap.processes = procs;
        Ok(Some(snap))
    }
}

/// Reads one line (without its `\n` / `\r\n`), at most [`MAX_LINE`] bytes, as UTF-8; errors name
/// the line (and the column of the first byte that is not UTF-8).
fn read_line(
    input: &mut std::io::BufReader<std::fs::File>,
    path: &str,
    line_no: &mut usize,
) -> anyhow::Result<Option<String>> {
    let mut buf = Vec::new();
    let limit = u64::try_from(MAX_LINE).unwrap_or(u64::MAX) + 1;
    let n = input
        .by_ref()
        .take(limit)
        .read_until(b'\n', &mut buf)
        .with_context(|| format!("cannot read {path}"))?;
    if n == 0 {
        return Ok(None);
    }
    *line_no += 1;
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
    } else if buf.len() > MAX_LINE {
        bail!(
            "{path}:{line_no}:1: line longer than {} MiB: not a CSV log (or one without line breaks)",
            MAX_LINE >> 20
        );
    }
    if *line_no == 1 && (buf.starts_with(&[0xff, 0xfe]) || buf.starts_with(&[0xfe, 0xff])) {
        bail!(
            "{path}:1:1: UTF-16 text (as PowerShell writes it); convert it first: \
             iconv -f UTF-16 -t UTF-8 {path} > log.csv"
        );
    }
    String::from_utf8(buf).map(Some).map_err(|e| {
        let col = e.utf8_error().valid_up_to() + 1;
        let byte = e.as_bytes()[col - 1];
        anyhow!(
            "{path}:{line_no}:{col}: not UTF-8 text (byte 0x{byte:02x}); convert the file to UTF-8"
        )
    })
}

/// A header that names one column twice (two `index` columns, or `temperature.gpu` twice) is an
/// error naming both.
fn check_duplicates(header: &str, columns: &[Col], path: &str) -> anyhow::Result<()> {
    let names = split_csv(header);
    let what = |c: &Col| match c {
        Col::Metric(m, _) => Some(m.key().to_string()),
        Col::Ignore => None,
        other => Some(format!("{other:?}")),
    };
    let mut offset = 0;
    let mut seen: Vec<(String, usize, String)> = Vec::new();
    for (i, c) in columns.iter().enumerate() {
        let name = names.get(i).map_or("", |n| n.trim());
        let col = offset + 1;
        offset += names.get(i).map_or(0, String::len) + 1;
        let Some(key) = what(c) else { continue };
        if let Some((_, first_col, first)) = seen.iter().find(|(k, _, _)| *k == key) {
            bail!(
                "{path}:1:{col}: column {} repeats column {} (1:{first_col}): both are {}",
                quoted(name),
                quoted(first),
                key.to_lowercase()
            );
        }
        seen.push((key, col, name.to_string()));
    }
    Ok(())
}

impl Iterator for TraceReader {
    type Item = anyhow::Result<Snapshot>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.next_snapshot() {
            Ok(Some(s)) => Some(Ok(s)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// Reads `reader` on its own thread and hands snapshots over in batches of 256, so parsing and
/// rule evaluation use two cores during `replay`. The thread ends with the file, at the first
/// error, or when the returned iterator is dropped.
pub fn read_ahead(reader: TraceReader) -> impl Iterator<Item = anyhow::Result<Snapshot>> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<anyhow::Result<Snapshot>>>(8);
    std::thread::spawn(move || {
        let mut batch = Vec::with_capacity(256);
        for item in reader {
            let failed = item.is_err();
            batch.push(item);
            if batch.len() == 256 || failed {
                let sent = tx.send(std::mem::take(&mut batch)).is_ok();
                if !sent || failed {
                    return;
                }
            }
        }
        let _ = tx.send(batch);
    });
    rx.into_iter().flatten()
}

/// Writes snapshots as a gpuwatch CSV recording (used by tests, fixtures and the benchmark; the
/// recorder owns the live writer).
pub fn write_gpuwatch_csv(
    out: &mut impl std::io::Write,
    snaps: &[Snapshot],
) -> std::io::Result<()> {
    write_gpuwatch_header(out)?;
    for s in snaps {
        write_gpuwatch_rows(out, s)?;
    }
    Ok(())
}

/// The gpuwatch CSV header line.
pub fn write_gpuwatch_header(out: &mut impl std::io::Write) -> std::io::Result<()> {
    let mut header = String::from("timestamp,index,uuid,name,pci_bus_id,minor,state");
    for d in METRICS {
        header.push(',');
        header.push_str(d.key);
    }
    header.push_str(",xids,processes");
    writeln!(out, "{header}")
}

/// The rows of one snapshot in gpuwatch CSV.
pub fn write_gpuwatch_rows(out: &mut impl std::io::Write, s: &Snapshot) -> std::io::Result<()> {
    use std::fmt::Write as _;
    let ts = format_time_ms(s.time_ms);
    for g in &s.gpus {
        let mut line = String::with_capacity(256);
        let quote = |f: &str| {
            if f.contains([',', '"']) {
                format!("\"{}\"", f.replace('"', "\"\""))
            } else {
                f.to_string()
            }
        };
        let _ = write!(
            line,
            "{ts},{},{},{},{},{},{}",
            g.id.index,
            quote(&g.id.uuid),
            quote(&g.id.name),
            quote(&g.id.pci_bus_id),
            g.id.minor.map(|m| m.to_string()).unwrap_or_default(),
            g.state.label()
        );
        for v in &g.values.0 {
            line.push(',');
            if let Some(v) = v {
                let _ = write!(line, "{v}");
            }
        }
        line.push(',');
        let xids: Vec<String> = s
            .xids
            .iter()
            .filter(|x| x.gpu_index == g.id.index)
            .map(|x| x.xid.to_string())
            .collect();
        line.push_str(&xids.join(";"));
        line.push(',');
        if let Some(procs) = &s.processes {
            let items: Vec<String> = procs
                .iter()
                .filter(|p| p.gpu_index == g.id.index)
                .map(|p| {
                    format!(
                        "{}:{}",
                        p.pid,
                        p.used_mem_bytes.map(|b| b.to_string()).unwrap_or_default()
                    )
                })
                .collect();
            line.push_str(&items.join(";"));
        }
        writeln!(out, "{line}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes() {
        assert_eq!(
            split_csv(r#"a,"b,c","d""e",,f"#),
            vec!["a", "b,c", "d\"e", "", "f"]
        );
    }

    #[test]
    fn smi_values_and_times() {
        assert_eq!(
            smi_value("1024 MiB", SmiUnit::MiB),
            Ok(Some(1_073_741_824.0))
        );
        assert_eq!(smi_value("1024", SmiUnit::MiB), Ok(Some(1_073_741_824.0)));
        assert_eq!(smi_value("250.50 W", SmiUnit::Same), Ok(Some(250.5)));
        assert_eq!(smi_value("87 %", SmiUnit::Same), Ok(Some(87.0)));
        assert_eq!(smi_value("[N/A]", SmiUnit::Same), Ok(None));
        assert_eq!(smi_value("[Not Supported]", SmiUnit::Same), Ok(None));
        assert_eq!(smi_value("P2", SmiUnit::Pstate), Ok(Some(2.0)));
        assert_eq!(
            smi_value("0x0000000000000024", SmiUnit::Hex),
            Ok(Some(36.0))
        );
        assert!(smi_value("abc", SmiUnit::Same).is_err());
        assert_eq!(
            parse_time_ms("2026/12/02 15:00:00.123"),
            parse_time_ms("2026-12-02T15:00:00.123Z")
        );
        assert_eq!(format_time_ms(0), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn detects_formats() {
        assert_eq!(
            detect("timestamp,index,uuid,name,pci_bus_id,minor,state,util,xids,processes"),
            Some(TraceFormat::Gpuwatch)
        );
        assert_eq!(
            detect("timestamp, index, utilization.gpu [%], memory.used [MiB]"),
            Some(TraceFormat::NvidiaSmi)
        );
        assert_eq!(detect("2026/12/02 15:00:00.000, 0, 45 %"), None);
    }

    #[test]
    fn round_trip_gpuwatch_csv() {
        let dir = tempfile::tempdir().unwrap();
        let mut snaps = Vec::new();
        for t in 0..3 {
            let mut values = MetricValues::default();
            values.set(Metric::Util, Some(50.5));
            values.set(Metric::MemUsed, Some(1e9));
            let gpus = (0..2)
                .map(|i| GpuSample {
                    time_ms: t * 1000,
                    id: DeviceId {
                        index: i,
                        uuid: format!("GPU-{i}"),
                        name: "NVIDIA \"X\", 80GB".into(),
                        ..DeviceId::default()
                    },
                    state: DeviceState::Ok,
                    values: values.clone(),
                })
                .collect();
            snaps.push(Snapshot {
                time_ms: 1_700_000_000_000 + t * 1000,
                gpus,
                processes: Some(vec![]),
                xids: if t == 1 {
                    vec![XidEvent::new(0, 1, "GPU-1", 79)]
                } else {
                    vec![]
                },
                ..Snapshot::default()
            });
        }
        let path = dir.path().join("t.csv");
        let mut f = std::fs::File::create(&path).unwrap();
        write_gpuwatch_csv(&mut f, &snaps).unwrap();
        drop(f);
        let r = TraceReader::open(&path, None).unwrap();
        assert_eq!(r.format(), TraceFormat::Gpuwatch);
        let back: Vec<Snapshot> = r.collect::<anyhow::Result<_>>().unwrap();
        assert_eq!(back.len(), 3);
        assert_eq!(back[1].xids.len(), 1);
        assert_eq!(back[1].xids[0].gpu_index, 1);
        assert_eq!(back[0].gpus[1].id.name, "NVIDIA \"X\", 80GB");
        assert_eq!(back[2].gpus[0].get(Metric::Util), Some(50.5));
        assert_eq!(back[2].gpus[0].get(Metric::Temp), None);
    }

    #[test]
    fn reads_nvidia_smi_logs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("smi.csv");
        std::fs::write(
            &path,
            "timestamp, index, name, utilization.gpu [%], memory.used [MiB], power.draw [W], temperature.gpu\n\
             2026/12/02 15:00:00.101, 0, NVIDIA H100, 87 %, 1024 MiB, 300.50 W, 60\n\
             2026/12/02 15:00:00.105, 1, NVIDIA H100, 0 %, 0 MiB, [N/A], 40\n\
             2026/12/02 15:00:01.101, 0, NVIDIA H100, 90 %, 1024 MiB, 301.00 W, 61\n\
             2026/12/02 15:00:01.104, 1, NVIDIA H100, bogus, 0 MiB, 70 W, 40\n",
        )
        .unwrap();
        let mut r = TraceReader::open(&path, None).unwrap();
        assert_eq!(r.format(), TraceFormat::NvidiaSmi);
        let s = r.next().unwrap().unwrap();
        assert_eq!(s.gpus.len(), 2);
        assert_eq!(s.gpus[0].get(Metric::MemUsed), Some(1_073_741_824.0));
        assert_eq!(s.gpus[1].get(Metric::Power), None);
        // "bogus" is a malformed cell: absent and counted, not the end of the replay.
        let s = r.next().unwrap().unwrap();
        assert_eq!(s.gpus[1].get(Metric::Util), None);
        assert_eq!(s.gpus[1].get(Metric::Power), Some(70.0));
        assert_eq!(r.malformed_cells().load(Ordering::Relaxed), 1);
        // noheader + nounits with the header given
        std::fs::write(&path, "2026/12/02 15:00:00.101, 0, 87, 1024\n").unwrap();
        let mut r = TraceReader::open(
            &path,
            Some("timestamp, index, utilization.gpu [%], memory.used [MiB]"),
        )
        .unwrap();
        let s = r.next().unwrap().unwrap();
        assert_eq!(s.gpus[0].get(Metric::Util), Some(87.0));
    }

    fn hostile(name: &str, bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        (dir, path)
    }

    fn read_all(path: &Path) -> anyhow::Result<Vec<Snapshot>> {
        TraceReader::open(path, None)?.collect()
    }

    const HEADER: &str = "timestamp, index, utilization.gpu [%], temperature.gpu\n";

    #[test]
    fn a_line_without_end_is_refused_without_reading_it_all() {
        let mut bytes = HEADER.as_bytes().to_vec();
        bytes.extend(std::iter::repeat_n(b'7', 3 * MAX_LINE));
        let (_d, path) = hostile("long.csv", &bytes);
        let err = read_all(&path).unwrap_err().to_string();
        assert!(
            err.contains("long.csv:2:1: line longer than 1 MiB"),
            "{err}"
        );
        assert!(err.len() < 300, "{err}");
    }

    #[test]
    fn bad_values_are_quoted_short_and_escaped() {
        let v = format!("\u{1b}[31m{}", "x".repeat(5000));
        let text = format!("{HEADER}2026/12/02 15:00:00.000, {v}, 50, 60\n");
        let (_d, path) = hostile("idx.csv", text.as_bytes());
        let err = read_all(&path).unwrap_err().to_string();
        assert!(err.contains("idx.csv:2:"), "{err}");
        assert!(err.len() < 300 && !err.contains('\u{1b}'), "{err}");
    }

    #[test]
    fn encodings_are_named_with_their_line() {
        let mut bytes = HEADER.as_bytes().to_vec();
        bytes.extend(b"2026/12/02 15:00:00.000, 0, 5\xe9, 60\n");
        let (_d, path) = hostile("latin1.csv", &bytes);
        let err = read_all(&path).unwrap_err().to_string();
        assert!(err.contains("latin1.csv:2:30: not UTF-8"), "{err}");
        let utf16: Vec<u8> = [0xff, 0xfe]
            .into_iter()
            .chain(HEADER.encode_utf16().flat_map(u16::to_le_bytes))
            .collect();
        let (_d, path) = hostile("ps.csv", &utf16);
        let err = read_all(&path).unwrap_err().to_string();
        assert!(err.contains("ps.csv:1:1: UTF-16"), "{err}");
    }

    #[test]
    fn impossible_values_are_malformed_cells() {
        let text = format!(
            "{HEADER}2026/12/02 15:00:00.000, 0, -5, 1e400\n\
             2026/12/02 15:00:00.001, 1, NaN, inf\n\
             2026/12/02 15:00:00.002, 2, 101, 60\n\
             2026/12/02 15:00:00.003, 3, 100, 60\n"
        );
        let (_d, path) = hostile("bad.csv", text.as_bytes());
        let mut r = TraceReader::open(&path, None).unwrap();
        let count = r.malformed_cells();
        let s = r.next().unwrap().unwrap();
        for g in &s.gpus[..3] {
            assert_eq!(g.get(Metric::Util), None, "{g:?}");
        }
        assert_eq!(s.gpus[0].get(Metric::Temp), None);
        assert_eq!(s.gpus[2].get(Metric::Temp), Some(60.0));
        assert_eq!(s.gpus[3].get(Metric::Util), Some(100.0));
        assert_eq!(count.load(Ordering::Relaxed), 5);
        // The same in gpuwatch's own format.
        let mut snap = s.clone();
        snap.gpus.truncate(1);
        let mut out = Vec::new();
        write_gpuwatch_csv(&mut out, &[snap]).unwrap();
        let text = String::from_utf8(out).unwrap().replace(",100,", ",NaN,");
        let (_d, path) = hostile("own.csv", text.as_bytes());
        assert!(read_all(&path).is_ok());
    }

    #[test]
    fn a_repeated_column_names_both() {
        let (_d, path) = hostile(
            "dup.csv",
            b"timestamp, index, temperature.gpu, utilization.gpu [%], temperature.gpu\n",
        );
        let err = read_all(&path).unwrap_err().to_string();
        assert!(
            err.contains("dup.csv:1:") && err.matches("temperature.gpu").count() >= 2,
            "{err}"
        );
    }
}
