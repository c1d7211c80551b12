//! Tests of the stock job and process rules through the real engine (rules/job_*.rhai,
//! gpu_memory_quota, zombie_gpu_memory, job_deadline), in virtual time.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::engine::{Engine, EngineOptions};
use crate::model::job::{CrashClass, JobExit, JobSample, ProgressState, ProgressUpdate};
use crate::model::{
    AlertEvent, AlertStatus, DeviceId, DeviceState, GpuSample, Metric, MetricValues, ProcKind,
    ProcSample, Snapshot,
};
use crate::rules::{RuleSet, RulesConfig};

const T0: i64 = 1_764_687_600_000;

fn engine(params: &[(&str, &str, toml::Value)]) -> Engine {
    let mut config = RulesConfig::default();
    for (rule, key, value) in params {
        config
            .params
            .entry((*rule).to_string())
            .or_default()
            .insert((*key).to_string(), value.clone());
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("rules");
    let rules = RuleSet::load(&[dir], &config).unwrap_or_else(|e| panic!("{e:?}"));
    Engine::new(
        rules,
        EngineOptions {
            hostname: "node1".into(),
            eval_interval_ms: 0,
            sample_interval_ms: Some(1000),
            clock_speed: 1.0,
        },
    )
}

fn gpu(index: u32, t: i64, util: f64, power: f64) -> GpuSample {
    let mut values = MetricValues::default();
    values.set(Metric::Util, Some(util));
    values.set(Metric::Power, Some(power));
    values.set(Metric::PowerLimit, Some(700.0));
    values.set(Metric::MemUsed, Some(60e9));
    values.set(Metric::MemTotal, Some(80e9));
    values.set(Metric::Temp, Some(60.0));
    GpuSample {
        time_ms: t,
        id: DeviceId {
            index,
            uuid: format!("GPU-{index}"),
            ..DeviceId::default()
        },
        state: DeviceState::Ok,
        values,
    }
}

fn proc_(pid: u32, gpu: u32, gib: u64, runtime_s: f64) -> ProcSample {
    ProcSample {
        pid,
        gpu_index: gpu,
        gpu_uuid: format!("GPU-{gpu}"),
        used_mem_bytes: Some(gib << 30),
        kind: ProcKind::Compute,
        uid: Some(1001),
        user: Some("alice".into()),
        command: Some("python train.py".into()),
        container: None,
        runtime_s: Some(runtime_s),
        start_ticks: None,
    }
}

fn snapshot(t: i64, util: f64, power: f64, procs: Option<Vec<ProcSample>>) -> Snapshot {
    Snapshot {
        time_ms: t,
        gpus: vec![gpu(0, t, util, power), gpu(1, t, util, power)],
        processes: procs,
        xids: vec![],
        ..Snapshot::default()
    }
}

fn job(t: i64, progress: &ProgressState) -> JobSample {
    JobSample {
        time_ms: t,
        pid: 4242,
        start_ticks: None,
        command: "python train.py".into(),
        started_at_ms: T0,
        progress: progress.clone(),
        alive: true,
        exit: None,
        crash_class: None,
        pids: vec![4242],
        deadline_ms: None,
        utc_offset_s: 0,
        tail: Vec::new(),
    }
}

fn step(progress: &mut ProgressState, n: i64, t: i64) {
    let u = ProgressUpdate {
        step: Some(n),
        ..ProgressUpdate::default()
    };
    progress.apply(&u, &format!("step {n}"), t);
}

fn names(events: &[AlertEvent]) -> Vec<(String, AlertStatus)> {
    events.iter().map(|e| (e.name.clone(), e.status)).collect()
}

/// Runs `secs` seconds: a snapshot and a job sample every second; progress moves every second
/// until `stall_at` (seconds after T0). Returns (second, event) pairs.
fn drive(
    e: &mut Engine,
    secs: i64,
    stall_at: i64,
    hang_at: i64,
    procs: &[ProcSample],
) -> Vec<(i64, AlertEvent)> {
    let mut progress = ProgressState::default();
    let mut out = Vec::new();
    for s in 0..secs {
        let t = T0 + s * 1000;
        let (util, power) = if s >= hang_at {
            (100.0, 90.0)
        } else {
            (95.0, 600.0)
        };
        let procs = (s % 5 == 0).then(|| procs.to_vec());
        for ev in e.observe(&snapshot(t, util, power, procs)) {
            out.push((s, ev));
        }
        if s < stall_at {
            step(&mut progress, s, t);
        }
        for ev in e.evaluate_job(&job(t, &progress), t) {
            out.push((s, ev));
        }
    }
    out
}

#[test]
fn job_stalled_fires_when_progress_stops_and_resolves_at_the_end() {
    let mut e = engine(&[("job_stalled", "after", "1m".into())]);
    let events = drive(&mut e, 200, 60, i64::MAX, &[]);
    let stalled: Vec<_> = events
        .iter()
        .filter(|(_, ev)| ev.name == "job_stalled")
        .collect();
    assert_eq!(
        stalled.len(),
        1,
        "{:?}",
        names(&events.iter().map(|e| e.1.clone()).collect::<Vec<_>>())
    );
    let (at, ev) = stalled[0];
    // Last progress at s = 59; fires one minute later.
    assert_eq!(*at, 119);
    assert_eq!(ev.status, AlertStatus::Firing);
    assert_eq!(ev.labels["pid"], "4242");
    assert!(ev.annotations["summary"].contains("made no progress for 60 s"));
    assert_eq!(ev.annotations["progress"], "step 59");
    assert!(!events
        .iter()
        .any(|(_, ev)| ev.name == "job_hung_collective"));
    // The job ends: the stall resolves and job_finished fires.
    let mut last = job(T0 + 200_000, &ProgressState::default());
    last.alive = false;
    last.exit = Some(JobExit::Exited { code: 0 });
    last.crash_class = Some(CrashClass::CleanExit);
    let end = e.evaluate_job(&last, T0 + 200_000);
    let mut got = names(&end);
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        got,
        vec![
            ("job_finished".to_string(), AlertStatus::Firing),
            ("job_stalled".to_string(), AlertStatus::Resolved)
        ]
    );
    // ... and says that the job's end is why, not a resumed progress (issue 30 §1).
    let stall = end.iter().find(|e| e.name == "job_stalled").unwrap();
    assert_eq!(
        stall.ended,
        Some(crate::model::EndReason::JobEnded {
            exit: Some("exit code 0".into())
        })
    );
    assert_eq!(stall.state_word(), "ENDED");
    assert!(
        stall
            .told_summary()
            .starts_with("the job ended (exit code 0); it said: job 4242 made no progress"),
        "{}",
        stall.told_summary()
    );
}

