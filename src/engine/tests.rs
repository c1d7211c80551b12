//! Unit tests of the engine: evaluation interval and per-rule cadence (`every`), rule errors,
//! restart, reload, staleness.

use super::*;
use crate::alert::{load_state, save_state, CounterPoint};
use crate::model::{AlertStatus, DeviceId, DeviceState, GpuSample, Metric, MetricValues, XidEvent};
use crate::rules::RulesConfig;
use std::path::Path;

fn rules(dir: &Path, files: &[(&str, &str)]) -> RuleSet {
    let mut paths = Vec::new();
    for (name, text) in files {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        paths.push(p);
    }
    RuleSet::load(&paths, &RulesConfig::default()).unwrap()
}

fn snap(t_s: i64, temps: &[f64]) -> Snapshot {
    Snapshot {
        time_ms: t_s * 1000,
        gpus: temps
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let mut values = MetricValues::default();
                values.set(Metric::Temp, Some(*t));
                GpuSample {
                    time_ms: t_s * 1000,
                    id: DeviceId {
                        index: i as u32,
                        uuid: format!("GPU-{i}"),
                        ..DeviceId::default()
                    },
                    state: DeviceState::Ok,
                    values,
                }
            })
            .collect(),
        processes: None,
        xids: Vec::new(),
        ..Snapshot::default()
    }
}

const HOT: &str = r#"rule(#{ name: "hot", hold: "10s", check: |gpu| {
    let t = gpu.temp.last();
    if t > 80 { `hot ${t}` }
} });"#;
const SPIN: &str = r#"rule(#{ name: "spin", check: |gpu| { let i = 0; loop { i += 1; } } });"#;

fn run(e: &mut Engine, from: i64, to: i64, temp: f64) -> Vec<(i64, String, AlertStatus)> {
    let mut out = Vec::new();
    for t in from..to {
        for ev in e.observe(&snap(t, &[temp, 50.0])) {
            out.push((ev.at_ms / 1000, ev.name.clone(), ev.status));
        }
    }
    out
}

#[test]
fn infinite_loop_rule_is_reported_while_others_fire() {
    let dir = tempfile::tempdir().unwrap();
    let set = rules(dir.path(), &[("a_spin.rhai", SPIN), ("hot.rhai", HOT)]);
    let mut e = Engine::new(set, EngineOptions::default());
    let evs = run(&mut e, 0, 12, 90.0);
    assert_eq!(
        evs,
        vec![
            (0, "rule_error".to_string(), AlertStatus::Firing),
            (10, "hot".to_string(), AlertStatus::Firing)
        ]
    );
    let err = e.alerts().find(|a| a.key == "rule_error/spin").unwrap();
    assert!(
        err.annotations["summary"].contains("a_spin.rhai:1"),
        "{:?}",
        err.annotations
    );
    assert_eq!(err.labels["rule"], "spin");
}

#[test]
fn eval_interval_aligns_evaluations() {
    let dir = tempfile::tempdir().unwrap();
    let set = rules(dir.path(), &[("hot.rhai", HOT)]);
    let opts = EngineOptions {
        eval_interval_ms: 5000,
        ..EngineOptions::default()
    };
    let mut e = Engine::new(set, opts);
    // hot from t=3: evaluations at 0,5,10,15 → pending at 5, firing at 15
    let mut evs = run(&mut e, 0, 3, 50.0);
    evs.extend(run(&mut e, 3, 20, 90.0));
    assert_eq!(evs, vec![(15, "hot".to_string(), AlertStatus::Firing)]);
}

/// Hot (> 80) with `every: "30s"`, no hold: fires at once when evaluated, resolves at the first
/// evaluation that sees it cool.
const HOT_EVERY_30S: &str = r#"rule(#{ name: "hot30", every: "30s", check: |gpu| {
    let t = gpu.temp.last();
    if t > 80 { `hot ${t}` }
} });"#;

/// Always fires with the latest temperature in its summary; the tests set temp = time, so the
/// summary and `last_active_ms` tell when it was last evaluated.
const ECHO_EVERY_30S: &str = r#"rule(#{ name: "echo30", every: "30s", check: |gpu| {
    `t=${gpu.temp.last()}`
} });"#;

