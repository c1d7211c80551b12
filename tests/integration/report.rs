//! `gpuwatch report` on recordings made at test time by the real recorder (nvml-sim scenarios
//! `overnight` and `dataloader-stall`, time-compressed and put back on the scenario clock): the
//! HTML page renders in headless Chromium (Debian's `chromium`, installed by `.ci/run`) to a
//! non-blank screenshot with one chart group per GPU; the diagnosis names the input stall; two
//! runs side by side; a baseline saved and compared.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::acceptance::{file_name, record_all, rescale, Rec};
use super::common::{self, gpuwatch};

/// Records the scenarios and returns the rescaled recordings' paths.
fn recordings(dir: &Path) -> Vec<PathBuf> {
    let recs = [
        // 600 s at 2 s resolution (XID 79 on GPU 5 lands at the very end).
        Rec {
            scenario: "overnight",
            scale: 20,
            real_s: 30,
            expect: vec![],
        },
        // 1000 s at 4 s resolution: every GPU stalls on input.
        Rec {
            scenario: "dataloader-stall",
            scale: 40,
            real_s: 25,
            expect: vec![],
        },
    ];
    record_all(dir, &recs);
    recs.iter()
        .map(|r| {
            let out = dir.join(file_name(r.scenario, ""));
            rescale(&dir.join(file_name(r.scenario, ".raw")), &out, r.scale);
            out
        })
        .collect()
}

/// Decodes an 8-bit RGB or RGBA PNG (what Chromium writes) to its pixels.
fn png_pixels(png: &[u8]) -> (usize, usize, usize, Vec<u8>) {
    use std::io::Read as _;
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let (mut w, mut h, mut channels) = (0, 0, 0);
    let mut idat = Vec::new();
    let mut i = 8;
    while i + 8 <= png.len() {
        let len = u32::from_be_bytes(png[i..i + 4].try_into().expect("4 bytes")) as usize;
        let kind = &png[i + 4..i + 8];
        let data = &png[i + 8..i + 8 + len];
        match kind {
            b"IHDR" => {
                w = u32::from_be_bytes(data[0..4].try_into().expect("4 bytes")) as usize;
                h = u32::from_be_bytes(data[4..8].try_into().expect("4 bytes")) as usize;
                assert_eq!(data[8], 8, "8-bit PNG expected");
                channels = match data[9] {
                    2 => 3,
                    6 => 4,
                    t => panic!("PNG colour type {t}"),
                };
            }
            b"IDAT" => idat.extend_from_slice(data),
            _ => {}
        }
        i += 12 + len;
    }
    let mut raw = Vec::new();
    flate2::read::ZlibDecoder::new(&idat[..])
        .read_to_end(&mut raw)
        .expect("PNG data inflates");
    let stride = w * channels;
    let mut out = vec![0u8; h * stride];
    for y in 0..h {
        let filter = raw[y * (stride + 1)];
        let line = &raw[y * (stride + 1) + 1..(y + 1) * (stride + 1)];
        for x in 0..stride {
            let a = if x >= channels {
                out[y * stride + x - channels]
            } else {
                0
            };
            let b = if y > 0 { out[(y - 1) * stride + x] } else { 0 };
            let c = if y > 0 && x >= channels {
                out[(y - 1) * stride + x - channels]
            } else {
                0
            };
            let pred = match filter {
                0 => 0,
                1 => a,
                2 => b,
                3 => ((u16::from(a) + u16::from(b)) / 2) as u8,
                4 => {
                    let p = i16::from(a) + i16::from(b) - i16::from(c);
                    let (pa, pb, pc) = (
                        (p - i16::from(a)).abs(),
                        (p - i16::from(b)).abs(),
                        (p - i16::from(c)).abs(),
                    );
                    if pa <= pb && pa <= pc {
                        a
                    } else if pb <= pc {
                        b
                    } else {
                        c
                    }
                }
                f => panic!("PNG filter {f}"),
            };
            out[y * stride + x] = line[x].wrapping_add(pred);
        }
    }
    (w, h, channels, out)
}

