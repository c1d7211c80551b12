//! `gpuwatch top`: a live terminal view of every GPU with the history `watch nvidia-smi` never
//! had — a row per GPU with utilization, memory, temperature, power, SM clock and throttle
//! reasons, sparklines of the last minutes, the processes (pid, user, container, command), the
//! jobs `gpuwatch run` watches, and what is pending and firing: read from the running daemon's
//! control socket, or (no daemon) from the stock rules evaluated here.
//!
//! Collect/render split: [`state`] takes snapshots, alerts and keys; [`view`] draws the state;
//! this module owns the terminal (raw mode, alternate screen, restored on every exit path: normal
//! end, `q`, Ctrl-C, SIGTERM/SIGHUP, and a panic) and the loop.

pub mod state;
pub mod view;

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossterm::event::{Event, KeyCode, KeyEventKind, KeyModifiers};

use crate::engine::Engine;
use crate::pipeline::SamplerThread;
use state::{AlertSource, AlertView, JobView, Key, TopState};
use view::Look;

/// What `top` runs with.
#[derive(Debug, Clone)]
pub struct TopOptions {
    pub host: String,
    /// The sampling interval (wall time).
    pub interval: Duration,
    pub look: Look,
    /// The daemon's control socket.
    pub socket: PathBuf,
    /// Where `gpuwatch run` leaves its jobs' status files.
    pub jobs_dir: PathBuf,
}

/// Puts the terminal back (cooked mode, main screen, cursor) when dropped.
struct TerminalGuard;

impl TerminalGuard {
    fn enter() -> std::io::Result<TerminalGuard> {
        crossterm::terminal::enable_raw_mode()?;
        let mut out = std::io::stdout();
        crossterm::execute!(
            out,
            crossterm::terminal::EnterAlternateScreen,
            crossterm::cursor::Hide
        )?;
        Ok(TerminalGuard)
    }
}

fn restore_terminal() {
    let mut out = std::io::stdout();
    let _ = crossterm::execute!(
        out,
        crossterm::cursor::Show,
        crossterm::terminal::LeaveAlternateScreen
    );
    let _ = crossterm::terminal::disable_raw_mode();
    let _ = out.flush();
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore_terminal();
    }
}

/// Whether this terminal shows UTF-8 (from `LC_ALL`, `LC_CTYPE`, `LANG`, the first one set).
pub fn terminal_is_utf8() -> bool {
    for var in ["LC_ALL", "LC_CTYPE", "LANG"] {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            let v = v.to_string_lossy().to_ascii_lowercase();
            return v.contains("utf-8") || v.contains("utf8");
        }
    }
    false
}

/// The alerts of the daemon at `socket`, or why not.
fn daemon_alerts(socket: &std::path::Path) -> Result<Vec<AlertView>, String> {
    // At most a second: the view stays live (and falls back to its own rules) when the daemon
    // is stopped or stuck.
    let v = crate::daemon::control::ask_within(
        socket,
        &serde_json::json!({"ask": "alerts"}),
        Duration::from_secs(1),
    )?;
    Ok(v["alerts"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|a| AlertView {
                    name: a["alert"].as_str().unwrap_or("").to_string(),
                    severity: a["severity"].as_str().unwrap_or("").to_string(),
                    gpu: a["gpu"].as_u64().and_then(|g| u32::try_from(g).ok()),
                    state: a["state"].as_str().unwrap_or("").to_string(),
                    summary: a["summary"].as_str().unwrap_or("").to_string(),
                    silenced: a["silenced_by"].is_string(),
                })
                .collect()
        })
        .unwrap_or_default())
}

/// The alerts pending and firing in the local engine.
fn local_alerts(engine: &Engine) -> Vec<AlertView> {
    engine
        .alerts()
        .map(|a| AlertView {
            name: a.alertname().to_string(),
            severity: a.severity.as_str().to_string(),
            gpu: a.gpu,
            state: a.phase.as_str().to_string(),
            summary: a.annotations.get("summary").cloned().unwrap_or_default(),
            silenced: false,
        })
        .collect()
}

/// The jobs `gpuwatch run` watches now: the status files whose job and `run` processes still
/// run (PID and start time); those of jobs provably gone are removed.
fn read_jobs(dir: &std::path::Path) -> Vec<JobView> {
    crate::pipeline::status::live_jobs(dir)
        .into_iter()
        .map(|j| JobView {
            pid: j.pid,
            command: j.command,
            progress: j.progress,
            progress_age_s: j.progress_age_s,
            eta_s: j.eta_s,
        })
        .collect()
}

/// Waits up to `wait` for input on the terminal (stdin); true when it has hung up.
fn terminal_hung_up(wait: Duration) -> bool {
    let mut fds = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(wait.as_millis()).unwrap_or(100);
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut fds, 1, ms) };
    n > 0 && fds.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