#[test]
fn every_evaluates_only_at_aligned_instants() {
    let dir = tempfile::tempdir().unwrap();
    let set = rules(dir.path(), &[("echo.rhai", ECHO_EVERY_30S)]);
    assert_eq!(set.rules()[0].every_ms, Some(30_000));
    // The global interval (every snapshot) does not apply to a rule with `every`.
    let mut e = Engine::new(set, EngineOptions::default());
    // Start off-grid at t=7 s: evaluated at the first snapshot (7), then at 30, 60, 90 — the
    // aligned instants floor(t / 30 s) — and nowhere else. The summary records the temp = time.
    let mut evaluated = Vec::new();
    for t in 7..100 {
        #[expect(clippy::cast_precision_loss, reason = "small")]
        let temp = t as f64;
        e.observe(&snap(t, &[temp]));
        let a = e.alerts().find(|a| a.key == "echo30").unwrap();
        let at = a.last_active_ms / 1000;
        if evaluated.last() != Some(&at) {
            evaluated.push(at);
            assert_eq!(a.annotations["summary"], format!("t={t}.0"));
        }
    }
    assert_eq!(evaluated, vec![7, 30, 60, 90]);
}

#[test]
fn firing_alert_is_not_resolved_between_evaluations() {
    let dir = tempfile::tempdir().unwrap();
    let set = rules(
        dir.path(),
        &[("hot.rhai", HOT_EVERY_30S), ("hot10.rhai", HOT)],
    );
    let mut e = Engine::new(set, EngineOptions::default());
    // hot from 0 to 35, cool afterwards: hot30 fires at 0 (first evaluation) and stays firing
    // through the cool samples at 35..59 (not evaluated), resolving at 60; the every-sample rule
    // `hot` (hold 10 s) fires at 10 and resolves at 35.
    let mut evs = run(&mut e, 0, 35, 90.0);
    evs.extend(run(&mut e, 35, 59, 50.0));
    assert!(e.alerts().any(|a| a.key == "hot30"), "still firing at 58 s");
    evs.extend(run(&mut e, 59, 65, 50.0));
    assert_eq!(
        evs,
        vec![
            (0, "hot30".to_string(), AlertStatus::Firing),
            (10, "hot".to_string(), AlertStatus::Firing),
            (35, "hot".to_string(), AlertStatus::Resolved),
            (60, "hot30".to_string(), AlertStatus::Resolved),
        ]
    );
}

#[test]
fn every_overrides_the_global_interval_and_survives_reload() {
    let dir = tempfile::tempdir().unwrap();
    let set = rules(dir.path(), &[("hot.rhai", HOT_EVERY_30S)]);
    let opts = EngineOptions {
        eval_interval_ms: 5000,
        ..EngineOptions::default()
    };
    let mut e = Engine::new(set, opts);
    assert_eq!(e.cadence_ms(0), 30_000);
    // Hot from 31: the next aligned instant is 60 (not 35, the global 5 s slot).
    let mut evs = run(&mut e, 0, 31, 50.0);
    evs.extend(run(&mut e, 31, 45, 90.0));
    // A reload keeps the rule's last evaluation time: no extra evaluation at 45.
    let path = dir.path().join("hot.rhai");
    assert!(e.reload_with(&[path]).unwrap().is_empty());
    evs.extend(run(&mut e, 45, 61, 90.0));
    assert_eq!(evs, vec![(60, "hot30".to_string(), AlertStatus::Firing)]);
}

#[test]
fn check_rejects_a_bad_every() {
    let dir = tempfile::tempdir().unwrap();
    for (text, msg) in [
        (
            r#"rule(#{ name: "a", every: "soon", check: |gpu| () });"#,
            "`every`",
        ),
        (
            r#"rule(#{ name: "a", every: -5, check: |gpu| () });"#,
            "`every`",
        ),
        (
            r#"rule(#{ name: "a", every: "2d", check: |gpu| () });"#,
            "24 h",
        ),
        (
            r#"rule(#{ name: "a", scope: "job", every: "30s", check: |job| () });"#,
            "job rules",
        ),
    ] {
        let p = dir.path().join("bad.rhai");
        std::fs::write(&p, text).unwrap();
        let errs = RuleSet::load(&[p], &RulesConfig::default()).unwrap_err();
        let e = errs[0].to_string();
        assert!(e.contains("bad.rhai:1:") && e.contains(msg), "{e}");
    }
}

