//! The `gpu` object: one GPU's identity, state, processes and metric series (`gpu.util`), with
//! the window functions as by-value methods.
//!
//! **Inputs.** The script API reads a GPU's history only through [`View::get`] with an
//! [`Input`] (a window aggregate, the newest fresh value, the process list, …). While an
//! evaluation is traced ([`start_trace`] / [`finish_trace`]) every input it read is recorded with
//! the value it got. A GPU-scope check is a function of those inputs alone — captured variables
//! are read-only, there is no clock and no randomness, and `print`/`debug` make a trace opaque —
//! so when every recorded input still has the same value at a later evaluation
//! ([`Trace::holds`]), the check would return the same result and the engine can reuse it.

use std::cell::RefCell;
use std::sync::Arc;

use rhai::{Array, Dynamic, Engine, ImmutableString, Map};

use super::{duration_ms, nodata, num_arg, number, RhaiResult};
use crate::model::nvlink::NvlinkView;
use crate::model::{
    clock_event_mask, DeviceId, DeviceState, Metric, MigSample, NvmlFunction, ProcSample, XidNote,
    METRICS,
};
use crate::window::{Agg, GpuHistory, RunStats};

/// Something a check can read from one GPU's history at the evaluation time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// `series.fn(duration, arg)`: metric, function, duration (ms), argument bits.
    Agg(Metric, Agg, i64, u64),
    /// `series.last()`: the newest value if fresh (at most 3 sampling intervals, ≥ 5 s old).
    Fresh(Metric),
    /// `series.age()`: seconds since the newest value.
    Age(Metric),
    /// Whether the metric has any sample (`series.supported`; also what tells "no data" from
    /// "not supported").
    Supported(Metric),
    /// `gpu.index` (an input of its own: the most read, and an integer to compare).
    Index,
    /// `gpu.uuid`, `name`, `pci_bus_id`.
    Device,
    /// `gpu.lost`.
    Lost,
    /// `gpu.stalled`, `gpu.stalled_call`: the NVML function the GPU is blocked in, if any.
    Stalled,
    /// `gpu.processes`.
    Processes,
    /// `gpu.process_count` (a check that reads only the count holds while it is the same, not
    /// while every process keeps its runtime).
    ProcessCount,
    /// `gpu.mig`: the MIG devices of a GPU with MIG on.
    Mig,
    /// `gpu.nvlinks`: the GPU's NVLinks as last read.
    Nvlinks,
    /// `gpu.interval`: the observed sampling interval, ms.
    Interval,
    /// `gpu.xids(duration)`: distinct XID codes within the duration (ms).
    Xids(i64),
    /// `gpu.xid_events(duration)`: the XID events within the duration (ms), with their
    /// process and ledger counts.
    XidEvents(i64),
    /// `series.idle_runs(duration, threshold)`: duration (ms), threshold bits.
    Runs(Metric, i64, u64),
    /// `series.maxima(duration, n)`.
    Maxima(Metric, i64, usize),
}

/// What an [`Input`] read.
#[derive(Debug, Clone)]
pub enum Value {
    /// A number, or none (no data).
    Num(Option<f64>),
    /// A yes/no.
    Flag(bool),
    /// An integer.
    Int(i64),
    /// The device identity.
    Device(DeviceId),
    /// The process list.
    Procs(Vec<ProcSample>),
    /// The MIG devices.
    Mig(Vec<MigSample>),
    /// The NVLinks as last read (none without NVLink or a fresh reading).
    Nvlinks(Option<Arc<NvlinkView>>),
    /// XID codes.
    Codes(Vec<u64>),
    /// Idle-run statistics.
    Runs(Option<RunStats>),
    /// Several numbers, or none.
    Nums(Option<Vec<f64>>),
    /// A fixed name, or none.
    Name(Option<&'static str>),
    /// XID events.
    Notes(Vec<XidNote>),
}

fn same_f64(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits()
}

fn same_opt(a: Option<f64>, b: Option<f64>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => same_f64(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// Equality with floats compared bit for bit, so "the same value" means the script could not
/// tell the difference (0.0 and -0.0 differ, a NaN equals itself).
impl PartialEq for Value {
    fn eq(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::Num(a), Value::Num(b)) => same_opt(*a, *b),
            (Value::Flag(a), Value::Flag(b)) => a == b,
            (Value::Int(a), Value::Int(b)) => a == b,
            (Value::Device(a), Value::Device(b)) => a == b,
            (Value::Procs(a), Value::Procs(b)) => same_procs(a, b),
            (Value::Codes(a), Value::Codes(b)) => a == b,
            (Value::Mig(a), Value::Mig(b)) => a == b,
            (Value::Nvlinks(a), Value::Nvlinks(b)) => match (a, b) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
                (None, None) => true,
                _ => false,
            },
            (Value::Name(a), Value::Name(b)) => a == b,
            (Value::Notes(a), Value::Notes(b)) => a == b,
            (Value::Runs(a), Value::Runs(b)) => match (a, b) {
                (Some(a), Some(b)) => {
                    a.runs == b.runs
                        && same_f64(a.share, b.share)
                        && same_opt(a.period_s, b.period_s)
                        && same_opt(a.period_cv, b.period_cv)
                        && same_f64(a.median_len_s, b.median_len_s)
                }
                (None, None) => true,
                _ => false,
            },
            (Value::Nums(a), Value::Nums(b)) => match (a, b) {
                (Some(a), Some(b)) => {
                    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_f64(*x, *y))
                }
                (None, None) => true,
                _ => false,
            },
            _ => false,
        }
    }
}

