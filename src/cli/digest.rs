//! `gpuwatch digest [--since 7d] [--json]`: who used the GPUs, from the daemon's accounting in
//! `state_dir/usage/` (see [`crate::usage`]) — what `[digest] schedule` sends.

use std::path::PathBuf;

use super::GlobalArgs;
use crate::config::Config;

/// Arguments of `digest`.
#[derive(Debug, clap::Args)]
pub struct DigestArgs {
    /// The daemon's configuration file (its `state_dir` has the accounting).
    #[arg(long, value_name = "FILE", env = "GPUWATCH_CONFIG")]
    pub config: Option<PathBuf>,
    /// The period, back from now (e.g. `24h`, `7d`).
    #[arg(long, value_name = "DURATION", default_value = "7d")]
    pub since: String,
    /// One JSON document.
    #[arg(long)]
    pub json: bool,
    /// Read the accounting in this state directory instead of the config's `state_dir` (e.g.
    /// one a `--speed` daemon kept).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

/// Runs `digest`.
pub fn digest(_global: &GlobalArgs, args: &DigestArgs) -> anyhow::Result<i32> {
    let config = match &args.config {
        Some(p) => crate::config::load(p)?,
        None => Config::builtin(),
    };
    let period = match crate::values::parse_duration_ms(&args.since) {
        Ok(ms) if ms > 0 => ms,
        Ok(_) => {
            eprintln!("gpuwatch: --since {}: must be positive", args.since);
            return Ok(2);
        }
        Err(e) => {
            eprintln!("gpuwatch: --since: {e}");
            return Ok(2);
        }
    };
    let now = crate::sys::now_ms();
    let dir = crate::usage::dir(&args.state_dir.clone().unwrap_or_else(|| config.state_dir()));
    let ledger = crate::usage::Ledger::load(&dir, now - period, true);
    // Up to now (the hour in progress is the newest bucket) — or, for the state a `--speed`
    // daemon kept, whose simulated clock ran ahead of the wall clock, up to the end of its
    // newest hour.
    let until = match ledger.hours.keys().next_back() {
        Some(h) if *h > now => h + 3_600_000,
        _ => now,
    };
    let digest = ledger.digest(until - period, until, config.digest.top_alerts.unwrap_or(5));
    for s in &digest.skipped {
        eprintln!("warning: {s}");
    }
    if args.json {
        println!("{}", digest.to_json());
    } else {
        print!("{}", digest.render_text(&config.hostname()));
    }
    Ok(0)
}
