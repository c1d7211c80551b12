//! `contrib/gpuwatch.service`: `systemd-analyze verify` must be clean, the offline
//! `systemd-analyze security` exposure must stay at or below [`MAX_EXPOSURE`], and the sandbox
//! must keep allowing what the daemon needs (checked on the unit's text, no systemd needed).
//!
//! Both systemd checks run on a copy of the unit whose `ExecStart` names the gpuwatch binary
//! under test (verify rejects a command that does not exist, and /usr/local/bin/gpuwatch is not
//! installed here); nothing else is changed. Without `systemd-analyze` they print SKIP, except
//! under `CI=true`, where they fail (`.ci/run` installs the `systemd` package when it is missing).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::gpuwatch_exe;

/// The exposure level `systemd-analyze security --offline=yes` gave the unit (systemd 252) when
/// it was hardened; a change that raises it fails here. Lower it when the unit gets tighter.
const MAX_EXPOSURE: f64 = 2.4;

/// `ExecStart=` of the shipped unit up to the arguments, which the copy keeps.
const EXEC_START: &str = "ExecStart=/usr/local/bin/gpuwatch ";

fn unit_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/gpuwatch.service")
}

fn unit_text() -> String {
    let path = unit_path();
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Prints SKIP with `why`, or fails under `CI=true`.
fn skip(why: &str) {
    let msg = format!("SKIP service: {why}");
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}");
    eprintln!("{msg}");
}

/// `systemd-analyze` from `PATH` (or /usr/bin, /bin), when installed.
fn systemd_analyze() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/bin")])
        .map(|dir| dir.join("systemd-analyze"))
        .find(|p| p.is_file());
    if found.is_none() {
        skip(
            "systemd-analyze not found (Debian/Ubuntu: apt-get install systemd); \
             contrib/gpuwatch.service was not verified",
        );
    }
    found
}