/// A job instance is about one process: a job sample whose PID now names another process
/// (another start time) ends the old process's alert first.
#[test]
fn a_job_alert_ends_when_its_pid_names_another_process() {
    let mut e = engine(&[("job_stalled", "after", "1m".into())]);
    let mut progress = ProgressState::default();
    let sample = |t: i64, progress: &ProgressState, start: u64| JobSample {
        start_ticks: Some(start),
        ..job(t, progress)
    };
    let mut fired = Vec::new();
    for s in 0..130 {
        let t = T0 + s * 1000;
        if s < 60 {
            step(&mut progress, s, t);
        }
        fired.extend(e.evaluate_job(&sample(t, &progress, 1000), t));
    }
    assert_eq!(
        names(&fired),
        vec![("job_stalled".to_string(), AlertStatus::Firing)]
    );
    // The same sample but for another process at the PID: the old alert resolves, and the
    // new process's is its own (it fires at once here: `job_stalled` has no `hold`).
    let t = T0 + 130_000;
    let events = e.evaluate_job(&sample(t, &progress, 2000), t);
    assert_eq!(
        names(&events),
        vec![
            ("job_stalled".to_string(), AlertStatus::Resolved),
            ("job_stalled".to_string(), AlertStatus::Firing)
        ]
    );
    assert_eq!(events[0].target_pid, Some(4242));
    assert_eq!(events[0].ended, Some(crate::model::EndReason::ProcessGone));
    assert_eq!(events[1].starts_at_ms, t);
}

