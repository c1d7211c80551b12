//! Missing GPUs and the preflight (issue 12 §4) end to end on nvml-sim: `doctor` is clean on
//! `healthy` and reports every finding of `tests/fixtures/sim/doctor-findings.toml`;
//! `run --preflight` refuses to start a job with findings (and starts it with `=warn`); a GPU
//! hidden from NVML but on the fake PCI bus (`NVML_SIM_SYSFS`), or seen at an earlier start
//! (`state_dir/gpus.json`), makes the daemon notify `gpu_missing`; `status` lists it.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common;
use crate::daemon::{daemon, webhook_config};
use crate::notify::servers::HttpReceiver;

const T: Duration = Duration::from_secs(60);

fn fixture() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sim/doctor-findings.toml")
        .display()
        .to_string()
}

#[test]
fn doctor_is_clean_on_healthy() {
    // the training job this test's own (the client's parent, same user): nothing to report
    let tmp = tempfile::tempdir().unwrap();
    let own = common::scenario_with_parent("healthy", tmp.path());
    let own = own.to_str().unwrap();
    let run = common::sim(own, &["doctor"], &[]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert_eq!(run.stdout, "no findings\n");
    let json = common::sim(own, &["doctor", "--json"], &[]).json();
    assert_eq!(json, serde_json::json!([]));
    // as shipped, a training job of no host PID (someone else's) holds every GPU
    let run = common::sim("healthy", &["doctor", "--json"], &[]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let json: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    let found = json.as_array().unwrap();
    assert_eq!(found.len(), 8, "{json}");
    assert!(
        found.iter().all(|f| f["check"] == "foreign_process"
            && f["message"]
                .as_str()
                .is_some_and(|m| m.contains("(an unknown user, python train.py)"))),
        "{json}"
    );
}

#[test]
fn doctor_reports_every_injected_finding() {
    let tmp = tempfile::tempdir().unwrap();
    let sysfs = tmp.path().display().to_string();
    let env = [("NVML_SIM_SYSFS", sysfs.as_str())];
    let text = common::sim(&fixture(), &["doctor"], &env);
    assert_eq!(text.code, 1, "{}{}", text.stdout, text.stderr);
    let json = common::sim(&fixture(), &["doctor", "--json"], &env);
    assert_eq!(json.code, 1, "{}", json.stderr);
    let list: Vec<serde_json::Value> = serde_json::from_str(&json.stdout).unwrap();
    let found: Vec<(Option<u64>, &str)> = list
        .iter()
        .map(|f| (f["gpu"].as_u64(), f["check"].as_str().unwrap()))
        .collect();
    // NVML indexes: scenario GPU 10 is hidden, so scenario 11/12 are NVML 10/11.
    assert_eq!(
        found,
        [
            (Some(0), "pcie_link_gen"),
            (Some(1), "pcie_link_width"),
            (Some(2), "persistence_mode"),
            (Some(3), "pending_repair"),
            (Some(4), "recovery_action"),
            (Some(5), "power_limit"),
            (Some(6), "applications_clocks"),
            (Some(7), "locked_clocks"),
            (Some(8), "ecc_disabled"),
            (Some(9), "foreign_process"),
            (Some(10), "pending_repair"),
            (Some(11), "pcie_link_gen"),
            (None, "gpu_missing"),
        ],
        "{}",
        json.stdout
    );
    for f in &list {
        for key in ["pci_bus_id", "severity", "message", "fix"] {
            assert!(f[key].is_string(), "{key} in {f}");
        }
    }
    assert_eq!(list[12]["pci_bus_id"], "00000000:C1:00.0");
    assert_eq!(list[12]["severity"], "critical");
    // One line per finding (each naming what to do), then the count.
    let lines: Vec<&str> = text.stdout.lines().collect();
    assert_eq!(lines.len(), 14, "{}", text.stdout);
    assert_eq!(lines[13], "13 findings");
    assert!(
        lines[2].starts_with("GPU 2 (00000000:3A:00.0): persistence mode is off")
            && lines[2].contains("nvidia-smi -pm 1"),
        "{}",
        lines[2]
    );
    assert!(
        lines[9].contains("pid 1 ") && lines[9].contains("20480 MiB"),
        "{}",
        lines[9]
    );
    // CUDA_VISIBLE_DEVICES leaves the foreign process on GPU 9 out of the job's GPUs.
    let env2 = [
        ("NVML_SIM_SYSFS", sysfs.as_str()),
        ("CUDA_VISIBLE_DEVICES", "0,1"),
    ];
    let narrowed = common::sim(&fixture(), &["doctor"], &env2);
    assert!(!narrowed.stdout.contains("pid 1 "), "{}", narrowed.stdout);
}

#[test]
fn run_preflight_refuses_a_job_with_findings_unless_warn() {
    let tmp = tempfile::tempdir().unwrap();
    let sysfs = tmp.path().join("sys").display().to_string();
    let marker = tmp.path().join("started");
    let cmd = format!("touch {}", marker.display());
    let env = [
        ("NVML_SIM_SYSFS", sysfs.as_str()),
        ("HOME", tmp.path().to_str().unwrap()),
    ];
    let fx = fixture();
    let refused = common::sim(
        &fx,
        &["run", "--no-rules", "--preflight", "--", "sh", "-c", &cmd],
        &env,
    );
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(!marker.exists(), "the job must not start");
    assert!(
        refused
            .stderr
            .contains("gpuwatch: preflight: GPU 2 (00000000:3A:00.0): persistence mode is off")
            && refused.stderr.contains("gpuwatch: preflight: 13 findings")
            && refused.stderr.contains("not starting the job"),
        "{}",
        refused.stderr
    );
    let warned = common::sim(
        &fx,
        &[
            "run",
            "--no-rules",
            "--preflight=warn",
            "--",
            "sh",
            "-c",
            &cmd,
        ],
        &env,
    );
    assert_eq!(warned.code, 0, "{}", warned.stderr);
    assert!(marker.exists(), "--preflight=warn starts the job");
    assert!(warned.stderr.contains("13 findings"), "{}", warned.stderr);
    // (A fresh fake sysfs: the one above still lists the fixture's 15 GPUs.)
    let fresh = tmp.path().join("sys2").display().to_string();
    // healthy GPUs whose training job is this test's own (the same user): nothing to report
    let own = common::scenario_with_parent("healthy", tmp.path());
    let clean = common::sim(
        own.to_str().unwrap(),
        &["run", "--no-rules", "--preflight", "--", "true"],
        &[
            ("NVML_SIM_SYSFS", fresh.as_str()),
            ("HOME", tmp.path().to_str().unwrap()),
        ],
    );
    assert_eq!(clean.code, 0, "{}", clean.stderr);
    assert!(
        clean.stderr.contains("gpuwatch: preflight: no findings"),
        "{}",
        clean.stderr
    );
}

/// Starts the daemon on `healthy` with `env`, waits for the `gpu_missing` webhook and returns
/// its alert and the daemon's log.
fn gpu_missing_alert(dir: &Path, env: &[(&str, &str)]) -> (serde_json::Value, String) {
    let hook = HttpReceiver::start();
    let cfg = webhook_config(dir, &hook.url("/hook"));
    let mut d = daemon("healthy", &cfg, &dir.join("log"), env);
    let got = hook.wait_accepted(1, T);
    let alert = got[0].json()["alerts"][0].clone();
    d.signal(libc::SIGTERM);
    assert!(d.wait(T).success(), "{}", d.log_text());
    (alert, d.log_text())
}

#[test]
fn a_gpu_on_the_bus_but_hidden_from_nvml_raises_gpu_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let sysfs = tmp.path().join("sys").display().to_string();
    let env = [("NVML_SIM_SYSFS", sysfs.as_str()), ("NVML_SIM_HIDE", "2")];
    let (a, log) = gpu_missing_alert(tmp.path(), &env);
    assert_eq!(a["labels"]["alertname"], "gpu_missing", "{a}\n{log}");
    assert_eq!(a["labels"]["severity"], "critical");
    let summary = a["annotations"]["summary"].as_str().unwrap();
    assert!(
        summary.contains("1 GPU missing on simhost: 00000000:3A:00.0: on the PCI bus"),
        "{summary}"
    );
    assert_eq!(a["annotations"]["pci_bus_ids"], "00000000:3A:00.0");
    assert!(log.contains("GPU missing: 00000000:3A:00.0"), "{log}");
    // status shows it too.
    let status = common::sim("healthy", &["status", "--json"], &env).json();
    assert_eq!(status["gpus"].as_array().unwrap().len(), 7);
    assert_eq!(status["missing"][0]["pci_bus_id"], "00000000:3A:00.0");
    assert_eq!(status["missing"][0]["why"], "on_bus");
}

#[test]
fn a_gpu_seen_at_an_earlier_start_and_hidden_now_raises_gpu_missing() {
    let tmp = tempfile::tempdir().unwrap();
    // First start: every GPU answers and is recorded (no channels, same state_dir).
    let first = tmp.path().join("first.toml");
    std::fs::write(&first, "[daemon]\nstate_dir = \"state\"\n").unwrap();
    let run = common::sim(
        "healthy",
        &[
            "run",
            "--config",
            first.to_str().unwrap(),
            "--quiet",
            "--",
            "true",
        ],
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let recorded: Vec<PathBuf> = std::fs::read_dir(tmp.path().join("state"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("gpus.")
        })
        .collect();
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    let history: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&recorded[0]).unwrap()).unwrap();
    assert_eq!(history["gpus"].as_array().unwrap().len(), 8, "{history}");
    let uuid2 = history["gpus"][2]["uuid"].as_str().unwrap().to_string();
    // Now GPU 2 is gone from NVML and there is no bus to read: only the history knows it.
    let (a, log) = gpu_missing_alert(tmp.path(), &[("NVML_SIM_HIDE", "2")]);
    assert_eq!(a["labels"]["alertname"], "gpu_missing", "{a}\n{log}");
    let summary = a["annotations"]["summary"].as_str().unwrap();
    assert!(
        summary.contains("00000000:3A:00.0")
            && summary.contains(&uuid2)
            && summary.contains("seen at an earlier start"),
        "{summary}"
    );
    // It stays expected: still in the history after this start.
    let again: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&recorded[0]).unwrap()).unwrap();
    assert_eq!(again["gpus"].as_array().unwrap().len(), 8);
}

