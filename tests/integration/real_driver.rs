//! Issue 12: gpuwatch on a driver that behaves like a real one (nvml-sim's per-function
//! latencies are on in every test) and on one that wedges. A call that never returns on one GPU
//! is announced as `nvml_stalled` within one interval + 2 s, names the function, and the other
//! GPUs keep being sampled at every tick; the daemon still stops on SIGTERM.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::{self, col, csv_rows};
use crate::daemon::daemon;
use crate::notify::servers::{wait_until, HttpReceiver};

const T: Duration = Duration::from_secs(60);

fn webhook_config(dir: &Path, url: &str) -> std::path::PathBuf {
    let path = dir.join("config.toml");
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules");
    std::fs::write(
        &path,
        format!(
            r#"
[daemon]
interval = "1s"
state_dir = "state"
rules = ["{rules}"]
hostname = "simhost"

[notify]
retry_initial = "200ms"
retry_max = "1s"

[[channel]]
name = "ops"
type = "webhook"
url = "{url}"

[[route]]
channels = ["ops"]
group_by = ["alertname", "gpu"]
group_wait = "0s"
group_interval = "1s"
"#,
            rules = rules.display()
        ),
    )
    .unwrap();
    path
}

/// The issue's check: a hang injected on GPU 2 gives an `nvml_stalled` notification within
/// interval + 2 s of the hang (measured conservatively from the daemon's start + the hang's
/// scenario time; scenario time starts later, once NVML is initialised).
#[test]
fn a_wedged_gpu_is_announced_within_interval_plus_2s_and_the_daemon_still_stops() {
    let tmp = tempfile::tempdir().unwrap();
    let hook = HttpReceiver::start();
    let cfg = webhook_config(tmp.path(), &hook.url("/hook"));
    common::sim_lib();
    let hang_at_s = 4.0;
    let started = Instant::now();
    let mut d = daemon(
        "healthy",
        &cfg,
        &tmp.path().join("log"),
        &[("NVML_SIM_HANG", "gpu=2,at_s=4,function=*")],
    );
    let alert = wait_until(T, "an nvml_stalled notification", || {
        hook.accepted()
            .into_iter()
            .map(|r| r.json())
            .find(|b| b["alerts"][0]["labels"]["alertname"] == "nvml_stalled")
    });
    let after = started.elapsed().as_secs_f64() - hang_at_s;
    let log = d.log_text();
    assert!(
        after <= 1.0 + 2.0,
        "nvml_stalled arrived {after:.2} s after the hang (> interval + 2 s)\n{log}"
    );
    let a = &alert["alerts"][0];
    assert_eq!(a["labels"]["gpu"], "2", "{alert}");
    assert_eq!(a["labels"]["severity"], "critical");
    let summary = a["annotations"]["summary"].as_str().unwrap();
    assert!(summary.contains("GPU 2"), "{summary}");
    assert!(
        summary.contains("nvmlDevice"),
        "names the function: {summary}"
    );
    // Only GPU 2 is stalled; nothing else alerts on a healthy node.
    std::thread::sleep(Duration::from_secs(3));
    for r in hook.accepted() {
        let b = r.json();
        let l = &b["alerts"][0]["labels"];
        assert!(
            l["alertname"] == "nvml_stalled" && l["gpu"] == "2",
            "unexpected {b}\n{}",
            d.log_text()
        );
    }
    assert!(log.contains("has not returned"), "{log}");
    d.signal(libc::SIGTERM);
    assert!(d.wait(T).success(), "{}", d.log_text());
}

