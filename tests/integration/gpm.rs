//! Issue 26 §1: the GPM profiling metrics (SM active, tensor and DRAM activity, …) through the
//! real binary on nvml-sim — present on Hopper GPUs from the second sample on, absent (never 0)
//! on an A100, with GPM off, or while GPM fails (said in `status --json` and `doctor`); the
//! `launch-bound`, `no-tensor-cores` and `memory-bound` scenarios read as they should.

use serde_json::Value;

use crate::common::{col, csv_rows, gpuwatch, sim, sim_lib};
use gpuwatch::model::METRICS;

fn gpm_keys() -> impl Iterator<Item = &'static str> {
    METRICS.iter().filter(|d| d.source.is_gpm()).map(|d| d.key)
}

fn gpus(doc: &Value) -> &Vec<Value> {
    doc["gpus"].as_array().expect("gpus")
}

fn num(g: &Value, key: &str) -> f64 {
    g["metrics"][key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing in {g}"))
}

/// `status --json` of a shipped scenario at scenario time `start_s`.
fn status_at(scenario: &str, start_s: u32, extra: &[&str]) -> Value {
    let start = start_s.to_string();
    let mut args = extra.to_vec();
    args.extend(["status", "--json"]);
    sim(scenario, &args, &[("NVML_SIM_START_S", start.as_str())]).json()
}

fn write_scenario(dir: &std::path::Path, text: &str) -> String {
    let p = dir.join("gpm.toml");
    std::fs::write(&p, text).expect("scenario");
    p.display().to_string()
}

/// `launch-bound` from 60 s: utilization ~100 % while SM active is ~10 %, on every GPU, in
/// `status` and in a recording (absent at the first tick only, the same columns as the table).
#[test]
fn launch_bound_reads_busy_with_the_sms_idle() {
    let s = status_at("launch-bound", 120, &[]);
    assert_eq!(gpus(&s).len(), 8);
    for g in gpus(&s) {
        assert_eq!(g["gpm"]["state"], "active", "{g}");
        assert!(num(g, "util") >= 97.0, "{g}");
        let sm = num(g, "sm_active");
        assert!((7.0..=13.0).contains(&sm), "SM active {sm}");
        assert!(
            num(g, "tensor_active") < 3.0 && num(g, "dram_active") < 6.0,
            "{g}"
        );
        assert!(num(g, "gr_engine_active") >= 97.0, "{g}");
        assert!(
            num(g, "nvlink_tx_bytes") > 0.0 && num(g, "pcie_rx_bytes") > 0.0,
            "{g}"
        );
    }
    // the table shows SM active beside utilization
    let t = sim("launch-bound", &["status"], &[("NVML_SIM_START_S", "120")]);
    assert!(t.stdout.contains(" SM% "), "{}", t.stdout);
    let rec = sim(
        "launch-bound",
        &[
            "record",
            "--interval",
            "200ms",
            "--gpm-interval",
            "0s",
            "--duration",
            "1s",
        ],
        &[("NVML_SIM_START_S", "120")],
    );
    assert_eq!(rec.code, 0, "{}", rec.stderr);
    let (h, rows) = csv_rows(&rec.stdout);
    assert!(rows.len() >= 32, "{}", rec.stdout);
    for (i, r) in rows.iter().enumerate() {
        for key in gpm_keys() {
            let cell = col(&h, r, key);
            if i < 8 {
                assert_eq!(cell, "", "{key}: no previous sample at the first tick");
            } else {
                assert!(!cell.is_empty(), "{key} in row {i}: {r:?}");
            }
        }
        if i >= 8 {
            let sm: f64 = col(&h, r, "sm_active").parse().expect("number");
            assert!((6.0..=14.0).contains(&sm), "{sm}");
        }
    }
    // and it reads back through the importer with the same values
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = dir.path().join("rec.csv");
    std::fs::write(&csv, &rec.stdout).expect("write");
    let out = gpuwatch(&["import", csv.to_str().expect("utf-8")], &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let (h2, rows2) = csv_rows(&out.stdout);
    assert_eq!(rows2.len(), rows.len());
    assert_eq!(
        col(&h2, &rows2[20], "sm_active"),
        col(&h, &rows[20], "sm_active")
    );
}

/// `no-tensor-cores`: busy SMs, idle tensor pipes; `memory-bound`: DRAM near its peak.
#[test]
fn no_tensor_cores_and_memory_bound() {
    let s = status_at("no-tensor-cores", 60, &[]);
    for g in gpus(&s) {
        assert!(num(g, "sm_active") > 80.0, "{g}");
        assert!(
            num(g, "tensor_active") < 1.0 && num(g, "hmma_active") < 1.0,
            "{g}"
        );
        assert!(num(g, "fp32_active") > 40.0, "{g}");
    }
    let s = status_at("memory-bound", 60, &[]);
    for g in gpus(&s) {
        assert!(num(g, "dram_active") > 90.0 && num(g, "util") > 97.0, "{g}");
        assert!(num(g, "sm_active") < 55.0, "{g}");
    }
}

/// Before Hopper there is no GPM: every GPM column is absent — an empty cell, `null` — never 0,
/// and `status --json` says why; the Hopper GPU beside it has them.
#[test]
fn pre_hopper_gpm_columns_are_absent_not_zero() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_scenario(
        dir.path(),
        "[devices]\ncount = 2\n[devices.metrics]\ngpu_util_pct = 90\n\
         [[device]]\nindex = 0\nname = \"NVIDIA A100-SXM4-80GB\"\n",
    );
    sim_lib();
    let s = gpuwatch(&["--sim", &path, "status", "--json"], &[]).json();
    let (a100, h100) = (&gpus(&s)[0], &gpus(&s)[1]);
    assert_eq!(a100["name"], "NVIDIA A100-SXM4-80GB");
    assert_eq!(a100["gpm"]["state"], "unsupported", "{a100}");
    assert!(
        a100["gpm"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("Hopper")),
        "{a100}"
    );
    assert_eq!(h100["gpm"]["state"], "active", "{h100}");
    for key in gpm_keys() {
        assert_eq!(a100["metrics"][key], Value::Null, "{key}: {a100}");
        assert!(h100["metrics"][key].is_number(), "{key}: {h100}");
    }
    let rec = gpuwatch(
        &[
            "--sim",
            &path,
            "record",
            "--interval",
            "100ms",
            "--gpm-interval",
            "0s",
            "--duration",
            "550ms",
        ],
        &[],
    );
    assert_eq!(rec.code, 0, "{}", rec.stderr);
    let (h, rows) = csv_rows(&rec.stdout);
    assert!(rows.len() >= 8, "{}", rec.stdout);
    for r in rows.iter().filter(|r| col(&h, r, "index") == "0") {
        for key in gpm_keys() {
            assert_eq!(col(&h, r, key), "", "{key} on the A100: {r:?}");
        }
        assert!(!col(&h, r, "util").is_empty());
    }
    assert!(rows
        .iter()
        .skip(2)
        .filter(|r| col(&h, r, "index") == "1")
        .all(|r| !col(&h, r, "sm_active").is_empty()));
    // doctor: an A100 without GPM is not a finding
    let d = gpuwatch(&["--sim", &path, "doctor", "--json"], &[]).json();
    assert!(
        !d.to_string().contains("gpm"),
        "no GPM finding for an A100: {d}"
    );
}

/// GPM held by another client (the simulated driver answers IN_USE on GPU 1): absent there, the
/// other GPUs unaffected; `status --json` and `doctor` name the error.
#[test]
fn gpm_in_use_is_said_in_status_and_doctor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_scenario(
        dir.path(),
        "[devices]\ncount = 2\n[devices.metrics]\ngpu_util_pct = 90\n\
         [[fault]]\nfunction = \"nvmlGpmSampleGet\"\nerror = \"IN_USE\"\ngpus = [1]\n",
    );
    sim_lib();
    let s = gpuwatch(&["--sim", &path, "status", "--json"], &[]).json();
    let (ok, held) = (&gpus(&s)[0], &gpus(&s)[1]);
    assert_eq!(ok["gpm"]["state"], "active");
    assert_eq!(held["gpm"]["state"], "failing", "{held}");
    assert!(
        held["gpm"]["detail"]
            .as_str()
            .is_some_and(|d| d.to_lowercase().contains("in use")),
        "{held}"
    );
    assert_eq!(held["metrics"]["sm_active"], Value::Null);
    assert!(ok["metrics"]["sm_active"].is_number());
    let d = gpuwatch(&["--sim", &path, "doctor", "--json"], &[]);
    assert_eq!(d.code, 1, "a finding: {}", d.stdout);
    let findings: Value = serde_json::from_str(&d.stdout).expect("doctor --json");
    let f = findings
        .as_array()
        .expect("findings")
        .iter()
        .find(|f| f["check"] == "gpm_failing")
        .unwrap_or_else(|| panic!("no gpm_failing finding: {findings}"));
    assert_eq!(f["gpu"], 1);
    assert!(
        f["fix"].as_str().is_some_and(|x| x.contains("--no-gpm")),
        "{f}"
    );
}

