//! Rule scripts: loading `*.rhai` files into a [`RuleSet`], the sandbox, and evaluating one rule
//! for one GPU (or the host).
//!
//! A rule file registers rules with `rule(#{ name, severity, scope, hold, keep_firing_for,
//! repeat, labels, check })` (see docs/rules.md). Files are compiled once; loading runs their top
//! level once, which calls `rule(..)`; evaluation calls each rule's `check` closure with a
//! by-value `gpu` (or `host`) handle.
//!
//! Sandbox: rhai is built with `no_module` (no `import`), `eval` is disabled, `print`/`debug` go to
//! the log, and every evaluation is bounded ([`MAX_OPERATIONS`] operations, call depth 32,
//! expression depth 64, strings 64 KiB, arrays 10 000, maps 1 000 entries). A runaway rule fails
//! with "too many operations" like any other run-time error: the engine turns it into a
//! `rule_error` alert naming `file:line` and keeps evaluating the other rules.

pub mod api;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rhai::{Dynamic, Engine, EvalAltResult, FnPtr, Map, NativeCallContext, Position, AST};
use serde::Deserialize;

use crate::alert::AlertSpec;
use crate::model::{Action, Metric, Severity, METRIC_COUNT};
use crate::values::parse_duration_ms;
use crate::values::{escape_control, DurationSetting, Problem};
use crate::window::{GpuHistory, RETENTION_MARGIN_MS};
pub use api::gpu::Trace;
pub use api::{GpuHandle, HostHandle};

/// Operation budget of one evaluation of one rule.
pub const MAX_OPERATIONS: u64 = 200_000;

/// Default wall-clock budget of one evaluation of one rule (`[rules] budget`).
pub const DEFAULT_BUDGET_MS: i64 = 50;

/// Wall-clock limit for running one rule file's top level at load time.
pub const LOAD_BUDGET_MS: i64 = 2_000;

/// Labels a rule may not set: identity labels gpuwatch sets itself, and `pid` / `action`, which
/// could otherwise pass for a control decision.
pub const RESERVED_LABELS: &[&str] = &[
    "alertname",
    "severity",
    "gpu",
    "uuid",
    "hostname",
    "rule",
    "pid",
    "action",
    "hpc_job",
];

/// Keys a check's returned map may not contain: control decisions travel only as the rule's
/// declared `action:` and the scope's own target.
pub const RESERVED_RESULT_KEYS: &[&str] = &["pid", "action", "actions", "target_pid"];

/// Labels gpuwatch sets on every alert (or on process and job alerts); a check's `labels` map
/// cannot replace them.
pub const BUILTIN_LABELS: &[&str] = &[
    "alertname",
    "severity",
    "hostname",
    "gpu",
    "uuid",
    "pid",
    "user",
    "rule",
    "action",
    "hpc_job",
];

/// Longest accepted `every` of a rule.
pub const MAX_EVERY_MS: i64 = 24 * 3600 * 1000;

/// Retention floor: windows of the metrics rules read keep at least this much history.
pub const MIN_RETENTION_MS: i64 = 15 * 60 * 1000;

/// Retention of a metric no loaded rule names. (The engine keeps no window of such a metric —
/// no rule can read it — nor carries its counter over a restart; a window filled by other
/// means, as in tests, keeps a minute.)
pub const UNREAD_RETENTION_MS: i64 = 60 * 1000;

/// `[rules]` section of the config.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RulesConfig {
    /// Per-rule parameter overrides: `[rules.params] low_utilization.threshold = 40`.
    pub params: BTreeMap<String, toml::Table>,
    /// Default evaluation cadence of rules without their own `every` (`"0s"` by default = at
    /// every snapshot).
    pub eval_interval: Option<DurationSetting>,
    /// Extra rule directories or files, relative to the config file.
    pub dirs: Vec<PathBuf>,
    /// Minimum history to keep per metric (default: the longest duration literal in the rules,
    /// at least 15 min).
    pub retention: Option<DurationSetting>,
    /// Wall-clock budget of one evaluation of one rule (default `"50ms"`): an evaluation that
    /// runs longer is stopped and raises `rule_error`; a rule that keeps exceeding it is
    /// suspended with backoff.
    pub budget: Option<DurationSetting>,
}

/// Default evaluation interval for the daemon, `replay` and `test`: every snapshot. Rules whose
/// windows span minutes set their own `every`.
pub const DEFAULT_EVAL_INTERVAL_MS: i64 = 0;

impl RulesConfig {
    /// The evaluation interval in ms.
    pub fn eval_interval_ms(&self) -> i64 {
        self.eval_interval
            .map_or(DEFAULT_EVAL_INTERVAL_MS, |d| d.ms)
    }

    /// The per-evaluation time budget in ms, clamped to [`BUDGET_RANGE_MS`] (out-of-range values
    /// are reported by [`RulesConfig::validate`]).
    pub fn budget_ms(&self) -> i64 {
        self.budget
            .map_or(DEFAULT_BUDGET_MS, |d| d.ms)
            .clamp(*BUDGET_RANGE_MS.start(), *BUDGET_RANGE_MS.end())
    }

    /// What serde could not check, as problems at `rules.*` keys.
    pub fn validate(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        if let Some(b) = self.budget {
            if !BUDGET_RANGE_MS.contains(&b.ms) {
                problems.push(Problem::at(
                    "rules.budget",
                    format!("budget {} ms is out of range (1ms to 10s)", b.ms),
                ));
            }
        }
        if self.eval_interval.is_some_and(|d| d.ms > MAX_EVERY_MS) {
            problems.push(Problem::at(
                "rules.eval_interval",
                "eval_interval is longer than the 24 h maximum",
            ));
        }
        problems
    }
}

/// The accepted range of `[rules] budget`, ms.
pub const BUDGET_RANGE_MS: std::ops::RangeInclusive<i64> = 1..=10_000;

/// A rule problem, displayed as `file:line:column: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError {
    /// The rule file.
    pub file: String,
    /// 1-based line (0 when unknown).
    pub line: usize,
    /// 1-based column (0 when unknown).
    pub column: usize,
    /// What went wrong.
    pub message: String,
    /// True when the evaluation was stopped for exceeding its wall-clock budget.
    pub over_budget: bool,
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file,
            self.line.max(1),
            self.column.max(1),
            self.message
        )
    }
}

impl std::error::Error for RuleError {}

impl RuleError {
    fn at(file: &str, pos: Position, message: impl Into<String>) -> Self {
        RuleError {
            file: file.to_string(),
            line: pos.line().unwrap_or(0),
            column: pos.position().unwrap_or(0),
            message: message.into(),
            over_budget: false,
        }
    }

    /// A plain error about a file or directory as a whole.
    pub fn file(file: &str, message: impl Into<String>) -> Self {
        RuleError::at(file, Position::NONE, message)
    }

    /// `file:line`, for alert annotations.
    pub fn location(&self) -> String {
        format!("{}:{}", self.file, self.line.max(1))
    }
}

