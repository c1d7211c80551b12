//! Scrapes of dcgm-exporter's `/metrics` saved as text: Prometheus's exposition format, as
//! `while true; do curl -s localhost:9400/metrics; sleep 1; done > scrapes.txt` writes it (many
//! scrapes one after another), and the same of gpuwatch's own `/metrics`, which uses
//! dcgm-exporter's names:
//!
//! ```text
//! # HELP DCGM_FI_PROF_SM_ACTIVE The ratio of cycles an SM has at least 1 warp assigned.
//! # TYPE DCGM_FI_PROF_SM_ACTIVE gauge
//! DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-…",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node1"} 0.123
//! ```
//!
//! A sample is `name{label="value",…} value [timestamp]` (label values with `\"`, `\\` and `\n`
//! escapes; `NaN`, `+Inf` read, then refused as readings); `{__name__="…",…} value timestamp`
//! (Prometheus's dump form) and OpenMetrics' `# EOF` are read too.
//!
//! **Families.** A `DCGM_FI_*` name maps to its metric through the metric table's `dcgm`
//! column, in the unit `/metrics` writes it (`MetricDesc::dcgm_unit`, inverted: framebuffer
//! MiB → bytes, energy mJ → J, the profiling ratios 0–1 → percent, NVLink MB/s → bytes/s).
//! `DCGM_FI_DEV_XID_ERRORS` (the GPU's last XID) is an XID event when it changes to a code
//! other than 0 (the same code twice in a row is one event): a GPU's first value is a baseline,
//! no event (the XID may be from before the scrapes), unless the GPU had readings before
//! without one (gpuwatch's page writes the family only from a GPU's first XID on). From
//! gpuwatch's own families, `gpuwatch_gpu_lost` 1 marks a GPU without values lost: the page
//! writes 1 for a lost GPU and for a stalled one alike, so a GPU stalled on its fast path (no
//! values either) reads back lost, and one stalled on its slow path (its tick's values kept)
//! stays answering. `gpuwatch_mig_device_info` names a MIG device (its UUID and compute
//! instance). Other families are counted and named in one warning.
//!
//! **GPUs.** A sample's GPU is its `gpu` label (else its `UUID`, else its `pci_bus_id`);
//! `UUID`/`uuid`, `modelName`, `pci_bus_id` and `device` (`nvidia3`: minor 3) fill the GPU's
//! identity. A series with a `GPU_I_ID` is a GPU instance's: its framebuffer (used, free,
//! total) and profiling activities (the GPM rows a GPU instance has) go to the snapshot's MIG
//! devices of that GPU instance (its compute instances share them); its other series are
//! skipped and counted, never mixed into the GPU's values. `gpuwatch_mig_device_info` names a
//! MIG device by GPU and compute instance (`gpu_i_id`, `gpu_ci_id`): two compute instances of
//! one GPU instance are two MIG devices, each with its own UUID (the first line of each wins).
//!
//! **Time.** A sample with a timestamp (milliseconds since the epoch; seconds in OpenMetrics) is
//! at that time. Without one, the scrape is the time: a scrape ends where a series, or a family's
//! `# HELP` / `# TYPE` line, comes again (or at `# EOF`), and scrape *k* is at `--t0` + *k* ×
//! `--every` (1 s by default), as for `nvidia-smi dmon` without `-o DT`.
//!
//! **Bounds.** A line is at most 1 MiB (the input's limit), 64 labels of at most 1 KiB each; a
//! scrape at most [`MAX_GPUS`] GPUs with [`MAX_MIG`] MIG devices each; readings with timestamps
//! wait for the rest of their GPU's samples (Prometheus's dump writes a series at a time) in at
//! most [`MAX_PENDING`] GPU readings, the oldest going out first (a later sample of a time gone
//! out is dropped and counted). A malformed line is skipped with the column where it went wrong
//! (the first few also as `file:line:column` warnings). Scrapes of several hosts in one file are
//! not told apart: a GPU index with a second UUID in one scrape is a malformed line.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher as _;
use std::sync::OnceLock;

use super::{Ctx, Item, Key, LineError, Reading};
use crate::model::{DeviceState, Metric, MigGpm, MigSample, METRICS};

/// Labels a sample may have.
pub const MAX_LABELS: usize = 64;
/// Bytes a label value may have.
pub const MAX_LABEL: usize = 1024;
/// GPUs in one scrape (one time).
pub const MAX_GPUS: usize = 1024;
/// MIG devices of one GPU in one scrape.
pub const MAX_MIG: usize = 16;
/// GPU readings waiting for the rest of their samples.
pub const MAX_PENDING: usize = 8192;
/// Series and `# HELP`/`# TYPE` lines remembered per scrape (to see the next one start).
const MAX_SERIES: usize = 1 << 16;
/// Distinct ignored families remembered (to count them).
const MAX_IGNORED: usize = 4096;

/// Whether `line` is typical of a scrape: a `# HELP` or `# TYPE` line of a `DCGM_` family, or a
/// `DCGM_FI_` sample.
pub fn recognises(line: &str) -> bool {
    let l = line.trim_start();
    if let Some(comment) = l.strip_prefix('#') {
        let mut words = comment.split_whitespace();
        return matches!(words.next(), Some("HELP" | "TYPE"))
            && words.next().is_some_and(|n| n.starts_with("DCGM_"));
    }
    if let Some(rest) = l.strip_prefix("DCGM_FI_") {
        let after = rest.trim_start_matches(is_name_char);
        return after.starts_with(['{', ' ', '\t']);
    }
    l.starts_with("{__name__=\"DCGM_FI_")
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// What a family gives.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Family {
    /// A metric of the table, and the factors of its DCGM unit (`/metrics` multiplies by the
    /// first and divides by the second).
    Metric(Metric, f64, f64),
    /// `DCGM_FI_DEV_XID_ERRORS`: the last XID.
    Xid,
    /// `gpuwatch_gpu_lost`.
    Lost,
    /// `gpuwatch_mig_device_info`.
    MigInfo,
}

/// The family named `name`: the metric table's dcgm-exporter names, inverted once.
fn family(name: &str) -> Option<Family> {
    static BY_NAME: OnceLock<HashMap<&'static str, Family>> = OnceLock::new();
    let map = BY_NAME.get_or_init(|| {
        let mut map: HashMap<&'static str, Family> = METRICS
            .iter()
            .filter_map(|d| {
                let (_, mul, div) = d.dcgm_unit()?;
                Some((d.dcgm?, Family::Metric(d.id, mul, div)))
            })
            .collect();
        map.insert("DCGM_FI_DEV_XID_ERRORS", Family::Xid);
        map.insert("gpuwatch_gpu_lost", Family::Lost);
        map.insert("gpuwatch_mig_device_info", Family::MigInfo);
        map
    });
    map.get(name).copied()
}

/// One sample line, parsed. Places in it are byte offsets, turned into the columns a warning
/// names ([`Sample::col`]) only when something there is wrong.
#[derive(Debug)]
struct Sample<'a> {
    line: &'a str,
    name: Cow<'a, str>,
    /// The series as written (name and labels), for telling scrapes apart.
    series: &'a str,
    labels: Vec<(&'a str, Cow<'a, str>, usize)>,
    value: &'a str,
    /// Byte offsets of the value and the timestamp.
    value_at: usize,
    stamp: Option<(&'a str, usize)>,
}

impl Sample<'_> {
    /// A label's value and the byte offset of its value (`None` when absent).
    fn label(&self, name: &str) -> Option<(&str, usize)> {
        self.labels
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, v, at)| (v.as_ref(), *at))
    }

    /// The 1-based character column of byte offset `at` of the line.
    fn col(&self, at: usize) -> usize {
        column(self.line, at)
    }

    /// A label's value, empty when absent.
    fn text(&self, name: &str) -> &str {
        self.label(name).map_or("", |(v, _)| v)
    }
}

