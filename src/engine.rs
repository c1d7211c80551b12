//! The engine: windows + rules + alert lifecycle, a pure function of timestamped snapshots.
//!
//! [`Engine::observe`] ingests a [`Snapshot`] into the per-GPU windows and, when an evaluation is
//! due, evaluates every rule at the snapshot's time and steps the alert book;
//! [`Engine::advance`] evaluates host-scope rules (e.g. `collector_stale`) at a time when no
//! snapshot arrived. Both return the [`AlertEvent`]s to announce. The clock is always an argument
//! and there is no I/O, so `replay`, `test` and the daemon behave identically given the same
//! snapshots and the same evaluation interval.
//!
//! **Evaluation cadence** (Prometheus's `evaluation_interval`, per rule group): each rule runs
//! at most once per slot of its cadence — its own `every`, else `eval_interval_ms` (default 0 =
//! at every snapshot) — slots being aligned multiples of the cadence in UTC (`floor(t / every)`),
//! so a restarted daemon and a replay evaluate at the same instants. A rule skipped at a tick
//! leaves its alert instances (and its `rule_error` instance) untouched; `hold`,
//! `keep_firing_for` and `repeat` are measured in sample time and checked at the rule's
//! evaluation instants.
//!
//! While no snapshots arrive only host-scope rules run; per-GPU alerts keep their state (a stale
//! collector must not silently resolve them).
//!
//! **Restart.** [`Engine::state`] also carries, per GPU UUID, the last point of every counter
//! metric and the XID events within the retention ([`GpuCarry`]). [`Engine::with_state`] puts the
//! XIDs back into the GPU's history when its first sample arrives, and, at the first sample that
//! has a value for a counter, inserts the saved value as a baseline point one sampling interval
//! earlier when the counter grew (not when it dropped: a driver reload reset it), so an increase
//! made while gpuwatch was down is reported at the first sample after the restart.

pub mod ledger;
pub mod testfile;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use crate::alert::{
    AlertBook, AlertSpec, AlertStateFile, CounterPoint, GpuCarry, InstanceId, Outcome,
};
use crate::model::{
    AlertEvent, AlertStatus, DeviceState, EndReason, GpuSample, Metric, MetricKind, MissingGpu,
    Severity, Snapshot,
};
use crate::rules::api::{host::HostTrace, JobHandle, ProcessHandle};
use crate::rules::{EvalResult, GpuHandle, HostHandle, RuleError, RuleScope, RuleSet, Trace};
use crate::window::GpuHistory;
use std::borrow::Cow;

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Value of the `hostname` label.
    pub hostname: String,
    /// Cadence of rules without their own `every`: at most once per this many ms, at aligned
    /// instants (0 = every snapshot, the default).
    pub eval_interval_ms: i64,
    /// The configured sampling interval (`host.interval`), when known; otherwise observed.
    pub sample_interval_ms: Option<i64>,
    /// How much faster than the wall clock the snapshots' clock runs (`--speed`; `host.clock_speed`):
    /// a rule about the collector's own timing keeps a floor in wall time with it.
    pub clock_speed: f64,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            hostname: "localhost".into(),
            eval_interval_ms: 0,
            sample_interval_ms: None,
            clock_speed: 1.0,
        }
    }
}

/// Name of the alert a failing rule raises.
pub const RULE_ERROR: &str = "rule_error";

/// What a process-scope evaluation was given, read and returned (see `Engine::proc_memo`).
type ProcMemo = (
    crate::model::ProcSample,
    Option<crate::model::MigSample>,
    crate::rules::api::process::ProcFields,
    Trace,
    EvalResult,
);

/// Windows, rules and alert lifecycle.
#[derive(Debug)]
pub struct Engine {
    /// When the state it resumed from was saved (until the first sample after the restart).
    resumed_from_ms: Option<i64>,
    /// GPU indexes seen in snapshots since the restart (see `AlertBook::end_misplaced`).
    seen_since_resume: std::collections::BTreeSet<u32>,
    rules: RuleSet,
    opts: EngineOptions,
    gpus: BTreeMap<u32, Arc<GpuHistory>>,
    present: Vec<u32>,
    /// The rules due at the evaluation running (kept for its allocation).
    due: Vec<usize>,
    /// The present GPUs' histories while the GPU and process rules run (empty otherwise).
    hists: Vec<Arc<GpuHistory>>,
    /// Expected GPUs NVML does not enumerate, as the latest snapshot said (`host.missing_gpus`).
    missing: Vec<MissingGpu>,
    book: AlertBook,
    last_snapshot_ms: Option<i64>,
    first_seen_ms: Option<i64>,
    /// Per rule (same order as `rules`): when it was last evaluated.
    last_eval_ms: Vec<Option<i64>>,
    /// Per rule: its record of evaluations over the time budget.
    overrun: Vec<Overrun>,
    /// Evaluation order: per-sample (event) rules first, then windowed ones, each in file order.
    order: Vec<usize>,
    last_now_ms: i64,
    recent_snapshots: VecDeque<i64>,
    /// Per rule: the key and spec of its `rule_error` instance.
    rule_errors: Vec<(String, AlertSpec)>,
    /// Restored per-GPU data (by UUID) not yet applied to a history.
    carry: BTreeMap<String, GpuCarry>,
    /// Every XID of the last week (see [`ledger`]).
    ledger: ledger::XidLedger,
    /// Per rule (same order as `rules`), per GPU index: the inputs its last GPU-scope evaluation
    /// read and what it returned, reused while the inputs read the same (see below).
    memo: Vec<BTreeMap<u32, (Trace, EvalResult)>>,
    /// Per rule: the host fields and GPU inputs its last host-scope evaluation read and what it
    /// returned (reused the same way).
    host_memo: Vec<Option<(HostTrace, EvalResult)>>,
    /// Per rule: per (GPU index, PID), the process its last process-scope evaluation was given
    /// (and the MIG device it ran on), the process fields and GPU inputs it read and what it
    /// returned — reused while the process list says the same of those fields (a list is read
    /// every few seconds, and each changes every process's runtime; a quota rule is evaluated
    /// every tick and reads its memory).
    proc_memo: Vec<BTreeMap<(u32, u32), ProcMemo>>,
    /// Whether results are reused (always, except to prove that reuse changes nothing).
    reuse: bool,
    /// Evaluations answered from `memo`/`host_memo`/`proc_memo`, and those that ran their
    /// script.
    reused: u64,
    ran: u64,
    /// Per rule (same order as `rules`): evaluations that ran its script.
    ran_by_rule: Vec<u64>,
    /// Wall time spent evaluating rules at snapshots.
    eval_time: std::time::Duration,
}