/// Whether a rule runs per GPU, once per host, per watched job or per GPU process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleScope {
    /// Once per GPU per evaluation.
    Gpu,
    /// Once per evaluation.
    Host,
    /// Once per job sample of `gpuwatch run` / `attach` (`check: |job| ..`), see
    /// `Engine::evaluate_job` in the `engine` module.
    Job,
    /// Once per process in each GPU's latest process list (`check: |p| ..`).
    Process,
}

/// One loaded rule.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Lifecycle settings and labels.
    pub spec: AlertSpec,
    /// GPU or host.
    pub scope: RuleScope,
    /// File it came from.
    pub file: String,
    /// Line of its `rule(..)` call.
    pub line: usize,
    /// `every:` — evaluate this rule only when `floor(t / every)` changes (overrides
    /// `[rules] eval_interval`); `None` follows the global interval. Not allowed on job rules.
    pub every_ms: Option<i64>,
    /// Whether it runs at every sample (no `every`, cadence 0 in the default config): such rules
    /// (lost GPU, XID, ECC) are evaluated before windowed ones at each tick.
    pub per_sample: bool,
    check: FnPtr,
    ast: Arc<AST>,
    params: Arc<Map>,
}

/// What one evaluation of a rule said.
#[derive(Debug, Clone, PartialEq)]
pub enum EvalResult {
    /// The condition holds.
    Fire {
        /// Summary.
        summary: String,
        /// Extra annotations (presentation only).
        annotations: BTreeMap<String, String>,
        /// A severity the check returned for this instance (`#{ severity: .. }`).
        severity: Option<Severity>,
        /// Labels the check returned (`#{ labels: #{ .. } }`): added to a new instance's
        /// identity labels, for receivers to route on (the built-in labels cannot be replaced).
        labels: BTreeMap<String, String>,
    },
    /// It does not.
    Quiet,
    /// It does not, and the check said what that means should it end a firing alert: a map
    /// with `cleared` (the cause is gone: "the GPU was reset") or `stopped` (an event alert's
    /// events stopped but the fault may remain: "no new XID for 1 h; GPU 3 is still lost") and
    /// no `summary`.
    Ended(crate::model::EndReason),
    /// It did not fire, and a window it read had too little data.
    NoData,
    /// The script failed.
    Error(RuleError),
    /// A host-scope check returned an array of maps, each naming the GPU it is about
    /// (`[#{ gpu: 0, summary: .. }, ..]`): one alert instance per GPU, carrying its `gpu`
    /// label, so silences, inhibition, bands and `/metrics` point at the right board. GPUs not
    /// listed are quiet; an empty array is [`EvalResult::Quiet`].
    PerGpu(Vec<(u32, EvalResult)>),
}

/// Every loaded rule, with the sandboxed engine that runs them.
#[derive(Clone)]
pub struct RuleSet {
    engine: Arc<Engine>,
    rules: Vec<Rule>,
    files: Vec<PathBuf>,
    retention_ms: i64,
    /// Per metric: how much history its window keeps (see [`RuleSet::metric_retention_ms`]).
    metric_retention_ms: [i64; METRIC_COUNT],
    /// Per metric: whether some rule file names it ([`metrics_named`]).
    named: [bool; METRIC_COUNT],
    /// The same as a list of indices in the metric table.
    named_list: Vec<usize>,
    budget_ms: i64,
    param_keys: BTreeMap<String, BTreeSet<String>>,
}

/// The time budget of the evaluation running on a thread.
///
/// An evaluation is stopped once it has run for its budget in wall time **and** has used a
/// further tenth of the budget (at least 1 ms) of CPU time since then, or once it has run
/// [`WALL_CAP_FACTOR`] × the budget in wall time. A CPU-bound rule is thus stopped at about
/// 1.1 × its budget, while a healthy rule that a busy machine preempted for a while finishes (it
/// needs microseconds of CPU once it runs again). No clock but the cheap monotonic one is read
/// until the budget has passed in wall time.
#[derive(Debug, Clone, Copy)]
struct Deadline {
    start: std::time::Instant,
    budget: std::time::Duration,
    /// The thread's CPU clock (ns) when the wall-clock budget was first seen spent.
    cpu_at_budget: Option<u64>,
}

/// The wall-clock cap of an evaluation, as a multiple of its budget.
pub const WALL_CAP_FACTOR: u32 = 10;

thread_local! {
    static DEADLINE: std::cell::Cell<Option<Deadline>> = const { std::cell::Cell::new(None) };
}

thread_local! {
    /// The rule (or, while loading, the file) whose script runs on this thread, for its output.
    static CURRENT_RULE: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Lines of `print`/`debug` output one rule may log per [`OUTPUT_WINDOW`].
pub const OUTPUT_LINES: u32 = 10;
/// The window of [`OUTPUT_LINES`].
pub const OUTPUT_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// Per rule: the start of its output window, lines logged in it, lines suppressed.
static OUTPUT: Mutex<BTreeMap<String, (std::time::Instant, u32, u64)>> =
    Mutex::new(BTreeMap::new());

/// Whether the running rule may log one more line of output; its name if so. A rule over its
/// allowance is quiet until its window ends, then one line says how much was suppressed.
fn rule_output_allowed() -> Option<String> {
    let rule = CURRENT_RULE.with(|r| r.borrow().clone());
    let rule = if rule.is_empty() {
        "rule".to_string()
    } else {
        rule
    };
    let mut map = OUTPUT.lock().ok()?;
    let now = std::time::Instant::now();
    let entry = map.entry(rule.clone()).or_insert((now, 0, 0));
    if now.duration_since(entry.0) >= OUTPUT_WINDOW {
        if entry.2 > 0 {
            tracing::warn!(
                target: "gpuwatch::rules",
                rule = %rule,
                "{} line(s) of print/debug output suppressed (at most {OUTPUT_LINES} per {} s)",
                entry.2,
                OUTPUT_WINDOW.as_secs()
            );
        }
        *entry = (now, 0, 0);
    }
    if entry.1 < OUTPUT_LINES {
        entry.1 += 1;
        Some(rule)
    } else {
        entry.2 += 1;
        None
    }
}

/// The termination token the progress callback returns when the budget is spent.
const OVER_BUDGET: &str = "gpuwatch: time budget exceeded";

/// Runs `f` with a time budget of `budget_ms` from now on this thread.
fn with_deadline<T>(budget_ms: i64, f: impl FnOnce() -> T) -> T {
    let budget = std::time::Duration::from_millis(budget_ms.max(1).unsigned_abs());
    DEADLINE.with(|d| {
        d.set(Some(Deadline {
            start: std::time::Instant::now(),
            budget,
            cpu_at_budget: None,
        }));
    });
    let out = f();
    DEADLINE.with(|d| d.set(None));
    out
}

/// True when the evaluation running on this thread has spent its budget (see [`Deadline`]).
fn past_deadline() -> bool {
    DEADLINE.with(|cell| {
        let Some(mut d) = cell.get() else {
            return false;
        };
        let wall = d.start.elapsed();
        if wall < d.budget {
            return false;
        }
        if wall >= d.budget * WALL_CAP_FACTOR {
            return true;
        }
        let cpu = crate::sys::thread_cpu_ns();
        let Some(at) = d.cpu_at_budget else {
            d.cpu_at_budget = Some(cpu);
            cell.set(Some(d));
            return false;
        };
        let grace = u64::try_from((d.budget / 10).as_nanos())
            .unwrap_or(u64::MAX)
            .max(1_000_000);
        cpu.saturating_sub(at) >= grace
    })
}

/// True when `err` (or the error inside a function call) is the budget's termination.
fn is_over_budget(err: &EvalAltResult) -> bool {
    match err {
        EvalAltResult::ErrorInFunctionCall(_, _, inner, _) => is_over_budget(inner),
        EvalAltResult::ErrorTerminated(token, _) => token
            .read_lock::<rhai::ImmutableString>()
            .is_some_and(|t| t.as_str() == OVER_BUDGET),
        _ => false,
    }
}

impl fmt::Debug for RuleSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RuleSet")
            .field(
                "rules",
                &self.rules.iter().map(|r| &r.spec.name).collect::<Vec<_>>(),
            )
            .field("retention_ms", &self.retention_ms)
            .finish_non_exhaustive()
    }
}

