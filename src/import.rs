//! Importing GPU logs of every shape users already have: gpuwatch's own CSV, nvidia-smi
//! `--query-gpu` CSVs (with or without header and units, any field order, several timestamp
//! forms), the plain `nvidia-smi` table, `nvidia-smi dmon`, `dcgmi dmon` (DCGM's profiling
//! fields), dcgm-exporter's (or gpuwatch's) `/metrics` scrapes saved as text, and the
//! monitoring-script logs tutorials teach. `replay`, `import` and (later) `report` read through here.
//!
//! Layers, one way: [`input`] (bytes → lines: gzip, UTF-16, CRLF), a format's line parser (one
//! file per format, registered in [`Format`]), [`assemble`] (rows → ticks in time order:
//! bursts, late rows, duplicates, segments). A line that does not parse is skipped and counted
//! ([`ImportStats`]); only an unreadable file, a header whose columns are ambiguous, or a log
//! whose times cannot be known (elapsed seconds without `--t0`), ends an import with an error.
//!
//! One odd line never decides how a file is read: the format is the one most of the first 200
//! non-blank lines are typical of, a parser settles its layout from them ([`Parse::survey`]: the
//! CSV delimiter), and whether a bare small number is the log's kind of time (seconds since the
//! start) or a garbled cell is what most of those lines' times are. CSV column names are one
//! table, [`columns`]; times and zones are [`stamp`]'s.

mod assemble;
pub mod columns;
mod csv;
mod dcgmi;
mod dmon;
pub mod input;
mod scrape;
mod script;
mod smi_table;
pub mod stamp;

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::anyhow;

use crate::model::{GpuSample, ProcSample, Snapshot};

pub use assemble::AssembleStats;

/// The log formats gpuwatch reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// gpuwatch's own CSV recording.
    Gpuwatch,
    /// nvidia-smi `--query-gpu=… --format=csv[,noheader][,nounits]`.
    SmiCsv,
    /// The plain `nvidia-smi` table (`nvidia-smi -l N`, a `date; nvidia-smi` loop, `watch`).
    SmiTable,
    /// `nvidia-smi dmon` (with or without `-o DT`).
    Dmon,
    /// `dcgmi dmon -e FIELD,…` (`#Entity` header, `GPU 0` rows).
    Dcgmi,
    /// dcgm-exporter's `/metrics` (or gpuwatch's) saved scrape after scrape: Prometheus's text
    /// format with `DCGM_FI_*` families.
    DcgmExporter,
    /// `[time] index,name,util,mem,total` with the other GPUs' rows unprefixed below.
    ScriptRows,
    /// `[time] GPU0: util,mem,total | GPU1: … |`.
    ScriptBars,
    /// `[time] Progress:… | GPU:index,util,mem,total,temp,power`.
    ScriptProgress,
}

impl Format {
    /// Every format, in detection order.
    pub const ALL: [Format; 9] = [
        Format::Gpuwatch,
        Format::SmiTable,
        Format::Dmon,
        Format::Dcgmi,
        Format::DcgmExporter,
        Format::ScriptBars,
        Format::ScriptProgress,
        Format::ScriptRows,
        Format::SmiCsv,
    ];