impl Engine {
    /// A fresh engine with no alert state.
    pub fn new(rules: RuleSet, opts: EngineOptions) -> Self {
        Engine {
            last_eval_ms: vec![None; rules.len()],
            overrun: vec![Overrun::default(); rules.len()],
            memo: vec![BTreeMap::new(); rules.len()],
            host_memo: vec![None; rules.len()],
            proc_memo: vec![BTreeMap::new(); rules.len()],
            reuse: true,
            reused: 0,
            ran: 0,
            ran_by_rule: vec![0; rules.len()],
            eval_time: std::time::Duration::ZERO,
            order: evaluation_order(&rules),
            rule_errors: rule_error_specs(&rules),
            rules,
            opts,
            gpus: BTreeMap::new(),
            present: Vec::new(),
            due: Vec::new(),
            hists: Vec::new(),
            missing: Vec::new(),
            book: AlertBook::new(),
            last_snapshot_ms: None,
            first_seen_ms: None,
            last_now_ms: 0,
            recent_snapshots: VecDeque::new(),
            carry: BTreeMap::new(),
            ledger: ledger::XidLedger::default(),
            resumed_from_ms: None,
            seen_since_resume: std::collections::BTreeSet::new(),
        }
    }

    /// An engine resuming from persisted alert state: firing alerts are not announced again;
    /// pending timers resume where they were (the downtime does not count toward a rule's
    /// `for`, as in Prometheus); while the windows fill again (half the longest window a rule
    /// reads), no data does not resolve a resumed alert; saved XIDs and counter values return
    /// with each GPU's first sample (see the module docs).
    pub fn with_state(rules: RuleSet, opts: EngineOptions, state: &AlertStateFile) -> Self {
        let mut e = Engine::new(rules, opts);
        e.book = AlertBook::from_state(state);
        e.resumed_from_ms = Some(state.saved_at_ms);
        e.last_now_ms = state.saved_at_ms;
        e.carry = state
            .gpus
            .iter()
            .filter(|g| !g.uuid.is_empty())
            .map(|g| (g.uuid.clone(), g.clone()))
            .collect();
        e.ledger = ledger::XidLedger::from_entries(&state.xid_ledger);
        e
    }

    /// The state to persist (`alert::save_state`): alert instances, and per GPU UUID the last
    /// counter values and the XIDs within the retention.
    pub fn state(&self) -> AlertStateFile {
        let mut state = self.book.state(self.last_now_ms);
        let cutoff = self.last_now_ms - self.rules.retention_ms();
        let mut gpus = self.carry.clone();
        for h in self.gpus.values() {
            if h.id.uuid.is_empty() {
                continue;
            }
            let entry = gpus.entry(h.id.uuid.clone()).or_insert_with(|| GpuCarry {
                uuid: h.id.uuid.clone(),
                ..GpuCarry::default()
            });
            for m in counter_metrics() {
                if let Some((time_ms, value)) = h.window(m).newest() {
                    entry
                        .counters
                        .insert(m.key().to_string(), CounterPoint { time_ms, value });
                }
            }
            for x in &h.xids {
                if !entry.xids.contains(x) {
                    entry.xids.push(x.clone());
                }
            }
        }
        state.gpus = gpus
            .into_values()
            .map(|mut g| {
                g.xids.retain(|x| x.time_ms >= cutoff);
                g.xids.sort_by_key(|x| x.time_ms);
                g
            })
            .filter(|g| !g.counters.is_empty() || !g.xids.is_empty())
            .collect();
        state.xid_ledger = self.ledger.entries();
        state
    }

    /// Turns reuse of GPU-scope results off or on (on by default). Off, every due rule runs its
    /// script for every GPU; the events are the same either way, which the tests check.
    pub fn set_reuse(&mut self, reuse: bool) {
        self.reuse = reuse;
        if !reuse {
            self.memo.iter_mut().for_each(BTreeMap::clear);
            self.host_memo.iter_mut().for_each(|m| *m = None);
            self.proc_memo.iter_mut().for_each(BTreeMap::clear);
        }
    }

    /// Evaluations so far (of any scope) whose result was reused, and those that ran the script.
    pub fn reuse_stats(&self) -> (u64, u64) {
        (self.reused, self.ran)
    }

    /// Per rule (in the order of [`Engine::rules`], since the last reload): evaluations that ran
    /// its script.
    pub fn runs_by_rule(&self) -> &[u64] {
        &self.ran_by_rule
    }

    /// Counts one evaluation of rule `idx` that ran its script.
    fn count_run(&mut self, idx: usize) {
        self.ran += 1;
        if let Some(n) = self.ran_by_rule.get_mut(idx) {
            *n += 1;
        }
    }

    /// Wall time spent evaluating rules at snapshots since the engine was made.
    pub fn eval_time(&self) -> std::time::Duration {
        self.eval_time
    }