#[test]
fn restart_mid_firing_does_not_reannounce() {
    let dir = tempfile::tempdir().unwrap();
    let state_dir = dir.path().join("state");
    let set = rules(dir.path(), &[("hot.rhai", HOT)]);
    let mut e = Engine::new(set.clone(), EngineOptions::default());
    assert_eq!(run(&mut e, 0, 20, 90.0).len(), 1);
    save_state(&state_dir, &e.state()).unwrap();
    drop(e);
    let state = load_state(&state_dir).unwrap().unwrap();
    let mut e = Engine::with_state(set, EngineOptions::default(), &state);
    assert!(run(&mut e, 25, 40, 90.0).is_empty());
    assert_eq!(
        run(&mut e, 40, 42, 50.0),
        vec![(40, "hot".to_string(), AlertStatus::Resolved)]
    );
}

/// The downtime does not count toward a pending alert's `hold`: a `hold: 10s` alert pending for
/// 5 s before a 60 s restart fires 5 s after the restart, not at once.
#[test]
fn downtime_does_not_count_toward_hold() {
    let dir = tempfile::tempdir().unwrap();
    let state_dir = dir.path().join("state");
    let set = rules(dir.path(), &[("hot.rhai", HOT)]);
    let mut e = Engine::new(set.clone(), EngineOptions::default());
    assert!(run(&mut e, 0, 6, 90.0).is_empty(), "pending");
    save_state(&state_dir, &e.state()).unwrap();
    drop(e);
    let state = load_state(&state_dir).unwrap().unwrap();
    let mut e = Engine::with_state(set, EngineOptions::default(), &state);
    assert_eq!(
        run(&mut e, 65, 75, 90.0),
        vec![(70, "hot".to_string(), AlertStatus::Firing)]
    );
}

/// A resumed firing alert is not resolved by "no data" while its windows fill again after the
/// restart (they answer once half sampled).
#[test]
fn a_resumed_alert_waits_for_its_windows() {
    const SLOW: &str = r#"rule(#{ name: "warm", check: |gpu| {
    let t = gpu.temp.mean("30m");
    if t == () { return (); }
    if t > 80 { `warm ${t}` }
} });"#;
    let dir = tempfile::tempdir().unwrap();
    let state_dir = dir.path().join("state");
    let set = rules(dir.path(), &[("warm.rhai", SLOW)]);
    let mut e = Engine::new(set.clone(), EngineOptions::default());
    let fired = (0..1000)
        .step_by(10)
        .flat_map(|t| e.observe(&snap(t, &[90.0])))
        .count();
    assert_eq!(fired, 1);
    save_state(&state_dir, &e.state()).unwrap();
    drop(e);
    let state = load_state(&state_dir).unwrap().unwrap();
    let mut e = Engine::with_state(set, EngineOptions::default(), &state);
    // 12 minutes of samples after the restart: the 30 min window has no answer yet.
    let events: Vec<AlertEvent> = (1000..1720)
        .step_by(10)
        .flat_map(|t| e.observe(&snap(t, &[90.0])))
        .collect();
    assert!(events.is_empty(), "{events:?}");
}

/// After a reboot the GPUs may be numbered otherwise: an alert restored for index 1 whose board
/// is now elsewhere is resolved at once (not checked against another board), and one whose
/// index no longer exists is resolved once the warm-up is over (it was never stepped again).
#[test]
fn restored_alerts_follow_their_board_not_their_index() {
    let dir = tempfile::tempdir().unwrap();
    let state_dir = dir.path().join("state");
    let set = rules(dir.path(), &[("hot.rhai", HOT)]);
    let mut e = Engine::new(set.clone(), EngineOptions::default());
    let fired: Vec<_> = (0..20)
        .flat_map(|t| e.observe(&snap(t, &[90.0, 90.0, 90.0])))
        .collect();
    assert_eq!(fired.len(), 3);
    save_state(&state_dir, &e.state()).unwrap();
    drop(e);
    let state = load_state(&state_dir).unwrap().unwrap();
    let mut e = Engine::with_state(set, EngineOptions::default(), &state);
    // Board GPU-1 is gone: GPU-2 is now index 1, and there is no index 2.
    let mut s = snap(30, &[90.0, 90.0]);
    s.gpus[1].id.uuid = "GPU-2".into();
    let ev = e.observe(&s);
    let resolved: Vec<_> = ev
        .iter()
        .filter(|e| e.status == AlertStatus::Resolved)
        .map(|e| (e.gpu, e.labels["uuid"].clone()))
        .collect();
    assert_eq!(resolved, [(Some(1), "GPU-1".to_string())], "{ev:?}");
    // Index 2 never comes back: resolved after the warm-up (half the longest window).
    let later: Vec<_> = (31..3000)
        .step_by(10)
        .flat_map(|t| {
            let mut s = snap(t, &[90.0, 90.0]);
            s.gpus[1].id.uuid = "GPU-2".into();
            e.observe(&s)
        })
        .filter(|e| e.status == AlertStatus::Resolved)
        .map(|e| e.gpu)
        .collect();
    assert_eq!(later, [Some(2)]);
}

