//! `[actions.drain]`: take this node out of Slurm's scheduling when a GPU breaks, so that the
//! next job does not land on a lost GPU.
//!
//! A rule asks for it with `action: "drain"` (stock: `gpu_lost`, `gpu_missing`, `nvml_stalled`,
//! `xid_error`, `ecc_uncorrected`); only its **critical** firing alerts drain (for `xid_error`
//! the hardware codes; for `ecc_uncorrected` every uncorrectable error, row-remap failures
//! included). Off by default, and a dry run when on until `dry_run = false`; always a dry run on
//! simulated GPUs (`--sim`), unless `GPUWATCH_SIM_REAL_DRAIN=1` (tests against a test cluster).
//!
//! The conditions are the engine's firing alerts, read at every evaluation
//! ([`DrainManager::sync`]): alerts restored after a restart, a reload that drops a rule or its
//! `drain`, a silence, all count as they stand — not as events that might be missed.
//!
//! What it does, once per condition (an alert instance), on a worker thread (an unreachable
//! slurmctld blocks `scontrol` for its MessageTimeout; the sampling loop never waits):
//! 1. `scontrol show node NODE --oneliner`: a node someone else took out of service — drained,
//!    down, failed, in maintenance or rebooting, or with a reason gpuwatch's daemon did not
//!    write — is left as it is, and said so;
//! 2. else `scontrol update NodeName=NODE State=DRAIN Reason="gpuwatch: ALERT GPU N SUMMARY"`.
//!
//! A failed `scontrol` is tried again after 1, 2, 4 … minutes (at most an hour); the first
//! failure per condition is notified, the later ones only logged and audited.
//!
//! With `resume = true`, once every condition has been clear for `resume_after` and no GPU is
//! lost, waits for a reset (NVIDIA's recovery action) or has a row remap pending, the node is
//! resumed (`State=RESUME`) — only while its drain is still the daemon's (reason starting
//! `gpuwatch: ` and not `gpuwatch: doctor` or `gpuwatch: prolog`): an admin who drained it
//! again, or changed the reason, keeps it drained. After a restart the same check runs once the
//! conditions have been clear for `resume_after`, so a drain made before it is not forgotten.
//!
//! Every decision is a line of `state_dir/drain-audit.jsonl` (append-only, fsynced) and a
//! one-shot `node_drain` notice through the channels.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::audit::AuditLog;
use crate::model::{AlertEvent, Severity};
use crate::values::DurationSetting;

/// What every drain reason gpuwatch writes starts with.
pub const REASON_PREFIX: &str = "gpuwatch:";

/// The reasons `gpuwatch doctor --slurm` writes (it resumes only these).
pub const DOCTOR_REASON: &str = "gpuwatch: doctor";

/// The reasons `gpuwatch slurm prolog` writes (nothing resumes these: a person does).
pub const PROLOG_REASON: &str = "gpuwatch: prolog";

/// Set (to anything) in the environment, simulated GPUs drain for real: for tests against a
/// test cluster only.
pub const SIM_REAL_DRAIN_ENV: &str = "GPUWATCH_SIM_REAL_DRAIN";

/// Whether drains must be dry runs: the GPUs are simulated (`sim`) and
/// [`SIM_REAL_DRAIN_ENV`] is not set.
pub fn simulated_dry_run(sim: bool) -> bool {
    sim && std::env::var_os(SIM_REAL_DRAIN_ENV).is_none()
}

/// Whether `reason` is a drain the daemon wrote (not doctor's, not the prolog's).
pub fn daemon_reason(reason: &str) -> bool {
    reason.starts_with(REASON_PREFIX)
        && !reason.starts_with(DOCTOR_REASON)
        && !reason.starts_with(PROLOG_REASON)
}

/// Whether `reason` is a drain `doctor --slurm` wrote.
pub fn doctor_reason(reason: &str) -> bool {
    reason.starts_with(DOCTOR_REASON)
}

/// Whether `reason` is a drain the prolog wrote.
pub fn prolog_reason(reason: &str) -> bool {
    reason.starts_with(PROLOG_REASON)
}

/// Slurm keeps any reason, but `sinfo -R` and people read it: long summaries are cut (at a
/// character boundary, with "…").
const MAX_REASON_CHARS: usize = 200;

/// How long a failed `scontrol` waits before the condition is tried again, doubled at each
/// further failure up to [`MAX_RETRY_MS`].
const RETRY_MS: i64 = 60_000;

/// The longest wait between two tries.
const MAX_RETRY_MS: i64 = 3_600_000;

/// `[actions.drain]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DrainSection {
    /// Drain at all (default false).
    pub enabled: bool,
    /// Say what would be done, and do nothing (default true).
    pub dry_run: bool,
    /// This node's Slurm name (`NodeName`); "" = the host name up to its first dot.
    pub node: String,
    /// The `scontrol` to run: a path, or a name looked up on PATH.
    pub scontrol: PathBuf,
    /// Resume the node when the conditions have cleared (only a drain gpuwatch made).
    pub resume: bool,
    /// How long every condition must have been clear before a resume.
    pub resume_after: DurationSetting,
    /// The longest one `scontrol` call may take before it is killed and counted as failed.
    pub timeout: DurationSetting,
}

impl Default for DrainSection {
    fn default() -> Self {
        DrainSection {
            enabled: false,
            dry_run: true,
            node: String::new(),
            scontrol: PathBuf::from("scontrol"),
            resume: false,
            resume_after: DurationSetting::from_ms(600_000),
            timeout: DurationSetting::from_ms(30_000),
        }
    }
}