    /// Number of loaded rules.
    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }

    /// The loaded rules.
    pub fn rules(&self) -> &RuleSet {
        &self.rules
    }

    /// The options.
    pub fn options(&self) -> &EngineOptions {
        &self.opts
    }

    /// Live alert instances (pending and firing).
    pub fn alerts(&self) -> impl Iterator<Item = &crate::alert::AlertInstanceState> {
        self.book.instances()
    }

    /// Replaces the rule set, keeping the alert state of rules that still exist. Firing alerts of
    /// removed rules are resolved (returned).
    pub fn reload(&mut self, rules: RuleSet) -> Vec<AlertEvent> {
        let names: Vec<String> = rules.rules().iter().map(|r| r.spec.name.clone()).collect();
        // Keep each surviving rule's last evaluation time, so a reload does not shift cadences.
        let previous: BTreeMap<&str, Option<i64>> = self
            .rules
            .rules()
            .iter()
            .map(|r| r.spec.name.as_str())
            .zip(self.last_eval_ms.iter().copied())
            .collect();
        self.last_eval_ms = names
            .iter()
            .map(|n| previous.get(n.as_str()).copied().flatten())
            .collect();
        self.overrun = vec![Overrun::default(); rules.len()];
        self.memo = vec![BTreeMap::new(); rules.len()];
        self.host_memo = vec![None; rules.len()];
        self.proc_memo = vec![BTreeMap::new(); rules.len()];
        self.ran_by_rule = vec![0; rules.len()];
        self.order = evaluation_order(&rules);
        self.rule_errors = rule_error_specs(&rules);
        self.rules = rules;
        let now = self.last_now_ms;
        // Instance keys are `rule`, `rule/gpuN/pid:P` (process scope) or `rule/job:PID`, and
        // `rule_error/rule`; rule names cannot contain `/`.
        self.book.retain_keys(now, &EndReason::RuleRemoved, |key| {
            let key = key
                .strip_prefix(RULE_ERROR)
                .and_then(|k| k.strip_prefix('/'))
                .unwrap_or(key);
            let rule = key.split('/').next().unwrap_or(key);
            names.iter().any(|n| n == rule)
        })
    }

    /// Ingests a snapshot and evaluates, at its time, the rules whose evaluation is due.
    pub fn observe(&mut self, snap: &Snapshot) -> Vec<AlertEvent> {
        let now = snap.time_ms;
        self.resume(now);
        self.ingest(snap);
        // Alerts restored from before a restart about a GPU no longer at their index (only
        // until they are all checked: nothing per tick after that).
        let mut events = Vec::new();
        if self.book.restoring() {
            self.seen_since_resume
                .extend(snap.gpus.iter().map(|g| g.id.index));
            let uuid_at = |i: u32| {
                snap.gpus
                    .iter()
                    .find(|g| g.id.index == i)
                    .map(|g| g.id.uuid.as_str())
            };
            events = self
                .book
                .end_misplaced(now, uuid_at, &self.seen_since_resume);
        }
        // The same monotonic clock the rules' time budget reads; it changes no result.
        let started = std::time::Instant::now();
        events.extend(self.evaluate(now, true));
        self.eval_time += started.elapsed();
        self.attach_charts(&mut events, now);
        events
    }

    /// Gives each firing GPU alert the chart of what its rule looked at: the metric it read over
    /// the longest window (at least 10 minutes), from the rule's last evaluation trace.
    fn attach_charts(&self, events: &mut [AlertEvent], now: i64) {
        for ev in events.iter_mut() {
            if ev.status != AlertStatus::Firing || ev.chart.is_some() {
                continue;
            }
            let Some(gpu) = ev.gpu else { continue };
            let Some(idx) = self
                .rules
                .rules()
                .iter()
                .position(|r| r.spec.name == ev.name)
            else {
                continue;
            };
            let traced = self
                .memo
                .get(idx)
                .and_then(|m| m.get(&gpu))
                .and_then(|(trace, _)| trace.main_series());
            let (Some((metric, window)), Some(hist)) = (traced, self.gpus.get(&gpu)) else {
                continue;
            };
            let window = window.clamp(10 * 60_000, 24 * 3_600_000);
            let points: Vec<(i64, f64)> =
                hist.window(metric).points_in(now - window, now).collect();
            if points.len() >= 2 {
                ev.chart = Some(crate::model::AlertChart::new(metric, window, &points));
            }
        }
    }

    /// Evaluates host-scope rules at `now_ms` with no new data (call it periodically, e.g. every
    /// sampling interval, so `collector_stale` can fire).
    pub fn advance(&mut self, now_ms: i64) -> Vec<AlertEvent> {
        self.first_seen_ms.get_or_insert(now_ms);
        if now_ms < self.last_now_ms {
            return Vec::new();
        }
        self.resume(now_ms);
        self.evaluate(now_ms, false)
    }

    /// At the first evaluation after a restart: the downtime is taken out of pending timers,
    /// and resumed alerts wait for their windows before no data can resolve them.
    fn resume(&mut self, now: i64) {
        let Some(saved) = self.resumed_from_ms.take() else {
            return;
        };
        let warm_up = self.rules.retention_ms() / 2;
        self.book
            .resume((now - saved).max(0), now.saturating_add(warm_up));
    }

    /// The cadence of rule `idx`, ms: its `every`, else the global interval (0 = every time).
    pub fn cadence_ms(&self, idx: usize) -> i64 {
        self.rules.rules()[idx]
            .every_ms
            .unwrap_or(self.opts.eval_interval_ms)
    }

    /// Whether rule `idx` is due at `now_ms`: the aligned slot `floor(t / cadence)` changed
    /// since its last evaluation (with cadence 0: any later time). Marks it evaluated if so.
    fn rule_due(&mut self, idx: usize, now_ms: i64) -> bool {
        let cadence = self.cadence_ms(idx);
        let slot = |t: i64| {
            if cadence > 0 {
                t.div_euclid(cadence)
            } else {
                t
            }
        };
        let Some(last) = self.last_eval_ms.get_mut(idx) else {
            return false;
        };
        if last.is_some_and(|l| slot(now_ms) <= slot(l)) {
            return false;
        }
        *last = Some(now_ms);
        true
    }

    fn ingest(&mut self, snap: &Snapshot) {
        let now = snap.time_ms;
        self.first_seen_ms.get_or_insert(now);
        if self.last_snapshot_ms.is_some_and(|t| now <= t) {
            // Out of order or duplicate: windows ignore older points, but keep XIDs.
        } else {
            self.last_snapshot_ms = Some(now);
            self.recent_snapshots.push_back(now);
            if self.recent_snapshots.len() > 16 {
                self.recent_snapshots.pop_front();
            }
        }
        self.present.clear();
        if self.missing != snap.missing {
            self.missing.clone_from(&snap.missing);
        }
        let cutoff = now - self.rules.retention_ms();
        let rules = &self.rules;
        let retention = |m: Metric| rules.metric_retention_ms(m);
        for sample in &snap.gpus {
            let index = sample.id.index;
            let entry = self
                .gpus
                .entry(index)
                .or_insert_with(|| Arc::new(GpuHistory::new(sample.id.clone())));
            if !sample.id.uuid.is_empty()
                && !entry.id.uuid.is_empty()
                && entry.id.uuid != sample.id.uuid
            {
                // A different board at this index: start over.
                *entry = Arc::new(GpuHistory::new(sample.id.clone()));
            }
            let h = Arc::make_mut(entry);
            if let Some(carry) = self.carry.get_mut(&sample.id.uuid) {
                restore(h, carry, sample, self.opts.sample_interval_ms, |m| {
                    rules.names_metric(m)
                });
                if carry.counters.is_empty() && carry.xids.is_empty() {
                    self.carry.remove(&sample.id.uuid);
                }
            }
            // (no window for a metric no rule file names: no rule can read it, and a daemon
            // touched a window per metric per GPU every second)
            h.push_only(sample, rules.named_metrics().iter().copied());
            if h.evict_due(now) {
                h.evict_before(cutoff, now, retention);
            }
            if h.mig.len() != snap.mig_of(index).count()
                || !snap.mig_of(index).zip(&h.mig).all(|(a, b)| a == b)
            {
                h.mig = snap.mig_of(index).cloned().collect();
            }
            if !(snap.pods.is_empty() && h.pods.is_none()) {
                let pods = crate::model::pod_labels(&snap.pods, index);
                if pods != h.pods {
                    h.pods = pods;
                }
            }
            // a new reading of its links (a slow-path round): the view follows the one before,
            // however many snapshots came without a current reading (kept for the rises, hidden
            // from rules meanwhile)
            match snap.nvlink.iter().find(|n| n.gpu == index) {
                Some(n) => {
                    if h.nvlink.as_ref().is_none_or(|v| v.time_ms != n.time_ms) {
                        let view = crate::model::nvlink::NvlinkView::next(h.nvlink.as_deref(), n);
                        h.nvlink = Some(Arc::new(view));
                    }
                    h.nvlink_stale = false;
                }
                None => h.nvlink_stale = true,
            }
            self.present.push(index);
        }
        if let Some(procs) = &snap.processes {
            for (index, h) in &mut self.gpus {
                // (compared in place: a recording lists them at every tick, mostly the same)
                let on_gpu = || procs.iter().filter(|p| p.gpu_index == *index);
                if !on_gpu().eq(h.processes.iter()) {
                    Arc::make_mut(h).processes = on_gpu().cloned().collect();
                }
            }
        }
        for x in &snap.xids {
            if let Some(h) = self.gpus.get_mut(&x.gpu_index) {
                let note = self.ledger.record(x);
                Arc::make_mut(h).push_xid(note);
            }
        }
    }

    fn interval_ms(&self) -> Option<i64> {
        if let Some(i) = self.opts.sample_interval_ms.filter(|i| *i > 0) {
            return Some(i);
        }
        crate::window::median_gap(&self.recent_snapshots)
    }

    /// The host at `now_ms` as a host-scope rule sees it, its `present` GPUs listed by index
    /// but not yet given (see [`Engine::gpu_handles`]).
    fn host_handle(&self, now_ms: i64, present: &[u32]) -> HostHandle {
        #[expect(clippy::cast_precision_loss, reason = "ms")]
        let secs = |ms: i64| ms as f64 / 1000.0;
        let reference = self.last_snapshot_ms.or(self.first_seen_ms);
        HostHandle {
            gpus: Vec::new(),
            present: present
                .iter()
                .copied()
                .filter(|i| self.gpus.contains_key(i))
                .collect(),
            hostname: self.opts.hostname.clone(),
            now_ms,
            sample_age_s: reference.map(|t| secs(now_ms - t)),
            clock_speed: self.opts.clock_speed,
            interval_s: self.interval_ms().map(secs),
            missing: self.missing.clone(),
        }
    }

    /// The GPUs `host` lists as present, as `host.gpus` gives them.
    fn gpu_handles(&self, host: &HostHandle) -> Vec<GpuHandle> {
        host.present
            .iter()
            .filter_map(|i| self.gpus.get(i))
            .map(|h| GpuHandle::new(h.clone(), host.now_ms))
            .collect()
    }

    /// Steps the `rule_error` alert of rule `idx`: active while its last evaluation failed
    /// (naming the script location), inactive once it runs cleanly again.
    fn step_rule_error(
        &mut self,
        idx: usize,
        now: i64,
        error: Option<RuleError>,
        events: &mut Vec<AlertEvent>,
    ) {
        let Some((key, err_spec)) = self.rule_errors.get(idx) else {
            return;
        };
        // (no error and no error alert: nothing to step, as at almost every evaluation)
        if error.is_none() && self.book.untracked(key, None) {
            return;
        }
        let outcome = match error {
            Some(e) => Outcome::Active {
                summary: format!("rule {} failed: {e}", self.rules.rules()[idx].spec.name),
                annotations: [("error_location".to_string(), e.location())]
                    .into_iter()
                    .collect(),
            },
            None => Outcome::Inactive,
        };
        let subject = Subject {
            key,
            gpu: None,
            extra: vec![("rule".into(), self.rules.rules()[idx].spec.name.clone())],
            target_pid: None,
            target_start: None,
            target_local: false,
        };
        events.extend(step(
            &mut self.book,
            &self.opts.hostname,
            now,
            err_spec,
            &subject,
            outcome,
            None,
        ));
    }

    /// Whether rule `idx` is suspended at `now_ms` for exceeding its time budget; when a
    /// suspension has just ended, the rule gets one more try before the next, longer one.
    fn suspended(&mut self, idx: usize, now_ms: i64) -> bool {
        let Some(o) = self.overrun.get_mut(idx) else {
            return false;
        };
        match o.suspended_until_ms {
            Some(until) if now_ms < until => true,
            Some(_) => {
                o.suspended_until_ms = None;
                o.strikes = SUSPEND_AFTER.saturating_sub(1);
                false
            }
            None => false,
        }
    }

    /// Books the budget outcome of one evaluation of rule `idx`: a clean run clears its record;
    /// [`SUSPEND_AFTER`] evaluations in a row over budget suspend it (60 s, doubling up to 1 h)
    /// and say so in the error.
    fn note_budget(
        &mut self,
        idx: usize,
        now_ms: i64,
        error: Option<RuleError>,
    ) -> Option<RuleError> {
        let o = self.overrun.get_mut(idx)?;
        let Some(mut e) = error else {
            *o = Overrun::default();
            return None;
        };
        if !e.over_budget {
            o.strikes = 0;
            return Some(e);
        }
        o.strikes += 1;
        if o.strikes >= SUSPEND_AFTER {
            o.backoff_ms = if o.backoff_ms == 0 {
                FIRST_SUSPENSION_MS
            } else {
                (o.backoff_ms * 2).min(MAX_SUSPENSION_MS)
            };
            o.suspended_until_ms = Some(now_ms + o.backoff_ms);
            o.strikes = 0;
            e.message = format!(
                "{}; suspended for {} s after {SUSPEND_AFTER} evaluations in a row over budget \
                 (the other rules keep running)",
                e.message,
                o.backoff_ms / 1000
            );
            tracing::warn!(rule = %self.rules.rules()[idx].spec.name, "{e}");
        }
        Some(e)
    }

    fn evaluate(&mut self, now: i64, gpu_rules: bool) -> Vec<AlertEvent> {
        self.last_now_ms = self.last_now_ms.max(now);
        let mut events = Vec::new();
        // (taken while the rules run, which do not change it, and put back)
        let present = std::mem::take(&mut self.present);
        // The rules due now, in evaluation order. Job rules run in `evaluate_job`; per-GPU and
        // process rules need a snapshot. A rule not due is skipped with its instances untouched.
        let mut due = std::mem::take(&mut self.due);
        due.clear();
        for k in 0..self.order.len() {
            let idx = self.order[k];
            let runs = match self.rules.rules()[idx].scope {
                RuleScope::Job => false,
                RuleScope::Gpu | RuleScope::Process => gpu_rules,
                RuleScope::Host => true,
            };
            if runs && !self.suspended(idx, now) && self.rule_due(idx, now) {
                due.push(idx);
            }
        }
        // The present GPUs' histories, shared once for the GPU and process rules (not once
        // per rule: two atomic operations each, a tenth of the evaluation's own time), and
        // let go before the next snapshot changes them.
        let mut hists = std::mem::take(&mut self.hists);
        hists.clear();
        if gpu_rules {
            hists.extend(present.iter().filter_map(|i| self.gpus.get(i).cloned()));
        }
        for &idx in &due {
            let error = match self.rules.rules()[idx].scope {
                RuleScope::Gpu => self.evaluate_gpus(idx, now, &hists, &mut events),
                RuleScope::Process => {
                    self.evaluate_processes(idx, now, &present, &hists, &mut events)
                }
                RuleScope::Host => {
                    let result = self.eval_host(idx, now, &present);
                    self.step_host(idx, now, result, &present, &mut events)
                }
                RuleScope::Job => continue,
            };
            let error = self.note_budget(idx, now, error);
            self.step_rule_error(idx, now, error, &mut events);
        }
        hists.clear();
        self.hists = hists;
        self.present = present;
        self.due = due;
        events
    }

    /// Steps host-scope rule `idx` with one evaluation's `result`: a per-GPU result steps one
    /// instance per present GPU (those not listed are quiet) and ends the host-wide instance; a
    /// single result steps the host-wide instance, and a quiet one also ends the rule's per-GPU
    /// instances (restored ones included). A GPU that is not present keeps its instance as it is
    /// (a late GPU is no evidence either way).
    fn step_host(
        &mut self,
        idx: usize,
        now: i64,
        result: EvalResult,
        present: &[u32],
        events: &mut Vec<AlertEvent>,
    ) -> Option<RuleError> {
        let name = self.rules.rules()[idx].spec.name.clone();
        let per_gpu_live = |book: &crate::alert::AlertBook| {
            book.instances().any(|i| i.key == name && i.gpu.is_some())
        };
        let (items, host_result) = match result {
            EvalResult::PerGpu(items) => (Some(items), EvalResult::Quiet),
            EvalResult::Error(e) => return Some(e),
            other @ (EvalResult::Quiet | EvalResult::NoData | EvalResult::Ended(_))
                if per_gpu_live(&self.book) =>
            {
                (Some(Vec::new()), other)
            }
            other => (None, other),
        };
        if let Some(items) = items {
            // GPUs not listed: what the host-wide instance gets (quiet, or no data).
            let quiet = host_result.clone();
            for index in present {
                let Some(hist) = self.gpus.get(index).cloned() else {
                    continue;
                };
                let r = items
                    .iter()
                    .find(|(g, _)| g == index)
                    .map_or_else(|| quiet.clone(), |(_, r)| r.clone());
                self.step_result(idx, now, r, Subject::gpu(&hist), events);
            }
        }
        self.step_result(idx, now, host_result, Subject::plain(), events)
    }

    /// Steps the instance `subject` of rule `idx` with one evaluation's `result`; returns the
    /// error when the evaluation failed (the instance is then left as it was).
    fn step_result(
        &mut self,
        idx: usize,
        now: i64,
        result: EvalResult,
        mut subject: Subject<'_>,
        events: &mut Vec<AlertEvent>,
    ) -> Option<RuleError> {
        let (outcome, severity) = match result {
            EvalResult::Error(e) => return Some(e),
            EvalResult::Fire {
                summary,
                annotations,
                severity,
                labels,
            } => {
                subject
                    .extra
                    .extend(labels.into_iter().map(|(k, v)| (k.into(), v)));
                (
                    Outcome::Active {
                        summary,
                        annotations,
                    },
                    severity,
                )
            }
            EvalResult::Quiet => (Outcome::Inactive, None),
            EvalResult::Ended(why) => (Outcome::Ended(why), None),
            EvalResult::NoData => (Outcome::NoData, None),
            // Only host rules return per-GPU results, and `step_host` splits them.
            EvalResult::PerGpu(_) => (Outcome::Inactive, None),
        };
        let spec = &self.rules.rules()[idx].spec;
        let hostname = &self.opts.hostname;
        events.extend(step(
            &mut self.book,
            hostname,
            now,
            spec,
            &subject,
            outcome,
            severity,
        ));
        None
    }

    /// Evaluates GPU-scope rule `idx` for every present GPU. An evaluation over the time budget
    /// stops the rule for this tick (its other GPUs keep their state). Returns the first script
    /// error.
    fn evaluate_gpus(
        &mut self,
        idx: usize,
        now: i64,
        hists: &[Arc<GpuHistory>],
        events: &mut Vec<AlertEvent>,
    ) -> Option<RuleError> {
        let mut error: Option<RuleError> = None;
        for hist in hists {
            let Some(result) = self.eval_gpu(idx, hist, now) else {
                continue;
            };
            if let Some(e) = self.step_result(idx, now, result, Subject::gpu(hist), events) {
                let stop = e.over_budget;
                if error.as_ref().is_none_or(|prev| !prev.over_budget && stop) {
                    error = Some(e);
                }
                if stop {
                    break;
                }
            }
        }
        error
    }
}