fn key_of(ev: &crossterm::event::KeyEvent) -> Option<Key> {
    if ev.kind == KeyEventKind::Release {
        return None;
    }
    if ev.modifiers.contains(KeyModifiers::CONTROL) && ev.code == KeyCode::Char('c') {
        return Some(Key::Char('q'));
    }
    Some(match ev.code {
        KeyCode::Char(c) => Key::Char(c),
        KeyCode::Up => Key::Up,
        KeyCode::Down => Key::Down,
        KeyCode::Enter => Key::Enter,
        KeyCode::Esc => Key::Esc,
        _ => return None,
    })
}

/// Runs the view until `q`, Ctrl-C, SIGTERM/SIGHUP/SIGINT or the end of the samples.
pub fn run(opts: &TopOptions, sampler: SamplerThread, mut engine: Engine) -> anyhow::Result<i32> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    // A panic must not leave the terminal raw: restore it before the message is printed.
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore_terminal();
        previous(info);
    }));
    let _guard = TerminalGuard::enter()?;
    let backend = ratatui::backend::CrosstermBackend::new(std::io::stdout());
    let mut terminal = ratatui::Terminal::new(backend)?;
    let _ = terminal.clear();

    let mut source = match daemon_alerts(&opts.socket) {
        Ok(_) => AlertSource::Daemon,
        Err(_) => AlertSource::Local(None),
    };
    let interval_ms = i64::try_from(opts.interval.as_millis()).unwrap_or(1000);
    let mut st = TopState::new(opts.host.clone(), interval_ms, source.clone());
    let mut last_jobs = Instant::now() - Duration::from_secs(60);
    let mut last_daemon_try = Instant::now();
    let mut dirty = true;
    let mut failed_draws = 0;
    while !stop.load(Ordering::Relaxed) {
        // Snapshots: the local engine always follows them (so switching to it loses nothing).
        let mut got = false;
        loop {
            match sampler.receiver().try_recv() {
                Ok(snap) => {
                    engine.observe(&snap);
                    if !st.paused {
                        st.observe(&snap);
                    }
                    got = true;
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    stop.store(true, Ordering::Relaxed);
                    break;
                }
            }
        }
        if got {
            dirty = true;
            // Alerts: the daemon's while it answers; else the local engine's, trying the
            // daemon again every 5 s.
            if source == AlertSource::Daemon {
                match daemon_alerts(&opts.socket) {
                    Ok(a) => st.alerts = a,
                    Err(e) => {
                        source =
                            AlertSource::Local(Some(format!("the daemon stopped answering ({e})")));
                        last_daemon_try = Instant::now();
                    }
                }
            } else if last_daemon_try.elapsed() >= Duration::from_secs(5) {
                last_daemon_try = Instant::now();
                if let Ok(a) = daemon_alerts(&opts.socket) {
                    source = AlertSource::Daemon;
                    st.alerts = a;
                }
            }
            if source != AlertSource::Daemon {
                st.alerts = local_alerts(&engine);
            }
            st.source = source.clone();
        }
        if last_jobs.elapsed() >= Duration::from_secs(2) {
            last_jobs = Instant::now();
            let jobs = read_jobs(&opts.jobs_dir);
            if jobs != st.jobs {
                st.jobs = jobs;
                dirty = true;
            }
        }
        if dirty {
            // A draw that fails (the terminal resized mid-draw) is retried at the next change;
            // a terminal that keeps failing is gone (ssh dropped, tmux killed): stop.
            match terminal.draw(|f| view::draw(f, &st, opts.look)) {
                Ok(_) => failed_draws = 0,
                Err(_) => failed_draws += 1,
            }
            if failed_draws >= 5 {
                break;
            }
            dirty = false;
        }
        // Wait for a key (or 100 ms) on the terminal ourselves: when it hangs up (ssh dropped,
        // tmux killed) crossterm's poll would spin on the dead descriptor; stop instead.
        if terminal_hung_up(Duration::from_millis(100)) {
            break;
        }
        // An error polling or reading the terminal means it is gone too.
        match crossterm::event::poll(Duration::ZERO) {
            Ok(false) => {}
            Err(_) => break,
            Ok(true) => match crossterm::event::read() {
                Ok(Event::Key(k)) => {
                    if let Some(key) = key_of(&k) {
                        if !st.key(key) {
                            break;
                        }
                        dirty = true;
                    }
                }
                Ok(Event::Resize(..)) => {
                    let _ = terminal.autoresize();
                    dirty = true;
                }
                Ok(_) => {}
                Err(_) => break,
            },
        }
    }
    drop(terminal);
    sampler.stop(Duration::from_secs(2));
    Ok(0)
}
