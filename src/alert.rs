//! The alert lifecycle: a pure, clock-injected state machine, and its persistence.
//!
//! Each (rule, GPU) pair is an *alert instance*. At every evaluation the engine hands
//! [`AlertBook::step`] the rule's [`Outcome`] and the evaluation time; the book moves the instance
//! through inactive → pending (`hold`) → firing → resolved, honouring `keep_firing_for` and
//! `repeat`, and returns the [`AlertEvent`]s worth announcing (firing, repeat firing, resolved).
//! Nothing here reads a clock or touches a file except [`save_state`] / [`load_state`].
//!
//! Semantics (Prometheus alerting rules, see docs/rules.md):
//! * inactive + active → pending at `now` (or firing at once when `hold` is 0);
//! * pending + active for `hold` → firing (announced);
//! * pending + inactive → inactive (nothing announced);
//! * firing + active → stays firing; re-announced with `repeat: true` every `repeat`;
//! * firing + inactive for `keep_firing_for` → resolved (announced);
//! * [`Outcome::NoData`] (the rule did not fire and some window it read was too sparse) freezes
//!   the instance: a pending timer keeps its start, a firing alert keeps firing. After
//!   [`NODATA_RESOLVE_MS`] of continuous no-data a firing alert resolves and a pending one is
//!   dropped, so a metric that disappears for good cannot keep an alert forever.
//!
//! The fingerprint is FNV-1a 64 over the sorted identity labels, stable across runs and builds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::{AlertEvent, AlertStatus, EndReason, Severity};

/// How long a firing (or pending) alert survives continuous no-data before it resolves.
pub const NODATA_RESOLVE_MS: i64 = 10 * 60 * 1000;

/// Version of the state file format written. 2 added [`AlertStateFile::gpus`]; version 1 files
/// (without it) still load.
pub const STATE_VERSION: u32 = 2;

/// Oldest state file version [`load_state`] accepts.
pub const STATE_VERSION_MIN: u32 = 1;

/// File name of the alert state inside the state directory.
pub const STATE_FILE: &str = "alerts.json";

/// The lifecycle settings of one rule.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertSpec {
    /// Rule name (`alertname`).
    pub name: String,
    /// Severity.
    pub severity: Severity,
    /// How long the condition must hold before firing, ms.
    pub hold_ms: i64,
    /// How long it keeps firing after the condition cleared, ms.
    pub keep_firing_for_ms: i64,
    /// Re-announce interval while firing, ms (0 = never).
    pub repeat_ms: i64,
    /// User labels.
    pub labels: BTreeMap<String, String>,
    /// `file:line` of the rule, for the `rule_file` annotation.
    pub source: String,
    /// What the rule declared with `action:` (empty for most rules).
    pub actions: Vec<crate::model::Action>,
}

/// What one evaluation of a rule for one instance said.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The condition holds.
    Active {
        /// Summary text.
        summary: String,
        /// Extra annotations (`values`, …).
        annotations: BTreeMap<String, String>,
    },
    /// The condition does not hold.
    Inactive,
    /// The condition does not hold, and the rule said what that means (`#{ cleared: "…" }`,
    /// `#{ stopped: "…" }`): the end a firing instance gets.
    Ended(EndReason),
    /// The rule did not fire but could not see enough data to say so.
    NoData,
}

/// Where an instance is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Active, waiting for `hold`.
    Pending,
    /// Announced.
    Firing,
}

impl Phase {
    /// `pending` or `firing`.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "pending",
            Phase::Firing => "firing",
        }
    }
}

