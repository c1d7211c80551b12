//! Email: subject, plain-text and HTML parts (pure [`render`]), and the lettre [`message`]
//! built from them. Every message carries the host, each GPU's index, UUID and name, the rule,
//! severity, summary, the values that tripped it, the start time, the processes on the GPUs and
//! what to do next; `Message-ID` is the notification's stable id so mail clients and archives
//! see retries as one message.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use lettre::message::header::ContentType;
use lettre::message::{Attachment, Mailbox, MultiPart, SinglePart};
use lettre::Message;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::CertificateDer;
use serde::Deserialize;
use toml::Spanned;

use super::channel::{
    Channel, ChannelType, RenderEnv, Request, Section, SectionError, SmtpRequest, SmtpServer,
    TlsMode,
};
use super::render::{alert_fields, html_escape, process_lines, summary, text, title};
use super::secret::Secret;
use super::Notification;
use crate::model::{AlertStatus, Severity};

/// A rendered email.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmailContent {
    /// Subject line.
    pub subject: String,
    /// text/plain part.
    pub text: String,
    /// text/html part.
    pub html: String,
    /// Inline images the HTML part references as `cid:ID`: (content id, PNG bytes).
    pub images: Vec<(String, Vec<u8>)>,
    /// Text attachments: (file name, content): a hang forensics bundle's stacks.
    pub attachments: Vec<(String, String)>,
}

/// The stacks of each firing alert's forensics bundle (`annotations.forensics`, a directory
/// with `stacks.txt`; the `stacks` annotation when the file cannot be read), as attachments.
fn forensics_attachments(n: &Notification) -> Vec<(String, String)> {
    n.alerts
        .iter()
        .filter(|a| a.status == AlertStatus::Firing)
        .filter_map(|a| {
            let dir = a.annotations.get("forensics")?;
            let name = std::path::Path::new(dir)
                .file_name()
                .map_or_else(|| "stacks".to_string(), |f| f.to_string_lossy().into_owned());
            let text = std::fs::read(std::path::Path::new(dir).join("stacks.txt"))
                .ok()
                .map(|b| {
                    String::from_utf8_lossy(&b[..b.len().min(1024 * 1024)])
                        .into_owned()
                })
                .or_else(|| a.annotations.get("stacks").cloned())?;
            Some((format!("stacks-{name}.txt"), text))
        })
        .collect()
}

/// Renders the email parts.
pub fn render(n: &Notification) -> EmailContent {
    let colour = match (n.status, n.severity()) {
        (AlertStatus::Resolved, _) => "#2eb886",
        (_, Severity::Critical) => "#d03030",
        (_, Severity::Warning) => "#e8a020",
        (_, Severity::Info) => "#3080d0",
    };
    let mut html = String::new();
    let _ = write!(
        html,
        "<!DOCTYPE html><html><body style=\"font-family:sans-serif\">\
         <h2 style=\"color:{colour}\">{}</h2>",
        html_escape(&title(n))
    );
    if let Some(note) = &n.note {
        let _ = write!(html, "<p>{}</p>", html_escape(note));
    }
    let mut images = Vec::new();
    for a in &n.alerts {
        let _ = write!(
            html,
            "<h3>{}</h3><table cellpadding=\"3\">",
            html_escape(&summary(a))
        );
        for (k, v) in alert_fields(n, a) {
            let _ = write!(
                html,
                "<tr><th align=\"left\" valign=\"top\">{k}</th><td>{}</td></tr>",
                html_escape(&v)
            );
        }
        html.push_str("</table>");
        // The shape of what tripped the rule, for the reader at 3 a.m.
        let chart = a
            .chart
            .as_ref()
            .filter(|_| a.status == AlertStatus::Firing)
            .and_then(|c| super::chart::png(c).map(|png| (c, png)));
        if let Some((c, png)) = chart {
            let cid = format!("chart{}.{}@gpuwatch", images.len() + 1, n.id);
            let caption = html_escape(&super::chart::caption(c));
            let _ = write!(
                html,
                "<p><img src=\"cid:{cid}\" width=\"{}\" height=\"{}\" alt=\"{caption}\"><br>\
                 <small style=\"color:#666\">{caption}</small></p>",
                super::chart::WIDTH,
                super::chart::HEIGHT
            );
            images.push((cid, png));
        }
    }
    if n.truncated_alerts > 0 {
        let _ = write!(
            html,
            "<p>(+{} more alerts not shown)</p>",
            n.truncated_alerts
        );
    }
    let procs = process_lines(n);
    if !procs.is_empty() {
        html.push_str("<h3>Processes</h3><ul>");
        for p in procs {
            let _ = write!(html, "<li><code>{}</code></li>", html_escape(&p));
        }
        html.push_str("</ul>");
    }
    let _ = write!(
        html,
        "<p style=\"color:#888\">gpuwatch on {} &middot; message {}</p></body></html>",
        html_escape(&n.hostname),
        html_escape(&n.id)
    );
    EmailContent {
        subject: title(n),
        text: text(n),
        html,
        images,
        attachments: forensics_attachments(n),
    }
}

