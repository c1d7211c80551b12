//! `gpuwatch daemon`: the long-running process. Logging (tracing to stderr, journald-friendly,
//! no colour unless stderr is a terminal), signals (SIGTERM/SIGINT stop gracefully, SIGHUP
//! reloads), and the two drivers that feed the notification [`Dispatcher`]:
//! * [`run`] — the watchdog: the [`SamplerThread`] → the [`Pipeline`] (engine, actions) →
//!   dispatcher, with the alert state saved under `state_dir`;
//! * [`run_events`] — alert events read as JSON lines (`daemon --events FILE|-`), for scripting
//!   and for testing channels without GPUs.
//!
//! The dispatcher runs on its own thread, so a slow channel never stalls the loop; everything it
//! has not delivered is in the outbox under `state_dir`, so a stop loses nothing.

pub mod console;
pub mod control;
pub mod http;
pub mod sim;

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use crate::alert;
use crate::config::{Config, Setup};
use crate::engine::Engine;
use crate::model::{AlertEvent, DeviceId, ProcSample, Snapshot};
use crate::notify::dispatcher::{Dispatcher, Input};
use crate::notify::settings::NotifySettings;
use crate::pipeline::{Pipeline, SamplerThread, EXIT_NO_NVML};
use crate::sampler::SamplerConfig;
use crate::sys::now_ms;

/// What the main loop reacts to.
#[derive(Debug)]
pub enum Control {
    /// SIGTERM / SIGINT: stop gracefully.
    Stop(&'static str),
    /// SIGHUP: reload config and rules.
    Reload,
    /// Alert events from `--events`.
    Events(Vec<AlertEvent>),
    /// End of the `--events` input.
    EndOfInput,
    /// Device identities and processes from `--events` (message context).
    Context(Vec<DeviceId>, Option<Vec<ProcSample>>),
    /// A snapshot from the sampler thread.
    Snapshot(Box<Snapshot>),
    /// A request on the control socket and where its answer goes ([`control::Answer`]).
    Ask(serde_json::Value, mpsc::Sender<control::Answer>),
}

/// A context line in `--events` input: `{"devices": [...], "processes": [...]}`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsContext {
    #[serde(default)]
    devices: Vec<DeviceId>,
    #[serde(default)]
    processes: Option<Vec<ProcSample>>,
}

/// Starts a thread turning SIGTERM, SIGINT and SIGHUP into [`Control`] messages.
pub fn spawn_signal_thread(tx: mpsc::Sender<Control>) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])?;
    std::thread::Builder::new()
        .name("gpuwatch-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                let msg = match sig {
                    SIGHUP => Control::Reload,
                    SIGINT => Control::Stop("SIGINT"),
                    _ => Control::Stop("SIGTERM"),
                };
                if tx.send(msg).is_err() {
                    break;
                }
            }
        })?;
    Ok(())
}

/// Loads and validates the config and notification settings (for `--events`: no rules); with
/// no file, the built-in defaults (no channels, state under `~/.local/state/gpuwatch`).
pub fn load(config_path: Option<&Path>) -> anyhow::Result<(Config, NotifySettings)> {
    let config = match config_path {
        Some(p) => crate::config::load(p)?,
        None => Config::builtin(),
    };
    let settings = config.notify_settings()?;
    Ok((config, settings))
}

/// `FILE` or `(built-in defaults)`, for messages.
pub fn describe(config_path: Option<&Path>) -> String {
    config_path.map_or_else(|| "(built-in defaults)".into(), |p| p.display().to_string())
}

/// `daemon --events SOURCE`: reads alert events (one JSON [`AlertEvent`] or array of them per
/// line) from a file or `-` (stdin) and dispatches them; stops at end of input or on
/// SIGTERM/SIGINT, reloads notification settings on SIGHUP.
pub fn run_events(config_path: Option<&Path>, source: &Path) -> anyhow::Result<i32> {
    let (config, settings) = load(config_path)?;
    let dir = config.state_dir();
    info!(
    config = %describe(config_path),
        state_dir = %dir.display(),
        channels = settings.channels.len(),
        "gpuwatch daemon starting (events mode)"
    );
    let dispatcher = Dispatcher::start(settings, &dir)?;
    let (tx, rx) = mpsc::channel();
    spawn_signal_thread(tx.clone())?;
    let source = source.to_path_buf();
    std::thread::Builder::new()
        .name("gpuwatch-events".into())
        .spawn(move || read_events(&source, &tx))?;
    loop {
        // The process is alive and reading: that is "healthy" for the dead-man heartbeat.
        dispatcher.healthy(crate::sys::now_ms());
        let msg = match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(m) => m,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        match msg {
            Control::Events(events) => dispatcher.send(Input::Events(events)),
            Control::Context(devices, processes) => {
                dispatcher.set_context(devices, processes);
            }
            Control::Snapshot(_) => {}
            // The `--events` driver has no control socket.
            Control::Ask(_, reply) => {
                let _ = reply.send(
                    control::reply(
                        &serde_json::json!({"ok": false, "error": "not in --events mode"}),
                    )
                    .into(),
                );
            }
            Control::Reload => match load(config_path) {
                Ok((_, s)) => {
                    info!("SIGHUP: configuration reloaded");
                    dispatcher.send(Input::Reload(Box::new(s)));
                }
                Err(e) => error!("SIGHUP: reload failed, keeping the old configuration: {e:#}"),
            },
            Control::Stop(why) => {
                info!("{why}: stopping");
                break;
            }
            Control::EndOfInput => {
                info!("end of events input: delivering what is queued, then stopping");
                dispatcher.drain(Duration::from_secs(30));
                return Ok(0);
            }
        }
    }
    dispatcher.stop();
    Ok(0)
}

