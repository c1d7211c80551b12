//! Issue 14 §3 (part): asking and steering the running daemon through its control socket.
//! A silence added with the CLI suppresses a firing alert's notifications until it expires and
//! survives a daemon restart; `alerts` lists what fires (and what is silenced); bad input is one
//! line and exit 2 (a malformed matcher with its column, an unknown id, no daemon); the socket is
//! the owner's only; `--until-job` ends with the job.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::Duration;

use super::common::gpuwatch;
use super::daemon::{daemon, webhook_config};
use super::notify::servers::{wait_until, HttpReceiver};

fn ctl(cfg: &Path, args: &[&str]) -> super::common::Run {
    let mut all = args.to_vec();
    all.extend_from_slice(&["--config", cfg.to_str().expect("utf-8")]);
    gpuwatch(&all, &[])
}

/// A `healthy` daemon with a webhook channel, its control socket up.
struct Served {
    _tmp: tempfile::TempDir,
    _hook: HttpReceiver,
    cfg: std::path::PathBuf,
    sock: std::path::PathBuf,
    daemon: super::notify::servers::Daemon,
}

impl Served {
    fn start() -> Served {
        let tmp = tempfile::tempdir().expect("tempdir");
        let hook = HttpReceiver::start();
        let cfg = webhook_config(tmp.path(), &hook.url("/hook"));
        let sock = tmp.path().join("state/control.sock");
        let daemon = daemon("healthy", &cfg, &tmp.path().join("log"), &[]);
        wait_until(Duration::from_secs(20), "the control socket", || {
            sock.exists().then_some(())
        });
        Served {
            _tmp: tmp,
            _hook: hook,
            cfg,
            sock,
            daemon,
        }
    }
}