#[test]
fn reload_keeps_state_and_broken_edit_keeps_old_rules() {
    let dir = tempfile::tempdir().unwrap();
    let set = rules(dir.path(), &[("hot.rhai", HOT)]);
    let mut e = Engine::new(set, EngineOptions::default());
    assert_eq!(run(&mut e, 0, 12, 90.0).len(), 1);
    let path = dir.path().join("hot.rhai");
    std::fs::write(
        &path,
        "rule(#{ name: \"hot\", check: |gpu| { gpu.temp.last( } });",
    )
    .unwrap();
    let errs = e.reload_with(std::slice::from_ref(&path)).unwrap_err();
    assert!(errs[0].to_string().contains("hot.rhai:1:"), "{}", errs[0]);
    assert_eq!(e.rule_count(), 1);
    assert!(
        run(&mut e, 12, 14, 90.0).is_empty(),
        "still firing, not re-announced"
    );
    std::fs::write(&path, HOT).unwrap();
    assert!(e.reload_with(&[path]).unwrap().is_empty());
    assert!(
        run(&mut e, 14, 16, 90.0).is_empty(),
        "state kept across reload"
    );
    let other = rules(
        dir.path(),
        &[("other.rhai", "rule(#{ name: \"o\", check: |g| false });")],
    );
    let evs = e.reload(other);
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0].status, AlertStatus::Resolved);
}

#[test]
fn collector_stale_fires_from_advance() {
    let dir = tempfile::tempdir().unwrap();
    let stale = r#"rule(#{ name: "collector_stale", scope: "host", check: |host| {
        let age = host.sample_age;
        if age > 5 * host.interval { `no samples for ${age} s` }
    } });"#;
    let set = rules(dir.path(), &[("stale.rhai", stale)]);
    let opts = EngineOptions {
        sample_interval_ms: Some(1000),
        ..EngineOptions::default()
    };
    let mut e = Engine::new(set, opts);
    assert!(run(&mut e, 0, 10, 50.0).is_empty());
    let mut evs = Vec::new();
    for t in 10..20 {
        evs.extend(
            e.advance(t * 1000)
                .into_iter()
                .map(|ev| (ev.at_ms / 1000, ev.status)),
        );
    }
    assert_eq!(evs, vec![(15, AlertStatus::Firing)]);
    let evs = run(&mut e, 20, 21, 50.0);
    assert_eq!(
        evs,
        vec![(20, "collector_stale".to_string(), AlertStatus::Resolved)]
    );
}

#[test]
fn xids_processes_and_labels() {
    let dir = tempfile::tempdir().unwrap();
    let r = r#"rule(#{ name: "x", severity: "critical", labels: #{ team: "ml" }, check: |gpu| {
        let x = gpu.xids("1m");
        if x.len() > 0 { `xid ${x} pids ${gpu.processes.len()}` }
    } });"#;
    let set = rules(dir.path(), &[("x.rhai", r)]);
    let mut e = Engine::new(
        set,
        EngineOptions {
            hostname: "box".into(),
            ..EngineOptions::default()
        },
    );
    let mut s = snap(0, &[50.0, 50.0]);
    s.xids.push(XidEvent::new(0, 1, "GPU-1", 79));
    s.processes = Some(vec![crate::model::ProcSample::compute(
        7,
        1,
        "GPU-1",
        Some(1),
    )]);
    let evs = e.observe(&s);
    assert_eq!(evs.len(), 1);
    let ev = &evs[0];
    assert_eq!(ev.gpu, Some(1));
    assert_eq!(ev.annotations["summary"], "xid [79] pids 1");
    assert_eq!(ev.labels["hostname"], "box");
    assert_eq!(ev.labels["uuid"], "GPU-1");
    assert_eq!(ev.labels["team"], "ml");
    assert_eq!(ev.labels["severity"], "critical");
    // XIDs are events: after the window passes the alert resolves.
    let mut resolved = None;
    for t in 1..70 {
        for ev in e.observe(&snap(t, &[50.0, 50.0])) {
            resolved = Some((t, ev.status));
        }
    }
    assert_eq!(resolved, Some((60, AlertStatus::Resolved)));
}