impl Input {
    /// Reads this input from `hist` at `now_ms`.
    pub fn eval(self, hist: &GpuHistory, now_ms: i64) -> Value {
        if let Input::Agg(m, _, dur, _) | Input::Runs(m, dur, _) | Input::Maxima(m, dur, _) = self {
            hist.note_asked(m, dur);
        }
        match self {
            Input::Agg(metric, agg, dur, arg) => {
                Value::Num(hist.aggregate(metric, agg, now_ms, dur, f64::from_bits(arg)))
            }
            Input::Fresh(metric) => {
                // Newest value if it is at most 3 sampling intervals (at least 5 s) old.
                let fresh_ms = (hist.interval_ms * 3).max(5000);
                Value::Num(match hist.window(metric).newest() {
                    Some((t, v)) if now_ms - t <= fresh_ms && t <= now_ms => Some(v),
                    _ => None,
                })
            }
            Input::Age(metric) => Value::Num(hist.window(metric).newest().map(|(t, _)| {
                #[expect(clippy::cast_precision_loss, reason = "ms")]
                let age = (now_ms - t) as f64 / 1000.0;
                age
            })),
            Input::Supported(metric) => Value::Flag(hist.has_data(metric)),
            Input::Index => Value::Int(i64::from(hist.id.index)),
            Input::Device => Value::Device(hist.id.clone()),
            Input::Lost => Value::Flag(hist.state == DeviceState::Lost),
            Input::Stalled => Value::Name(hist.state.stalled_in().map(NvmlFunction::symbol)),
            Input::Processes => Value::Procs(hist.processes.clone()),
            Input::ProcessCount => {
                Value::Int(i64::try_from(hist.processes.len()).unwrap_or(i64::MAX))
            }
            Input::Mig => Value::Mig(hist.mig.clone()),
            Input::Nvlinks => Value::Nvlinks(hist.nvlink.clone().filter(|_| !hist.nvlink_stale)),
            Input::Interval => Value::Int(hist.interval_ms),
            Input::Xids(dur) => Value::Codes(hist.xids_in(now_ms, dur)),
            Input::XidEvents(dur) => {
                Value::Notes(hist.xid_notes_in(now_ms, dur).cloned().collect())
            }
            Input::Runs(metric, dur, x) => Value::Runs(hist.window(metric).runs_below(
                now_ms,
                dur,
                f64::from_bits(x),
                hist.interval_ms,
            )),
            Input::Maxima(metric, dur, n) => {
                Value::Nums(hist.window(metric).maxima(now_ms, dur, n, hist.interval_ms))
            }
        }
    }
}

impl Input {
    /// Whether this input still reads `value` from `hist` at `now_ms` (what `eval` would give,
    /// compared in place: no list is copied to be compared).
    fn reads(self, hist: &GpuHistory, now_ms: i64, value: &Value) -> bool {
        match (self, value) {
            (Input::Device, Value::Device(d)) => hist.id == *d,
            (Input::Processes, Value::Procs(p)) => same_procs(&hist.processes, p),
            (Input::Mig, Value::Mig(m)) => hist.mig == *m,
            (Input::XidEvents(dur), Value::Notes(n)) => hist.xid_notes_in(now_ms, dur).eq(n.iter()),
            _ => self.eval(hist, now_ms) == *value,
        }
    }
}

