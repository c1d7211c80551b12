//! Routing alert events to actions: the one place the daemon and `gpuwatch run` hand their
//! [`AlertEvent`]s to, besides the notification dispatcher.
//!
//! * A firing event whose rule declares `action: kill` starts a kill ladder for the process the
//!   alert is about; its resolution cancels it (whatever the rule declares by then), and so do a
//!   silence that matches it ([`ActionRunner::cancel_where`]) and a reload after which its rule
//!   no longer declares the kill.
//! * Events matching an `[[actions.exec]]` entry run its command on a worker thread.
//!
//! [`ActionRunner::tick`] advances the ladders with the latest GPU process list. Everything it
//! and [`ActionRunner::handle`] return is an audit record, to be sent as a notification
//! ([`AuditRecord::to_alert_event`]). The kill audit log is opened at the first kill request.

use std::collections::HashMap;
use std::path::PathBuf;
use std::thread::JoinHandle;

use super::audit::{AuditDecision, AuditLog, AuditRecord};
use super::drain::{DrainManager, DrainRecord};
use super::exec::{run_exec, ExecOutcome, ExecSection};
use super::ladder::{KillManager, KillRequest};
use super::pidns::PidMapper;
use super::policy::{KillPolicy, KillSection};
use super::ActionsSection;
use crate::model::{AlertEvent, AlertStatus, ProcSample};

/// Routes events to the kill ladder and exec actions.
#[derive(Debug)]
pub struct ActionRunner {
    kill_section: KillSection,
    /// The version of `[actions]` in force: 1 at start, +1 at every reload.
    policy_version: u64,
    audit_path: PathBuf,
    kill: Option<KillManager>,
    exec: Vec<ExecSection>,
    hostname: String,
    running: Vec<JoinHandle<ExecOutcome>>,
    gpu_of: HashMap<u32, u32>,
    /// The firing event behind each kill ladder, by alert fingerprint (what a silence or a
    /// reload is checked against).
    kill_events: HashMap<String, AlertEvent>,
    /// `[actions.drain]`.
    drain: DrainManager,
    /// Drain decisions made since [`ActionRunner::drain_records`] last took them.
    drained: Vec<DrainRecord>,
    /// `[actions.taint]`; its records go with the drain's.
    taint: super::taint::TaintManager,
}

impl ActionRunner {
    /// A runner for `[actions]`; the audit log defaults to `state_dir/kill-audit.jsonl`.
    pub fn new(
        actions: &ActionsSection,
        state_dir: &std::path::Path,
        hostname: &str,
    ) -> ActionRunner {
        ActionRunner {
            kill_section: actions.kill.clone(),
            policy_version: 1,
            audit_path: actions.audit_log_path(state_dir),
            kill: None,
            exec: actions.exec.clone(),
            hostname: hostname.to_string(),
            running: Vec::new(),
            gpu_of: HashMap::new(),
            kill_events: HashMap::new(),
            drain: DrainManager::new(&actions.drain, state_dir, hostname),
            drained: Vec::new(),
            taint: super::taint::TaintManager::new(&actions.taint, state_dir, hostname),
        }
    }

    /// Applies a reloaded `[actions]`: the kill policy (a tightening takes effect at the next
    /// step, also for ladders already running; the rate of recent kills is kept) and the exec
    /// entries. The audit log stays where it is. Returns the new policy version.
    pub fn reload(&mut self, actions: &super::ActionsSection) -> u64 {
        if actions
            .kill
            .audit_log
            .as_ref()
            .is_some_and(|p| *p != self.audit_path)
        {
            tracing::warn!(
                "actions.kill.audit_log changed: takes effect at the next start; still writing {}",
                self.audit_path.display()
            );
        }
        self.kill_section = actions.kill.clone();
        self.exec = actions.exec.clone();
        self.drain.reload(&actions.drain);
        self.taint.reload(&actions.taint);
        self.policy_version += 1;
        if let Some(k) = &mut self.kill {
            k.set_section(actions.kill.clone(), self.policy_version);
        }
        self.policy_version
    }

    /// The audit log path.
    pub fn audit_path(&self) -> &std::path::Path {
        &self.audit_path
    }

    /// The reason gpuwatch signalled local PID or process group `pid`, if it did.
    pub fn killed_by_gpuwatch(&self, pid: u32) -> Option<String> {
        self.kill.as_ref().and_then(|k| k.signalled(pid).cloned())
    }

    /// Number of kill ladders in progress.
    pub fn active_kills(&self) -> usize {
        self.kill.as_ref().map_or(0, KillManager::active)
    }

    fn kill_manager(&mut self) -> Result<&mut KillManager, String> {
        if self.kill.is_none() {
            let audit = AuditLog::open(&self.audit_path).map_err(|e| {
                format!(
                    "cannot open the kill audit log {}: {e}; no process is killed without one",
                    self.audit_path.display()
                )
            })?;
            let mapper = PidMapper::detect(self.kill_section.host_proc.as_deref());
            let mut policy = KillPolicy::new(self.kill_section.clone());
            policy.version = self.policy_version;
            self.kill = Some(KillManager::new(policy, audit, mapper));
        }
        self.kill
            .as_mut()
            .ok_or_else(|| "kill manager missing".to_string())
    }