impl DrainSection {
    /// Every problem, at its `actions.drain.*` key.
    pub fn validate(&self) -> Vec<crate::values::Problem> {
        use crate::values::Problem;
        let mut out = Vec::new();
        if self.timeout.ms <= 0 {
            out.push(Problem::at(
                "actions.drain.timeout",
                "timeout must be positive",
            ));
        }
        if self.resume_after.ms < 0 {
            out.push(Problem::at(
                "actions.drain.resume_after",
                "resume_after must not be negative",
            ));
        }
        if self
            .node
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '[' | ']' | ','))
        {
            out.push(Problem::at(
                "actions.drain.node",
                "one Slurm node name: no spaces, control characters, lists (,) or ranges ([…])",
            ));
        }
        out
    }

    /// The node name: `node`, or `hostname` up to its first dot.
    pub fn node_name(&self, hostname: &str) -> String {
        if self.node.is_empty() {
            hostname.split('.').next().unwrap_or(hostname).to_string()
        } else {
            self.node.clone()
        }
    }
}

/// What was decided or done about the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DrainDecision {
    /// `scontrol update … State=DRAIN` succeeded.
    Drain,
    /// Dry run: the drain that would have been made.
    WouldDrain,
    /// Someone else's drain (or a changed reason): not touched.
    LeftAlone,
    /// `scontrol update … State=RESUME` succeeded.
    Resume,
    /// Dry run: the resume that would have been made.
    WouldResume,
    /// `scontrol` failed or timed out (see `reason`); tried again later.
    Error,
}

impl DrainDecision {
    /// Snake-case name, as written to the log.
    pub fn as_str(self) -> &'static str {
        match self {
            DrainDecision::Drain => "drain",
            DrainDecision::WouldDrain => "would_drain",
            DrainDecision::LeftAlone => "left_alone",
            DrainDecision::Resume => "resume",
            DrainDecision::WouldResume => "would_resume",
            DrainDecision::Error => "error",
        }
    }
}

/// One line of the drain audit log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrainRecord {
    /// RFC 3339 UTC time.
    pub time: String,
    /// Same, UTC ms.
    pub time_ms: i64,
    /// Host name.
    pub host: String,
    /// The Slurm node.
    pub node: String,
    /// The decision.
    pub decision: DrainDecision,
    /// Whether `[actions.drain]` was a dry run.
    pub dry_run: bool,
    /// The alert that asked for it ("" for a resume, which no single alert asks for).
    pub alert: String,
    /// Its GPU, when it is about one.
    pub gpu: Option<u32>,
    /// That alert's fingerprint.
    pub fingerprint: String,
    /// The drain reason written (or that would be), the node's reason left alone, or the error.
    pub reason: String,
    /// Whether it goes out as a notice (a repeated failure is only logged and audited).
    #[serde(skip)]
    pub notify: bool,
    /// The scheduler's words (Slurm's drain, Kubernetes' taint).
    #[serde(skip, default = "slurm_words")]
    pub words: &'static Words,
    /// Whether it is about putting the node back (a failed resume is not a failed drain).
    #[serde(skip)]
    pub undoing: bool,
}

fn slurm_words() -> &'static Words {
    &SLURM
}

/// How one scheduler's records say things.
#[derive(Debug, PartialEq, Eq)]
pub struct Words {
    /// `Slurm`, `Kubernetes`.
    pub scheduler: &'static str,
    /// `drain`, `taint`; `draining`, `tainting`; `drained`, `tainted`.
    pub act: &'static str,
    pub acting: &'static str,
    pub done: &'static str,
    /// `resume`, `untaint`; `resuming`, `untainting`; `resumed`, `untainted`.
    pub undo: &'static str,
    pub undoing: &'static str,
    pub undone: &'static str,
    /// The notice's alert name.
    pub notice: &'static str,
    /// The audit log's file name in the state directory.
    pub audit: &'static str,
}

impl Words {
    /// A decision's name in the audit log and the notice's `decision` label.
    pub fn decision(&self, d: DrainDecision) -> String {
        match d {
            DrainDecision::Drain => self.act.to_string(),
            DrainDecision::WouldDrain => format!("would_{}", self.act),
            DrainDecision::LeftAlone => "left_alone".into(),
            DrainDecision::Resume => self.undo.to_string(),
            DrainDecision::WouldResume => format!("would_{}", self.undo),
            DrainDecision::Error => "error".into(),
        }
    }
}

/// Slurm's words.
pub static SLURM: Words = Words {
    scheduler: "Slurm",
    act: "drain",
    acting: "draining",
    done: "drained",
    undo: "resume",
    undoing: "resuming",
    undone: "resumed",
    notice: "node_drain",
    audit: "drain-audit.jsonl",
};

/// How one scheduler takes this node out of service and puts it back (Slurm's drain,
/// Kubernetes' taint): what a [`NodeManager`]'s worker runs, and the settings it reads.
pub trait NodeHand: Clone + Send + std::fmt::Debug + 'static {
    /// Its words.
    fn words() -> &'static Words;
    /// The action is on.
    fn enabled(&self) -> bool;
    /// Say what would be done, do nothing.
    fn dry_run(&self) -> bool;
    /// Put the node back once the conditions have cleared.
    fn resume(&self) -> bool;
    /// How long they must have been clear.
    fn resume_after_ms(&self) -> i64;
    /// The node's name in the scheduler.
    fn node(&self, hostname: &str) -> String;
    /// Takes the node out with `reason` (never over someone else's).
    fn take_out(&self, node: &str, reason: &str) -> Drained;
    /// Puts it back (only when it is out by this hand).
    fn put_back(&self, node: &str) -> Resumed;
}

