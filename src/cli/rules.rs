//! `gpuwatch check`, `gpuwatch test` and `gpuwatch replay`: validate rules, run rule unit tests,
//! and play a recording (gpuwatch CSV or nvidia-smi CSV) through the rules in virtual time.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::GlobalArgs;
use crate::config::{Config, Setup};
use crate::engine::{Engine, EngineOptions};
use crate::model::{AlertEvent, AlertStatus};
use crate::rules::{RuleSet, RulesConfig};
use crate::trace::format_time_ms;

/// Arguments of `check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Configuration file to validate (its `[daemon] rules` and `[rules] dirs` name the rules).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Rule directory or file (repeatable). Default: from the config, else ./rules, else the
    /// stock rules shipped with gpuwatch.
    #[arg(long = "rules", value_name = "DIR")]
    pub rules: Vec<PathBuf>,
}

fn load_config(path: Option<&Path>) -> anyhow::Result<Option<Config>> {
    path.map(crate::config::load).transpose()
}

/// Runs `check`: the config, every rule and what needs both, loaded exactly as `daemon` and
/// `run` load them; every problem on its own line as `file:line:column: message`.
pub fn check(_global: &GlobalArgs, args: &CheckArgs) -> anyhow::Result<i32> {
    match Setup::load(args.config.as_deref(), &args.rules) {
        Ok(setup) => {
            let set = &setup.rules;
            let names: Vec<&str> = set.rules().iter().map(|r| r.spec.name.as_str()).collect();
            println!(
                "ok: {} rules in {} files ({})",
                set.len(),
                set.files().len(),
                names.join(", ")
            );
            Ok(0)
        }
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("{e}");
            }
            Ok(1)
        }
    }
}

/// Arguments of `test`.
#[derive(Debug, clap::Args)]
pub struct TestArgs {
    /// Rule test files (TOML, see docs/rules.md); a directory runs every `*.toml` in it.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

/// Runs `test`.
pub fn test(_global: &GlobalArgs, args: &TestArgs) -> anyhow::Result<i32> {
    let mut files = Vec::new();
    for f in &args.files {
        if f.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(f)
                .with_context(|| format!("cannot read {}", f.display()))?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                .collect();
            found.sort();
            files.extend(found);
        } else {
            files.push(f.clone());
        }
    }
    let (mut passed, mut failed) = (0, 0);
    let mut out = std::io::stdout().lock();
    for f in &files {
        writeln!(out, "{}", f.display())?;
        match crate::engine::testfile::run_file(f) {
            Ok(reports) => {
                for r in reports {
                    if r.passed {
                        passed += 1;
                        writeln!(out, "  ok    {}", r.name)?;
                    } else {
                        failed += 1;
                        writeln!(out, "  FAIL  {}", r.name)?;
                        for l in r.detail.lines() {
                            writeln!(out, "        {l}")?;
                        }
                    }
                }
            }
            Err(e) => {
                failed += 1;
                writeln!(out, "  ERROR {e}")?;
            }
        }
    }
    writeln!(out, "{passed} passed, {failed} failed")?;
    Ok(i32::from(failed > 0))
}

/// Arguments of `replay`.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// The recording or log: gpuwatch CSV, nvidia-smi CSV, table or dmon, a monitoring-script
    /// log (detected; see `import`).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Rule directory or file (repeatable); default as for `check`.
    #[arg(long = "rules", value_name = "DIR")]
    pub rules: Vec<PathBuf>,
    /// Configuration file (for `[rules]` parameters, directories and eval_interval).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// One JSON object per line per transition.
    #[arg(long)]
    pub json: bool,
    /// How to read the log.
    #[command(flatten)]
    pub log: super::import::LogArgs,
    /// Evaluation cadence of rules without their own `every` (default: `[rules] eval_interval`,
    /// else 0 = every snapshot).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_setting)]
    pub eval_interval: Option<crate::values::DurationSetting>,
    /// Also print `repeat` re-notifications.
    #[arg(long)]
    pub repeats: bool,
}

fn parse_duration_setting(s: &str) -> Result<crate::values::DurationSetting, String> {
    crate::values::parse_duration_ms(s).map(crate::values::DurationSetting::from_ms)
}

