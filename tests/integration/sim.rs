//! `status`, `devices` and `record` against the simulated NVML library, through the real
//! nvml-wrapper code path: every shipped scenario, faults (lost GPU, NOT_SUPPORTED), a malformed
//! scenario, a missing library, the CUDA_VISIBLE_DEVICES mapping, rotation and SIGTERM.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{self, col, csv_rows, sim};

const METRIC_KEYS: usize = gpuwatch::model::METRIC_COUNT;

fn gpus(doc: &Value) -> &Vec<Value> {
    doc["gpus"].as_array().expect("gpus array")
}

/// Checks the three commands on one scenario and returns `status --json`.
fn check_scenario(name: &str) -> Value {
    let status = sim(name, &["status", "--json"], &[]).json();
    let list = gpus(&status);
    assert!(!list.is_empty(), "{name}: no GPUs");
    for (i, g) in list.iter().enumerate() {
        assert_eq!(g["index"], i, "{name}: indices in order");
        assert!(
            g["uuid"].as_str().is_some_and(|u| u.starts_with("GPU-")),
            "{name}: {g}"
        );
        assert!(!g["name"].as_str().unwrap_or("").is_empty(), "{name}: {g}");
        assert!(g["processes"].is_array());
        if g["state"] == "ok" {
            let total = g["metrics"]["mem_total"].as_u64().expect("memory total");
            let used = g["metrics"]["mem_used"].as_u64().expect("memory used");
            assert!(total > 1 << 30 && used <= total, "{name}: {g}");
            let util = g["metrics"]["util"].as_f64().expect("util");
            assert!((0.0..=100.0).contains(&util), "{name}: {g}");
        }
        assert_eq!(
            g["metrics"].as_object().map(serde_json::Map::len),
            Some(METRIC_KEYS)
        );
    }
    // The table prints every GPU.
    let table = sim(name, &["status"], &[]);
    assert_eq!(table.code, 0, "{name}: {}", table.stderr);
    for g in list {
        assert!(
            table.stdout.contains(g["name"].as_str().unwrap_or("?")),
            "{}",
            table.stdout
        );
    }

    let devices = sim(name, &["devices", "--json"], &[]).json();
    let devs = devices["devices"].as_array().expect("devices array");
    assert_eq!(devs.len(), list.len());
    for (d, g) in devs.iter().zip(list) {
        assert_eq!(d["uuid"], g["uuid"]);
        assert_eq!(d["pci_bus_id"], g["pci_bus_id"]);
        assert!(d["device_path"]
            .as_str()
            .is_some_and(|p| p.starts_with("/dev/nvidia")));
    }
    let text = sim(name, &["devices"], &[]);
    assert_eq!(text.code, 0);
    assert!(text.stdout.contains("/dev/nvidia"), "{}", text.stdout);

    let rec = sim(
        name,
        &["record", "--interval", "100ms", "--duration", "450ms"],
        &[],
    );
    assert_eq!(rec.code, 0, "{name}: {}", rec.stderr);
    let (header, rows) = csv_rows(&rec.stdout);
    assert_eq!(header.len(), 7 + METRIC_KEYS + 2);
    assert_eq!(rows.len() % list.len(), 0, "{name}: whole ticks only");
    let ticks = rows.len() / list.len();
    assert!(
        (3..=5).contains(&ticks),
        "{name}: {ticks} ticks in 450 ms at 100 ms"
    );
    for tick in rows.chunks(list.len()) {
        let ts = col(&header, &tick[0], "timestamp");
        assert!(tick.iter().all(|r| col(&header, r, "timestamp") == ts));
        assert!(ts.ends_with('Z') && ts.len() == 24, "{ts}");
    }
    status
}

fn ok_gpus(doc: &Value) -> impl Iterator<Item = &Value> {
    gpus(doc).iter().filter(|g| g["state"] == "ok")
}

