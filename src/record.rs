//! Writer of gpuwatch's CSV recording format (the reader lives in `trace.rs`).
//!
//! Format (fixed in the project brief): a header `timestamp,index,uuid,name,pci_bus_id,minor,
//! state,` + every [`METRICS`] key in table order + `xids,processes`; one row per GPU per tick,
//! all rows of a tick sharing an RFC 3339 UTC timestamp with milliseconds; an empty cell means
//! "absent" (not supported, or the GPU is lost); values in canonical units, integral values
//! without a decimal point and others in shortest round-trip form; `xids` lists the XID codes
//! received since the previous tick (`;`-separated); `processes` the GPU's current process list
//! as `pid:used_bytes` items (`pid:` when the memory is unknown). Fields with `,` or `"` are
//! quoted RFC 4180 style; control characters in a text field are escaped (`\n`, `\u{1b}`), so
//! a row is one line. A missed tick simply has no rows.
//!
//! MIG: a GPU with MIG on is followed, in the same tick, by one row per MIG device: `index`
//! is `GPU/GI/CI` (`0/7/0`: GPU index, GPU instance id, compute instance id), `uuid` its
//! `MIG-…` UUID, `name` NVML's name for it (`NVIDIA A100-SXM4-80GB MIG 1g.10gb`: the profile
//! follows ` MIG `), `pci_bus_id` its GPU's, `minor` empty, `state` its GPU's; of the metrics
//! only `mem_used`, `mem_free` and `mem_total` (the MIG device's) and the GPM metrics of its GPU
//! instance (`sm_active`, …, Hopper and later); `processes` the processes on
//! it. The placement is not recorded. A reader that knows only GPU rows skips these as rows with
//! a bad index; `import` reads them back as the snapshot's MIG devices.
//!
//! [`RotatingFile`] adds what `gpuwatch record --out FILE` needs: a header at the top of every
//! file, a flush per tick, and size-based rotation at tick boundaries (`FILE.1`, `FILE.2`, …).

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use crate::model::{GpuSample, Metric, MigSample, ProcSample, Snapshot, METRICS};

/// Columns before the metric columns.
pub const LEADING_COLUMNS: [&str; 7] = [
    "timestamp",
    "index",
    "uuid",
    "name",
    "pci_bus_id",
    "minor",
    "state",
];
/// Columns after the metric columns.
pub const TRAILING_COLUMNS: [&str; 2] = ["xids", "processes"];

/// Every column name, in order.
pub fn columns() -> impl Iterator<Item = &'static str> {
    LEADING_COLUMNS
        .into_iter()
        .chain(METRICS.iter().map(|d| d.key))
        .chain(TRAILING_COLUMNS)
}

/// The header line, without the line end.
pub fn header_line() -> String {
    columns().collect::<Vec<_>>().join(",")
}

/// `2026-12-02T15:00:00.123Z` for a UTC millisecond timestamp.
pub fn format_timestamp(time_ms: i64) -> String {
    let mut s = String::with_capacity(24);
    push_timestamp(&mut s, time_ms);
    s
}

/// Appends `time_ms` as RFC 3339 UTC with milliseconds (proleptic Gregorian calendar; computed
/// directly because this runs for every tick of a recording).
pub fn push_timestamp(out: &mut String, time_ms: i64) {
    let ms = time_ms.rem_euclid(1000);
    let secs = time_ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (era-based algorithm, valid for any i64 input here).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    if !(0..=9999).contains(&year) {
        let _ = write!(
            out,
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{ms:03}Z",
            sod / 3600,
            sod % 3600 / 60,
            sod % 60
        );
        return;
    }
    // The digits put in place: `core::fmt` with widths costs more than the rest of a row's
    // timestamp, once a tick.
    let mut text = *b"0000-00-00T00:00:00.000Z";
    for (at, width, n) in [
        (0, 4, year),
        (5, 2, month),
        (8, 2, day),
        (11, 2, sod / 3600),
        (14, 2, sod % 3600 / 60),
        (17, 2, sod % 60),
        (20, 3, ms),
    ] {
        let mut n = n.unsigned_abs();
        for b in text[at..at + width].iter_mut().rev() {
            *b = b'0' + u8::try_from(n % 10).unwrap_or(0);
            n /= 10;
        }
    }
    // ASCII throughout
    out.push_str(std::str::from_utf8(&text).unwrap_or_default());
}