    /// The name `--format` takes.
    pub fn name(self) -> &'static str {
        match self {
            Format::Gpuwatch => "gpuwatch",
            Format::SmiCsv => "smi-csv",
            Format::SmiTable => "smi-table",
            Format::Dmon => "dmon",
            Format::Dcgmi => "dcgmi-dmon",
            Format::DcgmExporter => "dcgm-exporter",
            Format::ScriptRows => "script-rows",
            Format::ScriptBars => "script-bars",
            Format::ScriptProgress => "script-progress",
        }
    }

    /// The format named `s`.
    pub fn from_name(s: &str) -> Option<Format> {
        Format::ALL.into_iter().find(|f| f.name() == s)
    }

    /// Whether `line` (one of the first lines of a file) is typical of this format.
    fn recognises(self, line: &str) -> bool {
        match self {
            Format::Gpuwatch => csv::is_gpuwatch_header(line),
            Format::SmiCsv => csv::is_smi_header(line),
            Format::SmiTable => smi_table::recognises(line),
            Format::Dmon => dmon::recognises(line),
            Format::Dcgmi => dcgmi::recognises(line),
            Format::DcgmExporter => scrape::recognises(line),
            Format::ScriptRows => script::recognises_rows(line),
            Format::ScriptBars => script::recognises_bars(line),
            Format::ScriptProgress => script::recognises_progress(line),
        }
    }

    fn parser(self, opts: &ImportOptions) -> Box<dyn Parse> {
        match self {
            Format::Gpuwatch => Box::new(csv::CsvParser::gpuwatch()),
            Format::SmiCsv => Box::new(csv::CsvParser::smi(
                opts.smi_header.as_deref(),
                opts.columns.as_ref(),
            )),
            Format::SmiTable => Box::new(smi_table::TableParser::default()),
            Format::Dmon => Box::new(dmon::DmonParser::default()),
            Format::Dcgmi => Box::new(dcgmi::DcgmiParser::default()),
            Format::DcgmExporter => Box::new(scrape::ScrapeParser::default()),
            Format::ScriptRows => Box::new(script::RowsParser::default()),
            Format::ScriptBars => Box::new(script::BarsParser),
            Format::ScriptProgress => Box::new(script::ProgressParser),
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How to read a log (the command-line options every importing command shares).
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// Forced format (`--format`); detected when `None`.
    pub format: Option<Format>,
    /// The header of a `noheader` nvidia-smi CSV (`--smi-header`).
    pub smi_header: Option<String>,
    /// Start time for logs whose timestamps are seconds since the start, and for logs without
    /// timestamps (`--t0`), UTC ms.
    pub t0_ms: Option<i64>,
    /// GPUs per sampling burst in a log without a GPU column (`--gpus`).
    pub gpus: Option<u32>,
    /// Time between samples of a log without timestamps (dmon without `-o DT`), ms; 1 s when 0.
    pub every_ms: i64,
    /// What a CSV log's columns hold (`--columns`).
    pub columns: Option<columns::ColumnSpec>,
    /// The zone of times written without one, seconds east of UTC (`--tz`); UTC when `None`,
    /// with one warning.
    pub tz: Option<i32>,
}

/// Training progress a log carried next to the GPU readings.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Progress {
    /// The text as written (`Progress:3 120/500`).
    pub text: String,
    /// The epoch, when the text has a number before a `step/total`.
    pub epoch: Option<u64>,
    /// The step, from `step/total`.
    pub step: Option<u64>,
    /// The total steps, from `step/total`.
    pub total: Option<u64>,
}

impl Progress {
    /// Reads `Progress:3 120/500`, `epoch 3 step 120/500`, `120/500`: the first bare integer
    /// before a `step/total` pair is the epoch.
    pub fn parse(text: &str) -> Progress {
        let text = text.trim();
        let mut epoch = None;
        let mut step = None;
        let mut total = None;
        for word in text.split(|c: char| c.is_whitespace() || c == ':' || c == ',') {
            if let Some((a, b)) = word.split_once('/') {
                if let (Ok(a), Ok(b)) = (a.parse(), b.parse()) {
                    step = Some(a);
                    total = Some(b);
                    break;
                }
            } else if let Ok(n) = word.parse() {
                epoch.get_or_insert(n);
            }
        }
        Progress {
            text: text.to_string(),
            epoch: epoch.filter(|_| step.is_some()),
            step,
            total,
        }
    }
}

/// How a row names its GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Key {
    /// By `sample.id.index`.
    Index,
    /// By UUID or bus id (numbered in order of appearance).
    Named(String),
    /// By its position in the sampling burst.
    Position,
    /// A MIG device's row (gpuwatch CSV): it joins its GPU's row of the same time
    /// (`sample.id.index`), its device in `mig`.
    Mig,
}

/// One GPU's row as a format parser read it.
#[derive(Debug, Clone)]
pub(crate) struct Reading {
    pub time_ms: i64,
    pub key: Key,
    pub sample: GpuSample,
    pub xids: Vec<u64>,
    pub procs: Option<Vec<ProcSample>>,
    /// The GPU's process list is the one its previous row in the file gave (`Key::Index` rows:
    /// a gpuwatch recording repeats each list on every row); `procs` is then `None`.
    pub procs_same: bool,
    /// The GPU's process list as the assembler resolved it (`procs` or, with `procs_same`, the
    /// list before), shared with the rows that repeat it.
    pub procs_shared: Option<std::sync::Arc<Vec<ProcSample>>>,
    pub progress: Option<Progress>,
    /// The GPU's MIG devices (from the MIG rows that follow its row).
    pub mig: Vec<crate::model::MigSample>,
}

impl Reading {
    /// An empty reading of GPU `index` at `time_ms`.
    pub fn new(time_ms: i64, key: Key, index: u32) -> Reading {
        Reading {
            time_ms,
            key,
            sample: GpuSample {
                time_ms,
                id: crate::model::DeviceId {
                    index,
                    ..Default::default()
                },
                state: crate::model::DeviceState::Ok,
                values: crate::model::MetricValues::default(),
            },
            xids: Vec::new(),
            procs: None,
            procs_same: false,
            procs_shared: None,
            progress: None,
            mig: Vec::new(),
        }
    }
}

