//! `gpuwatch run` and `gpuwatch attach` against real processes: exit codes, signals, crash
//! classes, byte-exact pass-through, tee, progress from output and from a followed log file; job
//! rules (`job_stalled`, `job_hung_collective` on the `nccl-hang` scenario); the kill ladder
//! against real processes placed on simulated GPUs with `NVML_SIM_CONTROL`.

#![expect(clippy::unwrap_used, reason = "test helpers panic on setup failures")]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common;

fn gpuwatch() -> Command {
    let mut cmd = common::command(&[], &[]);
    cmd.env_remove("GPUWATCH_CONFIG");
    cmd
}

/// Runs `gpuwatch run --report-json R -- sh -c SCRIPT`; returns the output and the report.
fn run_sh(dir: &Path, script: &str, extra: &[&str]) -> (Output, serde_json::Value) {
    let report = dir.join("report.json");
    let _ = std::fs::remove_file(&report);
    let out = gpuwatch()
        .arg("run")
        .arg("--report-json")
        .arg(&report)
        .args(extra)
        .args(["--", "sh", "-c", script])
        .output()
        .expect("run gpuwatch");
    let text = std::fs::read_to_string(&report).unwrap_or_else(|e| {
        panic!(
            "no report ({e}); stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, serde_json::from_str(&text).expect("report is JSON"))
}

fn wait_for_file(path: &Path) -> String {
    let start = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if s.ends_with('\n') {
                return s;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{path:?} never appeared"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn exit_code_is_passed_through_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (out, report) = run_sh(dir.path(), "echo hi; exit 3", &[]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(out.stdout, b"hi\n");
    assert_eq!(report["exit_code"], 3);
    assert_eq!(report["exit"]["kind"], "exited");
    assert_eq!(report["exit"]["code"], 3);
    assert_eq!(report["crash_class"], "non_zero_exit");
    assert_eq!(report["last_lines"], serde_json::json!(["hi"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("gpuwatch: job failed: non-zero exit (exit code 3)"),
        "{stderr}"
    );
}

#[test]
fn clean_exit() {
    let dir = tempfile::tempdir().unwrap();
    let (out, report) = run_sh(dir.path(), "true", &["--quiet"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(report["crash_class"], "clean_exit");
    assert!(out.stderr.is_empty(), "--quiet prints nothing");
}

#[test]
fn output_passes_through_byte_exact() {
    let dir = tempfile::tempdir().unwrap();
    let tee = dir.path().join("tee.log");
    // Partial line, CR redraws, invalid UTF-8, no trailing newline.
    let script = r"printf 'a\r\n10%%|#  | 1/10 [\r\377\376 end'; printf 'to stderr\n' >&2";
    let (out, _) = run_sh(
        dir.path(),
        script,
        &["--tee", tee.to_str().unwrap(), "--quiet"],
    );
    let want_out: &[u8] = b"a\r\n10%|#  | 1/10 [\r\xff\xfe end";
    assert_eq!(out.stdout, want_out);
    assert_eq!(out.stderr, b"to stderr\n");
    let teed = std::fs::read(&tee).unwrap();
    assert_eq!(teed.len(), want_out.len() + b"to stderr\n".len());
}

#[test]
fn cuda_oom_is_classified() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"echo 'step 10'; echo 'Traceback (most recent call last):' >&2;
        echo '  File "train.py", line 9, in <module>' >&2;
        echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB' >&2; exit 1"#;
    let (out, report) = run_sh(dir.path(), script, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(report["crash_class"], "cuda_oom");
    assert!(report["crash_detail"]
        .as_str()
        .unwrap()
        .contains("CUDA out of memory"));
    assert_eq!(report["progress"]["step"], 10);
    assert!(String::from_utf8_lossy(&out.stderr).contains("class      CUDA out of memory"));
}

#[test]
fn nccl_error_and_traceback_are_classified() {
    let dir = tempfile::tempdir().unwrap();
    let (_, report) = run_sh(
        dir.path(),
        "echo '[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout' >&2; kill -ABRT $$",
        &["--quiet"],
    );
    assert_eq!(report["crash_class"], "nccl_error");
    assert_eq!(report["exit_code"], 128 + 6);
    let (_, report) = run_sh(
        dir.path(),
        "echo 'Traceback (most recent call last):'; echo 'KeyError: 3'; exit 1",
        &["--quiet"],
    );
    assert_eq!(report["crash_class"], "python_traceback");
    assert_eq!(report["crash_detail"], "KeyError: 3");
}

/// A job that a signal ended ends gpuwatch by the same signal: its parent's wait sees a death by
/// that signal (and a shell's `$?` is 128 + n), not an exit code.
#[test]
fn signal_exit_is_128_plus_signal() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let (out, report) = run_sh(dir.path(), "kill -TERM $$", &["--quiet"]);
    assert_eq!(out.status.signal(), Some(libc::SIGTERM), "{:?}", out.status);
    assert_eq!(report["exit_code"], 143);
    assert_eq!(report["exit"]["kind"], "signaled");
    assert_eq!(report["exit"]["signal"], 15);
    assert_eq!(report["crash_class"], "killed_by_signal");
}

#[test]
fn sigkill_from_outside_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let report = dir.path().join("report.json");
    let child = gpuwatch()
        .args(["run", "--report-json", report.to_str().unwrap(), "--"])
        .args([
            "sh",
            "-c",
            &format!("echo $$ > {}; exec sleep 30", pidfile.display()),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid: i32 = wait_for_file(&pidfile).trim().parse().unwrap();
    // SAFETY: plain kill(2) of the job we just started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let out = child.wait_with_output().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{:?}", out.status);
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(report["exit"]["signal"], 9);
    // No OOM-killer evidence here, so: a SIGKILL from outside.
    assert_eq!(report["crash_class"], "killed_by_signal");
    assert_eq!(
        report["crash_detail"],
        "killed by SIGKILL (possibly the OOM killer)"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("signal 9 (SIGKILL)"), "{stderr}");
}

#[test]
fn sigint_is_forwarded_to_the_job_group() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let report = dir.path().join("report.json");
    let child = gpuwatch()
        .args([
            "run",
            "--quiet",
            "--report-json",
            report.to_str().unwrap(),
            "--",
        ])
        .args([
            "sh",
            "-c",
            &format!("echo $$ > {}; exec sleep 30", pidfile.display()),
        ])
        .spawn()
        .unwrap();
    wait_for_file(&pidfile);
    // SAFETY: SIGINT to the gpuwatch process we started.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let out = child.wait_with_output().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGINT), "{:?}", out.status);
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(report["crash_detail"], "SIGINT forwarded by gpuwatch");
    assert_eq!(report["exit_code"], 130);
}

/// Issue 25 §11: `run` asked to stop by a signal forwards it and, once the job died of it, dies
/// of it too (default disposition restored, re-raised): a shell sees `$?` 143 and a death by
/// SIGTERM (bash's `kill -l $?`), Python a `returncode` of -15. A job that handles the signal and
/// exits with a code passes that code on; a job that crashes (SIGSEGV) ends gpuwatch by SIGSEGV
/// without a core of gpuwatch's.
#[test]
fn a_signal_death_reaches_the_parent_as_a_signal_death() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    // `gpuwatch run -- JOB` from a shell, which SIGTERMs gpuwatch once the job runs and reports
    // what its `wait` saw.
    let shell = |job: &str| -> String {
        let _ = std::fs::remove_file(&pidfile);
        let script = "\"$GW\" run --quiet --no-report -- sh -c \"$JOB\" & gw=$!; \
             while [ ! -s \"$PIDFILE\" ]; do sleep 0.02; done; kill -TERM $gw; wait $gw; s=$?; \
             sig=; if [ $s -gt 128 ]; then sig=$(kill -l $s); fi; echo \"status=$s signal=$sig\"";
        let out = Command::new("bash")
            .args(["-c", script])
            .env("GW", common::gpuwatch_exe())
            .env("JOB", job)
            .env("PIDFILE", &pidfile)
            .env("HOME", common::test_home())
            .env_remove("GPUWATCH_CONFIG")
            .current_dir(dir.path())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let job = format!("echo $$ > {}; exec sleep 30", pidfile.display());
    assert_eq!(shell(&job), "status=143 signal=TERM");
    // The job handles SIGTERM and exits 3: that is how it ended.
    let handled = format!(
        "trap 'exit 3' TERM; echo $$ > {}; sleep 30 & wait",
        pidfile.display()
    );
    assert_eq!(shell(&handled), "status=3 signal=");

    // What the parent's wait(2) sees: WIFSIGNALED with SIGTERM, no exit code.
    let _ = std::fs::remove_file(&pidfile);
    let child = gpuwatch()
        .args(["run", "--quiet", "--no-report", "--", "sh", "-c", &job])
        .spawn()
        .unwrap();
    wait_for_file(&pidfile);
    // SAFETY: SIGTERM to the gpuwatch process we started.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.signal(), Some(libc::SIGTERM), "{:?}", out.status);
    assert_eq!(out.status.code(), None);

    // The same seen by Python's subprocess.
    if let Some(python) = common::installed(&["python3"]) {
        let _ = std::fs::remove_file(&pidfile);
        let code = "import os, signal, subprocess, sys, time\n\
                    p = subprocess.Popen([os.environ['GW'], 'run', '--quiet', '--no-report', '--', \
                    'sh', '-c', os.environ['JOB']])\n\
                    while not os.path.exists(os.environ['PIDFILE']) or \
                    not open(os.environ['PIDFILE']).read().strip(): time.sleep(0.02)\n\
                    p.send_signal(signal.SIGTERM)\n\
                    print(p.wait())\n";
        let out = Command::new(python)
            .args(["-c", code])
            .env("GW", common::gpuwatch_exe())
            .env("JOB", &job)
            .env("PIDFILE", &pidfile)
            .env("HOME", common::test_home())
            .env_remove("GPUWATCH_CONFIG")
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "-15",
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // A crash of the job: gpuwatch dies of the same signal, without dumping a core itself.
    let out = gpuwatch()
        .args([
            "run",
            "--quiet",
            "--no-report",
            "--",
            "sh",
            "-c",
            "kill -SEGV $$",
        ])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "{:?}", out.status);
    assert!(!out.status.core_dumped(), "gpuwatch dumped a core");
}

#[test]
fn progress_from_output_and_from_a_followed_log() {
    let dir = tempfile::tempdir().unwrap();
    let (_, report) = run_sh(
        dir.path(),
        "echo 'Epoch 2/10'; printf ' 37%%|###7 | 370/1000 [00:10<00:17, 36.5it/s]\\r'; echo",
        &["--quiet"],
    );
    assert_eq!(report["progress"]["epoch"], 2.0);
    assert_eq!(report["progress"]["total_epochs"], 10);
    assert_eq!(report["progress"]["step"], 370);
    assert_eq!(report["progress"]["total_steps"], 1000);

    let log = dir.path().join("train.log");
    let script = format!(
        "echo 'step 1' > {log}; sleep 0.3; echo 'step 2' >> {log}; sleep 0.3; \
         mv {log} {log}.1; echo 'step 3' > {log}; sleep 0.3",
        log = log.display()
    );
    let (_, report) = run_sh(
        dir.path(),
        &script,
        &["--quiet", "--progress-log", log.to_str().unwrap()],
    );
    assert_eq!(report["progress"]["step"], 3);
    assert_eq!(
        report["last_lines"],
        serde_json::json!(["step 1", "step 2", "step 3"])
    );

    // A user pattern.
    let (_, report) = run_sh(
        dir.path(),
        "echo 'it=41 loss=2'",
        &["--quiet", "--progress", r"it=(?P<step>\d+)"],
    );
    assert_eq!(report["progress"]["step"], 41);
}

#[test]
fn attach_reports_the_end_of_a_foreign_process() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("out.log");
    // The target writes to a file; attach follows its stdout file for progress.
    let mut target = Command::new("sh")
        .args(["-c", "echo 'step 5'; sleep 1; echo 'step 6'; exit 5"])
        .stdout(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let report = dir.path().join("report.json");
    let out = gpuwatch()
        .args([
            "attach",
            "--quiet",
            "--report-json",
            report.to_str().unwrap(),
        ])
        .arg(target.id().to_string())
        .output()
        .unwrap();
    // We are the parent and have not reaped it yet, so the kernel may still show the zombie's
    // exit status; otherwise the report says "ended".
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(target.wait().unwrap().code(), Some(5));
    assert_eq!(report["mode"], "attach");
    assert_eq!(report["progress"]["step"], 6);
    match report["exit"]["kind"].as_str().unwrap() {
        "exited" => {
            assert_eq!(out.status.code(), Some(5));
            assert_eq!(report["crash_class"], "non_zero_exit");
        }
        "ended" => {
            assert_eq!(out.status.code(), Some(0));
            assert_eq!(report["crash_class"], "ended");
        }
        other => panic!("unexpected exit kind {other}"),
    }
}

#[test]
fn attach_to_a_missing_process_fails() {
    let out = gpuwatch().args(["attach", "999999999"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no process 999999999"));
}

#[test]
fn a_missing_command_exits_127_like_a_shell() {
    let out = gpuwatch()
        .args(["run", "--no-rules", "--", "/nonexistent/train.py"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot start"));
}

#[test]
fn run_without_command_is_a_usage_error() {
    let out = gpuwatch().arg("run").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// The repository's stock rules directory.
fn rules_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("rules")
}

/// A config file in `dir` with fast sampling and evaluation plus `extra` TOML.
fn config(dir: &Path, extra: &str) -> PathBuf {
    let path = dir.join("gpuwatch.toml");
    let text = format!(
        "[daemon]\ninterval = \"200ms\"\nstate_dir = {state:?}\nrules = [{rules:?}]\n\n\
         [rules]\neval_interval = \"0s\"\n\n[job]\ntick = \"100ms\"\n\n{extra}\n",
        state = dir.join("state").display().to_string(),
        rules = rules_dir().display().to_string(),
    );
    std::fs::write(&path, text).expect("write config");
    path
}

fn read_report(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("report written"))
        .expect("report is JSON")
}

/// `(name, status)` of every alert in a report.
fn alerts(report: &serde_json::Value) -> Vec<(String, String)> {
    report["alerts"]
        .as_array()
        .expect("alerts")
        .iter()
        .map(|a| {
            (
                a["name"].as_str().unwrap_or("").to_string(),
                a["status"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn job_stalled_fires_when_progress_stops() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "[rules.params.job_stalled]\nafter = \"1s\"\n");
    let report = dir.path().join("report.json");
    let out = gpuwatch()
        .args(["run", "--config", cfg.to_str().unwrap()])
        .args(["--report-json", report.to_str().unwrap(), "--"])
        .args([
            "sh",
            "-c",
            "for i in 1 2 3; do echo \"step $i\"; sleep 0.1; done; sleep 2.5",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("gpuwatch: [firing] job_stalled (warning): job "),
        "{stderr}"
    );
    assert!(stderr.contains("(last: step 3)"), "{stderr}");
    let report = read_report(&report);
    let got = alerts(&report);
    let want = [
        ("job_stalled", "firing"),
        ("job_stalled", "resolved"),
        ("job_finished", "firing"),
    ];
    for (name, status) in want {
        assert!(
            got.contains(&(name.to_string(), status.to_string())),
            "{name} {status} missing: {got:?}"
        );
    }
    // The end notice carries the whole report.
    let end = report["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "job_finished")
        .unwrap();
    assert!(end["annotations"]["description"]
        .as_str()
        .unwrap()
        .contains("progress   step 3"));
    assert_eq!(end["annotations"]["exit_code"], "0");
}

#[test]
fn job_crashed_is_the_end_notice_of_a_failed_job() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "");
    let report = dir.path().join("report.json");
    let out = gpuwatch()
        .args(["run", "--config", cfg.to_str().unwrap()])
        .args(["--report-json", report.to_str().unwrap(), "--"])
        .args([
            "sh",
            "-c",
            "echo 'CUDA out of memory. Tried to allocate 2 GiB' >&2; exit 1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report = read_report(&report);
    let crashed: Vec<_> = report["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["name"] == "job_crashed")
        .collect();
    assert_eq!(crashed.len(), 1, "{:?}", alerts(&report));
    assert_eq!(crashed[0]["annotations"]["crash_class"], "cuda_oom");
    assert!(crashed[0]["annotations"]["summary"]
        .as_str()
        .unwrap()
        .contains("failed: cuda_oom (exit code 1)"));
}

/// Issue 25 §3: escape sequences in a job's output (an OSC 52 clipboard write, a screen clear,
/// colours) pass through on the job's own stdout, but gpuwatch's report on stderr and the end
/// notice sent to people carry them escaped.
#[test]
fn the_report_and_the_end_notice_escape_the_jobs_control_characters() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "");
    let report = dir.path().join("report.json");
    let script = r"printf 'step 1\n\033]52;c;cm0gLXJmIH4=\007\n\033[2Jcleared\302\233m\n\033[31mRuntimeError: CUDA error: out of memory\033[0m\n'; exit 1";
    let out = gpuwatch()
        .args(["run", "--config", cfg.to_str().unwrap()])
        .args(["--report-json", report.to_str().unwrap(), "--"])
        .args(["sh", "-c", script])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    // The job's own output is the job's: byte-exact.
    assert!(
        out.stdout.windows(5).any(|w| w == b"]52;"),
        "{:?}",
        out.stdout
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.chars().any(|c| c.is_control() && c != '\n'),
        "raw control characters on stderr: {stderr:?}"
    );
    assert!(
        stderr.contains("    | \\u{1b}]52;c;cm0gLXJmIH4=\\u{7}\n"),
        "{stderr}"
    );
    assert!(
        stderr.contains("    | \\u{1b}[2Jcleared\\u{9b}m\n"),
        "{stderr}"
    );
    let report = read_report(&report);
    let crashed = report["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "job_crashed")
        .unwrap_or_else(|| panic!("{:?}", alerts(&report)));
    for (k, v) in crashed["annotations"].as_object().unwrap() {
        let v = v.as_str().unwrap_or("");
        assert!(
            !v.chars().any(|c| c.is_control() && c != '\n'),
            "annotation {k}: {v:?}"
        );
    }
    assert!(
        crashed["annotations"]["description"]
            .as_str()
            .unwrap()
            .contains("\\u{1b}]52;c;"),
        "{crashed}"
    );
}

/// Runs a job that prints steps for ~1 s and then hangs, on `scenario` at 60× time (the
/// nccl-hang scenario hangs its GPUs at scenario time 30 s, i.e. after 0.5 s).
fn hang_run(scenario: &str) -> serde_json::Value {
    common::sim_lib();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        "[rules.params.job_hung_collective]\nafter = \"2s\"\n\
         [rules.params.job_stalled]\nafter = \"1h\"\n",
    );
    let report = dir.path().join("report.json");
    let out = gpuwatch()
        .env("NVML_SIM_TIME_SCALE", "60")
        .args(["--sim", scenario, "run", "--config", cfg.to_str().unwrap()])
        .args(["--report-json", report.to_str().unwrap(), "--"])
        .args([
            "sh",
            "-c",
            "for i in 1 2 3 4 5; do echo \"step $i\"; sleep 0.2; done; sleep 3.5",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    read_report(&report)
}

#[test]
fn nccl_hang_with_stalled_progress_fires_job_hung_collective() {
    let report = hang_run("nccl-hang");
    let fired: Vec<_> = report["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["name"] == "job_hung_collective" && a["status"] == "firing")
        .collect();
    assert_eq!(fired.len(), 1, "{:?}", alerts(&report));
    assert_eq!(fired[0]["severity"], "critical");
    let summary = fired[0]["annotations"]["summary"].as_str().unwrap();
    assert!(
        summary.contains("~100% utilization with idle power"),
        "{summary}"
    );
    assert!(summary.contains("last: step 5"), "{summary}");
    assert_eq!(fired[0]["annotations"]["progress"], "step 5");
    // GPU data made it into the report.
    assert!(report["gpus"].is_array());
}

#[test]
fn a_stalled_job_on_healthy_gpus_is_not_a_hung_collective() {
    let report = hang_run("healthy");
    assert!(
        !alerts(&report)
            .iter()
            .any(|(n, _)| n == "job_hung_collective"),
        "{:?}",
        alerts(&report)
    );
}

// ---------------------------------------------------------------------------------------------
// The kill ladder against real processes on simulated GPUs.

fn my_uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

fn my_user() -> String {
    let out = Command::new("id").arg("-un").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A process in its own process group that ignores SIGTERM.
fn runaway() -> Child {
    // The shell says when its trap is in place, so a slow machine cannot TERM it too early.
    let mut child = Command::new("sh")
        .args([
            "-c",
            "trap '' TERM; echo ready; exec >/dev/null; while :; do sleep 0.05; done",
        ])
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(common::first_line(&mut child), "ready");
    child
}

/// Writes the nvml-sim control file placing `pids` on GPU 0 with 70 GiB each (atomically).
fn place_on_gpu(control: &Path, pids: &[u32]) {
    let mut text = String::new();
    for pid in pids {
        text.push_str(&format!(
            "[[process]]\ngpu = 0\npid = {pid}\nused_memory_mib = 71680\n\n"
        ));
    }
    let tmp = control.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, control).unwrap();
}

/// Kill-policy config: gpu_memory_quota enabled at 40 GiB, fast ladder, our own user allowed.
fn kill_config(dir: &Path, dry_run: bool, extra_kill: &str, grace: &str) -> PathBuf {
    let uid = my_uid();
    config(
        dir,
        &format!(
            "[rules.params.gpu_memory_quota]\nenabled = true\nquota_gib = 40\n\n\
             [actions.kill]\ndry_run = {dry_run}\nallow_users = [{user:?}]\nallow_root = {root}\n\
             min_uid = {min_uid}\ngrace = {grace:?}\nterm_timeout = \"500ms\"\n\
             audit_log = {audit:?}\n{extra_kill}\n",
            user = my_user(),
            root = uid == 0,
            min_uid = uid.min(1000),
            audit = dir.join("audit.jsonl").display().to_string(),
        ),
    )
}

/// Starts `gpuwatch --sim two-gpus run --config CFG -- sleep SECS` with the control file.
fn start_watch(dir: &Path, cfg: &Path, control: &Path, secs: &str) -> Child {
    common::sim_lib();
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/job/two-gpus.toml");
    gpuwatch()
        .env("NVML_SIM_CONTROL", control)
        .args(["--sim", scenario.to_str().unwrap(), "run", "--quiet"])
        .args(["--config", cfg.to_str().unwrap()])
        .args(["--report-json", dir.join("report.json").to_str().unwrap()])
        .args(["--", "sleep", secs])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn audit(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("audit line is JSON"))
        .collect()
}

fn decisions(records: &[serde_json::Value]) -> Vec<String> {
    records
        .iter()
        .map(|r| r["decision"].as_str().unwrap_or("").to_string())
        .collect()
}

fn finish(watch: Child) -> String {
    let out = watch.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn dry_run_kills_nothing_and_the_audit_log_says_what_would_have_been() {
    let dir = tempfile::tempdir().unwrap();
    let mut target = runaway();
    let control = dir.path().join("control.toml");
    place_on_gpu(&control, &[target.id()]);
    let cfg = kill_config(dir.path(), true, "", "500ms");
    let watch = start_watch(dir.path(), &cfg, &control, "3");
    finish(watch);
    assert!(
        target.try_wait().unwrap().is_none(),
        "dry run killed the process"
    );
    let records = audit(dir.path());
    assert_eq!(
        decisions(&records),
        vec!["would_warn", "would_term", "would_kill"],
        "{records:?}"
    );
    for r in &records {
        assert_eq!(r["dry_run"], true);
        assert_eq!(r["host_pid"], target.id());
        assert_eq!(r["alert"], "gpu_memory_quota");
        assert_eq!(r["gpu"], 0);
    }
    assert_eq!(records[1]["target"], format!("group {}", target.id()));
    // Every decision was also announced.
    let report = read_report(&dir.path().join("report.json"));
    let kill_notices = alerts(&report)
        .into_iter()
        .filter(|(n, _)| n == "kill_action")
        .count();
    assert_eq!(kill_notices, 3);
    target.kill().unwrap();
    target.wait().unwrap();
}

#[test]
fn with_kills_allowed_the_runaway_is_warned_termed_then_killed_on_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let mut target = runaway();
    let control = dir.path().join("control.toml");
    place_on_gpu(&control, &[target.id()]);
    let cfg = kill_config(dir.path(), false, "", "500ms");
    let watch = start_watch(dir.path(), &cfg, &control, "4");
    // The runaway dies by SIGKILL (it ignores SIGTERM).
    let start = Instant::now();
    let status = loop {
        if let Some(s) = target.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "never killed");
        std::thread::sleep(Duration::from_millis(20));
    };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    finish(watch);
    let records = audit(dir.path());
    assert_eq!(
        decisions(&records),
        vec!["warn", "term", "kill", "exited"],
        "{records:?}"
    );
    let t = |i: usize| records[i]["time_ms"].as_i64().unwrap();
    // (the ladder steps on the monotonic clock, a record is stamped with the wall clock, each
    // truncated to ms on its own: 500 ms on one can read 499 on the other)
    let slack = 2;
    assert!(
        t(1) - t(0) >= 500 - slack,
        "SIGTERM before the grace period ended: {records:?}"
    );
    assert!(
        t(2) - t(1) >= 500 - slack,
        "SIGKILL before term_timeout: {records:?}"
    );
    assert!(t(2) - t(0) < 4000, "{records:?}");
    assert_eq!(records[3]["reason"], "exited after SIGKILL");
    assert!(records.iter().all(|r| r["dry_run"] == false));
}

#[test]
fn a_protected_users_process_is_never_touched() {
    let dir = tempfile::tempdir().unwrap();
    let mut target = runaway();
    let control = dir.path().join("control.toml");
    place_on_gpu(&control, &[target.id()]);
    let extra = format!("protect_users = [{:?}]", my_user());
    let cfg = kill_config(dir.path(), false, &extra, "500ms");
    finish(start_watch(dir.path(), &cfg, &control, "2"));
    assert!(target.try_wait().unwrap().is_none());
    let records = audit(dir.path());
    assert_eq!(decisions(&records), vec!["refused"], "{records:?}");
    assert!(records[0]["reason"]
        .as_str()
        .unwrap()
        .contains("actions.kill.protect_users"));
    target.kill().unwrap();
    target.wait().unwrap();
}

#[test]
fn a_process_that_leaves_the_gpu_is_not_touched() {
    let dir = tempfile::tempdir().unwrap();
    let mut target = runaway();
    let control = dir.path().join("control.toml");
    place_on_gpu(&control, &[target.id()]);
    // A long grace: the process leaves the GPU after the warning, before SIGTERM is due.
    let cfg = kill_config(dir.path(), false, "", "3s");
    let watch = start_watch(dir.path(), &cfg, &control, "4");
    let start = Instant::now();
    while decisions(&audit(dir.path())).is_empty() {
        assert!(start.elapsed() < Duration::from_secs(10), "never warned");
        std::thread::sleep(Duration::from_millis(20));
    }
    place_on_gpu(&control, &[]);
    finish(watch);
    assert!(
        target.try_wait().unwrap().is_none(),
        "a non-GPU process was signalled"
    );
    let records = audit(dir.path());
    assert_eq!(
        decisions(&records),
        vec!["warn", "cancelled"],
        "{records:?}"
    );
    target.kill().unwrap();
    target.wait().unwrap();
}

// ---------------------------------------------------------------------------------------------
// The end notice through the configured channels.

#[test]
fn run_sends_one_notice_with_the_exit_code_through_the_channels() {
    use crate::notify::servers::HttpReceiver;
    let hook = HttpReceiver::start();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        &format!(
            "[notify]\ntimeout = \"3s\"\nretry_initial = \"200ms\"\n\n\
             [[channel]]\nname = \"ops\"\ntype = \"webhook\"\nurl = {url:?}\n\n\
             [[route]]\nchannels = [\"ops\"]\ngroup_by = [\"alertname\"]\n",
            url = hook.url("/hook")
        ),
    );
    let out = gpuwatch()
        .args(["run", "--config", cfg.to_str().unwrap(), "--"])
        .args(["sh", "-c", "echo hi; exit 3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    // Delivered before gpuwatch exited: exactly one message.
    let got = hook.accepted();
    assert_eq!(got.len(), 1, "{got:?}");
    let body = got[0].json().to_string();
    assert!(body.contains("job_crashed"), "{body}");
    assert!(
        body.contains("last 1 lines"),
        "the report is in the notice: {body}"
    );
    assert!(body.contains("exit code 3"), "{body}");
    assert!(body.contains("non_zero_exit"), "{body}");
    // The outbox of the run is gone (everything delivered).
    assert!(!dir
        .path()
        .join("state/jobs")
        .read_dir()
        .is_ok_and(|mut d| d.next().is_some()));
}

/// `gpuwatch --sim two-gpus daemon --config CFG` with the control file, logging to
/// `dir/daemon.log`.
fn kill_daemon(dir: &Path, cfg: &Path, control: &Path) -> crate::notify::servers::Daemon {
    common::sim_lib();
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/job/two-gpus.toml");
    let control_env = control.display().to_string();
    let cmd = common::command(
        &[
            "--sim",
            scenario.to_str().unwrap(),
            "daemon",
            "--config",
            cfg.to_str().unwrap(),
        ],
        &[("NVML_SIM_CONTROL", control_env.as_str())],
    );
    crate::notify::servers::Daemon::spawn(cmd, &dir.join("daemon.log"), &[], false)
}

#[test]
fn the_daemon_routes_kill_rules_through_the_policy() {
    let dir = tempfile::tempdir().unwrap();
    let mut target = runaway();
    let control = dir.path().join("control.toml");
    place_on_gpu(&control, &[target.id()]);
    let cfg = kill_config(dir.path(), false, "", "500ms");
    let daemon = kill_daemon(dir.path(), &cfg, &control);
    let start = Instant::now();
    let status = loop {
        if let Some(s) = target.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "never killed: {:?}\n{}",
            audit(dir.path()),
            std::fs::read_to_string(dir.path().join("daemon.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    let start = Instant::now();
    while decisions(&audit(dir.path())).len() < 4 && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    daemon.kill9();
    assert_eq!(
        decisions(&audit(dir.path())),
        vec!["warn", "term", "kill", "exited"]
    );
}

#[test]
fn report_has_peak_memory_and_mean_utilization_of_the_jobs_gpus() {
    common::sim_lib();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "");
    let control = dir.path().join("control.toml");
    let report = dir.path().join("report.json");
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/job/two-gpus.toml");
    // The job puts itself on GPU 1 with 2 GiB.
    let script = "printf '[[process]]\\ngpu = 1\\npid = %d\\nused_memory_mib = 2048\\n' $$ \
                  > \"$NVML_SIM_CONTROL\"; sleep 2.5";
    let out = gpuwatch()
        .env("NVML_SIM_CONTROL", &control)
        .args(["--sim", scenario.to_str().unwrap(), "run", "--quiet"])
        .args(["--config", cfg.to_str().unwrap()])
        .args([
            "--report-json",
            report.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            script,
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = read_report(&report);
    let gpus = report["gpus"].as_array().expect("GPU stats");
    assert_eq!(gpus.len(), 1, "{gpus:?}");
    assert_eq!(gpus[0]["index"], 1);
    assert_eq!(gpus[0]["peak_mem_used_bytes"], 2048u64 << 20);
    let util = gpus[0]["mean_util_percent"].as_f64().unwrap();
    assert!((90.0..=100.0).contains(&util), "{util}");
}

#[test]
fn a_job_stopped_by_the_kill_action_is_reported_as_killed_by_gpuwatch() {
    common::sim_lib();
    let dir = tempfile::tempdir().unwrap();
    let cfg = kill_config(dir.path(), false, "", "300ms");
    let control = dir.path().join("control.toml");
    let report = dir.path().join("report.json");
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/job/two-gpus.toml");
    // The job puts itself on GPU 0 with 70 GiB (over the 40 GiB quota) and ignores SIGTERM.
    let script =
        "trap '' TERM; printf '[[process]]\\ngpu = 0\\npid = %d\\nused_memory_mib = 71680\\n' $$ \
                  > \"$NVML_SIM_CONTROL\"; while :; do sleep 0.05; done";
    let out = gpuwatch()
        .env("NVML_SIM_CONTROL", &control)
        .args(["--sim", scenario.to_str().unwrap(), "run", "--quiet"])
        .args(["--config", cfg.to_str().unwrap()])
        .args([
            "--report-json",
            report.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            script,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(137));
    let report = read_report(&report);
    assert_eq!(report["crash_class"], "killed_by_gpuwatch", "{report}");
    assert!(report["crash_detail"]
        .as_str()
        .unwrap()
        .starts_with("gpu_memory_quota"));
    assert_eq!(decisions(&audit(dir.path()))[..3], ["warn", "term", "kill"]);
}

/// Rules that try to reach a process without declaring `action:`: by firing on a process, by
/// returning `action`/`pid` keys, by naming an exec entry. Under a policy that would let a
/// declared kill through at once, none of them may signal the process or run the command.
#[test]
fn a_rule_without_action_can_neither_kill_nor_exec() {
    let dir = tempfile::tempdir().unwrap();
    let mut target = runaway();
    let pid = target.id();
    let control = dir.path().join("control.toml");
    place_on_gpu(&control, &[pid]);
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).unwrap();
    std::fs::write(
        rules.join("sneaky.rhai"),
        format!(
            r#"
rule(#{{ name: "plain_process", scope: "process", check: |p| `pid ${{p.pid}} is on a GPU` }});
rule(#{{ name: "returns_kill", scope: "process", check: |p| #{{ summary: "kill it", action: "kill" }} }});
rule(#{{ name: "returns_pid", check: |gpu| #{{ summary: "x", action: "kill", pid: {pid} }} }});
rule(#{{ name: "returns_exec", check: |gpu| #{{ summary: "x", action: "exec:marker" }} }});
"#
        ),
    )
    .unwrap();
    let marker = dir.path().join("exec-ran");
    let uid = my_uid();
    let cfg = dir.path().join("gpuwatch.toml");
    std::fs::write(
        &cfg,
        format!(
            "[daemon]\ninterval = \"200ms\"\nstate_dir = {state:?}\nrules = [{rules:?}]\n\n\
             [job]\ntick = \"100ms\"\n\n\
             [actions.kill]\ndry_run = false\nallow_users = [{user:?}]\nallow_root = {root}\n\
             min_uid = {min_uid}\ngrace = \"0s\"\nterm_timeout = \"200ms\"\naudit_log = {audit:?}\n\n\
             [[actions.exec]]\nname = \"marker\"\ncommand = [\"touch\", {marker:?}]\n",
            state = dir.path().join("state").display().to_string(),
            rules = rules.display().to_string(),
            user = my_user(),
            root = uid == 0,
            min_uid = uid.min(1000),
            audit = dir.path().join("audit.jsonl").display().to_string(),
            marker = marker.display().to_string(),
        ),
    )
    .unwrap();
    let watch = start_watch(dir.path(), &cfg, &control, "3");
    finish(watch);
    assert!(
        target.try_wait().unwrap().is_none(),
        "a rule without `action:` killed the process"
    );
    assert!(audit(dir.path()).is_empty(), "{:?}", audit(dir.path()));
    assert!(
        !marker.exists(),
        "a returned `action: exec:…` ran the command"
    );
    let report = read_report(&dir.path().join("report.json"));
    let seen = alerts(&report);
    assert!(
        seen.contains(&("plain_process".into(), "firing".into())),
        "{seen:?}"
    );
    // The returned control keys are rule errors, naming the rule.
    let errors: Vec<String> = report["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["name"] == "rule_error")
        .map(|a| a["labels"]["rule"].as_str().unwrap_or("").to_string())
        .collect();
    for rule in ["returns_kill", "returns_pid", "returns_exec"] {
        assert!(errors.iter().any(|r| r == rule), "{rule}: {errors:?}");
    }
    target.kill().unwrap();
    target.wait().unwrap();
}

/// A `pid` (or `action`) label cannot be declared: such a rule does not load.
#[test]
fn pid_and_action_labels_are_reserved() {
    let dir = tempfile::tempdir().unwrap();
    for label in ["pid", "action"] {
        let rule = dir.path().join(format!("{label}.rhai"));
        std::fs::write(
            &rule,
            format!(
                "rule(#{{ name: \"x\", labels: #{{ {label}: \"4242\" }}, check: |gpu| true }});\n"
            ),
        )
        .unwrap();
        let out = gpuwatch()
            .args(["check", "--rules", rule.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains(&format!("label `{label}` is reserved")),
            "{err}"
        );
    }
}

/// Issue 11: a SIGHUP that tightens `[actions]` (dry run, nobody allowed) applies at once, also
/// to a ladder already running; the audit log says which policy version each decision used.
#[test]
fn a_reload_that_tightens_the_kill_policy_stops_a_running_ladder() {
    let dir = tempfile::tempdir().unwrap();
    let mut target = runaway();
    let control = dir.path().join("control.toml");
    place_on_gpu(&control, &[target.id()]);
    let cfg = kill_config(dir.path(), false, "", "4s");
    let daemon = kill_daemon(dir.path(), &cfg, &control);
    let start = Instant::now();
    while decisions(&audit(dir.path())).is_empty() {
        assert!(start.elapsed() < Duration::from_secs(15), "no warning");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(decisions(&audit(dir.path())), vec!["warn"]);
    // Tighten: dry run, nobody allowed.
    let text = std::fs::read_to_string(&cfg).unwrap();
    let user_line = text
        .lines()
        .find(|l| l.starts_with("allow_users"))
        .unwrap()
        .to_string();
    let tightened = text
        .replace("dry_run = false", "dry_run = true")
        .replace(&user_line, "allow_users = []");
    std::fs::write(&cfg, tightened).unwrap();
    daemon.signal(libc::SIGHUP);
    // Past the grace period and the term timeout: never signalled.
    std::thread::sleep(Duration::from_secs(6));
    assert!(
        target.try_wait().unwrap().is_none(),
        "killed after the reload: {:?}\n{}",
        audit(dir.path()),
        daemon.log_text()
    );
    let records = audit(dir.path());
    assert_eq!(decisions(&records), vec!["warn", "refused"], "{records:?}");
    assert_eq!(records[0]["policy_version"], 1);
    assert_eq!(records[1]["policy_version"], 2);
    assert!(daemon.log_text().contains("[actions] reloaded"));
    daemon.kill9();
    target.kill().unwrap();
    target.wait().unwrap();
}

/// Issue 11: the ladder signals a process group only when every member passes the policy; a
/// protected sibling in the target's group survives, and the audit log says only the pid was
/// signalled.
#[test]
fn a_protected_member_of_the_targets_group_is_not_signalled() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    // A group leader that ignores SIGTERM, with a sibling `sleep 1001` in its group.
    let mut leader = Command::new("sh")
        .args([
            "-c",
            "trap '' TERM; sleep 1001 & echo ready; exec >/dev/null; while :; do sleep 0.05; done",
        ])
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(leader.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    // The background `sleep` may not have exec'd yet when "ready" arrives: look until it has.
    let find_sibling = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .find(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                cmd == b"sleep\x001001\x00"
                    && stat
                        .rsplit(')')
                        .next()
                        .and_then(|r| r.split_whitespace().nth(2))
                        == Some(&leader.id().to_string())
            })
    };
    let start = Instant::now();
    let sibling = loop {
        if let Some(pid) = find_sibling() {
            break pid;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the sibling in the leader's group"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let control = dir.path().join("control.toml");
    place_on_gpu(&control, &[leader.id()]);
    let cfg = kill_config(
        dir.path(),
        false,
        "protect_commands = [\"^sleep 1001$\"]",
        "500ms",
    );
    let watch = start_watch(dir.path(), &cfg, &control, "4");
    let start = Instant::now();
    while leader.try_wait().unwrap().is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never killed: {:?}",
            audit(dir.path())
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    finish(watch);
    let alive = std::fs::read_to_string(format!("/proc/{sibling}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    });
    // SAFETY: killing our own test child's orphan.
    unsafe { libc::kill(sibling as i32, libc::SIGKILL) };
    assert!(
        alive,
        "the protected sibling was signalled: {:?}",
        audit(dir.path())
    );
    let records = audit(dir.path());
    let term = records
        .iter()
        .find(|r| r["decision"] == "term")
        .expect("a term record");
    let target = term["target"].as_str().unwrap();
    assert!(
        target.contains(&format!("pid {} only", leader.id()))
            && target.contains(&format!("pid {sibling}")),
        "{records:?}"
    );
}

/// Issue 13: `run` records the GPUs while the job runs and ends with a short report and the
/// path of its HTML page (beside the recording in `state_dir/runs/`); `--no-report` skips it.
#[test]
fn run_ends_with_a_report_of_the_gpus() {
    common::sim_lib();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "");
    let out = gpuwatch()
        .args(["--sim", "healthy", "run", "--config", cfg.to_str().unwrap()])
        .args(["--", "sh", "-c", "sleep 2"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("8 GPU(s)"), "{stderr}");
    let html = stderr
        .lines()
        .find_map(|l| l.strip_prefix("gpuwatch: report: "))
        .unwrap_or_else(|| panic!("no report path: {stderr}"));
    let page = std::fs::read_to_string(html).expect("the HTML report");
    assert_eq!(page.matches("<section class=\"gpu\"").count(), 8);
    assert!(
        Path::new(html).starts_with(dir.path().join("state/runs")),
        "{html}"
    );
    let out = gpuwatch()
        .args([
            "--sim",
            "healthy",
            "run",
            "--no-report",
            "--config",
            cfg.to_str().unwrap(),
        ])
        .args(["--", "true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("gpuwatch: report:"), "{stderr}");
}

/// Issue 15 §5: `run --deadline` with a job that slows down: `job_eta` fires, naming the
/// projected end and the deadline. Played 30× faster (`--speed`) so the pace and the rule's hold
/// take seconds.
#[test]
fn job_eta_fires_on_a_slowed_down_job_with_a_deadline() {
    common::sim_lib();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "");
    // A sample a second of the scenario's time (30 a second of wall time): at --speed 30 the
    // helper's 200 ms would be 6.7 ms of wall time, which is refused.
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replace("interval = \"200ms\"", "interval = \"1s\""),
    )
    .unwrap();
    // Five minutes of the job's (faster) clock from now, as a local time of day.
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 300;
    let deadline = Command::new("date")
        .args(["-d", &format!("@{at}"), "+%H:%M:%S"])
        .output()
        .unwrap();
    let deadline = String::from_utf8(deadline.stdout)
        .unwrap()
        .trim()
        .to_string();
    let out = gpuwatch()
        .args(["--sim", "healthy", "--speed", "30", "run", "--no-report"])
        .args(["--config", cfg.to_str().unwrap(), "--deadline", &deadline])
        .args([
            "--",
            "sh",
            "-c",
            "i=0; while [ $i -lt 60 ]; do i=$((i+1)); echo \"step $i/1000\"; \
             if [ $i -gt 20 ]; then sleep 0.1; fi; done",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("[firing] job_eta (info)"))
        .unwrap_or_else(|| panic!("job_eta fired:\n{stderr}"));
    let hhmm = &deadline[..5];
    assert!(
        line.contains("at the current pace step 1000/1000 ends at ")
            && line.contains(&format!("after your {hhmm} deadline")),
        "{line}"
    );
}

/// Issue 15 §3: a Python job stuck on a lock: when `job_stalled` fires, a forensics bundle is
/// collected with the real py-spy (its stack names the stuck frame), the notification carries
/// the top frames and the bundle's path, and the audit log records it.
#[test]
fn a_hung_python_job_yields_a_forensics_bundle_with_its_stack() {
    // .ci/run installs py-spy into its virtualenv (GPUWATCH_PEERS).
    let peer = std::env::var_os("GPUWATCH_PEERS")
        .map(|d| std::path::PathBuf::from(d).join("bin/py-spy"))
        .filter(|p| p.exists());
    let Some(py_spy) = peer.or_else(|| common::installed(&["py-spy"])) else {
        return;
    };
    common::sim_lib();
    let dir = tempfile::tempdir().unwrap();
    let hook = super::notify::servers::HttpReceiver::start();
    let cfg = config(
        dir.path(),
        &format!(
            "[rules.params.job_stalled]\nafter = \"2s\"\n\n\
             [actions.forensics]\npy_spy = {py_spy:?}\n\n\
             [[channel]]\nname = \"hook\"\ntype = \"webhook\"\nurl = \"{}\"\n\n\
             [[route]]\nchannels = [\"hook\"]\n",
            hook.url("/hook")
        ),
    );
    let script = "import threading\nprint('step 1/100', flush=True)\nlock = threading.Lock()\nlock.acquire()\n\
                  def stuck_here():\n    lock.acquire()\nstuck_here()\n";
    let mut child = gpuwatch()
        .args(["--sim", "healthy", "run", "--no-report"])
        .args([
            "--config",
            cfg.to_str().unwrap(),
            "--",
            "python3",
            "-c",
            script,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let root = dir.path().join("state/forensics");
    let start = Instant::now();
    let bundle = loop {
        let found = std::fs::read_dir(&root)
            .ok()
            .and_then(|mut d| d.next())
            .and_then(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.join("README.txt").exists());
        if let Some(b) = found {
            break b;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "no bundle");
        std::thread::sleep(Duration::from_millis(200));
    };
    let stacks = std::fs::read_to_string(bundle.join("stacks.txt")).unwrap();
    assert!(stacks.contains("stuck_here"), "{stacks}");
    let output = std::fs::read_to_string(bundle.join("output.txt")).unwrap();
    assert!(output.contains("step 1/100"), "{output}");
    assert!(std::fs::read_to_string(bundle.join("gpus.txt"))
        .unwrap()
        .contains("GPU 0"));
    assert!(std::fs::read_to_string(bundle.join("processes.txt"))
        .unwrap()
        .contains("python3"));
    // The notification names the stuck frame and the bundle.
    let body = super::notify::servers::wait_until(Duration::from_secs(30), "the notice", || {
        hook.requests().into_iter().map(|r| r.json()).find(|b| {
            b["alerts"][0]["labels"]["alertname"] == "job_stalled"
                && b["alerts"][0]["annotations"]["stacks"].is_string()
        })
    });
    let a = &body["alerts"][0]["annotations"];
    assert!(a["stacks"].as_str().unwrap().contains("stuck_here"), "{a}");
    assert_eq!(a["forensics"].as_str().unwrap(), bundle.to_str().unwrap());
    // The audit log has it.
    let audit = std::fs::read_to_string(dir.path().join("state/kill-audit.jsonl")).unwrap();
    assert!(
        audit.contains("\"decision\":\"forensics\"") && audit.contains("job_stalled"),
        "{audit}"
    );
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("stuck: pid ") && stderr.contains("stuck_here"),
        "{stderr}"
    );
}

/// `nohup gpuwatch run -- …`: a signal ignored when gpuwatch starts stays ignored — it is not
/// caught and forwarded to the job (which inherits the ignore), so closing the terminal does not
/// kill the training it would not have killed without gpuwatch.
#[test]
fn a_signal_ignored_at_start_is_not_forwarded() {
    common::sim_lib();
    let mut cmd = common::command(
        &[
            "--sim",
            "healthy",
            "run",
            "--quiet",
            "--no-report",
            "--",
            "sh",
            "-c",
            "sleep 3; echo alive",
        ],
        &[],
    );
    // SAFETY: only signal(2) between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("alive"),
        "{:?} {stdout} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Issue 25 item 2: `run`'s status file names the job's process and the `run` process, each
/// with its start time; a `run` that starts removes the files of jobs that no longer run (one
/// whose PID is now another process), and keeps those of jobs that do.
#[test]
fn run_records_start_times_and_removes_the_job_file_of_a_reused_pid() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "");
    let jobs = dir.path().join("state/jobs");
    std::fs::create_dir_all(&jobs).unwrap();
    let mut other = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = other.id();
    let start = gpuwatch::sys::live_start_ticks(pid).unwrap();
    let me = std::process::id();
    let my_start = gpuwatch::sys::live_start_ticks(me).unwrap();
    let file = |start: u64| {
        serde_json::json!({
            "pid": pid, "start_ticks": start, "watcher_pid": me,
            "watcher_start_ticks": my_start, "command": "x", "progress": "",
        })
        .to_string()
    };
    // Left by a job that had PID `pid` before the process now there.
    let stale = jobs.join(format!("{pid}.json"));
    std::fs::write(&stale, file(start + 1)).unwrap();
    // A job that runs (the same process and watcher).
    let live = jobs.join("live.json");
    std::fs::write(&live, file(start)).unwrap();
    let out = gpuwatch()
        .args([
            "run",
            "--quiet",
            "--no-report",
            "--config",
            cfg.to_str().unwrap(),
        ])
        .args(["--", "sh", "-c"])
        .arg(format!("sleep 1; cat {}/$$.json", jobs.display()))
        .output()
        .unwrap();
    let _ = other.kill();
    let _ = other.wait();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(!stale.exists(), "the stale file was kept");
    assert!(live.exists(), "a running job's file was removed");
    // The job's own file, as it read it while it ran.
    let own: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let job_pid = own["pid"].as_u64().unwrap();
    assert!(own["start_ticks"].as_u64().is_some(), "{own}");
    assert!(
        own["watcher_pid"].as_u64().is_some_and(|w| w != job_pid),
        "{own}"
    );
    assert!(own["watcher_start_ticks"].as_u64().is_some(), "{own}");
    assert!(
        !jobs.join(format!("{job_pid}.json")).exists(),
        "removed at the end"
    );
}

/// Issue 30 §9 (and issue 25 §4): what the docs promise about `run`'s files holds — read from
/// the docs themselves, 0755 directories an older gpuwatch left included: the report's path as
/// docs/jobs.md shows it (`…/runs/run-<start>-<pid>.html`), the modes it gives `runs/` and the
/// files in it, and those docs/notifications.md gives the
/// directories gpuwatch creates in the state directory and the files it writes there
/// (`baselines/` among them).
#[test]
fn the_docs_promised_paths_and_modes_hold() {
    use std::os::unix::fs::PermissionsExt;
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    let jobs = std::fs::read_to_string(docs.join("jobs.md")).unwrap();
    let notifications = std::fs::read_to_string(docs.join("notifications.md")).unwrap();
    // "gpuwatch: report: /var/lib/gpuwatch/runs/run-20261203T175440Z-4242.html": its name,
    // digits standing for digits.
    let shown = jobs
        .lines()
        .find_map(|l| l.strip_prefix("gpuwatch: report: "))
        .expect("docs/jobs.md shows the report's path");
    let shown_name = shown.rsplit('/').next().unwrap();
    // (a run of digits stands for any digits)
    let shape = |s: &str| -> String {
        let mut out = String::new();
        for c in s.chars() {
            let c = if c.is_ascii_digit() { '9' } else { c };
            if !(c == '9' && out.ends_with('9')) {
                out.push(c);
            }
        }
        out
    };
    // "`runs/` is mode 0700 and the recordings and pages in it 0600"
    let octal = |text: &str, before: &str, n: usize| -> u32 {
        let at = text
            .find(before)
            .unwrap_or_else(|| panic!("the docs say {before:?}"));
        let word = text[at + before.len()..]
            .split(|c: char| !c.is_ascii_digit())
            .filter(|w| w.len() == 4)
            .nth(n)
            .unwrap_or_else(|| panic!("a mode after {before:?}"));
        u32::from_str_radix(word, 8).unwrap()
    };
    let runs_mode = octal(&jobs, "`runs/` is mode ", 0);
    let runs_file_mode = octal(&jobs, "`runs/` is mode ", 1);
    let dir_mode = octal(&notifications, "Directories gpuwatch creates for", 0);
    let file_mode = octal(&notifications, "Directories gpuwatch creates for", 1);

    common::sim_lib();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "");
    let state = dir.path().join("state");
    // (issue 25 §4: directories an older gpuwatch left 0755 are narrowed)
    for d in ["runs", "baselines"] {
        std::fs::create_dir_all(state.join(d)).unwrap();
        std::fs::set_permissions(state.join(d), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = gpuwatch()
        .args(["--sim", "healthy", "run", "--config", cfg.to_str().unwrap()])
        .args(["--", "sh", "-c", "sleep 1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let report = stderr
        .lines()
        .find_map(|l| l.strip_prefix("gpuwatch: report: "))
        .unwrap_or_else(|| panic!("{stderr}"));
    let report = PathBuf::from(report);
    assert!(report.exists(), "{}", report.display());
    assert_eq!(report.parent(), Some(state.join("runs").as_path()));
    let name = report.file_name().unwrap().to_str().unwrap();
    assert_eq!(
        shape(name),
        shape(shown_name),
        "the report is {name}; docs/jobs.md shows {shown_name}"
    );
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&state.join("runs")), runs_mode, "runs/");
    for e in std::fs::read_dir(state.join("runs")).unwrap() {
        let p = e.unwrap().path();
        assert_eq!(mode(&p), runs_file_mode, "{}", p.display());
    }
    let csv = report.with_extension("csv");
    let out = gpuwatch()
        .arg("report")
        .arg(&csv)
        .args(["--config", cfg.to_str().unwrap(), "--save-baseline", "b1"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mode(&state.join("baselines")), dir_mode, "baselines/");
    assert_eq!(mode(&state.join("baselines/b1.json")), file_mode);
}