impl NodeHand for DrainSection {
    fn words() -> &'static Words {
        &SLURM
    }
    fn enabled(&self) -> bool {
        self.enabled
    }
    fn dry_run(&self) -> bool {
        self.dry_run
    }
    fn resume(&self) -> bool {
        self.resume
    }
    fn resume_after_ms(&self) -> i64 {
        self.resume_after.ms
    }
    fn node(&self, hostname: &str) -> String {
        self.node_name(hostname)
    }
    fn take_out(&self, node: &str, reason: &str) -> Drained {
        drain_node(self, node, reason, daemon_reason)
    }
    fn put_back(&self, node: &str) -> Resumed {
        resume_node(self, node, daemon_reason)
    }
}

impl DrainRecord {
    /// One line for humans.
    pub fn summary(&self) -> String {
        let w = self.words;
        let node = format!("{} node {}", w.scheduler, self.node);
        let r = &self.reason;
        match self.decision {
            DrainDecision::Drain => format!("{node} {}: {r}", w.done),
            DrainDecision::WouldDrain => format!("dry run: would {} {node}: {r}", w.act),
            DrainDecision::LeftAlone => format!("{node} left as it is: {r}"),
            DrainDecision::Resume => format!("{node} {}: {r}", w.undone),
            DrainDecision::WouldResume => format!("dry run: would {} {node}: {r}", w.undo),
            DrainDecision::Error if self.undoing => format!("{} {node} failed: {r}", w.undoing),
            DrainDecision::Error => format!("{} {node} failed: {r}", w.acting),
        }
    }

    /// The record as an audit line: the decision in the scheduler's words.
    pub fn audit_line(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        v["decision"] = serde_json::Value::from(self.words.decision(self.decision));
        v
    }

    /// The record as a one-shot `node_drain` notice (labels `decision`, `node`, `source_alert`,
    /// `gpu`): critical for a drain made or failed, info otherwise.
    pub fn to_alert_event(&self) -> AlertEvent {
        let mut labels = BTreeMap::new();
        let notice = self.words.notice;
        labels.insert("alertname".to_string(), notice.to_string());
        labels.insert(
            "decision".to_string(),
            self.words.decision(self.decision).to_string(),
        );
        labels.insert("node".to_string(), self.node.clone());
        labels.insert("hostname".to_string(), self.host.clone());
        if !self.alert.is_empty() {
            labels.insert("source_alert".to_string(), self.alert.clone());
        }
        if let Some(g) = self.gpu {
            labels.insert("gpu".to_string(), g.to_string());
        }
        let severity = match self.decision {
            DrainDecision::Drain | DrainDecision::Error => Severity::Critical,
            _ => Severity::Info,
        };
        labels.insert("severity".to_string(), severity.as_str().to_string());
        let mut annotations = BTreeMap::new();
        annotations.insert("summary".to_string(), self.summary());
        let fingerprint = super::fingerprint(&[
            notice,
            &self.fingerprint,
            self.decision.as_str(),
            &self.time_ms.to_string(),
        ]);
        AlertEvent::action_notice(
            fingerprint,
            notice,
            severity,
            labels,
            annotations,
            self.time_ms,
            self.gpu,
        )
    }
}

/// A firing alert that asks for a drain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// The alert (rule) name.
    pub alert: String,
    /// Its GPU, when it is about one.
    pub gpu: Option<u32>,
    /// The reason to write: `gpuwatch: ALERT GPU N SUMMARY`.
    pub reason: String,
}

impl Condition {
    /// The condition of alert `name` about `gpu` with `summary`.
    pub fn new(name: &str, gpu: Option<u32>, summary: &str) -> Condition {
        let on_gpu = gpu.map(|g| format!(" GPU {g}")).unwrap_or_default();
        Condition {
            alert: name.to_string(),
            gpu,
            reason: reason_line(&format!("{REASON_PREFIX} {name}{on_gpu} {summary}")),
        }
    }
}

/// What a worker is doing.
#[derive(Debug, Clone)]
enum Op {
    Drain {
        fingerprint: String,
        cond: Condition,
    },
    Resume,
}

/// What a worker found and did.
struct Done {
    op: Op,
    /// The decision and its reason; `None`: nothing to say (the daemon's drain already in
    /// place, or no drain to resume).
    said: Option<(DrainDecision, String)>,
    /// Whether the node is (still) drained by the daemon.
    ours: bool,
}

/// Slurm's drain state machine.
pub type DrainManager = NodeManager<DrainSection>;