/// What a parser made of a line.
#[expect(
    clippy::large_enum_variant,
    reason = "readings travel by value in batches: boxing each one costs an allocation and a \
              cross-thread free per row, measured 2x slower in bench/import.sh"
)]
pub(crate) enum Item {
    Reading(Reading),
    /// The tick in progress is complete (a table ended).
    EndTick,
}

/// Why a line was not read.
pub(crate) enum LineError {
    /// The line is malformed: skipped and counted.
    Skip(String),
    /// The line is malformed at this 1-based column: skipped and counted, the first few also
    /// reported as `file:line:column` warnings.
    SkipAt(usize, String),
    /// The log cannot be read on (its times cannot be known): ends the import.
    Fatal(String),
}

impl From<String> for LineError {
    fn from(s: String) -> LineError {
        LineError::Skip(s)
    }
}

/// What a parser needs besides the line.
pub(crate) struct Ctx {
    pub t0_ms: Option<i64>,
    pub every_ms: i64,
    /// `--gpus`.
    pub gpus: Option<u32>,
    /// `--tz`, seconds east of UTC.
    pub tz: Option<i32>,
    /// Whether a bare number below epoch range is the log's kind of time (most of its first
    /// lines' times are): then without `--t0` it ends the import; else the line is malformed.
    pub elapsed_times: bool,
    /// While the first lines are surveyed: times seen as (calendar or epoch, elapsed).
    survey: Option<std::cell::Cell<(u32, u32)>>,
    /// A naive time was read as UTC (no `--tz`): one warning at the end.
    naive: Arc<std::sync::atomic::AtomicBool>,
    /// Warnings a parser gives once (unknown columns), shown with the end-of-import warnings.
    notes: Arc<Mutex<Vec<String>>>,
    /// Malformed cells (read as absent) of accepted lines so far.
    pub malformed_cells: Arc<AtomicU64>,
    /// Malformed cells of the line being read (counted only if the line is kept).
    pub line_cells: std::cell::Cell<u64>,
    /// What was wrong with them and where (1-based column), while few are reported.
    pub cell_notes: std::cell::RefCell<Vec<(usize, String)>>,
}

impl Ctx {
    /// A context for `opts`, counting into `stats`.
    fn new(opts: &ImportOptions, stats: &ImportStats) -> Ctx {
        Ctx {
            t0_ms: opts.t0_ms,
            every_ms: if opts.every_ms > 0 {
                opts.every_ms
            } else {
                1000
            },
            gpus: opts.gpus,
            tz: opts.tz,
            elapsed_times: true,
            survey: None,
            naive: stats.naive.clone(),
            notes: stats.notes.clone(),
            malformed_cells: stats.malformed_cells.clone(),
            line_cells: std::cell::Cell::new(0),
            cell_notes: std::cell::RefCell::new(Vec::new()),
        }
    }

    /// Resolves a timestamp cell.
    pub fn time(&self, cell: &str) -> Result<i64, LineError> {
        let (stamp, zone) = stamp::parse_local(cell).ok_or_else(|| {
            LineError::Skip(format!("bad timestamp {}", crate::trace::quoted(cell)))
        })?;
        self.resolve(stamp, zone, cell)
    }

    /// A parsed timestamp in UTC ms: a naive time in `--tz`; a bare number as epoch time, or
    /// as seconds after `--t0` (without it, the end of the import in a log of elapsed times,
    /// a malformed line in a log of calendar times).
    pub fn resolve(
        &self,
        stamp: stamp::Stamp,
        zone: stamp::Zone,
        cell: &str,
    ) -> Result<i64, LineError> {
        if matches!(stamp, stamp::Stamp::At(_)) && zone == stamp::Zone::Naive && self.tz.is_none() {
            self.naive.store(true, Ordering::Relaxed);
        }
        let stamp = stamp::utc(stamp, zone, self.tz);
        let elapsed = matches!(stamp, stamp::Stamp::Number(n) if n < stamp::EPOCH_SECONDS_FROM);
        if let Some(counts) = &self.survey {
            let (calendar, bare) = counts.get();
            counts.set(if elapsed {
                (calendar, bare + 1)
            } else {
                (calendar + 1, bare)
            });
            if elapsed && self.t0_ms.is_none() {
                return Ok(0);
            }
        }
        stamp.resolve(self.t0_ms).map_err(|e| {
            if e == stamp::TOO_LATE {
                LineError::Skip(format!("{e}: {}", crate::trace::quoted(cell)))
            } else if self.elapsed_times {
                LineError::Fatal(e.to_string())
            } else {
                LineError::Skip(format!(
                    "a count of seconds {} among calendar times (pass --t0 if the log is elapsed seconds)",
                    crate::trace::quoted(cell)
                ))
            }
        })
    }