/// One alert instance, as persisted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlertInstanceState {
    /// Instance key: rule name (or `rule_error/<rule>`).
    pub key: String,
    /// GPU index for per-GPU rules.
    pub gpu: Option<u32>,
    /// Pending or firing.
    pub phase: Phase,
    /// Identity labels.
    pub labels: BTreeMap<String, String>,
    /// Fingerprint of `labels`.
    pub fingerprint: String,
    /// Severity.
    pub severity: Severity,
    /// When the condition became active (pending start), UTC ms.
    pub active_since_ms: i64,
    /// When it started firing, UTC ms.
    pub fired_at_ms: Option<i64>,
    /// Last evaluation at which the condition held.
    pub last_active_ms: i64,
    /// Last announcement (firing or repeat), UTC ms.
    pub last_notified_ms: Option<i64>,
    /// Start of the current run of no-data evaluations.
    pub nodata_since_ms: Option<i64>,
    /// Latest annotations (summary, values, rule_file).
    pub annotations: BTreeMap<String, String>,
    /// The rule's declared actions (refreshed from the spec at every active evaluation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub actions: Vec<crate::model::Action>,
    /// The process the instance is about (process and job scopes only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_pid: Option<u32>,
    /// When that process started, clock ticks since boot: with `target_pid`, the process's
    /// identity (see [`AlertBook::end_replaced`]). `None` when not known (state saved by an
    /// older version, a process `/proc` does not show): then the first start seen is taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_start: Option<u64>,
    /// Whether `target_pid` is a PID of gpuwatch's own namespace (a watched job), not NVML's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub target_local: bool,
}

impl AlertInstanceState {
    /// The `alertname` label (the instance key when it has none).
    pub fn alertname(&self) -> &str {
        self.labels.get("alertname").unwrap_or(&self.key)
    }
}

/// The persisted alert state.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AlertStateFile {
    /// Format version ([`STATE_VERSION`]).
    pub version: u32,
    /// Engine time of the save, UTC ms.
    pub saved_at_ms: i64,
    /// Every pending or firing instance.
    pub instances: Vec<AlertInstanceState>,
    /// Per-GPU data the windows need across a restart (version 2; empty in version 1 files).
    #[serde(default)]
    pub gpus: Vec<GpuCarry>,
    /// The XID ledger: every XID of the last week on every GPU (survives restarts and reboots;
    /// see `engine::ledger`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xid_ledger: Vec<crate::model::LedgerEntry>,
}

/// What the engine carries over a restart for one GPU, keyed by UUID (an index may name another
/// board after a restart).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct GpuCarry {
    /// The GPU's UUID.
    pub uuid: String,
    /// Last point of every counter metric (`MetricKind::Counter`), by metric key, so an increase
    /// that happened while gpuwatch was down is seen at the first sample after the restart.
    #[serde(default)]
    pub counters: BTreeMap<String, CounterPoint>,
    /// XID events within the rules' retention, oldest first.
    #[serde(default)]
    pub xids: Vec<XidPoint>,
}

/// A counter's last sampled value.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CounterPoint {
    /// Sample time, UTC ms.
    pub time_ms: i64,
    /// Counter value.
    pub value: f64,
}

/// One XID event as carried over a restart (older state files hold only time and code).
pub type XidPoint = crate::model::XidNote;

/// FNV-1a 64-bit hash of the sorted labels as `name=value\n` lines, in 16 hex digits.
pub fn fingerprint(labels: &BTreeMap<String, String>) -> String {
    crate::sys::fnv1a64_hex(labels.iter().flat_map(|(k, v)| {
        k.bytes()
            .chain(std::iter::once(b'='))
            .chain(v.bytes())
            .chain(std::iter::once(b'\n'))
    }))
}

/// All live alert instances.
#[derive(Debug, Clone, Default)]
pub struct AlertBook {
    /// By key, then GPU: a lookup by `&str` needs no allocation (most steps find nothing).
    instances: BTreeMap<String, BTreeMap<Option<u32>, AlertInstanceState>>,
    /// Instances restored from a saved state that have seen no data since (see
    /// [`AlertBook::resume`]).
    restored: std::collections::BTreeSet<(String, Option<u32>)>,
    /// Until when no data does not resolve a restored instance, UTC ms.
    warm_until_ms: i64,
}

/// Identity of the instance being stepped. `labels` is only called when a new instance starts.
pub struct InstanceId<'a> {
    /// Instance key (rule name, or `rule_error/<rule>`).
    pub key: &'a str,
    /// GPU index, for per-GPU rules.
    pub gpu: Option<u32>,
    /// Identity labels (alertname, severity, gpu, uuid, hostname, user labels).
    pub labels: &'a dyn Fn() -> BTreeMap<String, String>,
    /// The process this instance is about (process and job scopes), the only target an action
    /// can have.
    pub target_pid: Option<u32>,
    /// When that process started (clock ticks since boot), when known.
    pub target_start: Option<u64>,
    /// Whether `target_pid` is a PID of gpuwatch's own namespace (a watched job).
    pub target_local: bool,
    /// Whether the instance's GPU is lost (no data then ends it as [`EndReason::GpuLost`]).
    pub gpu_lost: bool,
}

