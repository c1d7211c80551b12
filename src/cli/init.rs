//! `gpuwatch init`: from install to a first message in a minute. Asks (on a terminal) where
//! alerts should go and the address, writes a minimal commented config in the right place
//! (`/etc/gpuwatch/config.toml` as root, `$XDG_CONFIG_HOME/gpuwatch/config.toml` otherwise) with
//! every secret — a webhook URL, an ntfy topic, a bot token — in its own 0600 file beside it,
//! sends a test message, and says what to run next. With flags (`--ntfy TOPIC`, `--slack URL`,
//! …) it asks nothing; a flag's value `-` is read from standard input, so a secret need not
//! appear on a command line or in shell history.

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};

use super::GlobalArgs;

/// Arguments of `init`.
#[derive(Debug, clap::Args)]
pub struct InitArgs {
    /// ntfy topic to publish alerts to (the phone app subscribes to it; on a public server the
    /// topic name is the password: pick a long random one).
    #[arg(long, value_name = "TOPIC")]
    pub ntfy: Option<String>,
    /// The ntfy server.
    #[arg(long, value_name = "URL", default_value = "https://ntfy.sh")]
    pub ntfy_server: String,
    /// Slack incoming-webhook URL.
    #[arg(long, value_name = "URL", alias = "slack-url")]
    pub slack: Option<String>,
    /// Discord webhook URL.
    #[arg(long, value_name = "URL", alias = "discord-url")]
    pub discord: Option<String>,
    /// Microsoft Teams workflow URL ("When a Teams webhook request is received").
    #[arg(long, value_name = "URL", alias = "teams-url")]
    pub teams: Option<String>,
    /// Feishu / Lark custom bot webhook URL.
    #[arg(long, value_name = "URL", alias = "feishu-url")]
    pub feishu: Option<String>,
    /// DingTalk robot webhook URL.
    #[arg(long, value_name = "URL", alias = "dingtalk-url")]
    pub dingtalk: Option<String>,
    /// WeCom (企业微信) group robot webhook URL.
    #[arg(long, value_name = "URL", alias = "wecom-url")]
    pub wecom: Option<String>,
    /// Generic webhook URL (Alertmanager's webhook format).
    #[arg(long, value_name = "URL", alias = "webhook-url")]
    pub webhook: Option<String>,
    /// Telegram bot token (with --telegram-chat).
    #[arg(long, value_name = "TOKEN", requires = "telegram_chat")]
    pub telegram_token: Option<String>,
    /// Telegram chat id (a number, or @channelname).
    #[arg(long, value_name = "ID", requires = "telegram_token")]
    pub telegram_chat: Option<String>,
    /// E-mail address to send alerts to (with --smtp).
    #[arg(long, value_name = "ADDRESS", requires = "smtp")]
    pub email: Option<String>,
    /// SMTP relay, host[:port] (STARTTLS; add username and password_file to the config for
    /// AUTH).
    #[arg(long, value_name = "HOST[:PORT]")]
    pub smtp: Option<String>,
    /// Also send a weekly usage digest (who used the GPUs, idle hours, energy).
    #[arg(long)]
    pub digest: bool,
    /// Where to write the config [default: /etc/gpuwatch/config.toml as root, else
    /// $XDG_CONFIG_HOME/gpuwatch/config.toml].
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Replace an existing config (and its secret files).
    #[arg(long)]
    pub force: bool,
    /// Ask nothing (the default when standard input is not a terminal).
    #[arg(long)]
    pub non_interactive: bool,
    /// Do not send the test message.
    #[arg(long)]
    pub no_test: bool,
}