/// Process lists compared as [`Value`]'s equality does.
fn same_procs(a: &[ProcSample], b: &[ProcSample]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(p, q)| p == q && same_opt(p.runtime_s, q.runtime_s))
}

/// The inputs one evaluation read, each with the GPU (index) it read it from and the value it
/// got.
#[derive(Debug, Clone, Default)]
pub struct Trace(Vec<(u32, Input, Value)>);

impl Trace {
    /// Whether every input still reads the same value from `hist` at `now_ms` (an evaluation of
    /// one GPU: every input is that GPU's).
    pub fn holds(&self, hist: &GpuHistory, now_ms: i64) -> bool {
        self.0.iter().all(|(_, i, v)| i.reads(hist, now_ms, v))
    }

    /// Whether every input still reads the same value from its GPU's history (`gpu(index)`) at
    /// `now_ms` (an evaluation that read several GPUs: a host-scope rule).
    pub fn holds_on<'a>(&self, gpu: impl Fn(u32) -> Option<&'a GpuHistory>, now_ms: i64) -> bool {
        self.0
            .iter()
            .all(|(g, i, v)| gpu(*g).is_some_and(|hist| i.reads(hist, now_ms, v)))
    }

    /// The metric the evaluation looked at over the longest window, and that window (ms):
    /// what a chart of the alert shows. `None` when it read no metric series.
    pub fn main_series(&self) -> Option<(Metric, i64)> {
        self.0
            .iter()
            .filter_map(|(_, i, _)| match i {
                Input::Agg(m, _, d, _) => Some((*m, *d)),
                Input::Fresh(m) => Some((*m, 0)),
                _ => None,
            })
            .max_by_key(|(_, d)| *d)
    }

    /// Number of inputs read.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when the evaluation read nothing.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The trace being recorded on this thread: its reads, and whether it became opaque.
struct Recording {
    trace: Trace,
    opaque: bool,
}

thread_local! {
    static RECORDING: RefCell<Option<Recording>> = const { RefCell::new(None) };
}

/// Starts recording the inputs of the evaluation about to run on this thread.
pub(crate) fn start_trace() {
    RECORDING.with(|r| {
        *r.borrow_mut() = Some(Recording {
            trace: Trace::default(),
            opaque: false,
        });
    });
}

/// Stops recording; the trace, unless the evaluation did something a trace cannot replay.
pub(crate) fn finish_trace() -> Option<Trace> {
    RECORDING
        .with(|r| r.borrow_mut().take())
        .filter(|rec| !rec.opaque)
        .map(|rec| rec.trace)
}

/// Marks the evaluation being recorded as not reusable (it had an effect: `print`, `debug`).
pub(crate) fn opaque_trace() {
    RECORDING.with(|r| {
        if let Some(rec) = r.borrow_mut().as_mut() {
            rec.opaque = true;
        }
    });
}

fn record(gpu: u32, input: Input, value: &Value) {
    RECORDING.with(|r| {
        if let Some(rec) = r.borrow_mut().as_mut() {
            if !rec.trace.0.iter().any(|(g, i, _)| *g == gpu && *i == input) {
                rec.trace.0.push((gpu, input, value.clone()));
            }
        }
    });
}

mod view {
    use super::{record, GpuHistory, Input, Value};
    use std::sync::Arc;

    /// A GPU's history at one evaluation time: the script API's only way to read it.
    #[derive(Debug, Clone)]
    pub struct View {
        hist: Arc<GpuHistory>,
        now_ms: i64,
    }

    impl View {
        pub fn new(hist: Arc<GpuHistory>, now_ms: i64) -> Self {
            View { hist, now_ms }
        }

        /// Reads `input` (recording it when the evaluation is traced).
        pub fn get(&self, input: Input) -> Value {
            let v = input.eval(&self.hist, self.now_ms);
            record(self.hist.id.index, input, &v);
            v
        }
    }
}

use view::View;

/// One GPU as a rule sees it (`gpu`).
#[derive(Debug, Clone)]
pub struct GpuHandle {
    view: View,
}

impl GpuHandle {
    /// A handle on `hist` evaluated at `now_ms`.
    pub fn new(hist: Arc<GpuHistory>, now_ms: i64) -> Self {
        GpuHandle {
            view: View::new(hist, now_ms),
        }
    }

    fn num(&self, input: Input) -> Option<f64> {
        match self.view.get(input) {
            Value::Num(v) => v,
            _ => None,
        }
    }

    fn flag(&self, input: Input) -> bool {
        matches!(self.view.get(input), Value::Flag(true))
    }