/// While GPU 2's calls hang, GPUs 0, 1 and 3–7 are recorded at every tick, without a gap, and
/// GPU 2's rows say `stalled:<function>` with empty values (never its last values).
#[test]
fn the_other_gpus_are_recorded_without_a_gap_while_one_hangs() {
    let rec = common::sim(
        "healthy",
        &["record", "--interval", "250ms", "--duration", "5s"],
        &[("NVML_SIM_HANG", "gpu=2,at_s=1.5,function=*")],
    );
    assert_eq!(rec.code, 0, "{}", rec.stderr);
    let (h, rows) = csv_rows(&rec.stdout);
    let mut by_time: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for r in &rows {
        by_time
            .entry(col(&h, r, "timestamp").to_string())
            .or_default()
            .insert(
                col(&h, r, "index").to_string(),
                col(&h, r, "state").to_string(),
            );
    }
    assert!(
        by_time.len() >= 15,
        "ticks: {}\n{}",
        by_time.len(),
        rec.stderr
    );
    let others: BTreeSet<String> = ["0", "1", "3", "4", "5", "6", "7"]
        .iter()
        .map(|s| (*s).to_string())
        .collect();
    for (t, gpus) in &by_time {
        let present: BTreeSet<String> = gpus.keys().filter(|g| *g != "2").cloned().collect();
        assert_eq!(present, others, "tick {t}: {gpus:?}");
        for g in &others {
            assert_eq!(gpus[g], "ok", "tick {t}");
        }
    }
    let stalled: Vec<&Vec<String>> = rows
        .iter()
        .filter(|r| col(&h, r, "index") == "2" && col(&h, r, "state").starts_with("stalled:"))
        .collect();
    assert!(!stalled.is_empty(), "GPU 2 never stalled:\n{}", rec.stdout);
    assert!(col(&h, stalled[0], "state").starts_with("stalled:nvmlDevice"));
    for r in &stalled {
        assert_eq!(col(&h, r, "util"), "", "a stalled GPU's values are absent");
    }
    // Before the hang GPU 2 was ok.
    let first2 = rows.iter().find(|r| col(&h, r, "index") == "2").unwrap();
    assert_eq!(col(&h, first2, "state"), "ok");
}

/// The threads of process `pid` (`comm`, as the kernel keeps it: 15 bytes) and how often each
/// was woken after a wait (`voluntary_ctxt_switches`).
fn threads(pid: u32) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let dir = task.path();
        let (Ok(comm), Ok(status)) = (
            std::fs::read_to_string(dir.join("comm")),
            std::fs::read_to_string(dir.join("status")),
        ) else {
            continue;
        };
        let woken = status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        out.push((comm.trim().to_string(), woken));
    }
    out.sort();
    out
}

