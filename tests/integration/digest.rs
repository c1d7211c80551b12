//! Issue 15 §4: the daemon accounts who used the GPUs and `gpuwatch digest` prints it: GPU-hours
//! and idle-but-allocated hours by user (here the simulated processes are the daemon's own), the
//! alerts that fired, and jobs `gpuwatch run` saw crash. (Attribution across users and
//! containers over a recorded week is checked in `usage::tests`.)

use std::time::Duration;

use super::common;

#[test]
fn the_daemon_accounts_usage_and_digest_prints_it() {
    common::sim_lib();
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = tmp.path().join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "[daemon]\nstate_dir = \"state\"\nrules = [{:?}]\nhostname = \"simhost\"\n\n[digest]\nschedule = \"daily\"\n",
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("rules")
                .display()
                .to_string()
        ),
    )
    .expect("config");
    let cfg_s = cfg.to_str().expect("utf-8");
    // A job that crashes, under `run`.
    let r = common::gpuwatch(
        &[
            "--sim",
            "healthy",
            "run",
            "--quiet",
            "--no-report",
            "--config",
            cfg_s,
            "--",
            "sh",
            "-c",
            "exit 3",
        ],
        &[],
    );
    assert_eq!(r.code, 3, "{r:?}");
    // The overnight scenario (GPU 6 holds 20 GiB at 0 %) for a few seconds, its training job
    // this test process (so that `/proc` names the owner).
    let overnight = common::scenario_with_parent("overnight", tmp.path());
    let overnight = overnight.to_str().expect("utf-8");
    let mut real = common::command(&["--sim", overnight, "daemon", "--config", cfg_s], &[])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("daemon");
    std::thread::sleep(Duration::from_secs(10));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(real.id() as i32, libc::SIGTERM) };
    assert!(real.wait().expect("daemon").success());
    let r = common::gpuwatch(
        &["digest", "--since", "7d", "--json", "--config", cfg_s],
        &[],
    );
    let v = r.json();
    let me = String::from_utf8(
        std::process::Command::new("id")
            .arg("-un")
            .output()
            .expect("id")
            .stdout,
    )
    .expect("utf-8")
    .trim()
    .to_string();
    let owners = v["owners"].as_array().expect("owners");
    let mine = owners
        .iter()
        .find(|o| o["user"] == me.as_str() && o["gpu_hours"].as_f64().unwrap_or(0.0) > 0.0)
        .unwrap_or_else(|| panic!("{me}'s GPU time: {v}"));
    // 7 answering GPUs with a process each for ~8 s.
    let gpu_h = mine["gpu_hours"].as_f64().expect("gpu_hours");
    assert!((0.005..0.05).contains(&gpu_h), "{v}");
    let idle = mine["idle_allocated_hours"].as_f64().expect("idle");
    assert!(
        idle > 0.0005 && idle < gpu_h,
        "GPU 6 holds memory at 0 %: {v}"
    );
    let crashed: u64 = owners
        .iter()
        .filter_map(|o| o["jobs_crashed"].as_u64())
        .sum();
    assert_eq!(crashed, 1, "{v}");
    let text = common::gpuwatch(&["digest", "--config", cfg_s], &[]);
    assert_eq!(text.code, 0, "{text:?}");
    assert!(
        text.stdout.contains("GPU usage on simhost") && text.stdout.contains("idle-alloc h"),
        "{}",
        text.stdout
    );
}

/// `[digest] schedule`: at the scheduled time the daemon sends one `usage_digest` notice through
/// the routes, with the table. Played 3600× faster so the schedule comes within seconds.
#[test]
fn a_scheduled_digest_is_sent_through_the_channels() {
    common::sim_lib();
    let tmp = tempfile::tempdir().expect("tempdir");
    let hook = super::notify::servers::HttpReceiver::start();
    // Two hours from now, local time: two seconds at --speed 3600.
    let at = std::process::Command::new("date")
        .args(["-d", "+2 hours", "+%H:%M"])
        .output()
        .expect("date");
    let at = String::from_utf8(at.stdout)
        .expect("utf-8")
        .trim()
        .to_string();
    let cfg = tmp.path().join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "[daemon]\nstate_dir = \"state\"\nrules = [{:?}]\nhostname = \"simhost\"\n\
             interval = \"1m\"\n\n\
             [digest]\nschedule = \"daily {at}\"\n\n\
             [[channel]]\nname = \"ops\"\ntype = \"webhook\"\nurl = \"{}\"\n\n\
             [[route]]\nchannels = [\"ops\"]\ngroup_wait = \"0s\"\n",
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("rules")
                .display()
                .to_string(),
            hook.url("/hook")
        ),
    )
    .expect("config");
    let mut d = common::command(
        &[
            "--sim",
            "overnight",
            "--speed",
            "3600",
            "daemon",
            "--config",
            cfg.to_str().expect("utf-8"),
        ],
        &[],
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .expect("daemon");
    let body = super::notify::servers::wait_until(Duration::from_secs(60), "the digest", || {
        hook.requests()
            .into_iter()
            .map(|r| r.json())
            .find(|b| b["alerts"][0]["labels"]["alertname"] == "usage_digest")
    });
    // SAFETY: signalling our own child.
    unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
    let _ = d.wait();
    let a = &body["alerts"][0]["annotations"];
    let summary = a["summary"].as_str().expect("summary");
    assert!(
        summary.starts_with("GPU usage on simhost over the last day: "),
        "{summary}"
    );
    let table = a["description"].as_str().expect("description");
    assert!(
        table.contains("GPU-h") && table.contains("idle-alloc h"),
        "{table}"
    );
    let digests = hook
        .requests()
        .into_iter()
        .filter(|r| r.json()["alerts"][0]["labels"]["alertname"] == "usage_digest")
        .count();
    assert_eq!(digests, 1, "one message per channel");
}

/// Issue 30 §4: a `--speed` daemon's state is kept when it stops (it says where), usage
/// included, so `digest --state-dir` after a simulated run lists who used the GPUs.
#[test]
fn a_speed_run_keeps_its_state_for_the_digest() {
    common::sim_lib();
    let tmp = tempfile::tempdir().expect("tempdir");
    let state = tmp.path().join("sim-state");
    let state_arg = state.to_str().expect("utf-8");
    let d = common::command(
        &[
            "--log-format",
            "human",
            "--sim",
            "overnight",
            "--speed",
            "60",
            "daemon",
            "--state-dir",
            state_arg,
        ],
        &[],
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("gpuwatch");
    // Eight minutes of the scenario.
    std::thread::sleep(std::time::Duration::from_secs(8));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
    let out = d.wait_with_output().expect("daemon output");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!("the simulated run's state stays in {state_arg}")),
        "{said}"
    );
    assert!(state.join("KEPT").exists());
    let r = common::gpuwatch(&["digest", "--state-dir", state_arg, "--since", "24h"], &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(!r.stdout.contains("no GPU processes"), "{}", r.stdout);
    let total = r
        .stdout
        .lines()
        .find(|l| l.starts_with("total"))
        .unwrap_or_else(|| panic!("{}", r.stdout));
    let gpu_h: f64 = total
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{total}"));
    assert!(gpu_h > 0.2, "{}", r.stdout);
}