impl Engine {
    /// Rule `idx`'s result for the GPU of `hist` at `now`: the previous one when every input
    /// that evaluation read still reads the same (the check would compute the same result — see
    /// `rules::api::gpu` on traces), else a fresh evaluation, remembered when it is reusable.
    /// `None` when stepping the result would change nothing ([`Engine::inert`]).
    fn eval_gpu(&mut self, idx: usize, hist: &Arc<GpuHistory>, now: i64) -> Option<EvalResult> {
        let index = hist.id.index;
        if self.reuse {
            if let Some((trace, result)) = self.memo.get(idx).and_then(|m| m.get(&index)) {
                if trace.holds(hist, now) {
                    self.reused += 1;
                    // (a cleared message need not be copied to be dropped)
                    let name = &self.rules.rules()[idx].spec.name;
                    return (!self.inert(result, name, Some(index))).then(|| result.clone());
                }
            }
        }
        // Traced with reuse off too: the trace also says what an alert's chart shows.
        self.count_run(idx);
        let (result, trace) = self.rules.eval_gpu_traced(idx, hist, now);
        if let Some(memo) = self.memo.get_mut(idx) {
            match trace {
                Some(trace) => memo.insert(index, (trace, result.clone())),
                None => memo.remove(&index),
            };
        }
        let name = &self.rules.rules()[idx].spec.name;
        (!self.inert(&result, name, Some(index))).then_some(result)
    }

