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
            assert_eq!(l["remote_type"], "gpu", "{l}");
            // the driver's nvmlNvlinkVersion_t 6 (4_0) is NVLink 4
            assert_eq!(l["version"], 4, "{l}");
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

/// A scenario file in `dir`: 8 × H100 SXM on an HGX board (every link to an NVSwitch) plus
/// `extra`.
fn hgx(dir: &std::path::Path, name: &str, extra: &str) -> String {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "name = \"{name}\"\n[devices]\ncount = 8\nname = \"NVIDIA H100 80GB HBM3\"\n{extra}"
        ),
    )
    .unwrap();
    path.to_str().unwrap().to_string()
}

/// What is at the far end of a link, from `nvmlDeviceGetNvLinkRemoteDeviceType`: on an HGX board
/// an NVSwitch (doctor names it), in a mesh whose far GPU NVML does not list (hidden, as in a
/// container that sees only some GPUs) a GPU not visible to gpuwatch, and on a driver without
/// the function an unknown device — never a guessed NVSwitch.
#[test]
fn the_far_end_of_a_link_is_a_gpu_a_switch_or_unknown() {
    let tmp = tempfile::tempdir().unwrap();
    let down = "[[nvlink.event]]\nat_s = 0\ngpu = 2\nlink = 3\nstate = \"down\"\n";
    let switch = hgx(tmp.path(), "hgx-down", down);
    let s = common::sim(&switch, &["status", "--json"], &[]).json();
    for g in s["gpus"].as_array().unwrap() {
        for l in g["nvlink"].as_array().unwrap() {
            assert_eq!(l["remote_type"], "switch", "{l}");
            assert!(l.get("peer_gpu").is_none(), "{l}");
        }
    }
    let out = common::sim(&switch, &["doctor"], &[]);
    assert!(
        out.stdout
            .contains("NVLink 3 (to NVSwitch 00000000:05:00.0) is down"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );

    // an older driver: FUNCTION_NOT_FOUND
    let old = hgx(
        tmp.path(),
        "hgx-old-driver",
        &format!(
            "{down}[[fault]]\nfunction = \"nvmlDeviceGetNvLinkRemoteDeviceType\"\nerror = \"FUNCTION_NOT_FOUND\"\n"
        ),
    );
    let s = common::sim(&old, &["status", "--json"], &[]).json();
    let links = s["gpus"][2]["nvlink"].as_array().unwrap();
    assert_eq!(links.len(), 18);
    assert!(
        links.iter().all(|l| l.get("remote_type").is_none()),
        "{links:?}"
    );
    let out = common::sim(&old, &["doctor"], &[]);
    assert!(
        out.stdout
            .contains("NVLink 3 (to unknown device 00000000:05:00.0) is down"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    assert!(!out.stdout.contains("NVSwitch"), "{}", out.stdout);

    // GPU 5 hidden from NVML: GPU 3's link to it goes to a GPU gpuwatch cannot see
    let s = common::sim(
        "nvlink-down",
        &["status", "--json"],
        &[("NVML_SIM_START_S", "70"), ("NVML_SIM_HIDE", "5")],
    )
    .json();
    let gpu3 = s["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["index"] == 3)
        .unwrap();
    let l5 = &gpu3["nvlink"][5];
    assert_eq!(l5["up"], false, "{l5}");
    assert_eq!(l5["remote_type"], "gpu", "{l5}");
    assert!(l5.get("peer_gpu").is_none(), "{l5}");
    assert!(l5["remote_bus_id"].is_string(), "{l5}");
    let out = common::sim(
        "nvlink-down",
        &["doctor"],
        &[("NVML_SIM_START_S", "70"), ("NVML_SIM_HIDE", "5")],
    );
    let want = format!(
        "NVLink 5 (to GPU {} (not visible to gpuwatch)) is down",
        l5["remote_bus_id"].as_str().unwrap()
    );
    assert!(out.stdout.contains(&want), "{want}\n{}", out.stdout);
}

/// On an HGX board a link down raises `nvlink_errors` naming the link to the NVSwitch (not a
/// GPU pair), through the daemon: the sampler's per-link reading reaches the rule as
/// `gpu.nvlinks`.
#[test]
fn a_link_down_to_an_nvswitch_names_the_switch() {
    let tmp = tempfile::tempdir().unwrap();
    let hook = HttpReceiver::start();
    let cfg = webhook_config(tmp.path(), &hook.url("/hook"));
    let scenario = hgx(
        tmp.path(),
        "hgx-link-down",
        "[[nvlink.event]]\nat_s = 0\ngpu = 2\nlink = 6\nstate = \"down\"\n",
    );
    let mut d = daemon(&scenario, &cfg, &tmp.path().join("log"), &[]);
    let alert = wait_until(T, "nvlink_errors on GPU 2", || {
        hook.accepted().iter().find_map(|r| {
            let body = r.json();
            body["alerts"]
                .as_array()
                .into_iter()
                .flatten()
                .find_map(|a| {
                    (a["labels"]["alertname"] == "nvlink_errors"
                        && a["status"] == "firing"
                        && a["labels"]["gpu"] == "2")
                        .then(|| a.clone())
                })
        })
    });
    let summary = alert["annotations"]["summary"].as_str().unwrap();
    assert!(
        summary.contains("NVLink from GPU 2 to NVSwitch 00000000:06:00.0 is down (1 link)"),
        "{summary}"
    );
    d.signal(libc::SIGTERM);
    assert!(d.wait(T).success(), "{}", d.log_text());
}

/// A mixed box: GPU 0's driver gives no NVLink error counters (NOT_SUPPORTED), GPU 1's does and
/// they climb: GPU 1's totals stay, GPU 0's are absent. And one link of GPU 4 trained at half
/// speed shows on that link alone: links 12–17 (read through the common speed) and the others
/// run NVLink 4's 26,562 MB/s, and doctor names only link 3.
#[test]
fn one_gpu_without_counters_hides_no_other_and_one_slow_link_is_one_finding() {
    let tmp = tempfile::tempdir().unwrap();
    let scenario = hgx(
        tmp.path(),
        "hgx-mixed",
        "[[nvlink.errors]]\ngpu = 1\nlink = 2\ncrc_flit_per_s = 10\n\
         [[nvlink.event]]\nat_s = 0\ngpu = 4\nlink = 3\nstate = \"up\"\nspeed_mbps = 13281\n\
         [[fault]]\nfunction = \"nvmlDeviceGetNvLinkErrorCounter\"\nerror = \"NOT_SUPPORTED\"\ngpus = [0]\n",
    );
    let env = [("NVML_SIM_TIME_SCALE", "0"), ("NVML_SIM_START_S", "10")];
    let s = common::sim(&scenario, &["status", "--json"], &env).json();
    let gpus = s["gpus"].as_array().unwrap();
    assert_eq!(gpus[0]["metrics"]["nvlink_crc_flit_errors"], Value::Null);
    assert!(gpus[0]["nvlink"][0].get("crc_flit_errors").is_none());
    assert_eq!(gpus[1]["metrics"]["nvlink_crc_flit_errors"], 100.0);
    assert_eq!(gpus[1]["nvlink"][2]["crc_flit_errors"], 100);
    assert_eq!(gpus[2]["metrics"]["nvlink_crc_flit_errors"], 0.0);
    let speeds: Vec<u64> = gpus[4]["nvlink"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["speed_mbps"].as_u64().unwrap())
        .collect();
    let mut want = vec![26_562; 18];
    want[3] = 13_281;
    assert_eq!(speeds, want);
    let out = common::sim(&scenario, &["doctor"], &env);
    let slow: Vec<&str> = out.stdout.lines().filter(|l| l.contains("MB/s")).collect();
    assert_eq!(slow.len(), 1, "{}", out.stdout);
    assert!(
        slow[0].contains("NVLink 3 (to NVSwitch 00000000:05:00.0) runs at 13281 MB/s, below the 26562 MB/s of NVLink 4"),
        "{}",
        out.stdout
    );
}

/// Two GPUs joined by NVLink bridges (every link GPU 0 – GPU 1), link 0 down from the start.
/// For its first 1.5 s GPU 1 cannot be looked up by its bus id (UNKNOWN: a peer slow at that
/// moment), and around 12 s GPU 0's error counters answer NOT_SUPPORTED for a second. The far
/// end is looked up again at the next slow round: GPU 0's link down then names GPU 1 (bit 1 of
/// the down-peers bitmask; it stayed 0 for good when the failed look-up was taken as done). The
/// links gave their counters before, so the NOT_SUPPORTED is a gap, not "unsupported": GPU 0's
/// totals are there again after it (they stayed absent for good).
#[test]
fn a_peer_that_failed_to_resolve_is_named_later_and_counters_come_back() {
    let tmp = tempfile::tempdir().unwrap();
    let scenario = tmp.path().join("bridge.toml");
    std::fs::write(
        &scenario,
        "name = \"bridge\"\n[devices]\ncount = 2\nname = \"NVIDIA H100 80GB HBM3\"\n\
         [nvlink]\ntopology = \"pairs\"\n\
         [[nvlink.event]]\nat_s = 0\ngpu = 0\nlink = 0\nstate = \"down\"\n\
         [[fault]]\nfunction = \"nvmlDeviceGetHandleByPciBusId*\"\nerror = \"UNKNOWN\"\ngpus = [1]\nfrom_s = 0\nuntil_s = 11.5\n\
         [[fault]]\nfunction = \"nvmlDeviceGetNvLinkErrorCounter\"\nerror = \"NOT_SUPPORTED\"\ngpus = [0]\nfrom_s = 11.5\nuntil_s = 12.5\n",
    )
    .unwrap();
    let rec = common::sim(
        scenario.to_str().unwrap(),
        &[
            "record",
            "--interval",
            "250ms",
            "--process-interval",
            "1s",
            "--duration",
            "4s",
        ],
        &[("NVML_SIM_START_S", "10")],
    );
    assert_eq!(rec.code, 0, "{}", rec.stderr);
    let (header, rows) = common::csv_rows(&rec.stdout);
    let gpu0: Vec<&Vec<String>> = rows
        .iter()
        .filter(|r| common::col(&header, r, "index") == "0")
        .collect();
    assert!(gpu0.len() >= 8, "{}", rec.stdout);
    let peers: Vec<&str> = gpu0
        .iter()
        .map(|r| common::col(&header, r, "nvlink_down_peers"))
        .collect();
    assert_eq!(peers[0], "0", "GPU 1 not looked up yet: {peers:?}");
    assert_eq!(
        peers.last(),
        Some(&"2"),
        "GPU 1 named once it answers: {peers:?}"
    );
    let last = gpu0.last().unwrap();
    assert_eq!(common::col(&header, last, "nvlink_links_down"), "1");
    assert_eq!(
        common::col(&header, last, "nvlink_crc_flit_errors"),
        "0",
        "the counters are asked again: {}",
        rec.stdout
    );
}