impl AlertBook {
    /// An empty book.
    pub fn new() -> Self {
        AlertBook::default()
    }

    /// Rebuilds a book from a saved state.
    pub fn from_state(state: &AlertStateFile) -> Self {
        let mut book = AlertBook::default();
        for i in &state.instances {
            book.instances
                .entry(i.key.clone())
                .or_default()
                .insert(i.gpu, i.clone());
            book.restored.insert((i.key.clone(), i.gpu));
        }
        book
    }

    /// Resumes after a restart that lasted `downtime_ms`: pending instances' timers skip the
    /// downtime (it does not count toward `for`), and until `warm_until_ms` a restored instance
    /// with no data is not resolved (its rule's windows are filling again: a window answers once
    /// half of it is sampled).
    pub fn resume(&mut self, downtime_ms: i64, warm_until_ms: i64) {
        for inst in self.instances.values_mut().flat_map(BTreeMap::values_mut) {
            if inst.phase == Phase::Pending {
                inst.active_since_ms = inst.active_since_ms.saturating_add(downtime_ms);
            }
            inst.nodata_since_ms = None;
        }
        self.warm_until_ms = warm_until_ms;
    }

    /// Whether instance (`key`, `gpu`) is neither live nor restored: a quiet outcome would
    /// leave the book as it is.
    pub fn untracked(&self, key: &str, gpu: Option<u32>) -> bool {
        self.instances
            .get(key)
            .is_none_or(|g| !g.contains_key(&gpu))
            && (self.restored.is_empty() || !self.restored.contains(&(key.to_string(), gpu)))
    }

    fn get_mut(&mut self, key: &str, gpu: Option<u32>) -> Option<&mut AlertInstanceState> {
        self.instances.get_mut(key)?.get_mut(&gpu)
    }

    fn remove(&mut self, key: &str, gpu: Option<u32>) -> Option<AlertInstanceState> {
        let by_gpu = self.instances.get_mut(key)?;
        let inst = by_gpu.remove(&gpu);
        if by_gpu.is_empty() {
            self.instances.remove(key);
        }
        inst
    }

    /// The state to persist.
    pub fn state(&self, now_ms: i64) -> AlertStateFile {
        AlertStateFile {
            version: STATE_VERSION,
            saved_at_ms: now_ms,
            instances: self.instances().cloned().collect(),
            gpus: Vec::new(),
            xid_ledger: Vec::new(),
        }
    }

    /// Live instances (pending and firing).
    pub fn instances(&self) -> impl Iterator<Item = &AlertInstanceState> {
        self.instances.values().flat_map(BTreeMap::values)
    }

    /// Whether instances restored from a saved state are still being checked (see
    /// [`AlertBook::end_misplaced`]).
    pub fn restoring(&self) -> bool {
        !self.restored.is_empty()
    }