/// `--no-gpm` and `[daemon] gpm = false`: no GPM call, the rows absent, `status` says `off`.
#[test]
fn gpm_can_be_turned_off() {
    let s = status_at("healthy", 10, &["--no-gpm"]);
    for g in gpus(&s) {
        assert_eq!(g["gpm"]["state"], "off", "{g}");
        for key in gpm_keys() {
            assert_eq!(g["metrics"][key], Value::Null, "{key}");
        }
    }
    let rec = sim(
        "healthy",
        &[
            "--no-gpm",
            "record",
            "--interval",
            "100ms",
            "--duration",
            "350ms",
        ],
        &[("NVML_SIM_DEBUG", "1")],
    );
    assert_eq!(rec.code, 0);
    assert!(!rec.stderr.contains("nvmlGpm"), "no GPM call is made");
    let (h, rows) = csv_rows(&rec.stdout);
    assert!(rows.iter().all(|r| col(&h, r, "sm_active").is_empty()));
    // the configuration key
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[daemon]\ngpm = false\nstate_dir = \"state\"\n").expect("config");
    let c = gpuwatch(
        &[
            "check",
            "--config",
            cfg.to_str().expect("utf-8"),
            "--rules",
            "rules",
        ],
        &[],
    );
    assert_eq!(c.code, 0, "{}{}", c.stdout, c.stderr);
    std::fs::write(&cfg, "[daemon]\ngpm = \"no\"\n").expect("config");
    let c = gpuwatch(&["check", "--config", cfg.to_str().expect("utf-8")], &[]);
    assert_ne!(c.code, 0);
    assert!(c.stderr.contains("c.toml:2:7:"), "{}", c.stderr);
}

