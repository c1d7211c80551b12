//! Command-line interface: clap definitions and dispatch. Each subcommand lives in one file under
//! `cli/`; this file only parses arguments and maps results to exit codes.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

mod control;
mod daemon;
mod digest;
mod doctor;
mod export;
mod import;
mod init;
mod inspect;
mod job;
mod record;
mod report;
mod rules;
mod service;
mod slurm;
mod top;

/// Exit status for "the NVML library could not be used" (no driver, bad scenario).
pub use crate::pipeline::EXIT_NO_NVML;

/// `gpuwatch --version`: the version, the commit it was built from, the target, and whether
/// the simulated NVML library is embedded (`build.rs`).
macro_rules! version {
    ($sim:literal) => {
        concat!(
            env!("CARGO_PKG_VERSION"),
            " (commit ",
            env!("GPUWATCH_GIT_COMMIT"),
            ", ",
            env!("GPUWATCH_TARGET"),
            ", ",
            $sim,
            ")"
        )
    };
}
/// The version line (see [`version!`]).
#[cfg(gpuwatch_embedded_sim)]
pub const VERSION: &str = version!("simulated NVML embedded");
/// The version line (see [`version!`]).
#[cfg(not(gpuwatch_embedded_sim))]
pub const VERSION: &str =
    version!("simulated NVML not embedded: --sim needs libnvml_sim.so beside the executable");

/// gpuwatch — a GPU watchdog for unattended deep-learning training.
#[derive(Debug, Parser)]
#[command(name = "gpuwatch", version = VERSION, about, propagate_version = true)]
pub struct Cli {
    /// Options every command shares.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Options shared by every command.
#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// Run against the simulated NVML library (next to the gpuwatch executable, or --nvml-lib)
    /// playing this scenario: a shipped name (healthy, overnight, xid-79, …) or a TOML file.
    #[arg(long, global = true, value_name = "SCENARIO")]
    pub sim: Option<String>,
    /// Path of the NVML library to load (default: libnvidia-ml.so.1 from the loader path).
    #[arg(long, global = true, value_name = "PATH", env = "GPUWATCH_NVML_LIB")]
    pub nvml_lib: Option<PathBuf>,
    /// With --sim: play the scenario N times faster (1–3600). Every command follows the
    /// faster clock — sampling at its interval of the scenario's time (`record`'s --interval and
    /// --duration, `top`, `run`; an interval under 10 ms of wall time is refused), rule windows
    /// and holds, notification timing — so a simulated night is told in minutes. The daemon's
    /// state is kept apart from the real one, in `daemon --state-dir` or a new private
    /// `$TMPDIR/gpuwatch-sim-*` directory, kept when it stops (it says where; `gpuwatch digest
    /// --state-dir DIR` reads it); one left by a daemon killed with `kill -9` is reported, its
    /// undelivered messages dropped, and removed by the next.
    #[arg(long, global = true, value_name = "N", requires = "sim")]
    pub speed: Option<f64>,
    /// How logs and alerts are printed: `auto` (human lines on a terminal, text records under
    /// journald, in files and pipes), `human`, `text` or `json`.
    #[arg(
        long,
        global = true,
        value_name = "FORMAT",
        value_enum,
        default_value = "auto"
    )]
    pub log_format: crate::daemon::console::LogFormat,
    /// Do not read the GPM profiling metrics (SM active, tensor and DRAM activity, … on Hopper
    /// and later): they stay absent, and no GPM sample is taken each tick (as `[daemon] gpm =
    /// false`).
    #[arg(long, global = true)]
    pub no_gpm: bool,
}

