//! Reusing GPU-scope results changes nothing: two hours of four GPUs that go hot, leak memory,
//! report ECC errors and XIDs, fall off the bus, idle with memory held and hang in a collective
//! are replayed through every stock rule with reuse on and off, and the alert events must be
//! identical — while most evaluations are in fact reused.

use super::*;
use crate::model::{DeviceId, DeviceState, GpuSample, MetricValues, ProcSample, XidEvent};
use crate::rules::RulesConfig;
use std::path::Path;

const STEP_S: i64 = 5;
const END_S: i64 = 2 * 3600;
const GIB: f64 = 1_073_741_824.0;

/// A small deterministic noise source in [-0.5, 0.5).
fn noise(seed: &mut u64) -> f64 {
    *seed = seed
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    ((*seed >> 33) as f64 / f64::from(1u32 << 31)) - 0.5
}

fn gpu(t: i64, i: u32, seed: &mut u64) -> GpuSample {
    let mut v = MetricValues::default();
    let busy = t % 600 >= 40; // a checkpoint stall every 10 min
    let mut util = if busy { 96.0 + 3.0 * noise(seed) } else { 0.0 };
    let mut power = if busy {
        550.0 + 30.0 * noise(seed)
    } else {
        90.0
    };
    let mut temp = (66.0 + 3.0 * noise(seed)).round();
    let mut used = 40.0 * GIB;
    let mut reasons = 0.0;
    let mut ecc = 0.0;
    match i {
        // Hot for 25 minutes, thermally throttled.
        0 if (1800..3300).contains(&t) => {
            temp = (91.0 + 2.0 * noise(seed)).round();
            reasons = 64.0;
        }
        // Uncorrectable ECC errors from t = 2400 s.
        1 if t >= 2400 => ecc = 1.0 + f64::from(u8::from(t >= 4000)),
        // Memory growing until out-of-memory risk.
        2 => used = (20.0 + 59.5 * (t as f64 / 5400.0).min(1.0)) * GIB,
        // Idle with memory held, then a collective hang (busy, no power).
        3 if t < 3000 => {
            util = 0.0;
            power = 70.0;
        }
        3 if t < 4200 => {
            util = 100.0;
            power = 80.0;
        }
        _ => {}
    }
    v.set(Metric::Util, Some(util));
    v.set(Metric::MemUtil, Some(util * 0.4));
    v.set(Metric::MemUsed, Some(used));
    v.set(Metric::MemFree, Some(80.0 * GIB - used));
    v.set(Metric::MemTotal, Some(80.0 * GIB));
    v.set(Metric::Temp, Some(temp));
    v.set(Metric::Power, Some(power));
    v.set(Metric::PowerLimit, Some(700.0));
    v.set(Metric::Energy, Some(t as f64 * 400.0));
    v.set(Metric::SmClock, Some(1980.0));
    v.set(Metric::ClockEventReasons, Some(reasons));
    v.set(Metric::EccCorrected, Some((t / 900) as f64));
    v.set(Metric::EccUncorrected, Some(ecc));
    v.set(Metric::RemappedUncorrectable, Some(0.0));
    v.set(Metric::RemapFailure, Some(0.0));
    let lost = i == 2 && t >= 6000;
    if lost {
        v = MetricValues::default();
    }
    GpuSample {
        time_ms: t * 1000,
        id: DeviceId {
            index: i,
            minor: Some(i),
            uuid: format!("GPU-{i}"),
            pci_bus_id: format!("00000000:{:02X}:00.0", i + 0x18),
            name: "NVIDIA H100 80GB HBM3".into(),
        },
        state: if lost {
            DeviceState::Lost
        } else {
            DeviceState::Ok
        },
        values: v,
    }
}

fn scenario() -> Vec<Snapshot> {
    let mut seed = 11;
    let mut out = Vec::new();
    for t in (0..END_S).step_by(STEP_S as usize) {
        if (5000..5100).contains(&t) {
            continue; // the collector stalls
        }
        let gpus: Vec<GpuSample> = (0..4).map(|i| gpu(t, i, &mut seed)).collect();
        let processes = (0..4u32)
            .filter(|i| *i != 2 || t < 6000)
            .map(|i| {
                let pid = if i == 3 && t >= 3600 { 9000 } else { 1000 + i };
                let mut p = ProcSample::compute(pid, i, format!("GPU-{i}"), Some(39 << 30));
                p.user = Some("alice".into());
                p
            })
            .collect();
        let mut xids = Vec::new();
        for (at, gpu_index, code) in [(2400, 1, 48), (4000, 1, 13), (6000, 2, 79)] {
            if t == at {
                xids.push(XidEvent::new(
                    t * 1000,
                    gpu_index,
                    format!("GPU-{gpu_index}"),
                    code,
                ));
            }
        }
        out.push(Snapshot {
            time_ms: t * 1000,
            gpus,
            processes: Some(processes),
            xids,
            ..Snapshot::default()
        });
    }
    out
}