/// A `rule(..)` call collected while loading a file.
struct Registration {
    def: Map,
    pos: Position,
}

type Collector = Arc<Mutex<Vec<Registration>>>;

/// The sandboxed engine.
fn new_engine(collector: Collector) -> Engine {
    let mut engine = Engine::new();
    engine
        .set_max_operations(MAX_OPERATIONS)
        .set_max_call_levels(32)
        .set_max_expr_depths(64, 32)
        .set_max_string_size(64 * 1024)
        .set_max_array_size(10_000)
        .set_max_map_size(1_000)
        .set_max_variables(256)
        .set_max_functions(256)
        .set_strict_variables(true)
        .disable_symbol("eval");
    // Bounded operations are not bounded time (one operation can copy 64 KiB): every 256
    // operations the evaluation checks its deadline.
    engine.on_progress(|ops| {
        if ops % 256 != 0 || !past_deadline() {
            return None;
        }
        Some(Dynamic::from(rhai::ImmutableString::from(OVER_BUDGET)))
    });
    engine.on_print(|s| {
        api::gpu::opaque_trace();
        if let Some(rule) = rule_output_allowed() {
            tracing::info!(target: "gpuwatch::rules", rule = %rule, "{}", escape_control(s));
        }
    });
    engine.on_debug(|s, src, pos| {
        api::gpu::opaque_trace();
        if let Some(rule) = rule_output_allowed() {
            tracing::debug!(
                target: "gpuwatch::rules",
                rule = %rule,
                "{}:{pos}: {}",
                src.unwrap_or("rule"),
                escape_control(s)
            );
        }
    });
    api::register(&mut engine);
    engine.register_fn(
        "rule",
        move |ctx: NativeCallContext, def: Map| -> Result<(), Box<EvalAltResult>> {
            if !api::LOADING.with(std::cell::Cell::get) {
                return Err("rule(..) can only be called at the top level of a rule file".into());
            }
            let pos = ctx.call_position();
            collector
                .lock()
                .map_err(|_| "rule registry poisoned")?
                .push(Registration { def, pos });
            Ok(())
        },
    );
    engine
}

/// The load-time scope: the constants `KiB`, `MiB`, `GiB`, `TiB` (bytes), which closures capture,
/// so `gpu.mem_used.last() > 70 * GiB` works as well as `GiB(70)`.
fn unit_scope() -> rhai::Scope<'static> {
    let mut scope = rhai::Scope::new();
    scope.push_constant("KiB", 1024.0_f64);
    scope.push_constant("MiB", 1_048_576.0_f64);
    scope.push_constant("GiB", 1_073_741_824.0_f64);
    scope.push_constant("TiB", 1_099_511_627_776.0_f64);
    scope
}

/// Every `*.rhai` file named by `paths` (files as given, directories non-recursively, sorted).
pub fn rule_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, Vec<RuleError>> {
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for p in paths {
        if p.is_dir() {
            match std::fs::read_dir(p) {
                Ok(rd) => {
                    let mut found: Vec<PathBuf> = rd
                        .filter_map(Result::ok)
                        .map(|e| e.path())
                        .filter(|f| f.extension().is_some_and(|x| x == "rhai") && f.is_file())
                        .collect();
                    found.sort();
                    files.extend(found);
                }
                Err(e) => errors.push(RuleError::file(
                    &p.display().to_string(),
                    format!("cannot read rule directory: {e}"),
                )),
            }
        } else if p.is_file() {
            files.push(p.clone());
        } else {
            errors.push(RuleError::file(
                &p.display().to_string(),
                "no such rule file or directory",
            ));
        }
    }
    if errors.is_empty() {
        Ok(files)
    } else {
        Err(errors)
    }
}

fn toml_to_dynamic(v: &toml::Value) -> Dynamic {
    match v {
        toml::Value::String(s) => Dynamic::from(s.clone()),
        toml::Value::Integer(i) => Dynamic::from_int(*i),
        toml::Value::Float(f) => Dynamic::from_float(*f),
        toml::Value::Boolean(b) => Dynamic::from_bool(*b),
        toml::Value::Datetime(d) => Dynamic::from(d.to_string()),
        toml::Value::Array(a) => Dynamic::from_array(a.iter().map(toml_to_dynamic).collect()),
        toml::Value::Table(t) => Dynamic::from_map(
            t.iter()
                .map(|(k, v)| (k.as_str().into(), toml_to_dynamic(v)))
                .collect(),
        ),
    }
}

fn params_for(config: &RulesConfig, name: &str) -> Arc<Map> {
    Arc::new(config.params.get(name).map_or_else(Map::new, |t| {
        t.iter()
            .map(|(k, v)| (k.as_str().into(), toml_to_dynamic(v)))
            .collect()
    }))
}

/// The duration literals (`"90s"`, `"2h"`) of a script, in ms, each with the text before it.
fn duration_literals(source: &str) -> impl Iterator<Item = (&str, i64)> {
    source.split(['"', '`', '\'']).filter_map(move |part| {
        let p = part.trim();
        let literal = p.len() <= 12
            && p.starts_with(|c: char| c.is_ascii_digit())
            && p.ends_with(|c: char| c.is_ascii_alphabetic());
        if !literal {
            return None;
        }
        let ms = parse_duration_ms(p).ok()?;
        // (`part` lies in `source`, one quote after what comes before it)
        let at = (part.as_ptr() as usize - source.as_ptr() as usize).saturating_sub(1);
        Some((&source[..at], ms))
    })
}

/// Longest duration literal of a script, ms.
fn longest_duration_literal(source: &str) -> i64 {
    duration_literals(source)
        .map(|(_, ms)| ms)
        .max()
        .unwrap_or(0)
}