/// Issue 26's check: the daemon on `launch-bound` (from its switch at 60 s) raises
/// `launch_bound` on every GPU — and not `low_utilization` (the GPU is not waiting for input).
#[test]
fn the_daemon_alerts_on_a_launch_bound_job() {
    use std::io::BufRead as _;
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    sim_lib();
    let mut child = crate::common::command(
        &[
            "--sim",
            "launch-bound",
            "--speed",
            "30",
            "--log-format",
            "json",
            "daemon",
        ],
        &[("NVML_SIM_START_S", "60")],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("gpuwatch");
    let err = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let firing = |lines: &[Value], name: &str| -> std::collections::BTreeSet<String> {
        lines
            .iter()
            .filter(|v| v["alert"] == name && v["status"] == "firing")
            .filter_map(|v| v["gpu"].as_str().map(str::to_string))
            .collect()
    };
    let start = Instant::now();
    let mut lines: Vec<Value> = Vec::new();
    let mut raw = Vec::new();
    // 5-min window and 2-min hold: ~7 simulated minutes, 14 s at 30×
    while start.elapsed() < Duration::from_secs(90) && firing(&lines, "launch_bound").len() < 8 {
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
            if let Ok(v) = serde_json::from_str::<Value>(&l) {
                lines.push(v);
            }
            raw.push(l);
        }
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    assert_eq!(
        firing(&lines, "launch_bound").len(),
        8,
        "launch_bound on every GPU:\n{}",
        raw.join("\n")
    );
    assert!(firing(&lines, "low_utilization").is_empty());
    let one = lines
        .iter()
        .find(|v| v["alert"] == "launch_bound")
        .expect("an alert record");
    assert!(
        one.to_string().contains("launch-bound"),
        "the summary names it: {one}"
    );
}

/// Issue 26's check: the report's diagnosis names each GPM pattern on its scenario's recording,
/// on every GPU — and nothing of the kind on `healthy`, nor on `nccl-hang` (100 % utilization
/// with ~12 % of the SMs active, but at near-idle power: a hang, not launch-bound).
#[test]
fn the_report_names_launch_bound_no_tensor_cores_and_memory_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (scenario, start, pattern) in [
        ("launch-bound", "90", Some("launch_bound")),
        ("no-tensor-cores", "30", Some("no_tensor_cores")),
        ("memory-bound", "30", Some("memory_bound")),
        ("healthy", "30", None),
        ("nccl-hang", "90", None),
    ] {
        let csv = dir.path().join(format!("{scenario}.csv"));
        let rec = sim(
            scenario,
            &[
                "record",
                "--interval",
                "200ms",
                "--duration",
                "4s",
                "--out",
                csv.to_str().expect("utf-8"),
            ],
            &[("NVML_SIM_START_S", start)],
        );
        assert_eq!(rec.code, 0, "{scenario}: {}", rec.stderr);
        let report = gpuwatch(&["report", "--json", csv.to_str().expect("utf-8")], &[]);
        assert_eq!(report.code, 0, "{scenario}: {}", report.stderr);
        let json = report.json();
        let found: Vec<(String, u64)> = json["findings"]
            .as_array()
            .expect("findings")
            .iter()
            .map(|f| {
                (
                    f["pattern"].as_str().unwrap_or("").to_string(),
                    f["gpu"].as_u64().unwrap_or(99),
                )
            })
            .collect();
        let gpm_patterns = ["launch_bound", "no_tensor_cores", "memory_bound"];
        for gpu in 0..8 {
            for p in gpm_patterns {
                let want = pattern == Some(p);
                assert_eq!(
                    found.contains(&(p.to_string(), gpu)),
                    want,
                    "{scenario}: {p} on GPU {gpu}: {found:?}"
                );
            }
        }
        if let Some(p) = pattern {
            let f = json["findings"]
                .as_array()
                .expect("findings")
                .iter()
                .find(|f| f["pattern"] == p)
                .expect("finding");
            assert!(
                f["evidence"].as_str().is_some_and(|e| e.contains("active")),
                "{f}"
            );
            // the text summary shows SM active beside utilization
            let text = gpuwatch(&["report", csv.to_str().expect("utf-8")], &[]);
            assert!(text.stdout.contains("SM active"), "{}", text.stdout);
        }
    }
}