/// The 1-based character column of byte offset `at` in `line`.
fn column(line: &str, at: usize) -> usize {
    line.get(..at).map_or(at, |s| s.chars().count()) + 1
}

/// Reads one sample line; `Err((byte offset, why))` where it stops making sense.
fn parse_sample(line: &str) -> Result<Sample<'_>, (usize, String)> {
    let b = line.as_bytes();
    let ws = |mut i: usize| {
        while i < b.len() && (b[i] == b' ' || b[i] == b'\t') {
            i += 1;
        }
        i
    };
    let start = ws(0);
    let mut i = start;
    while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':') {
        i += 1;
    }
    let mut name: Cow<'_, str> = Cow::Borrowed(&line[start..i]);
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err((start, "a metric name cannot start with a digit".into()));
    }
    if name.is_empty() && b.get(i) != Some(&b'{') {
        return Err((i, "expected a metric name or `{`".into()));
    }
    let mut labels = Vec::new();
    if b.get(i) == Some(&b'{') {
        i += 1;
        loop {
            i = ws(i);
            match b.get(i) {
                Some(b'}') => {
                    i += 1;
                    break;
                }
                None => return Err((i, "the labels end without `}`".into())),
                _ => {}
            }
            let at = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            let label = &line[at..i];
            if label.is_empty() || label.starts_with(|c: char| c.is_ascii_digit()) {
                return Err((at, "expected a label name".into()));
            }
            i = ws(i);
            if b.get(i) != Some(&b'=') {
                return Err((i, format!("expected `=` after label {label}")));
            }
            i = ws(i + 1);
            if b.get(i) != Some(&b'"') {
                return Err((
                    i,
                    format!("expected `\"` to open the value of label {label}"),
                ));
            }
            let open = i;
            i += 1;
            let from = i;
            let mut escaped = false;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    escaped = true;
                    i += 1;
                }
                i += 1;
            }
            if i >= b.len() {
                return Err((
                    open,
                    format!("the value of label {label} has no closing `\"`"),
                ));
            }
            if i - from > MAX_LABEL {
                return Err((
                    from,
                    format!("the value of label {label} is longer than {MAX_LABEL} bytes"),
                ));
            }
            let raw = &line[from..i];
            let value = if escaped {
                Cow::Owned(unescape(raw))
            } else {
                Cow::Borrowed(raw)
            };
            i = ws(i + 1);
            if label == "__name__" && name.is_empty() {
                name = value;
            } else {
                if labels.len() == MAX_LABELS {
                    return Err((at, format!("more than {MAX_LABELS} labels")));
                }
                labels.push((label, value, from));
            }
            match b.get(i) {
                Some(b',') => i += 1,
                Some(b'}') => {}
                _ => return Err((i, "expected `,` or `}` after a label".into())),
            }
        }
        if name.is_empty() {
            return Err((start, "a sample without a metric name".into()));
        }
    }
    let series = &line[start..i];
    let after = ws(i);
    if after == i && i < b.len() {
        return Err((i, "expected a space before the value".into()));
    }
    let words = |from: usize| {
        let end = b[from..]
            .iter()
            .position(|c| *c == b' ' || *c == b'\t')
            .map_or(b.len(), |n| from + n);
        (&line[from..end], end)
    };
    if after >= b.len() {
        return Err((after, "a sample without a value".into()));
    }
    let (value, end) = words(after);
    let next = ws(end);
    let mut stamp = None;
    if next < b.len() && b[next] != b'#' {
        let (t, end) = words(next);
        stamp = Some((t, next));
        let rest = ws(end);
        // an OpenMetrics exemplar (` # {…} value`) may follow
        if rest < b.len() && b[rest] != b'#' {
            return Err((rest, "more after the timestamp".into()));
        }
    }
    Ok(Sample {
        line,
        name,
        series,
        labels,
        value,
        value_at: after,
        stamp,
    })
}

/// A label value's escapes undone (`\\`, `\"`, `\n`; any other backslash kept as written).
fn unescape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('\\') => out.push('\\'),
            Some('"') => out.push('"'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

/// `raw` (a number read as `v`) in gpuwatch's unit: times `div` over `mul` — by moving the
/// decimal point where that is a power of ten, so a ratio of 0.57 is 57 %, not
/// 56.99999999999999.
fn from_dcgm(raw: &str, v: f64, mul: f64, div: f64) -> f64 {
    let pow10 = |x: f64| (0..=9).find(|k| 10f64.powi(*k) == x);
    if v.is_finite() {
        if let (Some(m), Some(d)) = (pow10(mul), pow10(div)) {
            let (mant, exp) = match raw.find(['e', 'E']) {
                Some(at) => (&raw[..at], raw[at + 1..].parse::<i32>().ok()),
                None => (raw, Some(0)),
            };
            // a hostile exponent (`0e2147483647`) must not overflow: it keeps `v`'s reading
            let e = exp.and_then(|e| e.checked_add(d)?.checked_sub(m));
            if let Some(shifted) = e.and_then(|e| format!("{mant}e{e}").parse().ok()) {
                return shifted;
            }
        }
    }
    v * div / mul
}

/// How a sample names its GPU.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum GpuId {
    /// The `gpu` label.
    Index(u32),
    /// Its UUID or bus id (no `gpu` label).
    Named(String),
}

/// A MIG device as its series describe it.
#[derive(Debug, Default)]
struct PendingMig {
    gi: u32,
    ci: Option<u32>,
    uuid: Option<String>,
    profile: Option<String>,
    /// Framebuffer used, free, total, bytes.
    used: Option<f64>,
    free: Option<f64>,
    total: Option<f64>,
    /// Its GPU instance's profiling activities (the GPM rows).
    gpm: MigGpm,
}

impl PendingMig {
    fn sample(self, index: u32) -> MigSample {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "checked: finite, not negative, below 2^63"
        )]
        let bytes = |v: Option<f64>| {
            v.filter(|v| v.is_finite() && *v >= 0.0 && *v < 9.2e18)
                .map(|v| v.round() as u64)
        };
        let used = bytes(self.used);
        let total = bytes(self.total).or_else(|| Some(used? + bytes(self.free)?));
        MigSample {
            gpu_index: 0,
            gpu_uuid: String::new(),
            index,
            uuid: self.uuid.unwrap_or_default(),
            gpu_instance_id: self.gi,
            compute_instance_id: self.ci.unwrap_or(0),
            profile: self.profile,
            placement: None,
            mem_used_bytes: used,
            mem_total_bytes: total,
            pids: Vec::new(),
            gpm: self.gpm,
        }
    }
}

/// A GPU's reading while its samples come in.
struct Pending {
    reading: Reading,
    id: GpuId,
    /// At a timestamp of its own (else at its scrape's time).
    timed: bool,
    mig: Vec<PendingMig>,
}

/// Reads scrapes (see the module docs).
pub struct ScrapeParser {
    hasher: std::hash::RandomState,
    /// Series and `# HELP`/`# TYPE` lines of the scrape in progress.
    seen: HashSet<u64>,
    /// Whether the scrape in progress has anything.
    in_scrape: bool,
    /// Scrapes ended so far (the time of samples without a timestamp).
    scrape: i64,
    pending: Vec<Pending>,
    /// (GPU, time) → position in `pending`.
    at: HashMap<(GpuId, i64), usize>,
    /// GPUs per time in `pending`.
    per_time: HashMap<i64, usize>,
    /// The last XID per GPU.
    last_xid: HashMap<GpuId, u64>,
    /// The earliest time each GPU had a reading (at most [`MAX_PENDING`] GPUs).
    first_ms: HashMap<GpuId, i64>,
    /// Samples of families not read, the families (hashed), the first few names.
    ignored: u64,
    ignored_families: HashSet<u64>,
    ignored_names: Vec<String>,
    /// Samples of MIG devices other than their framebuffer and GPM rows.
    mig_other: u64,
    /// The newest time of the readings with timestamps sent out to make room.
    emitted_ms: Option<i64>,
    /// Samples whose time's readings had been sent out to make room: dropped.
    late: u64,
    /// Readings of scrapes that ended, for the importer (handed over after each line, so a
    /// malformed line that ends a scrape never takes the scrape's readings with it).
    ready: Vec<Item>,
}