/// The rule fields whose durations belong to the alert's lifecycle, not to a window.
const LIFECYCLE_KEYS: &[&str] = &["every", "hold", "keep_firing_for", "repeat"];

/// Longest duration literal of a script that may be the length of a window, ms: every literal
/// but the value of a lifecycle field written in place (`keep_firing_for: "1h"`), which no series
/// function reads. (A duration a script passes to a series function some other way is kept from
/// its first use on: see [`GpuHistory::note_asked`](crate::window::GpuHistory::note_asked).)
fn longest_window_literal(source: &str) -> i64 {
    let lifecycle = |before: &str| {
        let Some(key) = before.trim_end().strip_suffix(':') else {
            return false;
        };
        let key = key.trim_end();
        LIFECYCLE_KEYS.iter().any(|k| {
            key.strip_suffix(k).is_some_and(|rest| {
                !rest.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            })
        })
    };
    duration_literals(source)
        .filter(|(before, _)| !lifecycle(before))
        .map(|(_, ms)| ms)
        .max()
        .unwrap_or(0)
}

/// The metrics a script names: each metric whose key occurs as a whole word (`gpu.util`, not
/// `gpu.mem_util`), and the clock-event reasons when it calls `throttled`. Rule scripts reach a
/// metric only through its key (a property of `gpu`), so a metric not named is never read.
fn metrics_named(source: &str) -> Vec<Metric> {
    let word = |w: &str| {
        let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
        source.match_indices(w).any(|(i, _)| {
            !source[..i].ends_with(is_ident) && !source[i + w.len()..].starts_with(is_ident)
        })
    };
    Metric::all()
        .filter(|m| word(m.key()) || (*m == Metric::ClockEventReasons && word("throttled")))
        .collect()
}

/// Names of the `param("key", ..)` calls in a script.
fn param_keys(source: &str) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    let mut rest = source;
    while let Some(i) = rest.find("param(") {
        rest = &rest[i + 6..];
        let t = rest.trim_start();
        if let Some(t) = t.strip_prefix('"') {
            if let Some(end) = t.find('"') {
                keys.insert(t[..end].to_string());
            }
        }
    }
    keys
}

fn get_str(def: &Map, key: &str) -> Result<Option<String>, String> {
    match def.get(key) {
        None => Ok(None),
        Some(v) if v.is_unit() => Ok(None),
        Some(v) => v
            .clone()
            .into_immutable_string()
            .map(|s| Some(s.to_string()))
            .map_err(|t| format!("`{key}` must be a string, got {t}")),
    }
}

fn get_duration(def: &Map, key: &str) -> Result<i64, String> {
    match def.get(key) {
        None => Ok(0),
        Some(v) if v.is_unit() => Ok(0),
        Some(v) => api::any_duration_ms(v).map_err(|e| format!("`{key}`: {e}")),
    }
}

/// Turns one `rule(#{..})` map into a [`Rule`].
fn build_rule(
    file: &str,
    reg: Registration,
    ast: &Arc<AST>,
    config: &RulesConfig,
) -> Result<Rule, RuleError> {
    let err = |m: String| RuleError::at(file, reg.pos, m);
    let def = &reg.def;
    check_keys(def).map_err(&err)?;
    let name = rule_name(def).map_err(&err)?;
    let severity = match get_str(def, "severity").map_err(&err)? {
        None => Severity::Warning,
        Some(s) => Severity::parse(&s).ok_or_else(|| {
            err(format!(
                "severity {s:?} must be \"info\", \"warning\" or \"critical\""
            ))
        })?,
    };
    let scope = rule_scope(def).map_err(&err)?;
    let actions = rule_actions(def, scope).map_err(&err)?;
    let hold_ms = get_duration(def, "hold").map_err(&err)?;
    let keep_firing_for_ms = get_duration(def, "keep_firing_for").map_err(&err)?;
    let repeat_ms = get_duration(def, "repeat").map_err(&err)?;
    let every_ms = rule_every(def, scope).map_err(&err)?;
    let labels = rule_labels(def).map_err(&err)?;
    let mut check = def
        .get("check")
        .and_then(|c| c.read_lock::<FnPtr>().map(|f| f.clone()))
        .ok_or_else(|| err("rule needs a `check` closure, e.g. `check: |gpu| { .. }`".into()))?;
    // A check is a function of what it reads: each evaluation gets its own copy of the
    // variables it captures, as the file left them, so no evaluation can leave state behind for
    // the next one (see `api::gpu` on traces).
    for v in check.iter_curry_mut() {
        *v = unshared(std::mem::take(v));
    }
    let line = reg.pos.line().unwrap_or(0);
    Ok(Rule {
        spec: AlertSpec {
            name: name.clone(),
            severity,
            hold_ms,
            keep_firing_for_ms,
            repeat_ms,
            labels,
            source: format!("{file}:{}", line.max(1)),
            actions,
        },
        scope,
        file: file.to_string(),
        line,
        per_sample: every_ms.is_none(),
        every_ms,
        check,
        ast: ast.clone(),
        params: params_for(config, &name),
    })
}

/// `v` with no shared (captured) value left anywhere inside it: closures it holds, and arrays
/// and maps, are copied down to plain values, so calling a captured closure cannot change a
/// variable that outlives the evaluation either.
fn unshared(v: Dynamic) -> Dynamic {
    let v = v.flatten();
    if let Some(mut f) = v.read_lock::<FnPtr>().map(|f| f.clone()) {
        for c in f.iter_curry_mut() {
            *c = unshared(std::mem::take(c));
        }
        return Dynamic::from(f);
    }
    if v.is_array() {
        let a: rhai::Array = v.cast();
        return Dynamic::from_array(a.into_iter().map(unshared).collect());
    }
    if v.is_map() {
        let m: Map = v.cast();
        return Dynamic::from_map(m.into_iter().map(|(k, x)| (k, unshared(x))).collect());
    }
    v
}

/// The fields `rule(#{ .. })` accepts.
const RULE_KEYS: &[&str] = &[
    "name",
    "severity",
    "scope",
    "hold",
    "keep_firing_for",
    "repeat",
    "labels",
    "check",
    "description",
    "action",
    "every",
];

fn check_keys(def: &Map) -> Result<(), String> {
    match def.keys().find(|k| !RULE_KEYS.contains(&k.as_str())) {
        Some(k) => Err(format!(
            "unknown rule field `{k}` (expected one of {})",
            RULE_KEYS.join(", ")
        )),
        None => Ok(()),
    }
}

fn rule_name(def: &Map) -> Result<String, String> {
    let name = get_str(def, "name")?.ok_or_else(|| "rule needs a `name`".to_string())?;
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(format!(
            "rule name {name:?} must be letters, digits, `_` or `-`"
        ));
    }
    Ok(name)
}