    /// A warning given once, shown with the end-of-import warnings.
    pub fn note(&self, text: String) {
        if self.survey.is_some() {
            return;
        }
        if let Ok(mut notes) = self.notes.lock() {
            if !notes.contains(&text) {
                notes.push(text);
            }
        }
    }

    /// Counts a cell that could not be read (the row is kept, the value absent).
    pub fn malformed_cell(&self, col: usize, what: impl FnOnce() -> String) {
        self.line_cells.set(self.line_cells.get() + 1);
        if self.malformed_cells.load(Ordering::Relaxed) < REPORTED_CELLS {
            self.cell_notes.borrow_mut().push((col, what()));
        }
    }
}

/// One format's line reader.
pub(crate) trait Parse: Send {
    /// Looks at the first lines (up to 200, not blank) before any is read: a format whose
    /// layout the majority of lines decides (the CSV delimiter) settles it here.
    fn survey(&mut self, _lines: &[&str]) {}
    /// Reads one line (not blank), pushing what it found.
    fn line(&mut self, line: &str, ctx: &Ctx, out: &mut Vec<Item>) -> Result<(), LineError>;
    /// The end of the file: pushes what is still held.
    fn finish(&mut self, _ctx: &Ctx, _out: &mut Vec<Item>) {}
    /// After each line, whether it was read or skipped: pushes items that do not belong to the
    /// line (a tick a format completes when the next one starts), which a skipped line's
    /// items must not take with them.
    fn settled(&mut self, _out: &mut Vec<Item>) {}
    /// Whether snapshots of this format carry training progress.
    fn has_progress(&self) -> bool {
        false
    }
}

/// One tick read from a log.
#[derive(Debug, Clone)]
pub struct Imported {
    /// The GPUs at that instant.
    pub snapshot: Snapshot,
    /// Training progress logged with it.
    pub progress: Option<Progress>,
    /// Time line the tick belongs to: a row older than everything before it starts the next.
    pub segment: u32,
}

/// Lines reported by number when skipped.
const REPORTED_LINES: usize = 10;
/// Malformed cells reported with their place (the rest are counted).
const REPORTED_CELLS: u64 = 5;

/// Counts of what an import skipped, shared with the thread reading the file.
#[derive(Debug, Default)]
pub struct ImportStats {
    /// Lines read.
    pub lines: AtomicU64,
    /// Malformed lines skipped.
    pub skipped: AtomicU64,
    /// Cells that could not be a reading, read as absent.
    pub malformed_cells: Arc<AtomicU64>,
    first_skipped: Mutex<Vec<(usize, String)>>,
    assembled: Mutex<AssembleStats>,
    /// A time without a zone was read as UTC (no `--tz`).
    naive: Arc<std::sync::atomic::AtomicBool>,
    /// Warnings the parser gave once.
    notes: Arc<Mutex<Vec<String>>>,
}

impl ImportStats {
    /// The first skipped lines with the reason (at most 10).
    pub fn first_skipped(&self) -> Vec<(usize, String)> {
        self.first_skipped
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
    }

    /// Duplicates, reordered rows and segments.
    pub fn assembled(&self) -> AssembleStats {
        self.assembled.lock().map(|a| *a).unwrap_or_default()
    }

    /// The end-of-import warnings (empty when nothing was skipped or dropped).
    pub fn warnings(&self, path: &str) -> Vec<String> {
        let mut out: Vec<String> = self
            .notes
            .lock()
            .map(|n| n.iter().map(|w| format!("{path}: {w}")).collect())
            .unwrap_or_default();
        if self.naive.load(Ordering::Relaxed) {
            out.push(format!(
                "{path}: times without a zone read as UTC; pass --tz (e.g. --tz +08:00, --tz EDT) if the log is in local time"
            ));
        }
        let skipped = self.skipped.load(Ordering::Relaxed);
        if skipped > 0 {
            let first = self.first_skipped();
            let lines: Vec<String> = first.iter().map(|(n, _)| n.to_string()).collect();
            let more = if skipped > first.len() as u64 {
                ", …"
            } else {
                ""
            };
            let why = first
                .first()
                .map(|(n, w)| format!("; line {n}: {w}"))
                .unwrap_or_default();
            out.push(format!(
                "{path}: skipped {skipped} malformed line{} (first: {}{more}){why}",
                if skipped == 1 { "" } else { "s" },
                lines.join(", ")
            ));
        }
        let cells = self.malformed_cells.load(Ordering::Relaxed);
        if cells > 0 {
            out.push(format!(
                "{path}: {cells} malformed cell(s) (not a number, NaN, infinite or out of range) read as absent"
            ));
        }
        let a = self.assembled();
        if a.duplicates > 0 {
            out.push(format!(
                "{path}: {} duplicate row(s) (same GPU, same time) dropped",
                a.duplicates
            ));
        }
        if a.orphan_mig > 0 {
            out.push(format!(
                "{path}: {} MIG row(s) without a row of their GPU at the same time dropped",
                a.orphan_mig
            ));
        }
        if a.new_segments > 0 {
            out.push(format!(
                "{path}: time went back {} time(s) beyond the reordering window; each starts a new segment",
                a.new_segments
            ));
        }
        out
    }
}

