//! The kill ladder: warning → grace → SIGTERM to the process group → wait → SIGKILL.
//!
//! [`KillManager`] holds one ladder per (alert fingerprint, host PID). [`KillManager::request`]
//! starts one (a firing `action: "kill"` alert), [`KillManager::cancel`] stops it (the alert
//! resolved), and [`KillManager::tick`] advances every ladder whose next step is due, re-reading
//! the target's facts and re-running the policy before each step. Every decision is appended to
//! the audit log and returned as a notice for the dispatcher. In dry-run mode the ladder runs on
//! the same schedule with `would_*` records and sends no signal.
//!
//! The schedule (grace, term timeout) runs on the monotonic clock ([`crate::sys::monotonic_ms`]),
//! not on the wall-clock time the caller passes: a wall-clock step (NTP, a manual date change)
//! between two steps neither cuts the grace to nothing nor stretches it. The wall-clock time is
//! what the audit records say.

use std::collections::{BTreeMap, HashMap};

use super::audit::{AuditDecision, AuditLog, AuditRecord};
use super::pidns::PidMapper;
use super::policy::{gather_facts, KillPolicy, SelfFacts, SignalTarget, TargetFacts};

/// A request to stop one process.
#[derive(Debug, Clone, PartialEq)]
pub struct KillRequest {
    /// PID as NVML reports it (or, with `local`, as gpuwatch itself sees it).
    pub host_pid: u32,
    /// When the process the alert is about started (clock ticks since boot), when known: the
    /// ladder's first step already refuses a process that reused the PID.
    pub start_ticks: Option<u64>,
    /// `host_pid` is a PID of gpuwatch's own namespace (a job `run`/`attach` watches), not one
    /// NVML reports: it is not mapped through `actions.kill.host_proc`.
    pub local: bool,
    /// The MIG device the process runs on, as the alert names it (for the audit record).
    pub mig: Option<String>,
    /// The alert (rule) asking.
    pub alert: String,
    /// Its fingerprint.
    pub fingerprint: String,
    /// Why (the alert summary).
    pub reason: String,
}

