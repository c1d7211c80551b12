//! Unit tests of rule loading, the script API and the sandbox.

use super::*;
use crate::model::{DeviceId, DeviceState, GpuSample, Metric, MetricValues};

const GPU_HOT: &str = r#"
rule(#{
    name: "gpu_hot",
    severity: "warning",          // info | warning | critical
    scope: "gpu",                 // gpu: once per device per tick (default) | host: once per tick
    hold: "2m",                   // must hold this long before firing (Prometheus's `for`, a keyword in rhai)
    keep_firing_for: "1m",        // stays firing this long after it clears (hysteresis)
    repeat: "1h",                 // re-notify while firing
    labels: #{ team: "ml" },
    check: |gpu| {
        let t = gpu.temp.max("1m");
        if t > 85.0 { `GPU ${gpu.index} at ${t} °C` }   // a string fires, with that summary
    },
});
"#;

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn load(text: &str) -> Result<RuleSet, Vec<RuleError>> {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "r.rhai", text);
    RuleSet::load(&[p], &RulesConfig::default())
}

fn history(temps: &[f64]) -> Arc<GpuHistory> {
    let mut h = GpuHistory::new(DeviceId::default());
    for (i, t) in temps.iter().enumerate() {
        let mut values = MetricValues::default();
        values.set(Metric::Temp, Some(*t));
        values.set(Metric::Util, Some(50.0));
        h.push(&GpuSample {
            time_ms: i as i64 * 1000,
            id: DeviceId::default(),
            state: DeviceState::Ok,
            values,
        });
    }
    Arc::new(h)
}

#[test]
fn gpu_hot_example_loads_and_fires() {
    let set = load(GPU_HOT).unwrap();
    assert_eq!(set.len(), 1);
    let r = &set.rules()[0];
    assert_eq!(r.spec.hold_ms, 120_000);
    assert_eq!(r.spec.keep_firing_for_ms, 60_000);
    assert_eq!(r.spec.repeat_ms, 3_600_000);
    assert_eq!(r.spec.labels.get("team").map(String::as_str), Some("ml"));
    let hot = history(&[90.0; 61]);
    match set.eval_gpu(0, &hot, 60_000) {
        EvalResult::Fire { summary, .. } => assert_eq!(summary, "GPU 0 at 90.0 °C"),
        other => panic!("{other:?}"),
    }
    let cool = history(&[60.0; 61]);
    assert_eq!(set.eval_gpu(0, &cool, 60_000), EvalResult::Quiet);
    // Too little data: `()` compared with 85.0 is false, and the evaluation is "no data".
    let short = history(&[90.0; 5]);
    assert_eq!(set.eval_gpu(0, &short, 4_000), EvalResult::NoData);
}

/// The GPM rows come to rules from the metric table like any other (`gpu.sm_active`,
/// `gpu.tensor_active`, `gpu.dram_active`); where a GPU has no GPM they are absent (`()`), and a
/// check comparing them does not fire, as it would on a 0.
#[test]
fn gpm_rows_are_rule_inputs() {
    let set = load(
        r#"rule(#{ name: "launch_bound_test", check: |gpu| {
            let sm = gpu.sm_active.mean("5m");
            if gpu.util.mean("5m") > 90 && sm < 20 && gpu.tensor_active.max("5m") < 5
                && gpu.dram_active.mean("5m") < 50 {
                `util ${fmt(gpu.util.mean("5m"), 0)}%, SM active ${fmt(sm, 0)}%`
            }
        } });"#,
    )
    .unwrap();
    let gpm = |sm: Option<f64>| {
        let mut h = GpuHistory::new(DeviceId::default());
        for i in 0..301 {
            let mut values = MetricValues::default();
            values.set(Metric::Util, Some(100.0));
            values.set(Metric::SmActive, sm);
            values.set(Metric::TensorActive, sm.map(|_| 1.0));
            values.set(Metric::DramActive, sm.map(|_| 10.0));
            h.push(&GpuSample {
                time_ms: i * 1000,
                id: DeviceId::default(),
                state: DeviceState::Ok,
                values,
            });
        }
        Arc::new(h)
    };
    match set.eval_gpu(0, &gpm(Some(12.0)), 300_000) {
        EvalResult::Fire { summary, .. } => assert_eq!(summary, "util 100%, SM active 12%"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        set.eval_gpu(0, &gpm(Some(80.0)), 300_000),
        EvalResult::Quiet
    );
    // an A100: no GPM, so `()` — never "SM active 0 %": the check does not fire
    let none = set.eval_gpu(0, &gpm(None), 300_000);
    assert!(
        matches!(none, EvalResult::Quiet | EvalResult::NoData),
        "{none:?}"
    );
}