    fn int(&self, input: Input) -> i64 {
        match self.view.get(input) {
            Value::Int(v) => v,
            _ => 0,
        }
    }

    fn stalled_in(&self) -> Option<&'static str> {
        match self.view.get(Input::Stalled) {
            Value::Name(n) => n,
            _ => None,
        }
    }

    fn device(&self) -> DeviceId {
        match self.view.get(Input::Device) {
            Value::Device(d) => d,
            _ => DeviceId::default(),
        }
    }

    fn processes(&self) -> Vec<ProcSample> {
        match self.view.get(Input::Processes) {
            Value::Procs(p) => p,
            _ => Vec::new(),
        }
    }

    fn mig(&self) -> Vec<MigSample> {
        match self.view.get(Input::Mig) {
            Value::Mig(m) => m,
            _ => Vec::new(),
        }
    }

    fn nvlinks(&self) -> Option<Arc<NvlinkView>> {
        match self.view.get(Input::Nvlinks) {
            Value::Nvlinks(v) => v,
            _ => None,
        }
    }

    fn series(&self, metric: Metric) -> Series {
        Series {
            gpu: self.clone(),
            metric,
        }
    }
}

/// One metric of one GPU (`gpu.util`), with the window functions as methods.
#[derive(Debug, Clone)]
pub struct Series {
    gpu: GpuHandle,
    metric: Metric,
}

impl Series {
    /// `()` for a missing result; the evaluation counts as "no data" unless the metric has no
    /// samples at all (not supported by this GPU or log), which is permanent, not a gap.
    fn missing(&self) -> Dynamic {
        if self.gpu.flag(Input::Supported(self.metric)) {
            nodata()
        } else {
            Dynamic::UNIT
        }
    }

    fn number(&self, input: Input) -> Dynamic {
        match self.gpu.num(input) {
            Some(v) => Dynamic::from_float(v),
            None => self.missing(),
        }
    }

    fn aggregate(&self, agg: Agg, dur: i64, arg: f64) -> Option<f64> {
        self.gpu
            .num(Input::Agg(self.metric, agg, dur, arg.to_bits()))
    }

    fn agg(&self, agg: Agg, d: &Dynamic, arg: f64) -> RhaiResult {
        let dur = duration_ms(d)?;
        Ok(match self.aggregate(agg, dur, arg) {
            Some(v) => Dynamic::from_float(v),
            None => self.missing(),
        })
    }

    fn last_default(&self) -> Dynamic {
        self.number(Input::Fresh(self.metric))
    }

    fn all(&self, d: &Dynamic, x: &Dynamic, above: bool) -> RhaiResult {
        let dur = duration_ms(d)?;
        let x = num_arg(x)?;
        let agg = if above {
            Agg::FracAbove
        } else {
            Agg::FracBelow
        };
        Ok(match self.aggregate(agg, dur, x) {
            Some(f) => Dynamic::from_bool(f >= 1.0),
            None => self.missing(),
        })
    }
}

/// One XID event as scripts see it: `#{ code, at, pid, process, detail, repeats, gpus }` (`at`
/// in UTC seconds; `pid`, `process`, `detail` are `()` unless the kernel log named them).
fn xid_event(n: XidNote) -> Dynamic {
    let mut m = Map::new();
    m.insert(
        "code".into(),
        Dynamic::from_int(i64::try_from(n.code).unwrap_or(i64::MAX)),
    );
    #[expect(clippy::cast_precision_loss, reason = "ms since 1970 fit f64")]
    m.insert("at".into(), Dynamic::from_float(n.time_ms as f64 / 1000.0));
    m.insert(
        "pid".into(),
        n.pid
            .map_or(Dynamic::UNIT, |p| Dynamic::from_int(i64::from(p))),
    );
    m.insert(
        "process".into(),
        n.process.map_or(Dynamic::UNIT, Dynamic::from),
    );
    m.insert(
        "detail".into(),
        n.detail.map_or(Dynamic::UNIT, Dynamic::from),
    );
    m.insert("repeats".into(), Dynamic::from_int(i64::from(n.repeats)));
    m.insert("gpus".into(), Dynamic::from_int(i64::from(n.gpus)));
    Dynamic::from_map(m)
}