    /// Ends restored per-GPU instances that are not about the GPU now at their index: one whose
    /// `uuid` label names another board than `uuid_at(index)` (the GPUs were renumbered after a
    /// reboot), and, once the warm-up is over, one whose index no snapshot has had since the
    /// restart (fewer GPUs now). Such an instance is never stepped again and would stay firing
    /// for ever. Firing ones get a resolution; `gpu_missing` tells of a GPU that is gone.
    pub fn end_misplaced<'u>(
        &mut self,
        now_ms: i64,
        uuid_at: impl Fn(u32) -> Option<&'u str>,
        seen: &std::collections::BTreeSet<u32>,
    ) -> Vec<AlertEvent> {
        if self.restored.is_empty() {
            return Vec::new();
        }
        let warm = now_ms < self.warm_until_ms;
        let misplaced: Vec<(String, Option<u32>)> = self
            .restored
            .iter()
            .filter(|(key, gpu)| {
                let Some(index) = *gpu else { return false };
                let Some(inst) = self.instances.get(key).and_then(|m| m.get(gpu)) else {
                    return false;
                };
                let label = inst.labels.get("uuid").map_or("", String::as_str);
                match uuid_at(index) {
                    Some(now) => !now.is_empty() && !label.is_empty() && now != label,
                    None => !warm && !seen.contains(&index),
                }
            })
            .cloned()
            .collect();
        let mut events = Vec::new();
        for (key, gpu) in misplaced {
            self.restored.remove(&(key.clone(), gpu));
            if let Some(inst) = self.remove(&key, gpu) {
                if inst.phase == Phase::Firing {
                    events.push(ended(&inst, now_ms, EndReason::GpuGone));
                }
            }
        }
        if !warm {
            self.restored.clear();
        }
        events
    }

    /// Keeps only instances for which `keep(key)` holds; returns the removed firing ones as
    /// resolved events at `now_ms`, ended for `why`.
    pub fn retain_keys(
        &mut self,
        now_ms: i64,
        why: &EndReason,
        mut keep: impl FnMut(&str) -> bool,
    ) -> Vec<AlertEvent> {
        let mut events = Vec::new();
        let removed: Vec<String> = self
            .instances
            .keys()
            .filter(|k| !keep(k))
            .cloned()
            .collect();
        for key in removed {
            for inst in self
                .instances
                .remove(&key)
                .into_iter()
                .flat_map(BTreeMap::into_values)
            {
                if inst.phase == Phase::Firing {
                    events.push(ended(&inst, now_ms, why.clone()));
                }
            }
        }
        events
    }

    /// Ends instance (`key`, `gpu`) when the process it is about is no longer the one behind its
    /// PID: `start` (the start time of the process now at that PID, when known) differs from the
    /// one the instance was created with. The instance goes as if its process had left (a
    /// firing one resolves at `now_ms`, returned; `keep_firing_for` does not apply: that
    /// process is gone), so the next step starts the new process's own instance, pending. An
    /// instance with no start known (saved by an older version) takes `start` and goes on.
    pub fn end_replaced(
        &mut self,
        now_ms: i64,
        key: &str,
        gpu: Option<u32>,
        start: Option<u64>,
    ) -> Option<AlertEvent> {
        let start = start?;
        let inst = self.get_mut(key, gpu)?;
        match inst.target_start {
            Some(s) if s == start => None,
            None => {
                inst.target_start = Some(start);
                None
            }
            Some(_) => {
                self.restored.remove(&(key.to_string(), gpu));
                let inst = self.remove(key, gpu)?;
                (inst.phase == Phase::Firing).then(|| ended(&inst, now_ms, EndReason::ProcessGone))
            }
        }
    }

    /// Advances one instance with the outcome of an evaluation at `now_ms`.
    pub fn step(
        &mut self,
        now_ms: i64,
        spec: &AlertSpec,
        id: &InstanceId<'_>,
        outcome: Outcome,
    ) -> Option<AlertEvent> {
        if !self.restored.is_empty() && !matches!(outcome, Outcome::NoData) {
            // The instance has data again: the warm-up no longer applies to it.
            self.restored.remove(&(id.key.to_string(), id.gpu));
        }
        match outcome {
            Outcome::Active {
                summary,
                mut annotations,
            } => {
                annotations.insert("summary".into(), summary);
                annotations.insert("rule_file".into(), spec.source.clone());
                // Summaries and annotations carry text from outside (command lines, user
                // names, a job's output): control characters are escaped once, here, so no
                // log line, table or message can be forged or carry terminal escapes.
                for v in annotations.values_mut() {
                    if v.chars().any(char::is_control) {
                        *v = crate::values::escape_control(v);
                    }
                }
                let inst = self
                    .instances
                    .entry(id.key.to_string())
                    .or_default()
                    .entry(id.gpu)
                    .or_insert_with(|| {
                        let labels = (id.labels)();
                        AlertInstanceState {
                            key: id.key.to_string(),
                            gpu: id.gpu,
                            phase: Phase::Pending,
                            fingerprint: fingerprint(&labels),
                            labels,
                            severity: spec.severity,
                            active_since_ms: now_ms,
                            fired_at_ms: None,
                            last_active_ms: now_ms,
                            last_notified_ms: None,
                            nodata_since_ms: None,
                            annotations: BTreeMap::new(),
                            actions: Vec::new(),
                            target_pid: id.target_pid,
                            target_start: id.target_start,
                            target_local: id.target_local,
                        }
                    });
                inst.actions.clone_from(&spec.actions);
                inst.last_active_ms = now_ms;
                inst.nodata_since_ms = None;
                inst.annotations = annotations;
                // A check that returns a higher severity than the instance has (a later XID 95
                // after an XID 43): the instance takes it and its labels (severity, recovery
                // action), keeping its identity; a firing one is announced again at once, so
                // routes that page on the new severity hear of it.
                let escalated = spec.severity > inst.severity;
                if escalated {
                    inst.severity = spec.severity;
                    inst.labels = (id.labels)();
                }
                match inst.phase {
                    Phase::Pending => {
                        if now_ms - inst.active_since_ms >= spec.hold_ms {
                            inst.phase = Phase::Firing;
                            inst.fired_at_ms = Some(now_ms);
                            inst.last_notified_ms = Some(now_ms);
                            return Some(event(inst, AlertStatus::Firing, now_ms, false));
                        }
                        None
                    }
                    Phase::Firing if escalated => {
                        inst.last_notified_ms = Some(now_ms);
                        Some(event(inst, AlertStatus::Firing, now_ms, true))
                    }
                    Phase::Firing => repeat_due(inst, spec, now_ms),
                }
            }
            Outcome::Inactive | Outcome::Ended(_) => {
                let why = match outcome {
                    Outcome::Ended(why) => why,
                    _ => EndReason::Cleared { note: None },
                };
                let inst = self.get_mut(id.key, id.gpu)?;
                inst.nodata_since_ms = None;
                match inst.phase {
                    Phase::Pending => {
                        self.remove(id.key, id.gpu);
                        None
                    }
                    Phase::Firing => {
                        if now_ms - inst.last_active_ms >= spec.keep_firing_for_ms {
                            let ev = ended(inst, now_ms, why);
                            self.remove(id.key, id.gpu);
                            Some(ev)
                        } else {
                            repeat_due(inst, spec, now_ms)
                        }
                    }
                }
            }
            Outcome::NoData => {
                let warming = now_ms < self.warm_until_ms
                    && self.restored.contains(&(id.key.to_string(), id.gpu));
                let inst = self.get_mut(id.key, id.gpu)?;
                if warming {
                    return match inst.phase {
                        Phase::Firing => repeat_due(inst, spec, now_ms),
                        Phase::Pending => None,
                    };
                }
                let since = *inst.nodata_since_ms.get_or_insert(now_ms);
                if now_ms - since < NODATA_RESOLVE_MS {
                    return match inst.phase {
                        Phase::Firing => repeat_due(inst, spec, now_ms),
                        Phase::Pending => None,
                    };
                }
                let inst = self.remove(id.key, id.gpu)?;
                let why = if id.gpu_lost {
                    EndReason::GpuLost
                } else {
                    EndReason::NoData
                };
                (inst.phase == Phase::Firing).then(|| ended(&inst, now_ms, why))
            }
        }
    }
}

