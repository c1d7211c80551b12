//! Email: subject, plain-text and HTML parts (pure [`render`]), and the lettre [`message`]
//! built from them. Every message carries the host, each GPU's index, UUID and name, the rule,
//! severity, summary, the values that tripped it, the start time, the processes on the GPUs and
//! what to do next; `Message-ID` is the notification's stable id so mail clients and archives
//! see retries as one message.

use std::fmt::Write as _;

use lettre::message::{Mailbox, MultiPart};
use lettre::Message;

use super::render::{alert_fields, html_escape, process_lines, summary, text, title};
use super::settings::EmailSpec;
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
    }
}

/// The lettre message for `spec`'s sender and recipients.
pub fn message(spec: &EmailSpec, n: &Notification) -> Result<Message, String> {
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
    b.multipart(MultiPart::alternative_plain_html(
        content.text,
        content.html,
    ))
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

    #[test]
    fn builds_a_multipart_message_with_stable_id() {
        let n = notification(vec![alert(1, AlertStatus::Resolved)]);
        let spec = EmailSpec {
            host: "h".into(),
            port: 25,
            tls: super::super::settings::TlsMode::None,
            from: "gpuwatch@example.org".into(),
            to: vec!["a@example.org".into(), "b@example.org".into()],
            username: None,
            password: None,
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
}
