//! `gpuwatch report`: a run's numbers, diagnosis, alert timeline and charts from any log
//! `import` reads; two logs side by side; baselines.

use std::path::{Path, PathBuf};

use std::io::Write as _;

use anyhow::{bail, Context as _};

use super::import::LogArgs;
use super::GlobalArgs;
use crate::config::Config;
use crate::engine::{Engine, EngineOptions};
use crate::report::{compare, Report};
use crate::sys::output::Dash;

/// Arguments of `report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// The log of the run; with two, BEFORE AFTER side by side.
    #[arg(value_name = "FILE", required = true, num_args = 1..=2)]
    pub files: Vec<PathBuf>,
    /// Write the HTML page here (one self-contained file).
    #[arg(long, short, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Print every number as JSON instead of the text summary.
    #[arg(long)]
    pub json: bool,
    /// Rule directory or file for the diagnosis and the alert timeline (repeatable); default
    /// as for `check`.
    #[arg(long = "rules", value_name = "DIR")]
    pub rules: Vec<PathBuf>,
    /// Configuration file (`[rules]` parameters, `[report]` price and CO₂, the state directory
    /// that keeps baselines).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Keep this run's summary as baseline NAME.
    #[arg(long, value_name = "NAME")]
    pub save_baseline: Option<String>,
    /// Compare this run with baseline NAME and flag what got worse.
    #[arg(long, value_name = "NAME", conflicts_with = "save_baseline")]
    pub baseline: Option<String>,
    /// How to read the logs.
    #[command(flatten)]
    pub log: LogArgs,
}

/// Reads one log into a report, replaying `rules` (default as for `check`) for the diagnosis.
pub(super) fn build(
    path: &Path,
    rules: &[PathBuf],
    log: &crate::import::ImportOptions,
    config: &Config,
) -> anyhow::Result<Report> {
    let importer = crate::import::Importer::open(path, log)?;
    let stats = importer.stats();
    let name = path.display().to_string();
    let mut report = build_from(
        vec![name.clone()],
        crate::import::read_ahead_assembled(importer),
        rules,
        config,
    )?;
    report.summary.warnings = stats.warnings(&name);
    if report.summary.ticks == 0 {
        bail!("{name}: no samples in the log");
    }
    Ok(report)
}

/// A report of `ticks` (read from `sources`), replaying `rules` (default as for `check`).
pub(super) fn build_from(
    sources: Vec<String>,
    ticks: impl Iterator<Item = anyhow::Result<crate::import::Imported>>,
    rules: &[PathBuf],
    config: &Config,
) -> anyhow::Result<Report> {
    let paths = crate::config::rule_paths(rules, Some(config));
    let rules_config = config.rules.clone();
    let opts = EngineOptions {
        hostname: crate::sys::hostname(),
        eval_interval_ms: rules_config.eval_interval_ms(),
        sample_interval_ms: None,
        clock_speed: 1.0,
    };
    let fresh = || -> anyhow::Result<Engine> {
        Ok(Engine::new(
            super::load_rules(&paths, &rules_config)?,
            opts.clone(),
        ))
    };
    crate::report::build(sources, ticks, fresh, &config.report)
}

/// Runs `report`.
pub fn run(_global: &GlobalArgs, args: &ReportArgs) -> anyhow::Result<i32> {
    let config = match &args.config {
        Some(p) => crate::config::load(p)?,
        None => Config::builtin(),
    };
    // Where the page goes is settled before the logs are read (a directory is an error now).
    let page_target = match &args.out {
        Some(p) => Some(crate::sys::output::target(p, Dash::Stdout)?),
        None => None,
    };
    let page_to_stdout = page_target == Some(crate::sys::output::Target::Stdout);
    if page_to_stdout && args.json {
        bail!("--out - and --json both want standard output: write the page to a file");
    }
    let mut reports = Vec::new();
    for f in &args.files {
        reports.push(build(f, &args.rules, &args.log.options(), &config)?);
    }
    for r in &reports {
        for w in &r.summary.warnings {
            eprintln!("warning: {w}");
        }
    }
    let after = reports.pop().context("a report")?;
    let (against, before) = match (reports.pop(), &args.baseline) {
        (Some(b), _) => (Some(args.files[0].display().to_string()), Some(b.summary)),
        (None, Some(name)) => (
            Some(format!("baseline {name}")),
            Some(compare::load(&config.state_dir(), name)?),
        ),
        (None, None) => (None, None),
    };
    let rows = before
        .as_ref()
        .map(|b| compare::compare(b, &after.summary))
        .unwrap_or_default();
    if let Some(target) = &page_target {
        let page =
            crate::report::html::render(&after, against.as_deref().map(|a| (a, rows.as_slice())));
        let mut out = crate::sys::output::Output::to(target)?;
        out.write_all(page.as_bytes())?;
        out.finish()?;
    }
    if args.json {
        let value = match &before {
            Some(b) => serde_json::json!({
                "before": b,
                "after": after.summary,
                "compare": rows.iter().map(|r| serde_json::json!({
                    "what": r.what, "before": r.before, "after": r.after,
                    "before_value": r.before_value, "after_value": r.after_value,
                    "change": r.change, "worse": r.worse,
                })).collect::<Vec<_>>(),
            }),
            None => serde_json::to_value(&after.summary)?,
        };
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        let mut text = String::new();
        let last = args.files[args.files.len() - 1].display().to_string();
        if let (Some(b), Some(a)) = (&before, &against) {
            text.push_str(&format!("== before: {a}\n"));
            text.push_str(&crate::report::text(b));
            text.push('\n');
            text.push_str(&format!("== after: {last}\n"));
        }
        text.push_str(&crate::report::text(&after.summary));
        if let Some(a) = &against {
            text.push('\n');
            text.push_str(&compare::text(&rows, a, &last));
        }
        // With the page on standard output, the summary goes to standard error.
        if page_to_stdout {
            eprint!("{text}");
        } else {
            print!("{text}");
        }
    }
    if let Some(out) = args.out.as_ref().filter(|_| !page_to_stdout) {
        eprintln!("report: {}", out.display());
    }
    if let Some(name) = &args.save_baseline {
        let path = compare::save(&config.state_dir(), name, &after.summary)?;
        eprintln!("baseline `{name}` saved: {}", path.display());
    }
    let worse = rows.iter().filter(|r| r.worse).count();
    if worse > 0 {
        eprintln!(
            "{worse} quantit{} got worse",
            if worse == 1 { "y" } else { "ies" }
        );
    }
    Ok(0)
}