fn repeat_due(inst: &mut AlertInstanceState, spec: &AlertSpec, now_ms: i64) -> Option<AlertEvent> {
    let last = inst.last_notified_ms.unwrap_or(now_ms);
    if spec.repeat_ms > 0 && now_ms - last >= spec.repeat_ms {
        inst.last_notified_ms = Some(now_ms);
        return Some(event(inst, AlertStatus::Firing, now_ms, true));
    }
    None
}

impl AlertInstanceState {
    /// The instance as a firing event at `now_ms` (what silences are matched against).
    pub fn as_event(&self, now_ms: i64) -> AlertEvent {
        event(self, AlertStatus::Firing, now_ms, false)
    }
}

/// The instance's resolved event at `now_ms`, ended for `why`: the reason is typed on the event
/// and, where it adds something, in its `ended` annotation (what webhooks and Alertmanager see).
fn ended(inst: &AlertInstanceState, now_ms: i64, why: EndReason) -> AlertEvent {
    let mut ev = event(inst, AlertStatus::Resolved, now_ms, false);
    ev.set_ended(why);
    ev
}

fn event(inst: &AlertInstanceState, status: AlertStatus, now_ms: i64, repeat: bool) -> AlertEvent {
    AlertEvent {
        fingerprint: inst.fingerprint.clone(),
        name: inst
            .labels
            .get("alertname")
            .cloned()
            .unwrap_or_else(|| inst.key.clone()),
        severity: inst.severity,
        status,
        labels: inst.labels.clone(),
        annotations: inst.annotations.clone(),
        starts_at_ms: inst.fired_at_ms.unwrap_or(inst.active_since_ms),
        ends_at_ms: (status == AlertStatus::Resolved).then_some(now_ms),
        at_ms: now_ms,
        repeat,
        gpu: inst.gpu,
        actions: inst.actions.clone(),
        target_pid: inst.target_pid,
        target_start: inst.target_start,
        target_local: inst.target_local,
        chart: None,
        once: false,
        ended: None,
    }
}

