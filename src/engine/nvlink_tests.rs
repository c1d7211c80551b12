//! NVLinks in rules: `gpu.nvlinks`, one map per link of the GPU's newest reading, with each
//! error counter's rise since the reading before (a reading carried in several snapshots is one
//! reading).

use super::*;
use crate::model::nvlink::{NvlinkLink, NvlinkStatus, RemoteType};
use crate::model::{AlertStatus, DeviceId, DeviceState, GpuSample, MetricValues};
use crate::rules::RulesConfig;

fn rules(dir: &std::path::Path, text: &str) -> RuleSet {
    let p = dir.join("links.rhai");
    std::fs::write(&p, text).unwrap();
    RuleSet::load(&[p], &RulesConfig::default()).unwrap()
}

fn link(n: u32, crc: u64) -> NvlinkLink {
    NvlinkLink {
        link: n,
        up: true,
        speed_mbps: Some(26_562),
        version: Some(4),
        remote_bus_id: Some(format!("00000000:0{}:00.0", 5 + n / 5)),
        remote_type: Some(RemoteType::Switch),
        peer_gpu: None,
        crc_flit_errors: Some(crc),
        crc_data_errors: None,
        replay_errors: Some(0),
        recovery_errors: Some(0),
    }
}

/// Two GPUs at `t_s`: GPU 0 with 18 links read at `read_s` (link 7's CRC flit counter at
/// `crc`), GPU 1 without NVLink.
fn snap(t_s: i64, read_s: i64, crc: u64) -> Snapshot {
    let gpu = |i: u32| GpuSample {
        time_ms: t_s * 1000,
        id: DeviceId {
            index: i,
            uuid: format!("GPU-{i}"),
            ..DeviceId::default()
        },
        state: DeviceState::Ok,
        values: MetricValues::default(),
    };
    Snapshot {
        time_ms: t_s * 1000,
        gpus: vec![gpu(0), gpu(1)],
        nvlink: vec![std::sync::Arc::new(NvlinkStatus {
            gpu: 0,
            time_ms: read_s * 1000,
            links: (0..18)
                .map(|n| link(n, if n == 7 { crc } else { 3 }))
                .collect(),
        })],
        ..Snapshot::default()
    }
}

const RULES: &str = r#"
rule(#{ name: "link_crc", check: |gpu| {
    for l in gpu.nvlinks {
        if l.crc_flit_delta != () && l.crc_flit_delta > 0 {
            return `NVLink ${l.index} (to ${l.far_end}, ${l.remote}) gained ${l.crc_flit_delta} CRC errors in ${l.interval_s} s (${l.crc_flit_errors} in all)`;
        }
    }
} });
rule(#{ name: "shape", check: |gpu| {
    let n = gpu.nvlinks;
    if gpu.index == 1 && n.len() != 0 { return "GPU 1 has no NVLink"; }
    if gpu.index == 0 && (n.len() != 18 || n[0].speed_mbps != 26562 || n[0].full_speed_mbps != 26562
        || n[0].version != 4 || n[0].peer_gpu != () || n[0].crc_data_errors != ()
        || n[17].remote_bus_id != "00000000:08:00.0") { return "wrong links"; }
    // each link an object: its properties also by name, as a map, and printed as one
    if gpu.index == 0 && (n[0]["version"] != 4 || n[0]["no_such"] != () || n[0].to_map().len() != 18
        || n[3].to_map()["index"] != 3 || !`${n[0]}`.contains("far_end")) { return "wrong link object"; }
} });
"#;

#[test]
fn rules_see_each_link_and_its_counters_rise() {
    let dir = tempfile::tempdir().unwrap();
    let mut e = Engine::new(rules(dir.path(), RULES), EngineOptions::default());
    let firing = |events: &[AlertEvent]| -> Vec<(String, String)> {
        events
            .iter()
            .filter(|ev| ev.status == AlertStatus::Firing)
            .map(|ev| (ev.name.clone(), ev.annotations["summary"].clone()))
            .collect()
    };
    // the first reading: no rise known yet
    assert_eq!(firing(&e.observe(&snap(0, 0, 100))), []);
    // the same reading carried into the next snapshot: still no rise
    assert_eq!(firing(&e.observe(&snap(1, 0, 100))), []);
    // a new reading 5 s after the first: link 7 gained 40
    let f = firing(&e.observe(&snap(5, 5, 140)));
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].0, "link_crc");
    assert_eq!(
        f[0].1,
        "NVLink 7 (to NVSwitch 00000000:06:00.0, switch) gained 40.0 CRC errors in 5.0 s (140.0 in all)"
    );
    // a snapshot without the reading (stale): hidden from rules, kept for the next rise
    let mut stale = snap(20, 5, 140);
    stale.nvlink.clear();
    e.observe(&stale);
    let h = e.gpus.get(&0).unwrap();
    assert!(h.nvlink_stale);
    assert_eq!(h.nvlink.as_ref().map(|v| v.time_ms), Some(5000));
}

/// Snapshots without a current reading of the links (the reading stale, a stalled tick): rules
/// see no links meanwhile, and the next reading's rise is since the last reading before them —
/// the errors in between are reported, not lost with a `()` rise.
#[test]
fn a_rise_spans_the_snapshots_without_a_reading() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "{RULES}\nrule(#{{ name: \"hidden\", check: |gpu| if gpu.index == 0 && gpu.nvlinks.len() == 0 {{ \"GPU 0's links hidden\" }} }});\n"
    );
    let mut e = Engine::new(rules(dir.path(), &text), EngineOptions::default());
    let firing = |events: &[AlertEvent]| -> Vec<(String, String)> {
        events
            .iter()
            .filter(|ev| ev.status == AlertStatus::Firing)
            .map(|ev| (ev.name.clone(), ev.annotations["summary"].clone()))
            .collect()
    };
    assert_eq!(firing(&e.observe(&snap(0, 0, 100))), []);
    for t in [5, 10] {
        let mut stale = snap(t, 0, 100);
        stale.nvlink.clear();
        let f = firing(&e.observe(&stale));
        assert_eq!(f.iter().any(|(n, _)| n == "hidden"), t == 5, "{f:?}");
        assert!(!f.iter().any(|(n, _)| n == "link_crc"), "{f:?}");
    }
    let f = firing(&e.observe(&snap(15, 15, 160)));
    assert_eq!(
        f,
        [(
            "link_crc".to_string(),
            "NVLink 7 (to NVSwitch 00000000:06:00.0, switch) gained 60.0 CRC errors in 15.0 s (160.0 in all)"
                .to_string()
        )]
    );
}