/// The stock rule `name` from `rules/`.
fn stock(name: &str) -> RuleSet {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("rules/{name}.rhai"));
    RuleSet::load(&[path], &RulesConfig::default()).unwrap()
}

fn one_gpu(t_s: i64, ecc_uncorrected: Option<f64>, xid: Option<u64>) -> Snapshot {
    let mut s = snap(t_s, &[50.0]);
    s.gpus[0]
        .values
        .set(Metric::EccUncorrected, ecc_uncorrected);
    if let Some(code) = xid {
        s.xids.push(XidEvent::new(t_s * 1000, 0, "GPU-0", code));
    }
    s
}

fn feed(
    e: &mut Engine,
    times_s: std::ops::Range<i64>,
    snap_at: impl Fn(i64) -> Snapshot,
) -> Vec<(i64, String, AlertStatus, bool)> {
    let mut out = Vec::new();
    for t in times_s {
        for ev in e.observe(&snap_at(t)) {
            out.push((ev.at_ms / 1000, ev.name.clone(), ev.status, ev.repeat));
        }
    }
    out
}

/// A restart: the state goes through JSON as the daemon's state file does.
fn restart(e: Engine, rules: RuleSet, opts: EngineOptions) -> Engine {
    let json = serde_json::to_string(&e.state()).unwrap();
    drop(e);
    let state: AlertStateFile = serde_json::from_str(&json).unwrap();
    Engine::with_state(rules, opts, &state)
}

fn opts_1s() -> EngineOptions {
    EngineOptions {
        sample_interval_ms: Some(1000),
        ..EngineOptions::default()
    }
}

#[test]
fn counter_increase_while_down_fires_at_first_sample_after_restart() {
    let mut e = Engine::new(stock("ecc_uncorrected"), opts_1s());
    assert!(feed(&mut e, 0..300, |t| one_gpu(t, Some(3.0), None)).is_empty());
    let state = e.state();
    assert_eq!(state.version, crate::alert::STATE_VERSION);
    assert_eq!(
        state.gpus[0].counters["ecc_uncorrected"],
        CounterPoint {
            time_ms: 299_000,
            value: 3.0
        }
    );
    // Down for an hour; two uncorrectable errors meanwhile.
    let mut e = restart(e, stock("ecc_uncorrected"), opts_1s());
    let evs = feed(&mut e, 3900..3960, |t| one_gpu(t, Some(5.0), None));
    assert_eq!(
        evs,
        vec![(
            3900,
            "ecc_uncorrected".to_string(),
            AlertStatus::Firing,
            false
        )]
    );
    let inst = e.alerts().next().unwrap();
    assert!(
        inst.annotations["summary"].contains("2 uncorrectable ECC error(s)"),
        "{:?}",
        inst.annotations
    );
    // Firing alert survives a second restart without being announced again.
    let mut e = restart(e, stock("ecc_uncorrected"), opts_1s());
    assert!(feed(&mut e, 3970..4000, |t| one_gpu(t, Some(5.0), None)).is_empty());
}

#[test]
fn counter_reset_or_no_change_while_down_does_not_fire() {
    for after in [0.0, 3.0] {
        let mut e = Engine::new(stock("ecc_uncorrected"), opts_1s());
        assert!(feed(&mut e, 0..300, |t| one_gpu(t, Some(3.0), None)).is_empty());
        let mut e = restart(e, stock("ecc_uncorrected"), opts_1s());
        assert!(
            feed(&mut e, 3900..4200, |t| one_gpu(t, Some(after), None)).is_empty(),
            "counter {after} after restart"
        );
    }
}