/// Appends a value: integral values without a decimal point, others in shortest round-trip
/// form; nothing for NaN or infinities.
pub fn push_value(out: &mut String, v: f64) {
    if !v.is_finite() {
        return;
    }
    if v.fract() == 0.0 && v.abs() < 9.007_199_254_740_992e15 {
        // Exact: the value is an integer below 2^53.
        if v < 0.0 {
            out.push('-');
        }
        crate::values::push_u64(out, v.abs() as u64);
    } else {
        // The shortest digits that read back as the same value (as `Display` writes, but for
        // the last digit where two are as short and as near), without `core::fmt`'s machinery:
        // ryu is several times faster, and this runs for most cells of every row. ryu switches
        // to an exponent outside 1e-5..1e16 and writes integers above 2^53 with `.0`; `Display`
        // does neither, and the recording keeps `Display`'s form there.
        let mut buf = ryu::Buffer::new();
        let text = buf.format_finite(v);
        if text.contains('e') || text.ends_with(".0") {
            let _ = write!(out, "{v}");
        } else {
            out.push_str(text);
        }
    }
}

/// Appends a text field, quoted RFC 4180 style when it contains `,` or `"`. Control characters
/// (a driver's GPU name or MIG UUID with a line break or an escape sequence) are written as
/// `\u{..}`-style escapes ([`crate::values::escape_control`]): a row is always one line, which
/// `import` and every line-based reader need, and no cell drives a terminal.
pub fn push_field(out: &mut String, s: &str) {
    let escaped;
    let s = if s.chars().any(char::is_control) {
        escaped = crate::values::escape_control(s);
        escaped.as_str()
    } else {
        s
    };
    if s.contains([',', '"']) {
        out.push('"');
        for c in s.chars() {
            if c == '"' {
                out.push('"');
            }
            out.push(c);
        }
        out.push('"');
    } else {
        out.push_str(s);
    }
}

/// Turns snapshots into CSV rows, remembering the last process list (snapshots carry one only
/// when it was refreshed).
#[derive(Debug, Default)]
pub struct CsvRows {
    processes: Vec<ProcSample>,
    /// Each GPU's identity cells as last written (`index,uuid,name,pci_bus_id,minor,`), kept
    /// while its identity is the same: the escaping and quoting is done once, not every tick.
    ids: Vec<(crate::model::DeviceId, String)>,
}

impl CsvRows {
    /// A renderer with no known processes.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends one row per GPU of `snap` (each ending in `\n`) to `out`.
    pub fn render(&mut self, snap: &Snapshot, out: &mut String) {
        if let Some(p) = &snap.processes {
            self.processes.clone_from(p);
        }
        let mut ts = String::with_capacity(24);
        push_timestamp(&mut ts, snap.time_ms);
        // identities kept: every GPU of a snapshot, and as many again that changed
        let keep = (2 * snap.gpus.len()).max(16);
        for gpu in &snap.gpus {
            out.push_str(&ts);
            out.push(',');
            out.push_str(self.id_cells(&gpu.id, keep));
            out.push_str(&gpu.state.label());
            for d in METRICS {
                out.push(',');
                if let Some(v) = gpu.values.get(d.id) {
                    push_value(out, v);
                }
            }
            out.push(',');
            let mut first = true;
            for x in snap.xids.iter().filter(|x| x.gpu_index == gpu.id.index) {
                if !first {
                    out.push(';');
                }
                first = false;
                let _ = write!(out, "{}", x.xid);
            }
            out.push(',');
            self.push_processes(out, gpu.id.index, |_| true);
            out.push('\n');
            if gpu.state == crate::model::DeviceState::Ok {
                for m in snap.mig_of(gpu.id.index) {
                    self.render_mig(&ts, gpu, m, out);
                }
            }
        }
    }

    /// GPU `id`'s identity cells, each followed by a comma (see [`CsvRows::ids`]); at most
    /// `keep` identities are kept, the oldest given up first.
    fn id_cells(&mut self, id: &crate::model::DeviceId, keep: usize) -> &str {
        let pos = match self.ids.iter().position(|(known, _)| known == id) {
            Some(p) => p,
            None => {
                let mut cells = String::with_capacity(96);
                crate::values::push_u64(&mut cells, u64::from(id.index));
                cells.push(',');
                push_field(&mut cells, &id.uuid);
                cells.push(',');
                push_field(&mut cells, &id.name);
                cells.push(',');
                push_field(&mut cells, &id.pci_bus_id);
                cells.push(',');
                if let Some(m) = id.minor {
                    crate::values::push_u64(&mut cells, u64::from(m));
                }
                cells.push(',');
                if self.ids.len() >= keep {
                    let extra = self.ids.len() + 1 - keep;
                    self.ids.drain(..extra);
                }
                self.ids.push((id.clone(), cells));
                self.ids.len() - 1
            }
        };
        &self.ids[pos].1
    }

