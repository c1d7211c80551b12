//! Issue 28: the .deb as an admin takes it. `.ci/run` builds it (`contrib/deb/build.sh`, from
//! the release executable) and names it in `GPUWATCH_DEB`; this test installs it on the machine
//! with dpkg (CI runs as root on a throwaway machine), checks every installed path and mode,
//! verifies the installed unit, runs the package's config and `--sim` as the `gpuwatch` user,
//! writes a channel with `gpuwatch init` that user can read and send with, then removes and
//! purges the package and checks what each leaves.
//!
//! A test binary of its own: cargo runs test binaries one after another, so no other test runs
//! while `/etc/gpuwatch/config.toml` (root's default config) exists. It refuses to touch a
//! machine where a gpuwatch package is already installed, and puts the machine back as it found
//! it (package purged; the `gpuwatch` user removed when the test made it).

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpListener;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// What a command printed, and whether it succeeded.
struct Out {
    ok: bool,
    text: String,
}

fn sh(program: &str, args: &[&str]) -> Out {
    let out = Command::new(program)
        .args(args)
        .env("SYSTEMD_PAGER", "cat")
        .env("SYSTEMD_COLORS", "0")
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    Out {
        ok: out.status.success(),
        text: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// `gpuwatch ARGS` as the `gpuwatch` user, with a bare environment.
fn as_service_user(args: &[&str]) -> Out {
    let mut all = vec![
        "-u",
        "gpuwatch",
        "--",
        "env",
        "-i",
        "HOME=/nonexistent",
        "PATH=/usr/bin:/bin",
        "/usr/bin/gpuwatch",
    ];
    all.extend_from_slice(args);
    sh("runuser", &all)
}

fn installed() -> bool {
    sh("dpkg-query", &["-W", "-f=${Status}", "gpuwatch"])
        .text
        .contains("install ok installed")
}

fn user_exists() -> bool {
    sh("getent", &["passwd", "gpuwatch"]).ok
}

/// Purges the package (and removes the user when the test made it) however the test ends.
struct Restore {
    made_user: bool,
}

impl Drop for Restore {
    fn drop(&mut self) {
        if sh("dpkg-query", &["-W", "gpuwatch"]).ok {
            let _ = sh("dpkg", &["--purge", "gpuwatch"]);
        }
        if self.made_user && user_exists() {
            let _ = sh("userdel", &["gpuwatch"]);
            let _ = sh("groupdel", &["gpuwatch"]);
        }
    }
}

/// (mode & 0o7777, uid, group name) of `path`.
fn owner_mode(path: &str) -> (u32, u32, String) {
    let m = std::fs::metadata(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let group = sh("getent", &["group", &m.gid().to_string()]).text;
    let group = group.split(':').next().unwrap_or_default().to_string();
    (m.permissions().mode() & 0o7777, m.uid(), group)
}

/// A loopback HTTP receiver that answers 200 to every request and hands over each request's
/// first line.
fn receiver() -> (String, std::sync::mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
            let mut reader = BufReader::new(&conn);
            let mut first = String::new();
            if reader.read_line(&mut first).is_err() {
                continue;
            }
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                let lower = line.to_ascii_lowercase();
                if let Some(v) = lower.strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0u8; length];
            let _ = reader.read_exact(&mut body);
            let _ = (&conn)
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
            let _ = tx.send(first.trim().to_string());
        }
    });
    (url, rx)
}