/// The state machine of one daemon taking its node out of service and back, for one scheduler
/// (`H`: Slurm's drain, Kubernetes' taint).
#[derive(Debug)]
pub struct NodeManager<H: NodeHand> {
    section: H,
    node: String,
    host: String,
    audit_path: PathBuf,
    audit: Option<AuditLog>,
    /// Simulated GPUs: a dry run whatever the config says.
    simulated: bool,
    /// The firing conditions asking for a drain, by alert fingerprint, as of the last sync.
    conditions: BTreeMap<String, Condition>,
    /// Conditions acted on (the node drained or left alone for them).
    handled: BTreeSet<String>,
    /// A condition whose `scontrol` failed: when it is tried again, and how often it failed.
    retry: BTreeMap<String, (i64, u32)>,
    /// Whether the node may carry a drain of the daemon's to resume (in a dry run: whether one
    /// would have been made).
    ours: bool,
    /// Since when no condition has been firing.
    clear_since: Option<i64>,
    /// Why a resume must wait (from the newest sample): a GPU lost, awaiting a reset, or with a
    /// row remap pending.
    blocked: Option<String>,
    /// The newest time seen: the timers' clock never goes back.
    now_ms: i64,
    worker: Option<(Op, JoinHandle<Done>)>,
}

impl<H: NodeHand> NodeManager<H> {
    /// A manager for `section` on host `hostname`, auditing to `state_dir/drain-audit.jsonl`
    /// (Slurm; `taint-audit.jsonl` for Kubernetes).
    pub fn new(section: &H, state_dir: &Path, hostname: &str) -> NodeManager<H> {
        let mut m = NodeManager {
            node: section.node(hostname),
            host: hostname.to_string(),
            audit_path: state_dir.join(H::words().audit),
            audit: None,
            simulated: false,
            conditions: BTreeMap::new(),
            handled: BTreeSet::new(),
            retry: BTreeMap::new(),
            ours: false,
            clear_since: None,
            blocked: None,
            now_ms: i64::MIN,
            worker: None,
            section: section.clone(),
        };
        m.start_over();
        m
    }

    /// Whether nothing is done for real (a dry run, or simulated GPUs).
    fn dry_run(&self) -> bool {
        self.section.dry_run() || self.simulated
    }

    /// Simulated GPUs (`--sim`): a dry run from now on.
    pub fn set_simulated(&mut self, simulated: bool) {
        if simulated != self.simulated {
            self.simulated = simulated;
            self.start_over();
        }
    }

    /// Forgets what was acted on, so every firing condition is acted on again (at a start, a
    /// switch of dry run or resume, turning the action on). A drain made before is found by
    /// the resume check, as after a restart.
    fn start_over(&mut self) {
        self.handled.clear();
        self.retry.clear();
        self.ours = self.section.enabled() && self.section.resume() && !self.dry_run();
        self.clear_since = None;
    }

    /// Applies a reloaded `[actions.drain]`.
    pub fn reload(&mut self, section: &H) {
        self.node = section.node(&self.host);
        let changed = section.enabled() != self.section.enabled()
            || section.dry_run() != self.section.dry_run()
            || section.resume() != self.section.resume();
        self.section = section.clone();
        if changed {
            self.start_over();
        }
    }

    /// Whether the action is on (conditions are worth gathering).
    pub fn enabled(&self) -> bool {
        self.section.enabled()
    }

    /// Takes the conditions as they stand now: the engine's firing critical alerts whose rule
    /// declares `drain` (and that no silence holds), by fingerprint. Those gone end.
    pub fn sync(&mut self, firing: BTreeMap<String, Condition>, now_ms: i64) {
        let now = self.clock(now_ms);
        if !self.section.enabled() {
            self.conditions.clear();
            return;
        }
        self.handled.retain(|fp| firing.contains_key(fp));
        self.retry.retain(|fp, _| firing.contains_key(fp));
        if firing.is_empty() {
            self.clear_since.get_or_insert(now);
        } else {
            self.clear_since = None;
        }
        self.conditions = firing;
    }

    /// What the newest sample says about resuming: `Some(why)` while a GPU is lost, waits for a
    /// reset or has a row remap pending.
    pub fn note_gpus(&mut self, blocked: Option<String>) {
        self.blocked = blocked;
    }

    /// `now_ms`, never before a time already seen.
    fn clock(&mut self, now_ms: i64) -> i64 {
        self.now_ms = self.now_ms.max(now_ms);
        self.now_ms
    }

    /// Advances: collects a finished `scontrol`, starts the next one that is due. Returns the
    /// decisions made now (each already in the audit log).
    pub fn tick(&mut self, now_ms: i64) -> Vec<DrainRecord> {
        if !self.section.enabled() {
            return Vec::new();
        }
        let now = self.clock(now_ms);
        let mut out = Vec::new();
        if self.worker.as_ref().is_some_and(|(_, h)| h.is_finished()) {
            if let Some((op, handle)) = self.worker.take() {
                let done = handle.join().unwrap_or_else(|_| Done {
                    op,
                    said: Some((
                        DrainDecision::Error,
                        format!("the {} worker panicked", H::words().act),
                    )),
                    ours: self.ours,
                });
                out.extend(self.finish(done, now));
            }
        }
        if self.worker.is_none() {
            out.extend(self.start_next(now));
        }
        out
    }

    /// Records what a worker found.
    fn finish(&mut self, done: Done, now_ms: i64) -> Option<DrainRecord> {
        self.ours = done.ours;
        let (decision, reason) = done.said?;
        let mut notify = true;
        let (alert, gpu, fingerprint) = match &done.op {
            Op::Drain { fingerprint, cond } => {
                if decision == DrainDecision::Error {
                    self.handled.remove(fingerprint);
                    let failures = self.retry.get(fingerprint).map_or(0, |r| r.1) + 1;
                    notify = failures == 1;
                    let wait = RETRY_MS
                        .saturating_mul(1_i64 << (failures - 1).min(20))
                        .min(MAX_RETRY_MS);
                    self.retry
                        .insert(fingerprint.clone(), (now_ms.saturating_add(wait), failures));
                }
                (cond.alert.clone(), cond.gpu, fingerprint.clone())
            }
            Op::Resume => {
                if decision == DrainDecision::Error {
                    // (tried again after the same wait as a fresh clearance)
                    self.clear_since = Some(now_ms);
                }
                (String::new(), None, String::new())
            }
        };
        let undoing = matches!(done.op, Op::Resume);
        let mut rec = self.record(decision, alert, gpu, fingerprint, reason, now_ms);
        rec.notify = notify;
        rec.undoing = undoing;
        Some(rec)
    }