    /// The `processes` cell: GPU `gpu`'s processes that `keep` accepts, as `pid:used_bytes`.
    fn push_processes(&self, out: &mut String, gpu: u32, keep: impl Fn(&ProcSample) -> bool) {
        let mut first = true;
        for p in self
            .processes
            .iter()
            .filter(|p| p.gpu_index == gpu && keep(p))
        {
            if !first {
                out.push(';');
            }
            first = false;
            crate::values::push_u64(out, u64::from(p.pid));
            out.push(':');
            if let Some(b) = p.used_mem_bytes {
                crate::values::push_u64(out, b);
            }
        }
    }

    /// The row of MIG device `m` of `gpu` (see the module docs).
    fn render_mig(&self, ts: &str, gpu: &GpuSample, m: &MigSample, out: &mut String) {
        out.push_str(ts);
        out.push(',');
        out.push_str(&m.address());
        out.push(',');
        push_field(out, &m.uuid);
        out.push(',');
        push_field(
            out,
            &format!("{} MIG {}", gpu.id.name, m.profile.as_deref().unwrap_or("")),
        );
        out.push(',');
        push_field(out, &gpu.id.pci_bus_id);
        out.push(',');
        out.push(',');
        out.push_str(&gpu.state.label());
        for d in METRICS {
            out.push(',');
            let v = match d.id {
                Metric::MemUsed => m.mem_used_bytes,
                Metric::MemTotal => m.mem_total_bytes,
                Metric::MemFree => m
                    .mem_total_bytes
                    .zip(m.mem_used_bytes)
                    .map(|(t, u)| t.saturating_sub(u)),
                _ => {
                    // its GPU instance's GPM metrics
                    if let Some(v) = m.gpm.get(d.id) {
                        push_value(out, v);
                    }
                    None
                }
            };
            if let Some(b) = v {
                crate::values::push_u64(out, b);
            }
        }
        out.push(',');
        out.push(',');
        self.push_processes(out, gpu.id.index, |p| m.pids.contains(&p.pid));
        out.push('\n');
    }
}

/// Where rows go: a file with size-based rotation, or any writer (stdout).
pub enum Sink {
    /// A rotating file.
    File(RotatingFile),
    /// A plain stream: header once, then rows, flushed each tick.
    Stream(Box<dyn Write + Send>),
}

impl Sink {
    /// Writes the header to a stream sink (files write their own).
    pub fn start(&mut self) -> io::Result<()> {
        match self {
            Sink::File(_) => Ok(()),
            Sink::Stream(w) => {
                writeln!(w, "{}", header_line())?;
                w.flush()
            }
        }
    }

    /// Writes the rows of one tick and flushes them.
    pub fn write_tick(&mut self, rows: &str) -> io::Result<()> {
        self.write_ticks(rows, &[rows.len()])
    }

    /// Writes the rows of several ticks (`ends`: where each tick's rows end in `rows`) and
    /// flushes them.
    pub fn write_ticks(&mut self, rows: &str, ends: &[usize]) -> io::Result<()> {
        match self {
            Sink::File(f) => f.write_ticks(rows, ends),
            Sink::Stream(w) => {
                w.write_all(rows.as_bytes())?;
                w.flush()
            }
        }
    }
}

/// Rows held in memory between writes: at short intervals a `write` per tick cost more CPU than
/// the tick's NVML calls (on ext4 about 40 µs each: `record` at 100 ms spent an eighth of its
/// time there), so ticks are written together, none held longer than [`Batched::HOLD_AT_MOST`]
/// (at intervals of a second or more each tick is written at once). A crash loses at most the
/// ticks held; a stop writes them ([`Batched::flush`]).
pub struct Batched {
    sink: Sink,
    pending: String,
    /// Where each held tick's rows end in `pending`.
    ends: Vec<usize>,
    /// How long the oldest held tick may wait: [`Batched::HOLD_AT_MOST`] less one interval.
    hold: std::time::Duration,
    /// When the oldest held tick came.
    since: Option<std::time::Instant>,
    /// Whether a tick was written yet (the first is written at once: output starts when the
    /// recording does).
    started: bool,
}

impl Batched {
    /// The longest a tick's rows wait in memory.
    pub const HOLD_AT_MOST: std::time::Duration = std::time::Duration::from_secs(1);
    /// Held rows are written once they reach this size whatever their age.
    const HOLD_BYTES: usize = 64 * 1024;

    /// Batches the ticks of a recording sampled every `interval` into `sink`.
    pub fn new(sink: Sink, interval: std::time::Duration) -> Batched {
        Batched {
            sink,
            pending: String::new(),
            ends: Vec::new(),
            hold: Self::HOLD_AT_MOST.saturating_sub(interval),
            since: None,
            started: false,
        }
    }

    /// Takes one tick's rows; writes what is held when it is due.
    pub fn push(&mut self, rows: &str) -> io::Result<()> {
        let since = *self.since.get_or_insert_with(std::time::Instant::now);
        self.pending.push_str(rows);
        self.ends.push(self.pending.len());
        if !self.started || since.elapsed() >= self.hold || self.pending.len() >= Self::HOLD_BYTES {
            self.started = true;
            return self.flush();
        }
        Ok(())
    }