/// One channel as written: its type, the config keys that are not secret, and the secret
/// (written to `secrets/NAME`, named by `KEY_file`).
struct Channel {
    kind: &'static str,
    /// (key, TOML value) pairs.
    plain: Vec<(&'static str, String)>,
    /// (key, secret value), each written to its own 0600 file.
    secrets: Vec<(&'static str, String)>,
    /// How the user will recognise it in messages ("ntfy topic …").
    what: String,
}

/// The menu of the interactive question, in order: (answer, type, what to ask for).
const MENU: &[(&str, &str, &str)] = &[
    (
        "1",
        "ntfy",
        "an ntfy topic (the ntfy phone app, no account needed)",
    ),
    ("2", "slack", "a Slack incoming-webhook URL"),
    ("3", "discord", "a Discord webhook URL"),
    ("4", "telegram", "a Telegram bot token and chat id"),
    ("5", "email", "an e-mail address and an SMTP relay"),
    ("6", "feishu", "a Feishu / Lark bot webhook URL"),
    ("7", "dingtalk", "a DingTalk robot webhook URL"),
    ("8", "wecom", "a WeCom group robot webhook URL"),
    ("9", "teams", "a Microsoft Teams workflow URL"),
    (
        "10",
        "webhook",
        "a generic webhook URL (Alertmanager format)",
    ),
];

/// A flag's value: `-` reads one line from standard input.
fn value(v: &str, what: &str) -> anyhow::Result<String> {
    if v != "-" {
        return Ok(v.trim().to_string());
    }
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let line = line.trim().to_string();
    if line.is_empty() {
        anyhow::bail!("{what}: nothing on standard input");
    }
    Ok(line)
}

fn ask(prompt: &str) -> anyhow::Result<String> {
    eprint!("{prompt}");
    std::io::stderr().flush()?;
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line)? == 0 {
        anyhow::bail!("no answer (end of input)");
    }
    Ok(line.trim().to_string())
}

fn url_channel(kind: &'static str, url: String) -> anyhow::Result<Channel> {
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        anyhow::bail!("{kind}: {url:?} is not an http(s) URL");
    }
    // (the host only: never a user:password@ part, which is as secret as the rest)
    let host = url
        .split("://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .map(|h| h.rsplit('@').next().unwrap_or(h))
        .unwrap_or_default()
        .to_string();
    Ok(Channel {
        kind,
        plain: Vec::new(),
        secrets: vec![("url", url)],
        what: format!("{kind} webhook at {host}"),
    })
}

fn ntfy_channel(server: &str, topic: String) -> anyhow::Result<Channel> {
    if topic.is_empty()
        || topic
            .chars()
            .any(|c| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
    {
        anyhow::bail!("ntfy topic {topic:?}: letters, digits, - and _ only");
    }
    let server = server.trim_end_matches('/');
    Ok(Channel {
        kind: "ntfy",
        plain: Vec::new(),
        secrets: vec![("url", format!("{server}/{topic}"))],
        // (not the topic: on a public server it is the password)
        what: format!("an ntfy topic on {server}"),
    })
}

fn email_channel(to: String, smtp: String) -> anyhow::Result<Channel> {
    if !to.contains('@') {
        anyhow::bail!("{to:?} is not an e-mail address");
    }
    let host = crate::sys::hostname();
    Ok(Channel {
        kind: "email",
        plain: vec![
            ("smtp", toml_str(&smtp)),
            ("from", toml_str(&format!("gpuwatch@{host}"))),
            ("to", format!("[{}]", toml_str(&to))),
        ],
        secrets: Vec::new(),
        what: format!("e-mail to {to} through {smtp}"),
    })
}

fn telegram_channel(token: String, chat: String) -> Channel {
    let chat_value = if chat.parse::<i64>().is_ok() {
        chat.clone()
    } else {
        toml_str(&chat)
    };
    Channel {
        kind: "telegram",
        plain: vec![("chat_id", chat_value)],
        secrets: vec![("token", token)],
        what: format!("Telegram chat {chat}"),
    }
}

/// A TOML string literal.
fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// The channels the flags name.
fn from_flags(a: &InitArgs) -> anyhow::Result<Vec<Channel>> {
    let mut out = Vec::new();
    if let Some(t) = &a.ntfy {
        out.push(ntfy_channel(&a.ntfy_server, value(t, "--ntfy")?)?);
    }
    for (kind, v) in [
        ("slack", &a.slack),
        ("discord", &a.discord),
        ("teams", &a.teams),
        ("feishu", &a.feishu),
        ("dingtalk", &a.dingtalk),
        ("wecom", &a.wecom),
        ("webhook", &a.webhook),
    ] {
        if let Some(v) = v {
            out.push(url_channel(kind, value(v, kind)?)?);
        }
    }
    if let (Some(t), Some(c)) = (&a.telegram_token, &a.telegram_chat) {
        out.push(telegram_channel(value(t, "--telegram-token")?, c.clone()));
    }
    if let (Some(to), Some(smtp)) = (&a.email, &a.smtp) {
        out.push(email_channel(to.clone(), smtp.clone())?);
    }
    Ok(out)
}

/// The three questions (on a terminal).
fn interview(a: &InitArgs) -> anyhow::Result<(Channel, bool)> {
    eprintln!("Where should gpuwatch send alerts?");
    for (n, _, what) in MENU {
        eprintln!("  {n:>2}) {what}");
    }
    let pick = ask("Choose 1-10 [1]: ")?;
    let pick = if pick.is_empty() {
        "1".to_string()
    } else {
        pick
    };
    let Some((_, kind, _)) = MENU.iter().find(|(n, k, _)| *n == pick || *k == pick) else {
        anyhow::bail!("{pick:?} is not one of 1-10");
    };
    let channel = match *kind {
        "ntfy" => {
            let suggested = format!(
                "gpuwatch-{}",
                crate::sys::fnv1a64_hex(
                    format!("{}{}", crate::sys::hostname(), crate::sys::now_ms()).bytes(),
                )
            );
            let t = ask(&format!(
                "ntfy topic (anyone who knows it can read your alerts) [{suggested}]: "
            ))?;
            let t = if t.is_empty() { suggested } else { t };
            ntfy_channel(&a.ntfy_server, t)?
        }
        "telegram" => {
            let token = ask("Bot token (from @BotFather): ")?;
            let chat = ask("Chat id (a number, or @channelname): ")?;
            telegram_channel(token, chat)
        }
        "email" => {
            let to = ask("Send alerts to (e-mail address): ")?;
            let smtp = ask("SMTP relay host[:port] [localhost:25]: ")?;
            let smtp = if smtp.is_empty() {
                "localhost:25".to_string()
            } else {
                smtp
            };
            email_channel(to, smtp)?
        }
        other => {
            let kind = MENU
                .iter()
                .map(|(_, k, _)| *k)
                .find(|k| *k == other)
                .unwrap_or("webhook");
            url_channel(kind, ask("URL: ")?)?
        }
    };
    let digest = ask(
        "Every stock rule (lost GPUs, XIDs, ECC, hangs, thermals, idle GPUs holding memory, …) \
         alerts by default. Also send a weekly usage digest (who used the GPUs, idle hours, \
         energy)? [y/N]: ",
    )?;
    Ok((
        channel,
        digest.eq_ignore_ascii_case("y") || digest.eq_ignore_ascii_case("yes"),
    ))
}

/// The config text for `channels` (secrets in `secrets/NAME`, relative to the config).
fn config_text(channels: &[(String, &Channel)], state_dir: &Path, digest: bool) -> String {
    let mut t = format!(
        "# gpuwatch configuration, written by `gpuwatch init` ({}).\n\
         # Every key is documented in config.example.toml; check a change with\n\
         # `gpuwatch check --config THIS_FILE`, apply it to a running daemon with `gpuwatch reload`.\n\
         \n\
         [daemon]\n\
         interval = \"1s\"\n\
         # alert state, the outbox of unsent messages, usage accounting\n\
         state_dir = {}\n\
         # The stock rules are built in; add a directory of your own rules with e.g.\n\
         # rules = [\"rules\"]   (relative to this file)\n",
        crate::record::format_timestamp(crate::sys::now_ms()),
        toml_str(&state_dir.display().to_string()),
    );
    for (name, c) in channels {
        t.push_str(&format!(
            "\n# {}\n[[channel]]\nname = {}\ntype = {}\n",
            c.what,
            toml_str(name),
            toml_str(c.kind)
        ));
        for (k, v) in &c.plain {
            t.push_str(&format!("{k} = {v}\n"));
        }
        for (k, _) in &c.secrets {
            t.push_str(&format!(
                "{k}_file = {}   # mode 0600: the {k} is a secret\n",
                toml_str(&format!("secrets/{name}-{k}"))
            ));
        }
    }
    let names: Vec<String> = channels.iter().map(|(n, _)| toml_str(n)).collect();
    t.push_str(&format!(
        "\n# Every alert to every channel; see [[route]] in config.example.toml for routing by\n\
         # severity, GPU or host.\n[[route]]\nchannels = [{}]\n",
        names.join(", ")
    ));
    if digest {
        t.push_str(
            "\n[digest]\n# who used the GPUs, Monday 09:00 local time\nschedule = \"weekly\"\n",
        );
    }
    t
}

/// The group of the `gpuwatch` system user the .deb's unit runs the daemon as.
const SERVICE_GROUP: &str = "gpuwatch";

/// The system config directory, whose daemon (the .deb's unit) runs as [`SERVICE_GROUP`].
const SYSTEM_CONFIG_DIR: &str = "/etc/gpuwatch";

/// The group `init` gives its files to so that the packaged daemon can read them: run as root
/// for the system config directory on a machine with the `gpuwatch` system group (the .deb's);
/// `None` elsewhere (the files stay 0600, for root's own daemon or the user's).
fn service_group(dir: &Path) -> Option<u32> {
    let system = std::fs::canonicalize(dir).ok()? == Path::new(SYSTEM_CONFIG_DIR);
    (crate::sys::is_root() && system)
        .then(|| crate::sys::group_id(SERVICE_GROUP))
        .flatten()
}

/// Makes `files` (0640) and `dirs` (0750, those root owns that others may not enter) readable
/// by group `gid`, owner unchanged: the packaged daemon's user reads them, no other user does.
fn share_with_group(dirs: &[&Path], files: &[PathBuf], gid: u32) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    for d in dirs {
        // (a directory others may enter, as the package makes /etc/gpuwatch, stays as it is)
        if let Ok(m) = std::fs::metadata(d) {
            if m.uid() == 0 && m.mode() & 0o005 != 0o005 {
                std::os::unix::fs::chown(d, None, Some(gid))?;
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o750))?;
            }
        }
    }
    for f in files {
        std::os::unix::fs::chown(f, None, Some(gid))?;
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o640))?;
    }
    Ok(())
}

