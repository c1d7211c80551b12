//! `gpuwatch daemon` restarts with a state dir: an uncorrectable ECC error that happens while the
//! daemon is down is announced at the first sample after the restart (the state file carries the
//! counters), exactly once, and not again after a further restart.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common;
use crate::notify::servers::{wait_until, Daemon, HttpReceiver};

const T: Duration = Duration::from_secs(60);

fn config(dir: &Path, webhook_url: &str) -> PathBuf {
    config_with(dir, webhook_url, &["ecc_uncorrected"])
}

fn config_with(dir: &Path, webhook_url: &str, stock_rules: &[&str]) -> PathBuf {
    let rules = common::stock_rules(dir, stock_rules);
    let path = dir.join("config.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[daemon]
interval = "1s"
state_dir = "state"
rules = ["{rules}"]
hostname = "simhost"

[rules]
eval_interval = "1s"

[[channel]]
name = "ops"
type = "webhook"
url = "{webhook_url}"

[[route]]
severity = ["info", "warning", "critical"]
channels = ["ops"]
group_by = ["alertname"]
group_wait = "0s"
"#,
            rules = rules.display()
        ),
    )
    .unwrap();
    path
}

fn daemon(config: &Path, log: &Path, start_s: &str) -> Daemon {
    daemon_on("ecc-errors", config, log, start_s)
}

fn daemon_on(scenario: &str, config: &Path, log: &Path, start_s: &str) -> Daemon {
    common::sim_lib();
    let cmd = common::command(
        &[
            "--sim",
            scenario,
            "daemon",
            "--config",
            config.to_str().unwrap(),
        ],
        &[("NVML_SIM_TIME_SCALE", "10"), ("NVML_SIM_START_S", start_s)],
    );
    Daemon::spawn(cmd, log, &[], false)
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[test]
fn ecc_error_while_down_is_announced_at_the_first_sample_after_the_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let hook = HttpReceiver::start();
    let cfg = config(tmp.path(), &hook.url("/hook"));
    let log = tmp.path().join("log");
    let state = tmp.path().join("state/alerts.json");

    // Up for scenario 0–~20 s (no uncorrectable error yet), then stopped.
    let mut d = daemon(&cfg, &log, "0");
    std::thread::sleep(Duration::from_secs(3));
    d.signal(libc::SIGTERM);
    assert!(d.wait(T).success(), "{}", d.log_text());
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    let gpus = saved["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 8, "{saved}");
    assert!(
        gpus.iter()
            .all(|g| g["counters"]["ecc_uncorrected"]["value"] == 0.0),
        "{saved}"
    );
    assert!(hook.accepted().is_empty());

    // The error comes at scenario 60 s, while the daemon is down; it restarts at 70 s.
    let restarted_s = now_s();
    let mut d = daemon(&cfg, &log, "70");
    let got = hook.wait_accepted(1, T);
    let body = got[0].json();
    assert_eq!(body["status"], "firing");
    let alert = &body["alerts"][0];
    assert_eq!(alert["labels"]["alertname"], "ecc_uncorrected");
    assert_eq!(alert["labels"]["gpu"], "2");
    let starts_s = chrono::DateTime::parse_from_rfc3339(alert["startsAt"].as_str().unwrap())
        .unwrap()
        .timestamp_millis() as f64
        / 1000.0;
    assert!(
        starts_s - restarted_s < 5.0,
        "fired {:.1} s after the restart\n{}",
        starts_s - restarted_s,
        d.log_text()
    );
    d.signal(libc::SIGTERM);
    assert!(d.wait(T).success(), "{}", d.log_text());

    // A further restart neither announces it again nor forgets it.
    let mut d = daemon(&cfg, &log, "80");
    wait_until(T, "samples after the second restart", || {
        d.log_text()
            .matches("resuming alert state")
            .nth(1)
            .map(|_| ())
    });
    std::thread::sleep(Duration::from_secs(3));
    d.signal(libc::SIGTERM);
    assert!(d.wait(T).success(), "{}", d.log_text());
    assert_eq!(hook.accepted().len(), 1, "{}", d.log_text());
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    assert_eq!(saved["instances"][0]["key"], "ecc_uncorrected", "{saved}");
}

/// A restart while a GPU is lost: its `gpu_lost` and `xid_error` alerts stay firing (the lost
/// GPU gives no samples, its XIDs come back from the state file), nothing is sent as resolved.
#[test]
fn restart_while_a_gpu_is_lost_resolves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let hook = HttpReceiver::start();
    let cfg = config_with(tmp.path(), &hook.url("/hook"), &["gpu_lost", "xid_error"]);
    // Without the default inhibition (gpu_lost mutes the GPU's other alerts), so a wrong
    // `xid_error` resolution would be sent.
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, format!("[notify]\ninhibit = []\n{text}")).unwrap();
    let log = tmp.path().join("log");

    // XID 79 and the loss of GPU 3 at scenario 30 s (3 s at 10x).
    let mut d = daemon_on("xid-79", &cfg, &log, "0");
    let got = hook.wait_accepted(2, T);
    let names: Vec<String> = got
        .iter()
        .flat_map(|r| {
            let body = r.json();
            assert_eq!(body["status"], "firing", "{body}");
            body["alerts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a["labels"]["alertname"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(names.contains(&"gpu_lost".to_string()), "{names:?}");
    assert!(names.contains(&"xid_error".to_string()), "{names:?}");
    d.signal(libc::SIGTERM);
    assert!(d.wait(T).success(), "{}", d.log_text());

    // Restarted at scenario 60 s: GPU 3 is still lost.
    let mut d = daemon_on("xid-79", &cfg, &log, "60");
    wait_until(T, "samples after the restart", || {
        d.log_text()
            .matches("resuming alert state")
            .next()
            .map(|_| ())
    });
    std::thread::sleep(Duration::from_secs(5));
    d.signal(libc::SIGTERM);
    assert!(d.wait(T).success(), "{}", d.log_text());
    let sent = hook.accepted();
    for r in &sent[got.len()..] {
        let body = r.json();
        assert_ne!(body["status"], "resolved", "{body}\n{}", d.log_text());
    }
}