fn read_events(source: &Path, tx: &mpsc::Sender<Control>) {
    let reader: Box<dyn std::io::BufRead> = if source == Path::new("-") {
        Box::new(std::io::stdin().lock())
    } else {
        match std::fs::File::open(source) {
            Ok(f) => Box::new(std::io::BufReader::new(f)),
            Err(e) => {
                error!("cannot open {}: {e}", source.display());
                let _ = tx.send(Control::EndOfInput);
                return;
            }
        }
    };
    for (i, line) in reader.lines().enumerate() {
        let Ok(line) = line else { break };
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Ok(ctx) = serde_json::from_str::<EventsContext>(line) {
            if tx
                .send(Control::Context(ctx.devices, ctx.processes))
                .is_err()
            {
                return;
            }
            continue;
        }
        let parsed = serde_json::from_str::<Vec<AlertEvent>>(line)
            .or_else(|_| serde_json::from_str::<AlertEvent>(line).map(|e| vec![e]));
        match parsed {
            Ok(events) => {
                if tx.send(Control::Events(events)).is_err() {
                    return;
                }
            }
            Err(e) => warn!("{}:{}: not an alert event: {e}", source.display(), i + 1),
        }
    }
    let _ = tx.send(Control::EndOfInput);
}

/// The rule paths the daemon watches for edits, with their files' modification times.
struct Rules {
    paths: Vec<PathBuf>,
    signature: crate::rules::FilesSignature,
    /// Says when the files may have changed, so the signature is taken only then (and every
    /// [`RULES_RECHECK_EVERY`] in any case).
    watch: crate::sys::watch::ChangeWatch,
    /// When the signature was last taken (`None`: not since the watch was made).
    last_signature: Option<Instant>,
}

/// How often the rule files' signature is taken even when no change was seen (a file system
/// without inotify events, e.g. some network mounts).
const RULES_RECHECK_EVERY: Duration = Duration::from_secs(60);

impl Rules {
    /// The rules of `setup`, with the signature taken before they were loaded (an edit made
    /// while loading is seen at the next check).
    fn new(paths: Vec<PathBuf>, signature: crate::rules::FilesSignature) -> Rules {
        Rules {
            watch: crate::sys::watch::ChangeWatch::new(&paths),
            paths,
            signature,
            // (the first check takes the signature: an edit made before the watch was made)
            last_signature: None,
        }
    }

    /// The files' signature when it changed since the last one.
    fn changed(&mut self) -> Option<crate::rules::FilesSignature> {
        let maybe = self.watch.maybe_changed();
        if !maybe
            && self
                .last_signature
                .is_some_and(|t| t.elapsed() < RULES_RECHECK_EVERY)
        {
            return None;
        }
        self.last_signature = Some(Instant::now());
        let sig = crate::rules::files_signature(&self.paths);
        (sig != self.signature).then_some(sig)
    }
}

fn log_events(events: &[AlertEvent]) {
    if console::is_human() {
        console::print_alerts(events);
        return;
    }
    for e in events {
        info!(
            alert = %e.name,
            severity = %e.severity.as_str(),
            gpu = %e.gpu.map_or_else(String::new, |g| g.to_string()),
            status = %e.status.as_str(),
            repeat = e.repeat,
            ended = e.ended.as_ref().map(|_| e.state_word()),
            "{}",
            e.told_summary()
        );
    }
}

/// Says at start what the daemon watches and where its messages go. On a terminal: two lines
/// for a person; otherwise one structured record.
fn announce(
    sampler_cfg: &SamplerConfig,
    config: &crate::config::Config,
    notify: &NotifySettings,
    gpus: usize,
    rules: usize,
) {
    let channels: Vec<String> = notify
        .channels
        .iter()
        .map(|c| format!("{} ({})", c.name, c.kind.as_str()))
        .collect();
    let speed = crate::sys::clock_speed();
    let what = match &sampler_cfg.sim_scenario {
        Some(s) if speed > 1.0 => format!(
            "simulated GPUs of scenario {s}, played {speed}× faster (a minute here is {} of the scenario)",
            plain_duration((60_000.0 * speed) as i64)
        ),
        Some(s) => format!("simulated GPUs of scenario {s}"),
        None => "GPUs".to_string(),
    };
    let every = plain_duration(config.daemon.interval.ms);
    if console::is_human() {
        console::say(&format!(
            "gpuwatch watching {gpus} {what} with {rules} rules, a sample every {every}; state in {}",
            config.state_dir().display()
        ));
        console::say(&if channels.is_empty() {
            "alerts go to this terminal only: no notification channels are configured (add [[channel]] \
             and [[route]] to a config file, see config.example.toml; `gpuwatch notify-test` tries them)"
                .to_string()
        } else {
            format!("alerts go to this terminal and to {}", channels.join(", "))
        });
    } else {
        info!(
            watching = %what,
            channels = %if channels.is_empty() { "none (alerts are only logged)".to_string() } else { channels.join(", ") },
            "alert destinations"
        );
    }
}