fn rule_scope(def: &Map) -> Result<RuleScope, String> {
    match get_str(def, "scope")?.as_deref() {
        None | Some("gpu") => Ok(RuleScope::Gpu),
        Some("host") => Ok(RuleScope::Host),
        Some("job") => Ok(RuleScope::Job),
        Some("process") => Ok(RuleScope::Process),
        Some(s) => Err(format!(
            "scope {s:?} must be \"gpu\", \"host\", \"job\" or \"process\""
        )),
    }
}

/// `action: "kill"` (process and job scopes only), `"drain"` (the node, in Slurm), `"taint"` (the
/// node, in Kubernetes), `"exec:NAME"`,
/// or several comma-separated.
fn rule_actions(def: &Map, scope: RuleScope) -> Result<Vec<Action>, String> {
    let mut actions = Vec::new();
    let Some(a) = get_str(def, "action")? else {
        return Ok(actions);
    };
    for part in a.split(',').map(str::trim) {
        let action = Action::parse(part).filter(|action| {
            *action != Action::Kill || matches!(scope, RuleScope::Process | RuleScope::Job)
        });
        match action {
            Some(action) if !actions.contains(&action) => actions.push(action),
            Some(_) => {}
            None => {
                return Err(format!(
                "action {part:?}: expected \"kill\" (process or job rules only), \"drain\", \"taint\" or \"exec:NAME\""
            ))
            }
        }
    }
    Ok(actions)
}

fn rule_every(def: &Map, scope: RuleScope) -> Result<Option<i64>, String> {
    let Some(v) = def.get("every").filter(|v| !v.is_unit()) else {
        return Ok(None);
    };
    if scope == RuleScope::Job {
        return Err("`every` is not allowed on job rules (they run at every job sample)".into());
    }
    let ms = api::any_duration_ms(v).map_err(|e| format!("`every`: {e}"))?;
    if ms > MAX_EVERY_MS {
        return Err(format!(
            "`every` = {} s is longer than the 24 h maximum",
            ms / 1000
        ));
    }
    Ok(Some(ms))
}

fn rule_labels(def: &Map) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    let Some(l) = def.get("labels") else {
        return Ok(labels);
    };
    let map = l
        .read_lock::<Map>()
        .ok_or_else(|| "`labels` must be a map".to_string())?;
    for (k, v) in map.iter() {
        if RESERVED_LABELS.contains(&k.as_str()) {
            return Err(format!(
                "label `{k}` is reserved (gpuwatch sets {})",
                RESERVED_LABELS.join(", ")
            ));
        }
        labels.insert(k.to_string(), v.to_string());
    }
    Ok(labels)
}

impl RuleSet {
    /// Loads every rule from `paths` (files or directories of `*.rhai`). Returns every error
    /// found, each naming `file:line:column`.
    pub fn load(paths: &[PathBuf], config: &RulesConfig) -> Result<RuleSet, Vec<RuleError>> {
        let files = rule_files(paths)?;
        let collector: Collector = Arc::new(Mutex::new(Vec::new()));
        let engine = Arc::new(new_engine(collector.clone()));
        let mut errors = Vec::new();
        let mut rules: Vec<Rule> = Vec::new();
        let mut retention_ms = MIN_RETENTION_MS;
        // Per metric, the longest duration literal of the files that name it (None: unnamed).
        let mut named: [Option<i64>; METRIC_COUNT] = [None; METRIC_COUNT];
        let mut param_keys_by_rule: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for path in &files {
            let file = path.display().to_string();
            let source = match std::fs::read_to_string(path) {
                Ok(s) => s,
                Err(e) => {
                    errors.push(RuleError::at(
                        &file,
                        Position::NONE,
                        format!("cannot read: {e}"),
                    ));
                    continue;
                }
            };
            let mut scope = unit_scope();
            let mut ast = match engine.compile_with_scope(&scope, &source) {
                Ok(a) => a,
                Err(e) => {
                    errors.push(RuleError::at(&file, e.position(), e.err_type().to_string()));
                    continue;
                }
            };
            ast.set_source(file.as_str());
            let ast = Arc::new(ast);
            // (a literal such as a `repeat` of days is no window)
            let longest = longest_duration_literal(&source).min(api::MAX_WINDOW_MS);
            retention_ms = retention_ms.max(longest);
            let window = longest_window_literal(&source).min(api::MAX_WINDOW_MS);
            for m in metrics_named(&source) {
                let r = &mut named[m as usize];
                *r = Some(r.unwrap_or(0).max(window));
            }
            let stem = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            let keys = param_keys(&source);
            if let Ok(mut c) = collector.lock() {
                c.clear();
            }
            api::PARAMS.with(|p| *p.borrow_mut() = Some(params_for(config, &stem)));
            api::LOADING.with(|l| l.set(true));
            CURRENT_RULE.with(|r| r.borrow_mut().clone_from(&file));
            let run = with_deadline(LOAD_BUDGET_MS, || {
                engine.run_ast_with_scope(&mut scope, &ast)
            });
            api::LOADING.with(|l| l.set(false));
            api::PARAMS.with(|p| *p.borrow_mut() = None);
            if let Err(e) = run {
                let over = is_over_budget(&e);
                let (pos, msg) = api::split_error(e);
                let msg = if over {
                    format!("the file's top level ran longer than {LOAD_BUDGET_MS} ms")
                } else {
                    msg
                };
                errors.push(RuleError::at(&file, pos, msg));
                continue;
            }
            let regs: Vec<Registration> = collector
                .lock()
                .map(|mut c| std::mem::take(&mut *c))
                .unwrap_or_default();
            if regs.is_empty() {
                errors.push(RuleError::at(
                    &file,
                    Position::new(1, 1),
                    "file registers no rule (call `rule(#{ name: .., check: |gpu| .. })`)",
                ));
            }
            for reg in regs {
                match build_rule(&file, reg, &ast, config) {
                    Ok(rule) => {
                        if let Some(prev) = rules.iter().find(|r| r.spec.name == rule.spec.name) {
                            errors.push(RuleError::at(
                                &file,
                                Position::new(rule.line.try_into().unwrap_or(1), 1),
                                format!(
                                    "rule `{}` already defined at {}",
                                    rule.spec.name, prev.spec.source
                                ),
                            ));
                        } else {
                            param_keys_by_rule
                                .entry(rule.spec.name.clone())
                                .or_default()
                                .extend(keys.iter().cloned());
                            param_keys_by_rule
                                .entry(stem.clone())
                                .or_default()
                                .extend(keys.iter().cloned());
                            rules.push(rule);
                        }
                    }
                    Err(e) => errors.push(e),
                }
            }
        }
        // Durations from the config reach every metric a rule names.
        let mut configured = MIN_RETENTION_MS;
        for table in config.params.values() {
            for v in table.values() {
                if let toml::Value::String(s) = v {
                    if let Ok(ms) = parse_duration_ms(s) {
                        configured = configured.max(ms);
                    }
                }
            }
        }
        if let Some(r) = config.retention {
            configured = configured.max(r.ms);
        }
        retention_ms = retention_ms.max(configured);
        let named_any = named.map(|n| n.is_some());
        let metric_retention_ms = named.map(|n| match n {
            Some(ms) => ms.max(configured) + RETENTION_MARGIN_MS,
            None => UNREAD_RETENTION_MS,
        });
        let budget_ms = config.budget_ms();
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(RuleSet {
            engine,
            rules,
            files,
            retention_ms: retention_ms + RETENTION_MARGIN_MS,
            metric_retention_ms,
            named: named_any,
            named_list: (0..METRIC_COUNT).filter(|i| named_any[*i]).collect(),
            budget_ms,
            param_keys: param_keys_by_rule,
        })
    }