#[test]
fn counter_unsupported_at_first_sample_waits_for_its_first_value() {
    let mut e = Engine::new(stock("ecc_uncorrected"), opts_1s());
    assert!(feed(&mut e, 0..300, |t| one_gpu(t, Some(3.0), None)).is_empty());
    let mut e = restart(e, stock("ecc_uncorrected"), opts_1s());
    assert!(feed(&mut e, 3900..3905, |t| one_gpu(t, None, None)).is_empty());
    // A save before the counter came back keeps the saved value.
    assert_eq!(e.state().gpus[0].counters["ecc_uncorrected"].value, 3.0);
    let evs = feed(&mut e, 3905..3910, |t| one_gpu(t, Some(4.0), None));
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert_eq!(evs[0].0, 3905);
}

#[test]
fn xid_alert_keeps_firing_across_restart_and_resolves_when_its_window_expires() {
    let rules = stock("xid_error");
    let mut e = Engine::new(rules.clone(), opts_1s());
    let evs = feed(&mut e, 0..60, |t| one_gpu(t, None, (t == 5).then_some(79)));
    assert_eq!(
        evs,
        vec![(5, "xid_error".to_string(), AlertStatus::Firing, false)]
    );
    let state = e.state();
    assert_eq!(
        state.gpus[0].xids,
        vec![crate::alert::XidPoint::new(5000, 79)]
    );
    // Down from 60 s to 120 s; the 5-minute window of the XID at 5 s ends at 305 s.
    let mut e = restart(e, rules, opts_1s());
    let evs = feed(&mut e, 120..400, |t| one_gpu(t, None, None));
    assert_eq!(
        evs,
        vec![(305, "xid_error".to_string(), AlertStatus::Resolved, false)]
    );
    assert_eq!(
        e.state().gpus[0].xids.len(),
        1,
        "still within the retention"
    );
    let gone_s = 5 + e.rules().retention_ms() / 1000 + 2;
    assert!(feed(&mut e, 400..gone_s, |t| one_gpu(t, None, None)).is_empty());
    assert!(e.state().gpus.is_empty(), "the XID left the retention");
}

/// Issue 11: a reload keeps the instances of process-scope rules (they used to resolve and fire
/// again, a notification pair on every reload or rule edit).
#[test]
fn reload_keeps_process_alerts() {
    let dir = tempfile::tempdir().unwrap();
    const BIG: &str = r#"rule(#{ name: "big", scope: "process", check: |p| p.mem > 1000.0 });"#;
    let set = rules(dir.path(), &[("big.rhai", BIG)]);
    let mut e = Engine::new(set.clone(), EngineOptions::default());
    let with_proc = |t: i64| {
        let mut s = snap(t, &[50.0]);
        s.processes = Some(vec![crate::model::ProcSample::compute(
            42,
            0,
            "GPU-0",
            Some(1 << 30),
        )]);
        s
    };
    let fired = e.observe(&with_proc(0));
    assert_eq!(fired.len(), 1, "{fired:?}");
    assert_eq!(fired[0].target_pid, Some(42));
    assert!(
        e.reload(set).is_empty(),
        "a reload resolved a process alert"
    );
    assert!(e.observe(&with_proc(1)).is_empty(), "and fired it again");
}

/// A log whose clock jumps by years (unset at boot) replays in bounded time: the engine's clock
/// runs through the first hours of the gap step by step, then jumps.
#[test]
fn replay_across_a_clock_jump_of_years_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let set = rules(dir.path(), &[]);
    let mut e = Engine::new(set, EngineOptions::default());
    let year_s = 365 * 86_400;
    let snaps = [
        snap(0, &[50.0]),
        snap(1, &[50.0]),
        snap(30 * year_s, &[50.0]),
    ];
    let start = std::time::Instant::now();
    let stats = super::replay(
        &mut e,
        snaps.into_iter().map(Ok::<_, std::convert::Infallible>),
        |_| {},
    )
    .unwrap();
    assert_eq!(stats.snapshots, 3);
    assert!(stats.advances <= 2 * 3600, "{}", stats.advances);
    assert!(start.elapsed() < std::time::Duration::from_secs(60));
}

