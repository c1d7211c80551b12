//! `gpuwatch run [OPTIONS] -- CMD ARGS...` and `gpuwatch attach PID`: flags, config merge, and
//! printing the end-of-job report. The work is in [`crate::job`].

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::GlobalArgs;
use crate::config::{Config, Setup};
use crate::job::{JobOptions, JobReport};
use crate::pipeline::watch::{DispatchSink, StderrSink, Watch};
use crate::pipeline::{Pipeline, SamplerThread};

/// Flags shared by `run` and `attach`.
#[derive(Debug, Clone, clap::Args)]
pub struct JobFlags {
    /// Configuration file (its `[job]`, `[actions]`, rules and channels apply) [default: yours
    /// from `gpuwatch init`, ~/.config/gpuwatch/config.toml; root's /etc/gpuwatch/config.toml].
    #[arg(long, value_name = "FILE", env = "GPUWATCH_CONFIG")]
    pub config: Option<PathBuf>,
    /// A progress regex (repeatable), tried before the defaults; named groups `step`, `total`,
    /// `epoch`, `epochs` are read, a pattern without them counts each match as progress.
    #[arg(long = "progress", value_name = "REGEX")]
    pub progress: Vec<String>,
    /// Do not use the built-in progress patterns (Epoch 3/10, step N, tqdm, Lightning, HF).
    #[arg(long)]
    pub no_default_progress: bool,
    /// Follow this log file (through truncation and rotation) for progress and the tail.
    #[arg(long, value_name = "FILE")]
    pub progress_log: Option<PathBuf>,
    /// Keep this many output lines for the report (default 20, or `[job] tail_lines`).
    #[arg(long, value_name = "N")]
    pub tail: Option<usize>,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub report_json: Option<PathBuf>,
    /// Do not print alerts and the report to stderr.
    #[arg(long)]
    pub quiet: bool,
    /// Do not evaluate rules or sample GPUs: only pass output through and report the end.
    #[arg(long)]
    pub no_rules: bool,
    /// When the job should be done: a local time `08:00` (the next one) or `2026-12-04 08:00`.
    /// The `job_eta` alert says when, at the job's recent pace, it will not be.
    #[arg(long, value_name = "TIME")]
    pub deadline: Option<String>,
    /// No end-of-run report (by default the run's GPU samples are recorded to
    /// `state_dir/runs/` and summarized at the end, with an HTML report beside them).
    #[arg(long)]
    pub no_report: bool,
}

/// Arguments of `run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Flags shared with `attach`.
    #[command(flatten)]
    pub flags: JobFlags,
    /// Append the job's stdout and stderr to this file as well.
    #[arg(long, value_name = "FILE")]
    pub tee: Option<PathBuf>,
    /// Run `gpuwatch doctor` first: with findings, print them and exit 1 without starting the
    /// job (`--preflight`), or print them and start it anyway (`--preflight=warn`).
    #[arg(long, value_name = "MODE", num_args = 0..=1, require_equals = true, default_missing_value = "fail")]
    pub preflight: Option<Preflight>,
    /// The command to run and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// What `run --preflight` does with findings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Preflight {
    /// Print them and do not start the job (exit 1).
    Fail,
    /// Print them and start the job.
    Warn,
}

/// `run --preflight`: the doctor's findings on stderr; `Some(exit code)` when the job must not
/// start (findings in `fail` mode: 1; no NVML in `fail` mode: [`crate::pipeline::EXIT_NO_NVML`]).
fn preflight(
    global: &GlobalArgs,
    mode: Preflight,
    path: Option<&Path>,
) -> anyhow::Result<Option<i32>> {
    let expected = load_config(path)?.expected_options(false);
    let findings = match super::doctor::examine(global, &expected) {
        Ok(f) => f,
        Err(e) => {
            crate::say!("gpuwatch: preflight: {e}");
            return Ok((mode == Preflight::Fail).then_some(crate::pipeline::EXIT_NO_NVML));
        }
    };
    for line in super::doctor::render_text(&findings).lines() {
        crate::say!("gpuwatch: preflight: {line}");
    }
    if findings.is_empty() || mode == Preflight::Warn {
        return Ok(None);
    }
    crate::say!(
        "gpuwatch: preflight: not starting the job (use --preflight=warn to start it anyway)"
    );
    Ok(Some(1))
}

