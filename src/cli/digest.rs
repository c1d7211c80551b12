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
    let dir = crate::usage::dir(&config.state_dir());
    // Up to the end of the current hour: the hour in progress is the newest bucket.
    let digest = crate::usage::Ledger::load(&dir, now - period, true).digest(
        now - period,
        now + 3_600_000,
        config.digest.top_alerts.unwrap_or(5),
    );
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