#[test]
fn syntax_error_names_file_line_column() {
    let errs =
        load("rule(#{ name: \"x\",\n  check: |gpu| { gpu.temp.max(\"1m\") > }\n});\n").unwrap_err();
    let msg = errs[0].to_string();
    assert!(msg.contains("r.rhai:2:"), "{msg}");
}

#[test]
fn bad_fields_are_reported_at_the_rule_call() {
    for (src, want) in [
        (
            "\n rule(#{ name: \"a\", severity: \"loud\", check: |g| true });",
            "severity",
        ),
        (
            "rule(#{ name: \"a\", hold: \"5 parsecs\", check: |g| true });",
            "hold",
        ),
        ("rule(#{ name: \"a\" });", "check"),
        (
            "rule(#{ name: \"a\", fire_when: 1, check: |g| true });",
            "unknown rule field",
        ),
        ("let x = 1;", "registers no rule"),
    ] {
        let errs = load(src).unwrap_err();
        let msg = errs[0].to_string();
        assert!(msg.contains(want), "{src}: {msg}");
        assert!(msg.contains("r.rhai:"), "{msg}");
    }
    let errs =
        load("\n\n rule(#{ name: \"a\", severity: \"loud\", check: |g| true });").unwrap_err();
    assert!(errs[0].to_string().contains("r.rhai:3:2:"), "{}", errs[0]);
}

#[test]
fn import_and_eval_are_not_available() {
    let errs = load("import \"x\" as y; rule(#{ name: \"a\", check: |g| true });").unwrap_err();
    assert!(!errs.is_empty());
    let errs = load("eval(\"1\"); rule(#{ name: \"a\", check: |g| true });").unwrap_err();
    assert!(!errs.is_empty());
}