/// Where a ladder is; the times are monotonic ms ([`crate::sys::monotonic_ms`]).
impl KillRequest {
    /// The process to look up: its PID and the namespace it is in.
    pub fn target(&self) -> super::pidns::Pid {
        if self.local {
            super::pidns::Pid::Local(self.host_pid)
        } else {
            super::pidns::Pid::Host(self.host_pid)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing done yet.
    New,
    /// Warned at this time.
    Warned(i64),
    /// SIGTERM sent (or would have been) at this time.
    Termed(i64),
    /// SIGKILL sent at this time; waiting for the process to vanish.
    Killed(i64),
}

#[derive(Debug, Clone)]
struct Ladder {
    request: KillRequest,
    phase: Phase,
    start_ticks: Option<u64>,
    target: Option<SignalTarget>,
    last: TargetFacts,
}

/// The time of a step: the wall clock for the audit records, the monotonic clock for the
/// schedule.
#[derive(Debug, Clone, Copy)]
struct Now {
    wall_ms: i64,
    mono_ms: i64,
}

/// Runs kill ladders under a policy.
#[derive(Debug)]
pub struct KillManager {
    policy: KillPolicy,
    audit: AuditLog,
    mapper: PidMapper,
    me: SelfFacts,
    host: String,
    ladders: BTreeMap<(String, u32), Ladder>,
    /// Host PIDs gpuwatch has signalled, with the reason (for `run`'s crash class).
    signalled: HashMap<u32, String>,
}

impl KillManager {
    /// Replaces the policy's settings (a reload); recent kills still count against the rate.
    /// A change between dry run and live restarts every ladder from its warning: a step taken in
    /// one mode never counts as a step of the other (a dry run's `would_term` must not be
    /// followed by a real SIGKILL with no SIGTERM before it).
    pub fn set_section(&mut self, section: super::policy::KillSection, version: u64) {
        if section.dry_run != self.policy.section.dry_run {
            for l in self.ladders.values_mut() {
                l.phase = Phase::New;
            }
        }
        self.policy.section = section;
        self.policy.version = version;
    }

    /// Whether a ladder runs for alert `fingerprint`.
    pub fn has(&self, fingerprint: &str) -> bool {
        self.ladders.keys().any(|(f, _)| f == fingerprint)
    }

    /// A manager writing to `audit`.
    pub fn new(policy: KillPolicy, audit: AuditLog, mapper: PidMapper) -> KillManager {
        KillManager {
            policy,
            audit,
            mapper,
            me: SelfFacts::current(),
            host: crate::sys::hostname(),
            ladders: BTreeMap::new(),
            signalled: HashMap::new(),
        }
    }

    /// Number of ladders in progress.
    pub fn active(&self) -> usize {
        self.ladders.len()
    }

    /// The reason gpuwatch signalled local PID or process group `pid`, if it did.
    pub fn signalled(&self, pid: u32) -> Option<&String> {
        self.signalled.get(&pid)
    }

    /// Starts a ladder (no-op when one runs for the same alert and PID). The first step is taken
    /// at the next [`KillManager::tick`].
    pub fn request(&mut self, request: KillRequest) {
        let key = (request.fingerprint.clone(), request.host_pid);
        self.ladders.entry(key).or_insert_with(|| Ladder {
            start_ticks: request.start_ticks,
            request,
            phase: Phase::New,
            target: None,
            last: TargetFacts::default(),
        });
    }

    /// Stops every ladder of alert `fingerprint` (the alert resolved) before its next signal.
    pub fn cancel(&mut self, fingerprint: &str, now_ms: i64, why: &str) -> Vec<AuditRecord> {
        let keys: Vec<_> = self
            .ladders
            .keys()
            .filter(|(f, _)| f == fingerprint)
            .cloned()
            .collect();
        let mut out = Vec::new();
        for key in keys {
            if let Some(l) = self.ladders.remove(&key) {
                if matches!(l.phase, Phase::New) {
                    continue;
                }
                out.push(self.record(&l, &l.last.clone(), AuditDecision::Cancelled, why, now_ms));
            }
        }
        out
    }

    /// Advances every ladder. `gpu_of` maps host PIDs currently on a GPU to their GPU index;
    /// `now_ms` (wall clock, UTC ms) is the time the audit records say. When a step is due is
    /// decided on the monotonic clock.
    pub fn tick(&mut self, now_ms: i64, gpu_of: &HashMap<u32, u32>) -> Vec<AuditRecord> {
        self.tick_at(now_ms, crate::sys::monotonic_ms(), gpu_of)
    }

    /// [`KillManager::tick`] at monotonic time `mono_ms`.
    fn tick_at(
        &mut self,
        now_ms: i64,
        mono_ms: i64,
        gpu_of: &HashMap<u32, u32>,
    ) -> Vec<AuditRecord> {
        let keys: Vec<_> = self.ladders.keys().cloned().collect();
        let mut out = Vec::new();
        let now = Now {
            wall_ms: now_ms,
            mono_ms,
        };
        for key in keys {
            let Some(mut ladder) = self.ladders.remove(&key) else {
                continue;
            };
            let keep = self.step(&mut ladder, now, gpu_of, &mut out);
            if keep {
                self.ladders.insert(key, ladder);
            }
        }
        out
    }

    /// Takes the ladder's due step; returns false when the ladder is finished.
    fn step(
        &mut self,
        l: &mut Ladder,
        now: Now,
        gpu_of: &HashMap<u32, u32>,
        out: &mut Vec<AuditRecord>,
    ) -> bool {
        let Now {
            wall_ms: now_ms,
            mono_ms,
        } = now;
        let facts = gather_facts(l.request.target(), &self.mapper, gpu_of);
        let dry = self.policy.dry_run();
        let grace = self.policy.section.grace.ms;
        let term_timeout = self.policy.section.term_timeout.ms;
        let same_process =
            facts.alive && (l.start_ticks.is_none() || facts.start_ticks == l.start_ticks);
        if !same_process && !matches!(l.phase, Phase::New) {
            let what = match l.phase {
                Phase::Termed(_) if !dry => "exited after SIGTERM",
                Phase::Killed(_) => "exited after SIGKILL",
                _ => "exited before gpuwatch signalled it",
            };
            out.push(self.record(l, &l.last.clone(), AuditDecision::Exited, what, now_ms));
            return false;
        }
        // In a dry run every step is recorded as what it would have done.
        let step = |real, would| if dry { would } else { real };
        let (decision, counting) = match l.phase {
            Phase::New => (step(AuditDecision::Warn, AuditDecision::WouldWarn), false),
            Phase::Warned(at) if mono_ms >= at + grace => {
                (step(AuditDecision::Term, AuditDecision::WouldTerm), true)
            }
            Phase::Termed(at) if mono_ms >= at + term_timeout => {
                (step(AuditDecision::Kill, AuditDecision::WouldKill), false)
            }
            Phase::Killed(at) => {
                if mono_ms >= at + term_timeout {
                    let why =
                        "still present after SIGKILL (uninterruptible sleep or a driver hang)";
                    out.push(self.record(l, &facts, AuditDecision::Error, why, now_ms));
                    return false;
                }
                return true;
            }
            _ => return true,
        };
        let expected = l.start_ticks;
        // Re-check the policy before every step, including the warning.
        let approved = self
            .policy
            .decide(&facts, &self.me, expected, counting && !dry, now_ms);
        l.last = facts.clone();
        let target = match approved {
            Ok(t) => t,
            Err(refusal) => {
                let reason = refusal.to_string();
                if matches!(l.phase, Phase::New) || !matches!(refusal, super::Refusal::NotOnGpu) {
                    out.push(self.record(l, &facts, AuditDecision::Refused, &reason, now_ms));
                } else {
                    out.push(self.record(
                        l,
                        &facts,
                        AuditDecision::Cancelled,
                        "the process left the GPU",
                        now_ms,
                    ));
                }
                return false;
            }
        };
        l.start_ticks = facts.start_ticks;
        l.target = Some(target);
        let mut reason = l.request.reason.clone();
        match decision {
            AuditDecision::Warn | AuditDecision::WouldWarn => {
                l.phase = Phase::Warned(mono_ms);
                reason = format!(
                    "{reason}; SIGTERM in {}, SIGKILL {} later",
                    crate::values::format_duration_ms(grace),
                    crate::values::format_duration_ms(term_timeout)
                );
            }
            AuditDecision::WouldTerm => l.phase = Phase::Termed(mono_ms),
            AuditDecision::WouldKill => {
                out.push(self.record(l, &facts, decision, &reason, now_ms));
                return false;
            }
            AuditDecision::Term | AuditDecision::Kill => {
                // The record is written before the signal is sent: no signal goes out unaudited.
                let rec = self.unwritten(l, &facts, decision, &reason, now_ms);
                if let Err(e) = self.audit.append(&rec) {
                    let why = format!(
                        "cannot write the kill audit log {}: {e}; no signal sent",
                        self.audit.path().display()
                    );
                    tracing::error!("{why}");
                    out.push(self.unwritten(l, &facts, AuditDecision::Error, &why, now_ms));
                    return false;
                }
                let term = decision == AuditDecision::Term;
                let signal = if term { libc::SIGTERM } else { libc::SIGKILL };
                if let Err(e) = send(target, signal) {
                    out.push(self.record(l, &facts, AuditDecision::Error, &e, now_ms));
                    return false;
                }
                if term {
                    self.policy.note_kill(now_ms);
                    self.note_signalled(target, &facts, &l.request);
                    l.phase = Phase::Termed(mono_ms);
                } else {
                    l.phase = Phase::Killed(mono_ms);
                }
                out.push(rec);
                return true;
            }
            _ => {}
        }
        out.push(self.record(l, &facts, decision, &reason, now_ms));
        true
    }

    fn note_signalled(&mut self, target: SignalTarget, facts: &TargetFacts, req: &KillRequest) {
        let why = format!("{} ({})", req.alert, req.reason);
        if let Ok(pid) = facts.pid {
            self.signalled.insert(pid, why.clone());
        }
        if let SignalTarget::Group(g) = target {
            self.signalled.insert(g, why);
        }
    }

    /// The audit record of a decision, appended to the log (a failure to write is logged).
    fn record(
        &mut self,
        l: &Ladder,
        facts: &TargetFacts,
        decision: AuditDecision,
        reason: &str,
        now_ms: i64,
    ) -> AuditRecord {
        let rec = self.unwritten(l, facts, decision, reason, now_ms);
        if let Err(e) = self.audit.append(&rec) {
            tracing::error!(path = %self.audit.path().display(), "cannot write the kill audit log: {e}");
        }
        rec
    }

    /// The audit record of a decision, not yet written.
    fn unwritten(
        &self,
        l: &Ladder,
        facts: &TargetFacts,
        decision: AuditDecision,
        reason: &str,
        now_ms: i64,
    ) -> AuditRecord {
        AuditRecord {
            time: chrono::DateTime::from_timestamp_millis(now_ms)
                .unwrap_or_default()
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            time_ms: now_ms,
            host: self.host.clone(),
            decision,
            dry_run: self.policy.dry_run(),
            host_pid: l.request.host_pid,
            pid: facts.pid.as_ref().ok().copied(),
            target: l.target.map(|t| t.to_string()),
            uid: facts.uid,
            user: facts.user.clone(),
            command: facts.command.clone(),
            gpu: facts.gpu,
            alert: l.request.alert.clone(),
            fingerprint: l.request.fingerprint.clone(),
            reason: reason.to_string(),
            policy_version: self.policy.version,
            mig: l.request.mig.clone(),
        }
    }
}

/// Sends `signal` to a group or process.
fn send(target: SignalTarget, signal: i32) -> Result<(), String> {
    let raw = match target {
        SignalTarget::Group(g) => -(g as libc::pid_t),
        SignalTarget::Process(p) | SignalTarget::ProcessOnly { pid: p, .. } => p as libc::pid_t,
    };
    // SAFETY: kill(2) with a pid or negative pgid.
    let rc = unsafe { libc::kill(raw, signal) };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!(
            "kill({raw}, {}) failed: {}",
            crate::model::job::signal_name(signal),
            std::io::Error::last_os_error()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::action::policy::KillSection;
    use crate::values::DurationSetting;
    use std::os::unix::process::CommandExt;
    use std::process::{Child, Command};
    use std::time::{Duration, Instant};

    fn my_user() -> String {
        crate::sys::user_name(unsafe { libc::getuid() }).unwrap()
    }

    fn section(dry_run: bool) -> KillSection {
        KillSection {
            dry_run,
            allow_users: vec![my_user()],
            allow_root: unsafe { libc::getuid() } == 0,
            min_uid: 0,
            grace: DurationSetting::from_ms(300),
            term_timeout: DurationSetting::from_ms(300),
            ..KillSection::default()
        }
    }

    /// Starts `sh -c SCRIPT` in its own process group and returns once the shell has run
    /// `setup` (e.g. installed its traps), however slow the machine is.
    fn spawn_after(setup: &str, script: &str) -> Child {
        use std::io::BufRead;
        let mut child = Command::new("sh")
            .args([
                "-c",
                &format!("{setup} echo ready; exec >/dev/null; {script}"),
            ])
            .process_group(0)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
        child
    }

    fn spawn(script: &str) -> Child {
        spawn_after("", script)
    }

    fn manager(s: KillSection, dir: &std::path::Path) -> KillManager {
        let audit = AuditLog::open(&dir.join("audit.jsonl")).unwrap();
        KillManager::new(KillPolicy::new(s), audit, PidMapper::Identity)
    }

    fn request(pid: u32) -> KillRequest {
        KillRequest {
            start_ticks: None,
            local: false,
            mig: None,
            host_pid: pid,
            alert: "gpu_memory_quota".into(),
            fingerprint: "fp1".into(),
            reason: "uses 30 GiB of GPU memory".into(),
        }
    }

    /// Ticks every 20 ms until no ladder is left (or 10 s), returning the decisions with the
    /// time since start.
    fn drive(
        m: &mut KillManager,
        gpu_of: &HashMap<u32, u32>,
        child: &mut Child,
    ) -> Vec<(AuditDecision, u128)> {
        let start = Instant::now();
        let start_ms = crate::sys::now_ms();
        let mut seen = Vec::new();
        while m.active() > 0 && start.elapsed() < Duration::from_secs(10) {
            for r in m.tick(crate::sys::now_ms(), gpu_of) {
                // The ladder's own decision time (what its schedule is about), not when this loop
                // got to look: a slow tick (fsync of the audit log under load) would skew that.
                let at = u128::try_from(r.time_ms - start_ms).unwrap_or(0);
                seen.push((r.decision, at));
            }
            let _ = child.try_wait();
            std::thread::sleep(Duration::from_millis(20));
        }
        seen
    }

    /// A kill asked for an alert about a process that has since been replaced by another one
    /// with the same PID is refused at its first step: the request carries the start time.
    #[test]
    fn a_request_for_a_replaced_process_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = spawn("sleep 30");
        let pid = child.id();
        let start = crate::sys::read_stat(pid).unwrap().start_ticks;
        let gpu_of = HashMap::from([(pid, 0)]);
        let mut m = manager(section(false), dir.path());
        m.request(KillRequest {
            start_ticks: Some(start + 1),
            ..request(pid)
        });
        let out = m.tick(crate::sys::now_ms(), &gpu_of);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].decision, AuditDecision::Refused, "{out:?}");
        assert!(out[0].reason.contains("different process"), "{out:?}");
        assert!(child.try_wait().unwrap().is_none());
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// No signal is sent when its audit record cannot be written.
    #[test]
    fn no_signal_without_its_audit_record() {
        let mut child = spawn("sleep 30");
        let pid = child.id();
        let gpu_of = HashMap::from([(pid, 0)]);
        let mut s = section(false);
        s.grace = DurationSetting::from_ms(0);
        let full = std::path::Path::new("/dev/full");
        let file = std::fs::OpenOptions::new().append(true).open(full).unwrap();
        let audit = AuditLog::from_file(full, file);
        let mut m = KillManager::new(KillPolicy::new(s), audit, PidMapper::Identity);
        m.request(request(pid));
        let warn = m.tick(1_000, &gpu_of);
        assert_eq!(warn[0].decision, AuditDecision::Warn);
        let term = m.tick(2_000, &gpu_of);
        assert_eq!(term.len(), 1);
        assert_eq!(term[0].decision, AuditDecision::Error, "{term:?}");
        assert!(term[0].reason.contains("no signal sent"), "{term:?}");
        assert_eq!(m.active(), 0);
        std::thread::sleep(Duration::from_millis(100));
        assert!(child.try_wait().unwrap().is_none(), "not signalled");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// A dry run switched to live mid-ladder starts again from the warning: its `would_term`
    /// is not followed by a real SIGKILL with no SIGTERM before it.
    #[test]
    fn a_switch_from_dry_run_to_live_restarts_the_ladder() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = spawn("sleep 30");
        let pid = child.id();
        let gpu_of = HashMap::from([(pid, 0)]);
        let mut s = section(true);
        s.grace = DurationSetting::from_ms(0);
        s.term_timeout = DurationSetting::from_ms(60_000);
        let mut m = manager(s.clone(), dir.path());
        m.request(request(pid));
        // Wall and monotonic time move together here.
        let steps = |m: &mut KillManager, t: i64| -> Vec<AuditDecision> {
            m.tick_at(t, t, &gpu_of)
                .iter()
                .map(|r| r.decision)
                .collect()
        };
        assert_eq!(steps(&mut m, 1_000), [AuditDecision::WouldWarn]);
        assert_eq!(steps(&mut m, 2_000), [AuditDecision::WouldTerm]);
        s.dry_run = false;
        m.set_section(s, 2);
        // Past the term timeout: without the restart this step would be a real SIGKILL.
        assert_eq!(steps(&mut m, 70_000), [AuditDecision::Warn]);
        assert!(child.try_wait().unwrap().is_none(), "no signal yet");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Issue 25 §11: the wall clock jumps an hour forward right after the warning; SIGTERM
    /// still waits the grace (before, the ladder read the grace off the wall-clock times the
    /// caller passed, and the jump cut it to nothing).
    #[test]
    fn a_wall_clock_jump_does_not_cut_the_grace() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = spawn("sleep 30");
        let pid = child.id();
        let gpu_of = HashMap::from([(pid, 0)]);
        let mut s = section(false);
        s.grace = DurationSetting::from_ms(60_000);
        let mut m = manager(s, dir.path());
        m.request(request(pid));
        let now = crate::sys::now_ms();
        let r = m.tick(now, &gpu_of);
        assert_eq!(r[0].decision, AuditDecision::Warn);
        // An hour later on the wall clock, a moment later on the monotonic one.
        let r = m.tick(now + 3_600_000, &gpu_of);
        assert!(r.is_empty(), "no SIGTERM within the grace: {r:?}");
        std::thread::sleep(Duration::from_millis(50));
        assert!(child.try_wait().unwrap().is_none(), "not signalled");
        assert_eq!(m.active(), 1);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// The schedule follows the monotonic clock whatever the wall clock does (forward or back);
    /// the audit records keep the wall-clock times.
    #[test]
    fn the_schedule_follows_the_monotonic_clock_and_records_the_wall_clock() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = spawn("sleep 30");
        let pid = child.id();
        let gpu_of = HashMap::from([(pid, 0)]);
        let mut s = section(true);
        s.grace = DurationSetting::from_ms(60_000);
        s.term_timeout = DurationSetting::from_ms(30_000);
        let mut m = manager(s, dir.path());
        m.request(request(pid));
        let wall = 1_800_000_000_000;
        let step = |m: &mut KillManager, wall: i64, mono: i64| -> Vec<(AuditDecision, i64)> {
            m.tick_at(wall, mono, &gpu_of)
                .iter()
                .map(|r| (r.decision, r.time_ms))
                .collect()
        };
        assert_eq!(step(&mut m, wall, 0), [(AuditDecision::WouldWarn, wall)]);
        // Forward an hour: nothing is due yet.
        assert!(step(&mut m, wall + 3_600_000, 1_000).is_empty());
        // The grace has passed on the monotonic clock, while the wall clock went back a day.
        let back = wall - 86_400_000;
        assert_eq!(
            step(&mut m, back, 60_000),
            [(AuditDecision::WouldTerm, back)]
        );
        assert!(step(&mut m, back + 20_000, 89_999).is_empty());
        assert_eq!(
            step(&mut m, back + 1, 90_000),
            [(AuditDecision::WouldKill, back + 1)]
        );
        assert_eq!(m.active(), 0);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn dry_run_kills_nothing_and_says_what_it_would_do() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = spawn("sleep 30");
        let pid = child.id();
        let gpu_of = HashMap::from([(pid, 0)]);
        let mut m = manager(section(true), dir.path());
        m.request(request(pid));
        let seen = drive(&mut m, &gpu_of, &mut child);
        let decisions: Vec<_> = seen.iter().map(|s| s.0).collect();
        assert_eq!(
            decisions,
            vec![
                AuditDecision::WouldWarn,
                AuditDecision::WouldTerm,
                AuditDecision::WouldKill
            ]
        );
        assert!(child.try_wait().unwrap().is_none(), "dry run must not kill");
        let log = AuditLog::read_all(&dir.path().join("audit.jsonl")).unwrap();
        assert_eq!(log.len(), 3);
        assert!(log.iter().all(|r| r.dry_run && r.host_pid == pid));
        assert_eq!(
            log[1].target.as_deref(),
            Some(format!("group {pid}").as_str())
        );
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn ladder_terms_then_kills_a_child_that_ignores_sigterm() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = spawn_after("trap '' TERM;", "while :; do sleep 0.05; done");
        let pid = child.id();
        let gpu_of = HashMap::from([(pid, 1)]);
        let mut m = manager(section(false), dir.path());
        m.request(request(pid));
        let seen = drive(&mut m, &gpu_of, &mut child);
        let decisions: Vec<_> = seen.iter().map(|s| s.0).collect();
        assert_eq!(
            decisions,
            vec![
                AuditDecision::Warn,
                AuditDecision::Term,
                AuditDecision::Kill,
                AuditDecision::Exited
            ],
            "{seen:?}"
        );
        // On schedule: TERM after the 300 ms grace, KILL 300 ms after TERM.
        assert!(seen[1].1 >= 300 && seen[1].1 < 1500, "{seen:?}");
        assert!(seen[2].1 - seen[1].1 >= 300, "{seen:?}");
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert!(m.signalled(pid).is_some());
        let log = AuditLog::read_all(&dir.path().join("audit.jsonl")).unwrap();
        assert_eq!(log.len(), 4);
        assert_eq!(log[3].reason, "exited after SIGKILL");
    }

    #[test]
    fn a_child_that_honours_sigterm_is_not_sigkilled() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = spawn("sleep 30");
        let pid = child.id();
        let gpu_of = HashMap::from([(pid, 0)]);
        let mut m = manager(section(false), dir.path());
        m.request(request(pid));
        let seen = drive(&mut m, &gpu_of, &mut child);
        let decisions: Vec<_> = seen.iter().map(|s| s.0).collect();
        assert_eq!(
            decisions,
            vec![
                AuditDecision::Warn,
                AuditDecision::Term,
                AuditDecision::Exited
            ]
        );
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGTERM));
    }

    #[test]
    fn protected_user_and_non_gpu_processes_are_never_touched() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = spawn("sleep 30");
        let pid = child.id();
        // Not on a GPU.
        let mut m = manager(section(false), dir.path());
        m.request(request(pid));
        let seen = drive(&mut m, &HashMap::new(), &mut child);
        assert_eq!(
            seen.iter().map(|s| s.0).collect::<Vec<_>>(),
            vec![AuditDecision::Refused]
        );
        // A protected user, on a GPU.
        let mut s = section(false);
        s.protect_users = vec![my_user()];
        let mut m = manager(s, dir.path());
        m.request(request(pid));
        let seen = drive(&mut m, &HashMap::from([(pid, 0)]), &mut child);
        assert_eq!(
            seen.iter().map(|s| s.0).collect::<Vec<_>>(),
            vec![AuditDecision::Refused]
        );
        assert!(child.try_wait().unwrap().is_none(), "must still be running");
        let log = AuditLog::read_all(&dir.path().join("audit.jsonl")).unwrap();
        assert_eq!(log[0].reason, "the process is not on a GPU");
        assert!(log[1].reason.contains("protect_users"), "{}", log[1].reason);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn unmappable_pids_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = spawn("sleep 30");
        let pid = child.id();
        let audit = AuditLog::open(&dir.path().join("audit.jsonl")).unwrap();
        let mapper = PidMapper::Unavailable("gpuwatch runs inside a PID namespace".into());
        let mut m = KillManager::new(KillPolicy::new(section(false)), audit, mapper);
        m.request(request(pid));
        let r = m.tick(crate::sys::now_ms(), &HashMap::from([(pid, 0)]));
        assert_eq!(r[0].decision, AuditDecision::Refused);
        assert_eq!(
            r[0].reason,
            "cannot map the host PID: gpuwatch runs inside a PID namespace"
        );
        assert!(child.try_wait().unwrap().is_none());
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn leaving_the_gpu_or_resolving_cancels() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = spawn("sleep 30");
        let pid = child.id();
        let mut m = manager(section(false), dir.path());
        m.request(request(pid));
        let now = crate::sys::now_ms();
        let r = m.tick_at(now, 0, &HashMap::from([(pid, 0)]));
        assert_eq!(r[0].decision, AuditDecision::Warn);
        // The process left the GPU before SIGTERM was due.
        let r = m.tick_at(now + 1000, 1000, &HashMap::new());
        assert_eq!(r[0].decision, AuditDecision::Cancelled);
        assert_eq!(m.active(), 0);
        // The alert resolved during the grace period.
        m.request(request(pid));
        m.tick(now, &HashMap::from([(pid, 0)]));
        let r = m.cancel("fp1", now + 100, "alert resolved");
        assert_eq!(r[0].decision, AuditDecision::Cancelled);
        assert!(child.try_wait().unwrap().is_none());
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