    /// Starts the next due operation: a drain for a condition not yet acted on, else a resume
    /// when every condition has been clear long enough and no GPU forbids it. In a dry run it is
    /// decided at once.
    fn start_next(&mut self, now_ms: i64) -> Option<DrainRecord> {
        let due = self
            .conditions
            .iter()
            .find(|(fp, _)| {
                !self.handled.contains(*fp)
                    && self.retry.get(*fp).is_none_or(|(at, _)| now_ms >= *at)
            })
            .map(|(fp, c)| (fp.clone(), c.clone()));
        if let Some((fingerprint, cond)) = due {
            self.handled.insert(fingerprint.clone());
            if self.dry_run() {
                // (once while the node would be drained: more conditions add nothing)
                if self.ours {
                    return None;
                }
                self.ours = true;
                return Some(self.record(
                    DrainDecision::WouldDrain,
                    cond.alert.clone(),
                    cond.gpu,
                    fingerprint,
                    cond.reason,
                    now_ms,
                ));
            }
            self.spawn(Op::Drain { fingerprint, cond });
            return None;
        }
        if !self.conditions.is_empty() || !self.ours {
            return None;
        }
        if !self.section.resume() {
            // (a dry run without resume: a later condition is said again)
            if self.dry_run() {
                self.ours = false;
            }
            return None;
        }
        let since = *self.clear_since.get_or_insert(now_ms);
        if since.saturating_add(self.section.resume_after_ms()) > now_ms || self.blocked.is_some() {
            return None;
        }
        if self.dry_run() {
            self.ours = false;
            let reason = format!(
                "every condition that asked for the {} has cleared",
                H::words().act
            );
            return Some(self.record(
                DrainDecision::WouldResume,
                String::new(),
                None,
                String::new(),
                reason,
                now_ms,
            ));
        }
        self.spawn(Op::Resume);
        None
    }

    fn spawn(&mut self, op: Op) {
        let section = self.section.clone();
        let node = self.node.clone();
        let ours = self.ours;
        let job = op.clone();
        let started = std::thread::Builder::new()
            .name(format!("gpuwatch-{}", H::words().act))
            .spawn(move || run_op(&section, &node, job, ours));
        match started {
            Ok(h) => self.worker = Some((op, h)),
            Err(e) => {
                tracing::error!("cannot start the {} worker thread: {e}", H::words().act);
                if let Op::Drain { fingerprint, .. } = &op {
                    self.handled.remove(fingerprint);
                }
            }
        }
    }

    /// Writes a record to the audit log (opened at the first) and the daemon's log.
    fn record(
        &mut self,
        decision: DrainDecision,
        alert: String,
        gpu: Option<u32>,
        fingerprint: String,
        reason: String,
        now_ms: i64,
    ) -> DrainRecord {
        let rec = DrainRecord {
            time: chrono::DateTime::from_timestamp_millis(now_ms)
                .unwrap_or_default()
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            time_ms: now_ms,
            host: self.host.clone(),
            node: self.node.clone(),
            decision,
            dry_run: self.dry_run(),
            alert,
            gpu,
            fingerprint,
            reason,
            notify: true,
            words: H::words(),
            undoing: false,
        };
        if self.audit.is_none() {
            match AuditLog::open(&self.audit_path) {
                Ok(log) => self.audit = Some(log),
                Err(e) => tracing::error!(
                    "cannot open the {} audit log {}: {e}",
                    H::words().act,
                    self.audit_path.display()
                ),
            }
        }
        if let Some(log) = &mut self.audit {
            if let Err(e) = log.append(&rec.audit_line()) {
                tracing::error!(
                    "cannot write the {} audit log {}: {e}",
                    H::words().act,
                    self.audit_path.display()
                );
            }
        }
        match decision {
            DrainDecision::Error => tracing::error!("{}", rec.summary()),
            _ => tracing::warn!("{}", rec.summary()),
        }
        rec
    }
}