/// Reads one log as ticks in time order (see the module docs). An iterator of
/// `anyhow::Result<Imported>`: an error ends it.
pub struct Importer {
    lines: input::Lines,
    /// Lines read while detecting the format, not yet parsed: (number, text).
    prefix: VecDeque<(usize, Option<String>)>,
    core: Core,
    asm: assemble::Assembler,
    format: Format,
    done: bool,
}

/// The importer less its input (borrowed apart from it while a line is parsed in place).
struct Core {
    parser: Box<dyn Parse>,
    ctx: Ctx,
    items: Vec<Item>,
    path: String,
    stats: Arc<ImportStats>,
    /// Skipped lines reported with their column so far.
    located: u64,
}

/// Lines looked at to detect the format.
const DETECT_LINES: usize = 200;

impl Importer {
    /// Opens `path` (format detected unless `opts.format` says).
    pub fn open(path: &Path, opts: &ImportOptions) -> anyhow::Result<Importer> {
        let lines = input::Lines::open(path)?;
        Importer::from_lines(lines, &path.display().to_string(), opts)
    }

    /// Reads from already opened lines; `name` names the input in messages.
    pub fn from_lines(
        mut lines: input::Lines,
        name: &str,
        opts: &ImportOptions,
    ) -> anyhow::Result<Importer> {
        let mut prefix = VecDeque::new();
        while prefix.len() < DETECT_LINES {
            let Some((no, line)) = lines
                .next_line()
                .map_err(|e| anyhow!("cannot read {name}: {e}"))?
            else {
                break;
            };
            let text = match line {
                input::Line::Text(t) => Some(t.to_string()),
                input::Line::TooLong => None,
            };
            prefix.push_back((no, text));
        }
        let texts: Vec<(usize, &str)> = prefix
            .iter()
            .filter_map(|(no, t)| t.as_deref().map(|t| (*no, t)))
            .filter(|(_, t)| !t.trim().is_empty())
            .collect();
        let mut format = opts.format;
        if (opts.smi_header.is_some()
            || matches!(opts.columns, Some(columns::ColumnSpec::InOrder(_))))
            && format.is_none()
        {
            format = Some(Format::SmiCsv);
        }
        let format = match format.or_else(|| detect(&texts)) {
            Some(f) => f,
            None => {
                // Lines cut at the length limit are not text the formats can read: say so,
                // rather than call a file of one 500 MB line "empty".
                if let Some((no, _)) = prefix.iter().find(|(_, t)| t.is_none()) {
                    if texts.is_empty() {
                        let one_line = prefix.iter().all(|(n, _)| n == no);
                        let what = if one_line {
                            format!(
                                "no line break in its first {} MiB",
                                prefix.len() * (input::MAX_LINE >> 20)
                            )
                        } else {
                            format!("only lines longer than {} MiB", input::MAX_LINE >> 20)
                        };
                        return Err(anyhow!(
                            "{name}:{no}:1: {what}: not a line-by-line GPU log (a binary file, or data without line breaks)"
                        ));
                    }
                }
                return Err(unknown_format(name, &texts));
            }
        };
        let stats = Arc::new(ImportStats::default());
        let lines_only: Vec<&str> = texts.iter().map(|(_, t)| *t).collect();
        let mut parser = format.parser(opts);
        parser.survey(&lines_only);
        let mut ctx = Ctx::new(opts, &stats);
        ctx.elapsed_times = survey_elapsed(format, opts, &lines_only);
        Ok(Importer {
            lines,
            prefix,
            asm: assemble::Assembler::new(opts.gpus),
            core: Core {
                parser,
                ctx,
                items: Vec::new(),
                path: name.to_string(),
                stats,
                located: 0,
            },
            format,
            done: false,
        })
    }

    /// The format read.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Whether the ticks carry training progress.
    pub fn has_progress(&self) -> bool {
        self.core.parser.has_progress()
    }

    /// Counts of what was skipped (shared: they keep counting while the importer runs on
    /// another thread).
    pub fn stats(&self) -> Arc<ImportStats> {
        self.core.stats.clone()
    }

    /// The input's name as messages give it.
    pub fn path(&self) -> &str {
        &self.core.path
    }