/// A GPU whose calls hang for a second is split off to a thread of its own, and the sampling
/// loop is taken over, as above. Once the driver has answered again for the rejoin wait (10 s),
/// `record` samples as it did before the hang: one NVML thread for the tick path again, and the
/// reads back on the sampling loop's own thread (that NVML thread is not woken at all). Before,
/// one slow moment cost a hand-off and a wake-up more at every tick for the rest of the run.
#[test]
fn after_a_hang_ends_the_gpus_rejoin_and_reads_run_inline_again() {
    common::sim_lib();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("rec.csv");
    let started = Instant::now();
    let mut child = common::command(
        &[
            "--sim",
            "healthy",
            "record",
            "--interval",
            "100ms",
            "--duration",
            "46s",
            "--out",
            out.to_str().unwrap(),
        ],
        &[("NVML_SIM_HANG", "gpu=2,at_s=1,for_s=1,function=nvmlDevice*")],
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let pid = child.id();
    // the tick path's NVML threads (the slow path's are `gpuwatch-nvml-slow-N`)
    let fast = |all: &[(String, u64)]| -> Vec<(String, u64)> {
        all.iter()
            .filter(|(n, _)| n.starts_with("gpuwatch-nvml-") && !n.starts_with("gpuwatch-nvml-s"))
            .cloned()
            .collect()
    };
    // The hang starts 1 s after the library is loaded (a loaded machine may start the child
    // late) and lasts a second; the split stays for 10 s of calm after it.
    let mut during = threads(pid);
    while fast(&during).len() < 2 && started.elapsed() < Duration::from_secs(8) {
        std::thread::sleep(Duration::from_millis(100));
        during = threads(pid);
    }
    assert!(fast(&during).len() >= 2, "GPU 2 split off: {during:?}");
    // A window of a second in which one tick-path thread is left and is never woken, looked
    // for until 44 s (a loaded machine may split the pool again: a call held off 25 ms is a
    // split too, and the next rejoin waits 20 s).
    std::thread::sleep(Duration::from_secs(12).saturating_sub(started.elapsed()));
    let mut before = threads(pid);
    let mut seen = Vec::new();
    let rejoined = loop {
        std::thread::sleep(Duration::from_secs(1));
        let now = threads(pid);
        let (a, b) = (fast(&before), fast(&now));
        seen.push(format!("{b:?}"));
        if b.len() == 1 && a == b {
            break true;
        }
        if started.elapsed() > Duration::from_secs(44) {
            break false;
        }
        before = now;
    };
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{err}");
    assert!(
        rejoined,
        "tick-path NVML threads, a second apart: {seen:#?}\n{err}"
    );
    let text = std::fs::read_to_string(&out).unwrap();
    let (h, rows) = csv_rows(&text);
    let gpu2: Vec<&Vec<String>> = rows.iter().filter(|r| col(&h, r, "index") == "2").collect();
    assert!(gpu2.len() >= 250, "GPU 2 rows: {}", gpu2.len());
    assert!(
        gpu2[gpu2.len() - 50..]
            .iter()
            .all(|r| col(&h, r, "state") == "ok" && !col(&h, r, "util").is_empty()),
        "GPU 2 answers again after the hang"
    );
}

/// A hang in one slow call only (the process list) leaves the fast path flowing: GPU 2 still
/// has utilization at every tick, and its state names the process-list call.
#[test]
fn a_hang_in_the_slow_path_keeps_the_fast_values() {
    let rec = common::sim(
        "healthy",
        &[
            "record",
            "--interval",
            "250ms",
            "--duration",
            "4s",
            "--process-interval",
            "1s",
        ],
        &[(
            "NVML_SIM_HANG",
            "gpu=2,at_s=0.5,function=nvmlDeviceGetComputeRunningProcesses*",
        )],
    );
    assert_eq!(rec.code, 0, "{}", rec.stderr);
    let (h, rows) = csv_rows(&rec.stdout);
    let gpu2: Vec<&Vec<String>> = rows.iter().filter(|r| col(&h, r, "index") == "2").collect();
    assert!(gpu2.len() >= 12, "{}", rec.stdout);
    for r in &gpu2 {
        assert!(!col(&h, r, "util").is_empty(), "{r:?}");
    }
    assert!(
        gpu2.iter()
            .any(|r| col(&h, r, "state") == "stalled:nvmlDeviceGetComputeRunningProcesses"),
        "{}",
        rec.stdout
    );
}

/// XIDs from both sources: the kernel line (nvml-sim's `NVML_SIM_KMSG` stands in for
/// `/dev/kmsg`) names the process that raised the XID, and the alert says so; an XID only in
/// the kernel log (event registration unsupported) still alerts; NVIDIA's recovery action
/// becomes the `recovery_action` label and the action the alert gives.
#[test]
fn kernel_log_xids_name_the_process_and_the_recovery_action_is_a_label() {
    let tmp = tempfile::tempdir().unwrap();
    let scenario = tmp.path().join("xids.toml");
    std::fs::write(
        &scenario,
        r#"name = "xids-kmsg"
[devices]
count = 3
[devices.metrics]
gpu_util_pct = 95
memory_used_mib = 60000
[[event]]
at_s = 3
gpu = 1
kind = "xid"
code = 31
pid = 4242
process_name = "python3"
[[event]]
at_s = 3
gpu = 0
kind = "recovery_action"
action = "node_reboot"
[[event]]
at_s = 3
gpu = 0
kind = "xid"
code = 154
kmsg = "none"
[[event]]
at_s = 3
gpu = 2
kind = "xid"
code = 43
nvml = false
kmsg = "quoted"
pid = 777
process_name = "worker"
"#,
    )
    .unwrap();
    let kmsg = tmp.path().join("kmsg");
    let hook = HttpReceiver::start();
    let cfg = webhook_config(tmp.path(), &hook.url("/hook"));
    let mut d = daemon(
        scenario.to_str().unwrap(),
        &cfg,
        &tmp.path().join("log"),
        &[("NVML_SIM_KMSG", kmsg.to_str().unwrap())],
    );
    let find = |gpu: &'static str| {
        let hook = &hook;
        move || {
            hook.accepted().into_iter().map(|r| r.json()).find(|b| {
                let l = &b["alerts"][0]["labels"];
                l["alertname"] == "xid_error" && l["gpu"] == gpu
            })
        }
    };
    let job = wait_until(T, "xid_error on GPU 1", find("1"));
    let a = &job["alerts"][0];
    let summary = a["annotations"]["summary"].as_str().unwrap();
    assert!(
        summary.contains("XID 31") && summary.contains("raised by pid 4242 (python3)"),
        "{summary}\n{}",
        d.log_text()
    );
    let reboot = wait_until(T, "xid_error on GPU 0", find("0"));
    let a = &reboot["alerts"][0];
    assert_eq!(a["labels"]["recovery_action"], "node_reboot", "{reboot}");
    let summary = a["annotations"]["summary"].as_str().unwrap();
    assert!(summary.contains("reboot the node"), "{summary}");
    let kernel_only = wait_until(T, "xid_error on GPU 2", find("2"));
    let summary = kernel_only["alerts"][0]["annotations"]["summary"]
        .as_str()
        .unwrap();
    assert!(
        summary.contains("XID 43") && summary.contains("raised by pid 777 (worker)"),
        "{summary}"
    );
    // One alert per GPU: NVML's event and the kernel line were merged, not announced twice.
    std::thread::sleep(Duration::from_secs(2));
    let xid_msgs = hook
        .accepted()
        .iter()
        .filter(|r| r.json()["alerts"][0]["labels"]["alertname"] == "xid_error")
        .count();
    assert_eq!(xid_msgs, 3, "{}", d.log_text());
    d.signal(libc::SIGTERM);
    assert!(d.wait(T).success(), "{}", d.log_text());
}

