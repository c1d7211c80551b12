//! Discord webhook: `content` (the title) plus one embed per alert (at most 10, Discord's limit),
//! coloured by severity. Limits: content ≤ 2000, title ≤ 256, description ≤ 4096 characters,
//! ≤ 25 fields per embed. Discord answers 204; 429 carries JSON `retry_after`.

use serde_json::{json, Value};

use super::render::{alert_fields, summary, title, truncate_chars};
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

/// The request body.
pub fn render(n: &Notification) -> Value {
    let embeds: Vec<Value> = n
        .alerts
        .iter()
        .take(10)
        .map(|a| {
            let fields: Vec<Value> = alert_fields(n, a)
                .into_iter()
                .take(25)
                .map(|(k, v)| {
                    json!({"name": k, "value": truncate_chars(&v, 1024), "inline": k.len() < 8 && v.len() < 40})
                })
                .collect();
            json!({
                "title": truncate_chars(&summary(a), 256),
                "color": colour(a.status, a.severity),
                "fields": fields,
                "timestamp": rfc3339_ms(a.ends_at_ms.unwrap_or(a.starts_at_ms)),
            })
        })
        .collect();
    let mut content = title(n);
    let hidden = n.alerts.len().saturating_sub(10) + n.truncated_alerts;
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

    #[test]
    fn at_most_ten_embeds() {
        let n = notification((0..12).map(|g| alert(g, AlertStatus::Firing)).collect());
        let got = render(&n);
        assert_eq!(got["embeds"].as_array().unwrap().len(), 10);
        assert!(got["content"].as_str().unwrap().ends_with("(+2 more)"));
    }
}