    /// Reads and parses the next line into `core.items`; false at the end of the file (after
    /// the parser's last items).
    fn read_line(&mut self) -> anyhow::Result<bool> {
        if let Some((no, text)) = self.prefix.pop_front() {
            self.core.feed(no, text.as_deref())?;
            return Ok(true);
        }
        let after = self.lines.line_no();
        let line = self
            .lines
            .next_line()
            .map_err(|e| anyhow!("{}: cannot read on after line {after}: {e}", self.core.path))?;
        match line {
            Some((no, input::Line::Text(t))) => self.core.feed(no, Some(t))?,
            Some((no, input::Line::TooLong)) => self.core.feed(no, None)?,
            None => {
                self.core
                    .parser
                    .finish(&self.core.ctx, &mut self.core.items);
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn next_tick(&mut self) -> anyhow::Result<Option<Imported>> {
        loop {
            if let Some(t) = self.asm.pop() {
                return Ok(Some(t));
            }
            if self.done {
                return Ok(None);
            }
            let more = self.read_line()?;
            feed_assembler(&mut self.asm, self.core.items.drain(..));
            if !more {
                finish_assembler(&mut self.asm, &self.core.stats);
                self.done = true;
            }
        }
    }
}

/// The format most of the first lines are typical of (a tie goes to the one seen first): one
/// odd line never decides it.
fn detect(texts: &[(usize, &str)]) -> Option<Format> {
    // (format, lines recognised, first line recognised)
    let mut votes: Vec<(Format, usize, usize)> = Vec::new();
    for (i, (_, t)) in texts.iter().enumerate() {
        if let Some(f) = Format::ALL.into_iter().find(|f| f.recognises(t)) {
            match votes.iter_mut().find(|(g, _, _)| *g == f) {
                Some(v) => v.1 += 1,
                None => votes.push((f, 1, i)),
            }
        }
    }
    votes
        .into_iter()
        .max_by_key(|(_, n, first)| (*n, std::cmp::Reverse(*first)))
        .map(|(f, _, _)| f)
}

/// The error for a log no format recognises: a header-less nvidia-smi CSV (most of the first
/// lines are rows starting with a time) is told to pass its header.
fn unknown_format(name: &str, texts: &[(usize, &str)]) -> anyhow::Error {
    let Some((no, _)) = texts.first() else {
        return anyhow!("{name}:1:1: empty file");
    };
    let rows = texts
        .iter()
        .filter(|(_, t)| csv::looks_like_headerless_smi(t))
        .count();
    if rows * 2 > texts.len() {
        return anyhow!(
            "{name}:{no}:1: a CSV log without a header (nvidia-smi's `--format=csv,noheader`): \
             say what its columns hold with --columns, e.g. --columns timestamp,index,util,mem_used, \
             or pass nvidia-smi's header with --smi-header, e.g. --smi-header \"timestamp, index, utilization.gpu [%], memory.used [MiB]\""
        );
    }
    anyhow!(
        "{name}:{no}:1: not a GPU log gpuwatch knows (gpuwatch CSV, nvidia-smi or home-made CSV with a header, \
         nvidia-smi table or dmon, dcgmi dmon, dcgm-exporter scrapes, or a monitoring-script log); name the format with --format ({})",
        Format::ALL.map(Format::name).join(", ")
    )
}

/// Whether the log's times are counts of seconds since its start: most of the times its first
/// lines hold are (read by a parser of its own over them; with no time read, yes).
fn survey_elapsed(format: Format, opts: &ImportOptions, lines: &[&str]) -> bool {
    let scratch = ImportStats::default();
    let mut ctx = Ctx::new(opts, &scratch);
    ctx.survey = Some(std::cell::Cell::new((0, 0)));
    let mut parser = format.parser(opts);
    parser.survey(lines);
    let mut sink = Vec::new();
    for l in lines {
        // A malformed line counts for nothing; the survey reads on.
        let _ = parser.line(l, &ctx, &mut sink);
        sink.clear();
        ctx.line_cells.set(0);
        ctx.cell_notes.borrow_mut().clear();
    }
    let (calendar, elapsed) = ctx.survey.as_ref().map_or((0, 0), std::cell::Cell::get);
    calendar == 0 || elapsed > calendar
}

/// Hands parsed items to the assembler.
fn feed_assembler(asm: &mut assemble::Assembler, items: impl Iterator<Item = Item>) {
    for item in items {
        match item {
            Item::Reading(r) => asm.push(r),
            Item::EndTick => asm.end_tick(),
        }
    }
}

/// The end of a log: every open tick out, the counts recorded.
fn finish_assembler(asm: &mut assemble::Assembler, stats: &ImportStats) {
    asm.flush(true);
    if let Ok(mut a) = stats.assembled.lock() {
        *a = asm.stats;
    }
}

impl Core {
    fn skip(&self, line_no: usize, why: String) {
        self.stats.skipped.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut v) = self.stats.first_skipped.lock() {
            if v.len() < REPORTED_LINES {
                v.push((line_no, why));
            }
        }
    }

    /// Parses one line (`None`: a piece of an over-long line); `Err` only for a fatal one.
    fn feed(&mut self, line_no: usize, text: Option<&str>) -> anyhow::Result<()> {
        self.stats.lines.fetch_add(1, Ordering::Relaxed);
        let Some(text) = text else {
            self.skip(
                line_no,
                format!("line longer than {} MiB", input::MAX_LINE >> 20),
            );
            return Ok(());
        };
        if text.trim().is_empty() {
            return Ok(());
        }
        let before = self.items.len();
        let read = self.parser.line(text, &self.ctx, &mut self.items);
        let cells = self.ctx.line_cells.replace(0);
        if cells == 0 {
            self.ctx.cell_notes.borrow_mut().clear();
        }
        match read {
            Ok(()) => {
                if cells > 0 {
                    let before = self.ctx.malformed_cells.fetch_add(cells, Ordering::Relaxed);
                    for (i, (col, what)) in self.ctx.cell_notes.borrow_mut().drain(..).enumerate() {
                        let n = before + i as u64 + 1;
                        if n <= REPORTED_CELLS {
                            tracing::warn!("{}:{line_no}:{col}: {what}: read as absent", self.path);
                        }
                        if n == REPORTED_CELLS {
                            tracing::warn!(
                                "{}: further malformed cells are only counted",
                                self.path
                            );
                        }
                    }
                }
            }
            Err(LineError::Skip(why)) => {
                self.items.truncate(before);
                // The skipped line's cell notes go with it (not to the next line's number).
                self.ctx.cell_notes.borrow_mut().clear();
                self.skip(line_no, why);
            }
            Err(LineError::SkipAt(col, why)) => {
                self.items.truncate(before);
                self.ctx.cell_notes.borrow_mut().clear();
                self.located += 1;
                if self.located <= REPORTED_CELLS {
                    tracing::warn!("{}:{line_no}:{col}: {why}: line skipped", self.path);
                }
                self.skip(line_no, format!("column {col}: {why}"));
            }
            Err(LineError::Fatal(why)) => {
                return Err(anyhow!("{}:{line_no}:1: {why}", self.path));
            }
        }
        self.parser.settled(&mut self.items);
        Ok(())
    }
}

impl Iterator for Importer {
    type Item = anyhow::Result<Imported>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.next_tick() {
            Ok(Some(t)) => Some(Ok(t)),
            Ok(None) => None,
            Err(e) => {
                self.done = true;
                self.prefix.clear();
                Some(Err(e))
            }
        }
    }
}

/// Reads, parses and assembles `importer`'s ticks on their own thread, for a consumer that costs
/// more than reading does (the rules engine: `replay`, `test`, `report`), which keeps the
/// caller's core to itself. (With the assembly on the caller's thread the engine waited on it,
/// and on the allocator's lock as it freed what the other thread had allocated.) The thread ends
/// with the file, after the first error, or when the returned iterator is dropped.
pub fn read_ahead_assembled(importer: Importer) -> impl Iterator<Item = anyhow::Result<Imported>> {
    read_ahead_giving_back(importer).0
}

/// [`read_ahead_assembled`], with a way back for the snapshots the caller is done with: the
/// reading thread, which allocated them, frees them. (Freed on the engine's thread, they made
/// it wait on the allocator's lock of the thread still allocating: a tenth of a replay.)
pub fn read_ahead_giving_back(
    importer: Importer,
) -> (impl Iterator<Item = anyhow::Result<Imported>>, GiveBack) {
    const BATCH: usize = HANDED_OVER;
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<anyhow::Result<Imported>>>(4);
    let (back, returned) = GiveBack::channel();
    let spawned = std::thread::Builder::new()
        .name("gpuwatch-import".into())
        .spawn(move || {
            let mut batch = Vec::with_capacity(BATCH);
            for tick in importer {
                batch.push(tick);
                if batch.len() >= BATCH {
                    if tx.send(std::mem::take(&mut batch)).is_err() {
                        return;
                    }
                    free_returned(&returned);
                }
            }
            let _ = tx.send(batch);
        });
    // (a thread that cannot start: the error, then nothing)
    let error = spawned
        .err()
        .map(|e| anyhow!("cannot start the log reader thread: {e}"));
    (
        error.map(Err).into_iter().chain(rx.into_iter().flatten()),
        back,
    )
}

/// Rows (items) handed over at a time by the reading thread of [`read_ahead`]; each batch is
/// made with room for all of them and [`READ_AHEAD_SLACK`] more (a line may add several items),
/// so that its large rows are not copied as a vector grown from empty copies them.
const READ_AHEAD_ITEMS: usize = 4096;
/// Room beyond [`READ_AHEAD_ITEMS`] in a batch.
const READ_AHEAD_SLACK: usize = 64;

/// Ticks handed over between the threads of [`read_ahead_giving_back`] at a time, either way
/// (and handed back by [`read_ahead`]'s caller).
const HANDED_OVER: usize = 64;

/// Hands snapshots back to the reading thread of [`read_ahead_giving_back`] or
/// [`read_ahead`] to be freed there, a batch at a time; once that thread has ended, they
/// are freed here.
#[derive(Debug)]
pub struct GiveBack {
    tx: Option<std::sync::mpsc::Sender<Vec<Snapshot>>>,
    held: Vec<Snapshot>,
}

impl GiveBack {
    /// A way back, and the reading thread's end of it (see [`free_returned`]).
    fn channel() -> (GiveBack, std::sync::mpsc::Receiver<Vec<Snapshot>>) {
        let (tx, rx) = std::sync::mpsc::channel();
        let back = GiveBack {
            tx: Some(tx),
            held: Vec::with_capacity(HANDED_OVER),
        };
        (back, rx)
    }

