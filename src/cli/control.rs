//! Asking and steering the running daemon through its control socket
//! (`state_dir/control.sock`): `alerts`, `silence add|list|expire`, `reload`. Every failure is
//! one line and exit 2: a malformed matcher (with its column), an unknown silence id, no daemon
//! on the socket (naming the path tried), a socket the user may not open.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

use super::GlobalArgs;
use crate::config::Config;
use crate::values::escape_control;

/// Where the daemon is: the config it runs with.
#[derive(Debug, clap::Args)]
pub struct Where {
    /// The daemon's configuration file (its `state_dir` has the socket).
    #[arg(long, value_name = "FILE", env = "GPUWATCH_CONFIG")]
    pub config: Option<PathBuf>,
}

/// Arguments of `alerts`.
#[derive(Debug, clap::Args)]
pub struct AlertsArgs {
    #[command(flatten)]
    pub at: Where,
    /// One JSON document.
    #[arg(long)]
    pub json: bool,
}

/// `silence` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum SilenceCmd {
    /// Mute notifications (and hold kills) of alerts matching every MATCHER
    /// (`alertname=low_utilization`, `gpu=~"3|4"`, `severity!=critical`).
    Add {
        #[command(flatten)]
        at: Where,
        /// Label matchers, Alertmanager's syntax.
        #[arg(value_name = "MATCHER", required = true)]
        matchers: Vec<String>,
        /// How long (default 1h).
        #[arg(long = "for", value_name = "DURATION", value_parser = crate::values::parse_duration)]
        duration: Option<Duration>,
        /// Why (shown in `silence list`).
        #[arg(long, default_value = "")]
        comment: String,
        /// End the silence when this process exits.
        #[arg(long, value_name = "PID")]
        until_job: Option<u32>,
    },
    /// The silences, active and recently ended.
    List {
        #[command(flatten)]
        at: Where,
        /// One JSON document.
        #[arg(long)]
        json: bool,
    },
    /// End a silence now.
    Expire {
        #[command(flatten)]
        at: Where,
        /// The silence's id (from `silence add` or `silence list`).
        #[arg(value_name = "ID")]
        id: String,
    },
}

/// Arguments of `silence`.
#[derive(Debug, clap::Args)]
pub struct SilenceArgs {
    #[command(subcommand)]
    pub cmd: SilenceCmd,
}

/// Exit code of a control request that could not be done.
const FAILED: i32 = 2;

fn socket(at: &Where) -> anyhow::Result<PathBuf> {
    let config = match &at.config {
        Some(p) => crate::config::load(p)?,
        None => Config::builtin(),
    };
    Ok(config.state_dir().join("control.sock"))
}

/// Asks the daemon and shows the answer with `show` on standard output (buffered; a closed
/// pipe, as in `gpuwatch silence list | head`, ends the command quietly).
fn run_ask(
    at: &Where,
    request: &Value,
    show: impl FnOnce(&Value, &mut dyn std::io::Write) -> std::io::Result<()>,
) -> anyhow::Result<i32> {
    let path = socket(at)?;
    match crate::daemon::control::ask(&path, request) {
        Ok(v) => {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            show(&v, &mut out)?;
            std::io::Write::flush(&mut out)?;
            Ok(0)
        }
        Err(line) => {
            eprintln!("gpuwatch: {line}");
            Ok(FAILED)
        }
    }
}

/// Runs `alerts`.
pub fn alerts(_global: &GlobalArgs, args: &AlertsArgs) -> anyhow::Result<i32> {
    run_ask(&args.at, &json!({"ask": "alerts"}), |v, out| {
        if args.json {
            writeln!(out, "{}", v["alerts"])?;
            return Ok(());
        }
        let list = v["alerts"].as_array().cloned().unwrap_or_default();
        if list.is_empty() {
            writeln!(out, "no alerts pending or firing")?;
        }
        for a in list {
            let gpu = a["gpu"]
                .as_u64()
                .map_or_else(|| "host".into(), |g| format!("gpu {g}"));
            let silenced = a["silenced_by"]
                .as_str()
                .map_or_else(String::new, |id| format!("  [silenced by {id}]"));
            writeln!(
                out,
                "{:<8} {:<20} {gpu:<6} {:<8} since {}  {}{}",
                a["state"].as_str().unwrap_or(""),
                escape_control(a["alert"].as_str().unwrap_or("")),
                a["severity"].as_str().unwrap_or(""),
                a["since"].as_str().unwrap_or(""),
                escape_control(a["summary"].as_str().unwrap_or("")),
                escape_control(&silenced)
            )?;
        }
        Ok(())
    })
}