/// Arguments of `attach`.
#[derive(Debug, clap::Args)]
pub struct AttachArgs {
    /// Flags shared with `run`.
    #[command(flatten)]
    pub flags: JobFlags,
    /// The process to watch.
    #[arg(value_name = "PID")]
    pub pid: u32,
}

/// The config alone (for `--no-rules`): parsed and checked like every command's.
fn load_config(path: Option<&Path>) -> anyhow::Result<Config> {
    match path {
        Some(p) => crate::config::load(p),
        None => Ok(Config::builtin()),
    }
}

/// The rules-and-actions watch: the configured (or stock) rules including job rules, a sampler
/// thread when NVML is available, kill/exec actions, alerts printed on stderr.
fn watch(global: &GlobalArgs, setup: Setup, flags: &JobFlags) -> anyhow::Result<Watch> {
    let config = &setup.config;
    let hostname = config.hostname();
    let engine = crate::engine::Engine::new(setup.rules, config.engine_options(&hostname));
    let mut pipeline = Pipeline::new(engine, config.action_runner(&hostname));
    let interval = config.interval();
    // (under --speed, the interval of the scenario's clock)
    let wall =
        crate::sys::wall_interval(interval, "[daemon] interval").map_err(anyhow::Error::msg)?;
    let mut sampler_cfg = config.sampler_config(&global.sampler_config());
    pipeline.set_simulated(sampler_cfg.sim_scenario.is_some());
    sampler_cfg.process_interval = interval.max(std::time::Duration::from_secs(1));
    let opened = crate::sampler::Sampler::open(&sampler_cfg).map(|mut s| {
        s.check_expected(&config.expected_options(true));
        SamplerThread::start(s, wall, None)
    });
    let snapshots = match opened {
        Ok(t) => Some(t),
        Err(e) if global.sim.is_some() || global.nvml_lib.is_some() => return Err(e.into()),
        Err(e) => {
            if !flags.quiet {
                crate::say!("gpuwatch: no GPU data: {e}");
            }
            None
        }
    };
    let mut watch = Watch::new(pipeline, snapshots);
    watch.status_to(config.state_dir().join("jobs"));
    watch.forensics_to(
        config.actions.forensics.clone(),
        config.state_dir().join("forensics"),
    );
    if let Some(state) = crate::daemon::http::start_configured(&config.exporter) {
        if let Ok(mut s) = state.lock() {
            s.hostname.clone_from(&hostname);
        }
        watch.export_to(state);
    }
    if !flags.quiet {
        watch.add_sink(Box::new(StderrSink));
    }
    if setup.from_file {
        let flush = std::time::Duration::from_millis(
            u64::try_from(config.job.notify_timeout.ms).unwrap_or(30_000),
        );
        if let Some(sink) = DispatchSink::start(setup.notify, &config.state_dir(), flush)? {
            watch.add_sink(Box::new(sink));
        }
    }
    Ok(watch)
}

/// The config, rules and notification settings, checked like `check` and `daemon` do.
fn setup(path: Option<&Path>) -> anyhow::Result<Setup> {
    Ok(Setup::load(path, &[])?)
}

fn options(config: &Config, flags: &JobFlags, tee: Option<&PathBuf>) -> anyhow::Result<JobOptions> {
    let job = &config.job;
    let resolve = |p: &PathBuf| config.resolve(p);
    // A report that could not be written would only be found at the job's end: a directory
    // or `-` is refused before the job starts.
    if let Some(p) = &flags.report_json {
        crate::sys::output::target(p, crate::job::JOB_DASH)?;
    }
    let mut progress = flags.progress.clone();
    progress.extend(job.progress_patterns());
    let tick_ms = job.tick.ms;
    Ok(JobOptions {
        progress,
        default_patterns: job.default_patterns && !flags.no_default_progress,
        tail_lines: flags.tail.unwrap_or(job.tail_lines),
        tee: tee.cloned().or_else(|| job.tee.as_ref().map(resolve)),
        progress_log: flags
            .progress_log
            .clone()
            .or_else(|| job.progress_log.as_ref().map(resolve)),
        tick_ms: u64::try_from(tick_ms).unwrap_or(1000),
        deadline_ms: flags
            .deadline
            .as_deref()
            .or(job.deadline.as_deref())
            .map(|d| crate::job::parse_deadline(d, crate::sys::now_ms()))
            .transpose()
            .map_err(|e| anyhow::anyhow!(e))?,
    })
}

