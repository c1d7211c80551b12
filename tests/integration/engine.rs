//! Integration tests of the rules engine through the real `gpuwatch` binary: `check`, `test`
//! and `replay` on the stock rules, the issue's gpu_hot example and unseen recordings in both
//! gpuwatch and nvidia-smi CSV formats.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpuwatch::model::{DeviceId, DeviceState, GpuSample, Metric, MetricValues, Snapshot};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn gpuwatch(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("run gpuwatch")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// `(alert, gpu, state)` of every line of `replay --json`, checking each line's shape.
fn replay_json(trace: &Path, rules: &str) -> Vec<(String, Option<u64>, String)> {
    let out = gpuwatch(&[
        "replay",
        "--json",
        "--rules",
        rules,
        trace.to_str().expect("utf-8 path"),
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "replay failed: {stderr}");
    stdout
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("JSON line");
            let at = v["at"].as_str().expect("at");
            assert!(
                chrono::DateTime::parse_from_rfc3339(at).is_ok(),
                "at is RFC 3339: {at}"
            );
            assert!(v["severity"].is_string() && v["summary"].is_string(), "{l}");
            (
                v["alert"].as_str().expect("alert").to_string(),
                v["gpu"].as_u64(),
                v["state"].as_str().expect("state").to_string(),
            )
        })
        .collect()
}

#[test]
fn stock_rule_tests_pass() {
    let out = gpuwatch(&["test", "rules/tests"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains(" 0 failed"), "{stdout}");
    // every stock rule has a test file with a healthy case
    for entry in std::fs::read_dir(root().join("rules")).expect("rules dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "rhai") {
            let stem = path
                .file_stem()
                .expect("stem")
                .to_string_lossy()
                .into_owned();
            let test = root().join("rules/tests").join(format!("{stem}.toml"));
            let body = std::fs::read_to_string(&test)
                .unwrap_or_else(|_| panic!("{} has no test file", path.display()));
            assert!(
                body.contains("quiet on a healthy run"),
                "{}",
                test.display()
            );
        }
    }
}

#[test]
fn stock_rules_check_clean() {
    let out = gpuwatch(&["check", "--rules", "rules"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let stock = std::fs::read_dir(root().join("rules"))
        .expect("rules dir")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "rhai"))
        })
        .count();
    assert!(
        stdout.starts_with(&format!("ok: {stock} rules")),
        "{stdout}"
    );
}

#[test]
fn gpu_hot_example_fires_in_test() {
    let out = gpuwatch(&["test", "tests/fixtures/series/gpu_hot.toml"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("3 passed, 0 failed"), "{stdout}");
}

#[test]
fn failing_test_prints_a_diff_and_exits_nonzero() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rule = root().join("tests/fixtures/rules/gpu_hot.rhai");
    let file = dir.path().join("wrong.toml");
    std::fs::write(
        &file,
        format!(
            "rules = [{:?}]\ninterval = \"10s\"\n[[case]]\nname = \"wrong time\"\n[[case.gpu]]\ntemp = \"90x30\"\n\
             [[case.expect]]\nalert = \"gpu_hot\"\ngpu = 0\nstate = \"firing\"\nat = \"1m\"\n",
            rule.display().to_string()
        ),
    )
    .expect("write");
    let out = gpuwatch(&["test", file.to_str().expect("utf-8")]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("FAIL  wrong time"), "{stdout}");
    assert!(
        stdout.contains("  - gpu_hot gpu 0 firing at 1m"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  + gpu_hot gpu 0 firing at 2m"),
        "{stdout}"
    );
}

fn hot_trace(dir: &Path) -> PathBuf {
    let t0 = 1_796_223_600_000_i64;
    let snaps: Vec<Snapshot> = (0..600)
        .map(|k| {
            let temp = if (120..360).contains(&k) { 91.0 } else { 60.0 };
            let gpus = (0..2)
                .map(|i| {
                    let mut values = MetricValues::default();
                    values.set(Metric::Temp, Some(if i == 0 { temp } else { 55.0 }));
                    values.set(Metric::Util, Some(90.0));
                    GpuSample {
                        time_ms: t0 + k * 1000,
                        id: DeviceId {
                            index: i,
                            uuid: format!("GPU-{i}"),
                            ..DeviceId::default()
                        },
                        state: DeviceState::Ok,
                        values,
                    }
                })
                .collect();
            Snapshot {
                time_ms: t0 + k * 1000,
                gpus,
                processes: None,
                xids: Vec::new(),
                ..Snapshot::default()
            }
        })
        .collect();
    let path = dir.join("hot.csv");
    let mut f = std::fs::File::create(&path).expect("create");
    gpuwatch::trace::write_gpuwatch_csv(&mut f, &snaps).expect("write");
    path
}

#[test]
fn gpu_hot_example_fires_in_replay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = hot_trace(dir.path());
    let events = replay_json(&trace, "tests/fixtures/rules/gpu_hot.rhai");
    assert_eq!(
        events,
        vec![
            ("gpu_hot".into(), Some(0), "firing".into()),
            ("gpu_hot".into(), Some(0), "resolved".into())
        ]
    );
    let out = gpuwatch(&[
        "replay",
        "--json",
        "--rules",
        "tests/fixtures/rules/gpu_hot.rhai",
        trace.to_str().expect("utf-8"),
    ]);
    let first = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(str::to_string)
        .expect("a line");
    let v: serde_json::Value = serde_json::from_str(&first).expect("json");
    // hot from 15:02:00, max(1m) > 85 at once, hold 2m, evaluated every 5 s
    assert_eq!(v["at"], "2026-12-02T15:04:00.000Z");
    assert_eq!(v["summary"], "GPU 0 at 91.0 °C");
    assert_eq!(v["severity"], "warning");
}