fn run(cmd: &mut Command) -> Output {
    cmd.env("SYSTEMD_PAGER", "cat")
        .env("SYSTEMD_COLORS", "0")
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

fn printed(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The unit with `ExecStart` pointing at the gpuwatch binary under test, as
/// `<tempdir>/gpuwatch.service` (systemd takes the unit name from the file name).
fn unit_copy() -> (tempfile::TempDir, PathBuf) {
    let text = unit_text();
    let exe = gpuwatch_exe().to_str().expect("a UTF-8 target path");
    // `%` starts a specifier in unit files; quotes keep a path with spaces one word.
    let exe = format!("\"{}\"", exe.replace('%', "%%"));
    let mut replaced = 0;
    let copy: String = text
        .lines()
        .map(|line| match line.strip_prefix(EXEC_START) {
            Some(args) => {
                replaced += 1;
                format!("ExecStart={exe} {args}\n")
            }
            None => format!("{line}\n"),
        })
        .collect();
    assert_eq!(
        replaced, 1,
        "the unit should have exactly one line starting with {EXEC_START:?}"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gpuwatch.service");
    std::fs::write(&path, copy).expect("writing the unit copy");
    (dir, path)
}

#[test]
fn verify_is_clean() {
    let Some(analyze) = systemd_analyze() else {
        return;
    };
    let (_dir, unit) = unit_copy();
    let out = run(Command::new(&analyze).arg("verify").arg(&unit));
    let text = printed(&out);
    assert!(
        out.status.success() && text.trim().is_empty(),
        "systemd-analyze verify contrib/gpuwatch.service ({}):\n{text}",
        out.status
    );
}

/// The systemd version (`systemd 252 (252.38-1~deb12u1)` → 252).
fn systemd_version(analyze: &Path) -> Option<u32> {
    let out = run(Command::new(analyze).arg("--version"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split_whitespace().nth(1)?.parse().ok()
}

/// The number in `→ Overall exposure level for gpuwatch.service: 2.4 OK 🙂`.
fn overall_exposure(report: &str) -> Option<f64> {
    let (_, rest) = report.split_once("Overall exposure level for gpuwatch.service:")?;
    rest.split_whitespace().next()?.parse().ok()
}

#[test]
fn security_exposure_stays_low() {
    let Some(analyze) = systemd_analyze() else {
        return;
    };
    // `security --offline` came with systemd 250.
    let version = systemd_version(&analyze);
    if version.is_none_or(|v| v < 250) {
        skip(&format!(
            "systemd-analyze {version:?} has no `security --offline` (needs systemd 250 or later)"
        ));
        return;
    }
    let (_dir, unit) = unit_copy();
    let out = run(Command::new(&analyze)
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(&unit));
    let text = printed(&out);
    assert!(
        out.status.success(),
        "systemd-analyze security --offline=yes ({}):\n{text}",
        out.status
    );
    let exposure = overall_exposure(&text)
        .unwrap_or_else(|| panic!("no overall exposure level in the report:\n{text}"));
    eprintln!("contrib/gpuwatch.service: exposure {exposure} (systemd {version:?}, at most {MAX_EXPOSURE})");
    assert!(
        exposure <= MAX_EXPOSURE,
        "contrib/gpuwatch.service exposure {exposure} is above {MAX_EXPOSURE}: a setting was \
         loosened (systemd {version:?}):\n{text}"
    );
}

/// `Key=value` assignments of the `[Service]` section, in order.
fn service_settings(text: &str) -> Vec<(String, String)> {
    let mut section = "";
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
        } else if section == "[Service]" && !line.starts_with('#') && !line.starts_with(';') {
            if let Some((k, v)) = line.split_once('=') {
                out.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
    }
    out
}

/// Every value of `key`, split into words.
fn words(settings: &[(String, String)], key: &str) -> Vec<String> {
    settings
        .iter()
        .filter(|(k, _)| k == key)
        .flat_map(|(_, v)| v.split_whitespace().map(str::to_string))
        .collect()
}

#[test]
fn sandbox_keeps_what_the_daemon_needs() {
    let settings = service_settings(&unit_text());
    let set = |key: &str| settings.iter().any(|(k, _)| k == key);

    // Each of these would lower the exposure score and break the daemon.
    for (key, why) in [
        (
            "PrivateNetwork",
            "webhooks, SMTP and the heartbeat need the network",
        ),
        ("IPAddressDeny", "channels may send to any address"),
        (
            "PrivateUsers",
            "kills and owner checks need other users' real uids",
        ),
        ("PrivateDevices", "it hides /dev/nvidia*"),
        ("ProtectProc", "the daemon reads other users' /proc/PID"),
        ("ProcSubset", "NVML reads /proc/driver/nvidia"),
        ("DynamicUser", "the daemon runs as root (state dir, kills)"),
    ] {
        assert!(!set(key), "{key}= must not be set: {why}");
    }

    let caps = words(&settings, "CapabilityBoundingSet");
    assert!(
        caps.iter().any(|c| c == "CAP_KILL"),
        "CapabilityBoundingSet must keep CAP_KILL ([actions.kill]): {caps:?}"
    );

    let devices = words(&settings, "DeviceAllow");
    for name in ["char-nvidia-frontend", "char-nvidia", "char-nvidiactl"] {
        assert!(
            devices.iter().any(|d| d == name),
            "DeviceAllow must list {name} (/dev/nvidia*): {devices:?}"
        );
    }

    let families = words(&settings, "RestrictAddressFamilies");
    for family in ["AF_UNIX", "AF_INET", "AF_INET6"] {
        assert!(
            families.iter().any(|f| f == family),
            "RestrictAddressFamilies must allow {family}: {families:?}"
        );
    }

    let filter = words(&settings, "SystemCallFilter");
    assert!(
        filter.iter().any(|f| f == "@system-service"),
        "SystemCallFilter must allow @system-service (kill, ioctl, exec): {filter:?}"
    );

    // The daemon's default state_dir, and every absolute state_dir / audit_log path that
    // config.example.toml shows (set or commented out), must be writable under the sandbox.
    let mut writable: Vec<PathBuf> = words(&settings, "ReadWritePaths")
        .iter()
        .map(|p| PathBuf::from(p.trim_start_matches(['-', '+'])))
        .collect();
    for (key, base) in [
        ("StateDirectory", "/var/lib"),
        ("LogsDirectory", "/var/log"),
        ("CacheDirectory", "/var/cache"),
        ("RuntimeDirectory", "/run"),
    ] {
        writable.extend(
            words(&settings, key)
                .iter()
                .map(|d| Path::new(base).join(d.split(':').next().unwrap_or(d))),
        );
    }
    let example_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config.example.toml");
    let example = std::fs::read_to_string(&example_path).expect("config.example.toml");
    let mut paths = vec![gpuwatch::config::DaemonSection::default().state_dir];
    for line in example.lines() {
        let line = line.trim_start_matches(['#', ' ']);
        for key in ["state_dir", "audit_log"] {
            let Some(value) = line
                .strip_prefix(key)
                .and_then(|r| r.trim_start().strip_prefix('='))
            else {
                continue;
            };
            let value = value.trim().trim_matches('"');
            if value.starts_with('/') {
                paths.push(PathBuf::from(value));
            }
        }
    }
    assert!(
        paths.len() >= 3,
        "found only {paths:?} in config.example.toml"
    );
    for p in &paths {
        assert!(
            writable.iter().any(|w| p.starts_with(w)),
            "{} (config.example.toml / the default state_dir) is not writable under the unit \
             (writable: {writable:?})",
            p.display()
        );
    }
}

#[test]
fn exposure_line_parses() {
    assert_eq!(
        overall_exposure("x\n→ Overall exposure level for gpuwatch.service: 2.4 OK 🙂\n"),
        Some(2.4)
    );
    assert_eq!(overall_exposure("nothing"), None);
}