/// `[[channel]] type = "email"` keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EmailSection {
    /// SMTP server `host:port` (port defaults by `tls`: 25, 587, 465).
    smtp: Option<String>,
    /// Connection security (default `starttls`).
    tls: Option<TlsMode>,
    /// Sender address.
    from: Option<String>,
    /// Recipients.
    #[serde(default)]
    to: Vec<String>,
    /// SMTP AUTH user name.
    username: Option<String>,
    /// SMTP AUTH password.
    password: Option<String>,
    password_env: Option<String>,
    password_file: Option<PathBuf>,
    /// PEM CA bundle trusted in addition to the built-in roots.
    ca_file: Option<Spanned<PathBuf>>,
}

/// The `email` channel: a validated SMTP server, sender and recipients.
#[derive(Debug, Clone)]
pub struct Email {
    /// SMTP host.
    pub host: String,
    /// SMTP port.
    pub port: u16,
    /// Connection security.
    pub tls: TlsMode,
    /// Sender.
    pub from: String,
    /// Recipients.
    pub to: Vec<String>,
    /// AUTH user.
    pub username: Option<String>,
    /// AUTH password.
    pub password: Option<Secret>,
    /// Extra trust anchors from `ca_file` (DER), trusted in addition to the webpki roots.
    pub ca_certs: Vec<CertificateDer<'static>>,
}

impl ChannelType for Email {
    const TYPE: &'static str = "email";

    fn parse(section: &mut Section<'_>) -> Result<Self, SectionError> {
        let c: EmailSection = section.deserialize()?;
        let smtp = c.smtp.as_deref().ok_or("`smtp` (host:port) is required")?;
        let tls = c.tls.unwrap_or(TlsMode::Starttls);
        let (host, port) = match smtp.rsplit_once(':') {
            Some((h, p)) if !h.contains(']') || h.ends_with(']') => (
                h.trim_start_matches('[').trim_end_matches(']').to_string(),
                p.parse::<u16>()
                    .map_err(|_| format!("`smtp`: bad port in {smtp:?}"))?,
            ),
            _ => (
                smtp.to_string(),
                match tls {
                    TlsMode::None => 25,
                    TlsMode::Starttls => 587,
                    TlsMode::Tls => 465,
                },
            ),
        };
        let from = c.from.clone().ok_or("`from` is required")?;
        if c.to.is_empty() {
            return Err("`to` needs at least one recipient".into());
        }
        for addr in std::iter::once(&from).chain(&c.to) {
            addr.parse::<Mailbox>()
                .map_err(|e| format!("bad address {addr:?}: {e}"))?;
        }
        let password = section.secret(
            "password",
            c.password.as_deref(),
            c.password_env.as_deref(),
            c.password_file.as_deref(),
        )?;
        if password.is_some() && c.username.is_none() {
            return Err("a password needs `username`".into());
        }
        let ca_certs = match &c.ca_file {
            None => Vec::new(),
            Some(path) => {
                let at = path.span().start;
                if tls == TlsMode::None {
                    return Err(section.error_at(
                        at,
                        "`ca_file` needs `tls = \"starttls\"` or `tls = \"tls\"`",
                    ));
                }
                read_ca_file(path.get_ref(), section.base_dir())
                    .map_err(|e| section.error_at(at, format!("`ca_file`: {e}")))?
            }
        };
        Ok(Email {
            host,
            port,
            tls,
            from,
            to: c.to,
            username: c.username,
            password,
            ca_certs,
        })
    }
}