impl Default for ScrapeParser {
    fn default() -> ScrapeParser {
        ScrapeParser {
            hasher: std::hash::RandomState::new(),
            seen: HashSet::new(),
            in_scrape: false,
            scrape: 0,
            pending: Vec::new(),
            at: HashMap::new(),
            per_time: HashMap::new(),
            last_xid: HashMap::new(),
            first_ms: HashMap::new(),
            ignored: 0,
            ignored_families: HashSet::new(),
            ignored_names: Vec::new(),
            mig_other: 0,
            emitted_ms: None,
            late: 0,
            ready: Vec::new(),
        }
    }
}

impl ScrapeParser {
    /// The scrape in progress is over: its readings without timestamps go out as one tick.
    fn end_scrape(&mut self) {
        if !self.in_scrape {
            return;
        }
        self.in_scrape = false;
        self.scrape += 1;
        self.seen.clear();
        if self.pending.iter().any(|p| !p.timed) {
            self.emit(|p| !p.timed);
            self.ready.push(Item::EndTick);
        }
    }

    /// Marks `key` (a series, a `# HELP` line) seen in this scrape; seen already, a new scrape
    /// starts.
    fn see(&mut self, key: impl std::hash::Hash) {
        let h = self.hasher.hash_one(key);
        if self.seen.contains(&h) || self.seen.len() >= MAX_SERIES {
            self.end_scrape();
        }
        self.seen.insert(h);
        self.in_scrape = true;
    }