/// Prints the report and writes `--report-json`; a report that cannot be written is said, and
/// the command still exits with the job's status (the job is what it reports on).
fn finish(report: &JobReport, flags: &JobFlags) {
    if !flags.quiet {
        let text = report.render_text();
        for line in text.lines() {
            crate::say!("gpuwatch: {line}");
        }
    }
    if let Some(path) = &flags.report_json {
        let written = serde_json::to_vec_pretty(report)
            .map_err(std::io::Error::other)
            .and_then(|json| crate::sys::output::write_output(path, crate::job::JOB_DASH, &json));
        if let Err(e) = written {
            crate::say!(
                "gpuwatch: cannot write the report to {}: {e}",
                path.display()
            );
        }
    }
}

impl JobFlags {
    /// The config to read: `--config`, else the user's own ([`super::daemon::own_config`]).
    fn config_path(&self) -> Option<PathBuf> {
        self.config.clone().or_else(super::daemon::own_config)
    }
}

/// Runs `run`: the job's exit code. A job that a signal ended makes gpuwatch end by the same
/// signal once its report is out ([`end_like`]).
pub fn run(global: &GlobalArgs, args: &RunArgs) -> anyhow::Result<i32> {
    let path = args.flags.config_path();
    let path = path.as_deref();
    if let Some(mode) = args.preflight {
        if let Some(code) = preflight(global, mode, path)? {
            return Ok(code);
        }
    }
    let mut recorded = None;
    let result = if args.flags.no_rules {
        let config = load_config(path)?;
        let opts = options(&config, &args.flags, args.tee.as_ref())?;
        crate::job::run_job(&args.command, &opts, &mut crate::job::NoObserver)
    } else {
        let setup = setup(path)?;
        let opts = options(&setup.config, &args.flags, args.tee.as_ref())?;
        let config = setup.config.clone();
        let mut w = watch(global, setup, &args.flags)?;
        if !args.flags.no_report {
            w.record_to(&run_recording(&config), RUN_RECORDING_MAX_BYTES);
        }
        let result = crate::job::run_job(&args.command, &opts, &mut w);
        recorded = w.recording().map(|p| (p.to_path_buf(), config));
        result
    };
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            // Like a shell: 127 when the command does not exist, 126 when it cannot be run.
            let io = e
                .chain()
                .find_map(|c| c.downcast_ref::<std::io::Error>())
                .map(std::io::Error::kind);
            let spawn_failed = e.to_string().starts_with("cannot start ");
            let code = match io {
                Some(std::io::ErrorKind::NotFound) if spawn_failed => 127,
                Some(std::io::ErrorKind::PermissionDenied) if spawn_failed => 126,
                _ => return Err(e),
            };
            crate::say!("gpuwatch: error: {e:#}");
            return Ok(code);
        }
    };
    finish(&report, &args.flags);
    record_job_end(path, &report);
    if let Some((recording, config)) = recorded {
        end_report(&recording, &config, args.flags.quiet);
    }
    end_like(&report);
    Ok(report.exit_code)
}

/// When a signal ended the job, gpuwatch ends by the same signal (everything done: the report
/// printed and sent, the recording summarised), so that whoever started `gpuwatch run` sees what
/// it would have seen without it — a shell's `$?` of 128 + n *and* a death by signal n for its
/// `wait` (a shell script stops at Ctrl-C, Python's `returncode` is -n, Slurm and systemd record
/// the signal) — as `env`/`nice` (which exec) and GNU `timeout` (which re-raises the command's
/// signal) do. This covers a signal sent to gpuwatch and forwarded to the job. The exception is a
/// job that gpuwatch's own kill action ended (class `killed_by_gpuwatch`): nothing signalled
/// gpuwatch, which exits with 128 + n (as `timeout` exits 124 for its own kill). A job that
/// handled a forwarded signal and exited with a code passes that code on (the job decided how
/// to end, as a shell does for a child that handles SIGINT).
fn end_like(report: &JobReport) {
    if let crate::model::job::JobExit::Signaled { signal, .. } = report.exit {
        if report.crash_class != crate::model::job::CrashClass::KilledByGpuwatch {
            crate::sys::die_of_signal(signal);
        }
    }
}