    /// Problems with `[rules.params]`: overrides for rules that are not loaded or keys the rule's
    /// file never asks for with `param("key", ..)`.
    pub fn check_params(&self, config: &RulesConfig) -> Vec<String> {
        let mut problems = Vec::new();
        for (rule, table) in &config.params {
            match self.param_keys.get(rule) {
                None => problems.push(format!(
                    "[rules.params] {rule}: no loaded rule or rule file is called `{rule}`"
                )),
                Some(keys) => {
                    for k in table.keys() {
                        if !keys.contains(k) {
                            problems.push(format!(
                                "[rules.params] {rule}.{k}: the rule has no parameter `{k}` (it has: {})",
                                keys.iter().cloned().collect::<Vec<_>>().join(", ")
                            ));
                        }
                    }
                }
            }
        }
        problems
    }

    /// The loaded rules, in file order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Number of rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// True when no rule is loaded.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The files the rules came from.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// How much history windows must keep, ms: the longest duration any rule or the config
    /// names (at least [`MIN_RETENTION_MS`]), plus a minute. XID events are kept this long.
    pub fn retention_ms(&self) -> i64 {
        self.retention_ms
    }

    /// How much history the window of `metric` keeps, ms: for a metric some rule file names
    /// (its key as a word, or `throttled` for the clock-event reasons), the longest duration
    /// literal of those files that may be a window (not `keep_firing_for: "1h"`) and of the
    /// config, at least [`MIN_RETENTION_MS`], plus a minute;
    /// for a metric no rule names, [`UNREAD_RETENTION_MS`]. On 8 GPUs sampled every second
    /// that is the difference between ~4 MB and ~14 MB of windows after an hour.
    pub fn metric_retention_ms(&self, metric: Metric) -> i64 {
        self.metric_retention_ms[metric as usize]
    }

    /// Whether some rule file names `metric` (its key as a word, or `throttled` for the
    /// clock-event reasons): a rule reaches a metric only through its key, so one no file names
    /// is never read by the rules.
    pub fn names_metric(&self, metric: Metric) -> bool {
        self.named[metric as usize]
    }

    /// The metrics some rule file names ([`RuleSet::names_metric`]), by index in the metric
    /// table, in its order.
    pub fn named_metrics(&self) -> &[usize] {
        &self.named_list
    }

    /// Evaluates rule `idx` for one GPU at `now_ms`.
    pub fn eval_gpu(&self, idx: usize, gpu: &Arc<GpuHistory>, now_ms: i64) -> EvalResult {
        let handle = GpuHandle::new(gpu.clone(), now_ms);
        let default = || format!("{} on GPU {}", self.rules[idx].spec.name, gpu.id.index);
        self.eval(idx, Dynamic::from(handle), default)
    }

    /// [`RuleSet::eval_gpu`], also returning the inputs the check read when its result may be
    /// reused while they keep their values (a clean evaluation without `print`/`debug`).
    pub fn eval_gpu_traced(
        &self,
        idx: usize,
        gpu: &Arc<GpuHistory>,
        now_ms: i64,
    ) -> (EvalResult, Option<Trace>) {
        api::gpu::start_trace();
        let result = self.eval_gpu(idx, gpu, now_ms);
        let trace = api::gpu::finish_trace();
        let trace = trace.filter(|_| !matches!(result, EvalResult::Error(_)));
        (result, trace)
    }

    /// Evaluates host-scope rule `idx`, tracing the host fields and GPU inputs it reads: the
    /// trace is returned when the result can be reused while those read the same (see
    /// [`api::host::HostTrace`]).
    pub fn eval_host_traced(
        &self,
        idx: usize,
        host: HostHandle,
    ) -> (EvalResult, Option<api::host::HostTrace>) {
        let fields = host.clone_fields();
        api::gpu::start_trace();
        api::start_fields_trace();
        let result = self.eval_host(idx, host);
        let trace = api::host::finish_trace(fields, api::gpu::finish_trace());
        let trace = trace.filter(|_| !matches!(result, EvalResult::Error(_)));
        (result, trace)
    }

    /// Evaluates host-scope rule `idx`.
    pub fn eval_host(&self, idx: usize, host: HostHandle) -> EvalResult {
        let default = || format!("{} on {}", self.rules[idx].spec.name, host.hostname);
        let name = default();
        self.eval(idx, Dynamic::from(host), move || name)
    }

    /// Evaluates job-scope rule `idx` for one job sample.
    pub fn eval_job(&self, idx: usize, job: api::JobHandle) -> EvalResult {
        let name = format!("{} for job {}", self.rules[idx].spec.name, job.sample.pid);
        self.eval(idx, Dynamic::from(job), move || name)
    }

    /// [`RuleSet::eval_process`], also returning the GPU inputs the check read (through
    /// `p.gpu_series`) when its result may be reused while the process and those inputs keep
    /// their values (see [`RuleSet::eval_gpu_traced`]).
    pub fn eval_process_traced(
        &self,
        idx: usize,
        p: api::ProcessHandle,
    ) -> (EvalResult, Option<(api::process::ProcFields, Trace)>) {
        api::gpu::start_trace();
        api::start_fields_trace();
        let result = self.eval_process(idx, p);
        let fields = api::process::finish_trace();
        let trace = api::gpu::finish_trace();
        let trace = trace.filter(|_| !matches!(result, EvalResult::Error(_)));
        (result, trace.map(|t| (fields, t)))
    }

    /// Evaluates process-scope rule `idx` for one GPU process.
    pub fn eval_process(&self, idx: usize, p: api::ProcessHandle) -> EvalResult {
        let on = p
            .mig
            .as_ref()
            .map_or_else(String::new, |m| format!(" ({})", m.describe()));
        let name = format!(
            "{} for process {} on GPU {}{on}",
            self.rules[idx].spec.name, p.proc_.pid, p.proc_.gpu_index
        );
        self.eval(idx, Dynamic::from(p), move || name)
    }