/// One transition as `replay --json` prints it.
pub fn event_json(ev: &AlertEvent) -> serde_json::Value {
    serde_json::json!({
        "at": format_time_ms(ev.at_ms),
        "alert": ev.name,
        "gpu": ev.gpu,
        "state": match ev.status { AlertStatus::Firing => "firing", AlertStatus::Resolved => "resolved" },
        "severity": ev.severity.as_str(),
        "summary": ev.annotations.get("summary").cloned().unwrap_or_default(),
        "ended": ev.ended,
    })
}

/// Runs `replay`.
pub fn replay(_global: &GlobalArgs, args: &ReplayArgs) -> anyhow::Result<i32> {
    let config = load_config(args.config.as_deref())?;
    let mut rules_config: RulesConfig =
        config.as_ref().map(|c| c.rules.clone()).unwrap_or_default();
    if let Some(e) = args.eval_interval {
        rules_config.eval_interval = Some(e);
    }
    let eval_interval_ms = rules_config.eval_interval_ms();
    let paths = crate::config::rule_paths(&args.rules, config.as_ref());
    let rules = match RuleSet::load(&paths, &rules_config) {
        Ok(r) => r,
        Err(errs) => {
            for e in errs {
                eprintln!("{e}");
            }
            return Ok(1);
        }
    };
    let importer = crate::import::Importer::open(&args.file, &args.log.options())?;
    let import_stats = importer.stats();
    let opts = EngineOptions {
        hostname: crate::sys::hostname(),
        eval_interval_ms,
        sample_interval_ms: None,
        clock_speed: 1.0,
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut transitions = 0u64;
    let mut write_err: Option<std::io::Error> = None;
    let started = std::time::Instant::now();
    let mut on_event = |ev: &AlertEvent| {
        if ev.repeat && !args.repeats {
            return;
        }
        transitions += 1;
        let r = if args.json {
            writeln!(out, "{}", event_json(ev))
        } else {
            let state = match ev.state_word() {
                "STILL" => "REPEAT",
                w => w,
            };
            let gpu = ev
                .gpu
                .map_or_else(|| "host".to_string(), |g| format!("gpu {g}"));
            writeln!(
                out,
                "{}  {state:<8}  {:<20} {gpu:<6} {:<8} {}",
                format_time_ms(ev.at_ms),
                ev.name,
                ev.severity.as_str(),
                ev.told_summary()
            )
        };
        if let Err(e) = r {
            write_err.get_or_insert(e);
        }
    };
    // Each segment (time went back beyond the reordering window) is replayed from fresh rules:
    // windows never mix two time lines.
    let mut first = Some(Engine::new(rules, opts.clone()));
    let fresh = || -> anyhow::Result<Engine> {
        if let Some(e) = first.take() {
            return Ok(e);
        }
        Ok(Engine::new(
            super::load_rules(&paths, &rules_config)?,
            opts.clone(),
        ))
    };
    let (ticks, mut back) = crate::import::read_ahead_giving_back(importer);
    let (stats, engine) =
        crate::engine::replay_segments(ticks, fresh, |_| {}, &mut on_event, |s| back.give(s))?;
    if let Some(e) = write_err {
        return Err(e.into());
    }
    out.flush()?;
    drop(out);
    let still: Vec<String> = engine
        .alerts()
        .filter(|a| a.phase == crate::alert::Phase::Firing)
        .map(|a| match a.gpu {
            Some(g) => format!("{} (gpu {g})", a.labels.get("alertname").unwrap_or(&a.key)),
            None => a.labels.get("alertname").unwrap_or(&a.key).clone(),
        })
        .collect();
    for w in import_stats.warnings(&args.file.display().to_string()) {
        eprintln!("warning: {w}");
    }
    eprintln!(
        "replayed {} snapshots ({} GPU samples{}) through {} rules in {:.2} s: {transitions} transitions; firing at the end: {}",
        stats.snapshots,
        stats.gpu_samples,
        match (stats.first_ms, stats.last_ms) {
            (Some(a), Some(b)) => format!(", {} to {}", format_time_ms(a), format_time_ms(b)),
            _ => String::new(),
        },
        engine.rule_count(),
        started.elapsed().as_secs_f64(),
        if still.is_empty() { "none".to_string() } else { still.join(", ") }
    );
    Ok(0)
}