/// `[digest] schedule`: the schedule, when the next digest is due (after the last one sent, as
/// `state_dir/usage/digest-sent` says, or now), and how many alerts it lists.
fn digest_plan(
    section: &crate::usage::DigestSection,
    state_dir: &Path,
) -> Option<(crate::usage::Schedule, i64, usize)> {
    let schedule = crate::usage::Schedule::parse(section.schedule.as_deref()?).ok()?;
    let sent: i64 = std::fs::read_to_string(crate::usage::dir(state_dir).join("digest-sent"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0);
    let next = schedule.next_after(now_ms().max(sent));
    Some((schedule, next, section.top_alerts.unwrap_or(5)))
}

/// `1 h`, `90 min`, `1 s`, `250 ms`: a whole number in the largest unit that fits.
fn plain_duration(ms: i64) -> String {
    match ms {
        m if m >= 3_600_000 && m % 3_600_000 == 0 => format!("{} h", m / 3_600_000),
        m if m >= 60_000 && m % 60_000 == 0 => format!("{} min", m / 60_000),
        m if m >= 1000 && m % 1000 == 0 => format!("{} s", m / 1000),
        m => format!("{m} ms"),
    }
}

/// Paths for a log line: `a, b, c`.
fn display_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `gpuwatch daemon`: the [`SamplerThread`] → [`Pipeline`] (engine, actions) → dispatcher.
/// Configuration problems (the same as `gpuwatch check` reports) are printed one per line and
/// exit 1; no NVML exits [`EXIT_NO_NVML`].
pub fn run(
    sampler_cfg: &SamplerConfig,
    config_path: Option<&Path>,
    state_dir: Option<&Path>,
) -> anyhow::Result<i32> {
    let mut setup = match Setup::load(config_path, &[]) {
        Ok(s) => s,
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("{e}");
            }
            return Ok(1);
        }
    };
    // Sampling follows the (possibly faster) clock: at --speed 60 a 1 s interval is 1 s of
    // the scenario, 1/60 s of wall time. (Checked before any directory is made.)
    let interval = crate::sys::wall_interval(setup.config.interval(), "[daemon] interval")
        .map_err(anyhow::Error::msg)?;
    // `--state-dir`: the state lives there instead of the config's `state_dir` (as given,
    // from the current directory — not from the config file's, as a relative `state_dir` in
    // the file is).
    let state_dir = match state_dir {
        Some(d) => Some(
            std::path::absolute(d)
                .map_err(|e| anyhow::anyhow!("--state-dir {}: {e}", d.display()))?,
        ),
        None => None,
    };
    let state_dir = state_dir.as_deref();
    if let Some(d) = state_dir {
        crate::sys::create_private_dir(d)
            .map_err(|e| anyhow::anyhow!("--state-dir {}: {e}", d.display()))?;
        setup.config.daemon.state_dir = d.to_path_buf();
    }
    // A scenario played faster (`--sim … --speed N`) starts at its beginning: its alert state,
    // outbox, silences and usage live apart from the real ones, in `--state-dir` or a new
    // private directory (`sim`), kept when it stops (said then, with how to read it); what
    // earlier ones killed before their end left there is said and removed.
    let speed = crate::sys::clock_speed();
    let sim_dir = match (speed > 1.0, state_dir) {
        (false, _) => None,
        (true, Some(d)) => Some(d.to_path_buf()),
        (true, None) => {
            let dir = sim::create()?;
            sim::sweep(&dir);
            Some(dir)
        }
    };
    if let Some(d) = &sim_dir {
        setup.config.daemon.state_dir.clone_from(d);
    }
    let config = &setup.config;
    if setup.rules.is_empty() {
        warn!(
            paths = %display_paths(&setup.rule_paths),
            "no rules loaded: gpuwatch only samples; nothing will alert"
        );
    }
    let dir = config.state_dir();
    let hostname = config.hostname();
    let opts = config.engine_options(&hostname);
    let engine = match alert::load_state(&dir) {
        // A simulated run's clock ran ahead of the wall clock: its state is dated in what is
        // still the future here, and resuming it would freeze every timer until then.
        Ok(Some(state)) if state.saved_at_ms > crate::sys::now_ms() + 60_000 => {
            anyhow::bail!(
                "the state in {} was saved at {} by a --speed run whose clock ran ahead; it \
                 cannot be resumed before then: use a new --state-dir (or remove it)",
                dir.display(),
                crate::trace::format_time_ms(state.saved_at_ms)
            );
        }
        Ok(Some(state)) => {
            info!(state_dir = %dir.display(), "resuming alert state");
            Engine::with_state(setup.rules, opts, &state)
        }
        Ok(None) => Engine::new(setup.rules, opts),
        Err(e) => {
            warn!("{e:#}; starting with empty alert state");
            Engine::new(setup.rules, opts)
        }
    };
    // Kill and exec actions of firing rules (`action: "kill"` goes through [actions.kill]).
    let mut pipeline = Pipeline::new(engine, config.action_runner(&hostname));
    let opened = config.sampler_config(sampler_cfg);
    pipeline.set_simulated(opened.sim_scenario.is_some());
    // (the exporter's reads settled once it listens, below)
    let unread = opened.unread.clone();
    unread.store(
        unread_reads(pipeline.engine(), config.exporter.addr().is_some()),
        std::sync::atomic::Ordering::Relaxed,
    );
    let mut sampler = match crate::sampler::Sampler::open(&opened) {
        Ok(s) => s,
        Err(e) => {
            error!("{e}");
            return Ok(EXIT_NO_NVML);
        }
    };
    // GPUs on the bus or seen before that NVML does not list: `gpu_missing` (host rule).
    sampler.check_expected(&config.expected_options(true));
    let devices = sampler.devices();
    let gpu_states = devices
        .iter()
        .map(|d| (d.index, crate::model::DeviceState::Ok))
        .collect();
    if !console::is_human() {
        info!(
            config = %describe(config_path),
            state_dir = %dir.display(),
            host = %hostname,
            gpus = devices.len(),
            rules = pipeline.engine().rule_count(),
            channels = setup.notify.channels.len(),
            interval_ms = config.daemon.interval.ms,
            "gpuwatch daemon started"
        );
    }
    announce(
        sampler_cfg,
        config,
        &setup.notify,
        devices.len(),
        pipeline.engine().rule_count(),
    );
    let dispatcher = Dispatcher::start(setup.notify, &dir)?;
    dispatcher.set_context(devices.clone(), None);
    if !sampler.degraded().is_empty() {
        // Never silently blind: an info alert says what cannot be watched.
        publish(
            &dispatcher,
            vec![degraded_event(&hostname, sampler.degraded(), now_ms())],
        );
    }
    let rules = Rules::new(setup.rule_paths, setup.rules_signature);
    let rules_config = config.rules.clone();

    let (tx, rx) = mpsc::channel::<Control>();
    spawn_signal_thread(tx.clone())?;
    let control_tx = tx.clone();
    // Snapshots arrive on the control channel, so signals and samples share one loop.
    let sampler = SamplerThread::start_with(sampler, interval, None, false, move |snap| {
        tx.send(Control::Snapshot(Box::new(snap))).is_ok()
    });

    // Silences (persisted) and the control socket that manages them.
    let silences = match crate::silence::Silences::load(&dir) {
        Ok(s) => s,
        Err(e) => {
            warn!("{e:#}; starting without silences");
            crate::silence::Silences::default()
        }
    };
    let silences = std::sync::Arc::new(std::sync::Mutex::new(silences));
    {
        // A silenced alert's kill actions are held.
        let silences = silences.clone();
        let host = hostname.clone();
        pipeline.set_hold(Box::new(move |ev: &AlertEvent| {
            let labels = crate::notify::full_labels(ev, &host);
            silences
                .lock()
                .is_ok_and(|s| s.silencing(&labels, now_ms()).is_some())
        }));
    }
    let control_group = config
        .daemon
        .control_group
        .as_deref()
        .and_then(crate::sys::group_id);
    if let Err(e) = control::start(&dir, control_group, control_tx.clone()) {
        error!(
            "control socket {}: {e}; `gpuwatch alerts` and `silence` cannot reach this daemon",
            control::socket_path(&dir).display()
        );
    }
    // `/metrics`: a taken port or a bad address is said once; alerting goes on without it.
    let export = http::start_configured(&config.exporter);
    let usage =
        crate::usage::Ledger::load(&crate::usage::dir(&dir), now_ms() - 2 * 86_400_000, false);
    let digest = digest_plan(&config.digest, &dir);
    let recorder = open_recorder(config, sim_dir.as_deref(), interval);
    let dir_for_jobs = dir.clone();
    unread.store(
        unread_reads(pipeline.engine(), export.is_some()),
        std::sync::atomic::Ordering::Relaxed,
    );
    let mut live = Live {
        silences,
        silences_checked: None,
        unread,
        export,
        hostname: hostname.clone(),
        pipeline,
        dispatcher,
        dir,
        config_path,
        rules,
        rules_config,
        interval,
        last_devices: devices,
        last_save: Instant::now(),
        save: (false, None),
        last_rule_check: Instant::now(),
        last_snapshot: Instant::now(),
        last_eval: Instant::now(),
        last_status: Instant::now(),
        status_every: if console::is_human() {
            Duration::from_secs(120)
        } else {
            Duration::from_secs(600)
        },
        gpu_states,
        missing_gpus: 0,
        usage,
        last_usage_save: Instant::now(),
        digest,
        recorder,
        recording: config.recording.clone(),
        sim_dir: sim_dir.clone(),
        jobs_seen: crate::usage::JobsSeen::load(&dir_for_jobs),
    };
    live.sync_silences();
    let mut code = 0;
    loop {
        match rx.recv_timeout(live.next_turn()) {
            Ok(Control::Snapshot(snap)) => live.snapshot(&snap, sampler.last_tick()),
            Ok(Control::Stop(why)) => {
                info!("{why}: stopping");
                break;
            }
            Ok(Control::Reload) => {
                let _ = live.reload();
            }
            Ok(Control::Ask(ask, reply)) => {
                let _ = reply.send(live.answer(&ask));
            }
            Ok(Control::Events(_) | Control::EndOfInput | Control::Context(..)) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                error!("the sampler thread stopped");
                break;
            }
        }
        live.housekeeping();
        if sampler.has_ended() {
            // It never ends by itself: it failed (a panic, logged). Exit non-zero so that the
            // service manager starts gpuwatch again rather than leave it running blind.
            error!(
                "the sampling thread ended; stopping so that the service manager restarts gpuwatch"
            );
            code = 1;
            break;
        }
    }
    // A sampler stuck in a slow NVML call must not hold up the stop.
    sampler.stop(Duration::from_secs(2));
    live.save_usage();
    if let Some(r) = &mut live.recorder {
        r.flush();
    }
    live.pipeline.finish();
    // The dispatcher handles (and saves) everything sent before its stop; the engine's state is
    // saved after it, never ahead of it (see `Live::save_engine`).
    let Live {
        dispatcher,
        pipeline,
        dir,
        ..
    } = live;
    dispatcher.stop();
    save_engine(&dir, pipeline.engine());
    if let Some(d) = &sim_dir {
        sim::keep(d);
        let shown = d.display();
        console::say(&format!(
            "the simulated run's state stays in {shown} (alerts, outbox, usage): `gpuwatch \
             digest --state-dir {shown}` says who used the GPUs; `rm -r {shown}` removes it"
        ));
    }
    info!("gpuwatch daemon stopped");
    Ok(code)
}