/// The `foreign_process` findings of `doctor --json` on the `mig` scenario with
/// `CUDA_VISIBLE_DEVICES` set to `visible` (unset when `None`).
fn mig_foreign(visible: Option<&str>) -> Vec<serde_json::Value> {
    let env: Vec<(&str, &str)> = visible
        .map(|v| ("CUDA_VISIBLE_DEVICES", v))
        .into_iter()
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let own = common::scenario_with_parent("mig", tmp.path());
    let run = common::sim(own.to_str().unwrap(), &["doctor", "--json"], &env);
    let list: Vec<serde_json::Value> = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", run.stdout, run.stderr));
    list.into_iter()
        .filter(|f| f["check"] == "foreign_process")
        .collect()
}

/// `CUDA_VISIBLE_DEVICES=MIG-…` gives the job one MIG device: doctor looks for foreign processes
/// on it only (read as `gpuwatch devices` reads the variable, the legacy form too) and names it.
/// The `mig` scenario with its training ranks made this test's process: the A100 has this
/// test's process on its first 1g.10gb and processes of no host PID (foreign) on the six others.
#[test]
fn doctor_checks_only_the_mig_device_cuda_visible_devices_names() {
    let devices = common::sim("mig", &["devices", "--json"], &[]).json();
    let a100 = &devices["devices"][0];
    let uuid = |k: usize| a100["mig"][k]["uuid"].as_str().unwrap().to_string();
    // the whole machine: the A100's six foreign processes and the H100's one
    let all = mig_foreign(None);
    assert_eq!(all.len(), 7, "{all:?}");
    assert!(all.iter().all(|f| f.get("mig").is_none()), "{all:?}");
    // this test's own MIG device: the processes on the six others are not the job's concern
    assert_eq!(mig_foreign(Some(&uuid(0))), Vec::<serde_json::Value>::new());
    // a MIG device with another's process on it: that one, named with its MIG device
    let legacy = a100["mig"][1]["legacy_id"].as_str().unwrap().to_string();
    for spec in [uuid(1), legacy] {
        let f = mig_foreign(Some(&spec));
        assert_eq!(f.len(), 1, "{spec}: {f:?}");
        assert_eq!(f[0]["gpu"], 0);
        assert_eq!(f[0]["mig"], "MIG 1g.10gb 0/8/0", "{spec}");
        let message = f[0]["message"].as_str().unwrap();
        assert!(
            message.starts_with("pid 4194401 ")
                && message.contains("of its 9728 MiB on this MIG device")
                && message.contains(&uuid(1)),
            "{message}"
        );
    }
    let text = common::sim("mig", &["doctor"], &[("CUDA_VISIBLE_DEVICES", &uuid(1))]);
    assert_eq!(text.code, 1, "{}{}", text.stdout, text.stderr);
    let line = text
        .stdout
        .lines()
        .find(|l| l.contains("pid 4194401"))
        .unwrap_or_else(|| panic!("{}", text.stdout));
    assert!(
        line.starts_with("GPU 0 (") && line.contains(") MIG 1g.10gb 0/8/0: pid 4194401 "),
        "{line}"
    );
    assert!(
        !text.stdout.contains("pid 4194402"),
        "another MIG device's: {}",
        text.stdout
    );
}
