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
use std::sync::mpsc;

use tracing::{error, info, warn};

use crate::config::{self, Config};
use crate::model::{AlertEvent, DeviceId, ProcSample};
use crate::notify::dispatcher::{Dispatcher, Input};
use crate::notify::settings::NotifySettings;

/// Sets up `tracing` to stderr: level from `GPUWATCH_LOG` (default `info`), ANSI colour only
/// when stderr is a terminal. Safe to call more than once.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("GPUWATCH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
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
        dispatcher.send(Input::Healthy(crate::notify::now_ms()));
        let msg = match rx.recv_timeout(std::time::Duration::from_secs(1)) {
            Ok(m) => m,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        match msg {
            Control::Events(events) => dispatcher.send(Input::Events(events)),
            Control::Context(devices, processes) => {
                dispatcher.send(Input::Context { devices, processes });
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
                info!("end of events input: stopping");
                break;
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
