//! Issue 28: the paths from install to a first message. `gpuwatch init` writes a config with its
//! secrets in 0600 files and sends a test message to a loopback ntfy-compatible receiver;
//! `gpuwatch service install --user` writes a user unit systemd verifies (no user manager here:
//! it says how to run under nohup or tmux instead); and a release executable copied alone into
//! an empty directory — what `cargo install` or the wheel leaves — runs `--sim` and finds its
//! stock rules (`GPUWATCH_RELEASE_BIN`: `.ci/run`'s `cargo install --path . --root …`).

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{command, gpuwatch};
use crate::notify::servers::HttpReceiver;

/// The environment of a user with a fresh home under `home` (and no systemctl or loginctl on
/// PATH: a test never touches the caller's service manager).
fn fresh_user(home: &Path) -> Vec<(String, String)> {
    let bin = home.join("empty-bin");
    std::fs::create_dir_all(&bin).expect("bin");
    vec![
        ("HOME".into(), home.display().to_string()),
        (
            "XDG_CONFIG_HOME".into(),
            home.join(".config").display().to_string(),
        ),
        (
            "XDG_STATE_HOME".into(),
            home.join(".local/state").display().to_string(),
        ),
        (
            "XDG_CACHE_HOME".into(),
            home.join(".cache").display().to_string(),
        ),
        ("PATH".into(), bin.display().to_string()),
    ]
}

fn envs(v: &[(String, String)]) -> Vec<(&str, &str)> {
    v.iter()
        .map(|(k, val)| (k.as_str(), val.as_str()))
        .collect()
}

#[test]
fn init_writes_a_private_config_and_sends_a_test_message() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let user = fresh_user(tmp.path());
    let env = envs(&user);
    let ntfy = HttpReceiver::start();
    let server = ntfy.url("");
    let server = server.trim_end_matches('/');
    // (--config always: the tests may run as root, whose default is /etc/gpuwatch)
    let config = tmp.path().join(".config/gpuwatch/config.toml");
    let config_s = config.to_str().expect("utf-8");
    let run = gpuwatch(
        &[
            "init",
            "--ntfy",
            "lab-7f3a9c",
            "--ntfy-server",
            server,
            "--non-interactive",
            "--config",
            config_s,
        ],
        &env,
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let got = ntfy.wait_accepted(1, Duration::from_secs(30));
    assert_eq!(got[0].method, "POST");
    assert_eq!(got[0].path, "/lab-7f3a9c", "the test message to the topic");
    let text = std::fs::read_to_string(&config).expect("the config is written");
    assert!(
        !text.contains("lab-7f3a9c"),
        "the topic is a secret:\n{text}"
    );
    assert!(text.contains("url_file = \"secrets/phone-url\""), "{text}");
    let secret = tmp.path().join(".config/gpuwatch/secrets/phone-url");
    let mode = std::fs::metadata(&secret)
        .expect("secret")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{}", secret.display());
    assert!(run.stdout.contains("Next:"), "{}", run.stdout);
    assert!(run.stdout.contains("service install"), "{}", run.stdout);
    let check = gpuwatch(&["check", "--config", config_s], &env);
    assert_eq!(check.code, 0, "{}{}", check.stdout, check.stderr);
    // For a user who is not root it is every command's default config.
    // SAFETY: geteuid has no preconditions.
    let args: &[&str] = if unsafe { libc::geteuid() } == 0 {
        &["notify-test", "--config", config_s]
    } else {
        &["notify-test"]
    };
    let again = gpuwatch(args, &env);
    assert_eq!(again.code, 0, "{}{}", again.stdout, again.stderr);
    assert_eq!(ntfy.wait_accepted(2, Duration::from_secs(30)).len(), 2);
    // Never overwritten without --force.
    let twice = gpuwatch(
        &[
            "init",
            "--ntfy",
            "other",
            "--non-interactive",
            "--config",
            config_s,
        ],
        &env,
    );
    assert_ne!(twice.code, 0);
    assert!(twice.stderr.contains("exists"), "{}", twice.stderr);
    // A secret given as `-` is read from standard input, not the command line.
    let hook = HttpReceiver::start();
    let second = tmp.path().join("second.toml");
    let mut cmd = command(
        &[
            "init",
            "--webhook",
            "-",
            "--config",
            second.to_str().expect("utf-8"),
        ],
        &env,
    );
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("init");
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().expect("stdin");
        writeln!(stdin, "{}", hook.url("/hook")).expect("write");
    }
    let out = child.wait_with_output().expect("init");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        hook.wait_accepted(1, Duration::from_secs(30))[0].path,
        "/hook"
    );
    // Without a channel and without a terminal it says what to pass.
    let none = gpuwatch(&["init", "--config", "/nonexistent/x.toml"], &env);
    assert_ne!(none.code, 0);
    assert!(none.stderr.contains("--ntfy"), "{}", none.stderr);
}

