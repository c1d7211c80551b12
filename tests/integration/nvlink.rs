//! Issue 26 §3: NVLink on nvml-sim. A link going down between GPU 3 and GPU 5 (`nvlink-down`)
//! raises `nvlink_errors` naming both GPUs at a real webhook receiver; `/metrics` carries the
//! NVLink families under DCGM's names; `status --json` lists each GPU's links; on a PCIe-only
//! board every NVLink row is absent (null), never 0, and no links are listed.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::Value;

use super::daemon::{daemon, webhook_config};
use super::exporter::get;
use super::notify::servers::{free_port, wait_until, HttpReceiver};
use crate::common;

const T: Duration = Duration::from_secs(60);

/// The NVLink rows of the metric table.
fn nvlink_keys() -> Vec<&'static str> {
    gpuwatch::model::METRICS
        .iter()
        .filter(|d| matches!(d.source, gpuwatch::model::Source::Nvlink(_)))
        .map(|d| d.key)
        .collect()
}

#[test]
fn a_link_down_raises_nvlink_errors_naming_both_gpus() {
    let tmp = tempfile::tempdir().unwrap();
    let hook = HttpReceiver::start();
    let cfg = webhook_config(tmp.path(), &hook.url("/hook"));
    // the link GPU 3 - GPU 5 goes down at scenario 60 s: start at 55 s
    let mut d = daemon(
        "nvlink-down",
        &cfg,
        &tmp.path().join("log"),
        &[("NVML_SIM_START_S", "55")],
    );
    let alerts = wait_until(T, "nvlink_errors on GPU 3 and GPU 5", || {
        let mut found: Vec<Value> = Vec::new();
        for r in hook.accepted() {
            let body = r.json();
            for a in body["alerts"].as_array().into_iter().flatten() {
                if a["labels"]["alertname"] == "nvlink_errors" && a["status"] == "firing" {
                    found.push(a.clone());
                }
            }
        }
        let gpus: Vec<&str> = found
            .iter()
            .filter_map(|a| a["labels"]["gpu"].as_str())
            .collect();
        (gpus.contains(&"3") && gpus.contains(&"5")).then_some(found)
    });
    for a in &alerts {
        assert_eq!(a["labels"]["severity"], "critical", "{a}");
        let summary = a["annotations"]["summary"].as_str().unwrap();
        let (me, peer) = match a["labels"]["gpu"].as_str().unwrap() {
            "3" => ("3", "5"),
            _ => ("5", "3"),
        };
        assert!(
            summary.contains(&format!("NVLink between GPU {me} and GPU {peer} is down")),
            "{summary}"
        );
    }
    // no other GPU's links are down
    assert!(
        alerts
            .iter()
            .all(|a| matches!(a["labels"]["gpu"].as_str(), Some("3" | "5"))),
        "{alerts:?}"
    );
    d.signal(libc::SIGTERM);
    assert!(d.wait(T).success(), "{}", d.log_text());
}

#[test]
fn metrics_carry_the_nvlink_families() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let path = tmp.path().join("config.toml");
    std::fs::write(
        &path,
        format!(
            "[daemon]\ninterval = \"1s\"\nstate_dir = \"state\"\nrules = [{rules:?}]\nhostname = \"simhost\"\n\n\
             [exporter]\nlisten = \"127.0.0.1:{port}\"\n",
            rules = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("rules")
                .display()
                .to_string(),
        ),
    )
    .unwrap();
    let mut d = daemon(
        "nvlink-down",
        &path,
        &tmp.path().join("log"),
        &[("NVML_SIM_START_S", "70")],
    );
    let families = [
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    ];
    let (_, _, page) = wait_until(T, "the NVLink families in /metrics", || {
        get(port, "/metrics", "text/plain")
            .filter(|r| families.iter().all(|f| r.2.contains(&format!("\n{f}{{"))))
    });
    let value = |name: &str, gpu: u32| -> f64 {
        let prefix = format!("{name}{{gpu=\"{gpu}\",");
        page.lines()
            .find(|l| l.starts_with(&prefix))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("{name} of GPU {gpu}:\n{page}"))
    };
    for f in families {
        let rows = page
            .lines()
            .filter(|l| l.starts_with(&format!("{f}{{")))
            .count();
        assert_eq!(rows, 8, "{f}: one row per GPU\n{page}");
    }
    // CRC errors climb at 40/s on GPU 3's link to GPU 5 from 20 s: 2000 by 70 s
    assert!(value(families[0], 3) >= 2000.0, "{page}");
    assert_eq!(value(families[0], 0), 0.0);
    // ~360 GB/s of data both ways as MB/s (DCGM's unit), spread over the links that are up
    let bw = value(families[4], 0);
    assert!((300_000.0..420_000.0).contains(&bw), "{bw}");
    assert!(page.contains("# TYPE DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL counter"));
    d.signal(libc::SIGTERM);
    assert!(d.wait(T).success(), "{}", d.log_text());
}