    /// Routes `events`; returns the audit records of what was decided now.
    pub fn handle(&mut self, events: &[AlertEvent], now_ms: i64) -> Vec<AuditRecord> {
        let mut out = Vec::new();
        for ev in events {
            // Only a rule's declared `action:` can ask for a kill, and only a process or job
            // rule's own target can be killed (typed, never read from labels or annotations).
            if ev.status == AlertStatus::Resolved {
                // Whatever the rule declares by now (a reload may have removed the action).
                out.extend(self.cancel_kills(&ev.fingerprint, now_ms, "the alert resolved"));
            } else if ev.actions.contains(&crate::model::Action::Kill) {
                out.extend(self.route_kill(ev, now_ms));
            }
            for section in &self.exec {
                if section.matches(ev) {
                    let (section, ev, host) = (section.clone(), ev.clone(), self.hostname.clone());
                    match std::thread::Builder::new()
                        .name(format!("gpuwatch-exec-{}", section.name))
                        .spawn(move || run_exec(&section, &ev, &host))
                    {
                        Ok(h) => self.running.push(h),
                        Err(e) => tracing::error!("cannot start an exec action thread: {e}"),
                    }
                }
            }
        }
        self.reap(false);
        // (on the events' clock, which under --speed is the simulated one)
        self.drained.extend(self.drain.tick(now_ms));
        self.drained.extend(self.taint.tick(now_ms));
        out
    }

    /// The drain and taint decisions made since the last call (each already in its audit log).
    pub fn drain_records(&mut self) -> Vec<DrainRecord> {
        std::mem::take(&mut self.drained)
    }

    /// `[actions.drain]`'s state machine (its conditions, the GPUs' state, simulated GPUs).
    pub fn drain_mut(&mut self) -> &mut DrainManager {
        &mut self.drain
    }

    /// `[actions.taint]`'s state machine.
    pub fn taint_mut(&mut self) -> &mut super::taint::TaintManager {
        &mut self.taint
    }

    fn route_kill(&mut self, ev: &AlertEvent, now_ms: i64) -> Vec<AuditRecord> {
        let Some(host_pid) = ev.target_pid else {
            tracing::warn!(alert = %ev.name, "action \"kill\" on an alert without a target process; ignored");
            return Vec::new();
        };
        let host = self.hostname.clone();
        let manager = match self.kill_manager() {
            Ok(m) => m,
            Err(reason) => {
                tracing::error!("{reason}");
                return vec![refusal(ev, host_pid, &host, &reason, now_ms)];
            }
        };
        manager.request(KillRequest {
            host_pid,
            start_ticks: ev.target_start,
            local: ev.target_local,
            mig: ev.labels.get("mig").cloned(),
            alert: ev.name.clone(),
            fingerprint: ev.fingerprint.clone(),
            reason: ev
                .annotations
                .get("summary")
                .cloned()
                .unwrap_or_else(|| ev.name.clone()),
        });
        self.kill_events.insert(ev.fingerprint.clone(), ev.clone());
        Vec::new()
    }

    /// Stops the kill ladders of alert `fingerprint` (audited when a step was taken).
    fn cancel_kills(&mut self, fingerprint: &str, now_ms: i64, why: &str) -> Vec<AuditRecord> {
        self.kill_events.remove(fingerprint);
        match &mut self.kill {
            Some(k) => k.cancel(fingerprint, now_ms, why),
            None => Vec::new(),
        }
    }

    /// Stops the kill ladders whose alert `stop` says (a silence that matches it, a reloaded
    /// rule that no longer declares the kill), each with an audit record saying `why`.
    pub fn cancel_where(
        &mut self,
        stop: impl Fn(&AlertEvent) -> bool,
        now_ms: i64,
        why: &str,
    ) -> Vec<AuditRecord> {
        if let Some(k) = &self.kill {
            // Ladders that ended on their own need no event any more.
            self.kill_events.retain(|fp, _| k.has(fp));
        }
        let stopped: Vec<String> = self
            .kill_events
            .iter()
            .filter(|(_, ev)| stop(ev))
            .map(|(fp, _)| fp.clone())
            .collect();
        let mut out = Vec::new();
        for fp in stopped {
            out.extend(self.cancel_kills(&fp, now_ms, why));
        }
        out
    }

    /// Advances the kill ladders. `processes` is the latest GPU process list when it was
    /// refreshed (`None`: unchanged).
    pub fn tick(&mut self, now_ms: i64, processes: Option<&[ProcSample]>) -> Vec<AuditRecord> {
        if let Some(list) = processes {
            self.gpu_of = list.iter().map(|p| (p.pid, p.gpu_index)).collect();
        }
        self.reap(false);
        match &mut self.kill {
            Some(k) if k.active() > 0 => k.tick(now_ms, &self.gpu_of),
            _ => Vec::new(),
        }
    }

