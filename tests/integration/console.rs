//! Issue 15 §2: the first run shows value in seconds. The README's main command (`--sim
//! overnight --speed 60 daemon`, read from the README itself) announces at least four different
//! stock alerts within two minutes, one human line each; what it says at start names where
//! messages go; `--log-format json` keeps structured records; a pipe gets text records; no line
//! shows Rust debug formatting.

use std::io::BufRead as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The gpuwatch arguments of the README's first command (`cargo run --release -- ARGS`).
fn readme_main_command() -> Vec<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README");
    let line = readme
        .lines()
        .find(|l| l.trim_start().starts_with("cargo run"))
        .expect("the README's main command");
    let args = line.split('#').next().unwrap_or("");
    let args = args.split_once(" -- ").expect("cargo run -- ARGS").1;
    args.split_whitespace().map(str::to_string).collect()
}

/// Runs gpuwatch with `args` until `enough` says so about the stderr lines seen (or `limit`);
/// returns the lines.
fn lines_until(
    args: &[String],
    limit: Duration,
    enough: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    super::common::sim_lib();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = super::common::command(&args, &[])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gpuwatch");
    let err = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let start = Instant::now();
    let mut lines = Vec::new();
    while start.elapsed() < limit && !enough(&lines) {
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
            lines.push(l);
        }
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    while let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
        lines.push(l);
    }
    lines
}

fn firing_names(lines: &[String]) -> std::collections::BTreeSet<String> {
    lines
        .iter()
        .filter_map(|l| {
            let rest = l.split_once("  FIRING  ")?.1;
            // severity, place, name — summary
            let before = rest.split(" — ").next()?;
            before.split_whitespace().last().map(str::to_string)
        })
        .collect()
}

#[test]
fn the_readme_main_command_shows_four_alerts_within_two_minutes() {
    let mut args = readme_main_command();
    assert!(
        args.windows(2)
            .any(|w| w[0] == "--sim" && w[1] == "overnight"),
        "{args:?}"
    );
    // On a terminal the console is human; here stderr is a pipe, so ask for it.
    args.insert(0, "--log-format=human".to_string());
    let started = Instant::now();
    let lines = lines_until(&args, Duration::from_secs(120), |l| {
        firing_names(l).len() >= 4
    });
    let took = started.elapsed();
    let names = firing_names(&lines);
    assert!(
        names.len() >= 4,
        "{} alerts in {took:?}: {names:?}\n{}",
        names.len(),
        lines.join("\n")
    );
    let text = lines.join("\n");
    assert!(
        text.contains("alerts go to this terminal only: no notification channels are configured"),
        "{text}"
    );
    assert!(text.contains("played 60× faster"), "{text}");
    for l in &lines {
        assert!(
            !l.contains("Some(") && !l.contains("None") && !l.contains("Firing"),
            "debug formatting: {l}"
        );
    }
}

#[test]
fn json_and_text_records_off_a_terminal() {
    let json = lines_until(
        &[
            "--sim".into(),
            "overnight".into(),
            "--speed".into(),
            "60".into(),
            "--log-format".into(),
            "json".into(),
            "daemon".into(),
        ],
        Duration::from_secs(60),
        |l| l.iter().any(|x| x.contains("\"alert\"")),
    );
    let mut alert = None;
    for l in &json {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v["timestamp"].is_string() && v["level"].is_string(), "{l}");
        if v["alert"].is_string() {
            alert = Some(v);
        }
    }
    let alert = alert.expect("an alert record");
    assert_eq!(alert["status"], "firing", "{alert}");
    assert!(
        alert["severity"].is_string() && alert["gpu"].is_string(),
        "{alert}"
    );

    // A pipe without --log-format: text records, not human lines.
    let text = lines_until(
        &[
            "--sim".into(),
            "overnight".into(),
            "--speed".into(),
            "60".into(),
            "daemon".into(),
        ],
        Duration::from_secs(60),
        |l| l.iter().any(|x| x.contains("alert=")),
    );
    let rec = text
        .iter()
        .find(|l| l.contains("alert="))
        .expect("an alert record");
    assert!(
        rec.contains(" INFO ") && rec.contains("status=firing"),
        "{rec}"
    );
    assert!(!text.iter().any(|l| l.contains("  FIRING  ")));
}

#[test]
fn speed_needs_a_simulation() {
    let r = super::common::gpuwatch(&["--speed", "60", "daemon"], &[]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("--sim"), "{}", r.stderr);
}

/// `--speed 3600`: the daemon's start-up (tens of milliseconds, hours of simulated time) is no
/// stuck collector — `collector_stale` keeps a floor of 5 s of wall time.
#[test]
fn a_fast_clock_does_not_call_the_start_up_a_stale_collector() {
    let lines = lines_until(
        &[
            "--sim".into(),
            "healthy".into(),
            "--speed".into(),
            "3600".into(),
            "daemon".into(),
        ],
        Duration::from_secs(4),
        |_| false,
    );
    assert!(!lines.is_empty(), "the daemon said nothing");
    assert!(
        !lines.iter().any(|l| l.contains("collector_stale")),
        "{}",
        lines.join("\n")
    );
}