/// A GPU left out of one snapshot (late: a gap) keeps its process alerts: they do not resolve
/// and fire again (which restarted a kill ladder each time).
#[test]
fn a_late_gpu_keeps_its_process_alerts() {
    let dir = tempfile::tempdir().unwrap();
    const BIG: &str = r#"rule(#{ name: "big", scope: "process", check: |p| p.mem > 1000.0 });"#;
    let set = rules(dir.path(), &[("big.rhai", BIG)]);
    let mut e = Engine::new(set, EngineOptions::default());
    let procs = || {
        Some(vec![crate::model::ProcSample::compute(
            42,
            1,
            "GPU-1",
            Some(1 << 30),
        )])
    };
    let mut s = snap(0, &[50.0, 50.0]);
    s.processes = procs();
    assert_eq!(e.observe(&s).len(), 1);
    // GPU 1 is late at the next tick: only GPU 0 is in it.
    let mut late = snap(1, &[50.0]);
    late.processes = procs();
    assert!(e.observe(&late).is_empty(), "resolved on a gap");
    let mut back = snap(2, &[50.0, 50.0]);
    back.processes = procs();
    assert!(e.observe(&back).is_empty(), "fired again");
}

/// Process 42 on GPU 0 (1 GiB), started at `start` clock ticks after boot.
fn proc_42(t: i64, start: Option<u64>) -> Snapshot {
    let mut s = snap(t, &[50.0]);
    s.processes = Some(vec![crate::model::ProcSample {
        start_ticks: start,
        ..crate::model::ProcSample::compute(42, 0, "GPU-0", Some(1 << 30))
    }]);
    s
}

const BIG_HOLD: &str =
    r#"rule(#{ name: "big", scope: "process", hold: "10s", check: |p| p.mem > 1000.0 });"#;

/// Issue 25 item 2: a PID reused by another process (another start time) does not inherit the
/// firing alert of the process that had it: that alert resolves at once (the process is gone),
/// and the new process's instance starts pending, with its own `hold`, and only then fires.
#[test]
fn a_reused_pid_does_not_inherit_a_firing_process_alert() {
    let dir = tempfile::tempdir().unwrap();
    let set = rules(dir.path(), &[("big.rhai", BIG_HOLD)]);
    let mut e = Engine::new(set, opts_1s());
    let evs = feed(&mut e, 0..15, |t| proc_42(t, Some(1000)));
    assert_eq!(
        evs,
        vec![(10, "big".to_string(), AlertStatus::Firing, false)]
    );
    let key = "big/gpu0/pid:42";
    assert!(e
        .alerts()
        .any(|a| a.key == key && a.target_start == Some(1000)));
    // PID 42 is now another process.
    let evs = e.observe(&proc_42(15, Some(2000)));
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert_eq!(evs[0].status, AlertStatus::Resolved);
    assert_eq!(evs[0].target_pid, Some(42));
    assert_eq!(evs[0].ends_at_ms, Some(15_000));
    let inst: Vec<_> = e.alerts().filter(|a| a.key == key).collect();
    assert_eq!(inst.len(), 1);
    assert_eq!(
        inst[0].phase,
        crate::alert::Phase::Pending,
        "inherited the firing"
    );
    assert_eq!(inst[0].active_since_ms, 15_000);
    assert_eq!(inst[0].target_start, Some(2000));
    // Its own hold: it fires 10 s after it was first seen, not before.
    let evs = feed(&mut e, 16..30, |t| proc_42(t, Some(2000)));
    assert_eq!(
        evs,
        vec![(25, "big".to_string(), AlertStatus::Firing, false)]
    );
    // A process list without start times (another PID namespace) says nothing either way.
    assert!(feed(&mut e, 30..35, |t| proc_42(t, None)).is_empty());
}

/// The same for a rule without `hold`: the old process's alert resolves before the new one
/// fires, in that order, so the action runner cancels the old kill ladder first.
#[test]
fn a_reused_pid_resolves_before_the_new_process_fires() {
    let dir = tempfile::tempdir().unwrap();
    const BIG: &str = r#"rule(#{ name: "big", scope: "process", check: |p| p.mem > 1000.0 });"#;
    let mut e = Engine::new(rules(dir.path(), &[("big.rhai", BIG)]), opts_1s());
    assert_eq!(e.observe(&proc_42(0, Some(1000))).len(), 1);
    assert!(e.observe(&proc_42(1, Some(1000))).is_empty());
    let evs: Vec<_> = e
        .observe(&proc_42(2, Some(2000)))
        .into_iter()
        .map(|ev| (ev.status, ev.starts_at_ms))
        .collect();
    assert_eq!(
        evs,
        vec![(AlertStatus::Resolved, 0), (AlertStatus::Firing, 2000)]
    );
}