/// Path of the state file in `dir`.
pub fn state_path(dir: &Path) -> PathBuf {
    dir.join(STATE_FILE)
}

/// Saves the state atomically: write a temporary file, fsync it, rename it over
/// `dir/alerts.json`, fsync the directory. Creates `dir` if needed.
pub fn save_state(dir: &Path, state: &AlertStateFile) -> anyhow::Result<()> {
    use anyhow::Context;
    crate::sys::create_private_dir(dir)
        .with_context(|| format!("cannot create state dir {}", dir.display()))?;
    let path = state_path(dir);
    let json = serde_json::to_vec_pretty(state)?;
    crate::sys::write_atomic(&path, &json)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Loads the state saved in `dir`; `Ok(None)` when there is none yet.
pub fn load_state(dir: &Path) -> anyhow::Result<Option<AlertStateFile>> {
    let path = state_path(dir);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => anyhow::bail!("cannot read {}: {e}", path.display()),
    };
    let state: AlertStateFile = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}:{}:{}: {e}", path.display(), e.line(), e.column()))?;
    if !(STATE_VERSION_MIN..=STATE_VERSION).contains(&state.version) {
        anyhow::bail!(
            "{}: unsupported state version {} (expected {STATE_VERSION_MIN} to {STATE_VERSION})",
            path.display(),
            state.version
        );
    }
    Ok(Some(state))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(hold_s: i64, keep_s: i64, repeat_s: i64) -> AlertSpec {
        AlertSpec {
            name: "gpu_hot".into(),
            severity: Severity::Warning,
            hold_ms: hold_s * 1000,
            keep_firing_for_ms: keep_s * 1000,
            repeat_ms: repeat_s * 1000,
            labels: BTreeMap::new(),
            source: "rules/gpu_hot.rhai:1".into(),
            actions: Vec::new(),
        }
    }

    fn labels() -> BTreeMap<String, String> {
        [("alertname", "gpu_hot"), ("gpu", "0"), ("hostname", "h")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The test instance: GPU 0 of `gpu_hot`.
    fn instance(gpu_lost: bool) -> InstanceId<'static> {
        InstanceId {
            key: "gpu_hot",
            gpu: Some(0),
            labels: &labels,
            target_pid: None,
            target_start: None,
            target_local: false,
            gpu_lost,
        }
    }

    fn active() -> Outcome {
        Outcome::Active {
            summary: "hot".into(),
            annotations: BTreeMap::new(),
        }
    }

    /// Runs `pattern` (one char per second: `1` active, `0` inactive, `n` no data) and returns
    /// `(second, status, repeat)` of every event.
    fn run(
        book: &mut AlertBook,
        spec: &AlertSpec,
        pattern: &str,
        t0: i64,
    ) -> Vec<(i64, AlertStatus, bool)> {
        let id = instance(false);
        let mut out = Vec::new();
        for (i, c) in pattern.chars().enumerate() {
            let t = t0 + i as i64;
            let o = match c {
                '1' => active(),
                'n' => Outcome::NoData,
                _ => Outcome::Inactive,
            };
            if let Some(ev) = book.step(t * 1000, spec, &id, o) {
                out.push((t, ev.status, ev.repeat));
            }
        }
        out
    }

    /// A firing alert whose check returns a higher severity (a later, worse XID) is announced
    /// again at once with it, keeping its identity; a lower one later does not lower it.
    #[test]
    fn a_higher_severity_is_announced_at_once() {
        let mut b = AlertBook::new();
        let id = instance(false);
        let warning = spec(0, 0, 3600);
        let first = b.step(1_000, &warning, &id, active()).unwrap();
        assert_eq!(first.severity, Severity::Warning);
        let critical = AlertSpec {
            severity: Severity::Critical,
            ..warning.clone()
        };
        let raised = b.step(2_000, &critical, &id, active()).unwrap();
        assert_eq!(raised.status, AlertStatus::Firing);
        assert_eq!(raised.severity, Severity::Critical);
        assert_eq!(raised.fingerprint, first.fingerprint);
        assert!(b.step(3_000, &critical, &id, active()).is_none());
        assert!(b.step(4_000, &warning, &id, active()).is_none());
        let resolved = b.step(5_000, &warning, &id, Outcome::Inactive).unwrap();
        assert_eq!(resolved.severity, Severity::Critical);
    }

    #[test]
    fn text_from_outside_is_escaped() {
        let mut b = AlertBook::new();
        let id = InstanceId {
            key: "quota",
            gpu: Some(0),
            labels: &labels,
            target_pid: None,
            target_start: None,
            target_local: false,
            gpu_lost: false,
        };
        let forged = "python3 train.py\n2026-12-03T00:00:00Z ERROR forged \u{1b}[31mred";
        let outcome = Outcome::Active {
            summary: format!("process uses 90 GiB: {forged}"),
            annotations: [("job".to_string(), forged.to_string())]
                .into_iter()
                .collect(),
        };
        let ev = b.step(0, &spec(0, 0, 0), &id, outcome).unwrap();
        for v in ev.annotations.values() {
            assert!(!v.chars().any(char::is_control), "{v:?}");
        }
        assert!(
            ev.annotations["summary"].contains("train.py\\n2026"),
            "{:?}",
            ev.annotations
        );
        assert!(
            ev.annotations["job"].contains("\\u{1b}[31m"),
            "{:?}",
            ev.annotations
        );
    }

    #[test]
    fn pending_then_firing_then_resolved() {
        let mut b = AlertBook::new();
        let ev = run(&mut b, &spec(3, 0, 0), "0111110", 0);
        assert_eq!(
            ev,
            vec![
                (4, AlertStatus::Firing, false),
                (6, AlertStatus::Resolved, false)
            ]
        );
        assert_eq!(b.instances().count(), 0);
    }

    #[test]
    fn pending_is_reset_by_an_inactive_evaluation() {
        let mut b = AlertBook::new();
        assert!(run(&mut b, &spec(3, 0, 0), "1101101101", 0).is_empty());
    }

    #[test]
    fn zero_hold_fires_at_once_and_keep_firing_for_delays_resolution() {
        let mut b = AlertBook::new();
        let ev = run(&mut b, &spec(0, 3, 0), "1001000000", 0);
        // fires at 0, inactive at 1 and 2 (within 3 s), active at 3 again, resolves 3 s later
        assert_eq!(
            ev,
            vec![
                (0, AlertStatus::Firing, false),
                (6, AlertStatus::Resolved, false)
            ]
        );
    }

    #[test]
    fn repeat_while_firing() {
        let mut b = AlertBook::new();
        let ev = run(&mut b, &spec(0, 0, 3), "11111110", 0);
        assert_eq!(
            ev,
            vec![
                (0, AlertStatus::Firing, false),
                (3, AlertStatus::Firing, true),
                (6, AlertStatus::Firing, true),
                (7, AlertStatus::Resolved, false)
            ]
        );
    }

    #[test]
    fn no_data_freezes_then_gives_up() {
        let mut b = AlertBook::new();
        let s = spec(2, 0, 0);
        let ev = run(&mut b, &s, "11nnn1", 0);
        // pending since 0, frozen through no data, fires when active again at 5
        assert_eq!(ev, vec![(5, AlertStatus::Firing, false)]);
        let long_nodata = "n".repeat(601);
        let ev = run(&mut b, &s, &long_nodata, 6);
        assert_eq!(ev, vec![(606, AlertStatus::Resolved, false)]);
    }

    #[test]
    fn fingerprint_is_stable() {
        // Golden value: must never change between runs or builds.
        assert_eq!(fingerprint(&labels()), "5c34770c2eb190f0");
        let mut other = labels();
        other.insert("gpu".into(), "1".into());
        assert_ne!(fingerprint(&other), fingerprint(&labels()));
    }

    #[test]
    fn restart_keeps_firing_without_reannouncing_and_keeps_pending_timer() {
        let dir = tempfile::tempdir().unwrap();
        let s = spec(3, 0, 0);
        let mut b = AlertBook::new();
        assert_eq!(
            run(&mut b, &s, "1111", 0),
            vec![(3, AlertStatus::Firing, false)]
        );
        save_state(dir.path(), &b.state(3000)).unwrap();
        let loaded = load_state(dir.path()).unwrap().unwrap();
        let mut b2 = AlertBook::from_state(&loaded);
        // still active after the restart: nothing announced; then it resolves once
        assert_eq!(
            run(&mut b2, &s, "110", 10),
            vec![(12, AlertStatus::Resolved, false)]
        );

        // a pending timer survives too
        let mut b = AlertBook::new();
        assert!(run(&mut b, &s, "11", 0).is_empty());
        save_state(dir.path(), &b.state(1000)).unwrap();
        let mut b2 = AlertBook::from_state(&load_state(dir.path()).unwrap().unwrap());
        assert_eq!(
            run(&mut b2, &s, "1", 3),
            vec![(3, AlertStatus::Firing, false)]
        );
    }

    #[test]
    fn version_1_file_without_gpus_still_loads() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            state_path(dir.path()),
            r#"{ "version": 1, "saved_at_ms": 5000, "instances": [] }"#,
        )
        .unwrap();
        let st = load_state(dir.path()).unwrap().unwrap();
        assert_eq!((st.version, st.saved_at_ms), (1, 5000));
        assert!(st.gpus.is_empty());
        std::fs::write(
            state_path(dir.path()),
            r#"{ "version": 99, "saved_at_ms": 0, "instances": [] }"#,
        )
        .unwrap();
        let err = load_state(dir.path()).unwrap_err().to_string();
        assert!(err.contains("unsupported state version 99"), "{err}");
    }

    #[test]
    fn missing_state_is_none_and_garbage_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load_state(dir.path()).unwrap().is_none());
        std::fs::write(state_path(dir.path()), "{ nope").unwrap();
        let err = load_state(dir.path()).unwrap_err().to_string();
        assert!(err.contains("alerts.json:1:"), "{err}");
    }

    /// Issue 30 §1: only a cleared condition reads RESOLVED; a lost GPU's no data, the rule's
    /// own "stopped repeating" and a plain clearing each end with their reason.
    #[test]
    fn an_end_carries_its_reason() {
        let spec = spec(0, 0, 0);
        let end = |gpu_lost: bool, last: Outcome, t: i64| {
            let mut book = AlertBook::new();
            let id = instance(gpu_lost);
            assert!(book.step(0, &spec, &id, active()).is_some());
            let mut got = None;
            for s in 1..=t {
                got = got.or(book.step(s * 1000, &spec, &id, last.clone()));
            }
            got.expect("an end")
        };
        let lost = end(true, Outcome::NoData, 700);
        assert_eq!(lost.ended, Some(EndReason::GpuLost));
        assert_eq!(lost.state_word(), "ENDED");
        assert!(lost.annotations["ended"].contains("its GPU is lost"));
        assert!(lost.told_summary().ends_with("it said: hot"));
        assert_eq!(
            end(false, Outcome::NoData, 700).ended,
            Some(EndReason::NoData)
        );
        let stopped = end(
            false,
            Outcome::Ended(EndReason::StoppedRepeating {
                note: "no new XID for 5m".into(),
            }),
            1,
        );
        assert_eq!(stopped.state_word(), "ENDED");
        assert_eq!(
            stopped.told_summary(),
            "stopped repeating: no new XID for 5m; it said: hot"
        );
        let cleared = end(false, Outcome::Inactive, 1);
        assert_eq!(cleared.state_word(), "RESOLVED");
        assert_eq!(cleared.told_summary(), "hot");
        assert!(!cleared.annotations.contains_key("ended"));
    }
}