/// The running daemon between two messages of its loop.
struct Live<'a> {
    /// Silences: notifications of matching alerts are not sent (the dispatcher's grouper mutes
    /// them) and their kills are held (the pipeline).
    silences: crate::silence::Shared,
    /// When the silences' housekeeping last ran (it walks them all: once a second at most).
    silences_checked: Option<Instant>,
    /// The sampler's reads nothing uses ([`unread_reads`]), set again when the rules change.
    unread: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// What `/metrics` serves, when the exporter runs.
    export: Option<http::Shared>,
    hostname: String,
    pipeline: Pipeline,
    dispatcher: Dispatcher,
    dir: PathBuf,
    config_path: Option<&'a Path>,
    rules: Rules,
    rules_config: crate::rules::RulesConfig,
    interval: Duration,
    last_devices: Vec<DeviceId>,
    last_save: Instant,
    /// Whether the alert state needs saving, and the dispatcher's mark it waits for.
    save: (bool, Option<u64>),
    last_rule_check: Instant,
    last_snapshot: Instant,
    /// When the rules were last evaluated: at the last snapshot, or the last advance of the
    /// clock without one.
    last_eval: Instant,
    /// When the last status line was printed, and how often one is.
    last_status: Instant,
    status_every: Duration,
    /// Each GPU's state as last sampled (by index): a tick some GPUs missed (late: a gap)
    /// leaves theirs as they were, so the status line counts every GPU watched.
    gpu_states: std::collections::BTreeMap<u32, crate::model::DeviceState>,
    /// Expected GPUs the last snapshot says NVML no longer lists (`gpu_missing`).
    missing_gpus: usize,
    /// Who used the GPUs (`state_dir/usage/`), saved every few minutes.
    usage: crate::usage::Ledger,
    last_usage_save: Instant,
    /// `[digest] schedule`: when the next digest is due (UTC ms), and how many alerts it lists.
    digest: Option<(crate::usage::Schedule, i64, usize)>,
    /// `[recording]`: every snapshot into the daemon's own metric log, and the section it was
    /// opened with (a reload that changes it reopens it).
    recorder: Option<crate::record::Recorder>,
    recording: crate::record::RecordingSection,
    /// `--speed`'s private state directory, where the recording then lives.
    sim_dir: Option<PathBuf>,
    /// The Slurm jobs seen on the GPUs (`state_dir/slurm-jobs.json`, for `slurm epilog`).
    jobs_seen: crate::usage::JobsSeen,
}