#[test]
fn status_json_lists_the_links_and_a_pcie_board_has_none() {
    let s = common::sim(
        "nvlink-down",
        &["status", "--json"],
        &[("NVML_SIM_START_S", "70")],
    )
    .json();
    let gpus = s["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 8);
    for g in gpus {
        let links = g["nvlink"].as_array().unwrap();
        assert_eq!(links.len(), 18, "H100 SXM: 18 links");
        let i = g["index"].as_u64().unwrap();
        let down: Vec<&Value> = links.iter().filter(|l| l["up"] == false).collect();
        let want_peer = match i {
            3 => Some(5),
            5 => Some(3),
            _ => None,
        };
        match want_peer {
            Some(p) => {
                assert_eq!(down.len(), 1, "{g}");
                assert_eq!(down[0]["peer_gpu"], p, "{g}");
                assert_eq!(g["metrics"]["nvlink_links_down"], 1.0);
                assert_eq!(g["metrics"]["nvlink_down_peers"], f64::from(1u32 << p));
            }
            None => {
                assert!(down.is_empty(), "{g}");
                assert_eq!(g["metrics"]["nvlink_links_down"], 0.0);
            }
        }
        for l in links.iter().filter(|l| l["up"] == true) {
            assert_eq!(l["speed_mbps"], 26_562, "{l}");
            assert!(l["peer_gpu"].is_u64(), "a mesh: every link to a GPU: {l}");
        }
    }
    // 40 CRC flit errors a second from 20 s on (the clock runs on a little past 70 s)
    let crc = gpus[3]["metrics"]["nvlink_crc_flit_errors"]
        .as_f64()
        .unwrap();
    assert!((2000.0..2400.0).contains(&crc), "{crc}");

    // PCIe-only boards: no NVLink, every NVLink row null (never 0), no links listed
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("pcie.toml");
    std::fs::write(
        &path,
        "name = \"pcie\"\n[devices]\ncount = 2\nname = \"NVIDIA H100 PCIe\"\n",
    )
    .unwrap();
    let s = common::sim(path.to_str().unwrap(), &["status", "--json"], &[]).json();
    for g in s["gpus"].as_array().unwrap() {
        assert!(g.get("nvlink").is_none(), "{g}");
        for k in nvlink_keys() {
            assert_eq!(g["metrics"][k], Value::Null, "{k}: {g}");
        }
    }
}

#[test]
fn doctor_finds_the_link_down() {
    let out = common::sim("nvlink-down", &["doctor"], &[("NVML_SIM_START_S", "70")]);
    assert!(
        out.stdout
            .contains("GPU 3 (00000000:5D:00.0): NVLink 5 (to GPU 5) is down"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    assert!(
        out.stdout.contains("NVLink 5 (to GPU 3) is down"),
        "{}",
        out.stdout
    );
    // a healthy H100 SXM board (NVSwitch links, all up): no NVLink finding
    let out = common::sim("healthy", &["doctor"], &[]);
    assert!(!out.stdout.contains("NVLink"), "{}", out.stdout);
}

/// A driver whose error counters stand near the top of u64 on two links (a broken counter, or
/// one that never resets): the GPU-level sum overflowed — a panic on the sampling thread of a
/// debug build that left the GPU without its slow-path values, a wrapped small total in a
/// release build. It saturates.
#[test]
fn error_counters_near_u64_max_on_two_links_saturate() {
    let tmp = tempfile::tempdir().unwrap();
    let scenario = tmp.path().join("overflow.toml");
    std::fs::write(
        &scenario,
        "name = \"nvlink-overflow\"\n[devices]\ncount = 2\nname = \"NVIDIA H100 80GB HBM3\"\n\
         [nvlink]\ntopology = \"mesh\"\n\
         [[nvlink.errors]]\ngpu = 0\nlink = 0\ncrc_flit_per_s = 1e30\n\
         [[nvlink.errors]]\ngpu = 0\nlink = 1\ncrc_flit_per_s = 1e30\n",
    )
    .unwrap();
    let run = common::sim(
        scenario.to_str().unwrap(),
        &["status", "--json"],
        &[("NVML_SIM_TIME_SCALE", "0"), ("NVML_SIM_START_S", "10")],
    );
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    let s = run.json();
    let g = &s["gpus"][0];
    assert_eq!(g["nvlink"].as_array().map(Vec::len), Some(18), "{g}");
    let crc = g["metrics"]["nvlink_crc_flit_errors"].as_f64().unwrap();
    assert_eq!(crc, u64::MAX as f64, "{g}");
}