/// On a terminal (tmux) with no channel flag, `init` asks where alerts go, the address, and
/// whether to add the weekly digest; the answers make the config, and the test message goes out.
#[test]
fn init_on_a_terminal_asks_where_alerts_go() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let hook = HttpReceiver::start();
    let config = tmp.path().join("asked.toml");
    let line = format!(
        "env -u GPUWATCH_CONFIG HOME={home} XDG_CACHE_HOME={home}/.cache {exe} init --config {config}; echo EXITED $?; sleep 600",
        home = tmp.path().display(),
        exe = crate::common::gpuwatch_exe().display(),
        config = config.display(),
    );
    let t = crate::top::Tmux::start("init", 120, 40, &line);
    let limit = Duration::from_secs(30);
    t.wait("the menu", limit, |s| s.contains("Choose 1-10"));
    t.keys(&["10", "Enter"]);
    t.wait("the URL", limit, |s| s.contains("URL:"));
    t.keys(&[&hook.url("/hook"), "Enter"]);
    t.wait("the digest question", limit, |s| s.contains("[y/N]"));
    t.keys(&["y", "Enter"]);
    let screen = t.wait("the end", limit, |s| s.contains("EXITED"));
    assert!(screen.contains("EXITED 0"), "{screen}");
    assert_eq!(hook.wait_accepted(1, limit)[0].path, "/hook");
    let text = std::fs::read_to_string(&config).expect("config");
    assert!(text.contains("type = \"webhook\""), "{text}");
    assert!(text.contains("schedule = \"weekly\""), "{text}");
    assert!(
        !text.contains(&hook.url("/hook")),
        "the URL is a secret: {text}"
    );
}

#[test]
fn service_install_user_writes_a_unit_systemd_accepts() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let user = fresh_user(tmp.path());
    let env = envs(&user);
    let missing = gpuwatch(&["service", "install", "--user"], &env);
    assert_ne!(missing.code, 0);
    assert!(
        missing.stderr.contains("gpuwatch init"),
        "{}",
        missing.stderr
    );
    let config = tmp.path().join(".config/gpuwatch/config.toml");
    let made = gpuwatch(
        &[
            "init",
            "--webhook",
            "http://127.0.0.1:9/hook",
            "--no-test",
            "--config",
            config.to_str().expect("utf-8"),
        ],
        &env,
    );
    assert_eq!(made.code, 0, "{}", made.stderr);
    let run = gpuwatch(&["service", "install", "--user"], &env);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let unit = tmp.path().join(".config/systemd/user/gpuwatch.service");
    let text = std::fs::read_to_string(&unit).expect("the unit is written");
    assert!(
        text.contains(&format!(
            "ExecStart={} daemon --config {}",
            crate::common::gpuwatch_exe().display(),
            config.display()
        )),
        "{text}"
    );
    assert!(text.contains("WantedBy=default.target"), "{text}");
    // no user manager here (no systemctl on PATH): how to run it without one
    assert!(run.stdout.contains("nohup"), "{}", run.stdout);
    assert!(run.stdout.contains("tmux"), "{}", run.stdout);
    verify_user_unit(&unit, None);
    // Again: up to date; a changed file is kept unless --force.
    let again = gpuwatch(&["service", "install", "--user"], &env);
    assert!(again.stdout.contains("up to date"), "{}", again.stdout);
    std::fs::write(&unit, "# mine\n").expect("edit");
    let kept = gpuwatch(&["service", "install", "--user"], &env);
    assert_ne!(kept.code, 0);
    assert!(kept.stderr.contains("--force"), "{}", kept.stderr);
    let status = gpuwatch(&["service", "status", "--user"], &env);
    assert_eq!(status.code, 3, "{}", status.stdout);
    let gone = gpuwatch(&["service", "uninstall", "--user"], &env);
    assert_eq!(gone.code, 0, "{}", gone.stderr);
    assert!(!unit.exists());
    assert!(config.exists(), "the config is kept");
    // A system unit needs root (the tests never install one).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        let system = gpuwatch(&["service", "install"], &env);
        assert!(system.stderr.contains("--user"), "{}", system.stderr);
    }
}