    /// Writes what is held.
    pub fn flush(&mut self) -> io::Result<()> {
        self.since = None;
        if self.pending.is_empty() {
            return Ok(());
        }
        let out = self.sink.write_ticks(&self.pending, &self.ends);
        self.pending.clear();
        self.ends.clear();
        out
    }

    /// The sink (to sync it at the end).
    pub fn sink_mut(&mut self) -> &mut Sink {
        &mut self.sink
    }
}

/// A CSV file that starts a new file (shifting `FILE` → `FILE.1` → `FILE.2` …, keeping `keep`
/// old files) before a tick would push it past `max_bytes`. Every file starts with the header.
#[derive(Debug)]
pub struct RotatingFile {
    path: PathBuf,
    max_bytes: Option<u64>,
    keep: usize,
    file: File,
    size: u64,
    header: String,
    /// Mode of the files it creates (before the umask).
    mode: u32,
}

fn rotated(path: &Path, n: usize) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

impl RotatingFile {
    /// Opens `path`. An existing file with the same header is appended to (a gap marks the
    /// restart); any other existing file is rotated away first, so nothing is overwritten.
    /// A symbolic link is followed (the file it names is the recording, rotated beside it). A
    /// character device (`/dev/null`), FIFO or socket is written in place and never rotated:
    /// `max_bytes` is refused for it.
    pub fn open(path: &Path, max_bytes: Option<u64>, keep: usize) -> io::Result<RotatingFile> {
        Self::open_mode(path, max_bytes, keep, 0o666)
    }

    /// [`RotatingFile::open`] for a recording in gpuwatch's state directory (`run`'s
    /// `state_dir/runs/`): the files it creates are mode 0600, like everything else there.
    pub fn open_private(
        path: &Path,
        max_bytes: Option<u64>,
        keep: usize,
    ) -> io::Result<RotatingFile> {
        Self::open_mode(path, max_bytes, keep, 0o600)
    }

    fn open_mode(
        path: &Path,
        max_bytes: Option<u64>,
        keep: usize,
        mode: u32,
    ) -> io::Result<RotatingFile> {
        use std::os::unix::fs::OpenOptionsExt;
        let header = format!("{}\n", header_line());
        let target = crate::sys::output::target(path, crate::sys::output::Dash::Stdout)?;
        let path = match &target {
            crate::sys::output::Target::File { path, .. } => path.as_path(),
            crate::sys::output::Target::Stdout => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "standard output is not a file",
                ))
            }
            special => {
                if max_bytes.is_some() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "{} is not a regular file: --max-size rotates files by renaming them, which would replace it",
                            path.display()
                        ),
                    ));
                }
                let mut file = special.open_append()?;
                file.write_all(header.as_bytes())?;
                file.flush()?;
                return Ok(RotatingFile {
                    path: path.to_path_buf(),
                    max_bytes: None,
                    keep,
                    file,
                    size: header.len() as u64,
                    header,
                    mode,
                });
            }
        };
        let existing = std::fs::metadata(path).ok().map(|m| m.len());
        let same_header = existing.is_some_and(|n| n > 0)
            && File::open(path).ok().is_some_and(|f| {
                let mut first = String::new();
                BufReader::new(f).read_line(&mut first).is_ok() && first == header
            });
        if existing.is_some_and(|n| n > 0) && !same_header {
            // Kept as `path.1` even with `--keep 0`: it is not one of our recordings.
            shift(path, keep.max(1))?;
        }
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(mode)
            .open(path)?;
        let mut size = file.metadata()?.len();
        if size == 0 {
            file.write_all(header.as_bytes())?;
            file.flush()?;
            size = header.len() as u64;
        }
        Ok(RotatingFile {
            path: path.to_path_buf(),
            max_bytes,
            keep,
            file,
            size,
            header,
            mode,
        })
    }

    /// Writes the rows of one tick (rotating first when they would not fit) and flushes.
    pub fn write_tick(&mut self, rows: &str) -> io::Result<()> {
        self.write_ticks(rows, &[rows.len()])
    }

    /// Writes the rows of several ticks (`ends`: where each tick's rows end in `rows`, in
    /// order), rotating before a tick that would not fit: one write per file, ticks whole.
    pub fn write_ticks(&mut self, rows: &str, ends: &[usize]) -> io::Result<()> {
        let header_len = self.header.len() as u64;
        let mut start = 0;
        let mut end = 0;
        for &tick_end in ends {
            let tick_end = tick_end.min(rows.len());
            let tick = (tick_end - end) as u64;
            let pending = (end - start) as u64;
            if let Some(max) = self.max_bytes {
                if self.size + pending > header_len && self.size + pending + tick > max {
                    self.write_run(&rows[start..end])?;
                    self.rotate()?;
                    start = end;
                }
            }
            end = tick_end;
        }
        self.write_run(&rows[start..end])
    }

    /// Writes `text` to the current file.
    fn write_run(&mut self, text: &str) -> io::Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        self.file.write_all(text.as_bytes())?;
        self.file.flush()?;
        self.size += text.len() as u64;
        Ok(())
    }

    fn rotate(&mut self) -> io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        self.file.sync_data()?;
        shift(&self.path, self.keep)?;
        let mut file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(self.mode)
            .open(&self.path)?;
        file.write_all(self.header.as_bytes())?;
        file.flush()?;
        self.file = file;
        self.size = self.header.len() as u64;
        Ok(())
    }

    /// Flushes file contents to disk (at the end of a recording). A file that cannot be synced
    /// (`--out /dev/null`, a pipe: `EINVAL`) is not an error.
    pub fn sync(&mut self) -> io::Result<()> {
        match self.file.sync_data() {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
            other => other,
        }
    }
}