#[test]
fn runaway_rule_is_stopped_with_its_location() {
    let set =
        load("rule(#{ name: \"spin\", check: |gpu| {\n  let x = 0;\n  loop { x += 1; }\n} });")
            .unwrap();
    let start = std::time::Instant::now();
    match set.eval_gpu(0, &history(&[50.0]), 0) {
        EvalResult::Error(e) => {
            // rhai loses the position inside closures for this error: the rule line is named.
            assert!(e.to_string().contains("r.rhai:1:"), "{e}");
            // The operation limit or the time budget, whichever comes first (debug builds
            // are slow enough for the budget to win).
            let m = e.message.to_lowercase();
            assert!(m.contains("operations") || m.contains("time budget"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert!(start.elapsed().as_secs() < 10);
    // Deep recursion, huge strings and arrays are bounded too.
    for body in [
        "fn f(x) { f(x + 1) } rule(#{ name: \"r\", check: |gpu| f(1) });",
        "rule(#{ name: \"s\", check: |gpu| { let s = \"x\"; loop { s += s; } } });",
        "rule(#{ name: \"a\", check: |gpu| { let a = []; loop { a.push(1); } } });",
        // `join` checks its size as it builds; a window is at most a day.
        "rule(#{ name: \"j\", check: |gpu| { let a = []; let s = \"\"; for i in 0..64 { s += \"xxxxxxxxxxxxxxxx\"; } for i in 0..200 { a.push(s); } join(a, s).len() > 0 } });",
        "rule(#{ name: \"w\", check: |gpu| gpu.temp.mean(\"2d\") > 1 });",
        "rule(#{ name: \"n\", check: |gpu| gpu.temp.mean(86400 * 365) > 1 });",
    ] {
        let set = load(body).unwrap();
        assert!(
            matches!(set.eval_gpu(0, &history(&[50.0]), 0), EvalResult::Error(_)),
            "{body}"
        );
    }
}

#[test]
fn unit_and_mixed_number_operators() {
    let src = r#"rule(#{ name: "u", check: |gpu| {
        let none = gpu.power.mean("1m");
        if none > 1.0 || none < 1 || none * 2 > 0 || 50 > 40.5 == false { return "bad"; }
        if 3 > 2.5 && 2.0 < 3 && MiB(1) == 1048576.0 && to_GiB(GiB(2)) == 2.0 && 2 * GiB == GiB(2) { "ok" }
    } });"#;
    let set = load(src).unwrap();
    match set.eval_gpu(0, &history(&[50.0; 60]), 59_000) {
        EvalResult::Fire { summary, .. } => assert_eq!(summary, "ok"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn results_true_false_map_and_bad_type() {
    let set = load(
        r#"
        rule(#{ name: "t", check: |gpu| true });
        rule(#{ name: "f", check: |gpu| false });
        rule(#{ name: "m", check: |gpu| #{ summary: "s", values: #{ temp: 1.5 } } });
        rule(#{ name: "i", check: |gpu| 42 });
    "#,
    )
    .unwrap();
    let h = history(&[50.0]);
    assert!(
        matches!(&set.eval_gpu(0, &h, 0), EvalResult::Fire { summary, .. } if summary == "t on GPU 0")
    );
    assert_eq!(set.eval_gpu(1, &h, 0), EvalResult::Quiet);
    match set.eval_gpu(2, &h, 0) {
        EvalResult::Fire {
            summary,
            annotations,
            ..
        } => {
            assert_eq!(summary, "s");
            assert_eq!(
                annotations.get("values").map(String::as_str),
                Some("temp=1.5")
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(set.eval_gpu(3, &h, 0), EvalResult::Error(_)));
}

#[test]
fn params_override_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "low.rhai",
        r#"rule(#{ name: "low", check: |gpu| `${param("threshold", 50.0)} ${param("window", "10m")}` });"#,
    );
    let set = RuleSet::load(std::slice::from_ref(&p), &RulesConfig::default()).unwrap();
    let h = history(&[50.0]);
    assert!(
        matches!(&set.eval_gpu(0, &h, 0), EvalResult::Fire { summary, .. } if summary == "50.0 10m")
    );
    let cfg: RulesConfig = toml::from_str("[params]\nlow.threshold = 40\n").unwrap();
    let set = RuleSet::load(&[p], &cfg).unwrap();
    assert!(
        matches!(&set.eval_gpu(0, &h, 0), EvalResult::Fire { summary, .. } if summary == "40.0 10m")
    );
    assert!(set.check_params(&cfg).is_empty());
    let bad: RulesConfig = toml::from_str("[params]\nlow.treshold = 40\nnope.x = 1\n").unwrap();
    assert_eq!(set.check_params(&bad).len(), 2);
}

#[test]
fn params_of_the_wrong_type_are_load_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "low.rhai",
        "let t = param(\"threshold\", 50.0);\nlet w = param(\"window\", \"10m\");\nrule(#{ name: \"low\", check: |gpu| gpu.util.mean(w) < t });\n",
    );
    // A string where a number is expected would compare as false for ever: refused.
    let cfg: RulesConfig = toml::from_str("[params]\nlow.threshold = \"forty\"\n").unwrap();
    let errs = RuleSet::load(std::slice::from_ref(&p), &cfg).unwrap_err();
    let msg = errs[0].to_string();
    assert!(msg.contains("low.rhai:1:9"), "{msg}");
    assert!(msg.contains("`threshold` must be a number"), "{msg}");
    // Numbers for durations (seconds) and ints for floats are fine.
    let ok: RulesConfig =
        toml::from_str("[params]\nlow.threshold = 40\nlow.window = 600\n").unwrap();
    assert!(RuleSet::load(std::slice::from_ref(&p), &ok).is_ok());
    let bad: RulesConfig = toml::from_str("[params]\nlow.window = true\n").unwrap();
    assert!(RuleSet::load(&[p], &bad).is_err());
}

#[test]
fn duplicate_names_and_retention() {
    let errs =
        load("rule(#{ name: \"a\", check: |g| true });\nrule(#{ name: \"a\", check: |g| true });")
            .unwrap_err();
    assert!(
        errs[0].to_string().contains("already defined"),
        "{}",
        errs[0]
    );
    let set = load("rule(#{ name: \"a\", check: |g| g.util.mean(\"2h\") > 1 });").unwrap();
    assert_eq!(set.retention_ms(), 2 * 3_600_000 + 60_000);
}

#[test]
fn each_metric_keeps_the_history_of_the_files_that_name_it() {
    let dir = tempfile::tempdir().unwrap();
    let long = write(
        dir.path(),
        "long.rhai",
        "rule(#{ name: \"long\", check: |g| g.util.mean(\"2h\") < 1 });",
    );
    let short = write(
        dir.path(),
        "short.rhai",
        "rule(#{ name: \"short\", check: |g| g.temp.max(\"5m\") > 80 && g.throttled(\"thermal\") && g.mem_util.last() > 1 });",
    );
    // `mem_util` does not name `util`
    let alone = RuleSet::load(std::slice::from_ref(&short), &RulesConfig::default()).unwrap();
    assert_eq!(alone.metric_retention_ms(Metric::Util), UNREAD_RETENTION_MS);
    assert_eq!(
        alone.metric_retention_ms(Metric::MemUtil),
        MIN_RETENTION_MS + 60_000
    );
    let set = RuleSet::load(&[long.clone(), short.clone()], &RulesConfig::default()).unwrap();
    let r = |m| set.metric_retention_ms(m);
    assert_eq!(r(Metric::Util), 2 * 3_600_000 + 60_000);
    // named only by a file whose longest window is 5 min: the 15-min floor
    assert_eq!(r(Metric::Temp), MIN_RETENTION_MS + 60_000);
    assert_eq!(r(Metric::MemUtil), MIN_RETENTION_MS + 60_000);
    // `throttled` reads the clock-event reasons
    assert_eq!(r(Metric::ClockEventReasons), MIN_RETENTION_MS + 60_000);
    // no rule names them
    assert_eq!(r(Metric::Energy), UNREAD_RETENTION_MS);
    assert_eq!(r(Metric::PcieRx), UNREAD_RETENTION_MS);
    // a duration in the config reaches every named metric
    let cfg: RulesConfig = toml::from_str("retention = \"3h\"").unwrap();
    let set = RuleSet::load(&[long, short], &cfg).unwrap();
    assert_eq!(
        set.metric_retention_ms(Metric::Temp),
        3 * 3_600_000 + 60_000
    );
    assert_eq!(set.metric_retention_ms(Metric::Energy), UNREAD_RETENTION_MS);
}

#[test]
fn a_lifecycle_duration_is_no_window() {
    // `keep_firing_for: "2h"` and `repeat : `3h`` do not make the ECC window two hours long; a
    // literal elsewhere does (it may reach a series function through a variable).
    let set = load(
        "rule(#{ name: \"ecc\", keep_firing_for: \"2h\", repeat : `3h`, every: \"30s\",\n  check: |g| g.ecc_uncorrected.increase(\"2m\") > 0 });",
    )
    .unwrap();
    assert_eq!(
        set.metric_retention_ms(Metric::EccUncorrected),
        MIN_RETENTION_MS + 60_000
    );
    // (alert instances and XIDs still keep the longest literal)
    assert_eq!(set.retention_ms(), 3 * 3_600_000 + 60_000);
    let set = load(
        "let w = \"2h\";\nrule(#{ name: \"ecc\", keep_firing_for: w, check: |g| g.ecc_uncorrected.increase(w) > 0 });",
    )
    .unwrap();
    assert_eq!(
        set.metric_retention_ms(Metric::EccUncorrected),
        2 * 3_600_000 + 60_000
    );
    // a key that only ends like one is no lifecycle field
    let set = load(
        "let my_hold = 0;\nrule(#{ name: \"u\", labels: #{ rehold: \"2h\" }, check: |g| g.util.mean(\"5m\") < 1 });",
    )
    .unwrap();
    assert_eq!(
        set.metric_retention_ms(Metric::Util),
        2 * 3_600_000 + 60_000
    );
}

#[test]
fn rule_cannot_be_registered_from_a_check() {
    let set = load(
        "rule(#{ name: \"r\", check: |gpu| { rule(#{ name: \"x\", check: |g| 1 }); true } });",
    )
    .unwrap();
    match set.eval_gpu(0, &history(&[50.0]), 0) {
        EvalResult::Error(e) => assert!(e.message.contains("top level"), "{e}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn no_clock_and_traces_record_what_a_check_read() {
    // No wall clock in rules: a check's result depends on the history alone.
    let errs = load("let t = timestamp(); rule(#{ name: \"x\", check: |gpu| false });")
        .expect_err("timestamp() is not available");
    assert!(errs[0].to_string().contains("timestamp"), "{errs:?}");

    let set = load(
        r#"rule(#{ name: "t", check: |gpu| {
            let hot = gpu.temp.max("1m") > 80.0;
            if hot { print("hot"); }
            if gpu.lost || hot { "x" }
        } });"#,
    )
    .unwrap();
    let cool = history(&[50.0; 120]);
    let (result, trace) = set.eval_gpu_traced(0, &cool, 119_000);
    assert_eq!(result, EvalResult::Quiet);
    let trace = trace.expect("a clean evaluation is reusable");
    assert_eq!(trace.len(), 2, "{trace:?}"); // temp.max("1m") and lost
    assert!(trace.holds(&cool, 119_000));
    assert!(!trace.holds(&history(&[90.0; 120]), 119_000));
    // `print` makes an evaluation not reusable.
    let (_, trace) = set.eval_gpu_traced(0, &history(&[90.0; 120]), 119_000);
    assert!(trace.is_none());
}