fn replay_all(reuse: bool, snaps: &[Snapshot]) -> (Vec<AlertEvent>, Engine) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules");
    let rules = RuleSet::load(&[dir], &RulesConfig::default()).unwrap();
    let mut engine = Engine::new(
        rules,
        EngineOptions {
            hostname: "box".into(),
            ..EngineOptions::default()
        },
    );
    engine.set_reuse(reuse);
    let mut events = Vec::new();
    replay(
        &mut engine,
        snaps.iter().cloned().map(Ok::<_, ()>),
        |e: &AlertEvent| events.push(e.clone()),
    )
    .unwrap();
    (events, engine)
}

#[test]
fn reusing_results_changes_no_event() {
    let snaps = scenario();
    let (fresh, plain) = replay_all(false, &snaps);
    let (reused, engine) = replay_all(true, &snaps);
    let names: std::collections::BTreeSet<&str> = fresh.iter().map(|e| e.name.as_str()).collect();
    for expected in [
        "temperature_high",
        "thermal_throttling",
        "ecc_uncorrected",
        "xid_error",
        "gpu_lost",
        "oom_risk",
        "collector_stale",
    ] {
        assert!(
            names.contains(expected),
            "{expected} missing from {names:?}"
        );
    }
    assert_eq!(fresh.len(), reused.len(), "{names:?}");
    for (a, b) in fresh.iter().zip(&reused) {
        assert_eq!(a, b);
    }
    let (hits, runs) = engine.reuse_stats();
    assert_eq!(plain.reuse_stats().0, 0);
    assert!(
        hits > runs,
        "only {hits} of {} evaluations reused",
        hits + runs
    );
}

#[test]
fn a_check_cannot_keep_state_between_evaluations() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("count.rhai");
    std::fs::write(
        &path,
        r#"let n = 0;
rule(#{ name: "count", check: |gpu| { n += 1; n > 2 } });"#,
    )
    .unwrap();
    let rules = RuleSet::load(std::slice::from_ref(&path), &RulesConfig::default()).unwrap();
    let mut engine = Engine::new(rules, EngineOptions::default());
    let snaps = scenario();
    let mut events = Vec::new();
    for s in snaps.iter().take(5) {
        events.extend(engine.observe(s));
    }
    // Each evaluation starts from the value the file left: `n` is 1 every time, never 3.
    assert!(events.is_empty(), "{events:?}");

    // Nor through a captured closure (or one inside an array) that captured the variable.
    std::fs::write(
        &path,
        r#"let n = 0;
let inc = || { n += 1; n };
let fns = [inc];
rule(#{ name: "count", check: |gpu| { inc.call() + fns[0].call() > 4 } });"#,
    )
    .unwrap();
    let rules = RuleSet::load(&[path], &RulesConfig::default()).unwrap();
    let mut engine = Engine::new(rules, EngineOptions::default());
    let mut events = Vec::new();
    for s in snaps.iter().take(5) {
        events.extend(engine.observe(s));
    }
    assert!(events.is_empty(), "{events:?}");
}

#[test]
fn a_host_result_is_reused_while_what_it_read_is_the_same_and_it_had_no_effect() {
    let dir = tempfile::tempdir().unwrap();
    let snaps = scenario();
    let stats = |script: &str| {
        let path = dir.path().join("host.rhai");
        std::fs::write(&path, script).unwrap();
        let rules = RuleSet::load(&[path], &RulesConfig::default()).unwrap();
        let mut engine = Engine::new(rules, EngineOptions::default());
        let mut fired = 0;
        for s in snaps.iter().take(10) {
            fired += engine.observe(s).len();
        }
        (engine.reuse_stats(), fired)
    };
    // The host name and the missing GPUs stay the same: evaluated once, reused nine times.
    let fields = r#"rule(#{ name: "h", scope: "host",
        check: |host| host.hostname == "nowhere" || host.missing_gpus.len() > 0 });"#;
    assert_eq!(stats(fields), ((9, 1), 0));
    // The GPUs present and a value of each that stays the same: reused too.
    let gpus = r#"rule(#{ name: "h", scope: "host",
        check: |host| { let big = 0; for g in host.gpus { if g.mem_total.last() > 1e9 { big += 1; } } big > 8 } });"#;
    assert_eq!(stats(gpus), ((9, 1), 0));
    // A GPU value that changes (GPU 2's memory grows) or an effect: evaluated every time.
    let moving = r#"rule(#{ name: "h", scope: "host",
        check: |host| { let full = 0; for g in host.gpus { if g.mem_used.last() > 1e15 { full += 1; } } full > 0 } });"#;
    assert_eq!(stats(moving), ((0, 10), 0));
    let effect = r#"rule(#{ name: "h", scope: "host",
        check: |host| { print("x"); host.hostname == "nowhere" } });"#;
    assert_eq!(stats(effect), ((0, 10), 0));
    // `now` changes at every snapshot.
    let now = r#"rule(#{ name: "h", scope: "host", check: |host| host.now < 0 });"#;
    assert_eq!(stats(now), ((0, 10), 0));
}