/// One MIG device as scripts see it (`gpu.mig`, `p.mig`): `#{ index, uuid, gpu_instance_id,
/// compute_instance_id, profile, slices, mem_used, mem_total, pids, address, name }` —
/// `address` is `GPU/GI/CI` (`0/7/0`), `name` `MIG 1g.10gb 0/7/0`, `slices` the profile's
/// compute slices (of 7) — and its GPU instance's GPM metrics under their table keys
/// (`sm_active`, `tensor_active`, `dram_active`, … percent; Hopper and later); unknown values
/// `()`.
pub fn mig_device(d: &MigSample) -> Dynamic {
    let mut m = Map::new();
    m.insert("index".into(), Dynamic::from_int(i64::from(d.index)));
    m.insert("uuid".into(), Dynamic::from(d.uuid.clone()));
    m.insert(
        "gpu_instance_id".into(),
        Dynamic::from_int(i64::from(d.gpu_instance_id)),
    );
    m.insert(
        "compute_instance_id".into(),
        Dynamic::from_int(i64::from(d.compute_instance_id)),
    );
    m.insert(
        "profile".into(),
        d.profile.clone().map_or(Dynamic::UNIT, Dynamic::from),
    );
    m.insert(
        "slices".into(),
        d.compute_slices()
            .map_or(Dynamic::UNIT, |s| Dynamic::from_int(i64::from(s))),
    );
    #[expect(
        clippy::cast_precision_loss,
        reason = "bytes fit f64 exactly below 2^53"
    )]
    let bytes = |b: Option<u64>| b.map_or(Dynamic::UNIT, |b| Dynamic::from_float(b as f64));
    m.insert("mem_used".into(), bytes(d.mem_used_bytes));
    m.insert("mem_total".into(), bytes(d.mem_total_bytes));
    m.insert(
        "pids".into(),
        Dynamic::from_array(
            d.pids
                .iter()
                .map(|p| Dynamic::from_int(i64::from(*p)))
                .collect(),
        ),
    );
    m.insert("address".into(), Dynamic::from(d.address()));
    m.insert("name".into(), Dynamic::from(d.describe()));
    for row in crate::model::METRICS.iter().filter(|r| r.source.is_gpm()) {
        m.insert(
            row.key.into(),
            d.gpm.get(row.id).map_or(Dynamic::UNIT, Dynamic::from_float),
        );
    }
    Dynamic::from_map(m)
}

/// The properties of a link of `gpu.nvlinks`, in the order `to_string` shows them.
const LINK_KEYS: [&str; 18] = [
    "index",
    "up",
    "speed_mbps",
    "full_speed_mbps",
    "version",
    "remote",
    "remote_bus_id",
    "peer_gpu",
    "far_end",
    "crc_flit_errors",
    "crc_data_errors",
    "replay_errors",
    "recovery_errors",
    "crc_flit_delta",
    "crc_data_delta",
    "replay_delta",
    "recovery_delta",
    "interval_s",
];

/// One link of `gpu.nvlinks` (`NvLink`): the reading it is part of and its position in it.
/// Reading `gpu.nvlinks` costs one array of these (an `Arc` each); a property is computed when
/// a script reads it, so no map per link is built and no far end put in words unless asked.
/// The reading was read through [`Input::Nvlinks`], so a trace covers every property.
#[derive(Debug, Clone)]
pub struct LinkHandle {
    view: Arc<NvlinkView>,
    pos: usize,
}

impl LinkHandle {
    /// Property `key` (one of [`LINK_KEYS`]); unknown values, and an unknown key, `()`.
    fn get(&self, key: &str) -> Dynamic {
        let (Some(l), Some(d)) = (
            self.view.links.get(self.pos),
            self.view.deltas.get(self.pos),
        ) else {
            return Dynamic::UNIT;
        };
        let int = |v: Option<u32>| v.map_or(Dynamic::UNIT, |v| Dynamic::from_int(i64::from(v)));
        #[expect(
            clippy::cast_precision_loss,
            reason = "error counts fit f64 exactly below 2^53"
        )]
        let count = |v: Option<u64>| v.map_or(Dynamic::UNIT, |v| Dynamic::from_float(v as f64));
        let c = l.counters();
        match key {
            "index" => Dynamic::from_int(i64::from(l.link)),
            "up" => Dynamic::from_bool(l.up),
            "speed_mbps" => int(l.speed_mbps),
            "full_speed_mbps" => int(l.full_speed_mbps()),
            "version" => int(l.version),
            "remote" => l
                .remote_type
                .map_or(Dynamic::UNIT, |t| Dynamic::from(t.as_str())),
            "remote_bus_id" => l.remote_bus_id.clone().map_or(Dynamic::UNIT, Dynamic::from),
            "peer_gpu" => int(l.peer_gpu),
            "far_end" => Dynamic::from(l.far_end()),
            "crc_flit_errors" => count(c[0]),
            "crc_data_errors" => count(c[1]),
            "replay_errors" => count(c[2]),
            "recovery_errors" => count(c[3]),
            "crc_flit_delta" => count(d[0]),
            "crc_data_delta" => count(d[1]),
            "replay_delta" => count(d[2]),
            "recovery_delta" => count(d[3]),
            "interval_s" => self
                .view
                .interval_s
                .map_or(Dynamic::UNIT, Dynamic::from_float),
            _ => Dynamic::UNIT,
        }
    }

    /// Every property as a map (`l.to_map()`, and what `print(l)` shows).
    fn to_map(&self) -> Map {
        LINK_KEYS
            .iter()
            .map(|k| ((*k).into(), self.get(k)))
            .collect()
    }
}

