//! `gpuwatch daemon`: the long-running process. Logging (tracing to stderr, journald-friendly,
//! no colour unless stderr is a terminal), signals (SIGTERM/SIGINT stop gracefully, SIGHUP
//! reloads), and the main loops that feed the notification [`Dispatcher`]:
//! * [`run_events`] — alert events read as JSON lines (`daemon --events FILE|-`), for scripting
//!   and for testing channels without GPUs;
//! * the sampling loop (sampler thread → engine → dispatcher), once the sampler and engine are
//!   on `main`.
//!
//! The dispatcher runs on its own thread, so a slow channel never stalls the loop; everything it
//! has not delivered is in the outbox under `state_dir`, so a stop loses nothing.

use std::io::{BufRead as _, IsTerminal as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use crate::alert;
use crate::cli::GlobalArgs;
use crate::config::{self, Config};
use crate::engine::{Engine, EngineOptions};
use crate::model::{AlertEvent, DeviceId, ProcSample, Snapshot};
use crate::notify::dispatcher::{Dispatcher, Input};
use crate::sys::now_ms;
use crate::notify::settings::NotifySettings;
use crate::rules::{default_rule_paths, RuleSet, RulesConfig};
use crate::sampler::{Sampler, Ticker};

/// Sets up `tracing` to stderr: filter from `GPUWATCH_LOG` (else `default_filter`), ANSI colour
/// only when stderr is a terminal (journald gets plain text). Safe to call more than once.
pub fn init_logging(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("GPUWATCH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}

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

/// Loads and validates the config and notification settings; with no file, the built-in
/// defaults (no channels, state under `~/.local/state/gpuwatch`).
pub fn load(config_path: Option<&Path>) -> anyhow::Result<(Config, NotifySettings)> {
    let config = match config_path {
        Some(p) => config::load(p)?,
        None => {
            let mut c = Config::default();
            if let Some(home) = std::env::var_os("HOME") {
                c.daemon.state_dir = PathBuf::from(home).join(".local/state/gpuwatch");
            }
            c
        }
    };
    let settings = NotifySettings::from_config(&config)?;
    Ok((config, settings))
}

/// `FILE` or `(built-in defaults)`, for messages.
pub fn describe(config_path: Option<&Path>) -> String {
    config_path.map_or_else(|| "(built-in defaults)".into(), |p| p.display().to_string())
}

/// The state directory (relative paths resolve against the config file's directory).
pub fn state_dir(config: &Config) -> PathBuf {
    if config.daemon.state_dir.is_absolute() {
        config.daemon.state_dir.clone()
    } else {
        config.base_dir.join(&config.daemon.state_dir)
    }
}

/// `daemon --events SOURCE`: reads alert events (one JSON [`AlertEvent`] or array of them per
/// line) from a file or `-` (stdin) and dispatches them; stops at end of input or on
/// SIGTERM/SIGINT, reloads notification settings on SIGHUP.
pub fn run_events(config_path: Option<&Path>, source: &Path) -> anyhow::Result<i32> {
    let (config, settings) = load(config_path)?;
    let dir = state_dir(&config);
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
        dispatcher.send(Input::Healthy(crate::sys::now_ms()));
        let msg = match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(m) => m,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        match msg {
            Control::Events(events) => dispatcher.send(Input::Events(events)),
            Control::Context(devices, processes) => {
                dispatcher.send(Input::Context { devices, processes });
            }
            Control::Snapshot(_) => {}
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

/// Files under the rule paths with their modification times (to notice edits).
fn rule_files_signature(paths: &[PathBuf]) -> Vec<(PathBuf, Option<std::time::SystemTime>)> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            if let Ok(rd) = std::fs::read_dir(p) {
                let mut files: Vec<PathBuf> = rd
                    .flatten()
                    .map(|e| e.path())
                    .filter(|f| f.extension().is_some_and(|x| x == "rhai"))
                    .collect();
                files.sort();
                for f in files {
                    let m = std::fs::metadata(&f).and_then(|m| m.modified()).ok();
                    out.push((f, m));
                }
            }
        } else {
            let m = std::fs::metadata(p).and_then(|m| m.modified()).ok();
            out.push((p.clone(), m));
        }
    }
    out
}

struct Rules {
    paths: Vec<PathBuf>,
    config: RulesConfig,
    signature: Vec<(PathBuf, Option<std::time::SystemTime>)>,
}

impl Rules {
    fn from_config(config: &Config) -> Rules {
        let rules_config = config.rules.clone();
        let paths = default_rule_paths(&[], Some(config), &rules_config);
        let signature = rule_files_signature(&paths);
        Rules {
            paths,
            config: rules_config,
            signature,
        }
    }
}

fn log_events(events: &[AlertEvent]) {
    for e in events {
        info!(
            alert = %e.name,
            severity = e.severity.as_str(),
            gpu = ?e.gpu,
            status = ?e.status,
            repeat = e.repeat,
            "{}",
            e.annotations.get("summary").map_or("", String::as_str)
        );
    }
}

/// `gpuwatch daemon`: the sampler on its own thread → engine (observe / advance) → dispatcher.
pub fn run(global: &GlobalArgs, config_path: Option<&Path>) -> anyhow::Result<i32> {
    let (config, settings) = load(config_path)?;
    let interval_ms = config::parse_duration_ms(&config.daemon.interval)
        .map_err(|e| anyhow::anyhow!("{}: [daemon] interval: {e}", describe(config_path)))?
        .max(10);
    let interval = Duration::from_millis(u64::try_from(interval_ms).unwrap_or(1000));
    let dir = state_dir(&config);
    let mut rules = Rules::from_config(&config);
    let rule_set = RuleSet::load(&rules.paths, &rules.config).map_err(|errs| {
        anyhow::anyhow!(
            "{}",
            errs.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        )
    })?;
    let hostname = config.hostname();
    let opts = EngineOptions::from_config(&config, &rules.config, &hostname)
        .map_err(|e| anyhow::anyhow!("{}: {e}", describe(config_path)))?;
    let mut engine = match alert::load_state(&dir) {
        Ok(Some(state)) => {
            info!(state_dir = %dir.display(), "resuming alert state");
            Engine::with_state(rule_set, opts, &state)
        }
        Ok(None) => Engine::new(rule_set, opts),
        Err(e) => {
            warn!("{e:#}; starting with empty alert state");
            Engine::new(rule_set, opts)
        }
    };
    let sampler_cfg = global.sampler_config();
    let mut sampler = match Sampler::open(&sampler_cfg) {
        Ok(s) => s,
        Err(e) => {
            error!("{e}");
            return Ok(crate::cli::EXIT_NO_NVML);
        }
    };
    let devices = sampler.devices();
    info!(
        config = %describe(config_path),
        state_dir = %dir.display(),
        host = %hostname,
        gpus = devices.len(),
        rules = engine.rule_count(),
        channels = settings.channels.len(),
        interval_ms,
        "gpuwatch daemon started"
    );
    let dispatcher = Dispatcher::start(settings, &dir)?;
    dispatcher.send(Input::Context {
        devices: devices.clone(),
        processes: None,
    });
    // Kill and exec actions of firing rules (`action: "kill"` goes through [actions.kill]).
    let mut actions = crate::action::ActionRunner::from_config(&config, &dir, &hostname);

    let (tx, rx) = mpsc::channel::<Control>();
    spawn_signal_thread(tx.clone())?;
    let stop = Arc::new(AtomicBool::new(false));
    let sampler_thread = {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("gpuwatch-sampler".into())
            .spawn(move || {
                let mut ticker = Ticker::new(Instant::now(), interval);
                'outer: loop {
                    let due = ticker.next(Instant::now());
                    loop {
                        if stop.load(Ordering::SeqCst) {
                            break 'outer;
                        }
                        let left = due.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            break;
                        }
                        std::thread::sleep(left.min(Duration::from_millis(100)));
                    }
                    let snap = sampler.sample();
                    if tx.send(Control::Snapshot(Box::new(snap))).is_err() {
                        break;
                    }
                }
                if ticker.missed() > 0 {
                    warn!(missed = ticker.missed(), "late sampling ticks were skipped");
                }
            })?
    };

    let mut last_devices = devices;
    let mut last_save = Instant::now();
    let mut last_rule_check = Instant::now();
    let mut last_snapshot = Instant::now();
    loop {
        let msg = rx.recv_timeout(interval);
        match msg {
            Ok(Control::Snapshot(snap)) => {
                last_snapshot = Instant::now();
                let devices: Vec<DeviceId> = snap.gpus.iter().map(|g| g.id.clone()).collect();
                if devices != last_devices || snap.processes.is_some() {
                    dispatcher.send(Input::Context {
                        devices: devices.clone(),
                        processes: snap.processes.clone(),
                    });
                    last_devices = devices;
                }
                let events = engine.observe(&snap);
                act(
                    &mut actions,
                    &events,
                    snap.time_ms,
                    snap.processes.as_deref(),
                    &dispatcher,
                );
                dispatcher.send(Input::Healthy(snap.time_ms));
                if !events.is_empty() {
                    log_events(&events);
                    dispatcher.send(Input::Events(events));
                    save_engine(&dir, &engine);
                    last_save = Instant::now();
                }
            }
            Ok(Control::Stop(why)) => {
                info!("{why}: stopping");
                break;
            }
            Ok(Control::Reload) => {
                info!("SIGHUP: reloading configuration and rules");
                match load(config_path) {
                    Ok((new_config, new_settings)) => {
                        dispatcher.send(Input::Reload(Box::new(new_settings)));
                        rules = Rules::from_config(&new_config);
                        reload_rules(&mut engine, &rules, &dispatcher);
                    }
                    Err(e) => error!("reload failed, keeping the running configuration: {e:#}"),
                }
            }
            Ok(Control::Events(_) | Control::EndOfInput | Control::Context(..)) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                error!("the sampler thread stopped");
                break;
            }
        }
        if last_snapshot.elapsed() >= interval {
            let events = engine.advance(now_ms());
            act(&mut actions, &events, now_ms(), None, &dispatcher);
            if !events.is_empty() {
                log_events(&events);
                dispatcher.send(Input::Events(events));
                save_engine(&dir, &engine);
                last_save = Instant::now();
            }
        }
        if last_rule_check.elapsed() >= Duration::from_secs(2) {
            last_rule_check = Instant::now();
            let sig = rule_files_signature(&rules.paths);
            if sig != rules.signature {
                info!("rule files changed: reloading");
                rules.signature = sig;
                reload_rules(&mut engine, &rules, &dispatcher);
            }
        }
        if last_save.elapsed() >= Duration::from_secs(30) {
            save_engine(&dir, &engine);
            last_save = Instant::now();
        }
    }
    stop.store(true, Ordering::SeqCst);
    // A sampler stuck in a slow NVML call must not hold up the stop: wait a little, then go.
    let deadline = Instant::now() + Duration::from_secs(2);
    while !sampler_thread.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if sampler_thread.is_finished() {
        let _ = sampler_thread.join();
    } else {
        warn!("the sampler thread is busy in an NVML call; stopping without it");
    }
    save_engine(&dir, &engine);
    actions.finish();
    dispatcher.stop();
    info!("gpuwatch daemon stopped");
    Ok(0)
}