    /// Sends out the pending readings `which` picks, in time order.
    fn emit(&mut self, which: impl Fn(&Pending) -> bool) {
        let (mut go, keep): (Vec<Pending>, Vec<Pending>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(which);
        go.sort_by_key(|p| p.reading.time_ms);
        self.pending = keep;
        self.at.clear();
        self.per_time.clear();
        for (i, p) in self.pending.iter().enumerate() {
            self.at.insert((p.id.clone(), p.reading.time_ms), i);
            *self.per_time.entry(p.reading.time_ms).or_default() += 1;
        }
        for p in go {
            let mut r = p.reading;
            let mut mig = p.mig;
            mig.sort_by_key(|m| (m.gi, m.ci));
            r.mig = mig
                .into_iter()
                .enumerate()
                .map(|(i, m)| m.sample(u32::try_from(i).unwrap_or(u32::MAX)))
                .collect();
            self.ready.push(Item::Reading(r));
        }
    }

    /// With [`MAX_PENDING`] readings open, the older half goes out (at a change of time: a
    /// time's GPUs stay together).
    fn make_room(&mut self) {
        let mut times: Vec<i64> = self.pending.iter().map(|p| p.reading.time_ms).collect();
        times.sort_unstable();
        let cut = times[times.len() / 2];
        let cut = if times[0] == cut { cut + 1 } else { cut };
        let newest = times.iter().rev().find(|t| **t < cut).copied();
        self.emitted_ms = newest.max(self.emitted_ms);
        self.emit(|p| p.reading.time_ms < cut);
    }

    fn ignore(&mut self, name: &str) {
        self.ignored += 1;
        if self.ignored_families.len() < MAX_IGNORED
            && self.ignored_families.insert(self.hasher.hash_one(name))
            && self.ignored_names.len() < 5
        {
            // a name from `{__name__="…"}` may hold anything: its control characters escaped
            let name = crate::values::escape_control(&crate::values::truncate_chars(name, 80));
            self.ignored_names.push(name);
        }
    }

    /// The pending reading of GPU `id` at `time`, made on its first sample.
    fn reading(
        &mut self,
        s: &Sample<'_>,
        id: GpuId,
        (time, timed): (i64, bool),
    ) -> Result<&mut Pending, LineError> {
        let uuid = s.label("UUID").or_else(|| s.label("uuid"));
        let key = (id, time);
        let at = match self.at.get(&key) {
            Some(&at) => at,
            None => {
                let n = self.per_time.entry(time).or_default();
                if *n >= MAX_GPUS {
                    return Err(LineError::Skip(format!(
                        "more than {MAX_GPUS} GPUs in one scrape"
                    )));
                }
                *n += 1;
                let (id, _) = key;
                let (index, k) = match &id {
                    GpuId::Index(i) => (*i, Key::Index),
                    GpuId::Named(n) => (0, Key::Named(n.clone())),
                };
                let mut r = Reading::new(time, k, index);
                r.sample.id.name = s.text("modelName").to_string();
                r.sample.id.pci_bus_id = s.text("pci_bus_id").to_string();
                r.sample.id.minor = s
                    .text("device")
                    .strip_prefix("nvidia")
                    .and_then(|m| m.parse().ok());
                let room = self.first_ms.len() < MAX_PENDING;
                match self.first_ms.get_mut(&id) {
                    Some(t) => *t = (*t).min(time),
                    None if room => {
                        self.first_ms.insert(id.clone(), time);
                    }
                    None => {}
                }
                self.at.insert((id.clone(), time), self.pending.len());
                self.pending.push(Pending {
                    reading: r,
                    id,
                    timed,
                    mig: Vec::new(),
                });
                self.pending.len() - 1
            }
        };
        let p = &mut self.pending[at];
        let ident = &mut p.reading.sample.id;
        if let Some((u, at)) = uuid.filter(|(u, _)| !u.is_empty()) {
            if ident.uuid.is_empty() {
                ident.uuid = u.to_string();
            } else if ident.uuid != u {
                return Err(LineError::SkipAt(
                    s.col(at),
                    format!(
                        "GPU {} again with another UUID in one scrape (several hosts' scrapes in one file? import each host's on its own)",
                        ident.index
                    ),
                ));
            }
        }
        if ident.name.is_empty() {
            ident.name = s.text("modelName").to_string();
        }
        if ident.pci_bus_id.is_empty() {
            ident.pci_bus_id = s.text("pci_bus_id").to_string();
        }
        Ok(p)
    }
}

/// Makes sure GPU instance `gi` of `p` has a MIG device (added on its first series).
fn gpu_instance(p: &mut Pending, gi: u32) -> Result<(), LineError> {
    if !p.mig.iter().any(|m| m.gi == gi) {
        add_mig(p, gi, None)?;
    }
    Ok(())
}

/// Adds MIG device (`gi`, `ci`) to `p`, with what is known of its GPU instance so far (the
/// compute instances of a GPU instance share its memory and GPM); its position.
fn add_mig(p: &mut Pending, gi: u32, ci: Option<u32>) -> Result<usize, LineError> {
    if p.mig.len() >= MAX_MIG {
        return Err(LineError::Skip(format!(
            "more than {MAX_MIG} MIG devices on one GPU"
        )));
    }
    let mut mig = PendingMig {
        gi,
        ..PendingMig::default()
    };
    if let Some(other) = p.mig.iter().find(|m| m.gi == gi) {
        mig.profile.clone_from(&other.profile);
        (mig.used, mig.free, mig.total) = (other.used, other.free, other.total);
        mig.gpm = other.gpm.clone();
    }
    mig.ci = ci;
    p.mig.push(mig);
    Ok(p.mig.len() - 1)
}

/// The MIG device `gpuwatch_mig_device_info` names: GPU instance `gi`, compute instance `ci`
/// when the line gives one. A MIG device of `gi` whose compute instance is not known yet (made
/// by its DCGM series, which name the GPU instance only) is taken as it; otherwise another MIG
/// device of `gi` is added (so two compute instances of one GPU instance keep their own UUIDs).
fn mig_device(p: &mut Pending, gi: u32, ci: Option<u32>) -> Result<usize, LineError> {
    let found = match ci {
        Some(c) => p
            .mig
            .iter()
            .position(|m| m.gi == gi && m.ci == Some(c))
            .or_else(|| {
                let at = p.mig.iter().position(|m| m.gi == gi && m.ci.is_none())?;
                p.mig[at].ci = Some(c);
                Some(at)
            }),
        None => p.mig.iter().position(|m| m.gi == gi),
    };
    match found {
        Some(at) => Ok(at),
        None => add_mig(p, gi, ci),
    }
}

/// A MIG profile as written in a label (`1g.10gb`), when it is one.
fn profile(label: &str) -> Option<String> {
    crate::model::mig_profile_of_name(&format!("MIG {label}"))
}

impl super::Parse for ScrapeParser {
    fn line(&mut self, line: &str, ctx: &Ctx, _out: &mut Vec<Item>) -> Result<(), LineError> {
        let l = line.trim_start();
        if let Some(comment) = l.strip_prefix('#') {
            let mut words = comment.split_whitespace();
            match words.next() {
                Some(kind @ ("HELP" | "TYPE")) => {
                    if let Some(name) = words.next() {
                        self.see((kind, name));
                    }
                }
                Some("EOF") => self.end_scrape(),
                _ => {}
            }
            return Ok(());
        }
        let s = parse_sample(line).map_err(|(at, why)| LineError::SkipAt(column(line, at), why))?;
        self.see(s.series);
        let Some(fam) = family(&s.name) else {
            self.ignore(&s.name);
            return Ok(());
        };
        let id = match s.label("gpu").filter(|(g, _)| !g.is_empty()) {
            Some((g, at)) => GpuId::Index(g.parse().map_err(|_| {
                LineError::SkipAt(
                    s.col(at),
                    format!("bad GPU index {}", crate::trace::quoted(g)),
                )
            })?),
            None => {
                let named = [s.text("UUID"), s.text("uuid"), s.text("pci_bus_id")]
                    .into_iter()
                    .find(|n| !n.is_empty())
                    .ok_or_else(|| {
                        LineError::Skip("a sample without a gpu, UUID or pci_bus_id label".into())
                    })?;
                GpuId::Named(named.to_string())
            }
        };
        let mig_label = if fam == Family::MigInfo {
            "gpu_i_id"
        } else {
            "GPU_I_ID"
        };
        let gi = match s.label(mig_label).filter(|(g, _)| !g.is_empty()) {
            Some((g, at)) => Some(g.parse::<u32>().map_err(|_| {
                LineError::SkipAt(
                    s.col(at),
                    format!("bad GPU instance id {}", crate::trace::quoted(g)),
                )
            })?),
            None => None,
        };
        if let (Some(_), Family::Metric(m, ..)) = (gi, fam) {
            if !matches!(m, Metric::MemUsed | Metric::MemFree | Metric::MemTotal)
                && !m.per_gpu_instance()
            {
                self.mig_other += 1;
                return Ok(());
            }
        }
        let time = match s.stamp {
            Some((raw, at)) => {
                let bad = |e: &str| {
                    LineError::SkipAt(
                        s.col(at),
                        format!("bad timestamp {}: {e}", crate::trace::quoted(raw)),
                    )
                };
                let n: f64 = raw.parse().map_err(|_| bad("not a number"))?;
                if n < super::stamp::EPOCH_SECONDS_FROM {
                    return Err(bad("not a time since the epoch"));
                }
                let ms = super::stamp::Stamp::Number(n).resolve(None).map_err(bad)?;
                (ms, true)
            }
            None => {
                let t0 = ctx.t0_ms.ok_or_else(|| {
                    LineError::Fatal(
                        "dcgm-exporter scrapes without timestamps: pass --t0 TIME (the first scrape's time) and --every (the time between scrapes; 1s by default)"
                            .into(),
                    )
                })?;
                (t0 + self.scrape * ctx.every_ms, false)
            }
        };
        if self.pending.len() >= MAX_PENDING && !self.at.contains_key(&(id.clone(), time.0)) {
            self.make_room();
        }
        if time.1 && self.emitted_ms.is_some_and(|e| time.0 <= e) {
            // its time's readings went out to make room: this value has no reading to join
            self.late += 1;
            return Ok(());
        }
        let raw = s.value;
        let value = raw.parse::<f64>();
        let col = s.col(s.value_at);
        match fam {
            Family::Metric(m, mul, div) => {
                let v = value
                    .map(|v| Some(from_dcgm(raw, v, mul, div)))
                    .map_err(|_| String::new());
                let v = super::csv::checked(m, v, raw, col, ctx);
                let p = self.reading(&s, id, time)?;
                if let Some(gi) = gi {
                    // every MIG device of the GPU instance: they share its memory and GPM (the
                    // first value wins, as for a GPU)
                    gpu_instance(p, gi)?;
                    let pr = s.label("GPU_I_PROFILE").and_then(|(p, _)| profile(p));
                    for mig in p.mig.iter_mut().filter(|m| m.gi == gi) {
                        if mig.profile.is_none() {
                            mig.profile.clone_from(&pr);
                        }
                        let slot = match m {
                            Metric::MemUsed => &mut mig.used,
                            Metric::MemFree => &mut mig.free,
                            Metric::MemTotal => &mut mig.total,
                            _ => {
                                if mig.gpm.get(m).is_none() {
                                    mig.gpm.set(m, v);
                                }
                                continue;
                            }
                        };
                        *slot = slot.or(v);
                    }
                } else if p.reading.sample.values.get(m).is_none() {
                    // the first series wins (dcgm-exporter repeats a GPU's value per pod)
                    p.reading.sample.values.set(m, v);
                }
            }
            Family::Xid => {
                let code = value
                    .ok()
                    .filter(|v| v.is_finite() && *v >= 0.0 && v.fract() == 0.0 && *v < 1e15);
                let Some(code) = code else {
                    ctx.malformed_cell(col, || {
                        format!("XID value {} is not an XID code", crate::trace::quoted(raw))
                    });
                    return Ok(());
                };
                #[expect(
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss,
                    reason = "a whole number in 0..1e15"
                )]
                let code = code as u64;
                let last = self.last_xid.get(&id).copied();
                // A GPU's first value is where it stands, no event (dcgm-exporter writes its
                // last XID since the exporter started, 0 when none) — unless the GPU had
                // readings before without one: gpuwatch's page has the family only from a GPU's
                // first XID on, so the value before was none.
                let before = last.or_else(|| {
                    self.first_ms
                        .get(&id)
                        .is_some_and(|t| *t < time.0)
                        .then_some(0)
                });
                let p = self.reading(&s, id.clone(), time)?;
                if before.is_some_and(|b| code != 0 && b != code) {
                    p.reading.xids.push(code);
                }
                if last.is_some() || self.last_xid.len() < MAX_PENDING {
                    self.last_xid.insert(id, code);
                }
            }
            Family::Lost => {
                let p = self.reading(&s, id, time)?;
                // 1 is also a stalled GPU's, which may have values left: not lost
                let no_values = p.reading.sample.values.iter().all(|v| v.is_none());
                if value.is_ok_and(|v| v == 1.0) && no_values {
                    p.reading.sample.state = DeviceState::Lost;
                }
            }
            Family::MigInfo => {
                let p = self.reading(&s, id, time)?;
                if let Some(gi) = gi {
                    let ci = s.text("gpu_ci_id").parse().ok();
                    let at = mig_device(p, gi, ci)?;
                    let mig = &mut p.mig[at];
                    // the first line of a MIG device names it
                    let mig_uuid = s.text("mig_uuid");
                    if mig.uuid.is_none() && !mig_uuid.is_empty() {
                        mig.uuid = Some(mig_uuid.to_string());
                    }
                    if mig.profile.is_none() {
                        mig.profile = profile(s.text("gpu_i_profile"));
                    }
                }
            }
        }
        Ok(())
    }

    fn settled(&mut self, out: &mut Vec<Item>) {
        out.append(&mut self.ready);
    }

    fn finish(&mut self, ctx: &Ctx, out: &mut Vec<Item>) {
        self.end_scrape();
        self.emit(|_| true);
        out.append(&mut self.ready);
        if self.ignored > 0 {
            let families = self.ignored_families.len();
            let more = if families > self.ignored_names.len() {
                ", …"
            } else {
                ""
            };
            ctx.note(format!(
                "{} sample(s) of {families}{} famil{} gpuwatch does not read ignored ({}{more})",
                self.ignored,
                if families >= MAX_IGNORED { "+" } else { "" },
                if families == 1 { "y" } else { "ies" },
                self.ignored_names.join(", ")
            ));
        }
        if self.late > 0 {
            ctx.note(format!(
                "{} sample(s) dropped: they came after the readings of their time had gone out (a file written series by series, as Prometheus's dump or `gpuwatch export` write it, keeps at most {MAX_PENDING} GPU readings open; import a shorter stretch, or scrapes)",
                self.late
            ));
        }
        if self.mig_other > 0 {
            ctx.note(format!(
                "{} sample(s) of MIG devices other than their framebuffer and profiling activities skipped (a snapshot keeps no other values of a MIG device)",
                self.mig_other
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::import::{ImportOptions, Imported, Importer};

    const LABELS: &str = r#"UUID="GPU-5f0a1c2e-0000-4000-8000-00000000000@",pci_bus_id="00000000:18:00.0",device="nvidia@",modelName="NVIDIA H100 80GB HBM3",Hostname="node1",container="",namespace="",pod="""#;

    /// dcgm-exporter's labels of GPU `g`.
    fn labels(g: u32) -> String {
        format!("gpu=\"{g}\",{}", LABELS.replace('@', &g.to_string()))
    }

    /// One dcgm-exporter scrape of 2 GPUs.
    fn scrape(sm: [&str; 2], util: [u32; 2], xid: [u32; 2]) -> String {
        let mut s = String::new();
        for (name, help, kind, vals) in [
            (
                "DCGM_FI_DEV_GPU_UTIL",
                "GPU utilization (in %).",
                "gauge",
                util.map(|u| u.to_string()),
            ),
            (
                "DCGM_FI_DEV_FB_USED",
                "Framebuffer memory used (in MiB).",
                "gauge",
                ["1024".into(), "40960".into()],
            ),
            (
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                "Total energy consumption since boot (in mJ).",
                "counter",
                ["12500".into(), "1e+09".into()],
            ),
            (
                "DCGM_FI_DEV_XID_ERRORS",
                "Value of the last XID error encountered.",
                "gauge",
                xid.map(|x| x.to_string()),
            ),
            (
                "DCGM_FI_PROF_SM_ACTIVE",
                "The ratio of cycles an SM has at least 1 warp assigned.",
                "gauge",
                sm.map(str::to_string),
            ),
            (
                "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
                "vGPU License status",
                "gauge",
                ["0".into(), "0".into()],
            ),
        ] {
            s.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            for (g, v) in vals.iter().enumerate() {
                s.push_str(&format!("{name}{{{}}} {v}\n", labels(g as u32)));
            }
        }
        s
    }

    const T0: i64 = 1_780_000_000_000;

    fn opts(t0: bool) -> ImportOptions {
        ImportOptions {
            t0_ms: t0.then_some(T0),
            ..ImportOptions::default()
        }
    }

    /// The ticks of `text` and the end-of-import warnings, or the error.
    fn import(text: &str, opts: &ImportOptions) -> anyhow::Result<(Vec<Imported>, Vec<String>)> {
        let lines = crate::import::input::Lines::from_reader(Box::new(std::io::Cursor::new(
            text.as_bytes().to_vec(),
        )))?;
        let imp = Importer::from_lines(lines, "s.txt", opts)?;
        assert_eq!(imp.format(), crate::import::Format::DcgmExporter);
        let stats = imp.stats();
        let ticks = imp.collect::<anyhow::Result<Vec<_>>>()?;
        Ok((ticks, stats.warnings("s.txt")))
    }

    fn value(t: &Imported, gpu: u32, m: Metric) -> Option<f64> {
        t.snapshot
            .gpus
            .iter()
            .find(|g| g.id.index == gpu)
            .and_then(|g| g.get(m))
    }

    #[test]
    fn recognises_dcgm_families_only() {
        assert!(recognises(
            "# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz)."
        ));
        assert!(recognises("# TYPE DCGM_FI_PROF_SM_ACTIVE gauge"));
        assert!(recognises(r#"DCGM_FI_DEV_GPU_UTIL{gpu="0"} 12"#));
        assert!(recognises("DCGM_FI_DEV_GPU_UTIL 12"));
        assert!(recognises(
            r#"{__name__="DCGM_FI_DEV_GPU_UTIL", gpu="0"} 12 1780000000000"#
        ));
        assert!(!recognises("# HELP go_goroutines Number of goroutines."));
        assert!(!recognises("DCGM_FI_DEV_GPU_UTILX"));
        assert!(!recognises("# gpu    pwr  gtemp"));
        assert!(!recognises("#Entity   GRACT"));
    }

    #[test]
    fn sample_lines_labels_escapes_and_columns() {
        let s =
            parse_sample(r#"m{a="x\"y\\z\nw", b = "" ,} -1.5e3 1780000000000"#).expect("parses");
        assert_eq!(s.name, "m");
        assert_eq!(s.labels[0].1, "x\"y\\z\nw");
        assert_eq!(s.col(s.labels[0].2), 6, "column of the value");
        assert_eq!(s.text("b"), "");
        assert_eq!(s.value, "-1.5e3");
        assert_eq!(s.stamp.map(|t| t.0), Some("1780000000000"));
        // an OpenMetrics exemplar after the value
        let s = parse_sample(r#"m_total{a="b"} 3 # {trace_id="1"} 1"#).expect("parses");
        assert_eq!((s.value, s.stamp.is_none()), ("3", true));
        // Prometheus's dump form
        let s = parse_sample(r#"{__name__="DCGM_FI_DEV_GPU_UTIL", gpu="0"} 87 1780000000000"#)
            .expect("parses");
        assert_eq!(
            (s.name.as_ref(), s.text("gpu")),
            ("DCGM_FI_DEV_GPU_UTIL", "0")
        );
        // where it stops making sense, by byte offset
        for (line, at, why) in [
            (r#"m{a="b} 1"#, 4, "no closing"),
            (r#"m{a "b"} 1"#, 4, "expected `=`"),
            (r#"m{a="b" c="d"} 1"#, 8, "expected `,` or `}`"),
            (r#"m{a="b"}"#, 8, "without a value"),
            (r#"m{a="b"}1"#, 8, "space before"),
            ("m 1 2 3", 6, "after the timestamp"),
            ("9m 1", 0, "digit"),
            (r#"{a="b"} 1"#, 0, "without a metric name"),
            ("\"m\" 1", 0, "expected a metric name"),
        ] {
            let (got, msg) = parse_sample(line).expect_err(line);
            assert_eq!(got, at, "{line}: {msg}");
            assert!(msg.contains(why), "{line}: {msg}");
        }
        // columns count characters, not bytes
        let s = parse_sample("m{a=\"é€\",b=\"x\"} 1 1780000000000").expect("parses");
        assert_eq!(s.col(s.label("b").expect("b").1), 13);
        assert_eq!(s.col(s.value_at), 17);
        assert_eq!(s.stamp.map(|(_, at)| s.col(at)), Some(19));
        let long = format!("m{{a=\"{}\"}} 1", "x".repeat(MAX_LABEL + 1));
        assert!(parse_sample(&long)
            .expect_err("too long")
            .1
            .contains("longer than"));
        let many: Vec<String> = (0..=MAX_LABELS).map(|i| format!("l{i}=\"\"")).collect();
        let many = format!("m{{{}}} 1", many.join(","));
        assert!(parse_sample(&many)
            .expect_err("too many")
            .1
            .contains("labels"));
    }

    /// The exporter's conversion inverted exactly: a ratio of 0.57 is 57 %, not
    /// 56.99999999999999.
    #[test]
    fn units_invert_the_exporters() {
        let conv = |m: Metric, raw: &str| {
            let (_, mul, div) = m.desc().dcgm_unit().expect("a DCGM name");
            from_dcgm(raw, raw.parse().expect("number"), mul, div)
        };
        assert_eq!(conv(Metric::SmActive, "0.57"), 57.0);
        assert_eq!(conv(Metric::SmActive, "1.07e-1"), 10.7);
        assert_eq!(conv(Metric::TensorActive, "0.003"), 0.3);
        assert_eq!(conv(Metric::Energy, "12500"), 12.5);
        assert_eq!(conv(Metric::MemUsed, "2048.5"), 2048.5 * 1_048_576.0);
        assert_eq!(conv(Metric::NvlinkBandwidth, "1500"), 1.5e9);
        assert_eq!(conv(Metric::Util, "87"), 87.0);
        assert_eq!(conv(Metric::PcieTxBytes, "81234567"), 81_234_567.0);
        assert!(conv(Metric::SmActive, "NaN").is_nan());
        // a hostile exponent overflows no i32: the value as read, converted
        assert_eq!(conv(Metric::SmActive, "0e2147483647"), 0.0);
        assert_eq!(conv(Metric::SmActive, "0e2147483646"), 0.0);
        assert_eq!(conv(Metric::Energy, "0e-2147483647"), 0.0);
        assert_eq!(conv(Metric::Energy, "0E-2147483648"), 0.0);
        assert!(family("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE").is_some());
        assert_eq!(family("DCGM_FI_DEV_VGPU_LICENSE_STATUS"), None);
        // every dcgm name of the table reads back as its metric
        for d in METRICS {
            if let Some(name) = d.dcgm {
                assert!(
                    matches!(family(name), Some(Family::Metric(m, ..)) if m == d.id),
                    "{name}"
                );
            }
        }
    }

    /// Scrapes without timestamps: scrape k at --t0 + k × --every; identity from the labels;
    /// units converted; the XID gauge an event when it changes; unknown families counted.
    #[test]
    fn untimed_scrapes_are_ticks() {
        let mut text = String::new();
        let sms = [["0.123", "0.5"], ["0.2", "0.25"], ["0.3", "NaN"]];
        let xids = [[0, 0], [79, 0], [79, 31]];
        for k in 0..3 {
            text.push_str(&scrape(sms[k], [100, 90 + k as u32], xids[k]));
        }
        let (ticks, warnings) = import(&text, &opts(true)).expect("imports");
        assert_eq!(ticks.len(), 3, "{ticks:?}");
        for (k, t) in ticks.iter().enumerate() {
            assert_eq!(t.snapshot.time_ms, T0 + 1000 * k as i64);
            assert_eq!(t.snapshot.gpus.len(), 2);
        }
        let t = &ticks[0];
        let g = &t.snapshot.gpus[1];
        assert_eq!(g.id.uuid, "GPU-5f0a1c2e-0000-4000-8000-000000000001");
        assert_eq!(g.id.name, "NVIDIA H100 80GB HBM3");
        assert_eq!(g.id.pci_bus_id, "00000000:18:00.0");
        assert_eq!(g.id.minor, Some(1));
        assert_eq!(value(t, 0, Metric::SmActive), Some(12.3));
        assert_eq!(value(t, 1, Metric::SmActive), Some(50.0));
        assert_eq!(value(t, 0, Metric::MemUsed), Some(1_073_741_824.0));
        assert_eq!(value(t, 0, Metric::Energy), Some(12.5));
        assert_eq!(value(t, 1, Metric::Energy), Some(1e6));
        assert_eq!(value(&ticks[2], 1, Metric::Util), Some(92.0));
        // NaN is no reading
        assert_eq!(value(&ticks[2], 1, Metric::SmActive), None);
        assert!(
            warnings.iter().any(|w| w.contains("1 malformed cell")),
            "{warnings:?}"
        );
        let xid: Vec<(i64, u32, u64)> = ticks
            .iter()
            .flat_map(|t| t.snapshot.xids.iter())
            .map(|x| (x.time_ms - T0, x.gpu_index, x.xid))
            .collect();
        assert_eq!(xid, [(1000, 0, 79), (2000, 1, 31)]);
        assert!(
            warnings.iter().any(|w| w.contains(
                "6 sample(s) of 1 family gpuwatch does not read ignored (DCGM_FI_DEV_VGPU_LICENSE_STATUS)"
            )),
            "{warnings:?}"
        );
        // --every spaces them
        let every = ImportOptions {
            every_ms: 15_000,
            ..opts(true)
        };
        let (ticks, _) = import(&text, &every).expect("imports");
        assert_eq!(ticks[2].snapshot.time_ms, T0 + 30_000);
    }

    /// A GPU's first XID value is a baseline: an XID from before the scrapes is no event. A
    /// GPU seen before without the family (gpuwatch's page writes it from the first XID on)
    /// has an event at its first value.
    #[test]
    fn the_first_xid_value_is_a_baseline() {
        let mut text = String::new();
        for xid in [[79, 0], [79, 0], [31, 0]] {
            text.push_str(&scrape(["0.1", "0.1"], [1, 1], xid));
        }
        // gpuwatch's page: GPU 1 without the family in the first scrapes
        text.push_str(&scrape(["0.1", "0.1"], [1, 1], [31, 0]).replace(
            &format!("DCGM_FI_DEV_XID_ERRORS{{{}}} 0\n", labels(1)),
            &format!("DCGM_FI_DEV_XID_ERRORS{{{}}} 48\n", labels(1)),
        ));
        let (ticks, _) = import(&text, &opts(true)).expect("imports");
        let xid: Vec<(i64, u32, u64)> = ticks
            .iter()
            .flat_map(|t| t.snapshot.xids.iter())
            .map(|x| (x.time_ms - T0, x.gpu_index, x.xid))
            .collect();
        assert_eq!(xid, [(2000, 0, 31), (3000, 1, 48)]);
        let first_seen = format!(
            "DCGM_FI_DEV_GPU_UTIL{{{g}}} 5\n# EOF\nDCGM_FI_DEV_GPU_UTIL{{{g}}} 5\nDCGM_FI_DEV_XID_ERRORS{{{g}}} 79\n# EOF\n",
            g = labels(0)
        );
        let (ticks, _) = import(&first_seen, &opts(true)).expect("imports");
        let xid: Vec<u64> = ticks
            .iter()
            .flat_map(|t| t.snapshot.xids.iter().map(|x| x.xid))
            .collect();
        assert_eq!(xid, [79], "seen before without one: an event");
    }

    /// A family name from `{__name__="…"}` reaches the warning with its control characters
    /// escaped (no forged log lines, no terminal escapes).
    #[test]
    fn ignored_family_names_are_escaped() {
        let text = format!(
            "DCGM_FI_DEV_GPU_UTIL{{{g}}} 5\n{{__name__=\"evil\\nwarning: forged\u{1b}[2J\",gpu=\"0\"}} 1\n",
            g = labels(0)
        );
        let (_, warnings) = import(&text, &opts(true)).expect("imports");
        let w = warnings.join("\n");
        assert!(w.contains("(evil\\nwarning: forged\\u{1b}[2J)"), "{w}");
        assert!(
            !w.contains('\u{1b}') && !w.contains("\nwarning: forged"),
            "{w}"
        );
    }

    /// Without timestamps and without --t0 the times cannot be known: the import ends, naming
    /// the line and the options.
    #[test]
    fn untimed_without_t0_says_what_to_pass() {
        let text = scrape(["0.1", "0.1"], [1, 1], [0, 0]);
        let e = import(&text, &opts(false))
            .expect_err("no times")
            .to_string();
        assert!(e.starts_with("s.txt:3:1: "), "{e}");
        assert!(e.contains("--t0") && e.contains("--every"), "{e}");
    }

    /// Scrapes with timestamps (ms in Prometheus's text, seconds in OpenMetrics, series by
    /// series as Prometheus's dump writes them) need no --t0.
    #[test]
    fn timestamps_are_the_time() {
        let mut text = String::new();
        for k in 0..3 {
            for g in 0..2 {
                text.push_str(&format!(
                    "DCGM_FI_DEV_GPU_UTIL{{{}}} {} {}\n",
                    labels(g),
                    50 + k,
                    T0 + 5000 * i64::from(k)
                ));
            }
            text.push_str("# EOF\n");
        }
        let (ticks, _) = import(&text, &opts(false)).expect("imports");
        let times: Vec<i64> = ticks.iter().map(|t| t.snapshot.time_ms - T0).collect();
        assert_eq!(times, [0, 5000, 10_000]);
        assert_eq!(value(&ticks[2], 1, Metric::Util), Some(52.0));
        // OpenMetrics seconds
        let om = format!(
            "DCGM_FI_DEV_GPU_UTIL{{gpu=\"0\"}} 7 {}.250\n# EOF\n",
            T0 / 1000
        );
        let (ticks, _) = import(&om, &opts(false)).expect("imports");
        assert_eq!(ticks[0].snapshot.time_ms, T0 + 250);
        // the dump: one series over time, then the next
        let mut dump = String::new();
        for (name, v) in [
            ("DCGM_FI_DEV_GPU_UTIL", "90"),
            ("DCGM_FI_PROF_SM_ACTIVE", "0.1"),
        ] {
            for g in 0..2 {
                for k in 0..4 {
                    dump.push_str(&format!(
                        "{{__name__=\"{name}\", gpu=\"{g}\", Hostname=\"n\"}} {v} {}\n",
                        T0 + 1000 * k
                    ));
                }
            }
        }
        let (ticks, warnings) = import(&dump, &opts(false)).expect("imports");
        assert_eq!(ticks.len(), 4, "{warnings:?}");
        for t in &ticks {
            for g in 0..2 {
                assert_eq!(value(t, g, Metric::Util), Some(90.0));
                assert_eq!(value(t, g, Metric::SmActive), Some(10.0));
            }
        }
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    /// A file written series by series longer than the readings kept open: what cannot be
    /// placed any more is dropped and said, never mixed into other times.
    #[test]
    fn long_series_by_series_files_drop_what_comes_too_late() {
        let times = MAX_PENDING as i64;
        let mut dump = String::new();
        for (name, v) in [
            ("DCGM_FI_DEV_GPU_UTIL", "90"),
            ("DCGM_FI_DEV_GPU_TEMP", "50"),
        ] {
            for g in 0..2 {
                for k in 0..times {
                    dump.push_str(&format!(
                        "{{__name__=\"{name}\",gpu=\"{g}\"}} {v} {}\n",
                        T0 + 1000 * k
                    ));
                }
            }
        }
        let (ticks, warnings) = import(&dump, &opts(false)).expect("imports");
        assert_eq!(ticks.len(), times as usize, "{warnings:?}");
        // the first series is whole, the later ones from where they could still join
        assert!(ticks
            .iter()
            .all(|t| value(t, 0, Metric::Util) == Some(90.0)));
        let with = |g: u32, m: Metric| ticks.iter().filter(|t| value(t, g, m).is_some()).count();
        for (g, m) in [(1, Metric::Util), (0, Metric::Temp), (1, Metric::Temp)] {
            let n = with(g, m);
            assert!(n > 0 && n < ticks.len(), "{g} {m:?}: {n}");
        }
        for w in ticks.windows(2) {
            assert!(w[0].snapshot.time_ms < w[1].snapshot.time_ms);
        }
        let w = warnings.join("\n");
        assert!(
            w.contains("sample(s) dropped") && w.contains("series by series"),
            "{w}"
        );
        assert!(!w.contains("duplicate") && !w.contains("segment"), "{w}");
    }

    /// A MIG device's series go to its MIG device (memory, profiling), never into its GPU's
    /// values; its other series are counted.
    #[test]
    fn mig_series_are_mig_devices() {
        let gpu = labels(0);
        let mig = |gi: u32, prof: &str| {
            gpu.replace(
                "modelName=\"NVIDIA H100 80GB HBM3\",",
                &format!(
                    "modelName=\"NVIDIA H100 80GB HBM3\",GPU_I_PROFILE=\"{prof}\",GPU_I_ID=\"{gi}\","
                ),
            )
        };
        let mut text = String::new();
        for _ in 0..2 {
            text.push_str(&format!(
                "# HELP DCGM_FI_DEV_GPU_TEMP t\nDCGM_FI_DEV_GPU_TEMP{{{gpu}}} 41\n\
                 DCGM_FI_DEV_FB_USED{{{}}} 2048\nDCGM_FI_DEV_FB_FREE{{{}}} 7680\n\
                 DCGM_FI_DEV_FB_USED{{{}}} 512\nDCGM_FI_DEV_FB_TOTAL{{{}}} 39936\n\
                 DCGM_FI_PROF_SM_ACTIVE{{{}}} 0.75\nDCGM_FI_DEV_GPU_UTIL{{{}}} 99\n",
                mig(9, "1g.10gb"),
                mig(9, "1g.10gb"),
                mig(2, "3g.40gb"),
                mig(2, "3g.40gb"),
                mig(9, "1g.10gb"),
                mig(9, "bad profile\\\""),
            ));
        }
        let (ticks, warnings) = import(&text, &opts(true)).expect("imports");
        assert_eq!(ticks.len(), 2);
        let s = &ticks[1].snapshot;
        assert_eq!(s.gpus.len(), 1);
        assert_eq!(value(&ticks[1], 0, Metric::Temp), Some(41.0));
        for m in [Metric::MemUsed, Metric::SmActive, Metric::Util] {
            assert_eq!(value(&ticks[1], 0, m), None, "{m:?} not the GPU's");
        }
        assert_eq!(s.mig.len(), 2);
        let (a, b) = (&s.mig[0], &s.mig[1]);
        assert_eq!(
            (a.gpu_instance_id, a.index, a.profile.as_deref()),
            (2, 0, Some("3g.40gb"))
        );
        assert_eq!(a.mem_used_bytes, Some(512 << 20));
        assert_eq!(a.mem_total_bytes, Some(39936 << 20));
        assert_eq!(b.gpu_instance_id, 9);
        assert_eq!(b.mem_total_bytes, Some((2048 + 7680) << 20), "used + free");
        assert_eq!(b.gpm.get(Metric::SmActive), Some(75.0));
        assert_eq!(b.gpu_uuid, s.gpus[0].id.uuid);
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("2 sample(s) of MIG devices")),
            "{warnings:?}"
        );
    }

    /// Damaged lines are skipped with their column; one that starts the next scrape does not
    /// take the scrape before it along; a GPU seen with two UUIDs in one scrape is refused.
    #[test]
    fn malformed_lines_are_skipped_and_located() {
        let one = scrape(["0.1", "0.2"], [10, 20], [0, 0]);
        let bad_first = one.replacen(
            "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"",
            "DCGM_FI_DEV_GPU_UTIL{gpu=\"zero\"",
            1,
        );
        // the second scrape (no HELP lines) opens with a sample of a series seen before, with
        // a bad timestamp: it ends the first scrape, and is skipped
        let second: String =
            one.lines()
                .filter(|l| !l.starts_with('#'))
                .fold(String::new(), |mut s, l| {
                    let first = s.is_empty();
                    s.push_str(l);
                    s.push_str(if first { " bad\n" } else { "\n" });
                    s
                });
        let text = format!(
            "{one}{second}DCGM_FI_DEV_GPU_UTIL{{gpu=\"1\",UUID=\"GPU-other\"}} 5\n{bad_first}DCGM_FI_DEV_GPU_UTIL{{gpu=\"0\",UUID=\"GPU-\n"
        );
        let (ticks, warnings) = import(&text, &opts(true)).expect("imports");
        assert_eq!(ticks.len(), 3, "{warnings:?}");
        assert_eq!(value(&ticks[0], 0, Metric::Util), Some(10.0));
        assert_eq!(value(&ticks[1], 0, Metric::Util), None);
        assert_eq!(value(&ticks[1], 1, Metric::Util), Some(20.0));
        assert_eq!(value(&ticks[2], 0, Metric::Util), None);
        let w = warnings.join("\n");
        assert!(w.contains("skipped 4 malformed lines"), "{w}");
        let col = second.find(" bad").expect("bad") + 2;
        assert!(
            w.contains(&format!("column {col}: bad timestamp \"bad\"")),
            "{w}"
        );
    }

    /// gpuwatch's own /metrics reads back as the snapshot it showed: values, identity, a lost
    /// GPU, MIG devices.
    #[test]
    fn gpuwatch_pages_round_trip() {
        use crate::model::{DeviceId, GpuSample, MetricValues, Snapshot};
        let mut values = MetricValues::default();
        for (i, d) in METRICS.iter().enumerate() {
            if d.dcgm.is_some() {
                let v = match d.unit {
                    "percent" => 0.5 + i as f64,
                    "bool" => 1.0,
                    "bytes" => 123_456_789_012.0,
                    _ => 1.25 * i as f64,
                };
                values.set(d.id, Some(v));
            }
        }
        let gpu = |index: u32, state| GpuSample {
            time_ms: T0,
            id: DeviceId {
                index,
                minor: Some(index + 4),
                uuid: format!("GPU-{index}"),
                pci_bus_id: format!("00000000:{index:02}:00.0"),
                name: "NVIDIA \"H100\"\\x".into(),
            },
            state,
            values: if state == DeviceState::Ok {
                values.clone()
            } else {
                MetricValues::default()
            },
        };
        let mut mig = MigSample::one_g(0, 0);
        mig.uuid = "MIG-abc".into();
        mig.compute_instance_id = 1;
        mig.mem_used_bytes = Some(5 << 30);
        mig.mem_total_bytes = Some(10 << 30);
        let snap = Snapshot {
            time_ms: T0,
            gpus: vec![gpu(0, DeviceState::Ok), gpu(1, DeviceState::Lost)],
            mig: vec![mig.clone()],
            ..Snapshot::default()
        };
        let mut state = crate::exporter::ExportState {
            hostname: "node".into(),
            ..Default::default()
        };
        state.take_snapshot(&snap);
        let page = crate::exporter::render(&state, false);
        let text = format!("{page}{page}");
        let (ticks, _) = import(&text, &opts(true)).expect("imports");
        assert_eq!(ticks.len(), 2);
        let back = &ticks[1].snapshot;
        let g = &back.gpus[0];
        assert_eq!(g.id, snap.gpus[0].id);
        for d in METRICS.iter().filter(|d| d.dcgm.is_some()) {
            assert_eq!(g.get(d.id), snap.gpus[0].get(d.id), "{}", d.key);
        }
        assert_eq!(back.gpus[1].state, DeviceState::Lost);
        assert_eq!(back.mig.len(), 1);
        let m = &back.mig[0];
        assert_eq!(
            (m.uuid.as_str(), m.compute_instance_id, m.profile.as_deref()),
            ("MIG-abc", 1, Some("1g.10gb"))
        );
        assert_eq!(
            (m.mem_used_bytes, m.mem_total_bytes),
            (mig.mem_used_bytes, mig.mem_total_bytes)
        );
    }

    /// A GPU instance with two compute instances: its framebuffer series (once, naming the GPU
    /// instance) go to both MIG devices, and each `gpuwatch_mig_device_info` line to its own
    /// compute instance's, whichever comes first; a second line for one MIG device does not
    /// change who it is.
    #[test]
    fn compute_instances_of_one_gpu_instance_keep_their_identity() {
        use crate::model::{DeviceId, GpuSample, Snapshot};
        let ci = |ci: u32, uuid: &str| MigSample {
            uuid: uuid.into(),
            compute_instance_id: ci,
            mem_used_bytes: Some(3 << 30),
            mem_total_bytes: Some(10 << 30),
            ..MigSample::one_g(0, ci)
        };
        let mut a = ci(0, "MIG-a");
        a.gpu_instance_id = 7;
        let mut b = ci(1, "MIG-b");
        b.gpu_instance_id = 7;
        let snap = Snapshot {
            time_ms: T0,
            gpus: vec![GpuSample {
                time_ms: T0,
                id: DeviceId {
                    index: 0,
                    uuid: "GPU-0".into(),
                    name: "NVIDIA H100 80GB HBM3".into(),
                    ..DeviceId::default()
                },
                state: DeviceState::Ok,
                values: crate::model::MetricValues::default(),
            }],
            mig: vec![a, b],
            ..Snapshot::default()
        };
        let mut state = crate::exporter::ExportState {
            hostname: "node".into(),
            ..Default::default()
        };
        state.take_snapshot(&snap);
        let page = crate::exporter::render(&state, false);
        assert_eq!(page.matches("DCGM_FI_DEV_FB_USED{").count(), 1, "{page}");
        // as written, then with the identity lines first (a dump sorted otherwise) and one
        // of them again with another UUID
        let (info, rest): (Vec<&str>, Vec<&str>) = page
            .lines()
            .partition(|l| l.starts_with("gpuwatch_mig_device_info{"));
        let again = info[0].replace("MIG-a", "MIG-z");
        let reordered = format!("{}\n{again}\n{}\n", info.join("\n"), rest.join("\n"));
        for text in [page.clone(), reordered] {
            let (ticks, warnings) = import(&text, &opts(true)).expect("imports");
            assert_eq!(ticks.len(), 1, "{warnings:?}");
            let got: Vec<_> = ticks[0]
                .snapshot
                .mig
                .iter()
                .map(|m| {
                    (
                        m.gpu_instance_id,
                        m.compute_instance_id,
                        m.uuid.as_str(),
                        m.mem_used_bytes,
                        m.mem_total_bytes,
                    )
                })
                .collect();
            assert_eq!(
                got,
                [
                    (7, 0, "MIG-a", Some(3_u64 << 30), Some(10_u64 << 30)),
                    (7, 1, "MIG-b", Some(3_u64 << 30), Some(10_u64 << 30))
                ],
                "{text}"
            );
        }
    }

    /// One scrape holds at most MAX_GPUS GPUs: the rest are skipped lines.
    #[test]
    fn gpus_per_scrape_are_bounded() {
        let mut text = String::new();
        for g in 0..MAX_GPUS + 3 {
            text.push_str(&format!("DCGM_FI_DEV_GPU_UTIL{{gpu=\"{g}\"}} 1\n"));
        }
        let (ticks, warnings) = import(&text, &opts(true)).expect("imports");
        assert_eq!(ticks[0].snapshot.gpus.len(), MAX_GPUS);
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("skipped 3 malformed lines")),
            "{warnings:?}"
        );
    }
}