/// A GPU's NVLinks as scripts see them (`gpu.nvlinks`): one `NvLink` per link with the
/// properties `index, up, speed_mbps, full_speed_mbps, version, remote, remote_bus_id, peer_gpu,
/// far_end, crc_flit_errors, crc_data_errors, replay_errors, recovery_errors, crc_flit_delta,
/// crc_data_delta, replay_delta, recovery_delta, interval_s` (also `l["index"]`, and
/// `l.to_map()`) — `remote` is what the far end is (`"gpu"`, `"switch"`, `"ibm_npu"`,
/// `"unknown"`, or `()` when the driver cannot say), `peer_gpu` the NVML index of a GPU at the
/// far end that this machine lists, `far_end` the far end in words (`GPU 5`, `NVSwitch
/// 00000000:05:00.0`, …), the error counters cumulative and their `_delta` the rise since the
/// reading before, `interval_s` seconds ago; unknown values `()`. Each property is computed
/// when read ([`LinkHandle`]).
fn nvlinks(g: &GpuHandle) -> Array {
    let Some(view) = g.nvlinks() else {
        return Array::new();
    };
    (0..view.links.len().min(view.deltas.len()))
        .map(|pos| {
            Dynamic::from(LinkHandle {
                view: view.clone(),
                pos,
            })
        })
        .collect()
}

fn processes(g: &GpuHandle) -> Array {
    let mig = g.mig();
    g.processes()
        .into_iter()
        .map(|p| {
            let mut m = Map::new();
            m.insert("pid".into(), Dynamic::from_int(i64::from(p.pid)));
            m.insert(
                "mig".into(),
                mig.iter()
                    .find(|d| d.pids.contains(&p.pid))
                    .map_or(Dynamic::UNIT, |d| Dynamic::from(d.address())),
            );
            #[expect(
                clippy::cast_precision_loss,
                reason = "bytes fit f64 exactly below 2^53"
            )]
            m.insert(
                "used_bytes".into(),
                p.used_mem_bytes
                    .map_or(Dynamic::UNIT, |b| Dynamic::from_float(b as f64)),
            );
            m.insert(
                "job".into(),
                p.job_key().map_or(Dynamic::UNIT, Dynamic::from),
            );
            m.insert("user".into(), p.user.map_or(Dynamic::UNIT, Dynamic::from));
            m.insert(
                "command".into(),
                p.command.map_or(Dynamic::UNIT, Dynamic::from),
            );
            m.insert(
                "runtime_s".into(),
                p.runtime_s.map_or(Dynamic::UNIT, Dynamic::from_float),
            );
            Dynamic::from_map(m)
        })
        .collect()
}

fn throttled_now(g: &GpuHandle, name: &str) -> RhaiResult {
    let mask =
        clock_event_mask(name).ok_or_else(|| format!("unknown clock event reason {name:?}"))?;
    let last = g.series(Metric::ClockEventReasons).last_default();
    Ok(match number(&last) {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "bitmask"
        )]
        Some(v) => Dynamic::from_bool((v as u64) & mask != 0),
        None => Dynamic::UNIT,
    })
}

