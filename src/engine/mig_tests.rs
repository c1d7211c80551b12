//! MIG devices in rules: `gpu.mig` in GPU rules, `p.mig` / `p.mig_profile` in process rules, and
//! the `mig` label that names the MIG device on a process alert.

use super::*;
use crate::model::{
    AlertStatus, DeviceId, DeviceState, GpuSample, MetricValues, MigSample, ProcSample,
};
use crate::rules::RulesConfig;

fn rules(dir: &std::path::Path, text: &str) -> RuleSet {
    let p = dir.join("mig.rhai");
    std::fs::write(&p, text).unwrap();
    RuleSet::load(&[p], &RulesConfig::default()).unwrap()
}

/// GPU 0 split into two MIG devices: pid 10 uses 9 of 9.5 GiB on the first (GI 7), pid 11
/// 1 GiB on the second (GI 8).
fn snap(t_s: i64) -> Snapshot {
    let mig = |k: u32, pid: u32, used: u64| MigSample {
        gpu_uuid: "GPU-0".into(),
        mem_used_bytes: Some(used),
        mem_total_bytes: Some(9728 << 20),
        pids: vec![pid],
        ..MigSample::one_g(0, k)
    };
    Snapshot {
        time_ms: t_s * 1000,
        gpus: vec![GpuSample {
            time_ms: t_s * 1000,
            id: DeviceId {
                index: 0,
                uuid: "GPU-0".into(),
                ..DeviceId::default()
            },
            state: DeviceState::Ok,
            values: MetricValues::default(),
        }],
        processes: Some(vec![
            ProcSample::compute(10, 0, "GPU-0", Some(9 << 30)),
            ProcSample::compute(11, 0, "GPU-0", Some(1 << 30)),
        ]),
        mig: vec![mig(0, 10, 9 << 30), mig(1, 11, 1 << 30)],
        ..Snapshot::default()
    }
}

const RULES: &str = r#"
rule(#{ name: "mig_full", check: |gpu| {
    for m in gpu.mig {
        if m.mem_used > 0.9 * m.mem_total {
            return #{ summary: `${m.name} is ${m.mem_used / m.mem_total * 100.0}% full`, labels: #{ mig: m.name } };
        }
    }
} });
rule(#{ name: "big_on_slice", scope: "process", check: |p| {
    if p.mig_profile == "1g.10gb" && p.mem > p.mig.mem_total * 0.5 { `pid ${p.pid} holds most of ${p.mig.address}` }
} });
rule(#{ name: "count", check: |gpu| if gpu.mig.len() != 2 { "wrong" } });
"#;

#[test]
fn rules_see_mig_devices_and_alerts_name_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut e = Engine::new(rules(dir.path(), RULES), EngineOptions::default());
    let events = e.observe(&snap(0));
    let firing: Vec<&AlertEvent> = events
        .iter()
        .filter(|ev| ev.status == AlertStatus::Firing)
        .collect();
    assert_eq!(firing.len(), 2, "{events:?}");
    let full = firing.iter().find(|ev| ev.name == "mig_full").unwrap();
    assert_eq!(full.labels["mig"], "MIG 1g.10gb 0/7/0");
    assert!(full.annotations["summary"].starts_with("MIG 1g.10gb 0/7/0 is 9"));
    let big = firing.iter().find(|ev| ev.name == "big_on_slice").unwrap();
    assert_eq!(big.labels["pid"], "10");
    assert_eq!(big.labels["mig"], "MIG 1g.10gb 0/7/0", "{big:?}");
    assert_eq!(big.annotations["summary"], "pid 10 holds most of 0/7/0");
    assert_eq!(big.target_pid, Some(10));
    assert_eq!(e.mig_of_process(0, 11).map(|m| m.gpu_instance_id), Some(8));
}

/// A GPU instance's GPM metrics in rules: `m.sm_active` on `gpu.mig` (and `p.mig`), `()` where
/// the GPU gave none (an A100, the first slow read), so a rule on them gets no data rather than
/// a false alarm; a change of the value is a change of the rule's input (no stale reuse).
#[test]
fn rules_see_the_gpm_metrics_of_gpu_instances() {
    let dir = tempfile::tempdir().unwrap();
    let rules = rules(
        dir.path(),
        r#"
rule(#{ name: "mig_idle_holder", check: |gpu| {
    for m in gpu.mig {
        if m.sm_active != () && m.sm_active < 5.0 && m.pids.len() > 0 {
            return #{ summary: `${m.name}: SM active ${m.sm_active} %`, labels: #{ mig: m.name } };
        }
    }
} });
rule(#{ name: "unknown_is_unit", check: |gpu| {
    for m in gpu.mig { if m.sm_active == () && m.tensor_active == () { return `${m.address} has no GPM`; } }
} });
rule(#{ name: "slow_process", scope: "process", check: |p| {
    if p.mig != () && p.mig.sm_active != () && p.mig.sm_active < 5.0 { `pid ${p.pid}` }
} });
"#,
    );
    let mut e = Engine::new(rules, EngineOptions::default());
    // no GPM yet: nothing fires but the check for `()`
    let events = e.observe(&snap(0));
    let names: Vec<&str> = events
        .iter()
        .filter(|ev| ev.status == AlertStatus::Firing)
        .map(|ev| ev.name.as_str())
        .collect();
    assert_eq!(names, ["unknown_is_unit"], "{events:?}");
    // GI 8 (pid 11) idles at 2 % SM active, GI 7 works
    let mut s = snap(10);
    s.mig[0].gpm.set(crate::model::Metric::SmActive, Some(80.0));
    s.mig[1].gpm.set(crate::model::Metric::SmActive, Some(2.0));
    let events = e.observe(&s);
    let idle = events
        .iter()
        .find(|ev| ev.name == "mig_idle_holder" && ev.status == AlertStatus::Firing)
        .unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(idle.labels["mig"], "MIG 1g.10gb 0/8/0");
    assert_eq!(
        idle.annotations["summary"],
        "MIG 1g.10gb 0/8/0: SM active 2.0 %"
    );
    let slow = events
        .iter()
        .find(|ev| ev.name == "slow_process" && ev.status == AlertStatus::Firing)
        .unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(slow.labels["pid"], "11");
    assert!(events
        .iter()
        .any(|ev| ev.name == "unknown_is_unit" && ev.status == AlertStatus::Resolved));
}