/// `systemd-analyze --user verify UNIT` (as `as_user` when given) prints nothing and succeeds;
/// skipped without systemd-analyze outside CI.
fn verify_user_unit(unit: &Path, as_user: Option<&str>) {
    // (under CI a missing one fails: .ci/run installs systemd)
    let Some(analyze) = crate::common::installed(&["systemd-analyze"]) else {
        return;
    };
    // (a user manager's runtime directory, which --user needs even offline)
    let runtime = tempfile::tempdir().expect("tempdir");
    let mut cmd = match as_user {
        Some(name) => {
            chown_to(runtime.path(), name);
            let mut c = Command::new("runuser");
            c.args(["-u", name, "--"]).arg(&analyze);
            c
        }
        None => Command::new(&analyze),
    };
    let out = cmd
        .args(["--user", "verify"])
        .arg(unit)
        .env("SYSTEMD_PAGER", "cat")
        .env("XDG_RUNTIME_DIR", runtime.path())
        .output()
        .expect("systemd-analyze");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && printed.trim().is_empty(),
        "{printed}"
    );
}

/// Gives `path` to user `name` (its own group too).
fn chown_to(path: &Path, name: &str) {
    let ok = Command::new("chown")
        .arg("-R")
        .arg(format!("{name}:"))
        .arg(path)
        .status()
        .expect("chown")
        .success();
    assert!(ok, "chown {name} {}", path.display());
}

/// As a user without root (`nobody`, when the tests run as root, as in CI): `init` then
/// `service install --user` write a user unit that `systemd-analyze --user verify` accepts as
/// that user.
#[test]
fn an_unprivileged_user_installs_a_user_service() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // (the test above is this one for a user who is not root)
        eprintln!("SKIP: not root, so service_install_user_writes_a_unit_systemd_accepts is it");
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let user = fresh_user(tmp.path());
    chown_to(tmp.path(), "nobody");
    let as_nobody = |args: &[&str]| {
        let out = Command::new("runuser")
            .args(["-u", "nobody", "--", "env", "-i"])
            .args(user.iter().map(|(k, v)| format!("{k}={v}")))
            .arg(crate::common::gpuwatch_exe())
            .args(args)
            .current_dir(tmp.path())
            .stdin(Stdio::null())
            .output()
            .expect("runuser");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "gpuwatch {args:?} as nobody: {text}");
        text
    };
    as_nobody(&["init", "--webhook", "http://127.0.0.1:9/hook", "--no-test"]);
    let config = tmp.path().join(".config/gpuwatch/config.toml");
    assert!(config.is_file(), "init wrote the user's own config");
    let said = as_nobody(&["service", "install", "--user"]);
    assert!(said.contains("nohup"), "{said}");
    let unit = tmp.path().join(".config/systemd/user/gpuwatch.service");
    let text = std::fs::read_to_string(&unit).expect("the unit");
    assert!(
        text.contains(&format!("--config {}", config.display())),
        "{text}"
    );
    verify_user_unit(&unit, Some("nobody"));
}

/// The executable copied alone into an empty directory, run with `user`'s environment and
/// nothing else: (exit code, stdout, stderr).
fn alone(
    exe: &Path,
    dir: &Path,
    user: &[(String, String)],
    args: &[&str],
) -> (i32, String, String) {
    let copy = dir.join("bin/gpuwatch");
    if !copy.exists() {
        std::fs::create_dir_all(copy.parent().expect("dir")).expect("dir");
        std::fs::copy(exe, &copy).expect("copy the executable");
    }
    run_as(&copy, dir, user, args)
}

/// `program ARGS` in `dir` with `user`'s environment and nothing else: (exit code, stdout,
/// stderr).
fn run_as(
    program: &Path,
    dir: &Path,
    user: &[(String, String)],
    args: &[&str],
) -> (i32, String, String) {
    let out = Command::new(program)
        .args(args)
        .env_clear()
        .envs(user.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", program.display()));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What `.ci/run` built and named in `var` (the release executable, the wheel); `None` (a
/// SKIP line) outside CI when it is not set, a failure under `CI=true`.
fn built_by_ci(var: &str, how: &str) -> Option<std::ffi::OsString> {
    let v = std::env::var_os(var);
    if v.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{var} is not set (.ci/run builds it and sets it)"
        );
        eprintln!("SKIP: {var} not set ({how}, then set it)");
    }
    v
}