#[test]
fn a_process_result_is_reused_while_the_process_and_its_gpu_inputs_are_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proc.rhai");
    std::fs::write(
        &path,
        r#"rule(#{ name: "busy_big", scope: "process",
        check: |p| p.mem > 30 * 1073741824 && p.gpu_series.util.mean("1m") > 50 });
rule(#{ name: "newcomer", scope: "process", check: |p| p.pid == 9000 });"#,
    )
    .unwrap();
    let snaps = scenario();
    let run = |reuse: bool| {
        let rules = RuleSet::load(std::slice::from_ref(&path), &RulesConfig::default()).unwrap();
        let mut engine = Engine::new(rules, EngineOptions::default());
        engine.set_reuse(reuse);
        let mut events = Vec::new();
        for s in &snaps {
            events.extend(engine.observe(s));
        }
        (events, engine.reuse_stats())
    };
    let (fresh, (none, _)) = run(false);
    let (reused, (hits, runs)) = run(true);
    assert_eq!(none, 0);
    assert_eq!(fresh, reused);
    for name in ["busy_big", "newcomer"] {
        assert!(fresh.iter().any(|e| e.name == name), "{name}: {fresh:?}");
    }
    // `newcomer` reads the process alone: it runs once per process; `busy_big` runs while the
    // utilization it averages moves (the busy GPUs), and is reused on the idle one.
    let ticks = snaps.len() as u64;
    assert!(
        hits > 3 * ticks,
        "{hits} reused, {runs} ran of {ticks} ticks"
    );
    assert!(
        runs < 4 * ticks,
        "{hits} reused, {runs} ran of {ticks} ticks"
    );
}

#[test]
fn a_process_result_is_reused_while_the_fields_it_read_are_the_same() {
    // One GPU, one process listed at every tick, its runtime growing (as every list says) and
    // its memory the same for 10 ticks, then more.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proc.rhai");
    std::fs::write(
        &path,
        r#"rule(#{ name: "big", scope: "process", check: |p| p.mem > 30 * 1073741824 });
rule(#{ name: "old", scope: "process", check: |p| p.runtime > 5.0 });
rule(#{ name: "named", scope: "process", check: |p| `${p}` == "" });
rule(#{ name: "off", scope: "process", check: |p| { if !param("enabled", false) { return; } p.mem > 0 } });"#,
    )
    .unwrap();
    let rules = RuleSet::load(std::slice::from_ref(&path), &RulesConfig::default()).unwrap();
    let names: Vec<String> = rules.rules().iter().map(|r| r.spec.name.clone()).collect();
    let mut engine = Engine::new(rules, EngineOptions::default());
    let mut seed = 1;
    let mut big_fired = false;
    for k in 0..20i64 {
        let mut s = Snapshot {
            time_ms: 1_000_000 + k * 1000,
            gpus: vec![gpu(k, 0, &mut seed)],
            ..Snapshot::default()
        };
        s.gpus[0].time_ms = s.time_ms;
        let mem = if k < 10 { 20u64 << 30 } else { 40 << 30 };
        let mut p = ProcSample::compute(4242, 0, "GPU-0", Some(mem));
        p.runtime_s = Some(k as f64);
        s.processes = Some(vec![p]);
        big_fired |= engine
            .observe(&s)
            .iter()
            .any(|e| e.name == "big" && e.status == crate::model::AlertStatus::Firing);
    }
    assert!(big_fired);
    let runs: BTreeMap<&str, u64> = names
        .iter()
        .map(String::as_str)
        .zip(engine.runs_by_rule().iter().copied())
        .collect();
    // `big` reads the memory: once for each value; `old` the runtime: at every tick;
    // `named` the PID, user and command through `${p}`, which never change.
    assert_eq!(runs["big"], 2, "{runs:?}");
    assert_eq!(runs["old"], 20, "{runs:?}");
    assert_eq!(runs["named"], 1, "{runs:?}");
    assert_eq!(runs["off"], 1, "{runs:?}");
}

#[test]
fn a_gpu_result_that_read_the_process_count_is_reused_while_the_count_is_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("count.rhai");
    std::fs::write(
        &path,
        r#"rule(#{ name: "crowded", check: |gpu| gpu.process_count > 1 });
rule(#{ name: "listed", check: |gpu| gpu.processes.len() > 1 });"#,
    )
    .unwrap();
    let rules = RuleSet::load(std::slice::from_ref(&path), &RulesConfig::default()).unwrap();
    let mut engine = Engine::new(rules, EngineOptions::default());
    let mut seed = 1;
    for k in 0..10i64 {
        let mut s = Snapshot {
            time_ms: 1_000_000 + k * 1000,
            gpus: vec![gpu(k, 0, &mut seed)],
            ..Snapshot::default()
        };
        s.gpus[0].time_ms = s.time_ms;
        // a list read at every tick: the same process, a second after the last
        let mut p = ProcSample::compute(4242, 0, "GPU-0", Some(1 << 30));
        p.runtime_s = Some(k as f64);
        s.processes = Some(vec![p]);
        engine.observe(&s);
    }
    // `crowded` read the count (1 throughout); `listed` read the list, whose runtime moves
    assert_eq!(engine.runs_by_rule(), &[1, 10]);
}