    /// Whether stepping instance (`key`, `gpu`) with `result` would change nothing: a quiet or
    /// ending result for an instance that is neither live nor restored (most evaluations) —
    /// such a result is not stepped, and its labels and key need not be made.
    fn inert(&self, result: &EvalResult, key: &str, gpu: Option<u32>) -> bool {
        matches!(result, EvalResult::Quiet | EvalResult::Ended(_)) && self.book.untracked(key, gpu)
    }

    /// Host-scope rule `idx`'s result: the previous one when the host fields and the GPU inputs
    /// it read are the same, else a fresh evaluation (see `eval_gpu`).
    fn eval_host(&mut self, idx: usize, now: i64, present: &[u32]) -> EvalResult {
        let mut host = self.host_handle(now, present);
        if self.reuse {
            if let Some(Some((trace, result))) = self.host_memo.get(idx) {
                let gpu = |i: u32| self.gpus.get(&i).map(|h| &**h);
                if trace.holds(&host, gpu) {
                    self.reused += 1;
                    return result.clone();
                }
            }
        }
        host.gpus = self.gpu_handles(&host);
        self.count_run(idx);
        let (result, trace) = self.rules.eval_host_traced(idx, host);
        if let Some(memo) = self.host_memo.get_mut(idx) {
            *memo = trace.map(|t| (t, result.clone()));
        }
        result
    }