/// A metric of one GPU of `status --json`, by its table key.
fn num(g: &Value, key: &str) -> f64 {
    g["metrics"][key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing in {g}"))
}

/// `status --json` with the scenario clock frozen at `start_s`.
fn status_at(name: &str, start_s: u32) -> Value {
    let start = start_s.to_string();
    sim(
        name,
        &["status", "--json"],
        &[("NVML_SIM_TIME_SCALE", "0"), ("NVML_SIM_START_S", &start)],
    )
    .json()
}

fn gpu(doc: &Value, i: usize) -> &Value {
    &gpus(doc)[i]
}

fn mib(g: &Value, key: &str) -> f64 {
    num(g, key) / 1_048_576.0
}

fn reasons(g: &Value) -> Vec<String> {
    g["clock_event_reason_names"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn healthy() {
    let s = check_scenario("healthy");
    assert_eq!(gpus(&s).len(), 8);
    assert_eq!(ok_gpus(&s).count(), 8);
    for g in ok_gpus(&s) {
        assert!(num(g, "util") >= 90.0, "{g}");
        assert!((61_500.0..62_500.0).contains(&mib(g, "mem_used")), "{g}");
        assert_eq!(mib(g, "mem_total"), 81_559.0);
        assert_eq!(g["metrics"]["ecc_uncorrected"], 0, "{g}");
        assert_eq!(g["metrics"]["clock_event_reasons"], 0, "{g}");
        assert_eq!(g["metrics"]["fan"], Value::Null, "no fans: absent, not 0");
        assert_eq!(g["metrics"]["power_limit"], 700);
        assert!(g["metrics"]["energy"].as_f64().is_some_and(|e| e > 0.0));
        assert_eq!(g["processes"].as_array().map(Vec::len), Some(1));
    }
}

#[test]
fn dataloader_stall() {
    check_scenario("dataloader-stall");
    let busy = status_at("dataloader-stall", 1);
    let idle = sim(
        "dataloader-stall",
        &["status", "--json"],
        &[("NVML_SIM_TIME_SCALE", "0"), ("NVML_SIM_START_S", "2.5")],
    )
    .json();
    for i in 0..8 {
        assert_eq!(gpu(&busy, i)["metrics"]["util"], 68);
        assert_eq!(gpu(&idle, i)["metrics"]["util"], 0);
        assert!(reasons(gpu(&idle, i)).contains(&"gpu_idle".to_string()));
    }
}

#[test]
fn memory_leak() {
    check_scenario("memory-leak");
    let early = mib(gpu(&status_at("memory-leak", 60), 0), "mem_used");
    let late = mib(gpu(&status_at("memory-leak", 660), 0), "mem_used");
    // 100 MB per minute = 95.37 MiB per minute.
    assert!((late - early - 953.7).abs() < 2.0, "{early} → {late}");
}

#[test]
fn oom() {
    check_scenario("oom");
    let s = status_at("oom", 50);
    let g0 = gpu(&s, 0);
    assert_eq!(g0["metrics"]["mem_free"], 0, "{g0}");
    assert_eq!(
        num(g0, "mem_used") + num(g0, "mem_reserved"),
        num(g0, "mem_total")
    );
    assert!(mib(gpu(&s, 1), "mem_used") < 63_000.0);
    let before = status_at("oom", 40);
    assert!(num(gpu(&before, 0), "mem_free") > 1e9);
}

#[test]
fn small_batch() {
    let s = check_scenario("small-batch");
    for g in ok_gpus(&s) {
        assert!((mib(g, "mem_used") - 6144.0).abs() <= 41.0, "{g}");
        assert!(num(g, "util") <= 31.0, "{g}");
    }
}

#[test]
fn thermal_throttle() {
    check_scenario("thermal-throttle");
    let s = status_at("thermal-throttle", 120);
    let g4 = gpu(&s, 4);
    assert!(num(g4, "temp") >= 87.0, "{g4}");
    assert_eq!(g4["metrics"]["clock_event_reasons"], 0x60);
    assert_eq!(reasons(g4), ["sw_thermal", "hw_thermal"]);
    assert!(g4["metrics"]["sm_clock"].as_f64() < Some(1300.0), "{g4}");
    assert_eq!(gpu(&s, 3)["metrics"]["clock_event_reasons"], 0);
    let table = sim(
        "thermal-throttle",
        &["status"],
        &[("NVML_SIM_TIME_SCALE", "0"), ("NVML_SIM_START_S", "120")],
    );
    assert!(
        table.stdout.contains("sw_thermal,hw_thermal"),
        "{}",
        table.stdout
    );
}

#[test]
fn power_anomaly() {
    check_scenario("power-anomaly");
    let spike = status_at("power-anomaly", 22);
    let g2 = gpu(&spike, 2);
    assert!(num(g2, "power") > 700.0, "{g2}");
    assert!(reasons(g2).contains(&"sw_power_cap".to_string()));
    let later = status_at("power-anomaly", 100);
    let g5 = gpu(&later, 5);
    assert!(num(g5, "power") < 80.0 && num(g5, "util") > 90.0, "{g5}");
}

#[test]
fn ecc_errors() {
    check_scenario("ecc-errors");
    let s = status_at("ecc-errors", 130);
    let g2 = gpu(&s, 2);
    assert_eq!(g2["metrics"]["ecc_corrected"], 10, "{g2}");
    assert_eq!(g2["metrics"]["ecc_uncorrected"], 1);
    assert_eq!(g2["metrics"]["remapped_uncorrectable"], 1);
    assert_eq!(g2["metrics"]["remap_pending"], 1);
    assert_eq!(g2["metrics"]["remap_failure"], 0);
    // H100s remap rows: page retirement is absent, not 0.
    assert_eq!(g2["metrics"]["retired_sbe"], Value::Null);
    assert_eq!(gpu(&s, 1)["metrics"]["ecc_corrected"], 0);
    // XID 94 at 60 s reaches a recording that was running then.
    let rec = sim(
        "ecc-errors",
        &["record", "--interval", "100ms", "--duration", "1500ms"],
        &[("NVML_SIM_TIME_SCALE", "60")],
    );
    let (h, rows) = csv_rows(&rec.stdout);
    let xids: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (col(&h, r, "index"), col(&h, r, "xids")))
        .filter(|(_, x)| !x.is_empty())
        .collect();
    assert_eq!(xids, [("2", "94")], "{}", rec.stderr);
}

#[test]
fn nccl_hang() {
    check_scenario("nccl-hang");
    let s = status_at("nccl-hang", 90);
    for g in ok_gpus(&s) {
        assert_eq!(g["metrics"]["util"], 100);
        assert!(num(g, "power") < 100.0, "{g}");
    }
}

#[test]
fn overnight() {
    let s = check_scenario("overnight");
    assert_eq!(gpus(&s).len(), 8);
    let late = status_at("overnight", 700);
    let states: Vec<&str> = gpus(&late)
        .iter()
        .map(|g| g["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["ok", "ok", "ok", "ok", "ok", "lost", "ok", "ok"]);
    assert_eq!(gpu(&late, 5)["metrics"]["util"], Value::Null);
    assert_eq!(gpu(&late, 6)["metrics"]["util"], 0);
    assert_eq!(reasons(gpu(&late, 3)), ["sw_thermal", "hw_thermal"]);
    assert_eq!(gpu(&late, 4)["metrics"]["ecc_uncorrected"], 1);
}

#[test]
fn xid_79_leaves_the_other_gpus_sampled() {
    check_scenario("xid-79");
    // Play the scenario fast enough to get past the XID within the recording.
    let rec = sim(
        "xid-79",
        &["record", "--interval", "100ms", "--duration", "4s"],
        &[("NVML_SIM_TIME_SCALE", "600")],
    );
    assert_eq!(rec.code, 0, "{}", rec.stderr);
    let (h, rows) = csv_rows(&rec.stdout);
    let n_gpus = rows
        .iter()
        .map(|r| col(&h, r, "index").to_string())
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let last_tick = &rows[rows.len() - n_gpus..];
    let lost: Vec<&Vec<String>> = last_tick
        .iter()
        .filter(|r| col(&h, r, "state") == "lost")
        .collect();
    assert_eq!(
        lost.len(),
        1,
        "exactly one GPU lost at the end:\n{}",
        rec.stdout
    );
    assert_eq!(
        n_gpus - 1,
        last_tick
            .iter()
            .filter(|r| col(&h, r, "state") == "ok")
            .count()
    );
    let lost_index = col(&h, lost[0], "index").to_string();
    // The lost GPU's values are empty, not 0; the others still have values.
    for key in ["util", "mem_used", "temp", "power"] {
        assert_eq!(col(&h, lost[0], key), "", "{key} of a lost GPU");
    }
    for r in last_tick.iter().filter(|r| col(&h, r, "state") == "ok") {
        assert!(
            !col(&h, r, "util").is_empty() && !col(&h, r, "mem_used").is_empty(),
            "{r:?}"
        );
    }
    // XID 79 was recorded on that GPU, once.
    let xids: Vec<&str> = rows
        .iter()
        .filter(|r| col(&h, r, "index") == lost_index)
        .map(|r| col(&h, r, "xids"))
        .filter(|x| !x.is_empty())
        .collect();
    assert!(
        xids.iter().any(|x| x.split(';').any(|c| c == "79")),
        "xids: {xids:?}"
    );
    // Identity stays on the lost GPU's rows.
    assert!(col(&h, lost[0], "uuid").starts_with("GPU-"));
}

fn write_scenario(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write scenario");
    p.display().to_string()
}

#[test]
fn malformed_scenario_is_one_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_scenario(
        dir.path(),
        "bad.toml",
        "name = \"bad\"\n[devices]\ncount = 2\nmemory_total_mib = \"lots\"\n",
    );
    for args in [
        &["status"][..],
        &["record", "--duration", "1s"],
        &["devices"],
    ] {
        let run = sim(&path, args, &[]);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(run.stdout.is_empty(), "{}", run.stdout);
        assert!(
            run.stderr.contains(&format!("{path}:4:")),
            "names file:line:col:\n{}",
            run.stderr
        );
        let ours: Vec<&str> = run
            .stderr
            .lines()
            .filter(|l| l.starts_with("gpuwatch:"))
            .collect();
        assert_eq!(ours.len(), 1, "{}", run.stderr);
        assert!(ours[0].contains("scenario"), "{}", ours[0]);
        assert!(run.stderr.lines().count() <= 3, "short: {}", run.stderr);
    }
}

#[test]
fn missing_library_is_one_clear_error() {
    for args in [&["status"][..], &["devices", "--json"], &["record"]] {
        let mut all = vec!["--nvml-lib", "/nonexistent/libnvidia-ml.so.1"];
        all.extend_from_slice(args);
        let run = common::gpuwatch(&all, &[]);
        assert_eq!(run.code, 2, "{}", run.stderr);
        assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
        assert!(run.stderr.contains("NVML not found"), "{}", run.stderr);
        assert!(run.stderr.contains("--sim overnight"), "{}", run.stderr);
        assert!(run.stdout.is_empty());
    }
    // The environment variable works like the option.
    let run = common::gpuwatch(
        &["status"],
        &[("GPUWATCH_NVML_LIB", "/nonexistent/libnvidia-ml.so.1")],
    );
    assert_eq!(run.code, 2);
}

#[test]
fn not_supported_is_an_empty_cell_not_zero() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_scenario(
        dir.path(),
        "faults.toml",
        r#"name = "faults"
[devices]
count = 2
name = "NVIDIA H100 80GB HBM3"
memory_total_mib = 81559
[devices.metrics]
gpu_util_pct = 50
temperature_c = 60
power_w = 300

[[fault]]
function = "nvmlDeviceGetTemperature"
error = "NOT_SUPPORTED"
gpus = [1]

[[fault]]
function = "nvmlDeviceGetPowerUsage"
error = "NOT_SUPPORTED"

[[fault]]
function = "nvmlDeviceGetFieldValues"
error = "NOT_SUPPORTED"
gpus = [1]
"#,
    );
    let s = sim(&path, &["status", "--json"], &[]).json();
    let g = gpus(&s);
    assert_eq!(g[0]["metrics"]["temp"], 60);
    assert_eq!(g[1]["metrics"]["temp"], Value::Null);
    assert_eq!(g[0]["metrics"]["power"], Value::Null);
    assert_eq!(g[1]["metrics"]["util"], 50);
    // Without field values, counters come from their dedicated calls; field-only metrics are
    // absent.
    for key in ["energy", "ecc_corrected", "ecc_uncorrected", "pcie_replay"] {
        assert!(g[0]["metrics"][key].is_number(), "{key}: {}", g[0]);
        assert!(g[1]["metrics"][key].is_number(), "{key}: {}", g[1]);
    }
    assert!(
        g[1]["metrics"]["energy"].as_f64() > Some(1e6),
        "joules, not millijoules"
    );
    assert!(g[0]["metrics"]["mem_temp"].is_number());
    assert_eq!(g[1]["metrics"]["mem_temp"], Value::Null);
    assert_eq!(g[1]["metrics"]["remapped_correctable"], Value::Null);
    let table = sim(&path, &["status"], &[]).stdout;
    assert!(table.contains("n/a"), "{table}");

    let rec = sim(
        &path,
        &["record", "--interval", "100ms", "--duration", "350ms"],
        &[],
    );
    let (h, rows) = csv_rows(&rec.stdout);
    assert!(rows.len() >= 4);
    for r in &rows {
        assert_eq!(col(&h, r, "power"), "");
        assert_eq!(col(&h, r, "util"), "50");
        assert_eq!(col(&h, r, "state"), "ok");
    }
    assert_eq!(col(&h, &rows[0], "temp"), "60");
    assert_eq!(col(&h, &rows[1], "temp"), "");
}

/// Two GPUs that support every metric between them: fans, video engines, GPU 0 remaps rows
/// (Ampere and later), GPU 1 retires pages (pre-Ampere).
const EVERY_METRIC: &str = r#"name = "every-metric"
[devices]
count = 2
num_fans = 2
recovery_action = "none"
[devices.metrics]
gpu_util_pct = 50
encoder_util_pct = 10
decoder_util_pct = 20
[[device]]
index = 1
memory_repair = "page_retirement"
"#;

/// Metrics that only one memory-repair family has: `(key, GPU of EVERY_METRIC that has it)`.
fn repair_family(key: &str) -> Option<usize> {
    if key.starts_with("remap") {
        Some(0)
    } else if key.starts_with("retired_") {
        Some(1)
    } else {
        None
    }
}

/// The metric table drives the sampler: every row whose source is NVML gets a value at every
/// tick on a GPU that supports it (a new row without a reader would be a permanently empty
/// column), under its table key in `status --json` and in the recording.
#[test]
fn every_nvml_metric_gets_a_value() {
    use gpuwatch::model::METRICS;
    let dir = tempfile::tempdir().unwrap();
    let path = write_scenario(dir.path(), "every.toml", EVERY_METRIC);
    let s = sim(&path, &["status", "--json"], &[]).json();
    let g = gpus(&s);
    assert_eq!(g.len(), 2);
    // A rate needs two readings of its counter at least half a second apart (the slow path
    // reads the PCIe counters every 6 process intervals: 1.2 s here): rows from 1.5 s on have it.
    let rec = sim(
        &path,
        &[
            "record",
            "--interval",
            "250ms",
            "--gpm-interval",
            "0s",
            "--duration",
            "2s",
            "--process-interval",
            "200ms",
        ],
        &[],
    );
    assert_eq!(rec.code, 0, "{}", rec.stderr);
    let (h, rows) = csv_rows(&rec.stdout);
    assert!(rows.len() >= 12, "{}", rec.stdout);
    // each row's tick number: rows come tick by tick, 250 ms apart
    let mut stamps: Vec<&str> = rows.iter().map(|r| col(&h, r, "timestamp")).collect();
    let row_stamps = stamps.clone();
    stamps.dedup();
    let ticks: Vec<usize> = row_stamps
        .iter()
        .map(|t| stamps.iter().position(|s| s == t).unwrap())
        .collect();
    for d in METRICS.iter().filter(|d| d.source.is_nvml()) {
        // NVLink bandwidth is the rate of the throughput counters between two slow reads:
        // a one-shot `status` has one
        let nvlink_rate = d.key == "nvlink_bandwidth";
        for (i, gpu) in g.iter().enumerate() {
            let want = repair_family(d.key).is_none_or(|only| only == i) && !nvlink_rate;
            assert_eq!(
                gpu["metrics"][d.key].is_number(),
                want,
                "{} ({}) on GPU {i}: {gpu}",
                d.key,
                d.source
            );
        }
        let rate = matches!(d.source, gpuwatch::model::Source::Field(f) if f.rate) || nvlink_rate;
        for (r, tick) in rows.iter().zip(&ticks) {
            let i: usize = col(&h, r, "index").parse().unwrap();
            if rate && *tick < 6 {
                continue;
            }
            // a GPM metric needs the sample of the tick before (the first is taken at start)
            if d.source.is_gpm() && *tick < 1 {
                assert_eq!(col(&h, r, d.key), "", "{} at the first tick", d.key);
                continue;
            }
            let want = repair_family(d.key).is_none_or(|only| only == i);
            assert_eq!(!col(&h, r, d.key).is_empty(), want, "{} in {r:?}", d.key);
        }
    }
}

/// What NVML says NOT_SUPPORTED stays absent (null, an empty cell), never 0, tick after tick:
/// here every NVML function a row reads (its call, or its field and fallback call).
#[test]
fn not_supported_sources_stay_absent() {
    use gpuwatch::model::{Source, METRICS};
    let dir = tempfile::tempdir().unwrap();
    let path = write_scenario(dir.path(), "every.toml", EVERY_METRIC);
    let mut symbols = vec!["nvmlDeviceGetFieldValues*".to_string()];
    for d in METRICS {
        match d.source {
            Source::Nvml(call) => symbols.push(format!("{}*", call.function())),
            Source::Field(f) => symbols.extend(f.fallback.map(|c| format!("{}*", c.function()))),
            Source::Gpm(_) => symbols.push("nvmlGpm*".to_string()),
            Source::Nvlink(_) => symbols.push("nvmlDeviceGetNvLink*".to_string()),
            Source::Derived(_) | Source::Host(_) => {}
        }
    }
    let symbols = symbols.join(",");
    let env = [("NVML_SIM_NOT_SUPPORTED", symbols.as_str())];
    let s = sim(&path, &["status", "--json"], &env).json();
    for g in gpus(&s) {
        assert_eq!(g["state"], "ok", "{g}");
        for d in METRICS.iter().filter(|d| d.source.is_nvml()) {
            assert_eq!(g["metrics"][d.key], Value::Null, "{}: {g}", d.key);
        }
    }
    let rec = sim(
        &path,
        &["record", "--interval", "100ms", "--duration", "350ms"],
        &env,
    );
    assert_eq!(rec.code, 0, "{}", rec.stderr);
    let (h, rows) = csv_rows(&rec.stdout);
    assert!(rows.len() >= 6, "{}", rec.stdout);
    for r in &rows {
        assert_eq!(col(&h, r, "state"), "ok");
        for d in METRICS.iter().filter(|d| d.source.is_nvml()) {
            assert_eq!(col(&h, r, d.key), "", "{} in {r:?}", d.key);
        }
    }
}

#[test]
fn processes_are_listed_with_proc_details() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_scenario(
        dir.path(),
        "procs.toml",
        r#"name = "procs"
[devices]
count = 2
[[process]]
gpu = 1
pid = "self"
used_memory_mib = 1024
"#,
    );
    let s = sim(&path, &["status", "--json"], &[]).json();
    let procs = gpus(&s)[1]["processes"]
        .as_array()
        .expect("processes")
        .clone();
    assert_eq!(procs.len(), 1, "{s}");
    let p = &procs[0];
    assert_eq!(p["used_memory_bytes"], 1024 * 1_048_576_u64);
    // "self" is the gpuwatch process: /proc gives its command line and owner.
    assert!(
        p["command"]
            .as_str()
            .is_some_and(|c| c.contains("gpuwatch")),
        "{p}"
    );
    assert!(p["user"].is_string() && p["uid"].is_u64(), "{p}");
    assert!(gpus(&s)[0]["processes"]
        .as_array()
        .is_some_and(Vec::is_empty));
    let rec = sim(
        &path,
        &["record", "--interval", "100ms", "--duration", "250ms"],
        &[],
    );
    let (h, rows) = csv_rows(&rec.stdout);
    let pid = p["pid"].as_u64().unwrap();
    // Each `record` run is its own process, so only the shape is compared.
    let cell = col(&h, &rows[1], "processes");
    assert!(
        cell.ends_with(&format!(":{}", 1024 * 1_048_576_u64)),
        "{cell} (status pid {pid})"
    );
    assert_eq!(col(&h, &rows[0], "processes"), "");
}

/// Issue 30 §8: without a control file the shipped scenarios' GPU processes look like a training
/// job — one rank per GPU, named by NVML (`nvmlSystemGetProcessName`) as `python train.py` — and
/// are no host process: their PIDs are above the largest a kernel hands out, `/proc` knows them
/// not (so no owner is made up), and no signal reaches them. Before, they were the shell that
/// started gpuwatch.
#[test]
fn shipped_processes_look_like_a_training_job_no_signal_reaches() {
    let s = sim(
        "overnight",
        &["status", "--json"],
        &[("NVML_SIM_TIME_SCALE", "0"), ("NVML_SIM_START_S", "700")],
    )
    .json();
    let mut pids = Vec::new();
    // (GPU 5 fell off the bus at 600 s: no processes)
    for g in gpus(&s).iter().filter(|g| g["state"] != "lost") {
        let procs = g["processes"].as_array().expect("processes");
        assert_eq!(procs.len(), 1, "{g}");
        let p = &procs[0];
        assert_eq!(p["command"], "python train.py", "{p}");
        assert_eq!(p["user"], Value::Null, "{p}");
        let pid = p["pid"].as_u64().expect("pid");
        assert!(pid > 4_194_304, "{p}");
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
        // SAFETY: signal 0 only checks that the process exists.
        let r = unsafe { libc::kill(pid as i32, 0) };
        assert_eq!(
            (r, std::io::Error::last_os_error().raw_os_error()),
            (-1, Some(libc::ESRCH))
        );
        pids.push(pid);
    }
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(pids.len(), 7, "one rank per GPU: {pids:?}");
}

#[test]
fn cuda_visible_devices_mapping() {
    let all = sim("healthy", &["devices", "--json"], &[]).json();
    let uuid1 = all["devices"][1]["uuid"].as_str().unwrap().to_string();
    let prefix = &uuid1[..12];
    let spec = format!("3,{prefix},9,0");
    let d = sim(
        "healthy",
        &["devices", "--json"],
        &[("CUDA_VISIBLE_DEVICES", &spec)],
    )
    .json();
    let c = &d["cuda_visible_devices"];
    let visible: Vec<u64> = c["visible"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["index"].as_u64().unwrap())
        .collect();
    assert_eq!(visible, vec![3, 1], "{c}");
    assert_eq!(c["visible"][1]["cuda"], 1);
    assert_eq!(c["stopped_at"]["entry"], "9");

    let text = sim("healthy", &["devices"], &[("CUDA_VISIBLE_DEVICES", &spec)]).stdout;
    assert!(text.contains("cuda:0 = NVML index 3"), "{text}");
    assert!(text.contains("cuda:1 = NVML index 1"), "{text}");
    assert!(text.contains("\"9\" ends the list"), "{text}");
    assert!(
        text.contains("renumbered"),
        "explains the container trap:\n{text}"
    );

    let dup = sim(
        "healthy",
        &["devices", "--json"],
        &[("CUDA_VISIBLE_DEVICES", "0,1,0")],
    )
    .json();
    assert_eq!(
        dup["cuda_visible_devices"]["visible"]
            .as_array()
            .map(Vec::len),
        Some(0)
    );

    let nv = sim(
        "healthy",
        &["devices", "--json"],
        &[("NVIDIA_VISIBLE_DEVICES", "all")],
    )
    .json();
    assert_eq!(nv["nvidia_visible_devices"]["mode"], "all");
    let unset = sim("healthy", &["devices", "--json"], &[]).json();
    assert_eq!(unset["cuda_visible_devices"], Value::Null);
}

/// The sampling thread sleeps once per tick (no polling steps): a signal must still end a
/// recording at once, with an interval of an hour, keeping the tick already written.
#[test]
fn record_with_a_long_interval_stops_at_once_on_a_signal() {
    use std::io::Read;
    common::sim_lib();
    let mut child = common::command(&["--sim", "healthy", "record", "--interval", "1h"], &[])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    // The header and the first tick (8 GPUs) come at once.
    let mut text = String::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(30);
    while text.lines().count() < 9 && Instant::now() < deadline {
        let n = out.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(text.lines().count() >= 9, "{text}");
    // The thread is now asleep until the next tick, an hour away.
    std::thread::sleep(Duration::from_millis(300));
    let asked = Instant::now();
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if asked.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("record did not stop within 10 s of SIGINT");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(status.code(), Some(0));
    out.read_to_string(&mut text).unwrap();
    let (_, rows) = csv_rows(&text);
    assert_eq!(rows.len(), 8, "one tick of 8 GPUs: {text}");
}

/// `--out /dev/null` (a device that cannot be fsynced) is a normal end, as benchmarks use it.
#[test]
fn record_to_dev_null_ends_cleanly() {
    let run = sim(
        "healthy",
        &[
            "record",
            "--interval",
            "100ms",
            "--duration",
            "300ms",
            "--out",
            "/dev/null",
        ],
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(!run.stderr.contains("error"), "{}", run.stderr);
}

#[test]
fn record_rotates_by_size_with_whole_ticks() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("gpu.csv");
    let out_s = out.display().to_string();
    let run = sim(
        "healthy",
        &[
            "record",
            "--interval",
            "100ms",
            "--duration",
            "1500ms",
            "--out",
            &out_s,
            "--max-size",
            "12KB",
            "--keep",
            "3",
        ],
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.is_empty());
    let mut files = vec![out.clone()];
    for n in 1..=3 {
        let p = dir.path().join(format!("gpu.csv.{n}"));
        if p.exists() {
            files.push(p);
        }
    }
    assert!(files.len() >= 3, "rotated: {files:?}");
    assert!(!dir.path().join("gpu.csv.4").exists());
    let mut header = None;
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        assert!(
            text.len() as u64 <= 12_000,
            "{} is {} bytes",
            f.display(),
            text.len()
        );
        let (h, rows) = csv_rows(&text);
        assert_eq!(rows.len() % 8, 0, "{}: whole ticks", f.display());
        assert!(!rows.is_empty());
        if let Some(prev) = &header {
            assert_eq!(prev, &h);
        }
        header = Some(h);
    }
}

#[test]
fn sigterm_leaves_a_valid_file() {
    common::sim_lib();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("rec.csv");
    let mut child = common::command(
        &[
            "--sim",
            "healthy",
            "record",
            "--interval",
            "100ms",
            "--out",
            &out.display().to_string(),
        ],
        &[],
    )
    .spawn()
    .expect("spawn gpuwatch record");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let lines = std::fs::read_to_string(&out)
            .map(|t| t.lines().count())
            .unwrap_or(0);
        if lines > 1 + 8 * 3 {
            break;
        }
        assert!(Instant::now() < deadline, "recording did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = i32::try_from(child.id()).unwrap();
    // SAFETY: plain kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "clean exit on SIGTERM");
    let text = std::fs::read_to_string(&out).unwrap();
    let (_, rows) = csv_rows(&text);
    assert_eq!(rows.len() % 8, 0, "whole ticks");
}

/// Issue 11: a command line with a newline and an escape sequence cannot forge a line or drive
/// the terminal in `status`.
#[test]
fn status_escapes_control_characters_from_command_lines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = std::process::Command::new("sh")
        .args(["-c", "sleep 30; :", "\nERROR forged\x1b[2J"])
        .spawn()
        .expect("spawn");
    let control = dir.path().join("control.toml");
    std::fs::write(
        &control,
        format!(
            "[[process]]\ngpu = 0\npid = {}\nused_memory_mib = 1024\n",
            child.id()
        ),
    )
    .expect("control");
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/job/two-gpus.toml");
    let out = sim(
        scenario.to_str().expect("utf-8"),
        &["status"],
        &[("NVML_SIM_CONTROL", control.to_str().expect("utf-8"))],
    );
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(!out.stdout.contains('\x1b'), "{:?}", out.stdout);
    assert!(
        !out.stdout.lines().any(|l| l.starts_with("ERROR forged")),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("\\nERROR forged\\u{1b}[2J"),
        "{}",
        out.stdout
    );
}

/// Spawns `gpuwatch --sim SCENARIO record …` and waits up to `limit` for it (killed after);
/// (exit code or None when it had to be killed, stdout, stderr).
fn record_within(
    scenario: &Path,
    args: &[&str],
    envs: &[(&str, &str)],
    limit: Duration,
) -> (Option<i32>, String, String) {
    common::sim_lib();
    let mut all = vec!["--sim", scenario.to_str().expect("utf-8"), "record"];
    all.extend_from_slice(args);
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let mut child = common::command(&all, envs)
        .stdout(std::fs::File::create(&out).expect("out"))
        .stderr(std::fs::File::create(&err).expect("err"))
        .spawn()
        .expect("gpuwatch");
    let deadline = Instant::now() + limit;
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status.code();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    (code, read(&out), read(&err))
}

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sim")
        .join(name)
}

