//! Discord webhook: `content` (the title) plus one embed per alert (at most 10, Discord's limit),
//! coloured by severity. Limits: content ≤ 2000, title ≤ 256, description ≤ 4096 characters,
//! ≤ 25 fields per embed, 6000 characters in all the embeds (fields stop there). Discord answers 204; 429 carries JSON `retry_after`.
//! Embed titles and field values are markdown-escaped ([`markdown_escape`]); no mention pings.

use serde_json::{json, Value};

use super::render::{alert_fields, markdown_escape, summary, title, truncate_chars};
use super::{rfc3339_ms, Notification};
use super::channel::{HookBody, JsonHook};
use crate::model::{AlertStatus, Severity};

/// Embed colour for an alert.
fn colour(status: AlertStatus, severity: Severity) -> u32 {
    match (status, severity) {
        (AlertStatus::Resolved, _) => 0x2e_b8_86,
        (_, Severity::Critical) => 0xd0_30_30,
        (_, Severity::Warning) => 0xe8_a0_20,
        (_, Severity::Info) => 0x30_80_d0,
    }
}

/// Discord refuses a message whose embeds hold more than 6000 characters in all (titles, field
/// names and values); this leaves room for the rest.
const EMBEDS_TOTAL: usize = 5_800;

/// The request body.
pub fn render(n: &Notification) -> Value {
    let mut used = 0;
    let mut embeds: Vec<Value> = Vec::new();
    for a in n.alerts.iter().take(10) {
        // Summaries and field values carry text from outside (a job's output): Discord renders
        // markdown in them, `[text](url)` included.
        let title = truncate_chars(&markdown_escape(&summary(a)), 256);
        let title_len = title.chars().count();
        if used + title_len > EMBEDS_TOTAL {
            break;
        }
        used += title_len;
        let mut fields = Vec::new();
        // An empty value is refused by Discord; fields stop where the total would pass.
        for (k, v) in alert_fields(n, a).into_iter().take(25) {
            let value = truncate_chars(&markdown_escape(&v), 1024);
            let len = k.chars().count() + value.chars().count();
            if value.trim().is_empty() || used + len > EMBEDS_TOTAL {
                continue;
            }
            used += len;
            fields.push(json!({"name": k, "value": value, "inline": k.len() < 8 && v.len() < 40}));
        }
        embeds.push(json!({
            "title": title,
            "color": colour(a.status, a.severity),
            "fields": fields,
            "timestamp": rfc3339_ms(a.ends_at_ms.unwrap_or(a.starts_at_ms)),
        }));
    }
    let mut content = title(n);
    let hidden = n.alerts.len().saturating_sub(embeds.len()) + n.truncated_alerts;
    if hidden > 0 {
        content.push_str(&format!(" (+{hidden} more)"));
    }
    if let Some(note) = &n.note {
        content.push('\n');
        content.push_str(note);
    }
    json!({
        "username": "gpuwatch",
        "content": truncate_chars(&content, 2000),
        "embeds": embeds,
        // No `@everyone`, role or user ping from text in the message.
        "allowed_mentions": {"parse": []},
    })
}

/// The `discord` channel: POST to a Discord webhook `url`.
pub type Discord = JsonHook<DiscordBody>;

/// The `discord` body.
#[derive(Debug)]
pub struct DiscordBody;

impl HookBody for DiscordBody {
    const TYPE: &'static str = "discord";

    fn body(n: &Notification) -> Value {
        render(n)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::*;

    #[test]
    fn golden() {
        let n = notification(vec![alert(1, AlertStatus::Firing)]);
        let got = render(&n);
        assert_eq!(got["content"], "[CRITICAL] XidCritical on node7: GPU 1");
        let e = &got["embeds"][0];
        assert_eq!(e["title"], "GPU 1 reported XID 79 (fallen off the bus)");
        assert_eq!(e["color"], 0xd0_30_30);
        assert_eq!(e["fields"][2]["name"], "GPU");
        assert_eq!(
            e["fields"][2]["value"],
            "GPU 1 (NVIDIA H100 80GB HBM3, GPU-00000001-aaaa-bbbb-cccc-dddddddddddd)"
        );
        assert_eq!(e["timestamp"], "2026-12-02T15:20:00.000Z");
    }

    /// Issue 25 §3: `[text](url)` from a job's output is no link in the embed; no pings.
    #[test]
    fn untrusted_text_makes_no_link() {
        let got = render(&notification(vec![hostile_alert()]));
        let e = &got["embeds"][0];
        let title = e["title"].as_str().unwrap();
        assert!(title.ends_with("\\[click\\](https://evil.example/)"), "{title}");
        let details = e["fields"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == "Details")
            .unwrap()["value"]
            .as_str()
            .unwrap();
        assert!(details.contains("\\[here\\](https://evil.example/)"), "{details}");
        assert!(!got.to_string().contains("[here]("), "{got}");
        assert!(!got.to_string().contains("\\u001b"), "raw ESC: {got}");
        assert_eq!(got["allowed_mentions"]["parse"], serde_json::json!([]));
    }

    #[test]
    fn at_most_ten_embeds() {
        let n = notification((0..12).map(|g| alert(g, AlertStatus::Firing)).collect());
        let got = render(&n);
        assert_eq!(got["embeds"].as_array().unwrap().len(), 10);
        assert!(got["content"].as_str().unwrap().ends_with("(+2 more)"));
    }

    /// Ten alerts with long annotations stay under Discord's 6000-character total for embeds,
    /// and no field is empty.
    #[test]
    fn embeds_stay_under_the_total() {
        let alerts: Vec<_> = (0..10)
            .map(|g| {
                let mut a = alert(g, AlertStatus::Firing);
                a.annotations.insert("description".into(), "x".repeat(900));
                a.annotations.insert("values".into(), String::new());
                a
            })
            .collect();
        let got = render(&notification(alerts));
        let mut total = 0;
        for e in got["embeds"].as_array().unwrap() {
            total += e["title"].as_str().unwrap().chars().count();
            for f in e["fields"].as_array().unwrap() {
                let v = f["value"].as_str().unwrap();
                assert!(!v.trim().is_empty(), "{f}");
                total += f["name"].as_str().unwrap().chars().count() + v.chars().count();
            }
        }
        assert!(total <= 6000, "{total}");
    }
}