/// Registers the `Gpu` and `Series` types, their properties and the window methods.
#[expect(clippy::too_many_lines, reason = "one registration list")]
pub(super) fn register(engine: &mut Engine) {
    engine.register_type_with_name::<GpuHandle>("Gpu");
    engine.register_type_with_name::<Series>("Series");

    for desc in METRICS {
        let metric = desc.id;
        engine.register_get(desc.key, move |g: &mut GpuHandle| g.series(metric));
    }
    engine.register_get("index", |g: &mut GpuHandle| g.int(Input::Index));
    engine.register_get("uuid", |g: &mut GpuHandle| g.device().uuid);
    engine.register_get("name", |g: &mut GpuHandle| g.device().name);
    engine.register_get("pci_bus_id", |g: &mut GpuHandle| g.device().pci_bus_id);
    engine.register_get("lost", |g: &mut GpuHandle| g.flag(Input::Lost));
    engine.register_get("stalled", |g: &mut GpuHandle| g.stalled_in().is_some());
    engine.register_get("stalled_call", |g: &mut GpuHandle| {
        g.stalled_in().unwrap_or_default().to_string()
    });
    engine.register_get("processes", |g: &mut GpuHandle| processes(g));
    engine.register_get("mig", |g: &mut GpuHandle| -> Array {
        g.mig().iter().map(mig_device).collect()
    });
    engine.register_get("nvlinks", |g: &mut GpuHandle| nvlinks(g));
    engine.register_type_with_name::<LinkHandle>("NvLink");
    for key in LINK_KEYS {
        engine.register_get(key, move |l: &mut LinkHandle| l.get(key));
    }
    engine.register_indexer_get(|l: &mut LinkHandle, key: ImmutableString| l.get(&key));
    engine.register_fn("to_map", |l: &mut LinkHandle| l.to_map());
    engine.register_fn("to_string", |l: &mut LinkHandle| {
        Dynamic::from_map(l.to_map()).to_string()
    });
    engine.register_fn("to_debug", |l: &mut LinkHandle| {
        format!("NvLink {}", Dynamic::from_map(l.to_map()))
    });
    engine.register_get("process_count", |g: &mut GpuHandle| {
        g.int(Input::ProcessCount)
    });
    engine.register_get("interval", |g: &mut GpuHandle| {
        let ms = g.int(Input::Interval);
        #[expect(clippy::cast_precision_loss, reason = "small")]
        if ms > 0 {
            Dynamic::from_float(ms as f64 / 1000.0)
        } else {
            Dynamic::UNIT
        }
    });
    engine.register_fn("throttled", |g: GpuHandle, name: &str| {
        throttled_now(&g, name)
    });
    engine.register_fn(
        "throttled",
        |g: GpuHandle, name: &str, d: Dynamic| -> RhaiResult {
            let mask = clock_event_mask(name)
                .ok_or_else(|| format!("unknown clock event reason {name:?}"))?;
            let dur = duration_ms(&d)?;
            #[expect(clippy::cast_precision_loss, reason = "bitmask below 2^53")]
            let arg = mask as f64;
            let series = g.series(Metric::ClockEventReasons);
            Ok(match series.aggregate(Agg::FracBits, dur, arg) {
                Some(v) => Dynamic::from_float(v),
                None => series.missing(),
            })
        },
    );
    engine.register_fn("xids", |g: GpuHandle, d: Dynamic| -> RhaiResult {
        let dur = duration_ms(&d)?;
        let Value::Codes(codes) = g.view.get(Input::Xids(dur)) else {
            return Ok(Dynamic::from_array(Array::new()));
        };
        Ok(Dynamic::from_array(
            codes
                .into_iter()
                .map(|c| Dynamic::from_int(i64::try_from(c).unwrap_or(i64::MAX)))
                .collect(),
        ))
    });
    engine.register_fn("xid_events", |g: GpuHandle, d: Dynamic| -> RhaiResult {
        let dur = duration_ms(&d)?;
        let Value::Notes(notes) = g.view.get(Input::XidEvents(dur)) else {
            return Ok(Dynamic::from_array(Array::new()));
        };
        Ok(Dynamic::from_array(
            notes.into_iter().map(xid_event).collect(),
        ))
    });
    engine.register_fn("to_string", |g: &mut GpuHandle| {
        format!("GPU {}", g.int(Input::Index))
    });

    // Window methods, by value.
    engine.register_fn("last", |s: Series| s.last_default());
    for (name, agg) in [
        ("last", Agg::Last),
        ("mean", Agg::Mean),
        ("avg", Agg::Mean),
        ("min", Agg::Min),
        ("max", Agg::Max),
        ("stddev", Agg::Stddev),
        ("delta", Agg::Delta),
        ("increase", Agg::Increase),
        ("rate", Agg::Rate),
        ("slope", Agg::Slope),
    ] {
        window_method(engine, name, move |s, d| s.agg(agg, d, 0.0));
    }
    window_method(engine, "count", |s, d| {
        let dur = duration_ms(d)?;
        let n = s.aggregate(Agg::Count, dur, 0.0).unwrap_or(0.0);
        #[expect(clippy::cast_possible_truncation, reason = "a count")]
        Ok(Dynamic::from_int(n as i64))
    });
    window_method2(engine, "percentile", |s, d, p| {
        s.agg(Agg::Percentile, d, num_arg(p)?)
    });
    window_method2(engine, "pct", |s, d, p| {
        s.agg(Agg::Percentile, d, num_arg(p)?)
    });
    window_method2(engine, "frac_above", |s, d, x| {
        s.agg(Agg::FracAbove, d, num_arg(x)?)
    });
    window_method2(engine, "frac_below", |s, d, x| {
        s.agg(Agg::FracBelow, d, num_arg(x)?)
    });
    window_method2(engine, "all_above", |s, d, x| s.all(d, x, true));
    window_method2(engine, "all_below", |s, d, x| s.all(d, x, false));
    engine.register_fn(
        "idle_runs",
        |s: Series, d: Dynamic, x: Dynamic| -> RhaiResult {
            let dur = duration_ms(&d)?;
            let x = num_arg(&x)?;
            let Value::Runs(Some(r)) = s.gpu.view.get(Input::Runs(s.metric, dur, x.to_bits()))
            else {
                return Ok(s.missing());
            };
            let mut m = Map::new();
            m.insert(
                "runs".into(),
                Dynamic::from_int(i64::try_from(r.runs).unwrap_or(i64::MAX)),
            );
            m.insert("share".into(), Dynamic::from_float(r.share));
            m.insert(
                "period".into(),
                r.period_s.map_or(Dynamic::UNIT, Dynamic::from_float),
            );
            m.insert(
                "period_cv".into(),
                r.period_cv.map_or(Dynamic::UNIT, Dynamic::from_float),
            );
            m.insert("median_len".into(), Dynamic::from_float(r.median_len_s));
            Ok(Dynamic::from_map(m))
        },
    );
    engine.register_fn("maxima", |s: Series, d: Dynamic, n: i64| -> RhaiResult {
        let dur = duration_ms(&d)?;
        let n = usize::try_from(n.clamp(1, 1000)).unwrap_or(1);
        Ok(match s.gpu.view.get(Input::Maxima(s.metric, dur, n)) {
            Value::Nums(Some(v)) => {
                Dynamic::from_array(v.into_iter().map(Dynamic::from_float).collect())
            }
            _ => s.missing(),
        })
    });
    engine.register_fn("age", |s: Series| s.number(Input::Age(s.metric)));
    engine.register_get("supported", |s: &mut Series| {
        s.gpu.flag(Input::Supported(s.metric))
    });
    engine.register_get("key", |s: &mut Series| s.metric.key().to_string());
    engine.register_get("unit", |s: &mut Series| s.metric.desc().unit.to_string());
}