/// Any build carries the stock rules: the executable alone, far from the source tree, writes
/// them once to its cache directory and loads them.
#[test]
fn an_executable_alone_has_its_stock_rules() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let user = fresh_user(tmp.path());
    let (code, out, err) = alone(crate::common::gpuwatch_exe(), tmp.path(), &user, &["check"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("gpu_lost"), "the stock rules: {out}");
    let cache = tmp.path().join(".cache/gpuwatch");
    let written: Vec<String> = std::fs::read_dir(&cache)
        .expect("the cache directory")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        written.iter().any(|n| n.starts_with("stock-rules-")),
        "{written:?}"
    );
    // again: the same directory, nothing rewritten
    let (code, again, _) = alone(crate::common::gpuwatch_exe(), tmp.path(), &user, &["check"]);
    assert_eq!((code, again), (0, out.clone()));
    // A rule slipped in beside them is not loaded: the copy is no longer trusted and is
    // replaced by a fresh one.
    let dir = cache.join(
        written
            .iter()
            .find(|n| n.starts_with("stock-rules-"))
            .expect("the directory"),
    );
    std::fs::write(
        dir.join("slipped.rhai"),
        "rule(#{ name: \"slipped_in\", check: |gpu| { \"x\" } });\n",
    )
    .expect("write beside");
    let (code, third, err) = alone(crate::common::gpuwatch_exe(), tmp.path(), &user, &["check"]);
    assert_eq!(code, 0, "{err}");
    assert!(!third.contains("slipped_in"), "{third}");
    assert_eq!(third, out);
    assert!(!dir.join("slipped.rhai").exists());
}

/// What `cargo install` (or the wheel) leaves: the release executable alone (`.ci/run` installs
/// it with `cargo install --path . --root target/cargo-install`). It names its build and plays a
/// scenario from the simulated library it carries.
#[test]
fn a_release_executable_alone_runs_sim() {
    let Some(release) = built_by_ci(
        "GPUWATCH_RELEASE_BIN",
        "cargo install --path . --root DIR, DIR/bin/gpuwatch",
    ) else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let user = fresh_user(tmp.path());
    let release = PathBuf::from(release);
    let (code, version, _) = alone(&release, tmp.path(), &user, &["--version"]);
    assert_eq!(code, 0);
    assert!(version.contains("simulated NVML embedded"), "{version}");
    assert!(version.contains("commit "), "{version}");
    let (code, out, err) = alone(
        &release,
        tmp.path(),
        &user,
        &["--sim", "overnight", "status"],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("8 GPUs"), "{out}");
    assert!(out.contains("NVIDIA H100"), "{out}");
}

/// The wheel (`GPUWATCH_WHEEL`, built by `.ci/run` with maturin) installed with pip into a
/// fresh virtualenv, offline: `gpuwatch` on the venv's PATH plays a scenario, `python -m
/// gpuwatch` runs it too, and `init` sends its test message to a loopback ntfy receiver.
#[test]
fn the_wheel_puts_gpuwatch_on_a_virtualenvs_path() {
    let Some(wheel) = built_by_ci("GPUWATCH_WHEEL", "maturin build --release") else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let venv = tmp.path().join("venv");
    let ok = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .expect("python3 -m venv");
    assert!(ok.success(), "python3 -m venv");
    let out = Command::new(venv.join("bin/pip"))
        .args([
            "install",
            "--quiet",
            "--no-index",
            "--disable-pip-version-check",
        ])
        .arg(&wheel)
        .output()
        .expect("pip install");
    assert!(
        out.status.success(),
        "pip install {}: {}",
        Path::new(&wheel).display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut user = fresh_user(tmp.path());
    // only the venv's bin on PATH, as an activated venv has it first
    for (k, v) in &mut user {
        if k == "PATH" {
            *v = venv.join("bin").display().to_string();
        }
    }
    let run = |program: &Path, args: &[&str]| run_as(program, tmp.path(), &user, args);
    let gw = venv.join("bin/gpuwatch");
    let (code, out, err) = run(&gw, &["--sim", "overnight", "status"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("8 GPUs"), "{out}");
    let (code, out, err) = run(&venv.join("bin/python"), &["-m", "gpuwatch", "--version"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("simulated NVML embedded"), "{out}");
    let ntfy = HttpReceiver::start();
    let server = ntfy.url("");
    let config = tmp.path().join("c.toml");
    let (code, out, err) = run(
        &gw,
        &[
            "init",
            "--ntfy",
            "wheel-topic",
            "--ntfy-server",
            server.trim_end_matches('/'),
            "--non-interactive",
            "--config",
            config.to_str().expect("utf-8"),
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        ntfy.wait_accepted(1, Duration::from_secs(30))[0].path,
        "/wheel-topic"
    );
}
