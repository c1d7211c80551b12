//! What a person watching the daemon's terminal reads, and what journald or a log shipper gets.
//!
//! `--log-format auto` (the default) picks [`Console::Human`] when stderr is a terminal and the
//! process is not under journald (`JOURNAL_STREAM` unset): each alert transition is one line
//! (`22:14:05  FIRING    critical  GPU 5  gpu_lost — GPU 5 has fallen off the bus …`), other
//! records are short `HH:MM:SS  LEVEL message` lines, and a status line comes every few minutes.
//! Otherwise [`Console::Text`] (timestamped `key=value` records, what journald stores) or, with
//! `--log-format json`, [`Console::Json`] (one JSON object per record). Colour only on a terminal
//! and never with `NO_COLOR`. No line shows Rust debug formatting.

use std::io::IsTerminal as _;
use std::sync::OnceLock;

use crate::model::{AlertEvent, AlertStatus, Severity};

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human lines on a terminal, text records elsewhere (journald, a file, a pipe).
    #[default]
    Auto,
    /// One line per alert transition and short log lines.
    Human,
    /// Timestamped `key=value` records.
    Text,
    /// One JSON object per record.
    Json,
}

/// The console style in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Console {
    /// Lines for a person; `color` when stderr is a terminal and `NO_COLOR` is unset.
    Human { color: bool },
    /// Structured text records.
    Text,
    /// JSON records.
    Json,
}

static CONSOLE: OnceLock<Console> = OnceLock::new();

/// What `format` means here: `auto` looks at stderr and `JOURNAL_STREAM`.
pub fn resolve(format: LogFormat) -> Console {
    let tty = std::io::stderr().is_terminal();
    let color = tty && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    match format {
        LogFormat::Auto if tty && std::env::var_os("JOURNAL_STREAM").is_none() => {
            Console::Human { color }
        }
        LogFormat::Auto | LogFormat::Text => Console::Text,
        LogFormat::Human => Console::Human { color },
        LogFormat::Json => Console::Json,
    }
}

/// The console style chosen at start ([`init`]); text before that.
pub fn console() -> Console {
    CONSOLE.get().copied().unwrap_or(Console::Text)
}

/// Whether alert transitions are printed as human lines (and not as log records).
pub fn is_human() -> bool {
    matches!(console(), Console::Human { .. })
}

/// Local wall time as `HH:MM:SS` for log lines.
struct LocalClock;

impl tracing_subscriber::fmt::time::FormatTime for LocalClock {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        write!(w, "{}", clock(crate::sys::now_ms()))
    }
}

/// `HH:MM:SS` in local time.
pub fn clock(ms: i64) -> String {
    use chrono::TimeZone as _;
    match chrono::Local.timestamp_millis_opt(ms) {
        chrono::LocalResult::Single(t) | chrono::LocalResult::Ambiguous(t, _) => {
            t.format("%H:%M:%S").to_string()
        }
        chrono::LocalResult::None => "--:--:--".to_string(),
    }
}

/// Sets up `tracing` to stderr in `format`'s style, filtered by `GPUWATCH_LOG` (else
/// `default_filter`; `"off"`: no records at all). Safe to call more than once (the first call
/// wins).
pub fn init(default_filter: &str, format: LogFormat) {
    let console = *CONSOLE.get_or_init(|| resolve(format));
    if default_filter == "off" {
        // A full-screen view (`top`) owns the terminal: no records may be written over it.
        return;
    }
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("GPUWATCH_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter))
    };
    let base = tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(std::io::stderr)
        .with_target(false);
    let _ = match console {
        Console::Human { color } => base
            .with_ansi(color)
            .with_timer(LocalClock)
            .compact()
            .try_init(),
        Console::Text => base.with_ansi(false).try_init(),
        Console::Json => base
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
}

/// One alert transition as a person reads it:
/// `22:14:05  FIRING    critical  GPU 5  gpu_lost — GPU 5 has fallen off the bus …`.
pub fn alert_line(ev: &AlertEvent, color: bool) -> String {
    let state = match ev.status {
        AlertStatus::Firing if ev.repeat => "STILL",
        AlertStatus::Firing => "FIRING",
        AlertStatus::Resolved => "RESOLVED",
    };
    let severity = ev.severity.as_str();
    let place = ev.gpu.map_or_else(
        || {
            ev.labels
                .get("pid")
                .map_or_else(|| "host".to_string(), |p| format!("pid {p}"))
        },
        |g| format!("GPU {g}"),
    );
    let summary =
        crate::values::escape_control(ev.annotations.get("summary").map_or("", String::as_str));
    let summary = crate::values::truncate_chars(&summary, 160);
    let (on, off) = if color {
        let code = match (ev.status, ev.severity) {
            (AlertStatus::Resolved, _) => "32",
            (_, Severity::Critical) => "1;31",
            (_, Severity::Warning) => "33",
            _ => "36",
        };
        (format!("\x1b[{code}m"), "\x1b[0m")
    } else {
        (String::new(), "")
    };
    format!(
        "{}  {on}{state:<8}  {severity:<8}{off}  {place:<6}  {} — {summary}",
        clock(ev.at_ms),
        ev.name
    )
}

/// Prints alert transitions for a person (human console only; other styles log them as
/// records).
pub fn print_alerts(events: &[AlertEvent]) {
    if let Console::Human { color } = console() {
        for ev in events {
            eprintln!("{}", alert_line(ev, color));
        }
    }
}

/// Prints a line for a person (human console), else logs it as an info record.
pub fn say(line: &str) {
    match console() {
        Console::Human { .. } => eprintln!("{}  {line}", clock(crate::sys::now_ms())),
        _ => tracing::info!("{line}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(status: AlertStatus, gpu: Option<u32>) -> AlertEvent {
        let mut annotations = std::collections::BTreeMap::new();
        annotations.insert(
            "summary".to_string(),
            "GPU 5 has fallen off the bus: reboot the node".to_string(),
        );
        AlertEvent {
            fingerprint: "f".into(),
            name: "gpu_lost".into(),
            severity: Severity::Critical,
            status,
            labels: std::collections::BTreeMap::new(),
            annotations,
            starts_at_ms: 0,
            ends_at_ms: None,
            at_ms: 0,
            repeat: false,
            gpu,
            actions: Vec::new(),
            target_pid: None,
            target_start: None,
            target_local: false,
            chart: None,
            once: false,
        }
    }

    #[test]
    fn an_alert_is_one_line_without_debug_formatting() {
        let line = alert_line(&event(AlertStatus::Firing, Some(5)), false);
        assert!(
            line.contains("  FIRING    critical  GPU 5   gpu_lost — GPU 5 has fallen off the bus"),
            "{line}"
        );
        assert!(!line.contains("Some(") && !line.contains('\n'), "{line}");
        let host = alert_line(&event(AlertStatus::Resolved, None), false);
        assert!(
            host.contains("RESOLVED  critical  host    gpu_lost"),
            "{host}"
        );
        let colored = alert_line(&event(AlertStatus::Firing, Some(5)), true);
        assert!(colored.contains("\x1b[1;31mFIRING"), "{colored}");
    }

    #[test]
    fn explicit_formats_are_kept() {
        assert_eq!(resolve(LogFormat::Json), Console::Json);
        assert_eq!(resolve(LogFormat::Text), Console::Text);
        assert!(matches!(resolve(LogFormat::Human), Console::Human { .. }));
    }
}
