//! `gpuwatch service install|status|uninstall [--user]`: the daemon as a systemd service.
//!
//! `--user` is for people without root on a shared lab server: a systemd *user* unit in
//! `$XDG_CONFIG_HOME/systemd/user/` running `gpuwatch daemon` with the user's config
//! (`$XDG_CONFIG_HOME/gpuwatch/config.toml`, written by `gpuwatch init`), enabled and started
//! through `systemctl --user`. A user service stops at logout unless lingering is on, so install
//! says how to turn it on when it is off. Without a systemd user manager (a container, a
//! non-systemd distribution) the unit is still written and install says how to run the daemon
//! under `nohup` or tmux instead.
//!
//! Without `--user`, as root: the hardened system unit of `contrib/gpuwatch.service` (carried in
//! the executable) in `/etc/systemd/system/`, with this executable in `ExecStart`.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::GlobalArgs;

/// Arguments of `service`.
#[derive(Debug, clap::Args)]
pub struct ServiceArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: ServiceAction,
}

/// `service` actions.
#[derive(Debug, clap::Subcommand)]
pub enum ServiceAction {
    /// Write the unit, enable it and start it.
    Install(InstallArgs),
    /// Whether the unit is installed, enabled and running.
    Status(Scope),
    /// Stop and disable the unit and remove its file (the state directory is kept).
    Uninstall(Scope),
}

/// Which service manager: the user's (`--user`) or the system's.
#[derive(Debug, Clone, clap::Args)]
pub struct Scope {
    /// A systemd user unit for the calling user (no root needed).
    #[arg(long)]
    pub user: bool,
}

/// Arguments of `service install`.
#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    #[command(flatten)]
    pub scope: Scope,
    /// The configuration the daemon runs with [default: the user's
    /// $XDG_CONFIG_HOME/gpuwatch/config.toml with --user, else /etc/gpuwatch/config.toml].
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Enable the unit but do not start it now.
    #[arg(long)]
    pub no_start: bool,
    /// Replace a unit file that differs from the one this would write.
    #[arg(long)]
    pub force: bool,
}

/// The unit's file name.
const UNIT: &str = "gpuwatch.service";

/// Where the .deb puts its unit (`contrib/deb/build.sh`).
const PACKAGED_UNIT: &str = "/usr/lib/systemd/system/gpuwatch.service";

/// The hardened system unit (`contrib/gpuwatch.service`).
const SYSTEM_UNIT: &str = include_str!("../../contrib/gpuwatch.service");

/// The user's configuration directory: `$XDG_CONFIG_HOME`, else `~/.config`.
pub fn user_config_home() -> anyhow::Result<PathBuf> {
    crate::sys::xdg_home("XDG_CONFIG_HOME", ".config")
        .ok_or_else(|| anyhow::anyhow!("HOME is not set: cannot find your configuration directory"))
}

/// The user's gpuwatch config: `$XDG_CONFIG_HOME/gpuwatch/config.toml`.
pub fn user_config_path() -> anyhow::Result<PathBuf> {
    Ok(user_config_home()?.join("gpuwatch/config.toml"))
}

/// Where the unit file goes.
fn unit_path(user: bool) -> anyhow::Result<PathBuf> {
    Ok(if user {
        user_config_home()?.join("systemd/user").join(UNIT)
    } else {
        PathBuf::from("/etc/systemd/system").join(UNIT)
    })
}

/// A path as systemd reads it in `ExecStart=` (quoted when it has a space).
fn unit_arg(p: &Path) -> anyhow::Result<String> {
    let s = p
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("{} is not UTF-8: systemd cannot run it", p.display()))?;
    if s.chars()
        .any(|c| c.is_control() || c == '"' || c == '\\' || c == '%' || c == '$')
    {
        anyhow::bail!("{s:?}: a path with quotes, backslashes, % or $ cannot go into a unit file");
    }
    Ok(if s.contains(' ') {
        format!("\"{s}\"")
    } else {
        s.to_string()
    })
}