/// Runs `silence`.
pub fn silence(_global: &GlobalArgs, args: &SilenceArgs) -> anyhow::Result<i32> {
    match &args.cmd {
        SilenceCmd::Add {
            at,
            matchers,
            duration,
            comment,
            until_job,
        } => {
            // Checked here first, so the error names the argument and column.
            for (i, m) in matchers.iter().enumerate() {
                if let Err((col, e)) = crate::silence::Matcher::parse(m) {
                    eprintln!("gpuwatch: matcher {} column {col}: {e}", i + 1);
                    return Ok(FAILED);
                }
            }
            // The job is this pid as it runs now (its start time goes with the request).
            let until_start = match until_job {
                Some(pid) => match crate::sys::live_start_ticks(*pid) {
                    Some(start) => Some(start),
                    None => {
                        eprintln!("gpuwatch: --until-job {pid}: no such process");
                        return Ok(FAILED);
                    }
                },
                None => None,
            };
            let for_ms = duration.map_or(3_600_000, |d| {
                i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
            });
            if for_ms > crate::silence::MAX_SILENCE_MS {
                eprintln!("gpuwatch: --for: at most 366d (a silence longer than a year is a typo; expire and renew it instead)");
                return Ok(FAILED);
            }
            if for_ms < 1 {
                eprintln!("gpuwatch: --for: must be longer than 0");
                return Ok(FAILED);
            }
            let request = json!({
                "ask": "silence_add",
                "matchers": matchers,
                "for_ms": for_ms,
                "comment": comment,
                "created_by": crate::sys::user_name(caller_uid()).unwrap_or_default(),
                "until_pid": until_job,
                "until_start": until_start,
            });
            run_ask(at, &request, |v, out| {
                writeln!(out, "{}", v["id"].as_str().unwrap_or(""))
            })
        }
        SilenceCmd::List { at, json: as_json } => {
            run_ask(at, &json!({"ask": "silence_list"}), |v, out| {
                if *as_json {
                    writeln!(out, "{}", v["silences"])?;
                    return Ok(());
                }
                let now = v["now_ms"].as_i64().unwrap_or(0);
                let list = v["silences"].as_array().cloned().unwrap_or_default();
                if list.is_empty() {
                    writeln!(out, "no silences")?;
                }
                for s in list {
                    let ends = s["ends_ms"].as_i64().unwrap_or(0);
                    let state = if ends > now { "active" } else { "expired" };
                    let matchers: Vec<String> = serde_json::from_value::<
                        Vec<crate::silence::Matcher>,
                    >(s["matchers"].clone())
                    .unwrap_or_default()
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                    let job = s["until_pid"]
                        .as_u64()
                        .map_or_else(String::new, |p| format!(" until job {p} ends"));
                    // Comments and matcher values are anyone's text: no terminal escapes.
                    writeln!(
                        out,
                        "{} {state:<7} until {}{job}  {}  {}",
                        escape_control(s["id"].as_str().unwrap_or("")),
                        crate::trace::format_time_ms(ends),
                        escape_control(&matchers.join(",")),
                        escape_control(s["comment"].as_str().unwrap_or(""))
                    )?;
                }
                Ok(())
            })
        }
        SilenceCmd::Expire { at, id } => {
            run_ask(at, &json!({"ask": "silence_expire", "id": id}), |_, out| {
                writeln!(out, "silence {id} expired")
            })
        }
    }
}

/// Runs `reload`: the daemon re-reads its configuration and rules (as SIGHUP does).
pub fn reload(_global: &GlobalArgs, args: &Where) -> anyhow::Result<i32> {
    run_ask(args, &json!({"ask": "reload"}), |_, out| {
        writeln!(
            out,
            "reloaded (a broken edit keeps the running configuration; see the daemon's log)"
        )
    })
}

/// The caller's uid, from `/proc/self/status` (no `unsafe` needed).
fn caller_uid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().next())
                .and_then(|u| u.parse().ok())
        })
        .unwrap_or(u32::MAX)
}
