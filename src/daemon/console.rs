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

/// A log record as a person reads it, in the columns of the alert lines:
/// `20:49:10  ERROR     GPU 5 (…) is lost …` under `20:44:00  FIRING    warning   GPU 1 …`.
struct HumanRecord {
    color: bool,
}

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for HumanRecord
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut w: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let level = *event.metadata().level();
        let (on, off) = match level {
            _ if !self.color => ("", ""),
            tracing::Level::ERROR => ("\x1b[1;31m", "\x1b[0m"),
            tracing::Level::WARN => ("\x1b[33m", "\x1b[0m"),
            _ => ("\x1b[2m", "\x1b[0m"),
        };
        let stamp = clock(crate::sys::now_ms());
        let mut text = String::new();
        ctx.field_format().format_fields(
            tracing_subscriber::fmt::format::Writer::new(&mut text),
            event,
        )?;
        // (the head: the stamp, two spaces, the level in 8 columns, two spaces)
        let body = layout(stamp.chars().count() + 12, &text, terminal_width());
        writeln!(w, "{stamp}  {on}{:<8}{off}  {body}", level.as_str())
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
            .event_format(HumanRecord { color })
            .try_init(),
        Console::Text => base.with_ansi(false).try_init(),
        Console::Json => base
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
}

/// The width of the terminal standard error is, when it is one.
fn terminal_width() -> Option<usize> {
    // SAFETY: a zeroed winsize is a valid out-parameter; TIOCGWINSZ writes only into it.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: fd 2 and a valid pointer to `ws`; the call fails harmlessly on a non-terminal.
    let rc = unsafe { libc::ioctl(2, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_col > 0).then_some(usize::from(ws.ws_col))
}

/// `text` in lines of at most `width` characters, broken between words (a word longer than a
/// line gets a line of its own, whole): nothing is cut.
fn wrap_words(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        let needed = line.chars().count() + usize::from(!line.is_empty()) + word.chars().count();
        if !line.is_empty() && needed > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

/// One alert transition as a person reads it:
/// `22:14:05  FIRING    critical  GPU 5  gpu_lost — GPU 5 has fallen off the bus …`. The
/// summary is never cut: on a terminal of `width` columns it is wrapped between words, the
/// following lines indented under it; elsewhere it is one line, whole.
pub fn alert_line(ev: &AlertEvent, color: bool, width: Option<usize>) -> String {
    let state = ev.state_word();
    let severity = ev.severity.as_str();
    let place = ev.gpu.map_or_else(
        || {
            ev.labels
                .get("pid")
                .map_or_else(|| "host".to_string(), |p| format!("pid {p}"))
        },
        |g| format!("GPU {g}"),
    );
    let summary = ev.told_summary();
    let (on, off) = if color {
        let code = match (ev.status, ev.severity) {
            // green only where the condition cleared; an end for another reason is dim
            (AlertStatus::Resolved, _) if state == "RESOLVED" => "32",
            (AlertStatus::Resolved, _) => "2",
            (_, Severity::Critical) => "1;31",
            (_, Severity::Warning) => "33",
            _ => "36",
        };
        (format!("\x1b[{code}m"), "\x1b[0m")
    } else {
        (String::new(), "")
    };
    let head = format!(
        "{}  {state:<8}  {severity:<8}  {place:<6}  ",
        clock(ev.at_ms)
    );
    let text = format!("{} — {summary}", ev.name);
    let body = layout(head.chars().count(), &text, width);
    format!(
        "{}  {on}{state:<8}  {severity:<8}{off}  {place:<6}  {body}",
        clock(ev.at_ms)
    )
}

/// Prints alert transitions for a person (human console only; other styles log them as
/// records).
pub fn print_alerts(events: &[AlertEvent]) {
    if let Console::Human { color } = console() {
        for ev in events {
            eprintln!("{}", alert_line(ev, color, terminal_width()));
        }
    }
}

/// `text` after a head of `indent` columns on a terminal of `width` columns: wrapped between
/// words, the following lines indented under its start (a pane too narrow for the columns: the
/// text under them, slightly indented); elsewhere one line, whole. Nothing is ever cut.
fn layout(indent: usize, text: &str, width: Option<usize>) -> String {
    // (a text of several lines — an error's causes — keeps them, each wrapped)
    let wrap = |w: usize| -> Vec<String> { text.lines().flat_map(|l| wrap_words(l, w)).collect() };
    match width {
        Some(w) if w >= indent + 30 => wrap(w - indent).join(&format!("\n{:indent$}", "")),
        Some(w) => format!("\n    {}", wrap(w.saturating_sub(4).max(20)).join("\n    ")),
        None => text.to_string(),
    }
}

/// Prints a line for a person (human console: wrapped to the terminal like alert lines), else
/// logs it as an info record.
pub fn say(line: &str) {
    match console() {
        Console::Human { .. } => {
            let head = format!("{}  ", clock(crate::sys::now_ms()));
            let body = layout(head.chars().count(), line, terminal_width());
            eprintln!("{head}{body}");
        }
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
            ended: None,
        }
    }

    #[test]
    fn an_alert_is_one_line_without_debug_formatting() {
        let line = alert_line(&event(AlertStatus::Firing, Some(5)), false, None);
        assert!(
            line.contains("  FIRING    critical  GPU 5   gpu_lost — GPU 5 has fallen off the bus"),
            "{line}"
        );
        assert!(!line.contains("Some(") && !line.contains('\n'), "{line}");
        let host = alert_line(&event(AlertStatus::Resolved, None), false, None);
        assert!(
            host.contains("RESOLVED  critical  host    gpu_lost"),
            "{host}"
        );
        let colored = alert_line(&event(AlertStatus::Firing, Some(5)), true, None);
        assert!(colored.contains("\x1b[1;31mFIRING"), "{colored}");
    }

    #[test]
    fn a_long_summary_is_wrapped_on_a_terminal_and_never_cut() {
        let mut ev = event(AlertStatus::Firing, None);
        let summary = "GPU 3 runs at 41 % while its 7 peers run at 96 %: a rank doing extra work \
                       (synchronous checkpoint or logging on rank 0) or a slower GPU; GPU 6 too, \
                       at 44 %: the same job's ranks wait for both at every step";
        ev.annotations.insert("summary".into(), summary.into());
        // piped: one line, whole
        let line = alert_line(&ev, false, None);
        assert!(
            !line.contains('\n') && line.ends_with("at every step"),
            "{line}"
        );
        // an 80-column pane: every line fits, every word is there, in order
        let wrapped = alert_line(&ev, false, Some(80));
        assert!(wrapped.lines().count() > 2, "{wrapped}");
        for l in wrapped.lines() {
            assert!(l.chars().count() <= 80, "{l:?}");
        }
        let words: Vec<&str> = wrapped.split_whitespace().collect();
        let expected: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words, expected);
        assert!(!wrapped.contains('…'), "{wrapped}");
        // the continuation lines start under the text
        let indent = wrapped.lines().nth(1).unwrap().len()
            - wrapped.lines().nth(1).unwrap().trim_start().len();
        assert_eq!(
            indent,
            wrapped.lines().next().unwrap().find("gpu_lost").unwrap()
        );
        // too narrow for the columns: the text under them, still whole
        let narrow = alert_line(&ev, false, Some(40));
        assert_eq!(narrow.split_whitespace().count(), expected.len());
        for l in narrow.lines() {
            assert!(l.chars().count() <= 40, "{l:?}");
        }
    }

    #[test]
    fn explicit_formats_are_kept() {
        assert_eq!(resolve(LogFormat::Json), Console::Json);
        assert_eq!(resolve(LogFormat::Text), Console::Text);
        assert!(matches!(resolve(LogFormat::Human), Console::Human { .. }));
    }
}