/// Renames `path.(keep-1)` → `path.keep` … `path` → `path.1`, deleting what falls past `keep`
/// (with `keep == 0` the old file is deleted).
fn shift(path: &Path, keep: usize) -> io::Result<()> {
    if keep == 0 {
        return match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    let _ = std::fs::remove_file(rotated(path, keep));
    for n in (1..keep).rev() {
        let from = rotated(path, n);
        if from.exists() {
            std::fs::rename(&from, rotated(path, n + 1))?;
        }
    }
    std::fs::rename(path, rotated(path, 1))
}

/// `[recording]` in the config file: the daemon's own metric log, in this file's format, which
/// `gpuwatch slurm epilog` and `gpuwatch job` read a job's span from (and `report` reads as any
/// log).
#[derive(Debug, Clone, serde::Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RecordingSection {
    /// Whether the daemon records every tick.
    pub enabled: bool,
    /// Where (`metrics.csv` and its rotated files); `""` = `state_dir/recording`.
    pub dir: PathBuf,
    /// Size of one file before it rotates, e.g. `"64MiB"`.
    pub max_size: String,
    /// Rotated files kept (`metrics.csv.1` … `.N`); the oldest goes.
    pub keep: usize,
}

impl Default for RecordingSection {
    fn default() -> Self {
        RecordingSection {
            enabled: false,
            dir: PathBuf::new(),
            max_size: "64MiB".into(),
            keep: 15,
        }
    }
}

impl RecordingSection {
    /// The file size limit in bytes.
    pub fn max_bytes(&self) -> Result<u64, String> {
        let b = crate::values::parse_size(&self.max_size)?;
        if b < 1_048_576 {
            return Err(format!("`{}` is under 1MiB", self.max_size));
        }
        Ok(b)
    }

    /// Checks the values serde cannot.
    pub fn validate(&self) -> Vec<crate::values::Problem> {
        let mut out = Vec::new();
        if let Err(e) = self.max_bytes() {
            out.push(crate::values::Problem::at("recording.max_size", e));
        }
        if !(1..=1000).contains(&self.keep) {
            out.push(crate::values::Problem::at(
                "recording.keep",
                "must be 1 to 1000",
            ));
        }
        out
    }
}

/// The recording's current file in `dir`.
pub const RECORDING_FILE: &str = "metrics.csv";

/// The files of the recording in `dir`, oldest first (`metrics.csv.N` … `metrics.csv.1`,
/// `metrics.csv`), each with when it was last written; only those that exist.
pub fn recording_files(dir: &Path) -> Vec<(PathBuf, std::time::SystemTime)> {
    let current = dir.join(RECORDING_FILE);
    let mut rotated: Vec<(usize, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let n = name
                .to_str()?
                .strip_prefix(RECORDING_FILE)?
                .strip_prefix('.')?;
            Some((n.parse().ok()?, e.path()))
        })
        .collect();
    rotated.sort_by_key(|r| std::cmp::Reverse(r.0));
    rotated
        .into_iter()
        .map(|(_, p)| p)
        .chain(std::iter::once(current))
        .filter_map(|p| {
            let m = std::fs::symlink_metadata(&p).ok()?;
            (m.is_file()).then(|| (p, m.modified().unwrap_or(std::time::UNIX_EPOCH)))
        })
        .collect()
}

/// The daemon's recorder: every snapshot as CSV rows, batched, into the rotating
/// `metrics.csv` of `[recording] dir` (mode 0600, like the rest of the state).
pub struct Recorder {
    rows: CsvRows,
    buf: String,
    out: Batched,
    /// Whether the last write failed (said once until one succeeds again).
    failing: bool,
}