    /// Evaluates process-scope rule `idx` for every process in the latest process list of each
    /// present GPU. Instances are keyed `rule/gpuN/pid:P`, labelled with `pid` (and `user`) and
    /// target that process, whose start time they keep; those of processes that left the list
    /// resolve, and so does one whose PID now belongs to another process (another start time:
    /// the PID was reused), whose new process starts an instance of its own. Returns the first
    /// script error.
    fn evaluate_processes(
        &mut self,
        idx: usize,
        now: i64,
        present: &[u32],
        hists: &[Arc<GpuHistory>],
        events: &mut Vec<AlertEvent>,
    ) -> Option<RuleError> {
        let prefix = format!("{}/gpu", self.rules.rules()[idx].spec.name);
        let mut seen = std::collections::BTreeSet::new();
        let mut listed = std::collections::BTreeSet::new();
        let mut error: Option<RuleError> = None;
        let mut key_buf = String::new();
        'gpus: for hist in hists {
            let index = &hist.id.index;
            for p in &hist.processes {
                listed.insert((*index, p.pid));
                // on a GPU with MIG on: the MIG device it runs on (`p.mig`, label `mig`)
                let mig = hist.mig.iter().find(|m| m.pids.contains(&p.pid));
                let result = self.eval_process(idx, hist, p, mig, now);
                key_buf.clear();
                key_buf.push_str(&prefix);
                crate::values::push_u64(&mut key_buf, u64::from(*index));
                key_buf.push_str("/pid:");
                crate::values::push_u64(&mut key_buf, u64::from(p.pid));
                if self.inert(&result, &key_buf, Some(*index)) {
                    continue;
                }
                let key = key_buf.clone();
                // Another process at a known PID: the old one's instance goes first.
                events.extend(
                    self.book
                        .end_replaced(now, &key, Some(*index), p.start_ticks),
                );
                let mut extra = vec![("pid".into(), p.pid.to_string())];
                if let Some(u) = &p.user {
                    extra.push(("user".into(), crate::values::escape_control(u)));
                }
                if let Some(m) = mig {
                    extra.push(("mig".into(), m.describe()));
                }
                let subject = Subject {
                    key: &key,
                    gpu: Some(hist),
                    extra,
                    target_pid: Some(p.pid),
                    target_start: p.start_ticks,
                    target_local: false,
                };
                if let Some(e) = self.step_result(idx, now, result, subject, events) {
                    let stop = e.over_budget;
                    error.get_or_insert(e);
                    // A failed evaluation says nothing about the process: its alert stays.
                    seen.insert(key);
                    if stop {
                        // Keep the instances not evaluated this tick as they are.
                        seen.extend(
                            self.book
                                .instances()
                                .filter(|i| i.key.starts_with(&prefix))
                                .map(|i| i.key.clone()),
                        );
                        break 'gpus;
                    }
                    continue;
                }
                seen.insert(key);
            }
        }
        // A GPU missing from this snapshot (late: a gap) keeps its process alerts as they are.
        let absent: Vec<String> = self
            .book
            .instances()
            .filter_map(|i| {
                let rest = i.key.strip_prefix(&prefix)?;
                let (index, _) = rest.split_once('/')?;
                let index: u32 = index.parse().ok()?;
                (!present.contains(&index)).then(|| i.key.clone())
            })
            .collect();
        seen.extend(absent);
        // A lost GPU lists no processes: its process alerts end because the GPU is lost, not
        // because their processes left it.
        let on_lost: Vec<String> = self
            .book
            .instances()
            .filter(|i| i.key.starts_with(&prefix) && !seen.contains(&i.key))
            .filter(|i| {
                i.gpu
                    .and_then(|g| self.gpus.get(&g))
                    .is_some_and(|h| h.state == DeviceState::Lost)
            })
            .map(|i| i.key.clone())
            .collect();
        events.extend(self.book.retain_keys(now, &EndReason::GpuLost, |k| {
            !on_lost.iter().any(|l| l == k)
        }));
        events.extend(self.book.retain_keys(now, &EndReason::ProcessGone, |k| {
            !k.starts_with(&prefix) || seen.contains(k)
        }));
        if let Some(memo) = self.proc_memo.get_mut(idx) {
            memo.retain(|k, _| listed.contains(k));
        }
        error
    }

    /// Process-scope rule `idx`'s result for process `p` of GPU `hist`: the previous one while
    /// the process list says the same of the fields the check read (`p.mem`, `p.runtime`, …), it
    /// runs on the same MIG device and the GPU inputs the check read are the same, else a fresh
    /// evaluation (see `eval_gpu`).
    fn eval_process(
        &mut self,
        idx: usize,
        hist: &Arc<GpuHistory>,
        p: &crate::model::ProcSample,
        mig: Option<&crate::model::MigSample>,
        now: i64,
    ) -> EvalResult {
        let key = (hist.id.index, p.pid);
        if self.reuse {
            if let Some((was, was_on, fields, trace, result)) =
                self.proc_memo.get(idx).and_then(|m| m.get(&key))
            {
                if fields.same(was, p) && was_on.as_ref() == mig && trace.holds(hist, now) {
                    self.reused += 1;
                    return result.clone();
                }
            }
        }
        self.count_run(idx);
        let mut handle = ProcessHandle::new(p.clone());
        handle.gpu_series = rhai::Dynamic::from(GpuHandle::new(hist.clone(), now));
        handle.mig = mig.map(|m| Arc::new(m.clone()));
        let (result, trace) = self.rules.eval_process_traced(idx, handle);
        if let Some(memo) = self.proc_memo.get_mut(idx) {
            match trace {
                Some((fields, trace)) => {
                    memo.insert(
                        key,
                        (p.clone(), mig.cloned(), fields, trace, result.clone()),
                    );
                }
                None => {
                    memo.remove(&key);
                }
            }
        }
        result
    }

    /// The MIG device process `pid` runs on, on GPU `gpu`, as of the newest snapshot (`None`
    /// without MIG).
    pub fn mig_of_process(&self, gpu: u32, pid: u32) -> Option<&crate::model::MigSample> {
        self.gpus
            .get(&gpu)?
            .mig
            .iter()
            .find(|m| m.pids.contains(&pid))
    }

    /// Evaluates the job-scope rules for one sample of a job watched by `gpuwatch run` /
    /// `attach`, at `now_ms` (no evaluation-interval slotting: the final sample of an ended job is
    /// always evaluated). `job.gpus` are the GPUs whose latest process list holds one of the
    /// job's PIDs, or every present GPU when none does (no process list, or a PID namespace).
    /// Instances are keyed `rule/job:PID`, labelled with `pid` and target the job's process (a
    /// PID whose start time changed ends the old instance, as for process rules);
    /// firing alerts carry the job's command and progress as annotations `job` and `progress`.
    pub fn evaluate_job(
        &mut self,
        job: &crate::model::job::JobSample,
        now_ms: i64,
    ) -> Vec<AlertEvent> {
        self.last_now_ms = self.last_now_ms.max(now_ms);
        let mut events = Vec::new();
        let pids: std::collections::HashSet<u32> =
            job.pids.iter().copied().chain([job.pid]).collect();
        let mut on: Vec<u32> = self
            .present
            .iter()
            .copied()
            .filter(|i| {
                self.gpus
                    .get(i)
                    .is_some_and(|h| h.processes.iter().any(|p| pids.contains(&p.pid)))
            })
            .collect();
        if on.is_empty() {
            on.clone_from(&self.present);
        }
        let handles: rhai::Array = on
            .iter()
            .filter_map(|i| self.gpus.get(i))
            .map(|h| rhai::Dynamic::from(GpuHandle::new(h.clone(), now_ms)))
            .collect();
        let progress = job.progress.describe();
        for idx in self.order.clone() {
            if self.rules.rules()[idx].scope != RuleScope::Job || self.suspended(idx, now_ms) {
                continue;
            }
            let mut handle = JobHandle::new(job.clone(), on.clone());
            handle.gpu_handles = handles.clone();
            let mut result = self.rules.eval_job(idx, handle);
            if let EvalResult::Fire { annotations, .. } = &mut result {
                annotations.insert("job".into(), job.command.clone());
                annotations.insert("progress".into(), progress.clone());
            }
            let key = format!("{}/job:{}", self.rules.rules()[idx].spec.name, job.pid);
            events.extend(self.book.end_replaced(now_ms, &key, None, job.start_ticks));
            let subject = Subject {
                key: &key,
                gpu: None,
                extra: vec![("pid".into(), job.pid.to_string())],
                target_pid: Some(job.pid),
                target_start: job.start_ticks,
                target_local: true,
            };
            let error = self.step_result(idx, now_ms, result, subject, &mut events);
            let error = self.note_budget(idx, now_ms, error);
            self.step_rule_error(idx, now_ms, error, &mut events);
        }
        if !job.alive {
            // What the job's end made quiet ended with the job, not because its condition
            // cleared ("no progress for 108 s" did not resume): say so.
            let exit = job
                .exit
                .filter(|e| !matches!(e, crate::model::job::JobExit::Ended))
                .map(crate::model::job::JobExit::describe);
            for ev in &mut events {
                let plain = matches!(ev.ended, Some(EndReason::Cleared { note: None }));
                if ev.status == AlertStatus::Resolved && plain && ev.target_pid == Some(job.pid) {
                    ev.set_ended(EndReason::JobEnded { exit: exit.clone() });
                }
            }
        }
        events
    }
}

