//! Issue 15 §1: `gpuwatch top` driven in a real terminal (tmux: `send-keys`, `capture-pane`).
//! The table of 8 GPUs, a firing alert, the job `gpuwatch run` watches, key presses (sort,
//! chart, quit), a daemon's alerts and the daemon vanishing, a terminal too small, a plain
//! ASCII terminal without colour, and the terminal given back on `q` and on SIGTERM.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::common;

/// One tmux server of its own per test (`-L`), killed when dropped.
pub(crate) struct Tmux {
    socket: String,
}

impl Tmux {
    /// Starts `command` (a shell line) in a `width` × `height` window.
    pub(crate) fn start(name: &str, width: u16, height: u16, command: &str) -> Tmux {
        let socket = format!("gpuwatch-{name}-{}", std::process::id());
        let t = Tmux { socket };
        let ok = t
            .cmd(&[
                "new-session",
                "-d",
                "-x",
                &width.to_string(),
                "-y",
                &height.to_string(),
                command,
            ])
            .status()
            .expect("tmux")
            .success();
        assert!(ok, "tmux new-session");
        t
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket, "-f", "/dev/null"]).args(args);
        c
    }

    /// The screen with the lines the terminal wrapped joined again (`capture-pane -J`): a line
    /// wider than the pane is one the program did not wrap itself.
    pub(crate) fn screen_joined(&self) -> String {
        let out = self
            .cmd(&["capture-pane", "-p", "-J"])
            .output()
            .expect("tmux");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub(crate) fn screen(&self) -> String {
        let out = self.cmd(&["capture-pane", "-p"]).output().expect("tmux");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn resize(&self, width: u16, height: u16) {
        let (w, h) = (width.to_string(), height.to_string());
        assert!(self
            .cmd(&["resize-window", "-x", &w, "-y", &h])
            .status()
            .expect("tmux")
            .success());
    }

    pub(crate) fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys"];
        args.extend_from_slice(keys);
        assert!(self.cmd(&args).status().expect("tmux").success());
    }

    /// Waits until the screen satisfies `ok`; panics with the screen after `limit`.
    pub(crate) fn wait(&self, what: &str, limit: Duration, ok: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let s = self.screen();
            if ok(&s) {
                return s;
            }
            assert!(start.elapsed() < limit, "{what}; the screen:\n{s}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]).status();
    }
}

fn config(dir: &Path) -> PathBuf {
    let path = dir.join("config.toml");
    std::fs::write(
        &path,
        format!(
            "[daemon]\nstate_dir = \"state\"\nrules = [{:?}]\nhostname = \"simhost\"\n\n[job]\ntick = \"200ms\"\n",
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("rules")
                .display()
                .to_string()
        ),
    )
    .expect("config");
    path
}

/// The shell line that runs gpuwatch `args` in the pane, then says how it ended and stays.
/// The newest process whose command line contains `pattern`.
fn newest(pattern: &str) -> i32 {
    let out = Command::new("pgrep")
        .args(["-f", "--newest", pattern])
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a pid")
}

fn line(env: &str, args: &str) -> String {
    format!(
        "env -u GPUWATCH_CONFIG -u GPUWATCH_LOG -u NVML_SIM_TIME_SCALE HOME={home} {env} {exe} {args}; echo EXITED $?; sleep 600",
        home = common::test_home().display(),
        exe = common::gpuwatch_exe().display(),
    )
}

#[test]
fn top_shows_gpus_alerts_jobs_and_answers_keys() {
    if common::installed(&["tmux"]).is_none() {
        return;
    }
    common::sim_lib();
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = config(tmp.path());
    // A job under `gpuwatch run`, in the same state directory.
    let mut job = common::command(
        &[
            "--sim",
            "healthy",
            "run",
            "--quiet",
            "--no-report",
            "--config",
            cfg.to_str().expect("utf-8"),
            "--",
            "sh",
            "-c",
            "i=0; while [ $i -lt 600 ]; do i=$((i+1)); echo \"step $i/1000\"; sleep 0.1; done",
        ],
        &[],
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .expect("gpuwatch run");
    let t = Tmux::start(
        "top",
        80,
        24,
        &line(
            "LANG=C.UTF-8",
            &format!("--sim overnight --speed 60 top --config {}", cfg.display()),
        ),
    );
    // The table: 8 GPUs, the lost one said as such, and a firing stock alert (evaluated here:
    // no daemon).
    let s = t.wait(
        "8 GPU rows and gpu_lost firing",
        Duration::from_secs(60),
        |s| s.contains("LOST") && s.contains("gpu_lost") && s.contains(" 7 "),
    );
    assert!(s.contains("GPU util"), "{s}");
    assert!(s.contains("alerts: local rules"), "{s}");
    assert!(s.contains("(stock rules evaluated here: no daemon)"), "{s}");
    assert!(s.contains("FIRING  critical GPU 5"), "{s}");
    assert!(s.contains('█') || s.contains('▆'), "sparklines: {s}");
    // The job `run` watches, with its progress.
    t.wait("the run's job", Duration::from_secs(20), |s| {
        s.contains("jobs (gpuwatch run)") && s.contains("/1000")
    });
    // Keys: sort, chart, back, quit.
    t.keys(&["s"]);
    t.wait("sorted by utilization", Duration::from_secs(10), |s| {
        s.contains("sort: util")
    });
    t.keys(&["Enter"]);
    t.wait("the chart", Duration::from_secs(10), |s| {
        s.contains("— utilization (%)") && s.contains("oldest")
    });
    t.keys(&["t"]);
    t.wait("the temperature chart", Duration::from_secs(10), |s| {
        s.contains("— temperature (°C)")
    });
    t.keys(&["Escape"]);
    t.wait("the table again", Duration::from_secs(10), |s| {
        s.contains("GPU util")
    });
    // Too small, then big again: a message, never a crash.
    t.resize(50, 12);
    t.wait("too small", Duration::from_secs(10), |s| {
        s.contains("terminal too small")
    });
    t.resize(80, 24);
    t.wait("the table after the resize", Duration::from_secs(10), |s| {
        s.contains("GPU util")
    });
    t.keys(&["q"]);
    let s = t.wait("quit", Duration::from_secs(10), |s| s.contains("EXITED 0"));
    // The main screen is back: nothing of the view is left on it.
    assert!(!s.contains("GPU util"), "{s}");
    let _ = job.kill();
    let _ = job.wait();
}

#[test]
fn top_follows_the_daemon_in_ascii_and_gives_the_terminal_back_on_sigterm() {
    if common::installed(&["tmux"]).is_none() {
        return;
    }
    common::sim_lib();
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = config(tmp.path());
    let log = tmp.path().join("daemon.log");
    let mut daemon = super::daemon::daemon("xid-79", &cfg, &log, &[("NVML_SIM_TIME_SCALE", "10")]);
    let sock = tmp.path().join("state/control.sock");
    let start = Instant::now();
    while !sock.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the daemon's socket"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let t = Tmux::start(
        "top-ascii",
        80,
        24,
        &line(
            "LANG=C NO_COLOR=1",
            &format!("--sim healthy top --config {}", cfg.display()),
        ),
    );
    let s = t.wait("the daemon's alerts", Duration::from_secs(60), |s| {
        s.contains("alerts: daemon") && s.contains("(from the daemon)") && s.contains("gpu_lost")
    });
    for l in s.lines() {
        assert!(l.is_ascii(), "a plain terminal gets ASCII only: {l}");
    }
    // The daemon goes away: the view says so and evaluates the rules itself.
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait(Duration::from_secs(15)).success());
    t.wait("the daemon gone", Duration::from_secs(20), |s| {
        s.contains("alerts: local rules")
            && s.contains("evaluated here: the daemon stopped answering")
    });
    // SIGTERM: the terminal is given back.
    let pid = newest("gpuwatch --sim healthy top");
    // SAFETY: signalling the view started above.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let s = t.wait("stopped by SIGTERM", Duration::from_secs(10), |s| {
        s.contains("EXITED 0")
    });
    assert!(!s.contains("GPU util"), "{s}");
    // Raw mode is off again: the shell echoes what is typed.
    t.keys(&["echo back-to-cooked", "Enter"]);
    t.wait("a cooked terminal", Duration::from_secs(10), |s| {
        s.contains("back-to-cooked")
    });

    // The terminal goes away under it (ssh dropped, tmux killed): the view ends, never spins.
    let gone = Tmux::start(
        "top-hangup",
        80,
        24,
        &line("LANG=C.UTF-8", "--sim healthy top --interval 500ms"),
    );
    gone.wait("the view", Duration::from_secs(30), |s| {
        s.contains("GPU util")
    });
    let pid = newest("top --interval 500ms");
    drop(gone);
    let start = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() {
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        });
        if zombie {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "top outlived its terminal"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Issue 25 item 2: a job status file left behind (its `run` was killed with SIGKILL) names a
/// PID that is now another process (another start time): `top` does not show it as a job, and
/// removes it; the file of a job that runs (job and watcher with their start times) is shown
/// and kept.
#[test]
fn top_skips_and_removes_the_job_file_of_a_reused_pid() {
    if common::installed(&["tmux"]).is_none() {
        return;
    }
    common::sim_lib();
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = config(tmp.path());
    let jobs = tmp.path().join("state/jobs");
    std::fs::create_dir_all(&jobs).expect("jobs dir");
    let sleep = || Command::new("sleep").arg("120").spawn().expect("sleep");
    let (mut real, mut reused) = (sleep(), sleep());
    let start = |pid: u32| gpuwatch::sys::live_start_ticks(pid).expect("a start time");
    let me = std::process::id();
    let my_start = start(me);
    let status = |pid: u32, start: u64, command: &str| {
        serde_json::json!({
            "pid": pid,
            "start_ticks": start,
            "watcher_pid": me,
            "watcher_start_ticks": my_start,
            "command": command,
            "progress": "step 5/1000",
        })
        .to_string()
    };
    let real_file = jobs.join(format!("{}.json", real.id()));
    let reused_file = jobs.join(format!("{}.json", reused.id()));
    std::fs::write(&real_file, status(real.id(), start(real.id()), "real-job")).expect("write");
    // The job that had this PID started at another time.
    std::fs::write(
        &reused_file,
        status(reused.id(), start(reused.id()) + 1, "phantom-job"),
    )
    .expect("write");
    let t = Tmux::start(
        "top-jobs",
        120,
        50,
        &line(
            "LANG=C.UTF-8",
            &format!("--sim healthy top --config {}", cfg.display()),
        ),
    );
    let s = t.wait("the running job", Duration::from_secs(60), |s| {
        s.contains("jobs (gpuwatch run)") && s.contains("real-job")
    });
    assert!(!s.contains("phantom-job"), "{s}");
    let since = Instant::now();
    while reused_file.exists() {
        assert!(
            since.elapsed() < Duration::from_secs(10),
            "the stale file is still there"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(real_file.exists(), "the running job's file was removed");
    assert!(!t.screen().contains("phantom-job"));
    t.keys(&["q"]);
    t.wait("quit", Duration::from_secs(10), |s| s.contains("EXITED 0"));
    for c in [&mut real, &mut reused] {
        let _ = c.kill();
        let _ = c.wait();
    }
}