#[test]
fn job_without_progress_lines_never_stalls() {
    let mut e = engine(&[("job_stalled", "after", "1m".into())]);
    let events = drive(&mut e, 200, 0, i64::MAX, &[]);
    assert!(events.iter().all(|(_, ev)| ev.name != "job_stalled"));
}

#[test]
fn hung_collective_needs_the_gpu_signature_and_no_progress() {
    // Progress stops at 60 s; the GPUs hang (100 %, 90 W) from 50 s.
    let mut e = engine(&[("job_hung_collective", "after", "1m".into())]);
    let events = drive(&mut e, 200, 60, 50, &[proc_(4242, 1, 60, 100.0)]);
    let hung: Vec<_> = events
        .iter()
        .filter(|(_, ev)| ev.name == "job_hung_collective")
        .collect();
    assert_eq!(hung.len(), 1);
    assert_eq!(hung[0].0, 119);
    let summary = &hung[0].1.annotations["summary"];
    // Only GPU 1 runs the job's process.
    assert!(summary.contains("GPU(s) 1 sit at ~100%"), "{summary}");
    assert_eq!(hung[0].1.severity, crate::model::Severity::Critical);

    // Same stall with healthy power: no hang alert.
    let mut e = engine(&[("job_hung_collective", "after", "1m".into())]);
    let events = drive(&mut e, 200, 60, i64::MAX, &[]);
    assert!(events
        .iter()
        .all(|(_, ev)| ev.name != "job_hung_collective"));
}

#[test]
fn crash_notice_carries_the_class() {
    let mut e = engine(&[]);
    let mut last = job(T0 + 5_000, &ProgressState::default());
    last.alive = false;
    last.exit = Some(JobExit::Signaled {
        signal: 9,
        core_dumped: false,
    });
    last.crash_class = Some(CrashClass::KernelOomKill);
    let events = e.evaluate_job(&last, T0 + 5_000);
    assert_eq!(
        names(&events),
        vec![("job_crashed".to_string(), AlertStatus::Firing)]
    );
    assert!(events[0].annotations["summary"].contains("kernel_oom_kill (signal 9)"));
}

#[test]
fn process_rules_fire_per_process_with_the_kill_action() {
    let mut e = engine(&[
        ("gpu_memory_quota", "enabled", true.into()),
        ("gpu_memory_quota", "quota_gib", 40.into()),
    ]);
    let big = proc_(5000, 0, 70, 10.0);
    let small = proc_(5001, 1, 10, 10.0);
    let events = e.observe(&snapshot(T0, 95.0, 600.0, Some(vec![big.clone(), small])));
    let quota: Vec<_> = events
        .iter()
        .filter(|ev| ev.name == "gpu_memory_quota")
        .collect();
    assert_eq!(quota.len(), 1);
    let ev = quota[0];
    assert_eq!(ev.labels["pid"], "5000");
    assert_eq!(ev.labels["user"], "alice");
    assert_eq!(ev.gpu, Some(0));
    assert_eq!(ev.actions, vec![crate::model::Action::Kill]);
    assert_eq!(ev.target_pid, Some(5000));
    assert!(!ev.annotations.contains_key("action"));
    assert!(ev.annotations["summary"].contains("uses 70.0 GiB on GPU 0"));
    // The process leaves the GPU: the alert resolves.
    let events = e.observe(&snapshot(T0 + 1000, 95.0, 600.0, Some(vec![])));
    let resolved: Vec<_> = events
        .iter()
        .filter(|ev| ev.name == "gpu_memory_quota")
        .map(|ev| ev.status)
        .collect();
    assert_eq!(resolved, vec![AlertStatus::Resolved]);
}