#[test]
fn the_deb_installs_verifies_and_purges_cleanly() {
    let Some(deb) = std::env::var_os("GPUWATCH_DEB").map(PathBuf::from) else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "GPUWATCH_DEB is not set (.ci/run builds the .deb and sets it)"
        );
        eprintln!("SKIP: GPUWATCH_DEB not set (bash contrib/deb/build.sh, then set it)");
        return;
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI runs as root and must install the .deb"
        );
        eprintln!("SKIP: installing a .deb needs root");
        return;
    }
    assert!(
        !installed(),
        "a gpuwatch package is already installed here: the test will not touch it"
    );
    let _restore = Restore {
        made_user: !user_exists(),
    };

    // Install: enabled, not started, the next steps said.
    let install = sh("dpkg", &["--install", deb.to_str().expect("utf-8")]);
    assert!(install.ok, "{}", install.text);
    assert!(installed(), "{}", install.text);
    assert!(
        install.text.contains("enabled, not started"),
        "{}",
        install.text
    );
    assert!(
        !install.text.contains("does not pass"),
        "the installed config passes gpuwatch check: {}",
        install.text
    );

    // Every installed path and mode.
    let expect = [
        ("/usr/bin/gpuwatch", 0o755, "root"),
        ("/usr/share/gpuwatch/rules", 0o755, "root"),
        ("/usr/share/gpuwatch/rules/gpu_lost.rhai", 0o644, "root"),
        ("/usr/lib/systemd/system/gpuwatch.service", 0o644, "root"),
        ("/etc/gpuwatch", 0o755, "root"),
        ("/etc/gpuwatch/config.toml", 0o644, "root"),
        ("/etc/gpuwatch/secrets", 0o750, "gpuwatch"),
        ("/usr/share/doc/gpuwatch/copyright", 0o644, "root"),
        ("/usr/share/doc/gpuwatch/config.example.toml", 0o644, "root"),
        ("/usr/share/doc/gpuwatch/notifications.md", 0o644, "root"),
    ];
    for (path, mode, group) in expect {
        assert_eq!(
            owner_mode(path),
            (mode, 0, group.to_string()),
            "{path}: mode, owner, group"
        );
    }
    let stock = std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("rules"))
        .expect("rules/")
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "rhai"))
        .count();
    let shipped = std::fs::read_dir("/usr/share/gpuwatch/rules")
        .expect("rules")
        .count();
    assert_eq!(shipped, stock, "every stock rule, nothing else");
    let conffiles = sh("dpkg-query", &["-W", "-f=${Conffiles}", "gpuwatch"]).text;
    assert!(
        conffiles.contains("/etc/gpuwatch/config.toml"),
        "{conffiles}"
    );
    let passwd = sh("getent", &["passwd", "gpuwatch"]).text;
    let uid: u32 = passwd.split(':').nth(2).expect("uid").parse().expect("uid");
    assert!(uid < 1000, "a system user: {passwd}");
    assert!(passwd.trim_end().ends_with("/usr/sbin/nologin"), "{passwd}");
    if sh("getent", &["group", "video"]).ok {
        assert!(
            sh("id", &["-nG", "gpuwatch"]).text.contains("video"),
            "in group video"
        );
    }
    let wants = "/etc/systemd/system/multi-user.target.wants/gpuwatch.service";
    assert!(
        std::fs::symlink_metadata(wants).is_ok(),
        "enabled: {wants} (postinst output: {})",
        install.text
    );
    let unit = std::fs::read_to_string("/usr/lib/systemd/system/gpuwatch.service").expect("unit");
    for line in [
        "ExecStart=/usr/bin/gpuwatch daemon --config /etc/gpuwatch/config.toml",
        "User=gpuwatch",
        "AmbientCapabilities=CAP_KILL CAP_SYSLOG",
        "CapabilityBoundingSet=CAP_KILL CAP_SYSLOG",
        "StateDirectory=gpuwatch",
        "ProtectSystem=strict",
    ] {
        assert!(unit.lines().any(|l| l == line), "{line} in the unit");
    }
    let verify = sh(
        "systemd-analyze",
        &["verify", "/usr/lib/systemd/system/gpuwatch.service"],
    );
    assert!(
        verify.ok && verify.text.trim().is_empty(),
        "{}",
        verify.text
    );

    // The package's config and the stock rules, as the daemon's user loads them; the simulated
    // GPUs from the installed executable alone.
    let check = as_service_user(&["check", "--config", "/etc/gpuwatch/config.toml"]);
    assert!(check.ok, "{}", check.text);
    assert!(check.text.contains("gpu_lost"), "{}", check.text);
    let status = as_service_user(&["--sim", "healthy", "status"]);
    assert!(status.ok, "{}", status.text);
    assert!(status.text.contains("8 GPUs"), "{}", status.text);

    // `gpuwatch init` as root writes a channel the service's user can read and send with.
    let (url, got) = receiver();
    let init = sh(
        "/usr/bin/gpuwatch",
        &["init", "--force", "--webhook", &url, "--no-test"],
    );
    assert!(init.ok, "{}", init.text);
    assert!(
        init.text.contains("systemctl restart gpuwatch"),
        "{}",
        init.text
    );
    assert_eq!(
        owner_mode("/etc/gpuwatch/config.toml"),
        (0o640, 0, "gpuwatch".to_string())
    );
    let secret = std::fs::read_dir("/etc/gpuwatch/secrets")
        .expect("secrets")
        .flatten()
        .next()
        .expect("a secret file")
        .path();
    assert_eq!(
        owner_mode(secret.to_str().expect("utf-8")),
        (0o640, 0, "gpuwatch".to_string())
    );
    let sent = as_service_user(&["notify-test", "--config", "/etc/gpuwatch/config.toml"]);
    assert!(sent.ok, "{}", sent.text);
    let first = got
        .recv_timeout(Duration::from_secs(30))
        .expect("the test message");
    assert!(first.starts_with("POST /hook "), "{first}");

    // `service install` does not shadow the package's unit with a root one.
    let shadow = sh("/usr/bin/gpuwatch", &["service", "install"]);
    assert!(!shadow.ok, "{}", shadow.text);
    assert!(
        shadow.text.contains("systemctl enable --now gpuwatch"),
        "{}",
        shadow.text
    );
    assert!(!Path::new("/etc/systemd/system/gpuwatch.service").exists());

    // Remove: the program goes; config, state, logs and the user stay.
    std::fs::create_dir_all("/var/lib/gpuwatch").expect("state dir");
    std::fs::write("/var/lib/gpuwatch/alerts.json", "{}").expect("state");
    let remove = sh("dpkg", &["--remove", "gpuwatch"]);
    assert!(remove.ok, "{}", remove.text);
    for gone in [
        "/usr/bin/gpuwatch",
        "/usr/share/gpuwatch",
        "/usr/lib/systemd/system/gpuwatch.service",
        "/usr/share/doc/gpuwatch",
    ] {
        assert!(!Path::new(gone).exists(), "{gone} is removed");
    }
    for kept in [
        "/etc/gpuwatch/config.toml",
        "/etc/gpuwatch/secrets",
        "/var/lib/gpuwatch/alerts.json",
    ] {
        assert!(Path::new(kept).exists(), "{kept} stays after remove");
    }
    assert!(user_exists());

    // Purge: everything but the system user (Debian keeps those).
    let purge = sh("dpkg", &["--purge", "gpuwatch"]);
    assert!(purge.ok, "{}", purge.text);
    for gone in [
        "/etc/gpuwatch",
        "/var/lib/gpuwatch",
        "/var/log/gpuwatch",
        "/var/cache/gpuwatch",
        wants,
        "/var/lib/systemd/deb-systemd-helper-enabled/gpuwatch.service.dsh-also",
        "/var/lib/systemd/deb-systemd-helper-masked/gpuwatch.service",
    ] {
        assert!(
            std::fs::symlink_metadata(gone).is_err(),
            "{gone} is gone after purge"
        );
    }
    assert!(
        !sh("dpkg-query", &["-W", "gpuwatch"]).ok,
        "dpkg forgets the package"
    );
    assert!(user_exists(), "the system user stays, as Debian does");
}