/// Evaluations in a row over the time budget that suspend a rule.
pub const SUSPEND_AFTER: u32 = 3;
/// First suspension of a rule that keeps exceeding its budget, ms (then doubling).
pub const FIRST_SUSPENSION_MS: i64 = 60_000;
/// Longest suspension, ms.
pub const MAX_SUSPENSION_MS: i64 = 3_600_000;

/// One rule's record of evaluations over the time budget.
#[derive(Debug, Clone, Copy, Default)]
struct Overrun {
    /// Evaluations in a row over budget.
    strikes: u32,
    /// Suspended until this time (sample clock), ms.
    suspended_until_ms: Option<i64>,
    /// The current suspension length, ms (0 = never suspended since the last clean run).
    backoff_ms: i64,
}

/// Per rule: the key (`rule_error/<rule>`) and spec of the alert its failures raise.
fn rule_error_specs(rules: &RuleSet) -> Vec<(String, AlertSpec)> {
    rules
        .rules()
        .iter()
        .map(|r| {
            let spec = AlertSpec {
                name: RULE_ERROR.into(),
                severity: Severity::Warning,
                hold_ms: 0,
                keep_firing_for_ms: 0,
                repeat_ms: 0,
                labels: BTreeMap::new(),
                source: r.spec.source.clone(),
                actions: Vec::new(),
            };
            (format!("{RULE_ERROR}/{}", r.spec.name), spec)
        })
        .collect()
}

/// Per-sample rules (no `every`: lost GPU, XID, ECC, …) first, then windowed ones.
fn evaluation_order(rules: &RuleSet) -> Vec<usize> {
    let (mut first, rest): (Vec<usize>, Vec<usize>) =
        (0..rules.len()).partition(|i| rules.rules()[*i].per_sample);
    first.extend(rest);
    first
}

/// What an alert instance is about: its key, GPU, extra identity labels and target process
/// (PID and start time).
struct Subject<'a> {
    key: &'a str,
    gpu: Option<&'a GpuHistory>,
    extra: Vec<(Cow<'static, str>, String)>,
    target_pid: Option<u32>,
    target_start: Option<u64>,
    /// Whether `target_pid` is a PID of gpuwatch's own namespace (a watched job).
    target_local: bool,
}

impl<'a> Subject<'a> {
    /// A host-wide instance keyed by the rule name.
    fn plain() -> Subject<'a> {
        Subject {
            key: "",
            gpu: None,
            extra: Vec::new(),
            target_pid: None,
            target_start: None,
            target_local: false,
        }
    }

    /// The rule's instance for one GPU (keyed by the rule name).
    fn gpu(hist: &'a GpuHistory) -> Subject<'a> {
        Subject {
            key: "",
            gpu: Some(hist),
            extra: Vec::new(),
            target_pid: None,
            target_start: None,
            target_local: false,
        }
    }
}

/// The one "severity → labels → instance → step" sequence: steps the instance `subject` of the
/// rule `spec` with `outcome` (a severity returned by the check applies to a new instance, and
/// raises a live one's).
fn step(
    book: &mut AlertBook,
    hostname: &str,
    now: i64,
    spec: &AlertSpec,
    subject: &Subject<'_>,
    outcome: Outcome,
    severity: Option<Severity>,
) -> Option<AlertEvent> {
    let spec = match severity {
        Some(severity) if severity != spec.severity => Cow::Owned(AlertSpec {
            severity,
            ..spec.clone()
        }),
        _ => Cow::Borrowed(spec),
    };
    let labels = || {
        let mut l = labels(hostname, &spec, subject.gpu);
        for (k, v) in &subject.extra {
            l.insert(k.to_string(), v.clone());
        }
        l
    };
    let key = if subject.key.is_empty() {
        spec.name.as_str()
    } else {
        subject.key
    };
    let id = InstanceId {
        key,
        gpu: subject.gpu.map(|h| h.id.index),
        labels: &labels,
        target_pid: subject.target_pid,
        target_start: subject.target_start,
        target_local: subject.target_local,
        gpu_lost: subject.gpu.is_some_and(|h| h.state == DeviceState::Lost),
    };
    book.step(now, &spec, &id, outcome)
}

/// The counter metrics of the metric table.
fn counter_metrics() -> impl Iterator<Item = Metric> {
    Metric::all().filter(|m| m.desc().kind == MetricKind::Counter)
}

