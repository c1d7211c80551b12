//! Replay benchmark: synthesizes 24 h × 8 GPUs × 1 Hz (691,200 device-samples) as a gpuwatch CSV
//! recording (written as `gpuwatch record` writes it: every row lists its GPU's processes) and
//! times `replay` through every stock rule, then measures the rule evaluation cost per tick for 8
//! GPUs.
//!
//! Run: `cargo run --release --example bench_replay [HOURS] [EVAL_INTERVAL]` (defaults 24 and
//! the engine's default `[rules] eval_interval`, every sample; rules with `every` keep theirs).

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use gpuwatch::engine::{Engine, EngineOptions};
use gpuwatch::model::{
    DeviceId, DeviceState, GpuSample, Metric, MetricValues, ProcSample, Snapshot,
};
use gpuwatch::rules::{RuleSet, RulesConfig};

const GPUS: u32 = 8;
const T0_MS: i64 = 1_796_212_800_000; // 2026-12-02T12:00:00Z

fn snapshot(t: i64, rng: &mut u64) -> Snapshot {
    let mut noise = || {
        *rng = rng
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((*rng >> 33) as f64 / f64::from(1u32 << 31)) - 0.5
    };
    let gpus = (0..GPUS)
        .map(|i| {
            let mut v = MetricValues::default();
            // a training job: 97 % busy with a 20 s dip every 30 min (checkpoint)
            let dip = t % 1800 < 20;
            v.set(
                Metric::Util,
                Some(if dip { 0.0 } else { 96.0 + 3.0 * noise() }),
            );
            v.set(Metric::MemUtil, Some(45.0 + 5.0 * noise()));
            v.set(Metric::MemUsed, Some(62.0 * 1_073_741_824.0));
            v.set(Metric::MemFree, Some(18.0 * 1_073_741_824.0));
            v.set(Metric::MemTotal, Some(80.0 * 1_073_741_824.0));
            v.set(Metric::Temp, Some((68.0 + 4.0 * noise()).round()));
            v.set(Metric::MemTemp, Some((75.0 + 4.0 * noise()).round()));
            v.set(
                Metric::Power,
                Some(if dip { 90.0 } else { 560.0 + 40.0 * noise() }),
            );
            v.set(Metric::PowerLimit, Some(700.0));
            v.set(Metric::Energy, Some(t as f64 * 500.0));
            v.set(Metric::SmClock, Some(1980.0));
            v.set(Metric::MemClock, Some(2619.0));
            v.set(Metric::ClockEventReasons, Some(0.0));
            v.set(Metric::Pstate, Some(0.0));
            v.set(Metric::EccCorrected, Some(3.0));
            v.set(Metric::EccUncorrected, Some(0.0));
            v.set(Metric::RemappedCorrectable, Some(0.0));
            v.set(Metric::RemappedUncorrectable, Some(0.0));
            v.set(Metric::RemapPending, Some(0.0));
            v.set(Metric::RemapFailure, Some(0.0));
            v.set(Metric::PcieRx, Some(1.0e9));
            v.set(Metric::PcieTx, Some(2.0e8));
            v.set(Metric::PcieReplay, Some(0.0));
            GpuSample {
                time_ms: T0_MS + t * 1000,
                id: DeviceId {
                    index: i,
                    minor: Some(i),
                    uuid: format!("GPU-{i:08x}-0000-0000-0000-000000000000"),
                    pci_bus_id: format!("00000000:{:02X}:00.0", i + 0x18),
                    name: "NVIDIA H100 80GB HBM3".into(),
                },
                state: DeviceState::Ok,
                values: v,
            }
        })
        .collect();
    let processes = (t % 10 == 0).then(|| {
        (0..GPUS)
            .map(|i| ProcSample::compute(1000 + i, i, String::new(), Some(61 * 1_073_741_824)))
            .collect()
    });
    Snapshot {
        time_ms: T0_MS + t * 1000,
        gpus,
        processes,
        xids: Vec::new(),
        ..Snapshot::default()
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let hours: i64 = args.get(1).map_or(Ok(24), |h| h.parse())?;
    let eval = args.get(2).cloned();
    let ticks = hours * 3600;
    // `BENCH_RULES=DIR` times another rule set (e.g. one rule, to see the ingest cost alone).
    let rules_dir = std::env::var_os("BENCH_RULES").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("rules"),
        PathBuf::from,
    );
    let cfg = RulesConfig {
        eval_interval: eval
            .as_deref()
            .map(gpuwatch::values::parse_duration_ms)
            .transpose()
            .map_err(anyhow::Error::msg)?
            .map(gpuwatch::values::DurationSetting::from_ms),
        ..RulesConfig::default()
    };
    let rules = RuleSet::load(&[rules_dir], &cfg).map_err(|e| {
        anyhow::anyhow!(
            "{}",
            e.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        )
    })?;

    let dir = tempfile::tempdir()?;
    let path = dir.path().join("bench.csv");
    let t = Instant::now();
    {
        // (the recorder's own rows: every row lists its GPU's processes as last read)
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path)?);
        writeln!(f, "{}", gpuwatch::record::header_line())?;
        let mut rows = gpuwatch::record::CsvRows::new();
        let mut text = String::new();
        let mut rng = 42u64;
        for k in 0..ticks {
            text.clear();
            rows.render(&snapshot(k, &mut rng), &mut text);
            f.write_all(text.as_bytes())?;
        }
        f.flush()?;
    }
    let size = std::fs::metadata(&path)?.len();
    println!(
        "synthesized {hours} h x {GPUS} GPUs x 1 Hz = {} device-samples, {:.0} MB CSV, in {:.1} s",
        ticks * i64::from(GPUS),
        size as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );

    // 1. Parsing alone.
    let t = Instant::now();
    let mut n = 0u64;
    for s in gpuwatch::import::Importer::open(&path, &Default::default())? {
        n += s?.snapshot.gpus.len() as u64;
    }
    let parse_s = t.elapsed().as_secs_f64();
    println!("parse only: {n} device-samples in {parse_s:.2} s");

    // 2. Full replay (parse + windows + {} rules + alerts), as `gpuwatch replay` does it.
    let opts = EngineOptions {
        hostname: "bench".into(),
        eval_interval_ms: cfg.eval_interval_ms(),
        sample_interval_ms: None,
        clock_speed: 1.0,
    };
    let t = Instant::now();
    let cpu0 = gpuwatch::sys::thread_cpu_ns();
    let mut events = 0;
    let (ticks, mut back) = gpuwatch::import::read_ahead_giving_back(
        gpuwatch::import::Importer::open(&path, &Default::default())?,
    );
    let mut first = Some(Engine::new(rules.clone(), opts.clone()));
    let (stats, engine) = gpuwatch::engine::replay_segments(
        ticks,
        || Ok(first.take().expect("one time line")),
        |_| {},
        |_| events += 1,
        |s| back.give(s),
    )?;
    let replay_s = t.elapsed().as_secs_f64();
    let engine_cpu_s = (gpuwatch::sys::thread_cpu_ns() - cpu0) as f64 / 1e9;
    let eval = eval.unwrap_or_else(|| "sample (default)".into());
    let (reused, ran) = engine.reuse_stats();
    println!(
        "replay: {} snapshots, {} device-samples through {} rules (eval_interval {eval}, rules' own `every` kept) in {replay_s:.2} s = {:.2}x parse only, {:.0} µs per tick ({events} events; {:.0}% of {} evaluations reused)",
        stats.snapshots, stats.gpu_samples, engine.rule_count(), replay_s / parse_s,
        replay_s * 1e6 / stats.snapshots.max(1) as f64,
        reused as f64 * 100.0 / (reused + ran).max(1) as f64,
        reused + ran
    );
    println!("  the engine's thread: {engine_cpu_s:.2} s of CPU in those {replay_s:.2} s");

    // Which rules ran their script, per tick (the rest were answered from their last result).
    let mut runs: Vec<(&str, u64)> = engine
        .rules()
        .rules()
        .iter()
        .map(|r| r.spec.name.as_str())
        .zip(engine.runs_by_rule().iter().copied())
        .filter(|(_, n)| *n > 0)
        .collect();
    runs.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    println!(
        "  scripts run per tick: {}",
        runs.iter()
            .map(|(name, n)| format!("{name} {:.2}", *n as f64 / stats.snapshots.max(1) as f64))
            .collect::<Vec<_>>()
            .join(", ")
    );

    // (BENCH_REPLAY_ONLY=1: stop here, e.g. to profile the replay alone)
    if std::env::var_os("BENCH_REPLAY_ONLY").is_some() {
        return Ok(());
    }

    // 2b. The same without reusing results (every due rule runs its script for every GPU), side
    //     by side with the run above; the events must be the same.
    let mut plain = Engine::new(rules.clone(), opts.clone());
    plain.set_reuse(false);
    let t = Instant::now();
    let mut plain_events = 0;
    gpuwatch::engine::replay(&mut plain, snapshots(&path)?, |_| plain_events += 1)?;
    let plain_s = t.elapsed().as_secs_f64();
    println!(
        "replay without reuse: {plain_s:.2} s ({plain_events} events), {:.1}x the time with reuse",
        plain_s / replay_s
    );
    assert_eq!(plain_events, events, "reuse changed the events");

    // 2c. `gpuwatch report` of the same recording: import, rules (diagnosis and alert timeline),
    //     per-GPU numbers, charts, the HTML page.
    let t = Instant::now();
    let report = gpuwatch::report::build(
        vec![path.display().to_string()],
        gpuwatch::import::read_ahead_assembled(gpuwatch::import::Importer::open(
            &path,
            &Default::default(),
        )?),
        || Ok(Engine::new(rules.clone(), opts.clone())),
        &Default::default(),
    )?;
    let page = gpuwatch::report::html::render(&report, None);
    let report_s = t.elapsed().as_secs_f64();
    let html = std::env::temp_dir().join("gpuwatch-bench-report.html");
    std::fs::write(&html, &page)?;
    println!(
        "report: {report_s:.2} s for {} ticks x {} GPUs; HTML page {:.2} MB ({})",
        report.summary.ticks,
        report.summary.gpus.len(),
        page.len() as f64 / 1e6,
        html.display()
    );

    // 3. Rule evaluation cost per tick for 8 GPUs: warm windows, then observe every snapshot with
    //    the default cadence (each rule at every sample or at its own `every`).
    let opts = EngineOptions {
        hostname: "bench".into(),
        eval_interval_ms: 0,
        sample_interval_ms: Some(1000),
        clock_speed: 1.0,
    };
    let mut engine = Engine::new(rules, opts);
    let mut rng = 7u64;
    let warm = 3600;
    let snaps: Vec<Snapshot> = (0..warm + 600).map(|k| snapshot(k, &mut rng)).collect();
    for s in &snaps[..warm as usize] {
        engine.observe(s);
    }
    let t = Instant::now();
    for s in &snaps[warm as usize..] {
        engine.observe(s);
    }
    let per_tick_us = t.elapsed().as_secs_f64() * 1e6 / 600.0;
    println!(
        "evaluation cost: {per_tick_us:.0} µs per tick for {GPUS} GPUs x {} rules ({:.2} µs per rule evaluation, ingest included)",
        engine.rule_count(),
        per_tick_us / (f64::from(GPUS) * engine.rule_count() as f64)
    );
    // 4. Per rule, on one warm GPU history.
    let mut hist = gpuwatch::window::GpuHistory::new(DeviceId::default());
    for s in &snaps {
        hist.push(&s.gpus[0]);
    }
    let hist = std::sync::Arc::new(hist);
    let now = snaps.last().map_or(0, |s| s.time_ms);
    let set = engine.rules().clone();
    for (i, r) in set.rules().iter().enumerate() {
        if r.scope != gpuwatch::rules::RuleScope::Gpu {
            continue;
        }
        let t = Instant::now();
        for k in 0..2000 {
            // a new time defeats the per-tick cache, as a real evaluation would
            let _ = set.eval_gpu(i, &hist, now - k % 2);
        }
        println!(
            "  {:<20} {:6.2} µs",
            r.spec.name,
            t.elapsed().as_secs_f64() * 1e6 / 2000.0
        );
    }
    Ok(())
}

/// The recording's snapshots, read and assembled on their own thread as `gpuwatch replay` reads
/// them.
fn snapshots(
    path: &std::path::Path,
) -> anyhow::Result<impl Iterator<Item = anyhow::Result<gpuwatch::model::Snapshot>>> {
    let importer = gpuwatch::import::Importer::open(path, &Default::default())?;
    Ok(gpuwatch::import::read_ahead_assembled(importer).map(|t| t.map(|t| t.snapshot)))
}