/// The XID ledger lives in the state directory: an XID 31 on a GPU that had one an hour ago
/// (before a restart or a reboot) is the second on that GPU and is suspected hardware; the
/// ledger the daemon leaves behind holds both.
#[test]
fn the_xid_ledger_survives_restarts_and_escalates_repeats() {
    let tmp = tempfile::tempdir().unwrap();
    let scenario = tmp.path().join("xid31.toml");
    std::fs::write(
        &scenario,
        "name = \"xid31\"\n[devices]\ncount = 2\n[[event]]\nat_s = 2\ngpu = 0\nkind = \"xid\"\ncode = 31\n",
    )
    .unwrap();
    let devs = common::sim(scenario.to_str().unwrap(), &["devices", "--json"], &[]).json();
    let uuid = devs["devices"][0]["uuid"]
        .as_str()
        .or_else(|| devs[0]["uuid"].as_str())
        .unwrap()
        .to_string();
    let state = tmp.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let hour_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        - 3_600_000;
    std::fs::write(
        state.join("alerts.json"),
        format!(
            r#"{{"version": 2, "saved_at_ms": {hour_ago}, "instances": [],
               "xid_ledger": [{{"uuid": "{uuid}", "gpu": 0, "time_ms": {hour_ago}, "code": 31}}]}}"#
        ),
    )
    .unwrap();
    let hook = HttpReceiver::start();
    let cfg = webhook_config(tmp.path(), &hook.url("/hook"));
    let mut d = daemon(
        scenario.to_str().unwrap(),
        &cfg,
        &tmp.path().join("log"),
        &[],
    );
    let got = wait_until(T, "xid_error", || {
        hook.accepted()
            .into_iter()
            .map(|r| r.json())
            .find(|b| b["alerts"][0]["labels"]["alertname"] == "xid_error")
    });
    let a = &got["alerts"][0];
    assert_eq!(
        a["labels"]["severity"],
        "critical",
        "{got}\n{}",
        d.log_text()
    );
    let summary = a["annotations"]["summary"].as_str().unwrap();
    assert!(summary.contains("2 times on this GPU in 24 h"), "{summary}");
    d.signal(libc::SIGTERM);
    assert!(d.wait(T).success(), "{}", d.log_text());
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("alerts.json")).unwrap()).unwrap();
    let ledger = saved["xid_ledger"].as_array().unwrap();
    assert_eq!(ledger.len(), 2, "{saved}");
    assert!(ledger
        .iter()
        .all(|e| e["uuid"] == uuid.as_str() && e["code"] == 31));
}