/// A run's recording starts over past this size (the part before is kept as `.1`): 512 MB is
/// about 20 hours of 8 GPUs at 1 s.
const RUN_RECORDING_MAX_BYTES: u64 = 512 * 1024 * 1024;
/// Recordings of this many runs are kept (the oldest are removed at the start of a run).
const RUNS_KEPT: usize = 10;

/// Where a run's GPU samples are recorded: `state_dir/runs/run-<UTC start>-<pid>.csv`; the
/// oldest runs' files are removed so that at most [`RUNS_KEPT`] remain with this one.
fn run_recording(config: &Config) -> PathBuf {
    let dir = config.state_dir().join("runs");
    let mut runs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "csv")
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("run-"))
        })
        .collect();
    runs.sort();
    let excess = runs.len().saturating_sub(RUNS_KEPT - 1);
    for old in &runs[..excess] {
        for p in [
            old.clone(),
            old.with_extension("csv.1"),
            old.with_extension("html"),
        ] {
            let _ = std::fs::remove_file(p);
        }
    }
    let start = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
    dir.join(format!("run-{start}-{}.csv", std::process::id()))
}

/// The end-of-run summary on stderr and the HTML report beside the recording. A report that
/// cannot be made is a warning: it never changes the run's exit code.
fn end_report(recording: &Path, config: &Config, quiet: bool) {
    let made = super::report::build(recording, &[], &Default::default(), config).and_then(|r| {
        let html = recording.with_extension("html");
        // Beside the recording in the state directory: 0600 like it.
        crate::sys::write_atomic(&html, crate::report::html::render(&r, None).as_bytes())
            .with_context(|| format!("cannot write {}", html.display()))?;
        Ok((r, html))
    });
    match made {
        Ok((r, html)) if !quiet => {
            // Process names and the like come from outside: no terminal escapes.
            for line in crate::report::text(&r.summary).lines() {
                crate::say!("gpuwatch: {}", crate::values::escape_control(line));
            }
            crate::say!("gpuwatch: report: {}", html.display());
        }
        Ok(_) => {}
        Err(e) => crate::say!("gpuwatch: no end-of-run report: {e:#}"),
    }
}

/// Runs `attach`: the process's exit code when the kernel told it, else 0.
pub fn attach(global: &GlobalArgs, args: &AttachArgs) -> anyhow::Result<i32> {
    let path = args.flags.config_path();
    let path = path.as_deref();
    let report = if args.flags.no_rules {
        let config = load_config(path)?;
        let opts = options(&config, &args.flags, None)?;
        crate::job::attach_job(args.pid, &opts, &mut crate::job::NoObserver)?
    } else {
        let setup = setup(path)?;
        let opts = options(&setup.config, &args.flags, None)?;
        let mut w = watch(global, setup, &args.flags)?;
        crate::job::attach_job(args.pid, &opts, &mut w)?
    };
    finish(&report, &args.flags);
    Ok(report.exit_code)
}

/// Counts the job's end for the usage digest (`state_dir/usage/jobs.jsonl`): its owner (the
/// user running it, and the container or Slurm job gpuwatch runs in) and whether it crashed.
fn record_job_end(path: Option<&Path>, report: &JobReport) {
    let Ok(config) = load_config(path) else {
        return;
    };
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let container = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|c| crate::sampler::procfs::parse_cgroup_container(&c))
        .map(|c| crate::usage::container_label(&c));
    let end = crate::usage::JobEnd {
        at_ms: crate::sys::now_ms(),
        owner: crate::usage::Owner {
            user: crate::sys::user_name(uid).unwrap_or_else(|| format!("uid {uid}")),
            container,
        },
        crashed: report.crash_class.is_failure(),
        command: report.command.join(" "),
    };
    if let Err(e) = crate::usage::record_job_end(&crate::usage::dir(&config.state_dir()), &end) {
        tracing::debug!("usage accounting: {e}");
    }
}