    /// Waits for running exec actions (each is bounded by its own timeout).
    pub fn finish(&mut self) {
        self.reap(true);
    }

    fn reap(&mut self, wait: bool) {
        let mut still = Vec::new();
        for h in self.running.drain(..) {
            if wait || h.is_finished() {
                let _ = h.join();
            } else {
                still.push(h);
            }
        }
        self.running = still;
    }
}

fn refusal(ev: &AlertEvent, host_pid: u32, host: &str, reason: &str, now_ms: i64) -> AuditRecord {
    AuditRecord {
        time: chrono::DateTime::from_timestamp_millis(now_ms)
            .unwrap_or_default()
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        time_ms: now_ms,
        host: host.to_string(),
        decision: AuditDecision::Error,
        dry_run: true,
        host_pid,
        pid: None,
        target: None,
        uid: None,
        user: ev.labels.get("user").cloned(),
        command: None,
        gpu: ev.gpu,
        alert: ev.name.clone(),
        fingerprint: ev.fingerprint.clone(),
        reason: reason.to_string(),
        policy_version: 0,
        mig: ev.labels.get("mig").cloned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Severity;
    use crate::values::DurationSetting;
    use std::collections::BTreeMap;

    fn event(pid: u32, status: AlertStatus, action: &str) -> AlertEvent {
        let mut labels = BTreeMap::new();
        labels.insert("alertname".into(), "gpu_memory_quota".into());
        labels.insert("pid".into(), pid.to_string());
        let mut annotations = BTreeMap::new();
        annotations.insert("summary".into(), "over quota".into());
        let actions = action
            .split(',')
            .filter_map(crate::model::Action::parse)
            .collect();
        AlertEvent {
            fingerprint: "fp".into(),
            name: "gpu_memory_quota".into(),
            severity: Severity::Warning,
            status,
            labels,
            annotations,
            starts_at_ms: 0,
            ends_at_ms: None,
            at_ms: 0,
            repeat: false,
            gpu: Some(0),
            actions,
            target_pid: Some(pid),
            target_start: None,
            target_local: false,
            chart: None,
            once: false,
            ended: None,
        }
    }

    fn on_gpu(pid: u32) -> ProcSample {
        ProcSample::compute(pid, 0, "GPU-0", Some(1 << 30))
    }

    #[test]
    fn dry_run_ladder_from_events_and_cancel_on_resolve() {
        let dir = tempfile::tempdir().unwrap();
        let mut actions = ActionsSection::default();
        actions.kill.grace = DurationSetting::from_ms(0);
        actions.kill.allow_users = vec!["*".into()];
        actions.kill.allow_root = true;
        actions.kill.min_uid = 0;
        let mut runner = ActionRunner::new(&actions, dir.path(), "h");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        assert!(runner
            .handle(&[event(pid, AlertStatus::Firing, "kill")], 0)
            .is_empty());
        let procs = [on_gpu(pid)];
        let r = runner.tick(1, Some(&procs));
        assert_eq!(r[0].decision, AuditDecision::WouldWarn);
        let r = runner.tick(2, None);
        assert_eq!(r[0].decision, AuditDecision::WouldTerm);
        let r = runner.handle(&[event(pid, AlertStatus::Resolved, "kill")], 3);
        assert_eq!(r[0].decision, AuditDecision::Cancelled);
        assert_eq!(runner.active_kills(), 0);
        assert!(child.try_wait().unwrap().is_none());
        let log = AuditLog::read_all(&dir.path().join("kill-audit.jsonl")).unwrap();
        assert_eq!(log.len(), 3);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn unwritable_audit_log_refuses() {
        let mut actions = ActionsSection::default();
        actions.kill.audit_log = Some("/proc/gpuwatch-cannot-write/audit.jsonl".into());
        let mut runner = ActionRunner::new(&actions, std::path::Path::new("/tmp"), "h");
        let r = runner.handle(&[event(1234, AlertStatus::Firing, "kill")], 0);
        assert_eq!(r[0].decision, AuditDecision::Error);
        assert!(r[0].reason.contains("no process is killed without one"));
    }

    #[test]
    fn exec_actions_run_for_matching_events() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("ran");
        let actions = ActionsSection {
            exec: vec![ExecSection {
                name: "note".into(),
                command: vec![
                    "sh".into(),
                    "-c".into(),
                    format!("echo \"$GPUWATCH_ALERT_NAME\" > {}", out.display()),
                ],
                timeout: DurationSetting::from_ms(5000),
                alerts: vec![],
                on: vec![crate::action::exec::ExecOn::Firing],
            }],
            ..ActionsSection::default()
        };
        let mut runner = ActionRunner::new(&actions, dir.path(), "h");
        runner.handle(&[event(1, AlertStatus::Firing, "exec:note")], 0);
        runner.finish();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "gpu_memory_quota\n");
    }
}
