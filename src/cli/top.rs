//! `gpuwatch top`: flags, and the sampler, engine and options the view runs with. The view
//! itself is [`crate::top`].

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::time::Duration;

use super::GlobalArgs;
use crate::config::Setup;

/// Arguments of `top`.
#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// Configuration file: its state directory (the daemon's socket, `run`'s jobs) and rules.
    #[arg(long, value_name = "FILE", env = "GPUWATCH_CONFIG")]
    pub config: Option<PathBuf>,
    /// Refresh interval (default 1s).
    #[arg(long, value_name = "DURATION", value_parser = crate::values::parse_duration)]
    pub interval: Option<Duration>,
    /// Draw with ASCII only (default: when the locale is not UTF-8).
    #[arg(long)]
    pub ascii: bool,
}

/// Runs `top`.
pub fn top(global: &GlobalArgs, args: &TopArgs) -> anyhow::Result<i32> {
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        eprintln!("gpuwatch: top needs a terminal (for a log use `gpuwatch record`, for a table `gpuwatch status`)");
        return Ok(2);
    }
    let setup = match Setup::load(args.config.as_deref(), &[]) {
        Ok(s) => s,
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("{e}");
            }
            return Ok(1);
        }
    };
    let config = &setup.config;
    let hostname = config.hostname();
    let interval = args.interval.unwrap_or(Duration::from_secs(1));
    let wall = crate::sys::wall_interval(interval, "--interval").map_err(anyhow::Error::msg)?;
    let engine = crate::engine::Engine::new(setup.rules, config.engine_options(&hostname));
    let mut sampler_cfg = config.sampler_config(&global.sampler_config());
    sampler_cfg.process_interval = interval.max(Duration::from_secs(1));
    // a screen watched by a person: SM activity as fresh as the process lists
    sampler_cfg.gpm_interval = sampler_cfg.gpm_interval.min(Duration::from_secs(1));
    let sampler = match crate::pipeline::SamplerThread::open(&sampler_cfg, wall, None) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("gpuwatch: {e}");
            return Ok(crate::pipeline::EXIT_NO_NVML);
        }
    };
    let state_dir = config.state_dir();
    let opts = crate::top::TopOptions {
        host: hostname,
        interval,
        look: crate::top::view::Look {
            ascii: args.ascii || !crate::top::terminal_is_utf8(),
            color: std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        },
        socket: state_dir.join("control.sock"),
        jobs_dir: state_dir.join("jobs"),
    };
    crate::top::run(&opts, sampler, engine)
}