/// Alert names the webhook receiver got, firing only.
fn fired(hook: &HttpReceiver) -> Vec<String> {
    hook.requests()
        .iter()
        .flat_map(|r| {
            let b = r.json();
            b["alerts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|a| a["status"] == "firing")
                .map(|a| a["labels"]["alertname"].as_str().unwrap_or("").to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn silences_from_the_cli_mute_notifications_and_persist() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let hook = HttpReceiver::start();
    let cfg = webhook_config(tmp.path(), &hook.url("/hook"));
    // The state directory is relative to the config file.
    let sock = tmp.path().join("state/control.sock");

    // Bad input before any daemon: one line, exit 2.
    let r = ctl(&cfg, &["alerts"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("no gpuwatch daemon answers on") && r.stderr.contains("control.sock"),
        "{}",
        r.stderr
    );
    let r = ctl(&cfg, &["silence", "add", "gpu~3"]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("matcher 1 column 4"), "{}", r.stderr);

    // gpu_lost of the xid-79 scenario (GPU 3, at 30 s) is silenced before it fires.
    let log = tmp.path().join("log");
    let mut d = daemon("xid-79", &cfg, &log, &[("NVML_SIM_TIME_SCALE", "10")]);
    wait_until(Duration::from_secs(20), "the control socket", || {
        sock.exists().then_some(())
    });
    let mode = std::fs::metadata(&sock)
        .expect("socket")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "owner-only socket");
    let r = ctl(
        &cfg,
        &[
            "silence",
            "add",
            "alertname=gpu_lost",
            "gpu=~\"3|4\"",
            "--for",
            "2h",
            "--comment",
            "reseating GPU 3",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let id = r.stdout.trim().to_string();
    assert_eq!(id.len(), 16, "{}", r.stdout);
    // xid_error fires and is notified; gpu_lost fires and is not.
    wait_until(Duration::from_secs(30), "xid_error notified", || {
        fired(&hook)
            .contains(&"xid_error".to_string())
            .then_some(())
    });
    let listed = wait_until(
        Duration::from_secs(20),
        "gpu_lost firing and silenced",
        || {
            let r = ctl(&cfg, &["alerts", "--json"]);
            let v: serde_json::Value = serde_json::from_str(&r.stdout).ok()?;
            v.as_array()?
                .iter()
                .find(|a| a["alert"] == "gpu_lost" && a["state"] == "firing")
                .cloned()
        },
    );
    assert_eq!(listed["silenced_by"], id.as_str(), "{listed}");
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !fired(&hook).contains(&"gpu_lost".to_string()),
        "silenced: {:?}",
        fired(&hook)
    );
    let text = ctl(&cfg, &["alerts"]);
    assert!(
        text.stdout.contains("gpu_lost") && text.stdout.contains("silenced by"),
        "{}",
        text.stdout
    );
    assert!(std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("silenced: not notified"));

    // The silence survives a restart.
    d.signal(libc::SIGTERM);
    assert!(d.wait(Duration::from_secs(15)).success());
    let d2 = daemon("xid-79", &cfg, &log, &[("NVML_SIM_TIME_SCALE", "10")]);
    wait_until(
        Duration::from_secs(20),
        "the silence after a restart",
        || {
            let r = ctl(&cfg, &["silence", "list"]);
            (r.code == 0 && r.stdout.contains(&id) && r.stdout.contains("active")).then_some(())
        },
    );
    // Expiring it lets the next notification through; an unknown id is refused.
    let r = ctl(&cfg, &["silence", "expire", "0000000000000000"]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("no active silence"), "{}", r.stderr);
    let r = ctl(&cfg, &["silence", "expire", &id]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(ctl(&cfg, &["silence", "list"]).stdout.contains("expired"));
    // `reload` answers; a reload of a broken configuration fails (and the daemon keeps its own).
    let r = ctl(&cfg, &["reload"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let good = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, format!("{good}\n[nonsense_section]\nx = 1\n")).unwrap();
    let broken =
        gpuwatch::daemon::control::ask(&sock, &serde_json::json!({"ask": "reload"})).unwrap_err();
    assert!(broken.contains("reload failed"), "{broken}");
    std::fs::write(&cfg, good).unwrap();
    drop(d2);
}

#[test]
fn a_job_silence_ends_with_the_job() {
    let served = Served::start();
    let cfg = served.cfg.clone();
    let mut job = std::process::Command::new("sleep")
        .arg("2")
        .spawn()
        .expect("sleep");
    let pid = job.id().to_string();
    let r = ctl(&cfg, &["silence", "add", "gpu=0", "--until-job", &pid]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let listed = ctl(&cfg, &["silence", "list"]);
    assert!(
        listed.stdout.contains(&format!("until job {pid} ends"))
            && listed.stdout.contains("active"),
        "{}",
        listed.stdout
    );
    let _ = job.wait();
    wait_until(
        Duration::from_secs(10),
        "the silence to end with the job",
        || {
            ctl(&cfg, &["silence", "list"])
                .stdout
                .contains("expired")
                .then_some(())
        },
    );
    let r = ctl(&cfg, &["silence", "add", "gpu=0", "--until-job", "4000000"]);
    assert_eq!(r.code, 2, "{}", r.stdout);
}

/// Issue 25 §3: a silence's comment is anyone's text: `silence list` shows its control
/// characters (an OSC 52 clipboard write, a screen clear, C1) escaped, never raw.
#[test]
fn silence_list_escapes_control_characters_in_comments() {
    let served = Served::start();
    let cfg = served.cfg.clone();
    let comment = "maintenance\u{1b}]52;c;cm0gLXJmIH4=\u{7}\u{1b}[2J\u{9b}31m\u{7f}done";
    let r = ctl(&cfg, &["silence", "add", "gpu=0", "--comment", comment]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let listed = ctl(&cfg, &["silence", "list"]);
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    assert!(
        !listed.stdout.chars().any(|c| c.is_control() && c != '\n'),
        "raw control characters: {:?}",
        listed.stdout
    );
    assert!(
        listed
            .stdout
            .contains("maintenance\\u{1b}]52;c;cm0gLXJmIH4=\\u{7}\\u{1b}[2J\\u{9b}31m\\u{7f}done"),
        "{}",
        listed.stdout
    );
    // `--json` is for programs: the comment as it was given, JSON-escaped.
    let json = ctl(&cfg, &["silence", "list", "--json"]);
    let v: serde_json::Value = serde_json::from_str(json.stdout.trim()).expect("JSON");
    assert_eq!(v[0]["comment"], comment, "{}", json.stdout);
}

/// `gpuwatch alerts` run as another user (uid/gid `ids`), from a copy of the binary that user
/// may execute.
fn as_user(tmp: &Path, cfg: &Path, ids: (u32, u32)) -> super::common::Run {
    use std::os::unix::process::CommandExt as _;
    let bin = tmp.join("bin/gpuwatch");
    if !bin.exists() {
        std::fs::create_dir_all(tmp.join("bin")).expect("bin");
        std::fs::copy(super::common::gpuwatch_exe(), &bin).expect("copy gpuwatch");
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let out = std::process::Command::new(&bin)
        .args(["alerts", "--config", cfg.to_str().expect("utf-8")])
        .env("HOME", tmp)
        .uid(ids.0)
        .gid(ids.1)
        .output()
        .expect("running gpuwatch as another user");
    super::common::Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The socket is the daemon's user's only: another user is refused with one line and exit 2;
/// with `[daemon] control_group`, that group's members get in (and the state directory only
/// lets them through). Needs root to act as other users; skipped elsewhere outside CI.
#[test]
fn another_user_is_refused_unless_in_the_control_group() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs the tests as root so that this one can act as another user"
        );
        eprintln!("skipped: not root");
        return;
    }
    const NOBODY: (u32, u32) = (65534, 65534);
    let tmp = tempfile::tempdir().expect("tempdir");
    // The config is readable by everyone; the state directory is not.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let hook = HttpReceiver::start();
    let cfg = webhook_config(tmp.path(), &hook.url("/hook"));
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let sock = tmp.path().join("state/control.sock");
    let mut d = daemon("healthy", &cfg, &tmp.path().join("log"), &[]);
    wait_until(Duration::from_secs(20), "the control socket", || {
        sock.exists().then_some(())
    });
    assert_eq!(ctl(&cfg, &["alerts"]).code, 0, "the owner gets in");
    let r = as_user(tmp.path(), &cfg, NOBODY);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("permission denied") && r.stderr.contains("control.sock"),
        "{}",
        r.stderr
    );
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    d.signal(libc::SIGTERM);
    assert!(d.wait(Duration::from_secs(15)).success());

    // With nobody's group as the control group, nobody gets in; the state directory lets the
    // group pass but not list it.
    let text = std::fs::read_to_string(&cfg).expect("config");
    std::fs::write(
        &cfg,
        text.replace("[daemon]\n", "[daemon]\ncontrol_group = \"nogroup\"\n"),
    )
    .expect("config");
    let _d = daemon("healthy", &cfg, &tmp.path().join("log2"), &[]);
    wait_until(Duration::from_secs(20), "the control socket", || {
        let m = std::fs::metadata(&sock).ok()?.permissions().mode() & 0o777;
        (m == 0o660).then_some(())
    });
    let state_mode = std::fs::metadata(tmp.path().join("state"))
        .expect("state")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(state_mode, 0o710);
    let r = as_user(tmp.path(), &cfg, NOBODY);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("no alerts pending or firing"), "{r:?}");
}

/// Sends one raw line to the control socket and returns the answer.
fn raw(sock: &Path, line: &[u8]) -> String {
    use std::io::{BufRead as _, Write as _};
    let mut s = std::os::unix::net::UnixStream::connect(sock).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    s.write_all(line).expect("write");
    s.write_all(b"\n").expect("write");
    let mut answer = String::new();
    std::io::BufReader::new(s)
        .read_line(&mut answer)
        .expect("an answer");
    answer
}

/// Control-socket input is checked field by field: an out-of-range duration or pid is an error
/// naming the field (not an hour's silence, not a silence without its job, not a regex that
/// compiles to megabytes), invalid UTF-8 gets an answer, and the CLI refuses `--for 10000000d`.
#[test]
fn control_requests_out_of_bounds_are_refused_naming_the_field() {
    let served = Served::start();
    let cfg = served.cfg.clone();
    let sock = served.sock.clone();
    for (request, field) in [
        (
            r#"{"ask":"silence_add","matchers":["gpu=0"],"for_ms":18446744073709551615}"#,
            "for_ms",
        ),
        (
            r#"{"ask":"silence_add","matchers":["gpu=0"],"for_ms":1e300}"#,
            "for_ms",
        ),
        (
            r#"{"ask":"silence_add","matchers":["gpu=0"],"for_ms":0}"#,
            "for_ms",
        ),
        (
            r#"{"ask":"silence_add","matchers":["gpu=0"],"until_pid":-1}"#,
            "until_pid",
        ),
        (
            r#"{"ask":"silence_add","matchers":["gpu=0"],"until_pid":"1"}"#,
            "until_pid",
        ),
        (r#"{"ask":"silence_add","matchers":[7]}"#, "matchers[0]"),
        (
            r#"{"ask":"silence_add","matchers":["gpu=0","job=~\\w{50}"]}"#,
            "matchers[1] column 6: `job=~\\w{50}`: the regex is too large compiled (over 64 KiB)",
        ),
        (
            r#"{"ask":"silence_add","matchers":["gpu=0"],"comment":5}"#,
            "comment",
        ),
    ] {
        let answer = raw(&sock, request.as_bytes());
        let v: serde_json::Value = serde_json::from_str(&answer).expect("JSON answer");
        assert_eq!(v["ok"], false, "{request}: {answer}");
        assert!(
            v["error"].as_str().unwrap_or("").starts_with(field),
            "{request}: {answer}"
        );
    }
    let answer = raw(&sock, b"{\"ask\":\"silence_list\xff\"}");
    assert!(answer.contains("not UTF-8"), "{answer}");
    let listed = ctl(&cfg, &["silence", "list"]);
    assert!(
        !listed.stdout.contains("gpu=0"),
        "nothing was added: {}",
        listed.stdout
    );
    let r = ctl(&cfg, &["silence", "add", "gpu=0", "--for", "10000000d"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("--for"), "{}", r.stderr);
}

/// A silence bound to a job ends when the job ends even when its pid is reused at once: the
/// job is its (pid, start time). The pid is handed to a new process by writing
/// `/proc/sys/kernel/ns_last_pid` (root), retried until the kernel gives it.
#[test]
fn a_job_silence_ends_with_the_job_even_when_its_pid_is_reused() {
    let last_pid = Path::new("/proc/sys/kernel/ns_last_pid");
    if std::fs::OpenOptions::new()
        .write(true)
        .open(last_pid)
        .is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs as root and must be able to force a pid's reuse"
        );
        return;
    }
    let served = Served::start();
    let cfg = served.cfg.clone();
    let mut job = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .expect("sleep");
    let pid = job.id();
    let r = ctl(
        &cfg,
        &["silence", "add", "gpu=0", "--until-job", &pid.to_string()],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let _ = job.kill();
    let _ = job.wait();
    // (a start time counts clock ticks of 10 ms: a process started within the same tick as the
    // job, pid and all, is the job as far as anyone can tell — the heir starts two ticks later)
    std::thread::sleep(Duration::from_millis(30));
    // The same pid for a new process.
    let mut heir = None;
    for _ in 0..200 {
        let _ = std::fs::write(last_pid, (pid - 1).to_string());
        let child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("sleep");
        if child.id() == pid {
            heir = Some(child);
            break;
        }
        let mut child = child;
        let _ = child.kill();
        let _ = child.wait();
    }
    let mut heir = heir.expect("the kernel gave the pid to a new process");
    wait_until(
        Duration::from_secs(10),
        "the silence to end with the job despite the reused pid",
        || {
            ctl(&cfg, &["silence", "list"])
                .stdout
                .contains("expired")
                .then_some(())
        },
    );
    let _ = heir.kill();
    let _ = heir.wait();
}

/// Threads of process `pid`.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

/// 200 clients that connect and trickle bytes hold at most 16 threads of the daemon, each for at
/// most 10 s; afterwards a request is answered.
#[test]
fn trickling_clients_cannot_pile_up_threads() {
    use std::io::Write as _;
    let served = Served::start();
    let cfg = served.cfg.clone();
    let sock = served.sock.clone();
    let d = &served.daemon;
    let before = threads(d.pid());
    let mut clients: Vec<std::os::unix::net::UnixStream> = (0..200)
        .filter_map(|_| std::os::unix::net::UnixStream::connect(&sock).ok())
        .collect();
    let start = std::time::Instant::now();
    let mut most = 0;
    while start.elapsed() < Duration::from_secs(3) {
        for c in &mut clients {
            let _ = c.write_all(b" ");
        }
        most = most.max(threads(d.pid()));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        most <= before + 16 + 2,
        "{most} threads with 200 trickling clients ({before} before)"
    );
    drop(clients);
    wait_until(Duration::from_secs(15), "an answer after the flood", || {
        (ctl(&cfg, &["alerts"]).code == 0).then_some(())
    });
}

/// Resident memory of `pid` (`VmRSS` or `VmHWM`, the peak) in KiB.
fn vm_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Seconds since the epoch, now.
fn wall_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64()
}

/// The `gpu_lost` notification of GPU `gpu` the receiver got, if any: (wall time of its
/// tripping sample, wall time it arrived), seconds.
fn gpu_lost_delivery(hook: &HttpReceiver, gpu: &str) -> Option<(f64, f64)> {
    hook.accepted().into_iter().find_map(|r| {
        let body = r.json();
        let a = body["alerts"].as_array()?.iter().find(|a| {
            a["labels"]["alertname"] == "gpu_lost"
                && a["labels"]["gpu"] == gpu
                && a["status"] == "firing"
        })?;
        let starts = chrono::DateTime::parse_from_rfc3339(a["startsAt"].as_str()?).ok()?;
        let arrived = wall_s() - r.at.elapsed().as_secs_f64();
        Some((starts.timestamp_millis() as f64 / 1000.0, arrived))
    })
}

/// Issue 25 item 5: 10,000 `silence add` requests from four concurrent clients (about 1,000 a
/// second) made the daemon grow to 605 MiB and delayed a critical alert by seconds (every add
/// rewrote all of silences.json; every change queued a full copy of the list to the
/// dispatcher). Now the daemon stays under 64 MiB (VmHWM), a `gpu_lost` that fires in the middle
/// of the burst is delivered within its latency without a burst (GPU 0, lost earlier in the same
/// run) + 100 ms, and every acknowledged silence is listed after a `kill -9` right after the last
/// answer and a restart; listing all of them from the restarted daemon keeps it under 64 MiB too
/// (73 MiB when the answer was built as a JSON value tree and then a string).
#[test]
fn a_burst_of_silence_adds_stays_small_and_keeps_alerts_on_time() {
    const ADDS: usize = 10_000;
    const CLIENTS: usize = 4;
    const PER_SECOND: f64 = 1000.0;
    const BURST_DEADLINE: Duration = Duration::from_secs(45);
    const RSS_LIMIT_KIB: u64 = 64 * 1024;
    let tmp = tempfile::tempdir().expect("tempdir");
    let hook = HttpReceiver::start();
    let cfg = tmp.path().join("config.toml");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::write(
        &cfg,
        format!(
            "[daemon]\ninterval = \"1s\"\nstate_dir = \"state\"\nrules = [{rules:?}]\nhostname = \"simhost\"\n\n\
             [[channel]]\nname = \"ops\"\ntype = \"webhook\"\nurl = \"{url}\"\n\n\
             [[route]]\nchannels = [\"ops\"]\ngroup_wait = \"0s\"\ngroup_by = [\"alertname\", \"gpu\"]\n",
            rules = root.join("rules/gpu_lost.rhai").display().to_string(),
            url = hook.url("/hook"),
        ),
    )
    .expect("config");
    let scenario = root
        .join("tests/fixtures/sim/two-gpus-lost.toml")
        .display()
        .to_string();
    let sock = tmp.path().join("state/control.sock");
    let d = daemon(&scenario, &cfg, &tmp.path().join("log"), &[]);
    let pid = d.pid();
    wait_until(Duration::from_secs(20), "the control socket", || {
        sock.exists().then_some(())
    });

    // GPU 0 is lost at 4 s, before the burst: the latency to beat.
    let (starts0, arrived0) = wait_until(Duration::from_secs(30), "gpu_lost of GPU 0", || {
        gpu_lost_delivery(&hook, "0")
    });
    let baseline_ms = (arrived0 - starts0) * 1000.0;

    // The burst, paced to at most PER_SECOND adds so that it lasts 10 s or more whatever the
    // machine: GPU 1 is lost at 10 s, in its middle.
    let peak_rss = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let monitor = {
        let (peak_rss, done) = (peak_rss.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                peak_rss.fetch_max(vm_kib(pid, "VmRSS"), std::sync::atomic::Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let start = std::time::Instant::now();
    let burst_from = wall_s();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let sock = sock.clone();
            std::thread::spawn(move || {
                let mut ids = Vec::new();
                let mut errors = Vec::new();
                for i in (c..ADDS).step_by(CLIENTS) {
                    let due = Duration::from_secs_f64(i as f64 / PER_SECOND);
                    if let Some(wait) = due.checked_sub(start.elapsed()) {
                        std::thread::sleep(wait);
                    }
                    if start.elapsed() > BURST_DEADLINE {
                        errors.push(format!("add {i}: not sent within {BURST_DEADLINE:?}"));
                        break;
                    }
                    // Matchers that never match gpu_lost.
                    let ask = serde_json::json!({
                        "ask": "silence_add",
                        "matchers": ["alertname=low_utilization", format!("job=\"burst-{i}\"")],
                        "for_ms": 7_200_000,
                        "comment": format!("burst {i}"),
                    });
                    match gpuwatch::daemon::control::ask(&sock, &ask) {
                        Ok(v) => ids.push(v["id"].as_str().unwrap_or("").to_string()),
                        Err(e) => errors.push(format!("add {i}: {e}")),
                    }
                }
                (ids, errors)
            })
        })
        .collect();
    let mut acknowledged = std::collections::BTreeSet::new();
    let mut errors = Vec::new();
    for c in clients {
        let (ids, errs) = c.join().expect("client");
        acknowledged.extend(ids);
        errors.extend(errs);
    }
    let burst_to = wall_s();
    let took = start.elapsed();
    let hwm = vm_kib(pid, "VmHWM");
    // No more than a kill -9 right after the last answer.
    d.kill9();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    monitor.join().expect("monitor");
    let rss = peak_rss.load(std::sync::atomic::Ordering::SeqCst);
    let lost1 = gpu_lost_delivery(&hook, "1");
    eprintln!(
        "{} adds answered in {took:?}; daemon VmHWM {hwm} KiB, VmRSS at most {rss} KiB; gpu_lost latency without a burst {baseline_ms:.0} ms, during it {:?} ms",
        acknowledged.len(),
        lost1.map(|(s, a)| ((a - s) * 1000.0).round())
    );
    assert!(
        errors.is_empty(),
        "{} of {ADDS} adds failed, first: {:?}",
        errors.len(),
        errors.first()
    );
    assert_eq!(acknowledged.len(), ADDS, "distinct ids");
    assert!(
        hwm < RSS_LIMIT_KIB && rss < RSS_LIMIT_KIB,
        "the daemon grew to {hwm} KiB (VmHWM) during a burst of {ADDS} silence adds"
    );
    let (starts1, arrived1) = lost1.unwrap_or_else(|| {
        panic!(
            "gpu_lost of GPU 1 (lost at 10 s, during the burst) not delivered before its end; took {took:?}"
        )
    });
    assert!(
        (burst_from..burst_to).contains(&starts1),
        "GPU 1 was not lost during the burst ({burst_from:.3}..{burst_to:.3}, lost at {starts1:.3})"
    );
    let during_ms = (arrived1 - starts1) * 1000.0;
    assert!(
        during_ms <= baseline_ms + 100.0,
        "gpu_lost during the burst took {during_ms:.0} ms, {baseline_ms:.0} ms without"
    );

    // Every acknowledged silence survived the kill -9.
    let d2 = daemon(&scenario, &cfg, &tmp.path().join("log2"), &[]);
    let listed = wait_until(
        Duration::from_secs(20),
        "the silences after a restart",
        || gpuwatch::daemon::control::ask(&sock, &serde_json::json!({"ask": "silence_list"})).ok(),
    );
    let ids: std::collections::BTreeSet<String> = listed["silences"]
        .as_array()
        .expect("silences")
        .iter()
        .filter_map(|s| s["id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(ids.len(), ADDS, "silences listed after kill -9 and restart");
    assert!(
        ids == acknowledged,
        "the listed ids are the acknowledged ones"
    );

    let hwm_one = vm_kib(d2.pid(), "VmHWM");
    // Listing all of them is cheap: the answer is serialized straight into the bytes written
    // (2.7 MB). Listed three times more at once, the daemon still stays under the limit.
    let lists: Vec<_> = (0..3)
        .map(|_| {
            let sock = sock.clone();
            std::thread::spawn(move || {
                gpuwatch::daemon::control::ask(&sock, &serde_json::json!({"ask": "silence_list"}))
                    .map(|v| v["silences"].as_array().map_or(0, Vec::len))
            })
        })
        .collect();
    for l in lists {
        assert_eq!(l.join().expect("lister"), Ok(ADDS), "a full list");
    }
    let (hwm2, rss2) = (vm_kib(d2.pid(), "VmHWM"), vm_kib(d2.pid(), "VmRSS"));
    eprintln!("restarted daemon listing {ADDS} silences: VmHWM {hwm_one} KiB after one list, {hwm2} KiB after 3 more at once, VmRSS {rss2} KiB");
    assert!(
        hwm2 < RSS_LIMIT_KIB,
        "the restarted daemon grew to {hwm2} KiB (VmHWM) listing {ADDS} silences ({hwm_one} KiB after one list)"
    );
}

/// Writes `n` silences with 1 KiB comments to `state/silences.json` (a list of 24 MB of JSON),
/// as a daemon that took `n` adds would have left it.
fn many_long_silences(state: &Path, n: usize) {
    std::fs::create_dir_all(state).expect("state dir");
    std::fs::set_permissions(state, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let now = (wall_s() * 1000.0) as i64;
    let silences: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            serde_json::json!({
                "id": format!("{i:016x}"),
                "matchers": [{"name": "gpu", "op": "Eq", "value": i.to_string()}],
                "starts_ms": now,
                "ends_ms": now + 86_400_000,
                "comment": "x".repeat(1024),
                "created_by": "root",
            })
        })
        .collect();
    let json = serde_json::to_vec(&serde_json::json!({ "silences": silences })).expect("json");
    std::fs::write(state.join("silences.json"), json).expect("silences.json");
}

/// Issue 25, fourth round: `silence list` of 20,000 silences with 1 KiB comments is 24 MB of
/// JSON. It was serialized on the daemon's loop (a second each in a debug build: 8 lists at
/// once kept an `alerts` asked after them waiting ~8 s, and the rules waiting as long) into a
/// 24 MB buffer per client (16 slow readers: +350 MB), and a client reading it a little at a time
/// kept its place as long as it kept reading (16 of them: every other request "busy" for
/// minutes). Now each client's thread serializes a snapshot into the socket and the answer must
/// be read within `ANSWER_DEADLINE` (10 s).
#[test]
fn a_big_silence_list_neither_stalls_the_loop_nor_holds_the_socket() {
    use std::io::{Read as _, Write as _};
    const N: usize = 20_000;
    let tmp = tempfile::tempdir().expect("tempdir");
    let hook = HttpReceiver::start();
    let cfg = webhook_config(tmp.path(), &hook.url("/hook"));
    let state = tmp.path().join("state");
    many_long_silences(&state, N);
    let sock = state.join("control.sock");
    let d = daemon("healthy", &cfg, &tmp.path().join("log"), &[]);
    let alerts = || gpuwatch::daemon::control::ask(&sock, &serde_json::json!({"ask": "alerts"}));
    wait_until(Duration::from_secs(30), "the control socket", || {
        alerts().ok()
    });
    let ask_list = |sock: &Path| {
        let mut s = std::os::unix::net::UnixStream::connect(sock).expect("connect");
        s.write_all(b"{\"ask\":\"silence_list\"}\n").expect("ask");
        s
    };

    // 8 lists at once, then `alerts`: answered at once (it waited for the 8 serializations).
    let listers: Vec<_> = (0..8)
        .map(|_| {
            let mut s = ask_list(&sock);
            std::thread::spawn(move || {
                let mut all = Vec::new();
                s.set_read_timeout(Some(Duration::from_secs(60)))
                    .expect("timeout");
                let _ = s.read_to_end(&mut all);
                all
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let t = std::time::Instant::now();
    let answered = alerts();
    let took = t.elapsed();
    let lists: Vec<Vec<u8>> = listers
        .into_iter()
        .map(|l| l.join().expect("lister"))
        .collect();
    assert!(answered.is_ok(), "{answered:?}");
    assert!(
        took < Duration::from_millis(1500),
        "`alerts` waited {took:?} behind 8 silence lists"
    );
    for l in &lists {
        let v: serde_json::Value = serde_json::from_slice(l).expect("a whole JSON answer");
        assert_eq!(v["ok"], true);
        assert_eq!(v["silences"].as_array().map_or(0, Vec::len), N);
    }

    // 16 clients that read the list 256 KiB a second (it would take them ~90 s): their places
    // come back within the answer deadline, and the daemon does not hold 16 copies of 24 MB.
    let rss_before = vm_kib(d.pid(), "VmRSS");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let slow: Vec<_> = (0..16)
        .map(|_| {
            let mut s = ask_list(&sock);
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 256 * 1024];
                let mut got = 0usize;
                s.set_read_timeout(Some(Duration::from_secs(1)))
                    .expect("timeout");
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    match s.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => got += n,
                        Err(_) => {}
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
                got
            })
        })
        .collect();
    let started = std::time::Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    let rss_held = vm_kib(d.pid(), "VmRSS");
    let busy = alerts();
    wait_until(
        Duration::from_secs(20),
        "a request answered while 16 slow readers had asked for the list",
        || alerts().ok(),
    );
    let freed = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let got: Vec<usize> = slow
        .into_iter()
        .map(|t| t.join().expect("reader"))
        .collect();
    eprintln!(
        "alerts after 8 lists: {took:?}; 16 slow readers: busy at 3 s: {}, answered after {freed:?}; VmRSS {rss_before} → {rss_held} KiB; read {got:?}",
        busy.is_err()
    );
    assert!(
        busy.as_ref().is_err_and(|e| e.starts_with("busy")),
        "16 readers in flight hold every place: {busy:?}"
    );
    assert!(
        freed < Duration::from_secs(16),
        "the slow readers held the socket for {freed:?}"
    );
    assert!(
        got.iter().all(|g| *g < lists[0].len()),
        "a slow reader was cut off before the end: {got:?}"
    );
    assert!(
        rss_held < rss_before + 100 * 1024,
        "16 slow readers took the daemon from {rss_before} to {rss_held} KiB"
    );
}

/// `gpuwatch silence list | head -1`: the closed pipe ends the listing quietly (it panicked
/// with "failed printing to stdout: Broken pipe").
#[test]
fn a_listing_into_a_closed_pipe_ends_quietly() {
    let served = Served::start();
    let cfg = served.cfg.clone();
    // More than a pipe holds (64 KiB), so the writer meets the closed pipe.
    let comment = "c".repeat(1000);
    for n in 0..100 {
        let request = serde_json::json!({
            "ask": "silence_add", "matchers": [format!("job=run-{n}")],
            "for_ms": 3_600_000, "comment": comment,
        });
        let answer = raw(&served.sock, request.to_string().as_bytes());
        assert!(answer.contains("\"ok\":true"), "{answer}");
    }
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{} silence list --config {} | head -1",
            super::common::gpuwatch_exe().display(),
            cfg.display()
        ))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
}