/// `text` as a Slurm reason: one line (control characters as spaces), trimmed, cut at
/// [`MAX_REASON_CHARS`] with "…".
pub fn reason_line(text: &str) -> String {
    let clean: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let clean = clean.trim();
    if clean.chars().count() <= MAX_REASON_CHARS {
        return clean.to_string();
    }
    let mut cut: String = clean.chars().take(MAX_REASON_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// The node's state flags and reason, from `scontrol show node NODE --oneliner`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    /// `State=` (e.g. `IDLE+DRAIN`, `MIXED`, `DOWN+DRAIN+NOT_RESPONDING`).
    pub state: String,
    /// `Reason=` without Slurm's trailing ` [user@time]`; empty when none.
    pub reason: String,
}

impl NodeState {
    /// Parses one line of `scontrol show node --oneliner` (`Reason=` is its last field and may
    /// hold spaces).
    pub fn parse(line: &str) -> Option<NodeState> {
        let state = line
            .split_whitespace()
            .find_map(|f| f.strip_prefix("State="))?
            .to_string();
        let reason = line
            .find(" Reason=")
            .map(|i| &line[i + " Reason=".len()..])
            .map(|r| {
                let r = r.trim_end();
                match r.rfind(" [") {
                    Some(j) if r.ends_with(']') => &r[..j],
                    _ => r,
                }
            })
            .unwrap_or_default()
            .to_string();
        Some(NodeState { state, reason })
    }

    /// Whether it is drained or draining (by anyone).
    pub fn drained(&self) -> bool {
        self.state.split('+').any(|f| f.starts_with("DRAIN"))
    }

    /// Whether it is out of service in any way: drained, down, failed, in maintenance or
    /// rebooting.
    pub fn out_of_service(&self) -> bool {
        self.state.split('+').any(|f| {
            ["DRAIN", "DOWN", "FAIL", "MAINT", "REBOOT"]
                .iter()
                .any(|s| f.starts_with(s))
        })
    }
}

/// Runs `scontrol ARGS` within the section's timeout: its output, or why it failed.
fn scontrol(section: &DrainSection, args: &[&str]) -> Result<String, String> {
    slurm_tool(section, "scontrol", args)
}

/// Runs Slurm's `tool` with `args` within the section's timeout: `scontrol` is the one the
/// section names; `sacctmgr`, `squeue`, `sacct` are looked for beside it (on PATH when it is a
/// bare name). Its output, or why it failed (an argument over 60 characters shown cut).
pub fn slurm_tool(section: &DrainSection, tool: &str, args: &[&str]) -> Result<String, String> {
    let path = if tool == "scontrol" {
        section.scontrol.clone()
    } else {
        section
            .scontrol
            .parent()
            .map_or_else(|| PathBuf::from(tool), |d| d.join(tool))
    };
    let mut cmd = Command::new(&path);
    cmd.args(args);
    let deadline = Instant::now() + Duration::from_millis(section.timeout.ms.max(1) as u64);
    let (ok, out) = super::forensics::run_bounded(cmd, deadline);
    let shown: Vec<String> = args
        .iter()
        .map(|a| crate::values::truncate_chars(a, 60))
        .collect();
    let line = format!("{} {}", path.display(), shown.join(" "));
    if ok {
        Ok(out)
    } else if Instant::now() >= deadline {
        // (the accounting tools wait for slurmdbd, the others for slurmctld)
        let daemon = if tool.starts_with("sacct") {
            "slurmdbd"
        } else {
            "slurmctld"
        };
        Err(format!(
            "`{line}` took longer than {} ({daemon} unreachable?)",
            crate::values::format_duration_ms(section.timeout.ms)
        ))
    } else {
        Err(format!("`{line}`: {}", out.trim()))
    }
}

/// Sets a finished job's `AdminComment` in Slurm's accounting database (`sacctmgr -i modify
/// job where JobID=JOB set AdminComment=TEXT`, as jobstats does: slurmctld refuses to update a
/// job that ended, and an epilog runs after the end). Needs slurmdbd; `sacctmgr` is looked for
/// beside `scontrol`.
pub fn set_admin_comment(section: &DrainSection, job: &str, text: &str) -> Result<(), String> {
    let args = [
        "-i",
        "modify",
        "job",
        "where",
        &format!("JobID={job}"),
        "set",
        &format!("AdminComment={text}"),
    ];
    slurm_tool(section, "sacctmgr", &args).map(|_| ())
}

/// What [`drain_node`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drained {
    /// The node is now drained with the reason.
    Now,
    /// It already was, by gpuwatch (its reason starts with [`REASON_PREFIX`]).
    Already,
    /// Someone else drained it: left as it is (why, with their reason).
    LeftAlone(String),
    /// `scontrol` failed (why).
    Failed(String),
}

/// What [`resume_node`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resumed {
    /// Resumed; the reason its drain had.
    Now(String),
    /// It was not drained.
    NotDrained,
    /// Its drain is not one `ours` accepts: left as it is (why, with the reason).
    LeftAlone(String),
    /// `scontrol` failed (why).
    Failed(String),
}

/// The node's state through `scontrol show node NODE --oneliner`.
pub fn node_state(section: &DrainSection, node: &str) -> Result<NodeState, String> {
    let out = scontrol(section, &["show", "node", node, "--oneliner"])?;
    NodeState::parse(out.lines().next().unwrap_or_default())
        .ok_or_else(|| format!("no State= in scontrol's answer: {}", out.trim()))
}

/// Drains `node` with `reason` unless it is drained already by the same hand (`mine` says
/// which reasons are) or someone else took it out of service (drained, down, failed, in
/// maintenance, rebooting, or carrying a reason that is not `mine`): that is left as it is.
pub fn drain_node(
    section: &DrainSection,
    node: &str,
    reason: &str,
    mine: impl Fn(&str) -> bool,
) -> Drained {
    let state = match node_state(section, node) {
        Ok(s) => s,
        Err(e) => return Drained::Failed(e),
    };
    if state.drained() && mine(&state.reason) {
        return Drained::Already;
    }
    if state.out_of_service() || (!state.reason.is_empty() && !mine(&state.reason)) {
        return Drained::LeftAlone(format!(
            "already out of service by someone else's hand (state {}, reason {:?}); gpuwatch will not resume it",
            state.state, state.reason
        ));
    }
    let nodearg = format!("NodeName={node}");
    let reasonarg = format!("Reason={reason}");
    match scontrol(section, &["update", &nodearg, "State=DRAIN", &reasonarg]) {
        Ok(_) => Drained::Now,
        Err(e) => Drained::Failed(e),
    }
}

