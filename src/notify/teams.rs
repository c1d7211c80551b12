//! Microsoft Teams (Workflows "When a Teams webhook request is received"): a message with one
//! Adaptive Card 1.2 attachment — title, one fact set per alert, processes. Legacy MessageCards
//! are not accepted by workflows. Teams answers 202. Text from alerts (summaries, fact values,
//! processes) is markdown-escaped ([`markdown_escape`]): cards render markdown, links included.

use serde_json::{json, Value};

use super::render::{alert_fields, markdown_escape, process_lines, summary, title};
use super::Notification;
use super::channel::{HookBody, JsonHook};
use crate::model::{AlertStatus, Severity};

/// The request body.
pub fn render(n: &Notification) -> Value {
    let colour = match (n.status, n.severity()) {
        (AlertStatus::Resolved, _) => "good",
        (_, Severity::Critical) => "attention",
        (_, Severity::Warning) => "warning",
        (_, Severity::Info) => "accent",
    };
    let mut body = vec![json!({
        "type": "TextBlock", "text": title(n), "weight": "bolder", "size": "medium",
        "color": colour, "wrap": true,
    })];
    if let Some(note) = &n.note {
        body.push(json!({"type": "TextBlock", "text": note, "wrap": true}));
    }
    for a in &n.alerts {
        body.push(
            json!({"type": "TextBlock", "text": markdown_escape(&summary(a)), "weight": "bolder",
            "wrap": true, "separator": true}),
        );
        let facts: Vec<Value> = alert_fields(n, a)
            .into_iter()
            .map(|(k, v)| json!({"title": k, "value": markdown_escape(&v)}))
            .collect();
        body.push(json!({"type": "FactSet", "facts": facts}));
    }
    let procs: Vec<String> = process_lines(n).iter().map(|p| markdown_escape(p)).collect();
    if !procs.is_empty() {
        body.push(
            json!({"type": "TextBlock", "text": format!("Processes:\n\n- {}", procs.join("\n- ")),
            "wrap": true, "separator": true}),
        );
    }
    json!({
        "type": "message",
        "attachments": [{
            "contentType": "application/vnd.microsoft.card.adaptive",
            "contentUrl": null,
            "content": {
                "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                "type": "AdaptiveCard",
                "version": "1.2",
                "body": body,
            }
        }]
    })
}

/// The `teams` channel: POST to a Teams workflow `url`.
pub type Teams = JsonHook<TeamsBody>;

/// The `teams` body.
#[derive(Debug)]
pub struct TeamsBody;

impl HookBody for TeamsBody {
    const TYPE: &'static str = "teams";

    fn body(n: &Notification) -> Value {
        render(n)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::*;

    /// Issue 25 §3: `[text](url)` from a job's output is no link in the card.
    #[test]
    fn untrusted_text_makes_no_link() {
        let mut n = notification(vec![hostile_alert()]);
        n.processes[0].command = Some("python [x](https://evil.example/)".into());
        let got = render(&n);
        let body = &got["attachments"][0]["content"]["body"];
        let summary = body[1]["text"].as_str().unwrap();
        assert!(summary.ends_with("\\[click\\](https://evil.example/)"), "{summary}");
        let facts = body[2]["facts"].as_array().unwrap();
        let details = facts.iter().find(|f| f["title"] == "Details").unwrap()["value"]
            .as_str()
            .unwrap();
        assert!(details.contains("\\[here\\](https://evil.example/)"), "{details}");
        let procs = body[3]["text"].as_str().unwrap();
        assert!(procs.contains("python \\[x\\](https://evil.example/)"), "{procs}");
        let all = got.to_string();
        assert!(!all.contains("[here](") && !all.contains("[x]("), "{all}");
        assert!(!all.contains("\\u001b"), "raw ESC: {all}");
    }

    #[test]
    fn golden() {
        let n = notification(vec![alert(1, AlertStatus::Firing)]);
        let got = render(&n);
        assert_eq!(got["type"], "message");
        let att = &got["attachments"][0];
        assert_eq!(
            att["contentType"],
            "application/vnd.microsoft.card.adaptive"
        );
        assert_eq!(att["contentUrl"], Value::Null);
        let card = &att["content"];
        assert_eq!(card["type"], "AdaptiveCard");
        assert_eq!(card["version"], "1.2");
        assert_eq!(
            card["body"][0]["text"],
            "[CRITICAL] XidCritical on node7: GPU 1"
        );
        assert_eq!(card["body"][0]["color"], "attention");
        assert_eq!(card["body"][2]["type"], "FactSet");
        assert_eq!(card["body"][2]["facts"][0]["title"], "Status");
        assert!(card["body"][3]["text"]
            .as_str()
            .unwrap()
            .contains("pid 4242"));
    }
}