/// Where the state goes: `/var/lib/gpuwatch` for root, else `$XDG_STATE_HOME/gpuwatch`.
fn state_dir() -> PathBuf {
    if crate::sys::is_root() {
        return PathBuf::from("/var/lib/gpuwatch");
    }
    crate::sys::xdg_home("XDG_STATE_HOME", ".local/state")
        .map_or_else(|| PathBuf::from("gpuwatch-state"), |d| d.join("gpuwatch"))
}

/// Runs `init`.
pub fn init(global: &GlobalArgs, a: &InitArgs) -> anyhow::Result<i32> {
    let path = match &a.config {
        Some(p) => std::path::absolute(p)?,
        None if crate::sys::is_root() => PathBuf::from("/etc/gpuwatch/config.toml"),
        None => super::service::user_config_path()?,
    };
    if path.exists() && !a.force {
        anyhow::bail!(
            "{} exists: gpuwatch init does not overwrite a config (--force replaces it; \
             `gpuwatch notify-test --config {}` tests the one there)",
            path.display(),
            path.display()
        );
    }
    let mut channels = from_flags(a)?;
    let mut digest = a.digest;
    if channels.is_empty() {
        if a.non_interactive || !std::io::stdin().is_terminal() {
            anyhow::bail!(
                "no channel given: e.g. `gpuwatch init --ntfy SOME-LONG-RANDOM-TOPIC` (or --slack, \
                 --discord, --telegram-token/--telegram-chat, --email/--smtp, --feishu, \
                 --dingtalk, --wecom, --teams, --webhook; a value `-` is read from standard \
                 input), or run it on a terminal to be asked"
            );
        }
        let (c, d) = interview(a)?;
        channels.push(c);
        digest |= d;
    }
    let mut named: Vec<(String, &Channel)> = Vec::new();
    for c in &channels {
        let base = match c.kind {
            "ntfy" => "phone",
            k => k,
        };
        let mut name = base.to_string();
        let mut n = 2;
        while named.iter().any(|(x, _)| *x == name) {
            name = format!("{base}{n}");
            n += 1;
        }
        named.push((name, c));
    }
    let dir = path
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    crate::sys::create_private_dir(&dir)
        .or_else(|_| std::fs::create_dir_all(&dir))
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    let secrets = dir.join("secrets");
    if named.iter().any(|(_, c)| !c.secrets.is_empty()) {
        crate::sys::create_private_dir(&secrets)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", secrets.display()))?;
    }
    let group = service_group(&dir);
    let mut written = Vec::new();
    for (name, c) in &named {
        for (k, v) in &c.secrets {
            let p = secrets.join(format!("{name}-{k}"));
            // (mode 0600 from its creation on)
            crate::sys::write_atomic(&p, format!("{v}\n").as_bytes())
                .map_err(|e| anyhow::anyhow!("writing {}: {e}", p.display()))?;
            written.push(p);
        }
    }
    let text = config_text(&named, &state_dir(), digest);
    // Checked as every command will read it before it is put in place (mode 0600).
    if let Err(e) = crate::config::parse(&text, &path) {
        anyhow::bail!("the config gpuwatch init made does not load (a bug): {e}");
    }
    crate::sys::write_atomic(&path, text.as_bytes())
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    written.push(path.clone());
    if let Some(gid) = group {
        let dirs = [dir.as_path(), secrets.as_path()];
        share_with_group(&dirs, &written, gid).map_err(|e| {
            anyhow::anyhow!("giving {} to group {SERVICE_GROUP}: {e}", dir.display())
        })?;
    }
    println!("wrote {}", path.display());
    for (name, c) in &named {
        println!("  channel {name:?}: {}", c.what);
    }
    if !named.iter().all(|(_, c)| c.secrets.is_empty()) {
        match group {
            Some(_) => println!(
                "  secrets in {} (mode 0640, group {SERVICE_GROUP}: the packaged service's user)",
                secrets.display()
            ),
            None => println!("  secrets in {} (mode 0600)", secrets.display()),
        }
    }
    let mut code = 0;
    if !a.no_test {
        println!("sending a test message …");
        let args = super::daemon::NotifyTestArgs {
            config: Some(path.clone()),
            channel: Vec::new(),
        };
        match super::daemon::notify_test(global, &args) {
            Ok(0) => println!("the test message went out: check that it arrived"),
            Ok(c) => {
                code = c;
                println!("the test message did not go out (above); fix the address and run `gpuwatch notify-test --config {}`", path.display());
            }
            Err(e) => {
                code = 1;
                println!("the test message did not go out: {e:#}");
            }
        }
    }
    let cfg = if a.config.is_some() || crate::sys::is_root() {
        format!(" --config {}", path.display())
    } else {
        String::new()
    };
    if group.is_some() {
        println!(
            "\nNext:\n\
             \x20 systemctl restart gpuwatch    the packaged service (runs as user {SERVICE_GROUP}) with this config\n\
             \x20 gpuwatch status    every GPU and its processes"
        );
        return Ok(code);
    }
    println!(
        "\nNext:\n\
         \x20 gpuwatch run{cfg} -- python train.py    watch one job: alerts while it runs, a report when it ends\n\
         \x20 gpuwatch service install{}{cfg}    the watchdog for every job, started at boot\n\
         \x20 gpuwatch --sim overnight --speed 60 daemon{cfg}    a simulated night: see what alerts look like",
        if crate::sys::is_root() { "" } else { " --user" }
    );
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_names_secrets_by_file_and_loads() {
        let dir = tempfile::tempdir().unwrap();
        let c = ntfy_channel("https://ntfy.sh/", "my-topic_1".into()).unwrap();
        let t = telegram_channel("123:abc".into(), "@news".into());
        let named = vec![("phone".to_string(), &c), ("telegram".to_string(), &t)];
        let text = config_text(&named, Path::new("/tmp/st"), true);
        assert!(
            !text.contains("my-topic_1"),
            "the topic is a secret: {text}"
        );
        assert!(!text.contains("123:abc"), "{text}");
        assert!(text.contains("url_file = \"secrets/phone-url\""), "{text}");
        assert!(text.contains("chat_id = \"@news\""), "{text}");
        let secrets = dir.path().join("secrets");
        std::fs::create_dir(&secrets).unwrap();
        std::fs::write(secrets.join("phone-url"), "https://ntfy.sh/my-topic_1\n").unwrap();
        std::fs::write(secrets.join("telegram-token"), "123:abc\n").unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, &text).unwrap();
        let cfg = crate::config::load(&path).unwrap();
        cfg.notify_settings().unwrap();
        assert!(ntfy_channel("https://ntfy.sh", "a b".into()).is_err());
        assert!(url_channel("slack", "hooks.slack.com/x".into()).is_err());
    }
}