/// Whether only root can change `path` (asked as root, of this executable's resolved path): it
/// and every directory above it root's own and writable by no one else
/// ([`crate::sys::owned_private`]); else which one is not.
fn root_only(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let Some(open) = path
        .ancestors()
        .filter(|p| !p.as_os_str().is_empty())
        .find(|p| !crate::sys::owned_private(p))
    else {
        return Ok(());
    };
    Err(match std::fs::symlink_metadata(open) {
        Ok(m) => format!(
            "{} is owned by uid {} with mode {:o}",
            open.display(),
            m.uid(),
            m.mode() & 0o7777
        ),
        Err(e) => format!("{}: {e}", open.display()),
    })
}

/// The user unit's text.
pub fn user_unit(exe: &Path, config: &Path) -> anyhow::Result<String> {
    let secrets = config.with_file_name("secrets.env");
    Ok(format!(
        "# gpuwatch as a systemd user service, written by `gpuwatch service install --user`.\n\
         # Status: gpuwatch service status --user   Logs: journalctl --user -u gpuwatch\n\
         # Reload config and rules: systemctl --user reload gpuwatch   Remove: gpuwatch service uninstall --user\n\
         # Secrets (webhook URLs, tokens): KEY=value lines in {secrets} (mode 0600), named by\n\
         # url_env / token_env / password_env in the config.\n\
         [Unit]\n\
         Description=gpuwatch GPU watchdog (user service)\n\
         After=network-online.target\n\
         \n\
         [Service]\n\
         Type=simple\n\
         ExecStart={exe} daemon --config {config}\n\
         ExecReload=/bin/kill -HUP $MAINPID\n\
         EnvironmentFile=-{secrets_file}\n\
         Environment=GPUWATCH_LOG=info\n\
         Restart=on-failure\n\
         RestartSec=5s\n\
         KillSignal=SIGTERM\n\
         TimeoutStopSec=30s\n\
         UMask=0077\n\
         NoNewPrivileges=yes\n\
         \n\
         [Install]\n\
         WantedBy=default.target\n",
        exe = unit_arg(exe)?,
        config = unit_arg(config)?,
        secrets = unit_arg(&secrets)?,
        // (EnvironmentFile= takes the rest of the line as the path: no quotes)
        secrets_file = secrets.display(),
    ))
}