/// Resumes `node` when it is drained with a reason `mine` accepts; any other drain is left as
/// it is.
pub fn resume_node(section: &DrainSection, node: &str, mine: impl Fn(&str) -> bool) -> Resumed {
    let state = match node_state(section, node) {
        Ok(s) => s,
        Err(e) => return Resumed::Failed(e),
    };
    if !state.drained() {
        return Resumed::NotDrained;
    }
    if !mine(&state.reason) {
        return Resumed::LeftAlone(format!(
            "its drain is not gpuwatch's to undo (reason {:?}): not resumed",
            state.reason
        ));
    }
    let nodearg = format!("NodeName={node}");
    match scontrol(section, &["update", &nodearg, "State=RESUME"]) {
        Ok(_) => Resumed::Now(state.reason),
        Err(e) => Resumed::Failed(e),
    }
}

/// One operation, on the worker thread.
fn run_op<H: NodeHand>(section: &H, node: &str, op: Op, ours: bool) -> Done {
    let (said, ours) = match &op {
        Op::Drain { cond, .. } => match section.take_out(node, &cond.reason) {
            Drained::Now => (Some((DrainDecision::Drain, cond.reason.clone())), true),
            // (another condition took it out already)
            Drained::Already => (None, true),
            Drained::LeftAlone(why) => (Some((DrainDecision::LeftAlone, why)), false),
            // (it may have landed: a timed-out call; the put-back checks ownership anyway)
            Drained::Failed(e) => (Some((DrainDecision::Error, e)), true),
        },
        Op::Resume => match section.put_back(node) {
            Resumed::Now(was) => (
                Some((
                    DrainDecision::Resume,
                    format!(
                        "every condition that asked for the {} cleared {} ago (was: {was})",
                        H::words().act,
                        crate::values::format_duration_ms(section.resume_after_ms())
                    ),
                )),
                false,
            ),
            Resumed::NotDrained => (None, false),
            Resumed::LeftAlone(why) => (Some((DrainDecision::LeftAlone, why)), false),
            Resumed::Failed(e) => (Some((DrainDecision::Error, e)), ours),
        },
    };
    Done { op, said, ours }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scontrol_lines_parse_with_spaces_in_the_reason() {
        let line = "NodeName=gpu7 Arch=x86_64 State=IDLE+DRAIN ThreadsPerCore=1 Partitions=debug \
                    Reason=gpuwatch: xid_error GPU 5 XID 79 — fell off the bus [root@2026-12-06T14:33:04]";
        let s = NodeState::parse(line).unwrap();
        assert_eq!(s.state, "IDLE+DRAIN");
        assert_eq!(
            s.reason,
            "gpuwatch: xid_error GPU 5 XID 79 — fell off the bus"
        );
        assert!(s.drained() && daemon_reason(&s.reason));
        let admin = NodeState::parse(
            "NodeName=n State=MIXED+DRAIN Reason=bad fan [alice@2026-01-01T00:00:00]",
        )
        .unwrap();
        assert!(admin.drained() && !daemon_reason(&admin.reason));
        let idle = NodeState::parse("NodeName=n State=IDLE Weight=1").unwrap();
        assert!(!idle.drained() && !idle.out_of_service());
        assert_eq!(idle.reason, "");
        let down = NodeState::parse(
            "NodeName=n State=DOWN+NOT_RESPONDING Reason=Not responding [slurm@t]",
        )
        .unwrap();
        assert!(!down.drained() && down.out_of_service());
        let draining =
            NodeState::parse("NodeName=n State=DRAINING Reason=gpuwatch: x [root@t]").unwrap();
        assert!(draining.drained());
        assert_eq!(NodeState::parse("Node nosuch not found"), None);
    }

    #[test]
    fn each_hand_knows_its_own_drains() {
        let daemon = "gpuwatch: xid_error GPU 5 XID 79";
        let doctor = "gpuwatch: doctor GPU 3 (…): lost";
        let prolog = "gpuwatch: prolog job 42 GPU 3 (…): lost";
        assert!(daemon_reason(daemon) && !daemon_reason(doctor) && !daemon_reason(prolog));
        assert!(doctor_reason(doctor) && !doctor_reason(daemon) && !doctor_reason(prolog));
        assert!(prolog_reason(prolog) && !prolog_reason(doctor));
        assert!(!daemon_reason("maintenance"));
    }

    #[test]
    fn reasons_are_one_line_marked_and_bounded() {
        let c = Condition::new("xid_error", Some(5), "XID 79\nfell off the bus");
        assert_eq!(
            c.reason,
            "gpuwatch: xid_error GPU 5 XID 79 fell off the bus"
        );
        let long = Condition::new("xid_error", Some(5), &"é".repeat(500));
        assert_eq!(long.reason.chars().count(), MAX_REASON_CHARS);
        assert!(long.reason.ends_with('…') && long.reason.starts_with(REASON_PREFIX));
        let host = Condition::new("gpu_missing", None, "1 GPU missing");
        assert_eq!(host.reason, "gpuwatch: gpu_missing 1 GPU missing");
    }

    fn firing(fps: &[&str]) -> BTreeMap<String, Condition> {
        fps.iter()
            .map(|fp| {
                (
                    (*fp).to_string(),
                    Condition::new("xid_error", Some(5), "XID 79"),
                )
            })
            .collect()
    }

    /// Dry run: one `would_drain` per node however many conditions, a `would_resume` once they
    /// have been clear for `resume_after` and no GPU forbids it; all audited.
    #[test]
    fn a_dry_run_decides_at_once_and_resumes_after_the_clearance() {
        let dir = tempfile::tempdir().unwrap();
        let section = DrainSection {
            enabled: true,
            resume: true,
            resume_after: DurationSetting::from_ms(10_000),
            ..DrainSection::default()
        };
        let mut m = DrainManager::new(&section, dir.path(), "gpu7.lab.example");
        assert_eq!(m.node, "gpu7");
        m.sync(firing(&[]), 0);
        assert!(m.tick(0).is_empty(), "nothing firing, nothing of ours");
        m.sync(firing(&["fp5"]), 1);
        let r = m.tick(1);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].decision, DrainDecision::WouldDrain);
        assert_eq!(r[0].reason, "gpuwatch: xid_error GPU 5 XID 79");
        assert!(m.tick(2).is_empty(), "once per condition");
        m.sync(firing(&["fp5", "fp6"]), 3);
        assert!(m.tick(3).is_empty(), "once per node");
        m.sync(firing(&["fp6"]), 4);
        assert!(m.tick(5_000).is_empty(), "fp6 still firing");
        m.sync(firing(&[]), 6_000);
        assert!(m.tick(15_000).is_empty(), "not clear for 10 s yet");
        m.note_gpus(Some("GPU 5 is lost".into()));
        assert!(m.tick(16_000).is_empty(), "a lost GPU holds the resume");
        m.note_gpus(None);
        // (the clock never goes back: a late sample's time does not undo the wait)
        let r = m.tick(12_000);
        assert_eq!(r[0].decision, DrainDecision::WouldResume);
        let log = std::fs::read_to_string(dir.path().join("drain-audit.jsonl")).unwrap();
        assert_eq!(log.lines().count(), 2, "{log}");
        assert!(r[0].to_alert_event().once);
        // a new condition is said again
        m.sync(firing(&["fp7"]), 17_000);
        assert_eq!(m.tick(17_000)[0].decision, DrainDecision::WouldDrain);
    }

    /// Turning the dry run off acts on what is firing already; simulated GPUs stay a dry run.
    #[test]
    fn switching_the_dry_run_off_acts_on_alerts_already_firing() {
        let dir = tempfile::tempdir().unwrap();
        let mut section = DrainSection {
            enabled: true,
            scontrol: "/nonexistent/scontrol".into(),
            ..DrainSection::default()
        };
        let mut m = DrainManager::new(&section, dir.path(), "n1");
        m.sync(firing(&["fp5"]), 0);
        assert_eq!(m.tick(0)[0].decision, DrainDecision::WouldDrain);
        m.set_simulated(true);
        section.dry_run = false;
        m.reload(&section);
        m.sync(firing(&["fp5"]), 1);
        assert_eq!(
            m.tick(1)[0].decision,
            DrainDecision::WouldDrain,
            "simulated"
        );
        m.set_simulated(false);
        m.sync(firing(&["fp5"]), 2);
        assert!(m.tick(2).is_empty());
        assert!(
            m.worker.is_some(),
            "scontrol runs for the alert firing since before"
        );
    }

    /// A failing scontrol is an error record, notified once, tried again after 1, 2, 4 …
    /// minutes, never a panic.
    #[test]
    fn a_missing_scontrol_is_an_error_tried_again_later() {
        let dir = tempfile::tempdir().unwrap();
        let section = DrainSection {
            enabled: true,
            dry_run: false,
            scontrol: "/nonexistent/scontrol".into(),
            ..DrainSection::default()
        };
        let mut m = DrainManager::new(&section, dir.path(), "n1");
        let wait_record = |m: &mut DrainManager, now: i64| {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                std::thread::sleep(Duration::from_millis(10));
                let got = m.tick(now);
                if !got.is_empty() || Instant::now() > deadline {
                    return got;
                }
            }
        };
        m.sync(firing(&["fp5"]), 0);
        assert!(m.tick(0).is_empty());
        let got = wait_record(&mut m, 1);
        assert_eq!(got[0].decision, DrainDecision::Error, "{got:?}");
        assert!(got[0].reason.contains("cannot start"), "{}", got[0].reason);
        assert!(got[0].notify);
        assert!(m.tick(2).is_empty(), "not again at once");
        assert!(m.worker.is_none());
        m.tick(RETRY_MS + 1);
        assert!(m.worker.is_some(), "tried again after a minute");
        let again = wait_record(&mut m, RETRY_MS + 2);
        assert!(!again[0].notify, "a repeated failure is not notified again");
        m.tick(RETRY_MS + 2 + RETRY_MS);
        assert!(m.worker.is_none(), "the second wait is two minutes");
        m.tick(RETRY_MS + 2 + 2 * RETRY_MS);
        assert!(m.worker.is_some());
    }

    #[test]
    fn a_node_list_or_range_is_refused() {
        for bad in ["gpu[01-08]", "a,b", "a b"] {
            let s = DrainSection {
                node: bad.into(),
                ..DrainSection::default()
            };
            assert_eq!(s.validate().len(), 1, "{bad}");
        }
    }
}