/// The certificates of the PEM bundle `path` (relative to `base_dir`), each checked to parse as
/// a trust anchor. A file that cannot be read, is not PEM, holds no certificate or a broken one
/// is an error.
fn read_ca_file(path: &Path, base_dir: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let full = if path.is_absolute() {
        path.to_path_buf()
    } else {
        base_dir.join(path)
    };
    let shown = full.display();
    let pem = std::fs::read(&full).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{shown} is not a PEM certificate bundle: {e}"))?;
    if certs.is_empty() {
        return Err(format!(
            "{shown} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        ));
    }
    let mut store = rustls::RootCertStore::empty();
    for (i, cert) in certs.iter().enumerate() {
        store.add(cert.clone()).map_err(|e| {
            format!(
                "certificate {} of {shown} is not a valid X.509 certificate: {e}",
                i + 1
            )
        })?;
    }
    Ok(certs)
}

impl Channel for Email {
    fn secrets(&self) -> Vec<&Secret> {
        self.password.iter().collect()
    }

    fn render(&self, n: &Notification, _env: &RenderEnv) -> Result<Vec<Request>, String> {
        Ok(vec![Request::Smtp(SmtpRequest {
            server: self.server(),
            message: message(self, n)?,
        })])
    }

    fn letter(&self, to: &str, subject: &str, text: &str) -> Option<Result<Vec<Request>, String>> {
        Some(letter_message(self, to, subject, text).map(|message| {
            vec![Request::Smtp(SmtpRequest {
                server: self.server(),
                message,
            })]
        }))
    }
}

impl Email {
    /// Where and how it sends.
    fn server(&self) -> SmtpServer {
        SmtpServer {
            host: self.host.clone(),
            port: self.port,
            tls: self.tls,
            username: self.username.clone(),
            password: self.password.clone(),
            ca_certs: self.ca_certs.clone(),
        }
    }
}

/// A plain-text message from `spec`'s sender to `to`.
fn letter_message(spec: &Email, to: &str, subject: &str, text: &str) -> Result<Message, String> {
    let from: Mailbox = spec
        .from
        .parse()
        .map_err(|e| format!("bad from address: {e}"))?;
    let to: Mailbox = to
        .parse()
        .map_err(|e| format!("bad to address {to:?}: {e}"))?;
    Message::builder()
        .from(from)
        .to(to)
        .subject(subject)
        .user_agent("gpuwatch".into())
        .date_now()
        .singlepart(SinglePart::plain(text.to_string()))
        .map_err(|e| format!("cannot build email: {e}"))
}

/// The lettre message for `spec`'s sender and recipients.
pub fn message(spec: &Email, n: &Notification) -> Result<Message, String> {
    let content = render(n);
    let from: Mailbox = spec
        .from
        .parse()
        .map_err(|e| format!("bad from address: {e}"))?;
    let mut b = Message::builder()
        .from(from)
        .subject(content.subject)
        .message_id(Some(format!("<{}@gpuwatch>", n.id)))
        .user_agent("gpuwatch".into())
        .date_now();
    for to in &spec.to {
        b = b.to(to
            .parse()
            .map_err(|e| format!("bad to address {to:?}: {e}"))?);
    }
    let body = if content.images.is_empty() {
        MultiPart::alternative_plain_html(content.text, content.html)
    } else {
        // text | (html + the charts it shows inline)
        let mut related = MultiPart::related().singlepart(SinglePart::html(content.html));
        for (cid, png) in content.images {
            let png_type = ContentType::parse("image/png").map_err(|e| e.to_string())?;
            related = related.singlepart(Attachment::new_inline(cid).body(png, png_type));
        }
        MultiPart::alternative()
            .singlepart(SinglePart::plain(content.text))
            .multipart(related)
    };
    let body = if content.attachments.is_empty() {
        body
    } else {
        let text_type = ContentType::parse("text/plain; charset=utf-8").map_err(|e| e.to_string())?;
        content
            .attachments
            .into_iter()
            .fold(MultiPart::mixed().multipart(body), |m, (name, text)| {
                m.singlepart(Attachment::new(name).body(text, text_type.clone()))
            })
    };
    b.multipart(body)
        .map_err(|e| format!("cannot build email: {e}"))
}

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::*;

    #[test]
    fn carries_everything_someone_woken_up_needs() {
        let n = notification(vec![alert(1, AlertStatus::Firing)]);
        let e = render(&n);
        assert_eq!(e.subject, "[CRITICAL] XidCritical on node7: GPU 1");
        for needle in [
            "node7",
            "GPU 1",
            "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd",
            "NVIDIA H100 80GB HBM3",
            "XidCritical",
            "critical",
            "GPU 1 reported XID 79",
            "xid=79",
            "2026-12-02T15:20:00.000Z",
            "pid 4242",
            "python train.py",
            "Drain the node",
        ] {
            assert!(e.text.contains(needle), "text lacks {needle}: {}", e.text);
            assert!(e.html.contains(needle), "html lacks {needle}: {}", e.html);
        }
        assert!(e
            .html
            .contains("<th align=\"left\" valign=\"top\">Values</th><td>xid=79</td>"));
    }

    /// The notify settings of `channel` (an email `[[channel]]` table) in `dir/config.toml`,
    /// or the error text.
    fn email_settings(dir: &Path, channel: &str) -> Result<(), String> {
        let path = dir.join("config.toml");
        let text = format!(
            "[[channel]]\nname = \"mail\"\ntype = \"email\"\nsmtp = \"127.0.0.1:2525\"\nfrom = \"a@b.c\"\nto = [\"d@e.f\"]\n{channel}"
        );
        let config = crate::config::parse(&text, &path).map_err(|e| e.to_string())?;
        config
            .notify_settings()
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// Issue 11: `ca_file` that cannot be read, is not PEM, holds no certificate or a broken
    /// one, or comes with `tls = "none"`, is a config error at the value's position, naming the
    /// file resolved against the config's directory.
    /// Issue 25 §3: a job's output with escape sequences reaches neither part raw (a mail
    /// client in a terminal would run them); the text keeps its lines.
    #[test]
    fn control_characters_from_a_job_are_escaped() {
        let mut n = notification(vec![hostile_alert()]);
        n.processes[0].command = Some("python \u{1b}[2Jtrain.py".into());
        let e = render(&n);
        for part in [&e.subject, &e.text, &e.html] {
            assert!(
                !part.chars().any(|c| c.is_control() && c != '\n'),
                "{part:?}"
            );
        }
        assert!(e.text.contains("\n    | \\u{1b}]52;c;cm0gLXJmIH4=\\u{7}\n"), "{}", e.text);
        assert!(e.html.contains("\\u{1b}[2J\\u{9b}0m"), "{}", e.html);
        assert!(e.html.contains("python \\u{1b}[2Jtrain.py"), "{}", e.html);
    }

    #[test]
    fn ca_file_problems_are_config_errors_at_their_position() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("notes.txt"), "just some text\n").unwrap();
        std::fs::write(
            d.join("key.pem"),
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        std::fs::write(
            d.join("badb64.pem"),
            "-----BEGIN CERTIFICATE-----\n!!not base64!!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        // Valid PEM and base64, but not DER of a certificate.
        std::fs::write(
            d.join("notder.pem"),
            "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let missing = d.join("missing.pem");
        for (file, expected) in [
            ("missing.pem", format!("cannot read {}", missing.display())),
            ("notes.txt", "holds no PEM certificate".to_string()),
            ("key.pem", "holds no PEM certificate".to_string()),
            ("badb64.pem", "is not a PEM certificate bundle".to_string()),
            (
                "notder.pem",
                format!(
                    "certificate 1 of {} is not a valid X.509 certificate",
                    d.join("notder.pem").display()
                ),
            ),
        ] {
            let err = email_settings(d, &format!("ca_file = \"{file}\"\n")).unwrap_err();
            let want = "config.toml:7:11: channel \"mail\": `ca_file`: ";
            assert!(err.contains(want), "{file}: {err}");
            assert!(err.contains(&expected), "{file}: {err}");
        }
        let err = email_settings(d, "tls = \"none\"\nca_file = \"notes.txt\"\n").unwrap_err();
        assert!(
            err.contains("config.toml:8:11: channel \"mail\": `ca_file` needs `tls = \"starttls\"`"),
            "{err}"
        );
        let err = email_settings(d, "ca_file = 5\n").unwrap_err();
        assert!(err.contains("config.toml:7:11"), "{err}");
        assert!(email_settings(d, "").is_ok());
    }

    #[test]
    fn builds_a_multipart_message_with_stable_id() {
        let n = notification(vec![alert(1, AlertStatus::Resolved)]);
        let spec = Email {
            host: "h".into(),
            port: 25,
            tls: TlsMode::None,
            from: "gpuwatch@example.org".into(),
            to: vec!["a@example.org".into(), "b@example.org".into()],
            username: None,
            password: None,
            ca_certs: Vec::new(),
        };
        let m = message(&spec, &n).unwrap();
        let raw = String::from_utf8(m.formatted()).unwrap();
        assert!(
            raw.contains("Message-ID: <0123456789abcdef0123456789abcdef@gpuwatch>"),
            "{raw}"
        );
        assert!(raw.contains("To: a@example.org, b@example.org"), "{raw}");
        assert!(
            raw.contains("Subject: [RESOLVED] XidCritical on node7: GPU 1"),
            "{raw}"
        );
        assert!(raw.contains("multipart/alternative"), "{raw}");
    }

    #[test]
    fn a_forensics_bundle_travels_as_an_attachment() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("4242-20261203T211221Z");
        std::fs::create_dir_all(&bundle).unwrap();
        std::fs::write(bundle.join("stacks.txt"), "Thread 4242 (idle)\n    stuck_here (train.py:6)\n").unwrap();
        let mut a = alert(1, AlertStatus::Firing);
        a.annotations
            .insert("forensics".into(), bundle.display().to_string());
        let n = notification(vec![a]);
        let spec = Email {
            host: "h".into(),
            port: 25,
            tls: TlsMode::None,
            from: "gpuwatch@example.org".into(),
            to: vec!["a@example.org".into()],
            username: None,
            password: None,
            ca_certs: Vec::new(),
        };
        let raw = String::from_utf8(message(&spec, &n).unwrap().formatted()).unwrap();
        assert!(raw.contains("multipart/mixed"), "{raw}");
        assert!(
            raw.contains("stacks-4242-20261203T211221Z.txt\"") && raw.contains("Content-Disposition: attachment"),
            "{raw}"
        );
        assert!(raw.contains("stuck_here (train.py:6)"), "{raw}");
    }
}
