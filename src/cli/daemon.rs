//! `gpuwatch daemon` and `gpuwatch notify-test`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::GlobalArgs;
use crate::model::{AlertEvent, AlertStatus, Severity};
use crate::notify::settings::NotifySettings;
use crate::notify::transport::Transport;
use crate::notify::{now_ms, Notification, Reason};

/// Default config path (root's, and everyone's when the user has none).
const DEFAULT_CONFIG: &str = "/etc/gpuwatch/config.toml";

/// The config a command uses when none is named: the user's own
/// (`$XDG_CONFIG_HOME/gpuwatch/config.toml`, what `gpuwatch init` writes) for a user who is not
/// root, else `/etc/gpuwatch/config.toml` — the first that exists.
pub fn default_config() -> Option<PathBuf> {
    user_config().or_else(|| Some(PathBuf::from(DEFAULT_CONFIG)).filter(|p| p.is_file()))
}

/// The config of a command a user runs for their own job (`run`, `attach`) when none is named:
/// the user's own (`gpuwatch init`'s), or for root `/etc/gpuwatch/config.toml` — never the system
/// daemon's config for another user, whose secrets they cannot read and whose state directory
/// they cannot write.
pub fn own_config() -> Option<PathBuf> {
    if crate::sys::is_root() {
        Some(PathBuf::from(DEFAULT_CONFIG)).filter(|p| p.is_file())
    } else {
        user_config()
    }
}

/// A user's own config (not root's): `$XDG_CONFIG_HOME/gpuwatch/config.toml`, when it exists.
fn user_config() -> Option<PathBuf> {
    (!crate::sys::is_root())
        .then(super::service::user_config_path)
        .and_then(Result::ok)
        .filter(|p| p.is_file())
}

/// Arguments of `daemon`.
#[derive(Debug, clap::Args)]
pub struct DaemonArgs {
    /// Configuration file [default: ~/.config/gpuwatch/config.toml (`gpuwatch init`'s) for a
    /// user who is not root, else /etc/gpuwatch/config.toml, when it exists; else built-in
    /// defaults: stock rules, no channels (alerts are only logged), state in
    /// ~/.local/state/gpuwatch].
    #[arg(long, short, value_name = "FILE", env = "GPUWATCH_CONFIG")]
    pub config: Option<PathBuf>,
    /// Instead of sampling GPUs, read alert events (JSON lines, `-` for stdin) and deliver them
    /// through the configured channels; stops at end of input. For scripts and channel tests.
    #[arg(long, value_name = "FILE")]
    pub events: Option<PathBuf>,
    /// Keep the alert state, outbox, silences and usage accounting in this directory instead of
    /// the config's `state_dir` (made 0700 when missing). With --speed: where the simulated
    /// run's state stays (by default a new `$TMPDIR/gpuwatch-sim-*` directory, also kept).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

/// Runs `daemon`.
pub fn daemon(global: &GlobalArgs, args: &DaemonArgs) -> anyhow::Result<i32> {
    let config = args.config.clone().or_else(default_config);
    if let Some(events) = &args.events {
        return crate::daemon::run_events(config.as_deref(), events);
    }
    crate::daemon::run(
        &global.sampler_config(),
        config.as_deref(),
        args.state_dir.as_deref(),
    )
}

/// Arguments of `notify-test`.
#[derive(Debug, clap::Args)]
pub struct NotifyTestArgs {
    /// Configuration file [default: as `daemon`'s].
    #[arg(long, short, value_name = "FILE", env = "GPUWATCH_CONFIG")]
    pub config: Option<PathBuf>,
    /// Test only this channel (repeatable); default: every channel.
    #[arg(long, value_name = "NAME")]
    pub channel: Vec<String>,
}

/// The test message for `channel`.
pub fn test_notification(settings: &NotifySettings, channel: &str, now: i64) -> Notification {
    let mut labels = BTreeMap::new();
    labels.insert("alertname".to_string(), "gpuwatch_test".to_string());
    labels.insert("severity".to_string(), "info".to_string());
    labels.insert("hostname".to_string(), settings.hostname.clone());
    let mut annotations = BTreeMap::new();
    annotations.insert(
        "summary".to_string(),
        format!(
            "Test message from gpuwatch on {}: channel {channel:?} works.",
            settings.hostname
        ),
    );
    annotations.insert(
        "next_steps".to_string(),
        "Nothing: this was sent by `gpuwatch notify-test`.".to_string(),
    );
    let alert = AlertEvent::notice(
        "gpuwatch_test".into(),
        "gpuwatch_test",
        Severity::Info,
        AlertStatus::Firing,
        labels.clone(),
        annotations,
        now,
    );
    let mut n = Notification {
        id: String::new(),
        channel: channel.to_string(),
        group_key: "test".into(),
        group_labels: labels,
        status: AlertStatus::Firing,
        reason: Reason::Test,
        alerts: vec![alert],
        truncated_alerts: 0,
        created_ms: now,
        repeat_interval_ms: 60_000,
        hostname: settings.hostname.clone(),
        devices: Vec::new(),
        processes: Vec::new(),
        note: None,
    };
    n.compute_id();
    n
}

/// Runs `notify-test`: one test message per channel, concurrently; prints `ok` or the exact
/// failure per channel; exit 1 if any failed.
#[expect(clippy::print_stdout, reason = "command output")]
pub fn notify_test(_global: &GlobalArgs, args: &NotifyTestArgs) -> anyhow::Result<i32> {
    let path = args
        .config
        .clone()
        .or_else(default_config)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG));
    let config = crate::config::load(&path)?;
    let settings = config.notify_settings()?;
    for name in &args.channel {
        if settings.channel(name).is_none() {
            anyhow::bail!("no channel named {name:?} in {}", path.display());
        }
    }
    let channels: Vec<_> = settings
        .channels
        .iter()
        .filter(|c| args.channel.is_empty() || args.channel.contains(&c.name))
        .cloned()
        .collect();
    if channels.is_empty() {
        anyhow::bail!("no channels configured in {}", path.display());
    }
    let transport = Transport::new()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let now = now_ms();
    let results = rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for (i, spec) in channels.iter().enumerate() {
            let n = test_notification(&settings, &spec.name, now);
            let spec = spec.clone();
            let t = transport.clone();
            set.spawn(async move {
                let start = std::time::Instant::now();
                let r = t.send(&spec, &n).await;
                (i, r, start.elapsed())
            });
        }
        let mut results = vec![None; channels.len()];
        while let Some(Ok((i, r, took))) = set.join_next().await {
            results[i] = Some((r, took));
        }
        results
    });
    let mut failed = 0;
    for (spec, r) in channels.iter().zip(results) {
        match r {
            Some((Ok(()), took)) => println!(
                "ok    {} ({}) in {} ms",
                spec.name,
                spec.kind.as_str(),
                took.as_millis()
            ),
            Some((Err(e), _)) => {
                failed += 1;
                println!("FAIL  {} ({}): {e}", spec.name, spec.kind.as_str());
            }
            None => {
                failed += 1;
                println!(
                    "FAIL  {} ({}): send task crashed",
                    spec.name,
                    spec.kind.as_str()
                );
            }
        }
    }
    Ok(i32::from(failed > 0))
}