/// A daemon upgraded with a process alert firing: the saved instance has no start time (older
/// state files) and the same key, so it goes on firing without a second notification, takes the
/// process's start, and still notices a later reuse of the PID.
#[test]
fn a_process_alert_saved_without_a_start_time_is_kept_over_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let set = rules(dir.path(), &[("big.rhai", BIG_HOLD)]);
    let mut e = Engine::new(set.clone(), opts_1s());
    assert_eq!(feed(&mut e, 0..15, |t| proc_42(t, None)).len(), 1);
    let json = serde_json::to_string(&e.state()).unwrap();
    assert!(json.contains("\"big/gpu0/pid:42\""), "{json}");
    assert!(!json.contains("target_start"), "{json}");
    let mut e = restart(e, set.clone(), opts_1s());
    assert!(feed(&mut e, 20..40, |t| proc_42(t, Some(1000))).is_empty());
    // Saved with the start this time: it survives another restart as the same process.
    let json = serde_json::to_string(&e.state()).unwrap();
    assert!(json.contains("\"target_start\":1000"), "{json}");
    let mut e = restart(e, set, opts_1s());
    assert!(feed(&mut e, 45..50, |t| proc_42(t, Some(1000))).is_empty());
    let evs = feed(&mut e, 50..51, |t| proc_42(t, Some(3000)));
    assert_eq!(
        evs,
        vec![(50, "big".to_string(), AlertStatus::Resolved, false)]
    );
}

impl Engine {
    /// Loads rules from `paths` and swaps them in, as the daemon's reload does.
    fn reload_with(
        &mut self,
        paths: &[std::path::PathBuf],
    ) -> Result<Vec<AlertEvent>, Vec<RuleError>> {
        Ok(self.reload(RuleSet::load(paths, &RulesConfig::default())?))
    }
}

/// Issue 13: a firing GPU alert carries the chart of the metric its rule read, over the rule's
/// window (at least 10 minutes); a resolution carries none.
#[test]
fn firing_alerts_carry_the_chart_of_their_metric() {
    let dir = tempfile::tempdir().unwrap();
    let warm = r#"rule(#{ name: "warm", check: |gpu| {
        let m = gpu.temp.mean("2m");
        if m > 70 { `mean ${m}` }
    } });"#;
    let mut e = Engine::new(rules(dir.path(), &[("w.rhai", warm)]), opts_1s());
    let mut fired = Vec::new();
    for t in 0..400 {
        let temp = if t < 200 { 60.0 } else { 90.0 };
        fired.extend(e.observe(&snap(t, &[temp, 50.0])));
    }
    let ev = fired
        .iter()
        .find(|ev| ev.status == AlertStatus::Firing)
        .expect("warm fires");
    let chart = ev.chart.as_ref().expect("a chart");
    assert_eq!(chart.metric, "temp");
    assert_eq!(chart.window_ms, 600_000, "at least ten minutes");
    assert!(chart.points.len() >= 2 && chart.points.len() <= crate::model::AlertChart::MAX_POINTS);
    assert_eq!(chart.points.last().map(|p| p.1), Some(90.0));
    assert!(
        chart.points.iter().any(|p| p.1 == 60.0),
        "the history before the rise"
    );
    for t in 400..700 {
        for ev in e.observe(&snap(t, &[50.0, 50.0])) {
            assert!(ev.chart.is_none(), "{ev:?}");
        }
    }
}

#[test]
fn only_the_metrics_a_rule_file_names_are_kept() {
    // Two counters in every sample; the rules name one. The other has no window (no rule can
    // read it): its value is not in the state either.
    let dir = tempfile::tempdir().unwrap();
    let rules = rules(
        dir.path(),
        &[(
            "ecc.rhai",
            r#"rule(#{ name: "ecc", check: |gpu| gpu.ecc_uncorrected.delta("1m") > 0 });"#,
        )],
    );
    let mut e = Engine::new(rules, EngineOptions::default());
    for t in 0..5 {
        let mut s = snap(1_000 + t, &[60.0]);
        s.gpus[0].values.set(Metric::EccUncorrected, Some(2.0));
        s.gpus[0].values.set(Metric::Energy, Some(1e6 + t as f64));
        e.observe(&s);
    }
    let state = e.state();
    let counters = &state.gpus[0].counters;
    assert!(
        counters.contains_key(Metric::EccUncorrected.key()),
        "{counters:?}"
    );
    assert!(!counters.contains_key(Metric::Energy.key()), "{counters:?}");
}