    fn eval(&self, idx: usize, arg: Dynamic, default: impl FnOnce() -> String) -> EvalResult {
        let rule = &self.rules[idx];
        let rule_pos = Position::new(rule.line.try_into().unwrap_or(1), 1);
        api::NODATA.with(|c| c.set(false));
        api::PARAMS.with(|p| *p.borrow_mut() = Some(rule.params.clone()));
        CURRENT_RULE.with(|r| r.borrow_mut().clone_from(&rule.spec.name));
        let result: Result<Dynamic, _> = with_deadline(self.budget_ms, || {
            rule.check.call(&self.engine, &rule.ast, (arg,))
        });
        api::PARAMS.with(|p| *p.borrow_mut() = None);
        let nodata = api::NODATA.with(std::cell::Cell::get);
        let value = match result {
            Ok(v) => v,
            Err(e) => {
                let over_budget = is_over_budget(&e);
                let (pos, msg) = api::split_error(e);
                let pos = if pos.is_none() { rule_pos } else { pos };
                let msg = if over_budget {
                    format!(
                        "evaluation exceeded its time budget of {} ms and was stopped",
                        self.budget_ms
                    )
                } else {
                    msg
                };
                return EvalResult::Error(RuleError {
                    over_budget,
                    ..RuleError::at(&rule.file, pos, msg)
                });
            }
        };
        interpret(rule, value, nodata, default)
    }
}

/// What a check's returned value means: `()`/`false` quiet (or no data), `true` or a string
/// fires, a map fires with a summary, a severity and presentation annotations; control keys
/// (`action`, `pid`, …) and anything else are errors.
fn interpret(
    rule: &Rule,
    value: Dynamic,
    nodata: bool,
    default: impl FnOnce() -> String,
) -> EvalResult {
    let rule_pos = Position::new(rule.line.try_into().unwrap_or(1), 1);
    let quiet = if nodata {
        EvalResult::NoData
    } else {
        EvalResult::Quiet
    };
    if value.is_unit() {
        return quiet;
    }
    if value.is_array() {
        return per_gpu(rule, value, nodata, &default());
    }
    if let Ok(b) = value.as_bool() {
        return if b {
            EvalResult::Fire {
                summary: default(),
                annotations: BTreeMap::new(),
                severity: None,
                labels: BTreeMap::new(),
            }
        } else {
            quiet
        };
    }
    if value.is_string() {
        return EvalResult::Fire {
            summary: value.to_string(),
            annotations: BTreeMap::new(),
            severity: None,
            labels: BTreeMap::new(),
        };
    }
    if let Some(map) = value.read_lock::<Map>() {
        if !map.contains_key("summary") {
            // (a `()` or empty note is none)
            let text = |k: &str| {
                map.get(k)
                    .filter(|v| !v.is_unit())
                    .map(ToString::to_string)
                    .filter(|t| !t.is_empty())
            };
            let has = |k: &str| map.contains_key(k);
            let why = match (text("cleared"), text("stopped")) {
                (Some(_), Some(_)) => {
                    return EvalResult::Error(RuleError::at(
                        &rule.file,
                        rule_pos,
                        "check returned both `cleared` and `stopped`: an end is one or the other"
                            .to_string(),
                    ))
                }
                (Some(note), None) => Some(crate::model::EndReason::Cleared { note: Some(note) }),
                (None, Some(note)) => Some(crate::model::EndReason::StoppedRepeating { note }),
                (None, None) if has("cleared") => {
                    Some(crate::model::EndReason::Cleared { note: None })
                }
                (None, None) => None,
            };
            // Only a map of `cleared` or `stopped` alone is an end; with other keys it fires as
            // any map without a summary does (its keys become annotations).
            if let Some(why) = why.filter(|_| map.len() == 1) {
                return if nodata {
                    EvalResult::NoData
                } else {
                    EvalResult::Ended(why)
                };
            }
        }
        let mut annotations = BTreeMap::new();
        let mut summary = None;
        let mut severity = None;
        let mut values = Vec::new();
        let mut labels = BTreeMap::new();
        for (k, v) in map.iter() {
            match k.as_str() {
                "labels" => {
                    let Some(lm) = v.read_lock::<Map>() else {
                        return EvalResult::Error(RuleError::at(
                            &rule.file,
                            rule_pos,
                            "check returned `labels` that is not a map".to_string(),
                        ));
                    };
                    for (lk, lv) in lm.iter() {
                        if BUILTIN_LABELS.contains(&lk.as_str()) {
                            return EvalResult::Error(RuleError::at(
                                &rule.file,
                                rule_pos,
                                format!("check returned label `{lk}`, which gpuwatch sets itself"),
                            ));
                        }
                        labels.insert(
                            lk.to_string(),
                            crate::values::escape_control(&lv.to_string()),
                        );
                    }
                }
                "summary" => summary = Some(v.to_string()),
                "severity" => {
                    let sev = v.to_string();
                    match Severity::parse(&sev) {
                        Some(s) => severity = Some(s),
                        None => return EvalResult::Error(RuleError::at(
                            &rule.file,
                            rule_pos,
                            format!("check returned severity {sev:?}; expected info, warning or critical"),
                        )),
                    }
                }
                reserved if RESERVED_RESULT_KEYS.contains(&reserved) => {
                    return EvalResult::Error(RuleError::at(
                        &rule.file,
                        rule_pos,
                        format!(
                            "check returned `{reserved}`: a check cannot request actions or \
                             targets; declare `action:` on the rule (process and job scopes \
                             target their own process)"
                        ),
                    ));
                }
                "values" => {
                    if let Some(vm) = v.read_lock::<Map>() {
                        for (vk, vv) in vm.iter() {
                            values.push(format!("{vk}={vv}"));
                        }
                    } else {
                        values.push(v.to_string());
                    }
                }
                other => {
                    annotations.insert(other.to_string(), v.to_string());
                }
            }
        }
        if !values.is_empty() {
            annotations.insert("values".into(), values.join(", "));
        }
        return EvalResult::Fire {
            summary: summary.unwrap_or_else(default),
            annotations,
            severity,
            labels,
        };
    }
    EvalResult::Error(RuleError::at(
        &rule.file,
        rule_pos,
        format!(
            "check returned {}; expected a string (fires), true/false, () or a map",
            value.type_name()
        ),
    ))
}

/// A host-scope check's array of per-GPU results (see [`EvalResult::PerGpu`]): each element a
/// map with an integer `gpu` (the GPU index) and what a single result's map may hold.
fn per_gpu(rule: &Rule, value: Dynamic, nodata: bool, fallback: &str) -> EvalResult {
    let rule_pos = Position::new(rule.line.try_into().unwrap_or(1), 1);
    let bad = |msg: String| EvalResult::Error(RuleError::at(&rule.file, rule_pos, msg));
    if rule.scope != RuleScope::Host {
        return bad(
            "check returned an array: only a host-scope rule returns one result per GPU \
             (`[#{ gpu: 0, summary: .. }]`)"
                .to_string(),
        );
    }
    let items: rhai::Array = value.cast();
    if items.is_empty() {
        return if nodata {
            EvalResult::NoData
        } else {
            EvalResult::Quiet
        };
    }
    let mut out: Vec<(u32, EvalResult)> = Vec::with_capacity(items.len());
    for item in items {
        let Some(mut map) = item.read_lock::<Map>().map(|m| m.clone()) else {
            return bad(format!(
                "check returned an array holding {}; expected maps with a `gpu` index",
                item.type_name()
            ));
        };
        let gpu = map
            .remove("gpu")
            .and_then(|g| g.as_int().ok())
            .and_then(|g| u32::try_from(g).ok());
        let Some(gpu) = gpu else {
            return bad(
                "check returned an array element without an integer `gpu` (the GPU index)"
                    .to_string(),
            );
        };
        let name = format!("{fallback} (GPU {gpu})");
        let r = interpret(rule, Dynamic::from_map(map), false, move || name);
        if let EvalResult::Error(_) = r {
            return r;
        }
        if let Some(slot) = out.iter_mut().find(|(g, _)| *g == gpu) {
            slot.1 = r;
        } else {
            out.push((gpu, r));
        }
    }
    EvalResult::PerGpu(out)
}