/// A wedged `nvmlEventSetWait` (it does not return for 10 minutes) does not stop sampling: the
/// XIDs are drained on a thread of their own and the wedge is said once.
#[test]
fn a_wedged_event_wait_does_not_stop_sampling() {
    let (code, out, err) = record_within(
        &fixture("event-wait-wedged.toml"),
        &["--interval", "200ms", "--duration", "3s"],
        &[],
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(0), "record ended by itself\n{err}");
    let (_, rows) = csv_rows(&out);
    assert!(
        rows.len() >= 10,
        "{} rows in 3 s at 200 ms\n{err}",
        rows.len()
    );
    assert!(err.contains("nvmlEventSetWait has not returned"), "{err}");
}

/// A GPU that does not answer when gpuwatch starts (its XID events cannot be registered then)
/// gets them registered once it answers: its XID 48 at 6 s is recorded.
#[test]
fn xids_of_a_gpu_stalled_at_start_are_reported_once_it_answers() {
    let (code, out, err) = record_within(
        &fixture("xid-after-stall.toml"),
        &["--interval", "500ms", "--duration", "9s"],
        &[
            ("NVML_SIM_HANG", "gpu=1,at_s=0,for_s=3"),
            ("GPUWATCH_LOG", "info"),
        ],
        Duration::from_secs(60),
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("GPU 1 answers now"), "{err}");
    let (header, rows) = csv_rows(&out);
    let xid48 = rows
        .iter()
        .filter(|r| col(&header, r, "index") == "1" && col(&header, r, "xids").contains("48"))
        .count();
    assert_eq!(xid48, 1, "XID 48 on GPU 1, once\n{out}\n{err}");
    // Its identity too (the answer that carried it came late and was dropped).
    let last = rows
        .iter()
        .rev()
        .find(|r| col(&header, r, "index") == "1")
        .unwrap();
    assert!(col(&header, last, "uuid").starts_with("GPU-"), "{out}");
}

/// `NVML_SIM_CALL_COUNTS`: the library counts each function's calls (and each field asked) and
/// writes them at exit — what `bench/sampler.sh` compares between gpuwatch and the floor.
#[test]
fn the_library_counts_the_calls_it_answers() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let counts = tmp.path().join("counts");
    let run = sim(
        "healthy",
        &["record", "--interval", "100ms", "--duration", "1s"],
        &[("NVML_SIM_CALL_COUNTS", counts.to_str().expect("utf-8"))],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let text = std::fs::read_to_string(&counts).expect("the counts, written at exit");
    let count = |key: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0)
    };
    assert_eq!(count("nvmlInit_v2"), 1, "{text}");
    // every tick asks each of the 8 GPUs for its power (about 10 ticks)
    let power = count("nvmlDeviceGetPowerUsage");
    assert!((8 * 8..=8 * 13).contains(&power), "{power}\n{text}");
    // the tick's field-values call asks the same fields of every GPU
    assert!(count("nvmlDeviceGetFieldValues") >= 8 * 8, "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("nvmlDeviceGetFieldValues[")),
        "{text}"
    );
}