/// `import` reads `dcgmi dmon -e …` logs: DCGM's profiling ratios become the GPM rows (in
/// percent), its bytes per second and device fields their rows; the report then diagnoses the
/// log like a recording (a launch-bound run here); MIG-instance rows are skipped.
#[test]
fn dcgmi_dmon_logs_import_and_report() {
    let mut log = String::new();
    for round in 0..120 {
        if round % 40 == 0 {
            log.push_str(
                "#Entity   GPUTL  GRACT  SMACT  SMOCC  TENSO  DRAMA  PCITX      NVLRX      POWER\n",
            );
            log.push_str("ID\n");
        }
        for gpu in 0..2 {
            log.push_str(&format!(
                "GPU {gpu}     100    0.993  0.107  0.021  0.012  0.031  81234567   N/A        231.450\n"
            ));
        }
        log.push_str(
            "GPU-I 21  N/A    0.000  0.000  0.000  0.000  0.000  0          0          N/A\n",
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("dcgmi.log");
    std::fs::write(&path, &log).expect("write");
    let p = path.to_str().expect("utf-8");
    let args = ["--t0", "2026-12-06T00:00:00Z", "--every", "1s"];
    let mut import = vec!["import", p];
    import.extend(args);
    let out = gpuwatch(&import, &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let (h, rows) = csv_rows(&out.stdout);
    assert_eq!(rows.len(), 240, "{}", out.stderr);
    let r = &rows[5];
    assert_eq!(col(&h, r, "util"), "100");
    let pct = |key: &str| -> f64 { col(&h, r, key).parse().expect("number") };
    assert!(
        (pct("sm_active") - 10.7).abs() < 1e-9,
        "ratio 0.107 → 10.7 %"
    );
    assert!((pct("gr_engine_active") - 99.3).abs() < 1e-9);
    assert_eq!(col(&h, r, "pcie_tx_bytes"), "81234567");
    assert_eq!(col(&h, r, "nvlink_rx_bytes"), "", "N/A is absent");
    assert_eq!(col(&h, r, "power"), "231.45");
    assert_eq!(
        col(&h, rows.last().expect("rows"), "timestamp"),
        "2026-12-06T00:01:59.000Z"
    );
    let mut report = vec!["report", "--json", p];
    report.extend(args);
    let rep = gpuwatch(&report, &[]);
    assert_eq!(rep.code, 0, "{}", rep.stderr);
    let found = rep.json()["findings"].to_string();
    assert!(found.contains("\"launch_bound\""), "{found}");
}

/// A GPM cadence slower than the tick (`record --gpm-interval`, `[daemon] gpm_interval`): one
/// sample per GPU per cadence (nvml-sim counts the calls), each tick between two samples shows
/// the last means, and the first means come with the second sample.
#[test]
fn gpm_is_sampled_at_its_own_cadence() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let counts = tmp.path().join("counts");
    let rec = sim(
        "launch-bound",
        &[
            "record",
            "--interval",
            "100ms",
            "--gpm-interval",
            "1s",
            "--duration",
            "3s",
        ],
        &[
            ("NVML_SIM_START_S", "120"),
            ("NVML_SIM_CALL_COUNTS", counts.to_str().expect("utf-8")),
        ],
    );
    assert_eq!(rec.code, 0, "{}", rec.stderr);
    let (h, rows) = csv_rows(&rec.stdout);
    let gpu0: Vec<&Vec<String>> = rows.iter().filter(|r| col(&h, r, "index") == "0").collect();
    assert!(gpu0.len() >= 25, "{}", rec.stdout);
    let sm: Vec<&str> = gpu0.iter().map(|r| col(&h, r, "sm_active")).collect();
    // absent until the second sample (about 1 s in), then at every tick
    assert!(sm[..5].iter().all(|c| c.is_empty()), "{sm:?}");
    assert!(sm[15..].iter().all(|c| !c.is_empty()), "{sm:?}");
    // the same means between two samples: a few distinct values, not one per tick
    let distinct: std::collections::BTreeSet<&str> =
        sm.iter().copied().filter(|c| !c.is_empty()).collect();
    assert!(distinct.len() <= 4, "{distinct:?}");
    let text = std::fs::read_to_string(&counts).expect("call counts");
    let samples: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("nvmlGpmSampleGet ")?.parse().ok())
        .unwrap_or(0);
    // 8 GPUs × (the first sample + one a second): about 32, not 8 × 30
    assert!((8 * 3..=8 * 5).contains(&samples), "{samples}\n{text}");
}
