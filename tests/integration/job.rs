//! `gpuwatch run` and `gpuwatch attach` against real processes: exit codes, signals, crash
//! classes, byte-exact pass-through, tee, progress from output and from a followed log file.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn gpuwatch() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpuwatch"));
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

#[test]
fn signal_exit_is_128_plus_signal() {
    let dir = tempfile::tempdir().unwrap();
    let (out, report) = run_sh(dir.path(), "kill -TERM $$", &["--quiet"]);
    assert_eq!(out.status.code(), Some(143));
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
    assert_eq!(out.status.code(), Some(137));
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
    assert_eq!(out.status.code(), Some(130));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(report["crash_detail"], "SIGINT forwarded by gpuwatch");
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
fn run_without_command_is_a_usage_error() {
    let out = gpuwatch().arg("run").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}