/// Registers `name(series, duration)` with exact overloads for a duration given as a string, an
/// int or a float, and a `Dynamic` one for anything else (`()`). An exact overload resolves at
/// the first lookup; a `Dynamic` parameter alone would send every call through rhai's search
/// over argument-type permutations, whose cache does not outlive one evaluation.
fn window_method<F>(engine: &mut Engine, name: &str, f: F)
where
    F: Fn(&Series, &Dynamic) -> RhaiResult + Copy + Send + Sync + 'static,
{
    engine.register_fn(name, move |s: Series, d: ImmutableString| {
        f(&s, &Dynamic::from(d))
    });
    engine.register_fn(name, move |s: Series, d: i64| f(&s, &Dynamic::from_int(d)));
    engine.register_fn(name, move |s: Series, d: f64| {
        f(&s, &Dynamic::from_float(d))
    });
    engine.register_fn(name, move |s: Series, d: Dynamic| f(&s, &d));
}

/// [`window_method`] for `name(series, duration, number)`.
fn window_method2<F>(engine: &mut Engine, name: &str, f: F)
where
    F: Fn(&Series, &Dynamic, &Dynamic) -> RhaiResult + Copy + Send + Sync + 'static,
{
    engine.register_fn(name, move |s: Series, d: ImmutableString, x: f64| {
        f(&s, &Dynamic::from(d), &Dynamic::from_float(x))
    });
    engine.register_fn(name, move |s: Series, d: ImmutableString, x: i64| {
        f(&s, &Dynamic::from(d), &Dynamic::from_int(x))
    });
    engine.register_fn(name, move |s: Series, d: Dynamic, x: Dynamic| f(&s, &d, &x));
}