/// Applies restored data to the history of the GPU `sample` comes from, before the sample is
/// pushed: the XIDs at once, and for each saved counter that `sample` has a value for, a baseline
/// point when the counter grew while gpuwatch was down. What was applied leaves `carry`.
fn restore(
    h: &mut GpuHistory,
    carry: &mut GpuCarry,
    sample: &GpuSample,
    interval_ms: Option<i64>,
    named: impl Fn(Metric) -> bool,
) {
    for x in carry.xids.drain(..) {
        h.push_xid(x);
    }
    let step_ms = interval_ms.filter(|i| *i > 0).unwrap_or(1000);
    carry.counters.retain(|key, saved| {
        let Some(metric) = Metric::from_key(key) else {
            return false; // a metric this build no longer has
        };
        if !named(metric) {
            return false; // no rule reads it: it has no window
        }
        let Some(value) = sample.values.get(metric).filter(|v| v.is_finite()) else {
            return true; // not sampled yet: wait for the first value
        };
        if value > saved.value && saved.time_ms < sample.time_ms && h.window(metric).is_empty() {
            let at_ms = (sample.time_ms - step_ms)
                .max(saved.time_ms)
                .min(sample.time_ms - 1);
            h.push_baseline(metric, at_ms, saved.value);
        }
        false
    });
}

/// Identity labels of an alert instance.
fn labels(hostname: &str, spec: &AlertSpec, gpu: Option<&GpuHistory>) -> BTreeMap<String, String> {
    let mut labels = spec.labels.clone();
    labels.insert("alertname".into(), spec.name.clone());
    labels.insert("severity".into(), spec.severity.as_str().into());
    labels.insert("hostname".into(), hostname.to_string());
    if let Some(h) = gpu {
        labels.insert("gpu".into(), h.id.index.to_string());
        if !h.id.uuid.is_empty() {
            labels.insert("uuid".into(), h.id.uuid.clone());
        }
        // the Slurm job(s) on the GPU when the alert starts (dcgm-exporter's label)
        if let Some(jobs) = crate::model::hpc_jobs(h.processes.iter()) {
            labels.insert("hpc_job".into(), jobs);
        }
        // the Kubernetes pod(s) it is allocated to (dcgm-exporter's labels)
        if let Some([pod, namespace, container]) = &h.pods {
            labels.insert("pod".into(), pod.clone());
            labels.insert("namespace".into(), namespace.clone());
            labels.insert("container".into(), container.clone());
        }
    }
    labels
}

/// Counts from [`replay`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayStats {
    /// Snapshots fed.
    pub snapshots: u64,
    /// GPU samples fed.
    pub gpu_samples: u64,
    /// `advance` calls made inside gaps.
    pub advances: u64,
    /// Time of the first snapshot, UTC ms.
    pub first_ms: Option<i64>,
    /// Time of the last snapshot, UTC ms.
    pub last_ms: Option<i64>,
}

/// How much of a gap in a replayed log the engine's clock runs through step by step (longer
/// than the stock rules' longest window and the no-data resolution).
const MAX_GAP_ADVANCE_MS: i64 = 2 * 3_600_000;

/// Feeds snapshots through `engine` in virtual time. Inside a gap longer than twice the
/// observed sampling interval it calls `advance` every evaluation interval (at least every
/// sampling interval), as the daemon's timer would, so `collector_stale` behaves as live — for
/// the first [`MAX_GAP_ADVANCE_MS`] of the gap.
pub fn replay<E>(
    engine: &mut Engine,
    snapshots: impl Iterator<Item = Result<Snapshot, E>>,
    on_event: impl FnMut(&AlertEvent),
) -> Result<ReplayStats, E> {
    replay_then(engine, snapshots, on_event, drop)
}

/// [`replay`], handing each snapshot to `done` once the engine has it
/// (`import::GiveBack::give`).
pub fn replay_then<E>(
    engine: &mut Engine,
    snapshots: impl Iterator<Item = Result<Snapshot, E>>,
    mut on_event: impl FnMut(&AlertEvent),
    mut done: impl FnMut(Snapshot),
) -> Result<ReplayStats, E> {
    let mut stats = ReplayStats::default();
    for snap in snapshots {
        let snap = snap?;
        if let Some(last) = stats.last_ms {
            let interval = engine.interval_ms().unwrap_or(1000).max(1);
            if snap.time_ms - last > 2 * interval {
                let step = engine.opts.eval_interval_ms.max(interval);
                let mut t = last + step;
                // The clock runs through at most the first MAX_GAP_ADVANCE_MS of a gap (what
                // the host rules and the no-data resolutions need); then it jumps: a log whose
                // clock jumps by years (unset at boot) would otherwise take billions of steps.
                let until = snap.time_ms.min(last.saturating_add(MAX_GAP_ADVANCE_MS));
                while t < until {
                    stats.advances += 1;
                    for ev in engine.advance(t) {
                        on_event(&ev);
                    }
                    t += step;
                }
            }
        }
        stats.snapshots += 1;
        stats.gpu_samples += snap.gpus.len() as u64;
        stats.first_ms.get_or_insert(snap.time_ms);
        stats.last_ms = Some(snap.time_ms);
        for ev in engine.observe(&snap) {
            on_event(&ev);
        }
        done(snap);
    }
    Ok(stats)
}

/// Replays imported ticks (`crate::import`), each time-line segment through a fresh engine
/// from `fresh` (windows never mix two time lines); `on_tick` sees every tick first, `done`
/// gets its snapshot last. Returns the counts over all segments and the last segment's engine
/// (its alerts still firing).
pub fn replay_segments(
    ticks: impl Iterator<Item = anyhow::Result<crate::import::Imported>>,
    mut fresh: impl FnMut() -> anyhow::Result<Engine>,
    mut on_tick: impl FnMut(&crate::import::Imported),
    mut on_event: impl FnMut(&AlertEvent),
    mut done: impl FnMut(Snapshot),
) -> anyhow::Result<(ReplayStats, Engine)> {
    let mut ticks = ticks.peekable();
    let mut stats = ReplayStats::default();
    let mut engine = fresh()?;
    let mut segments = 0u32;
    loop {
        let segment = match ticks.peek() {
            None => break,
            Some(Err(_)) => match ticks.next() {
                Some(Err(e)) => return Err(e),
                _ => break,
            },
            Some(Ok(t)) => t.segment,
        };
        if segments > 0 {
            engine = fresh()?;
        }
        segments += 1;
        let part = std::iter::from_fn(|| {
            if ticks
                .peek()
                .is_some_and(|t| t.as_ref().is_ok_and(|t| t.segment != segment))
            {
                return None;
            }
            ticks.next().map(|t| {
                t.map(|t| {
                    on_tick(&t);
                    t.snapshot
                })
            })
        });
        let s = replay_then(&mut engine, part, &mut on_event, &mut done)?;
        stats.snapshots += s.snapshots;
        stats.gpu_samples += s.gpu_samples;
        stats.advances += s.advances;
        stats.first_ms = stats.first_ms.or(s.first_ms);
        stats.last_ms = s.last_ms.or(stats.last_ms);
    }
    Ok((stats, engine))
}

#[cfg(test)]
mod job_rules_tests;
#[cfg(test)]
mod mig_tests;
#[cfg(test)]
mod nvlink_tests;
#[cfg(test)]
mod reuse_tests;
#[cfg(test)]
mod tests;