impl Recorder {
    /// Opens the recording in `dir` (made 0700 when missing), sampled every `interval`.
    pub fn open(
        dir: &Path,
        section: &RecordingSection,
        interval: std::time::Duration,
    ) -> io::Result<Recorder> {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let max = section
            .max_bytes()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let file = RotatingFile::open_private(&dir.join(RECORDING_FILE), Some(max), section.keep)?;
        Ok(Recorder {
            rows: CsvRows::new(),
            buf: String::new(),
            out: Batched::new(Sink::File(file), interval),
            failing: false,
        })
    }

    /// Records one snapshot. A failed write (a full disk) is said once, and the daemon goes on:
    /// the recording is a side output.
    pub fn record(&mut self, snap: &Snapshot) {
        self.buf.clear();
        self.rows.render(snap, &mut self.buf);
        let r = self.out.push(&self.buf);
        self.said(r);
    }

    /// Writes what is held (at a stop, and before a job's summary is read).
    pub fn flush(&mut self) {
        let r = self.out.flush();
        self.said(r);
    }

    fn said(&mut self, r: io::Result<()>) {
        match r {
            Err(e) if !self.failing => {
                self.failing = true;
                tracing::warn!("the recording could not be written: {e}; the daemon goes on");
            }
            Err(_) => {}
            Ok(()) => self.failing = false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DeviceState;
    use crate::model::{DeviceId, GpuSample, Metric, MetricValues, XidEvent};

    fn gpu(index: u32, state: DeviceState, util: Option<f64>) -> GpuSample {
        let mut values = MetricValues::default();
        values.set(Metric::Util, util);
        if state == DeviceState::Ok {
            values.set(Metric::Power, Some(312.5));
            values.set(Metric::MemUsed, Some(81_559_000_000.0));
        }
        GpuSample {
            time_ms: 0,
            id: DeviceId {
                index,
                minor: Some(index),
                uuid: format!("GPU-{index}"),
                name: "NVIDIA H100 80GB HBM3".into(),
                pci_bus_id: format!("00000000:0{index}:00.0"),
            },
            state,
            values,
        }
    }

    fn proc(pid: u32, gpu: u32, mem: Option<u64>) -> ProcSample {
        ProcSample::compute(pid, gpu, format!("GPU-{gpu}"), mem)
    }

    #[test]
    fn header_has_every_metric_in_table_order() {
        let h = header_line();
        assert!(h.starts_with("timestamp,index,uuid,name,pci_bus_id,minor,state,util,mem_util,"));
        assert!(h.contains(",dec_util,gr_engine_active,sm_active,sm_occupancy,tensor_active,hmma_active,imma_active,dfma_active,dram_active,fp64_active,fp32_active,fp16_active,pcie_tx_bytes,pcie_rx_bytes,nvlink_tx_bytes,nvlink_rx_bytes,nvdec_util,nvjpg_util,nvofa_util,"));
        assert!(h.ends_with(",xids,processes"));
        assert_eq!(h.split(',').count(), 7 + METRICS.len() + 2);
    }

    #[test]
    fn timestamps_match_chrono() {
        let mut t: i64 = -62_135_596_800_000; // 0001-01-01
        while t < 253_402_300_799_999 {
            let want = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(t)
                .unwrap()
                .format("%Y-%m-%dT%H:%M:%S%.3fZ")
                .to_string();
            assert_eq!(format_timestamp(t), want, "{t}");
            t += 86_399_987 * 71 + 13;
        }
        assert_eq!(format_timestamp(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            format_timestamp(951_782_400_999),
            "2000-02-29T00:00:00.999Z"
        );
        assert_eq!(format_timestamp(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn values_are_canonical_text() {
        let mut s = String::new();
        for v in [45.0, 312.5, 0.1, 81_559_000_000.0, -3.0, 1e20, f64::NAN] {
            push_value(&mut s, v);
            s.push('|');
        }
        assert_eq!(s, "45|312.5|0.1|81559000000|-3|100000000000000000000||");
        assert_eq!(
            format_timestamp(1_796_223_600_123),
            "2026-12-02T15:00:00.123Z"
        );
        let mut f = String::new();
        push_field(&mut f, r#"a,"b""#);
        assert_eq!(f, r#""a,""b""""#);
    }

    #[test]
    fn fractional_values_read_back_exactly_and_without_an_exponent() {
        // Powers, energies, rates and GPM percentages over many magnitudes, and the edges where
        // ryu would switch to an exponent.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut values = vec![1e-7, 1.5e-5, 0.000_01, 0.000_123, 9.999_999e15, 1.234_5e16];
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let bits = (x >> 11) as f64 / (1_u64 << 53) as f64;
            let exp = (x % 40) as i32 - 12;
            values.push(bits * 10_f64.powi(exp));
            values.push(f64::from_bits(x));
        }
        let mut differ = 0;
        for v in values.into_iter().filter(|v| v.is_finite()) {
            let mut ours = String::new();
            push_value(&mut ours, v);
            let back: f64 = ours.parse().unwrap();
            assert_eq!(back.to_bits(), v.to_bits(), "{v:e} written as {ours}");
            assert!(!ours.contains(['e', 'E']), "{ours}");
            let display = format!("{v}");
            assert!(ours.len() <= display.len(), "{ours} longer than {display}");
            differ +=
                usize::from(ours != display && !(v.fract() == 0.0 && ours.len() < display.len()));
        }
        // The same digits as `Display` but for the last one where two are as short and as near.
        assert!(differ < 100, "{differ}");
    }

    #[test]
    fn a_gpus_identity_cells_follow_its_identity() {
        let snap = |name: &str| Snapshot {
            time_ms: 1_000,
            gpus: vec![GpuSample {
                time_ms: 1_000,
                id: DeviceId {
                    index: 0,
                    minor: Some(3),
                    uuid: "GPU-1".into(),
                    pci_bus_id: "00000000:07:00.0".into(),
                    name: name.into(),
                },
                state: DeviceState::Ok,
                values: MetricValues::default(),
            }],
            ..Snapshot::default()
        };
        let mut rows = CsvRows::new();
        let (mut a, mut b) = (String::new(), String::new());
        rows.render(&snap("NVIDIA H200"), &mut a);
        rows.render(&snap("NVIDIA \"H200\", renamed"), &mut b);
        assert!(
            a.contains(",0,GPU-1,NVIDIA H200,00000000:07:00.0,3,ok,"),
            "{a}"
        );
        assert!(
            b.contains(r#",0,GPU-1,"NVIDIA ""H200"", renamed",00000000:07:00.0,3,ok,"#),
            "{b}"
        );
    }

    #[test]
    fn a_text_field_with_control_characters_stays_on_one_line() {
        // a driver's GPU name or MIG UUID with a line break and escape sequences
        let mut f = String::new();
        push_field(&mut f, "MIG-\u{1b}[31mRED\n\"}<x>,y\r\u{7}");
        assert_eq!(f, r#""MIG-\u{1b}[31mRED\n""}<x>,y\r\u{7}""#);
        assert!(!f.chars().any(char::is_control), "{f:?}");
    }

    #[test]
    fn rows_carry_state_xids_and_last_process_list() {
        let mut rows = CsvRows::new();
        let snap = Snapshot {
            time_ms: 1_796_223_600_123,
            gpus: vec![
                gpu(0, DeviceState::Ok, Some(98.0)),
                gpu(1, DeviceState::Lost, None),
            ],
            processes: Some(vec![
                proc(10, 0, Some(1024)),
                proc(11, 0, None),
                proc(12, 1, None),
            ]),
            xids: vec![
                XidEvent::new(0, 1, "GPU-1", 79),
                XidEvent::new(0, 1, "GPU-1", 48),
            ],
            ..Snapshot::default()
        };
        let mut out = String::new();
        rows.render(&snap, &mut out);
        let empty_metrics = |skip: usize| ",".repeat(METRICS.len() - skip);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2);
        let mut c0: Vec<&str> = lines[0].split(',').collect();
        assert_eq!(c0.len(), 7 + METRICS.len() + 2);
        assert_eq!(
            &c0[..7],
            [
                "2026-12-02T15:00:00.123Z",
                "0",
                "GPU-0",
                "NVIDIA H100 80GB HBM3",
                "00000000:00:00.0",
                "0",
                "ok"
            ]
        );
        assert_eq!(c0[7 + Metric::Util as usize], "98");
        assert_eq!(c0[7 + Metric::MemUsed as usize], "81559000000");
        assert_eq!(c0[7 + Metric::Power as usize], "312.5");
        assert_eq!(c0[7 + Metric::Temp as usize], "", "absent is empty, not 0");
        assert_eq!(c0.pop(), Some("10:1024;11:"));
        assert_eq!(c0.pop(), Some(""));
        assert_eq!(
            lines[1],
            format!(
                "2026-12-02T15:00:00.123Z,1,GPU-1,NVIDIA H100 80GB HBM3,00000000:01:00.0,1,lost{},79;48,12:",
                empty_metrics(0)
            )
        );
        // Next tick: no refreshed list → the last one is repeated; no new XIDs.
        let snap2 = Snapshot {
            time_ms: 1_796_223_601_123,
            gpus: vec![gpu(1, DeviceState::Lost, None)],
            processes: None,
            xids: vec![],
            ..Snapshot::default()
        };
        let mut out2 = String::new();
        rows.render(&snap2, &mut out2);
        assert!(
            out2.ends_with(&format!("lost{},,12:\n", empty_metrics(0))),
            "{out2}"
        );
    }

    /// Issue 25 §4: a private recording (`run`'s, in the state directory) and its rotated
    /// parts are 0600 whatever the umask lets through.
    #[test]
    fn a_private_recording_is_the_owners_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.csv");
        let header = format!("{}\n", header_line());
        let tick = "row-a\n";
        let mut f = RotatingFile::open_private(&path, Some(header.len() as u64 + 8), 1).unwrap();
        for _ in 0..3 {
            f.write_tick(tick).unwrap();
        }
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&rotated(&path, 1)), 0o600);
    }

    /// At short intervals the first tick is written at once and later ones together, none held
    /// past a second; at 1 s each tick is written when it comes; a flush writes what is held.
    #[test]
    fn short_ticks_are_written_together_within_a_second() {
        #[derive(Clone, Default)]
        struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl Write for Shared {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let out = Shared::default();
        let text = |o: &Shared| String::from_utf8(o.0.lock().unwrap().clone()).unwrap();
        let mut b = Batched::new(
            Sink::Stream(Box::new(out.clone())),
            std::time::Duration::from_millis(100),
        );
        b.push("t1\n").unwrap();
        assert_eq!(text(&out), "t1\n", "the first tick at once");
        b.push("t2\n").unwrap();
        b.push("t3\n").unwrap();
        assert_eq!(text(&out), "t1\n", "later ones held");
        std::thread::sleep(Batched::HOLD_AT_MOST);
        b.push("t4\n").unwrap();
        assert_eq!(
            text(&out),
            "t1\nt2\nt3\nt4\n",
            "written once the oldest is due"
        );
        b.push("t5\n").unwrap();
        b.flush().unwrap();
        assert_eq!(
            text(&out),
            "t1\nt2\nt3\nt4\nt5\n",
            "a flush writes what is held"
        );

        let out = Shared::default();
        let mut b = Batched::new(
            Sink::Stream(Box::new(out.clone())),
            std::time::Duration::from_secs(1),
        );
        b.push("t1\n").unwrap();
        b.push("t2\n").unwrap();
        assert_eq!(text(&out), "t1\nt2\n", "at 1 s every tick at once");
    }

    #[test]
    fn rotation_keeps_ticks_whole_and_headers_everywhere() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpu.csv");
        let header = format!("{}\n", header_line());
        let tick = "row-a\nrow-b\n";
        let max = header.len() as u64 + 2 * tick.len() as u64;
        let mut f = RotatingFile::open(&path, Some(max), 2).unwrap();
        for _ in 0..7 {
            f.write_tick(tick).unwrap();
        }
        f.sync().unwrap();
        let read = |p: &Path| std::fs::read_to_string(p).unwrap();
        assert_eq!(read(&path), format!("{header}{tick}"));
        assert_eq!(read(&rotated(&path, 1)), format!("{header}{tick}{tick}"));
        assert_eq!(read(&rotated(&path, 2)), format!("{header}{tick}{tick}"));
        assert!(!rotated(&path, 3).exists());
        // The same seven ticks written together (as `record` batches short ticks): the same
        // files.
        drop(f);
        let batched = dir.path().join("batched.csv");
        let mut b = RotatingFile::open(&batched, Some(max), 2).unwrap();
        let ends: Vec<usize> = (1..=7).map(|n| n * tick.len()).collect();
        b.write_ticks(&tick.repeat(7), &ends).unwrap();
        assert_eq!(read(&batched), format!("{header}{tick}"));
        assert_eq!(read(&rotated(&batched, 1)), format!("{header}{tick}{tick}"));
        assert_eq!(read(&rotated(&batched, 2)), format!("{header}{tick}{tick}"));
        assert!(!rotated(&batched, 3).exists());

        // Reopening with the same header appends; a foreign file is rotated away, not lost.
        let mut again = RotatingFile::open(&path, None, 2).unwrap();
        again.write_tick(tick).unwrap();
        assert_eq!(read(&path), format!("{header}{tick}{tick}"));
        let other = dir.path().join("other.csv");
        std::fs::write(&other, "something else\n").unwrap();
        let _f = RotatingFile::open(&other, None, 3).unwrap();
        assert_eq!(read(&rotated(&other, 1)), "something else\n");
        assert_eq!(read(&other), header);
        // Also with --keep 0 (which deletes our own old rotations, never a foreign file).
        let notes = dir.path().join("notes.csv");
        std::fs::write(&notes, "my notes\n").unwrap();
        let _n = RotatingFile::open(&notes, None, 0).unwrap();
        assert_eq!(read(&rotated(&notes, 1)), "my notes\n");
    }
}