#[test]
fn runaway_rule_is_reported_while_others_fire() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = hot_trace(dir.path());
    let events = replay_json(&trace, "tests/fixtures/rules");
    assert_eq!(
        events,
        vec![
            ("rule_error".into(), None, "firing".into()),
            ("gpu_hot".into(), Some(0), "firing".into()),
            ("gpu_hot".into(), Some(0), "resolved".into())
        ]
    );
    let out = gpuwatch(&[
        "replay",
        "--rules",
        "tests/fixtures/rules",
        trace.to_str().expect("utf-8"),
    ]);
    let (stdout, _) = text(&out);
    assert!(
        stdout.contains("spin.rhai:"),
        "rule_error names the file: {stdout}"
    );
    // The operation limit or the time budget, whichever stops the loop first.
    assert!(
        stdout.contains("too many operations") || stdout.contains("time budget"),
        "{stdout}"
    );
}

#[test]
fn check_reports_file_line_column() {
    let out = gpuwatch(&["check", "--rules", "tests/fixtures/rules/broken"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("tests/fixtures/rules/broken/bad.rhai:4:"),
        "file:line:column expected: {stderr}"
    );
    let col_part = stderr
        .split("bad.rhai:4:")
        .nth(1)
        .and_then(|r| r.split(':').next())
        .expect("column");
    assert!(col_part.parse::<u32>().is_ok(), "{stderr}");
}

#[test]
fn check_validates_config_params() {
    let out = gpuwatch(&["check", "--config", "tests/fixtures/config/params.toml"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let out = gpuwatch(&[
        "check",
        "--config",
        "tests/fixtures/config/params_typo.toml",
    ]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("low_utilisation"), "{stderr}");
    assert!(stderr.contains("temperature_high.treshold"), "{stderr}");
}

type Expected = &'static [(&'static str, Option<u64>, &'static str)];

fn check_fixture(name: &str, expected: Expected, smi_expected: Option<Expected>) {
    for (format, want) in [
        ("gpuwatch", expected),
        ("smi", smi_expected.unwrap_or(expected)),
    ] {
        let trace = root().join(format!("tests/fixtures/traces/{name}.{format}.csv"));
        let got = replay_json(&trace, "rules");
        let want: Vec<(String, Option<u64>, String)> = want
            .iter()
            .map(|(a, g, s)| ((*a).to_string(), *g, (*s).to_string()))
            .collect();
        assert_eq!(got, want, "{}", trace.display());
    }
}

#[test]
fn replay_healthy_is_quiet() {
    check_fixture("healthy", &[], None);
}

#[test]
fn replay_stall() {
    check_fixture(
        "stall",
        &[
            ("low_utilization", Some(0), "firing"),
            ("periodic_idle", Some(0), "firing"),
        ],
        None,
    );
}

#[test]
fn replay_leak() {
    check_fixture("leak", &[("memory_leak", Some(0), "firing")], None);
}

#[test]
fn replay_hang() {
    check_fixture(
        "hang",
        &[
            ("nccl_hang", Some(0), "firing"),
            ("nccl_hang", Some(1), "firing"),
        ],
        None,
    );
}

#[test]
fn replay_ecc() {
    check_fixture(
        "ecc",
        &[
            ("ecc_uncorrected", Some(0), "firing"),
            ("ecc_corrected_rate", Some(0), "firing"),
        ],
        None,
    );
}

#[test]
fn replay_xid() {
    // nvidia-smi logs carry no XIDs: only the lost GPU shows there.
    check_fixture(
        "xid",
        &[
            ("xid_error", Some(1), "firing"),
            ("gpu_lost", Some(1), "firing"),
            // (not resolved: GPU 1 stays lost to the end, within the hour its XID 79 keeps
            // the alert)
        ],
        Some(&[("gpu_lost", Some(1), "firing")]),
    );
}

#[test]
fn replay_noheader_smi_log_with_given_header() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = std::fs::read_to_string(root().join("tests/fixtures/traces/hang.smi.csv"))
        .expect("fixture");
    let mut lines = src.lines();
    let header = lines.next().expect("header").to_string();
    let body: Vec<&str> = lines.collect();
    let path = dir.path().join("noheader.csv");
    std::fs::write(&path, body.join("\n")).expect("write");
    let out = gpuwatch(&[
        "replay",
        "--json",
        "--rules",
        "rules",
        "--smi-header",
        &header,
        path.to_str().expect("utf-8"),
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
    // without the header the file is refused with a hint
    let out = gpuwatch(&["replay", "--rules", "rules", path.to_str().expect("utf-8")]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("--smi-header"), "{stderr}");
}

#[test]
fn docs_cover_every_metric() {
    let docs = std::fs::read_to_string(root().join("docs/rules.md")).expect("docs/rules.md");
    for d in gpuwatch::model::METRICS {
        let row = format!("| `gpu.{}` | {} |", d.key, d.unit);
        assert!(docs.contains(&row), "docs/rules.md lacks the row {row:?}");
    }
}

#[test]
fn replay_bad_value_names_file_line_column() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.csv");
    std::fs::write(
        &path,
        "timestamp,index,uuid,name,pci_bus_id,minor,state,util,xids,processes\n\
         2026-12-02T15:00:00.000Z,0,GPU-0,X,,0,ok,50,,\n\
         2026-12-02T15:00:01.000Z,0,GPU-0,X,,0,ok,5O,,\n",
    )
    .expect("write");
    let out = gpuwatch(&["replay", "--rules", "rules", path.to_str().expect("utf-8")]);
    let (_, stderr) = text(&out);
    // A malformed cell is read as absent and reported with its place; the replay goes on.
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("bad.csv:3:42: util value \"5O\" is not a number"),
        "{stderr}"
    );
    assert!(stderr.contains("1 malformed cell(s)"), "{stderr}");
}

/// Issue 11: `print` from a rule is rate-limited per rule and names the rule; control
/// characters in it cannot forge a log line.
#[test]
fn rule_output_is_rate_limited_and_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = hot_trace(dir.path());
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).expect("mkdir");
    std::fs::write(
        rules.join("chatty.rhai"),
        r#"rule(#{ name: "chatty", check: |gpu| { for i in 0..50 { print(`line ${i}\nERROR forged`); } false } });"#,
    )
    .expect("write rule");
    let out = crate::common::command(
        &[
            "replay",
            "--rules",
            rules.to_str().expect("utf-8"),
            trace.to_str().expect("utf-8"),
        ],
        &[("GPUWATCH_LOG", "info")],
    )
    .output()
    .expect("replay");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("line ")).collect();
    assert_eq!(lines.len(), 10, "{stderr}");
    assert!(lines.iter().all(|l| l.contains("rule=chatty")), "{stderr}");
    assert!(
        !stderr.lines().any(|l| l.starts_with("ERROR forged")),
        "{stderr}"
    );
    assert!(lines[0].contains("\\nERROR forged"), "{stderr}");
}