#[test]
fn kill_rules_are_off_by_default() {
    let mut e = engine(&[]);
    let mut old = proc_(5000, 0, 70, 200_000.0);
    old.used_mem_bytes = Some(70 << 30);
    let mut all = Vec::new();
    for s in 0..10 {
        all.extend(e.observe(&snapshot(T0 + s * 1000, 0.0, 60.0, Some(vec![old.clone()]))));
    }
    let by_name: BTreeMap<_, _> = all.iter().map(|e| (e.name.clone(), e.status)).collect();
    for rule in ["gpu_memory_quota", "zombie_gpu_memory", "job_deadline"] {
        assert!(!by_name.contains_key(rule), "{rule} fired: {by_name:?}");
    }
    // Enabled, the deadline fires.
    let mut e = engine(&[
        ("job_deadline", "enabled", true.into()),
        ("job_deadline", "max_hours", 48.into()),
    ]);
    let events = e.observe(&snapshot(T0, 0.0, 60.0, Some(vec![old])));
    assert!(events
        .iter()
        .any(|ev| ev.name == "job_deadline" && ev.annotations["summary"].contains("55.6 h")));
}

#[test]
fn rule_scope_and_action_are_validated() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.rhai");
    std::fs::write(
        &bad,
        "rule(#{ name: \"x\", scope: \"gpu\", action: \"kill\", check: |gpu| false });\n",
    )
    .unwrap();
    let err = RuleSet::load(std::slice::from_ref(&bad), &RulesConfig::default()).unwrap_err();
    assert!(
        err[0].to_string().contains("process or job rules only"),
        "{}",
        err[0]
    );
    std::fs::write(
        &bad,
        "rule(#{ name: \"x\", scope: \"pod\", check: |gpu| false });\n",
    )
    .unwrap();
    let err = RuleSet::load(&[bad], &RulesConfig::default()).unwrap_err();
    assert!(
        err[0].to_string().contains("\"job\" or \"process\""),
        "{}",
        err[0]
    );
}

/// `job_eta`: a job counting to 1000 steps at 10 steps/s is on time for a deadline 200 s away;
/// when it slows to 1 step/s its projected end passes the deadline and the alert fires (after
/// its 1 min hold) with the projected clock time; without a deadline it never fires.
#[test]
fn job_eta_fires_when_the_pace_misses_the_deadline() {
    for deadline in [Some(T0 + 200_000), None] {
        let mut e = engine(&[("job_eta", "slack", "0s".into())]);
        let mut progress = ProgressState::default();
        let mut fired = Vec::new();
        let mut n = 0;
        for s in 0..240 {
            let t = T0 + s * 1000;
            e.observe(&snapshot(t, 95.0, 600.0, None));
            n += if s < 30 { 10 } else { 1 };
            let u = ProgressUpdate {
                step: Some(n),
                total_steps: Some(1000),
                ..ProgressUpdate::default()
            };
            progress.apply(&u, "step", t);
            let mut sample = job(t, &progress);
            sample.deadline_ms = deadline;
            for ev in e.evaluate_job(&sample, t) {
                if ev.name == "job_eta" {
                    fired.push((s, ev));
                }
            }
        }
        if deadline.is_none() {
            assert!(fired.is_empty(), "no deadline, no alert");
            continue;
        }
        let (at, ev) = fired.first().expect("job_eta fired");
        // On time at first (300 steps in 30 s); the slowdown drags the 5-minute pace down.
        assert!((60..200).contains(at), "fired at {at}");
        let summary = &ev.annotations["summary"];
        assert!(
            summary.starts_with("at the current pace step 1000/1000 ends at ")
                && summary.contains(", after your 15:03 deadline"),
            "{summary}"
        );
    }
}