impl GlobalArgs {
    /// The sampler configuration these options ask for (library path, `--sim` scenario); the
    /// caller adjusts the process interval and XID events to its needs.
    pub fn sampler_config(&self) -> crate::sampler::SamplerConfig {
        crate::sampler::SamplerConfig {
            nvml_lib: self.nvml_lib.clone(),
            sim_scenario: self.sim.clone(),
            sim_time_scale: self.speed,
            gpm: !self.no_gpm,
            ..crate::sampler::SamplerConfig::default()
        }
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// One-shot table of every GPU and its processes.
    Status(inspect::StatusArgs),
    /// List GPUs with their identities and CUDA_VISIBLE_DEVICES mapping.
    Devices(inspect::DevicesArgs),
    /// Preflight before a long job: PCIe link, persistence, pending repairs, recovery action,
    /// power and clock settings, ECC, foreign processes, missing GPUs (exit 1 with findings).
    Doctor(doctor::DoctorArgs),
    /// Record a timestamped CSV log of every metric.
    Record(record::RecordArgs),
    /// Validate the config and every rule.
    Check(rules::CheckArgs),
    /// Run rule unit tests.
    Test(rules::TestArgs),
    /// Run the rules over a recording in virtual time and print the alert timeline.
    Replay(rules::ReplayArgs),
    /// Convert GPU logs (nvidia-smi CSV, table or dmon, dcgmi dmon, dcgm-exporter scrapes,
    /// monitoring-script logs, gzip, UTF-16) to gpuwatch's CSV.
    Import(import::ImportArgs),
    /// A run's report from any log: per-GPU numbers, diagnosis, alert timeline, charts
    /// (--out report.html); two logs side by side; baselines.
    Report(report::ReportArgs),
    /// Any log as OpenMetrics under dcgm-exporter's names, for `promtool tsdb
    /// create-blocks-from openmetrics` (old logs in Grafana beside live data).
    Export(export::ExportArgs),
    /// Run the watchdog: sample, evaluate rules, notify.
    Daemon(daemon::DaemonArgs),
    /// What the running daemon has pending and firing now (through its control socket).
    Alerts(control::AlertsArgs),
    /// Mute the running daemon's notifications for matching alerts (Alertmanager matchers).
    Silence(control::SilenceArgs),
    /// Make the running daemon re-read its configuration and rules (as SIGHUP).
    Reload(control::Where),
    /// Send a test message through each configured channel.
    NotifyTest(daemon::NotifyTestArgs),
    /// Run a training command under watch and report how it ended.
    ///
    /// Exits with the job's exit code. A job ended by a signal ends gpuwatch by the same signal
    /// once the report is out (a shell shows 128 + n, a parent's wait sees the signal), also
    /// when the signal was sent to gpuwatch and forwarded; a job ended by gpuwatch's own kill
    /// action makes it exit with 128 + n. 127/126: the command was not found / could not run.
    Run(job::RunArgs),
    /// Watch an already running process and report how it ends.
    Attach(job::AttachArgs),
    /// Who used the GPUs: GPU-hours, energy, idle-but-allocated hours, jobs and alerts per
    /// user and container (the daemon's accounting).
    Digest(digest::DigestArgs),
    /// Live terminal view: every GPU with the last minutes as sparklines, processes, jobs, and
    /// what is pending and firing (q quits, ? helps).
    Top(top::TopArgs),
    /// The daemon as a systemd service: `install --user` (no root needed), `status`,
    /// `uninstall`.
    Service(service::ServiceArgs),
    /// Write a first config: where alerts go (ntfy, Slack, Discord, Telegram, e-mail, Feishu,
    /// DingTalk, WeCom, Teams, a webhook), secrets in 0600 files; then a test message.
    Init(init::InitArgs),
    /// Slurm: `prolog` refuses a job whose GPUs are unfit (drains the node with the reason).
    Slurm(slurm::SlurmArgs),
    /// A Slurm job's GPU summary (utilization, memory peak, energy, diagnosis), as its epilog
    /// wrote it or from the daemon's recording.
    Job(slurm::JobArgs),
}

/// Loads rules for a command that reads logs (`replay`, `report`): every problem in one error.
fn load_rules(
    paths: &[PathBuf],
    config: &crate::rules::RulesConfig,
) -> anyhow::Result<crate::rules::RuleSet> {
    crate::rules::RuleSet::load(paths, config).map_err(|errs| {
        anyhow::anyhow!(errs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n"))
    })
}

/// Parses the command line, runs the command and returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    // `tracing` to stderr, filtered by `GPUWATCH_LOG`: `info` for the daemon, `warn` otherwise.
    if let Some(speed) = cli.global.speed {
        if !(1.0..=3600.0).contains(&speed) {
            eprintln!("gpuwatch: --speed {speed}: must be between 1 and 3600");
            return 2;
        }
        // Before any thread reads the clock.
        crate::sys::set_clock_speed(speed);
    }
    crate::daemon::console::init(
        match cli.command {
            Command::Daemon(_) => "info",
            Command::Top(_) => "off",
            _ => "warn",
        },
        cli.global.log_format,
    );
    let result = match &cli.command {
        Command::Status(a) => inspect::status(&cli.global, a),
        Command::Devices(a) => inspect::devices(&cli.global, a),
        Command::Doctor(a) => doctor::doctor(&cli.global, a),
        Command::Record(a) => record::run(&cli.global, a),
        Command::Check(a) => rules::check(&cli.global, a),
        Command::Test(a) => rules::test(&cli.global, a),
        Command::Replay(a) => rules::replay(&cli.global, a),
        Command::Import(a) => import::run(&cli.global, a),
        Command::Report(a) => report::run(&cli.global, a),
        Command::Export(a) => export::run(&cli.global, a),
        Command::Daemon(a) => daemon::daemon(&cli.global, a),
        Command::NotifyTest(a) => daemon::notify_test(&cli.global, a),
        Command::Alerts(a) => control::alerts(&cli.global, a),
        Command::Silence(a) => control::silence(&cli.global, a),
        Command::Reload(a) => control::reload(&cli.global, a),
        Command::Run(a) => job::run(&cli.global, a),
        Command::Attach(a) => job::attach(&cli.global, a),
        Command::Top(a) => top::top(&cli.global, a),
        Command::Digest(a) => digest::digest(&cli.global, a),
        Command::Service(a) => service::service(&cli.global, a),
        Command::Slurm(a) => slurm::slurm(&cli.global, a),
        Command::Job(a) => slurm::job(a),
        Command::Init(a) => init::init(&cli.global, a),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            if is_broken_pipe(&err) {
                return 0;
            }
            if let Some(e) = err.downcast_ref::<crate::sampler::SamplerError>() {
                // One line: what is wrong and what to try.
                eprintln!("gpuwatch: {e}");
                return EXIT_NO_NVML;
            }
            // Configuration problems: one `file:line:column: message` per line, exactly as
            // `gpuwatch check` prints them.
            if let Some(e) = err.downcast_ref::<crate::config::SetupErrors>() {
                for line in &e.0 {
                    eprintln!("{line}");
                }
                return 1;
            }
            if let Some(e) = err.downcast_ref::<crate::config::ConfigErrors>() {
                for line in e.iter() {
                    eprintln!("{line}");
                }
                return 1;
            }
            eprintln!("gpuwatch: error: {err:#}");
            1
        }
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