/// The system unit's text: the shipped one with this executable and `config` in `ExecStart`.
fn system_unit(exe: &Path, config: &Path) -> anyhow::Result<String> {
    let exec = format!(
        "ExecStart={} daemon --config {}",
        unit_arg(exe)?,
        unit_arg(config)?
    );
    Ok(SYSTEM_UNIT
        .lines()
        .map(|l| {
            if l.starts_with("ExecStart=") {
                exec.as_str()
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n")
}

/// `systemctl [--user] ARGS`: whether it succeeded, and what it printed.
fn systemctl(user: bool, args: &[&str]) -> (bool, String) {
    let mut cmd = Command::new("systemctl");
    if user {
        cmd.arg("--user");
    }
    match cmd.args(args).output() {
        Ok(o) => (
            o.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        ),
        Err(e) => (false, format!("systemctl: {e}")),
    }
}

/// Whether a systemd manager of this scope answers.
fn manager_running(user: bool) -> bool {
    if user {
        systemctl(true, &["show-environment"]).0
    } else {
        Path::new("/run/systemd/system").is_dir()
    }
}

/// What to do without a systemd user manager.
fn without_systemd(exe: &Path, config: &Path) -> String {
    let (exe, config) = (exe.display(), config.display());
    format!(
        "No systemd user manager answers here (a container, or a system without systemd): the unit \
         is written but cannot be started. Run the daemon in the background instead:\n\
         \x20 nohup {exe} daemon --config {config} >> ~/gpuwatch.log 2>&1 &\n\
         or in a tmux session that outlives your login:\n\
         \x20 tmux new-session -d -s gpuwatch '{exe} daemon --config {config}'\n\
         (either stops at a reboot: start it again from your crontab with @reboot)"
    )
}

/// Runs `service`.
pub fn service(_global: &GlobalArgs, args: &ServiceArgs) -> anyhow::Result<i32> {
    match &args.action {
        ServiceAction::Install(a) => install(a),
        ServiceAction::Status(s) => status(s.user),
        ServiceAction::Uninstall(s) => uninstall(s.user),
    }
}

fn check_scope(user: bool) -> anyhow::Result<()> {
    if !user && !crate::sys::is_root() {
        anyhow::bail!(
            "a system service needs root: run `sudo gpuwatch service install`, or \
             `gpuwatch service install --user` for a service of your own (no root needed)"
        );
    }
    Ok(())
}

fn install(a: &InstallArgs) -> anyhow::Result<i32> {
    let user = a.scope.user;
    check_scope(user)?;
    // The .deb's unit (run as the gpuwatch user) is already there: one written to /etc would
    // shadow it with a root one.
    let packaged = Path::new(PACKAGED_UNIT);
    if !user && packaged.is_file() && !a.force {
        anyhow::bail!(
            "the gpuwatch package installed {}: `systemctl enable --now gpuwatch` starts it       (--force writes a root unit to /etc/systemd/system that takes its place)",
            packaged.display()
        );
    }
    let exe = std::env::current_exe()
        .map_err(|e| anyhow::anyhow!("cannot find this executable's path: {e}"))?;
    let config = match &a.config {
        Some(c) => std::path::absolute(c)?,
        None if user => user_config_path()?,
        None => PathBuf::from("/etc/gpuwatch/config.toml"),
    };
    if !config.is_file() {
        anyhow::bail!(
            "no configuration at {}: write one with `gpuwatch init{}` first (or name one with --config)",
            config.display(),
            if user { "" } else { " (as root)" }
        );
    }
    // The daemon would refuse a bad config or rule at every start: refuse them now (this also
    // puts the built-in stock rules in place when they come from the executable).
    if let Err(errors) = crate::config::Setup::load(Some(&config), &[]) {
        anyhow::bail!("{errors}");
    }
    let text = if user {
        user_unit(&exe, &config)?
    } else {
        // systemd would run it as root at every start: only root may be able to change it
        if let Err(why) = root_only(&exe) {
            anyhow::bail!(
                "the unit would run {} as root, but {why}: put gpuwatch where only root writes \
                 (e.g. `sudo install -m 0755 {} /usr/local/bin/`) and run that one's \
                 `service install`",
                exe.display(),
                exe.display()
            );
        }
        system_unit(&exe, &config)?
    };
    let path = unit_path(user)?;
    match std::fs::read_to_string(&path) {
        Ok(old) if old == text => println!("{} is already up to date", path.display()),
        Ok(_) if !a.force => anyhow::bail!(
            "{} exists and differs from the unit this would write: --force replaces it",
            path.display()
        ),
        _ => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            crate::sys::write_atomic(&path, text.as_bytes())
                .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
            println!("wrote {}", path.display());
        }
    }
    let scope = if user { " --user" } else { "" };
    if !manager_running(user) {
        println!("{}", without_systemd(&exe, &config));
        return Ok(0);
    }
    let (ok, out) = systemctl(user, &["daemon-reload"]);
    if !ok {
        anyhow::bail!("systemctl{scope} daemon-reload failed: {}", out.trim());
    }
    let mut enable = vec!["enable"];
    if !a.no_start {
        enable.push("--now");
    }
    enable.push(UNIT);
    let (ok, out) = systemctl(user, &enable);
    if !ok {
        anyhow::bail!(
            "systemctl{scope} {} failed: {}",
            enable.join(" "),
            out.trim()
        );
    }
    if !a.no_start {
        // `enable --now` succeeds even when the daemon dies at once (a bad secret file, no
        // NVML): look again once it had time to fail
        std::thread::sleep(std::time::Duration::from_secs(2));
        let (active, state) = systemctl(user, &["is-active", UNIT]);
        if !active {
            anyhow::bail!(
                "gpuwatch.service was enabled but is not running ({}): see journalctl{scope} -u gpuwatch",
                state.trim()
            );
        }
    }
    println!(
        "{} gpuwatch.service{}",
        if a.no_start {
            "enabled"
        } else {
            "enabled and running"
        },
        if user { " (user service)" } else { "" }
    );
    if user {
        println!("{}", linger_advice());
    }
    println!(
        "Next: gpuwatch service status{scope}   logs: journalctl{scope} -u gpuwatch -f   \
         a test message: gpuwatch notify-test --config {}",
        config.display()
    );
    Ok(0)
}

/// Whether the user's services outlive their logins, and what to do when they do not.
fn linger_advice() -> String {
    let user = std::env::var("USER").unwrap_or_default();
    let out = Command::new("loginctl")
        .args(["show-user", &user, "--property=Linger", "--value"])
        .output();
    match out {
        Ok(o) if String::from_utf8_lossy(&o.stdout).trim() == "yes" => {
            "Lingering is on: the service runs without you logged in, and starts at boot.".into()
        }
        _ => format!(
            "Lingering is off: the service stops when you log out and does not start at boot. \
             Ask an admin once for: sudo loginctl enable-linger {user}"
        ),
    }
}

fn status(user: bool) -> anyhow::Result<i32> {
    let path = unit_path(user)?;
    let scope = if user { " --user" } else { "" };
    if !path.is_file() {
        println!(
            "not installed ({} does not exist): gpuwatch service install{scope}",
            path.display()
        );
        return Ok(3);
    }
    println!("unit: {}", path.display());
    if !manager_running(user) {
        println!("no systemd{scope} manager answers here: the unit cannot run under it");
        return Ok(3);
    }
    let (_, enabled) = systemctl(user, &["is-enabled", UNIT]);
    let (active, state) = systemctl(user, &["is-active", UNIT]);
    println!("enabled: {}", enabled.trim());
    println!("active: {}", state.trim());
    if user {
        println!("{}", linger_advice());
    }
    Ok(if active { 0 } else { 3 })
}

fn uninstall(user: bool) -> anyhow::Result<i32> {
    check_scope(user)?;
    let path = unit_path(user)?;
    if manager_running(user) {
        let _ = systemctl(user, &["disable", "--now", UNIT]);
    }
    match std::fs::remove_file(&path) {
        Ok(()) => println!("removed {}", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!("{} was not installed", path.display());
        }
        Err(e) => anyhow::bail!("removing {}: {e}", path.display()),
    }
    if manager_running(user) {
        let _ = systemctl(user, &["daemon-reload"]);
    }
    println!("the configuration and the state directory (alert state, outbox) are kept");
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_unit_runs_this_executable_with_the_config() {
        let t = system_unit(Path::new("/opt/gw/bin/gpuwatch"), Path::new("/etc/gw.toml")).unwrap();
        assert!(t.contains("\nExecStart=/opt/gw/bin/gpuwatch daemon --config /etc/gw.toml\n"));
        assert_eq!(t.matches("ExecStart=").count(), 1);
        assert!(t.contains("CapabilityBoundingSet=CAP_KILL CAP_SYSLOG"));
    }

    #[test]
    fn unit_paths_with_spaces_are_quoted_and_odd_ones_refused() {
        let t = user_unit(
            Path::new("/home/a b/gpuwatch"),
            Path::new("/home/a b/c.toml"),
        )
        .unwrap();
        assert!(t.contains("ExecStart=\"/home/a b/gpuwatch\" daemon --config \"/home/a b/c.toml\""));
        assert!(user_unit(Path::new("/x/%h/gpuwatch"), Path::new("/c")).is_err());
        assert!(user_unit(Path::new("/x/gpu\"watch"), Path::new("/c")).is_err());
    }
}