    /// A snapshot the caller is done with.
    pub fn give(&mut self, snapshot: Snapshot) {
        self.held.push(snapshot);
        if self.held.len() >= HANDED_OVER {
            let batch = std::mem::replace(&mut self.held, Vec::with_capacity(HANDED_OVER));
            if let Some(tx) = &self.tx {
                if tx.send(batch).is_err() {
                    self.tx = None;
                }
            }
        }
    }
}

/// Frees, on the reading thread that allocated them, the snapshots given back so far.
fn free_returned(returned: &std::sync::mpsc::Receiver<Vec<Snapshot>>) {
    while let Ok(done) = returned.try_recv() {
        drop(done);
    }
}

/// Reads and parses `importer`'s lines on their own thread and assembles ticks on the caller's,
/// so reading a log and what consumes its ticks (a writer) share two cores. The thread ends
/// with the file, at the first error, or when the returned iterator is dropped. The snapshots
/// the caller is done with go back through the [`GiveBack`] to the reading thread, which
/// allocated their rows' text (most of what a snapshot holds; the tick's own vectors come from
/// the caller's thread), to be freed there (see [`read_ahead_giving_back`]).
pub fn read_ahead(
    importer: Importer,
) -> (impl Iterator<Item = anyhow::Result<Imported>>, GiveBack) {
    type Batch = anyhow::Result<Vec<Item>>;
    let (tx, rx) = std::sync::mpsc::sync_channel::<Batch>(4);
    let (back, returned) = GiveBack::channel();
    let Importer {
        lines,
        prefix,
        core,
        asm,
        format,
        done: _,
    } = importer;
    let stats = core.stats.clone();
    let mut reader = Importer {
        lines,
        prefix,
        core,
        asm: assemble::Assembler::new(None),
        format,
        done: false,
    };
    let spawned = std::thread::Builder::new()
        .name("gpuwatch-import".into())
        .spawn(move || loop {
            match reader.read_line() {
                Ok(more) => {
                    if reader.core.items.len() >= READ_AHEAD_ITEMS || !more {
                        let room = if more {
                            READ_AHEAD_ITEMS + READ_AHEAD_SLACK
                        } else {
                            0
                        };
                        let batch =
                            std::mem::replace(&mut reader.core.items, Vec::with_capacity(room));
                        if tx.send(Ok(batch)).is_err() {
                            return;
                        }
                    }
                    // What came back is freed as soon as it comes: the next rows' text then
                    // reuses the memory just freed (freed a batch at a time, the import took
                    // 10–20 % longer).
                    free_returned(&returned);
                    if !more {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            }
        });
    let mut failed = spawned
        .err()
        .map(|e| anyhow!("cannot start the log reader thread: {e}"));
    let mut asm = asm;
    let mut done = false;
    let ticks = std::iter::from_fn(move || loop {
        if let Some(e) = failed.take() {
            done = true;
            return Some(Err(e));
        }
        if let Some(t) = asm.pop() {
            return Some(Ok(t));
        }
        if done {
            return None;
        }
        match rx.recv() {
            Ok(Ok(items)) => feed_assembler(&mut asm, items.into_iter()),
            Ok(Err(e)) => {
                done = true;
                return Some(Err(e));
            }
            Err(_) => {
                finish_assembler(&mut asm, &stats);
                done = true;
            }
        }
    });
    (ticks, back)
}
