//! Every log shape in tests/fixtures/logs/ (hand-written to the documented formats, see its
//! README) goes through `gpuwatch import` and `gpuwatch replay`; what comes out is checked
//! against expected.toml: the format detected, GPUs, ticks, first and last time, skipped line
//! numbers, values, processes and progress.

use std::path::{Path, PathBuf};

use crate::common::gpuwatch;
use gpuwatch::import::{ImportOptions, Importer};
use gpuwatch::model::Metric;

fn logs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/logs")
}

fn expected() -> Vec<toml::Value> {
    let text = std::fs::read_to_string(logs().join("expected.toml")).expect("expected.toml");
    let doc: toml::Value = toml::from_str(&text).expect("expected.toml parses");
    doc["log"].as_array().expect("[[log]]").clone()
}

fn strs(v: &toml::Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|s| s.as_str().expect("string").to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn int(v: &toml::Value, key: &str) -> i64 {
    v[key].as_integer().unwrap_or_else(|| panic!("{key}"))
}

fn time_ms(s: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(s)
        .expect("RFC 3339")
        .timestamp_millis()
}

#[test]
fn every_log_shape_imports_as_expected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut checked = 0;
    for log in expected() {
        let file = log["file"].as_str().expect("file");
        let path = logs().join(file);
        let out = dir.path().join(format!("{file}.gpuwatch.csv"));
        let mut args = vec![
            "import".to_string(),
            path.display().to_string(),
            "--out".into(),
            out.display().to_string(),
        ];
        args.extend(strs(&log["args"]));
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = gpuwatch(&argv, &[]);
        let stderr = run.stderr.clone();
        assert_eq!(run.code, 0, "{file}: {stderr}");
        let format = log["format"].as_str().expect("format");
        assert!(
            stderr.contains(&format!("{file}: {format},")),
            "{file}: detected format: {stderr}"
        );
        let skipped = int(&log, "skipped");
        let lines: Vec<String> = log["skipped_lines"]
            .as_array()
            .expect("skipped_lines")
            .iter()
            .map(|n| n.as_integer().expect("line").to_string())
            .collect();
        if skipped > 0 {
            let want = format!("skipped {skipped} malformed line");
            assert!(stderr.contains(&want), "{file}: {stderr}");
            assert!(
                stderr.contains(&format!("(first: {}", lines.join(", "))),
                "{file}: skipped lines {lines:?}: {stderr}"
            );
        } else {
            assert!(!stderr.contains("malformed line"), "{file}: {stderr}");
        }

        // What was written is gpuwatch's CSV, read back by the same importer.
        let back: Vec<_> = Importer::open(&out, &ImportOptions::default())
            .expect("the output opens")
            .collect::<anyhow::Result<Vec<_>>>()
            .expect("the output reads");
        assert_eq!(
            back.len() as i64,
            int(&log, "ticks"),
            "{file}: ticks: {:?}",
            back.iter()
                .map(|t| gpuwatch::trace::format_time_ms(t.snapshot.time_ms))
                .collect::<Vec<_>>()
        );
        let mut gpus: Vec<u32> = back
            .iter()
            .flat_map(|t| t.snapshot.gpus.iter().map(|g| g.id.index))
            .collect();
        gpus.sort_unstable();
        gpus.dedup();
        assert_eq!(
            gpus.len() as i64,
            int(&log, "gpus"),
            "{file}: GPUs {gpus:?}"
        );
        assert_eq!(
            back[0].snapshot.time_ms,
            time_ms(log["first"].as_str().expect("first")),
            "{file}: first tick"
        );
        assert_eq!(
            back.last().expect("ticks").snapshot.time_ms,
            time_ms(log["last"].as_str().expect("last")),
            "{file}: last tick"
        );
        for w in back.windows(2) {
            assert!(
                w[0].snapshot.time_ms <= w[1].snapshot.time_ms,
                "{file}: in time order"
            );
        }
        for c in log
            .get("check")
            .and_then(|c| c.as_array())
            .into_iter()
            .flatten()
        {
            let tick = usize::try_from(int(c, "tick")).expect("tick");
            let gpu = u32::try_from(int(c, "gpu")).expect("gpu");
            let key = c["metric"].as_str().expect("metric");
            let m = Metric::from_key(key).unwrap_or_else(|| panic!("metric {key}"));
            let sample = back[tick]
                .snapshot
                .gpus
                .iter()
                .find(|g| g.id.index == gpu)
                .unwrap_or_else(|| panic!("{file}: tick {tick} has no GPU {gpu}"));
            let got = sample.get(m);
            if c.get("absent").and_then(toml::Value::as_bool) == Some(true) {
                assert_eq!(got, None, "{file}: tick {tick} gpu {gpu} {key}");
            } else {
                let want = c["value"].as_float().expect("value");
                let got =
                    got.unwrap_or_else(|| panic!("{file}: tick {tick} gpu {gpu} {key} absent"));
                assert!(
                    (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                    "{file}: tick {tick} gpu {gpu} {key}: {got} != {want}"
                );
            }
            checked += 1;
        }
        for p in log
            .get("process")
            .and_then(|c| c.as_array())
            .into_iter()
            .flatten()
        {
            let tick = usize::try_from(int(p, "tick")).expect("tick");
            let pid = u32::try_from(int(p, "pid")).expect("pid");
            let procs = back[tick]
                .snapshot
                .processes
                .as_ref()
                .unwrap_or_else(|| panic!("{file}: tick {tick} has no process list"));
            let proc = procs
                .iter()
                .find(|x| x.pid == pid)
                .unwrap_or_else(|| panic!("{file}: tick {tick} has no pid {pid}: {procs:?}"));
            assert_eq!(
                i64::from(proc.gpu_index),
                int(p, "gpu"),
                "{file}: pid {pid}"
            );
            assert_eq!(
                proc.used_mem_bytes.map(|b| b as i64),
                Some(int(p, "mem_bytes")),
                "{file}: pid {pid}"
            );
            checked += 1;
        }
        if let Some(progress) = log.get("progress").and_then(|p| p.as_array()) {
            for row in progress {
                let row: Vec<i64> = row
                    .as_array()
                    .expect("[tick, epoch, step, total]")
                    .iter()
                    .map(|v| v.as_integer().expect("int"))
                    .collect();
                let p = back[usize::try_from(row[0]).expect("tick")]
                    .progress
                    .as_ref()
                    .unwrap_or_else(|| panic!("{file}: tick {} has no progress", row[0]));
                let got = [p.epoch, p.step, p.total].map(|v| v.map(|v| v as i64));
                assert_eq!(
                    got,
                    [Some(row[1]), Some(row[2]), Some(row[3])],
                    "{file}: {p:?}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 60, "only {checked} checks ran");
}

/// The processes read from a table keep their names (what `status` and the report show).
#[test]
fn table_processes_keep_names() {
    let ticks: Vec<_> = Importer::open(&logs().join("smi-table.log"), &ImportOptions::default())
        .expect("opens")
        .collect::<anyhow::Result<Vec<_>>>()
        .expect("reads");
    let names: Vec<String> = ticks
        .iter()
        .filter_map(|t| t.snapshot.processes.as_ref())
        .flatten()
        .filter_map(|p| p.command.clone())
        .collect();
    assert!(!names.is_empty(), "no process names");
    assert!(names.iter().all(|n| !n.ends_with("MiB")), "{names:?}");
}

/// Every shape replays through the stock rules without an error.
#[test]
fn every_log_shape_replays() {
    for log in expected() {
        let file = log["file"].as_str().expect("file");
        let path = logs().join(file).display().to_string();
        let mut args = vec![
            "replay".to_string(),
            "--rules".into(),
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("rules")
                .display()
                .to_string(),
            path,
        ];
        args.extend(strs(&log["args"]));
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = gpuwatch(&argv, &[]);
        let stderr = &run.stderr;
        assert_eq!(run.code, 0, "{file}: {stderr}");
        assert!(
            stderr.contains(&format!("replayed {} snapshots", int(&log, "ticks"))),
            "{file}: {stderr}"
        );
    }
}

/// Time going back beyond the reordering window (two days' logs concatenated in the wrong
/// order) is a new segment, not an abort; replay restarts its rules there.
#[test]
fn time_going_back_far_is_a_new_segment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut text = String::from("timestamp, index, utilization.gpu [%]\n");
    for day in [2, 1] {
        for s in 0..120 {
            text.push_str(&format!(
                "2024/05/0{day} 10:{:02}:{:02}.000, 0, 50 %\n",
                s / 60,
                s % 60
            ));
        }
    }
    let path = dir.path().join("two-days.csv");
    std::fs::write(&path, text).expect("write");
    let ticks: Vec<_> = Importer::open(&path, &ImportOptions::default())
        .expect("opens")
        .collect::<anyhow::Result<Vec<_>>>()
        .expect("reads");
    assert_eq!(ticks.len(), 240);
    assert_eq!(ticks[119].segment, 0);
    assert_eq!(ticks[120].segment, 1);
    let run = gpuwatch(
        &[
            "replay",
            "--rules",
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("rules")
                .to_str()
                .expect("utf-8"),
            path.to_str().expect("utf-8"),
        ],
        &[],
    );
    let stderr = &run.stderr;
    assert_eq!(run.code, 0, "{stderr}");
    assert!(stderr.contains("new segment"), "{stderr}");
    assert!(stderr.contains("replayed 240 snapshots"), "{stderr}");
}

/// The minute a real H200 gave both tools (tests/fixtures/real/): nvidia-smi's own CSV, imported,
/// agrees with what gpuwatch recorded beside it (medians; the two sample at other instants).
#[test]
fn a_real_h200_minute_imports_as_gpuwatch_recorded_it() {
    let real = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/real");
    let median = |file: &str, m: Metric| -> f64 {
        let mut v: Vec<f64> = Importer::open(&real.join(file), &ImportOptions::default())
            .expect("opens")
            .map(|t| t.expect("reads"))
            .flat_map(|t| t.snapshot.gpus.into_iter().filter_map(move |g| g.get(m)))
            .collect();
        assert!(v.len() >= 50, "{file}: {} samples of {m:?}", v.len());
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    for (m, tolerance) in [
        (Metric::Temp, 2.0),
        (Metric::Power, 8.0),
        (Metric::PowerLimit, 1.0),
        (Metric::MemTotal, 1048576.0),
        (Metric::SmClock, 1.0),
        (Metric::MemClock, 1.0),
    ] {
        let smi = median("idle-minute.smi.csv", m);
        let ours = median("idle-minute.gpuwatch.csv", m);
        assert!(
            (smi - ours).abs() <= tolerance,
            "{m:?}: nvidia-smi {smi} vs gpuwatch {ours}"
        );
    }
}

/// Writes `text` as `name` in a fresh directory and imports it with `args`: (exit code, stderr,
/// the gpuwatch CSV written).
fn import_text(name: &str, text: &str, args: &[&str]) -> (i32, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(name);
    std::fs::write(&path, text).expect("write");
    let out = dir.path().join("out.csv");
    let mut argv = vec![
        "import",
        path.to_str().expect("utf-8"),
        "--out",
        out.to_str().expect("utf-8"),
    ];
    argv.extend_from_slice(args);
    let run = gpuwatch(&argv, &[]);
    let written = std::fs::read_to_string(&out).unwrap_or_default();
    (run.code, run.stderr, written)
}

/// A garbled line whose first cell is a small number (`3.477`, several writers appending to one
/// file) among calendar times is a skipped line, not "seconds since the start: pass --t0"; in a
/// log of elapsed seconds the same number still asks for --t0.
#[test]
fn one_odd_timestamp_never_decides_the_time_style() {
    let mut text =
        String::from("timestamp,gpu_index,temperature_C,utilization_gpu_percent,power_W\n");
    for s in 0..30 {
        if s == 12 {
            text.push_str("3.477,0, 40, 50, 100.5\n");
        }
        text.push_str(&format!(
            "2025-05-04T00:00:{s:02}.000Z,0, 40, 50, 100.5\n2025-05-04T00:00:{s:02}.000Z,1, 41, 51, 101.5\n"
        ));
    }
    let (code, stderr, out) = import_text("appended.csv", &text, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("skipped 1 malformed line (first: 26)"),
        "{stderr}"
    );
    assert_eq!(out.lines().count(), 1 + 60, "{out}");

    let mut elapsed = String::from("timestamp, index, utilization.gpu [%]\n");
    for s in 0..10 {
        elapsed.push_str(&format!("{s}.0, 0, 50 %\n"));
    }
    let (code, stderr, _) = import_text("elapsed.csv", &elapsed, &[]);
    assert_ne!(code, 0);
    assert!(stderr.contains("--t0"), "{stderr}");
}

/// One odd line first (another tool's line) does not decide the format: most lines do.
#[test]
fn one_odd_first_line_never_decides_the_format() {
    let mut text = String::from("[2025-05-04 00:00:00] GPU0: 1,2,3 | \n");
    text.push_str("timestamp, index, utilization.gpu [%]\n");
    for s in 0..10 {
        text.push_str(&format!(
            "2025/05/04 00:00:{s:02}.000, 0, 50 %\n2025/05/04 00:00:{s:02}.000, 1, 60 %\n"
        ));
    }
    text.push_str("timestamp, index, utilization.gpu [%]\n");
    let (code, stderr, out) = import_text("odd-first.csv", &text, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains(": smi-csv,"), "{stderr}");
    assert!(
        stderr.contains("skipped 1 malformed line (first: 1)"),
        "{stderr}"
    );
    assert_eq!(out.lines().count(), 1 + 20);
}

/// An ambiguous header is an error that names the column and --columns; a repeated one too.
/// Unknown columns are one warning naming them.
#[test]
fn ambiguous_and_unknown_columns_are_named() {
    let rows = "2025-05-04T00:00:00Z,0,50,1024,3\n";
    let (code, stderr, _) = import_text("amb.csv", &format!("time,gpu,util,mem,step\n{rows}"), &[]);
    assert_ne!(code, 0);
    assert!(stderr.contains("amb.csv:1:1:"), "{stderr}");
    assert!(stderr.contains("\"mem\" is ambiguous"), "{stderr}");
    assert!(stderr.contains("--columns"), "{stderr}");

    let (code, stderr, _) = import_text(
        "twice.csv",
        &format!("time,gpu,util,gpu_util,step\n{rows}"),
        &[],
    );
    assert_ne!(code, 0);
    assert!(
        stderr.contains("\"gpu_util\" repeats column \"util\""),
        "{stderr}"
    );
    assert!(stderr.contains("--columns"), "{stderr}");

    let (code, stderr, out) = import_text(
        "unknown.csv",
        &format!("time,gpu,util,mem_used_GB,step\n{rows}"),
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stderr.matches("ignored").count(), 1, "{stderr}");
    assert!(stderr.contains("column `step` ignored"), "{stderr}");
    // 1024 GB in bytes.
    assert!(out.contains(",1099511627776,"), "{out}");

    // `--columns` in column order reads a log without a header, with its units.
    let (code, stderr, out) = import_text(
        "noheader.csv",
        "2025-05-04T00:00:00Z, 0, 50, 2\n2025-05-04T00:00:01Z, 0, 60, 3\n",
        &["--columns", "timestamp,gpu,util,mem_used_GB"],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(out.contains(",2147483648,"), "{out}");
    assert!(
        !stderr.contains("--tz"),
        "zoned times need no --tz: {stderr}"
    );
}

/// Times without a zone: one warning naming --tz (not one per line); --tz reads them.
#[test]
fn naive_times_warn_once_and_tz_reads_them() {
    let mut text = String::from("timestamp, index, utilization.gpu [%]\n");
    for s in 0..5 {
        text.push_str(&format!("2025/05/04 08:00:{s:02}.000, 0, 50 %\n"));
    }
    let (code, stderr, out) = import_text("naive.csv", &text, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stderr.lines().filter(|l| l.contains("--tz")).count(),
        1,
        "{stderr}"
    );
    assert!(out.contains("2025-05-04T08:00:00.000Z"), "{out}");
    let (code, stderr, out) = import_text("naive.csv", &text, &["--tz", "EDT"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("--tz"), "{stderr}");
    assert!(out.contains("2025-05-04T12:00:00.000Z"), "{out}");
    let (code, stderr, _) = import_text("naive.csv", &text, &["--tz", "Mars/Olympus"]);
    assert_ne!(code, 0);
    assert!(stderr.contains("Mars/Olympus"), "{stderr}");
}

/// A log without any time (`nvidia-smi --query-gpu=utilization.gpu --format=csv` in a loop: a
/// header before every value) asks for --t0, then reads one tick per header.
#[test]
fn a_log_without_times_takes_t0_and_every() {
    let text = "utilization.gpu [%]\n85 %\nutilization.gpu [%]\n100 %\nutilization.gpu [%]\n95 %\n";
    let (code, stderr, _) = import_text("no-times.csv", text, &[]);
    assert_ne!(code, 0);
    assert!(stderr.contains("--t0"), "{stderr}");
    let (code, stderr, out) = import_text(
        "no-times.csv",
        text,
        &["--t0", "2025-05-04T00:00:00Z", "--every", "2s"],
    );
    assert_eq!(code, 0, "{stderr}");
    let times: Vec<&str> = out.lines().skip(1).map(|l| &l[..24]).collect();
    assert_eq!(
        times,
        [
            "2025-05-04T00:00:00.000Z",
            "2025-05-04T00:00:02.000Z",
            "2025-05-04T00:00:04.000Z"
        ]
    );
}

/// Times outside 1970–2199 are malformed lines, skipped and counted: a leap second rolling into
/// the year 10000, a 20-digit number, the year 0000.
#[test]
fn out_of_range_times_are_malformed_lines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("range.csv");
    std::fs::write(
        &log,
        "timestamp, index, utilization.gpu [%]\n\
         2024/05/01 10:00:00.000, 0, 50 %\n\
         9999/12/31 23:59:60.000, 0, 51 %\n\
         2024/05/01 10:00:01.000, 0, 52 %\n\
         0000/01/01 00:00:00.000, 0, 53 %\n\
         2024/05/01 10:00:02.000, 0, 54 %\n",
    )
    .expect("write");
    let run = gpuwatch(&["import", log.to_str().expect("utf-8")], &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr.contains("skipped 2 malformed lines"),
        "{}",
        run.stderr
    );
    let rows = run.stdout.lines().count();
    assert_eq!(rows, 4, "header and three ticks: {}", run.stdout);
    assert!(!run.stdout.contains("10000-"), "{}", run.stdout);
}

/// dcgm-exporter's scrapes saved by a curl loop (tests/fixtures/logs/dcgm-exporter.txt: 10
/// scrapes of 3 H100s, no timestamps) get the report any log gets: SM active and tensor active
/// per GPU from DCGM's ratios, the launch-bound GPU diagnosed; without --t0 the error says
/// what to pass.
#[test]
fn dcgm_exporter_scrapes_report() {
    let log = logs().join("dcgm-exporter.txt");
    let log = log.to_str().expect("utf-8");
    let t0 = ["--t0", "2026-12-06T10:00:00Z"];
    let text = gpuwatch(&["report", log, t0[0], t0[1]], &[]);
    assert_eq!(text.code, 0, "{}", text.stderr);
    let line = |gpu: u32| {
        text.stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("GPU {gpu}: ")))
            .unwrap_or_else(|| panic!("GPU {gpu} in {}", text.stdout))
            .to_string()
    };
    assert!(
        line(0).contains("SM active 71 %, tensor active 42 %, DRAM active 38 %"),
        "{}",
        line(0)
    );
    assert!(
        line(2).contains("SM active 8 %, tensor active 0 %"),
        "{}",
        line(2)
    );
    assert!(text.stdout.contains("launch-bound"), "{}", text.stdout);
    assert!(
        text.stderr.contains("dcgm-exporter.txt:650:") && text.stderr.contains("line skipped"),
        "the cut last line, located: {}",
        text.stderr
    );
    assert!(
        text.stderr.contains("DCGM_FI_DEV_VGPU_LICENSE_STATUS"),
        "the family not read, named: {}",
        text.stderr
    );
    let json = gpuwatch(&["report", "--json", log, t0[0], t0[1]], &[]).json();
    let gpus = json["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), 3);
    assert_eq!(gpus[1]["uuid"], "GPU-8a41d0c6-2b7e-4f93-b5c1-0e9d2f7a6b58");
    assert_eq!(gpus[1]["name"], "NVIDIA H100 80GB HBM3");
    let sm = gpus[0]["sm_active_mean"].as_f64().expect("SM active");
    assert!((69.0..=73.0).contains(&sm), "{sm}");
    let tensor = gpus[1]["tensor_active_mean"]
        .as_f64()
        .expect("tensor active");
    assert!((41.0..=43.0).contains(&tensor), "{tensor}");
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
    assert_eq!(found, [("launch_bound".to_string(), 2)], "{found:?}");
    let no_t0 = gpuwatch(&["import", log], &[]);
    assert_ne!(no_t0.code, 0);
    assert!(
        no_t0.stderr.contains("dcgm-exporter.txt:3:1: ")
            && no_t0.stderr.contains("--t0")
            && no_t0.stderr.contains("--every"),
        "{}",
        no_t0.stderr
    );
}

/// gpuwatch's own /metrics (dcgm-exporter's names) scraped by a curl-like loop from the daemon
/// on nvml-sim's `launch-bound` reads back: the SM active the page showed (a ratio) is the
/// imported percentage, and the report finds the run launch-bound on every GPU.
#[test]
fn gpuwatch_scrapes_round_trip_through_import_and_report() {
    use std::time::Duration;
    let tmp = tempfile::tempdir().expect("tempdir");
    let port = crate::notify::servers::free_port();
    let cfg = tmp.path().join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "[daemon]\ninterval = \"1s\"\nstate_dir = \"state\"\nrules = [{rules:?}]\nhostname = \"simhost\"\n\n\
             [exporter]\nlisten = \"127.0.0.1:{port}\"\n",
            rules = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("rules")
                .display()
                .to_string(),
        ),
    )
    .expect("config");
    // launch-bound from 60 s of scenario time: utilization ~100 %, SM active ~10 %
    let _daemon = crate::daemon::daemon(
        "launch-bound",
        &cfg,
        &tmp.path().join("log"),
        &[("NVML_SIM_START_S", "90")],
    );
    // one page per sample (a new gpuwatch_last_sample_timestamp_seconds), with GPM values
    let mut pages: Vec<String> = Vec::new();
    let mut last_sample = String::new();
    crate::notify::servers::wait_until(Duration::from_secs(60), "8 scrapes", || {
        let (status, _, page) = crate::exporter::get(port, "/metrics", "text/plain")?;
        let sample = page
            .lines()
            .find(|l| l.starts_with("gpuwatch_last_sample_timestamp_seconds{"))?
            .to_string();
        if status == 200 && sample != last_sample && page.contains("\nDCGM_FI_PROF_SM_ACTIVE{") {
            last_sample = sample;
            pages.push(page);
        }
        (pages.len() >= 8).then_some(())
    });
    let scrapes = tmp.path().join("scrapes.txt");
    std::fs::write(&scrapes, pages.concat()).expect("write");
    let path = scrapes.to_str().expect("utf-8");
    let args = ["--t0", "2026-12-06T10:00:00Z", "--every", "1s"];
    let mut import = vec!["import", path];
    import.extend(args);
    let out = gpuwatch(&import, &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains("scrapes.txt: dcgm-exporter,"),
        "{}",
        out.stderr
    );
    let (h, rows) = crate::common::csv_rows(&out.stdout);
    assert_eq!(rows.len(), 8 * 8, "8 scrapes of 8 GPUs: {}", out.stderr);
    // the values of the fourth page, GPU by GPU
    for (gpu, row) in rows[24..32].iter().enumerate() {
        assert_eq!(crate::common::col(&h, row, "index"), gpu.to_string());
        let shown: f64 = pages[3]
            .lines()
            .find(|l| l.starts_with(&format!("DCGM_FI_PROF_SM_ACTIVE{{gpu=\"{gpu}\",")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .expect("SM active on the page");
        let imported: f64 = crate::common::col(&h, row, "sm_active")
            .parse()
            .expect("a number");
        assert!(
            (imported - shown * 100.0).abs() < 1e-9,
            "GPU {gpu}: page {shown}, imported {imported}"
        );
        assert!((5.0..=15.0).contains(&imported), "{imported}");
        assert!(crate::common::col(&h, row, "uuid").starts_with("GPU-"));
    }
    let mut report = vec!["report", "--json", path];
    report.extend(args);
    let rep = gpuwatch(&report, &[]);
    let json = rep.json();
    let mut launch_bound: Vec<u64> = json["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["pattern"] == "launch_bound")
        .filter_map(|f| f["gpu"].as_u64())
        .collect();
    launch_bound.sort_unstable();
    assert_eq!(launch_bound, (0..8).collect::<Vec<u64>>(), "{json}");
}