#[test]
fn report_renders_in_chromium_compares_runs_and_keeps_baselines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let logs = recordings(dir.path());
    let (overnight, stall) = (&logs[0], &logs[1]);
    let html = dir.path().join("report.html");
    let state = dir.path().join("state");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[daemon]\nstate_dir = {:?}\n[report]\nprice_per_kwh = 0.3\ncurrency = \"EUR\"\ngrams_co2_per_kwh = 400\n",
            state.display().to_string()
        ),
    )
    .expect("config");
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules");
    let (rules, config_s) = (
        rules.to_str().expect("utf-8"),
        config.to_str().expect("utf-8"),
    );
    // `gpuwatch report ARGS --rules R --config C`.
    let report = |args: &[&str]| {
        let mut all = vec!["report"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--rules", rules, "--config", config_s]);
        gpuwatch(&all, &[])
    };

    // One run: text summary, HTML page.
    let run = gpuwatch(
        &[
            "report",
            overnight.to_str().expect("utf-8"),
            "--out",
            html.to_str().expect("utf-8"),
            "--rules",
            rules,
            "--config",
            config_s,
            "--save-baseline",
            "overnight",
        ],
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("8 GPU(s)"), "{}", run.stdout);
    assert!(run.stdout.contains("EUR"), "energy cost: {}", run.stdout);
    let page = std::fs::read_to_string(&html).expect("the page");
    assert!(page.len() < 2_000_000, "page of {} bytes", page.len());
    assert_eq!(page.matches("<section class=\"gpu\"").count(), 8);
    assert_eq!(page.matches("<svg class=\"chart\"").count(), 32);
    for banned in ["<script", "http://", "https://", "src=\""] {
        let hits: Vec<_> = page.match_indices(banned).map(|(i, _)| i).collect();
        // The SVG namespace is the one URL allowed (it is a name, never fetched).
        let real = hits
            .iter()
            .filter(|i| !page[**i..].starts_with("http://www.w3.org/2000/svg"))
            .count();
        assert_eq!(real, 0, "self-contained page has {banned}");
    }
    assert!(
        page.contains("xid_error") || page.contains("gpu_lost"),
        "alert timeline"
    );

    // Headless Chromium: the DOM has one chart group per GPU and the screenshot is not blank.
    if let Some(chrome) =
        super::common::installed(&["chromium", "chromium-browser", "google-chrome"])
    {
        let url = format!("file://{}", html.display());
        let base = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
        ];
        let profile = format!("--user-data-dir={}", dir.path().join("chrome").display());
        let dom = Command::new(&chrome)
            .args(base)
            .arg(&profile)
            .args(["--dump-dom", &url])
            .output()
            .expect("chromium --dump-dom");
        let dom = String::from_utf8_lossy(&dom.stdout);
        assert_eq!(
            dom.matches("class=\"gpu\"").count(),
            8,
            "chart groups in the DOM"
        );
        let shot = dir.path().join("shot.png");
        let out = Command::new(&chrome)
            .args(base)
            .arg(&profile)
            .args([
                &format!("--screenshot={}", shot.display()),
                "--window-size=1280,2000",
                &url,
            ])
            .output()
            .expect("chromium --screenshot");
        let png = std::fs::read(&shot).unwrap_or_else(|e| {
            panic!(
                "no screenshot ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        let (w, h, ch, px) = png_pixels(&png);
        assert_eq!((w, h), (1280, 2000));
        let bg = &px[..ch];
        let differing = px.chunks(ch).filter(|p| p != &bg).count();
        let mut colours: Vec<&[u8]> = px.chunks(ch).collect();
        colours.sort_unstable();
        colours.dedup();
        assert!(
            differing > w * h / 50 && colours.len() > 20,
            "blank screenshot: {differing} pixels differ from the background, {} colours",
            colours.len()
        );
    }

    // The input stall is diagnosed, with its cause and fix.
    let run = report(&[stall.to_str().expect("utf-8"), "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let json = run.json();
    let findings = json["findings"].as_array().expect("findings");
    assert!(
        findings
            .iter()
            .any(|f| f["pattern"] == "low_utilization"
                && f["seconds"].as_f64().unwrap_or(0.0) > 60.0),
        "{findings:?}"
    );
    assert!(findings
        .iter()
        .all(|f| !f["fix"].as_str().unwrap_or("").is_empty()));
    assert_eq!(json["gpus"].as_array().expect("gpus").len(), 8);

    // Two runs side by side, and the same run against the saved baseline.
    let run = report(&[
        overnight.to_str().expect("utf-8"),
        stall.to_str().expect("utf-8"),
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("utilization mean"), "{}", run.stdout);
    assert!(run.stdout.contains(" → "), "{}", run.stdout);
    assert_eq!(
        run.stdout.matches("8 GPU(s)").count(),
        2,
        "both runs: {}",
        run.stdout
    );
    // Issue 30 §5: each run's block names its file; a memory change has its sign, in GiB like
    // the columns; the summed pattern time says it is summed; JSON rows carry numbers.
    assert!(
        run.stdout
            .contains(&format!("== before: {}", overnight.display()))
            && run
                .stdout
                .contains(&format!("== after: {}", stall.display())),
        "{}",
        run.stdout
    );
    let memory = run
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("memory peak"))
        .unwrap_or_else(|| panic!("{}", run.stdout));
    assert!(
        !memory.contains("MiB") && !memory.contains('±') && memory.contains("GiB"),
        "{memory}"
    );
    assert!(
        run.stdout.contains("GPU-time in problem patterns"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("added up"), "{}", run.stdout);
    let json = report(&[
        overnight.to_str().expect("utf-8"),
        stall.to_str().expect("utf-8"),
        "--json",
    ])
    .json();
    let rows = json["compare"].as_array().expect("compare rows");
    let util = rows
        .iter()
        .find(|r| r["what"] == "utilization mean")
        .expect("utilization row");
    assert!(
        util["before_value"].is_f64() && util["after_value"].is_f64(),
        "{util}"
    );
    let run = report(&[stall.to_str().expect("utf-8"), "--baseline", "overnight"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("baseline overnight"), "{}", run.stdout);
    assert!(
        run.stdout.contains("WORSE"),
        "the stall run is worse: {}",
        run.stdout
    );
    let run = report(&[stall.to_str().expect("utf-8"), "--baseline", "nope"]);
    assert_ne!(run.code, 0);
    assert!(
        run.stderr.contains("saved ones: overnight"),
        "{}",
        run.stderr
    );
}

/// Every hand-written log shape reports without an error.
#[test]
fn every_log_shape_reports() {
    let logs = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/logs");
    let text = std::fs::read_to_string(logs.join("expected.toml")).expect("expected.toml");
    let doc: toml::Value = toml::from_str(&text).expect("parses");
    for log in doc["log"].as_array().expect("[[log]]") {
        let file = logs.join(log["file"].as_str().expect("file"));
        let mut args = vec![
            "report".to_string(),
            file.display().to_string(),
            "--json".into(),
        ];
        for a in log["args"].as_array().expect("args") {
            args.push(a.as_str().expect("arg").to_string());
        }
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = gpuwatch(&argv, &[]);
        assert_eq!(run.code, 0, "{}: {}", file.display(), run.stderr);
        let json = run.json();
        assert_eq!(
            json["gpus"].as_array().expect("gpus").len() as i64,
            log["gpus"].as_integer().expect("gpus"),
            "{}",
            file.display()
        );
    }
}

/// Real logs recorded by others (`tests/fixtures/real/others-*`): each is reported, every
/// finding an expert sees is named on the right GPU, and healthy GPUs have none
/// (`tests/fixtures/real/expected.toml`).
#[test]
fn real_logs_are_diagnosed_as_an_expert_would() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/real");
    let spec: toml::Table = std::fs::read_to_string(dir.join("expected.toml"))
        .expect("expected.toml")
        .parse()
        .expect("expected.toml is TOML");
    let pairs = |v: Option<&toml::Value>| -> Vec<(u32, String)> {
        v.and_then(toml::Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|f| {
                        (
                            u32::try_from(f["gpu"].as_integer().expect("gpu")).expect("gpu"),
                            f["pattern"].as_str().expect("pattern").to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut failures = Vec::new();
    let logs = spec["log"].as_array().expect("[[log]]");
    assert!(logs.len() >= 6, "at least six real logs");
    for log in logs {
        let file = log["file"].as_str().expect("file");
        let path = dir.join(file);
        let mut args = vec![
            "report".to_string(),
            "--json".into(),
            path.display().to_string(),
        ];
        if let Some(a) = log.get("args").and_then(toml::Value::as_array) {
            args.extend(a.iter().map(|x| x.as_str().expect("arg").to_string()));
        }
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = gpuwatch(&argv, &[]);
        if run.code != 0 {
            failures.push(format!("{file}: exit {}: {}", run.code, run.stderr));
            continue;
        }
        let json = run.json();
        let got: Vec<(u32, String)> = json["findings"]
            .as_array()
            .expect("findings")
            .iter()
            .map(|f| {
                (
                    u32::try_from(f["gpu"].as_u64().expect("gpu")).expect("gpu"),
                    f["pattern"].as_str().expect("pattern").to_string(),
                )
            })
            .collect();
        let want = pairs(log.get("finding"));
        let allowed = pairs(log.get("allowed"));
        for w in &want {
            if !got.contains(w) {
                failures.push(format!(
                    "{file}: missing {} on GPU {}; got {got:?}",
                    w.1, w.0
                ));
            }
        }
        for q in log
            .get("quiet")
            .and_then(toml::Value::as_array)
            .into_iter()
            .flatten()
        {
            let q = u32::try_from(q.as_integer().expect("gpu")).expect("gpu");
            let on: Vec<&(u32, String)> = got.iter().filter(|g| g.0 == q).collect();
            if !on.is_empty() {
                failures.push(format!("{file}: GPU {q} must stay quiet; got {on:?}"));
            }
        }
        if log.get("exact").and_then(toml::Value::as_bool) == Some(true) {
            for g in &got {
                if !want.contains(g) && !allowed.contains(g) {
                    failures.push(format!("{file}: unexpected {} on GPU {}", g.1, g.0));
                }
            }
        }
        if let Some(max) = log
            .get("max_abs_trend_mib_per_h")
            .and_then(toml::Value::as_integer)
        {
            for g in json["gpus"].as_array().expect("gpus") {
                let t = g["mem_trend_mib_per_h"].as_f64().unwrap_or(0.0);
                if t.abs() > max as f64 {
                    failures.push(format!(
                        "{file}: GPU {} memory trend {t:.0} MiB/h",
                        g["index"]
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// A log of 10,000 GPUs (three ticks) makes a page under 2 MB that says it shows a part of them;
/// a file of one long line says what it is instead of "empty file".
#[test]
fn huge_logs_are_summarised_and_a_line_without_end_is_named() {
    let report = |args: &[&str]| {
        let mut all = vec!["report"];
        all.extend_from_slice(args);
        gpuwatch(&all, &[])
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("many.csv");
    let mut text = String::from(
        "timestamp, index, utilization.gpu [%], memory.used [MiB], memory.total [MiB]\n",
    );
    for t in 0..3 {
        for g in 0..10_000 {
            text.push_str(&format!(
                "2024/05/01 10:00:0{t}.000, {g}, {}, 40000, 81920\n",
                if g == 7 { 3 } else { 95 }
            ));
        }
    }
    std::fs::write(&log, text).expect("write");
    let page = dir.path().join("many.html");
    let run = report(&[
        log.to_str().expect("utf-8"),
        "--out",
        page.to_str().expect("utf-8"),
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let html = std::fs::read_to_string(&page).expect("page");
    assert!(html.len() < 2_000_000, "{} bytes", html.len());
    assert!(
        html.contains("This log has 10000 GPUs"),
        "the page says it is a part"
    );
    assert!(html.contains("data-gpu=\"7\""), "the odd GPU is shown");

    let long = dir.path().join("one-line.log");
    std::fs::write(&long, "x".repeat(5 << 20)).expect("write");
    let run = report(&[long.to_str().expect("utf-8")]);
    assert_ne!(run.code, 0);
    assert!(run.stderr.contains("no line break"), "{}", run.stderr);
    assert!(!run.stderr.contains("empty file"), "{}", run.stderr);
}

/// Issue 30 §3: under `--speed`, `record` samples at its interval in simulated time. A 3 s
/// DataLoader stall recorded at `--speed 30` for a minute of the scenario is sixty 1 s ticks
/// (two seconds of wall time), not two ticks 30 s apart, and the report names the periodic
/// stall; an interval the machine cannot keep is refused, saying why.
#[test]
fn a_recording_at_speed_samples_in_simulated_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("stall.csv");
    let started = std::time::Instant::now();
    let r = common::sim(
        "dataloader-stall",
        &[
            "--speed",
            "30",
            "record",
            "--duration",
            "60s",
            "--out",
            out.to_str().expect("path"),
        ],
        &[],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    let text = std::fs::read_to_string(&out).expect("recording");
    let (_, rows) = common::csv_rows(&text);
    let ticks: std::collections::BTreeSet<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert!((55..=61).contains(&ticks.len()), "{} ticks", ticks.len());
    let report = common::gpuwatch(&["report", out.to_str().expect("path")], &[]);
    assert_eq!(report.code, 0, "{}", report.stderr);
    assert!(
        report.stdout.contains("periodically dropping to zero")
            && report.stdout.contains("every 3s"),
        "{}",
        report.stdout
    );
    let refused = common::sim(
        "healthy",
        &["--speed", "3600", "record", "--duration", "1h"],
        &[],
    );
    assert_ne!(refused.code, 0);
    assert!(
        refused
            .stderr
            .contains("at --speed 3600, an interval of 1s passes in 0.28 ms")
            && refused.stderr.contains("set --interval to 36s or more"),
        "{}",
        refused.stderr
    );
}