/// How often the silences' housekeeping runs (jobs ended, ended silences dropped, the journal
/// folded into `silences.json`).
const SILENCES_CHECK_EVERY: Duration = Duration::from_secs(1);

/// How often the rule files are looked at for changes.
const RULES_CHECK_EVERY: Duration = Duration::from_secs(2);

/// A periodic check due within this long is done at the turn of the loop now rather than at a
/// wake-up of its own a moment later (a 1 s interval's snapshots come a few ms either side of
/// the second).
const CHECK_SLACK: Duration = Duration::from_millis(50);

/// How often the usage ledger is saved: a `kill -9` (or a power cut) loses at most this much
/// accounting; a clean stop saves at once.
const USAGE_SAVE_EVERY: Duration = Duration::from_secs(60);

impl Live<'_> {
    /// A snapshot (with the sampler's tick counters): message context for the dispatcher, the
    /// pipeline's events, then the exporter's state.
    fn snapshot(&mut self, snap: &Snapshot, ticks: (u64, u64, Option<u32>)) {
        self.last_snapshot = Instant::now();
        self.last_eval = self.last_snapshot;
        let devices: Vec<DeviceId> = snap.gpus.iter().map(|g| g.id.clone()).collect();
        if devices != self.last_devices || snap.processes.is_some() {
            self.dispatcher
                .set_context(devices.clone(), snap.processes.clone());
            self.last_devices = devices;
        }
        for g in &snap.gpus {
            self.gpu_states.insert(g.id.index, g.state);
        }
        self.missing_gpus = snap.missing.len();
        self.usage.observe(snap);
        if let Some(r) = &mut self.recorder {
            r.record(snap);
        }
        if self.jobs_seen.observe(snap) {
            self.save_jobs_seen(snap.time_ms);
        }
        let events = self.pipeline.observe(snap);
        self.dispatcher.healthy(snap.time_ms);
        self.publish_and_save(events);
        self.export(snap, ticks);
    }

    /// While no snapshot comes: the exporter gets the alerts (`collector_stale` is among them
    /// then) and, after three intervals without one, leaves the GPUs' values out.
    fn export_without_snapshot(&mut self) {
        let Some(shared) = &self.export else { return };
        let alerts = crate::exporter::alert_rows(self.pipeline.engine());
        let stale = self.last_snapshot.elapsed() >= 3 * self.interval;
        if let Ok(mut s) = shared.lock() {
            if s.alerts != alerts || s.stale != stale {
                s.alerts = alerts;
                s.stale = stale;
                s.generation += 1;
            }
        }
    }

    /// Hands the exporter the new snapshot, the alerts pending or firing now, and the counters
    /// (sampler ticks, rule evaluations, delivery, silences): one update per tick.
    fn export(&mut self, snap: &Snapshot, (taken, missed, micros): (u64, u64, Option<u32>)) {
        let Some(shared) = &self.export else { return };
        let engine = self.pipeline.engine();
        let (reused, ran) = engine.reuse_stats();
        let eval_seconds = engine.eval_time().as_secs_f64();
        let delivery = self.dispatcher.delivery();
        let now = now_ms();
        let silences = self
            .silences
            .lock()
            .map(|s| s.list().iter().filter(|x| x.active(now)).count())
            .unwrap_or(0);
        let alerts = crate::exporter::alert_rows(self.pipeline.engine());
        if let Ok(mut s) = shared.lock() {
            s.hostname.clone_from(&self.hostname);
            s.take_snapshot(snap);
            s.stale = false;
            s.alerts = alerts;
            s.ticks = (taken, missed);
            s.sample_seconds = micros.map(|m| f64::from(m) / 1e6);
            s.evaluations = (ran, reused);
            s.silences_active = silences;
            s.eval_seconds = eval_seconds;
            s.delivery = Some((delivery.queued, delivery.channels));
            s.generation += 1;
        }
    }

    /// SIGHUP: the whole setup is loaded and checked again; on any problem the running one stays.
    /// Loads and applies the whole setup again; the problems when it could not (the running one
    /// stays).
    fn reload(&mut self) -> Result<(), Vec<String>> {
        info!("SIGHUP: reloading configuration and rules");
        match Setup::load(self.config_path, &[]) {
            Ok(new) => {
                self.dispatcher.send(Input::Reload(Box::new(new.notify)));
                let version = self.pipeline.reload_actions(&new.config.actions_resolved());
                info!(policy_version = version, "[actions] reloaded");
                if new.rules.is_empty() {
                    warn!(paths = %display_paths(&new.rule_paths), "the reloaded configuration has no rules: nothing will alert");
                }
                let mut events = self.pipeline.engine_mut().reload(new.rules);
                self.reads_for_rules();
                events.extend(self.pipeline.cancel_undeclared_kills(now_ms()));
                info!(
                    rules = self.pipeline.engine().rule_count(),
                    "rules reloaded"
                );
                self.publish(events);
                self.rules = Rules::new(new.rule_paths, new.rules_signature);
                // (a recorder that could not be opened is tried again)
                if new.config.recording != self.recording
                    || (self.recorder.is_none() && new.config.recording.enabled)
                {
                    if let Some(r) = &mut self.recorder {
                        r.flush();
                    }
                    self.recorder =
                        open_recorder(&new.config, self.sim_dir.as_deref(), self.interval);
                    self.recording = new.config.recording.clone();
                    info!(on = self.recorder.is_some(), "[recording] reloaded");
                }
                self.rules_config = new.config.rules;
                Ok(())
            }
            Err(errors) => {
                for e in &errors.0 {
                    error!("{e}");
                }
                error!("reload failed, keeping the running configuration");
                Err(errors.0.iter().map(ToString::to_string).collect())
            }
        }
    }

    /// How long the loop may wait for a message: until the clock is to advance without a
    /// snapshot (see [`Live::housekeeping`]: two intervals after the last snapshot, then once an
    /// interval — on the snapshots' grid, as `replay` advances), or until the silences' or the
    /// rule files' check is due where it comes sooner than the next snapshot (intervals longer
    /// than those checks). With snapshots on time the loop wakes once per snapshot: a fixed
    /// wait of one interval ran out just before most snapshots, a second wake-up per tick for
    /// nothing.
    fn next_turn(&self) -> Duration {
        let mut due = if self.last_eval > self.last_snapshot {
            self.last_eval + self.interval
        } else {
            self.last_snapshot + 2 * self.interval
        };
        if self.interval > SILENCES_CHECK_EVERY {
            if let Some(t) = self.silences_checked {
                due = due.min(t + SILENCES_CHECK_EVERY);
            }
        }
        if self.interval > RULES_CHECK_EVERY {
            due = due.min(self.last_rule_check + RULES_CHECK_EVERY);
        }
        due.saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    }

    /// Host rules when no snapshot came for an interval, rule-file edits, periodic state saves,
    /// silences whose job ended.
    fn housekeeping(&mut self) {
        // (a check due within a few ms is done now, with the snapshot that woke the loop; the
        // next is due a second after this one ended, however long it took)
        if self
            .silences_checked
            .is_none_or(|t| t.elapsed() + CHECK_SLACK >= SILENCES_CHECK_EVERY)
        {
            if let Ok(mut s) = self.silences.lock() {
                let alive = |pid: u32, start: Option<u64>| job_alive(pid, start);
                if let Err(e) = s.housekeeping(now_ms(), alive) {
                    warn!("silences: {e:#}");
                }
            }
            self.silences_checked = Some(Instant::now());
        }
        // A snapshot is late only once half an interval has passed (until then it is the
        // sampler's jitter, and advancing would evaluate every rule twice in that tick); then
        // the clock advances once an interval until one comes.
        if self.last_snapshot.elapsed() >= self.interval + self.interval / 2
            && self.last_eval.elapsed() >= self.interval
        {
            self.last_eval = Instant::now();
            let events = self.pipeline.advance(now_ms());
            self.publish_and_save(events);
            self.export_without_snapshot();
        }
        if self.last_rule_check.elapsed() + CHECK_SLACK >= RULES_CHECK_EVERY {
            self.last_rule_check = Instant::now();
            if let Some(sig) = self.rules.changed() {
                info!("rule files changed: reloading");
                self.rules.signature = sig;
                let engine = self.pipeline.engine_mut();
                let mut events = reload_rules(engine, &self.rules.paths, &self.rules_config);
                self.reads_for_rules();
                events.extend(self.pipeline.cancel_undeclared_kills(now_ms()));
                self.publish(events);
            }
        }
        // (in the scenario's time under --speed: a simulated night saves as a real one would)
        if self.last_usage_save.elapsed() >= USAGE_SAVE_EVERY.div_f64(crate::sys::clock_speed()) {
            self.save_usage();
        }
        if let Some((schedule, due, top)) = self.digest {
            let now = now_ms();
            if now >= due {
                self.send_digest(now, schedule, top);
                self.digest = Some((schedule, schedule.next_after(now), top));
            }
        }
        if self.last_status.elapsed() >= self.status_every {
            self.last_status = Instant::now();
            console::say(&self.status_line());
        }
        if self.last_save.elapsed() >= Duration::from_secs(30) {
            self.save.0 = true;
        }
        self.save_engine();
    }

    /// Sets the sampler's reads for the rules now loaded ([`unread_reads`]).
    fn reads_for_rules(&self) {
        self.unread.store(
            unread_reads(self.pipeline.engine(), self.export.is_some()),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Saves the usage ledger, keeping two days of it in memory.
    fn save_usage(&mut self) {
        self.last_usage_save = Instant::now();
        let now = now_ms();
        if let Err(e) = self.usage.save(&crate::usage::dir(&self.dir), now) {
            warn!("usage accounting: {e}");
        }
        self.usage.forget_before(now - 2 * 86_400_000);
        self.save_jobs_seen(now);
    }

    /// Saves the Slurm jobs seen (`slurm epilog` reads them).
    fn save_jobs_seen(&mut self, now: i64) {
        if self.jobs_seen.jobs.is_empty() && !crate::usage::JobsSeen::path(&self.dir).exists() {
            return;
        }
        if let Err(e) = self.jobs_seen.save(&self.dir, now) {
            warn!("Slurm jobs seen: {e}");
        }
    }

    /// Sends the usage digest of the period ending `now` (one notice through the routes).
    fn send_digest(&mut self, now: i64, schedule: crate::usage::Schedule, top: usize) {
        self.save_usage();
        let dir = crate::usage::dir(&self.dir);
        let since = now - schedule.period_ms();
        let digest = crate::usage::Ledger::load(&dir, since, true).digest(since, now, top);
        let gpu_h: f64 = digest.rows.iter().map(|(_, u)| u.gpu_s).sum::<f64>() / 3600.0;
        let idle_h: f64 = digest.rows.iter().map(|(_, u)| u.idle_alloc_s).sum::<f64>() / 3600.0;
        let users: std::collections::BTreeSet<&str> =
            digest.rows.iter().map(|(o, _)| o.user.as_str()).collect();
        let period = if schedule.weekday.is_some() {
            "week"
        } else {
            "day"
        };
        let labels: std::collections::BTreeMap<String, String> = [
            ("alertname", "usage_digest".to_string()),
            ("severity", "info".to_string()),
            ("hostname", self.hostname.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let mut annotations = std::collections::BTreeMap::new();
        annotations.insert(
            "summary".to_string(),
            format!(
                "GPU usage on {} over the last {period}: {gpu_h:.1} GPU-hours by {} user(s), {idle_h:.1} h holding memory on idle GPUs",
                self.hostname,
                users.len()
            ),
        );
        annotations.insert(
            "description".to_string(),
            digest.render_text(&self.hostname),
        );
        let ev = AlertEvent::notice(
            crate::sys::fnv1a64_hex(format!("usage_digest{now}").bytes()),
            "usage_digest",
            crate::model::Severity::Info,
            crate::model::AlertStatus::Firing,
            labels,
            annotations,
            now,
        )
        .once();
        let _ = crate::sys::write_atomic(&dir.join("digest-sent"), now.to_string().as_bytes());
        self.publish_and_save(vec![ev]);
    }

    /// `status: 8 GPUs (1 lost or stalled), 4 alerts firing (2 critical), 1 pending; 9
    /// notifications sent, 0 failed, 0 queued`.
    fn status_line(&self) -> String {
        let (mut firing, mut critical, mut pending) = (0, 0, 0);
        for a in self.pipeline.engine().alerts() {
            match a.phase {
                crate::alert::Phase::Firing => {
                    firing += 1;
                    if a.severity == crate::model::Severity::Critical {
                        critical += 1;
                    }
                }
                crate::alert::Phase::Pending => pending += 1,
            }
        }
        let d = self.dispatcher.delivery();
        let (sent, failed) = d
            .channels
            .values()
            .fold((0, 0), |(s, f), (a, b)| (s + a, f + b));
        let bad = self
            .gpu_states
            .values()
            .filter(|s| **s != crate::model::DeviceState::Ok)
            .count()
            + self.missing_gpus;
        let lost = if bad > 0 {
            format!(" ({bad} lost or stalled)")
        } else {
            String::new()
        };
        format!(
            "status: {} GPUs{lost}, {firing} alert{} firing ({critical} critical), {pending} pending; {sent} notification{} sent, {failed} failed, {} queued",
            self.gpu_states.len(),
            if firing == 1 { "" } else { "s" },
            if sent == 1 { "" } else { "s" },
            d.queued
        )
    }

    /// Answers a control-socket request: the bytes to write ([`control::reply`]), or the
    /// silences to list (serialized by the client's thread, not the loop).
    fn answer(&mut self, ask: &serde_json::Value) -> control::Answer {
        use serde_json::json;
        let now = now_ms();
        let fail = |e: String| control::reply(&json!({"ok": false, "error": e}));
        let bytes = match ask["ask"].as_str().unwrap_or("") {
            "alerts" => {
                let alerts: Vec<serde_json::Value> = self
                    .pipeline
                    .engine()
                    .alerts()
                    .map(|a| {
                        let name = a.alertname();
                        // The labels a published event of this instance would carry.
                        let labels = crate::notify::complete_labels(
                            &a.labels,
                            name,
                            a.severity,
                            a.gpu,
                            &self.hostname,
                        );
                        let silenced = self
                            .silences
                            .lock()
                            .ok()
                            .and_then(|s| s.silencing(&labels, now).map(|x| x.id.clone()));
                        json!({
                            "alert": name,
                            "gpu": a.gpu,
                            "state": a.phase.as_str(),
                            "severity": a.severity.as_str(),
                            "since": crate::trace::format_time_ms(a.fired_at_ms.unwrap_or(a.active_since_ms)),
                            "summary": a.annotations.get("summary").cloned().unwrap_or_default(),
                            "silenced_by": silenced,
                        })
                    })
                    .collect();
                control::reply(&json!({"ok": true, "alerts": alerts}))
            }
            "silence_add" => {
                let req = match crate::silence::AddRequest::from_json(ask) {
                    Ok(r) => r,
                    Err(e) => return fail(e).into(),
                };
                // The job is the process of that pid that started when the asker saw it: a pid
                // that already belongs to another process is no job to wait for.
                let until_start = match req.until_pid {
                    Some(pid) => match crate::sys::live_start_ticks(pid) {
                        Some(start) if req.until_start.is_some_and(|s| s != start) => {
                            return fail(format!(
                                "until_pid: process {pid} is not the job asked for (it ended and the pid was reused)"
                            ))
                            .into();
                        }
                        Some(start) => Some(start),
                        None => return fail(format!("until_pid: no process {pid}")).into(),
                    },
                    None => None,
                };
                let silence = crate::silence::Silence {
                    id: String::new(),
                    matchers: req.matchers,
                    starts_ms: now,
                    ends_ms: now.saturating_add(req.for_ms),
                    comment: req.comment,
                    created_by: ask["created_by"].as_str().unwrap_or("").to_string(),
                    until_pid: req.until_pid,
                    until_start,
                };
                let text: Vec<String> = silence.matchers.iter().map(ToString::to_string).collect();
                match self
                    .silences
                    .lock()
                    .map_err(|e| e.to_string())
                    .and_then(|mut s| s.add(silence).map_err(|e| format!("{e:#}")))
                {
                    Ok(id) => {
                        info!(silence = %id, matchers = %text.join(","), "silence added");
                        control::reply(&json!({"ok": true, "id": id}))
                    }
                    Err(e) => fail(e),
                }
            }
            "silence_list" => {
                // A snapshot (O(1)): the client's thread serializes it into the socket, without
                // the lock and off the loop (20,000 silences with long comments are 24 MB of
                // JSON: a second of a debug build's loop per request, and 24 MB per client).
                return match self.silences.lock() {
                    Ok(s) => control::Answer::Silences {
                        now_ms: now,
                        list: s.snapshot(),
                    },
                    Err(e) => fail(e.to_string()).into(),
                };
            }
            "silence_expire" => {
                let id = ask["id"].as_str().unwrap_or("");
                match self
                    .silences
                    .lock()
                    .map_err(|e| e.to_string())
                    .and_then(|mut s| s.expire(id, now).map_err(|e| format!("{e:#}")))
                {
                    Ok(true) => {
                        info!(silence = %id, "silence expired");
                        control::reply(&json!({"ok": true}))
                    }
                    Ok(false) => fail(format!("no active silence with id `{id}`")),
                    Err(e) => fail(e),
                }
            }
            "reload" => match self.reload() {
                Ok(()) => control::reply(&json!({"ok": true})),
                Err(errors) => fail(format!(
                    "reload failed, the running configuration stays:\n{}",
                    errors.join("\n")
                )),
            },
            other => fail(format!("unknown request `{other}`")),
        };
        bytes.into()
    }

    /// Hands the dispatcher the live silences (once, at the start): its grouper reads the set in
    /// force whenever it makes messages, so a change is never copied or queued to it.
    fn sync_silences(&mut self) {
        self.dispatcher
            .send(Input::Silences(crate::silence::Feed::live(&self.silences)));
    }

    /// Publishes `events`; the alert state is saved after every announcement.
    fn publish_and_save(&mut self, events: Vec<AlertEvent>) {
        for ev in &events {
            self.usage.alert(ev);
        }
        // Silenced alerts are evaluated, recorded and exported, but not notified: the
        // dispatcher's grouper leaves them out of messages while a silence matches (their
        // resolutions, and their announcement when a silence ends first, still go out).
        let now = now_ms();
        if let Ok(s) = self.silences.lock() {
            for ev in events
                .iter()
                .filter(|e| e.status == crate::model::AlertStatus::Firing)
            {
                let labels = crate::notify::full_labels(ev, &self.hostname);
                if let Some(x) = s.silencing(&labels, now) {
                    info!(alert = %ev.name, gpu = %ev.gpu.map_or_else(String::new, |g| g.to_string()), silence = %x.id, "silenced: not notified");
                }
            }
        }
        self.publish(events);
        self.save_engine();
    }

    /// Hands `events` to the dispatcher; the alert state is to be saved after them.
    fn publish(&mut self, events: Vec<AlertEvent>) {
        if publish(&self.dispatcher, events) {
            // A mark put before these events no longer covers them.
            self.save = (true, None);
        }
    }

    /// Saves the alert state when it is due, but only once the dispatcher has ingested and saved
    /// every event published before (its mark reached): a `kill -9` between the two saves then
    /// leaves the engine behind the dispatcher — the transitions are evaluated again and their
    /// events ingested again, which changes nothing — and never ahead of it, where an alert the
    /// engine counts as announced would never reach anyone. The dispatcher answers within
    /// milliseconds; when it is slower the save waits for the next turn of the loop.
    fn save_engine(&mut self) {
        if !self.save.0 {
            return;
        }
        let mark = *self.save.1.get_or_insert_with(|| self.dispatcher.mark());
        if self
            .dispatcher
            .wait_persisted(mark, Duration::from_millis(20))
        {
            save_engine(&self.dir, self.pipeline.engine());
            self.save = (false, None);
            self.last_save = Instant::now();
        }
    }
}

/// The recorder `[recording]` asks for (in `--speed`'s private state directory under a faster
/// clock), `None` when it is off or cannot be opened (said).
fn open_recorder(
    config: &crate::config::Config,
    sim_dir: Option<&Path>,
    interval: Duration,
) -> Option<crate::record::Recorder> {
    if !config.recording.enabled {
        return None;
    }
    let dir = match sim_dir {
        Some(d) => d.join("recording"),
        None => config.recording_dir(),
    };
    match crate::record::Recorder::open(&dir, &config.recording, interval) {
        Ok(r) => {
            info!(dir = %dir.display(), "recording every tick");
            Some(r)
        }
        Err(e) => {
            error!(
                "recording in {}: {e}; the daemon runs without it",
                dir.display()
            );
            None
        }
    }
}

/// The `collector_degraded` alert (info): what the sampler cannot watch, e.g. GPUs whose XID
/// events could not be registered.
fn degraded_event(hostname: &str, missing: &[String], now: i64) -> AlertEvent {
    let labels: std::collections::BTreeMap<String, String> = [
        ("alertname", "collector_degraded"),
        ("severity", "info"),
        ("hostname", hostname),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut annotations = std::collections::BTreeMap::new();
    annotations.insert(
        "summary".to_string(),
        format!(
            "gpuwatch on {hostname} cannot watch everything: {}",
            missing.join("; ")
        ),
    );
    annotations.insert(
        "next_steps".to_string(),
        "XIDs on these GPUs (79 fallen off the bus, 94/95 memory errors, …) will not be \
         reported: check the driver (`nvidia-smi -q`), and the kernel log (`journalctl -k | \
         grep -i xid`) for XIDs meanwhile."
            .to_string(),
    );
    AlertEvent::notice(
        crate::alert::fingerprint(&labels),
        "collector_degraded",
        crate::model::Severity::Info,
        crate::model::AlertStatus::Firing,
        labels,
        annotations,
        now,
    )
    .once()
}

/// Logs `events` and hands them to the dispatcher; true when there were any.
fn publish(dispatcher: &Dispatcher, events: Vec<AlertEvent>) -> bool {
    if events.is_empty() {
        return false;
    }
    log_events(&events);
    dispatcher.send(Input::Events(events));
    true
}

/// Which of the sampler's optional reads ([`crate::sampler::OPTIONAL_READS`]) nothing in this
/// daemon uses: one is read while a rule names it or `/metrics` serves it.
fn unread_reads(engine: &Engine, exporting: bool) -> u64 {
    crate::sampler::unread_mask(|m| exporting || engine.rules().names_metric(m))
}

fn save_engine(dir: &Path, engine: &Engine) {
    if let Err(e) = alert::save_state(dir, &engine.state()) {
        error!("cannot save alert state: {e:#}");
    }
}

/// Loads the rule files again into `engine`; the events of the change (alerts of removed or
/// changed rules resolving), to publish.
fn reload_rules(
    engine: &mut Engine,
    paths: &[PathBuf],
    config: &crate::rules::RulesConfig,
) -> Vec<AlertEvent> {
    let set = match crate::rules::RuleSet::load(paths, config) {
        Ok(set) if set.is_empty() && engine.rule_count() > 0 => {
            error!(
                "the rule files are gone: keeping the {} running rules (SIGHUP with a config that \
                 names no rules to run without any)",
                engine.rule_count()
            );
            return Vec::new();
        }
        other => other,
    };
    match set.map(|set| engine.reload(set)) {
        Ok(events) => {
            info!(rules = engine.rule_count(), "rules reloaded");
            events
        }
        Err(errors) => {
            for e in &errors {
                error!("{e}");
            }
            error!(
                "rule reload failed: keeping the {} running rules",
                engine.rule_count()
            );
            Vec::new()
        }
    }
}

/// Whether the job a silence waits for still runs: process `pid` exists, is not a zombie, and
/// (when known) started at `start` (clock ticks since boot) — a process that reused the pid is
/// not the job.
fn job_alive(pid: u32, start: Option<u64>) -> bool {
    crate::sys::live_start_ticks(pid).is_some_and(|now| start.is_none_or(|s| s == now))
}