/// Routes events to kill/exec actions, advances kill ladders, and sends every audit record as a
/// `kill_action` notification.
fn act(
    actions: &mut crate::action::ActionRunner,
    events: &[AlertEvent],
    now: i64,
    processes: Option<&[crate::model::ProcSample]>,
    dispatcher: &Dispatcher,
) {
    let mut audits = actions.handle(events, now);
    audits.extend(actions.tick(now, processes));
    if !audits.is_empty() {
        let notices: Vec<AlertEvent> = audits
            .iter()
            .map(crate::action::AuditRecord::to_alert_event)
            .collect();
        log_events(&notices);
        dispatcher.send(Input::Events(notices));
    }
}

fn save_engine(dir: &Path, engine: &Engine) {
    if let Err(e) = alert::save_state(dir, &engine.state()) {
        error!("cannot save alert state: {e:#}");
    }
}

fn reload_rules(engine: &mut Engine, rules: &Rules, dispatcher: &Dispatcher) {
    match engine.reload_from(&rules.paths, &rules.config) {
        Ok(events) => {
            info!(rules = engine.rule_count(), "rules reloaded");
            if !events.is_empty() {
                log_events(&events);
                dispatcher.send(Input::Events(events));
            }
        }
        Err(errors) => {
            for e in &errors {
                error!("{e}");
            }
            error!(
                "rule reload failed: keeping the {} running rules",
                engine.rule_count()
            );
        }
    }
}