/// The rule files under some paths with their modification times, to notice edits.
pub type FilesSignature = Vec<(PathBuf, Option<std::time::SystemTime>)>;

/// The [`FilesSignature`] of `paths` now.
pub fn files_signature(paths: &[PathBuf]) -> FilesSignature {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            if let Ok(rd) = std::fs::read_dir(p) {
                let mut files: Vec<PathBuf> = rd
                    .flatten()
                    .map(|e| e.path())
                    .filter(|f| f.extension().is_some_and(|x| x == "rhai"))
                    .collect();
                files.sort();
                for f in files {
                    let m = std::fs::metadata(&f).and_then(|m| m.modified()).ok();
                    out.push((f, m));
                }
            }
        } else {
            let m = std::fs::metadata(p).and_then(|m| m.modified()).ok();
            out.push((p.clone(), m));
        }
    }
    out
}

include!(concat!(env!("OUT_DIR"), "/stock_rules.rs"));

/// The stock rules directory: `rules/` of the source tree the executable was built in (a
/// development build), `../share/gpuwatch/rules` beside the executable (the .deb's
/// `/usr/share/gpuwatch/rules`, a wheel's `share/gpuwatch/rules` in its environment), or else the
/// copy carried inside the executable ([`STOCK_RULES`]), written once per version to a cache
/// directory ([`embedded_rules_dir`]) — so any install has its stock rules.
pub fn shipped_rules_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let has_rules = |d: &Path| d.join("gpu_lost.rhai").is_file();
    // (the source tree: up to 4 levels above the executable, target/release/ and such)
    if let Some(tree) = exe
        .ancestors()
        .skip(1)
        .take(4)
        .map(|d| d.join("rules"))
        .find(|d| has_rules(d))
    {
        return Some(tree);
    }
    if let Some(share) = exe
        .parent()
        .and_then(Path::parent)
        .map(|p| p.join("share/gpuwatch/rules"))
        .filter(|d| has_rules(d))
    {
        return Some(share);
    }
    match embedded_rules_dir() {
        Ok(d) => Some(d),
        Err(e) => {
            tracing::warn!("cannot write the built-in stock rules to a cache directory: {e}");
            None
        }
    }
}

/// Writes the stock rules carried inside the executable to
/// `$XDG_CACHE_HOME/gpuwatch/stock-rules-VERSION-HASH` (without it, or for root when that
/// directory is not root's own, `/var/cache/gpuwatch/…` for root and `~/.cache/gpuwatch/…` for
/// others), unless a trusted copy is there ([`trusted_copy`]), and returns that directory.
/// Read-only files: a local change belongs in a copy named in `[daemon] rules`. Several
/// processes may do this at once (eight ranks starting after an upgrade): each writes its own
/// temporary copy and renames it into place; a copy in place is never deleted under a reader,
/// only a damaged one is moved aside.
pub fn embedded_rules_dir() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let hash = crate::sys::fnv1a64_hex(
        STOCK_RULES
            .iter()
            .flat_map(|(name, text)| name.bytes().chain([0]).chain(text.bytes()).chain([0])),
    );
    let root = crate::sys::is_root();
    let xdg = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|x| x.is_absolute())
        // root takes no directory another user could change (sudo -E): its nearest existing
        // ancestor must be root's own
        .filter(|x| {
            !root
                || x.ancestors()
                    .find(|a| a.exists())
                    .is_some_and(crate::sys::owned_private)
        });
    let base = match xdg {
        Some(x) => Some(x),
        None if root => Some(PathBuf::from("/var/cache")),
        None => crate::sys::xdg_home("XDG_CACHE_HOME", ".cache"),
    };
    let Some(cache) = base.map(|b| b.join("gpuwatch")) else {
        return Err(std::io::Error::other(
            "neither XDG_CACHE_HOME nor HOME is set: no cache directory of this user's",
        ));
    };
    let dir = cache.join(format!(
        "stock-rules-{}-{}",
        env!("CARGO_PKG_VERSION"),
        &hash[..hash.len().min(12)]
    ));
    if trusted_copy(&dir) {
        return Ok(dir);
    }
    crate::sys::create_private_dir(&cache)?;
    if !crate::sys::owned_private(&cache) {
        return Err(std::io::Error::other(format!(
            "{} is not this user's own (or others may write it)",
            cache.display()
        )));
    }
    let unique = format!(
        "{}-{}-{}",
        crate::sys::hostname(),
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let tmp = cache.join(format!(".stock-rules-{unique}"));
    crate::sys::create_private_dir(&tmp)?;
    for (name, text) in STOCK_RULES {
        let path = tmp.join(name);
        std::fs::write(&path, text)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444))?;
    }
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    if std::fs::rename(&tmp, &dir).is_ok() {
        return Ok(dir);
    }
    if trusted_copy(&dir) {
        // another process put its copy there first
        let _ = std::fs::remove_dir_all(&tmp);
        return Ok(dir);
    }
    // a damaged or foreign copy: moved aside (a reader of it keeps what it opened), then ours
    let aside = cache.join(format!(".stale-stock-rules-{unique}"));
    std::fs::rename(&dir, &aside)?;
    std::fs::rename(&tmp, &dir)?;
    let _ = std::fs::remove_dir_all(&aside);
    Ok(dir)
}

/// Whether `dir` holds exactly the built-in stock rules, each file and the directory this
/// user's own and writable by no one else (a rule file slipped in beside them would be loaded).
fn trusted_copy(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    if !crate::sys::owned_private(dir) || !std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir())
    {
        return false;
    }
    let mut seen = 0;
    for e in entries {
        let Ok(e) = e else { return false };
        let name = e.file_name();
        let Some((_, text)) = STOCK_RULES.iter().find(|(n, _)| name.to_str() == Some(n)) else {
            return false;
        };
        let path = e.path();
        let regular = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file());
        if !regular
            || !crate::sys::owned_private(&path)
            || std::fs::read_to_string(&path).ok().as_deref() != Some(*text)
        {
            return false;
        }
        seen += 1;
    }
    seen == STOCK_RULES.len()
}

#[cfg(test)]
mod tests;
