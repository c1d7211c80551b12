//! Microsoft Teams (Workflows "When a Teams webhook request is received"): a message with one
//! Adaptive Card 1.2 attachment — title, one fact set per alert, processes. Legacy MessageCards
//! are not accepted by workflows. Teams answers 202. Text from alerts (summaries, fact values,
//! processes) is markdown-escaped ([`markdown_escape`]): cards render markdown, links included.

use serde_json::{json, Value};

use super::channel::{HookBody, JsonHook};
use super::render::{alert_fields, markdown_escape, process_lines, summary, title, truncate_chars};
use super::Notification;
use crate::model::{AlertStatus, Severity};

/// The most a request body may hold, in bytes of JSON. Teams refuses a bigger message ("The
/// message size limit is 28 KB", Microsoft Learn, *Create Incoming Webhooks*; the Teams connector
/// of Power Automate lists the same ~28 KB, "Request Entity too large"), and users of the
/// Workflows webhooks report refusals from about 21 KB: 20 000 bytes leaves a margin.
pub const MAX_BODY_BYTES: usize = 20_000;
/// The most characters of one text from an alert (a summary, a fact value, a process line).
const MAX_TEXT_CHARS: usize = 1_000;
/// The most characters of the title and of the note (a digest's).
const MAX_TITLE_CHARS: usize = 300;
const MAX_NOTE_CHARS: usize = 2_000;
/// Room kept for the closing "… N more" blocks while alerts and processes are added.
const RESERVED_BYTES: usize = 400;

/// The card's body blocks and the bytes the whole request takes with them.
struct Body {
    blocks: Vec<Value>,
    bytes: usize,
}

impl Body {
    /// Bytes `block` adds (with its comma).
    fn cost(block: &Value) -> usize {
        block.to_string().len() + 1
    }

    /// Adds `blocks` when, with `reserve` bytes left over, they fit; says whether they did.
    fn try_push(&mut self, blocks: Vec<Value>, reserve: usize) -> bool {
        let cost: usize = blocks.iter().map(Body::cost).sum();
        if self.bytes + cost + reserve > MAX_BODY_BYTES {
            return false;
        }
        self.bytes += cost;
        self.blocks.extend(blocks);
        true
    }
}

/// The message around the card's `body`.
fn envelope(body: Vec<Value>) -> Value {
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

/// `… 3 more alerts not shown` as a subtle text block.
fn more(count: usize, one: &str, many: &str) -> Value {
    let what = if count == 1 { one } else { many };
    json!({"type": "TextBlock", "text": format!("… {count} more {what} not shown"),
        "isSubtle": true, "wrap": true})
}

/// Bytes `s` takes inside a JSON string (escapes counted).
fn json_len(s: &str) -> usize {
    Value::String(s.to_string()).to_string().len() - 2
}

/// An alert's two blocks (summary, facts) with each text cut to `max` characters.
fn alert_blocks(n: &Notification, a: &crate::model::AlertEvent, max: usize) -> Vec<Value> {
    let cut = |s: &str| markdown_escape(&truncate_chars(s, max));
    let facts: Vec<Value> = alert_fields(n, a)
        .into_iter()
        .map(|(k, v)| json!({"title": k, "value": cut(&v)}))
        .collect();
    vec![
        json!({"type": "TextBlock", "text": cut(&summary(a)), "weight": "bolder",
            "wrap": true, "separator": true}),
        json!({"type": "FactSet", "facts": facts}),
    ]
}

/// The request body, at most [`MAX_BODY_BYTES`]: each text is cut to [`MAX_TEXT_CHARS`]; alerts,
/// then process lines, are added while they fit, and what did not is counted in a closing
/// `… N more alerts not shown` (with the alerts the group left out, `max_alerts`) and
/// `… N more processes not shown`.
pub fn render(n: &Notification) -> Value {
    let colour = match (n.status, n.severity()) {
        (AlertStatus::Resolved, _) => "good",
        (_, Severity::Critical) => "attention",
        (_, Severity::Warning) => "warning",
        (_, Severity::Info) => "accent",
    };
    let mut body = Body {
        blocks: Vec::new(),
        bytes: envelope(Vec::new()).to_string().len(),
    };
    // The title and the note are cut to sizes that always fit.
    let mut head = vec![json!({
        "type": "TextBlock", "text": truncate_chars(&title(n), MAX_TITLE_CHARS),
        "weight": "bolder", "size": "medium", "color": colour, "wrap": true,
    })];
    if let Some(note) = &n.note {
        head.push(
            json!({"type": "TextBlock", "text": truncate_chars(note, MAX_NOTE_CHARS),
            "wrap": true}),
        );
    }
    body.try_push(head, 0);
    let mut shown = 0;
    for a in &n.alerts {
        // The first alert is shown even when its texts must be cut shorter to fit.
        let fits = body.try_push(alert_blocks(n, a, MAX_TEXT_CHARS), RESERVED_BYTES)
            || (shown == 0 && body.try_push(alert_blocks(n, a, 100), RESERVED_BYTES));
        if !fits {
            break;
        }
        shown += 1;
    }
    let hidden = n.alerts.len() - shown + n.truncated_alerts;
    if hidden > 0 {
        body.try_push(vec![more(hidden, "alert", "alerts")], 0);
    }
    // The process lines that fit, in one block; the JSON of a list is the sum of its parts.
    let procs: Vec<String> = process_lines(n)
        .iter()
        .map(|p| markdown_escape(&truncate_chars(p, MAX_TEXT_CHARS)))
        .collect();
    let list = |lines: &[String]| {
        json!({"type": "TextBlock", "text": format!("Processes:\n\n- {}", lines.join("\n- ")),
            "wrap": true, "separator": true})
    };
    let mut listed = 0;
    let mut bytes = Body::cost(&list(&[]));
    for (i, p) in procs.iter().enumerate() {
        let more_bytes = json_len(p) + if i == 0 { 0 } else { json_len("\n- ") };
        if body.bytes + bytes + more_bytes + RESERVED_BYTES / 2 > MAX_BODY_BYTES {
            break;
        }
        bytes += more_bytes;
        listed = i + 1;
    }
    if listed > 0 && !body.try_push(vec![list(&procs[..listed])], 0) {
        listed = 0;
    }
    if procs.len() > listed {
        body.try_push(vec![more(procs.len() - listed, "process", "processes")], 0);
    }
    envelope(body.blocks)
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
        assert!(
            summary.ends_with("\\[click\\](https://evil.example/)"),
            "{summary}"
        );
        let facts = body[2]["facts"].as_array().unwrap();
        let details = facts.iter().find(|f| f["title"] == "Details").unwrap()["value"]
            .as_str()
            .unwrap();
        assert!(
            details.contains("\\[here\\](https://evil.example/)"),
            "{details}"
        );
        let procs = body[3]["text"].as_str().unwrap();
        assert!(
            procs.contains("python \\[x\\](https://evil.example/)"),
            "{procs}"
        );
        let all = got.to_string();
        assert!(!all.contains("[here](") && !all.contains("[x]("), "{all}");
        assert!(!all.contains("\\u001b"), "raw ESC: {all}");
    }

    /// Issue 25 §11: a group of 400 alerts with long texts (and 300 more the group left out),
    /// 200 processes with long command lines and a long note makes a body under Teams' limit,
    /// which says what it left out.
    #[test]
    fn a_huge_group_stays_under_the_size_limit() {
        let alerts: Vec<_> = (0..400)
            .map(|i| {
                let mut a = alert(1, AlertStatus::Firing);
                a.fingerprint = format!("fp{i}");
                a.annotations.insert(
                    "summary".into(),
                    format!("alert {i}: {}", "显卡掉线".repeat(500)),
                );
                a.annotations
                    .insert("description".into(), "x".repeat(5_000));
                a
            })
            .collect();
        let mut n = notification(alerts);
        n.truncated_alerts = 300;
        n.note = Some("n".repeat(10_000));
        let proc = n.processes[0].clone();
        n.processes = (0..200)
            .map(|i| {
                let mut p = proc.clone();
                p.pid = 10_000 + i;
                p.command = Some(format!("python train.py {}", "--flag ".repeat(400)));
                p
            })
            .collect();
        let got = render(&n);
        let bytes = got.to_string().len();
        assert!(bytes <= MAX_BODY_BYTES, "{bytes} bytes");
        let body = got["attachments"][0]["content"]["body"].as_array().unwrap();
        let texts: Vec<&str> = body.iter().filter_map(|b| b["text"].as_str()).collect();
        let shown = texts.iter().filter(|t| t.starts_with("alert ")).count();
        assert!(shown >= 1, "{texts:?}");
        let more_alerts = format!("… {} more alerts not shown", 400 - shown + 300);
        assert!(texts.contains(&more_alerts.as_str()), "{texts:?}");
        let procs = texts
            .iter()
            .find(|t| t.starts_with("Processes:"))
            .expect("some processes");
        let listed = procs.matches("\n- ").count();
        let more_procs = format!("… {} more processes not shown", 200 - listed);
        assert!(texts.contains(&more_procs.as_str()), "{texts:?}");
        for t in texts.iter().flat_map(|t| t.lines()) {
            assert!(t.chars().count() <= 2_000, "a text is cut: {}", t.len());
        }
        // The card is still whole: its JSON parses back.
        let back: Value = serde_json::from_str(&got.to_string()).unwrap();
        assert_eq!(back["attachments"][0]["content"]["type"], "AdaptiveCard");
    }

    /// One alert whose facts alone would pass the limit is still shown, its texts cut shorter.
    #[test]
    fn one_oversized_alert_is_shown_cut() {
        let mut a = alert(1, AlertStatus::Firing);
        for k in ["description", "values", "next_steps", "summary"] {
            a.annotations.insert(k.into(), "€".repeat(3_000));
        }
        for i in 0..20 {
            a.labels.insert(format!("label{i}"), "€".repeat(3_000));
        }
        let got = render(&notification(vec![a]));
        assert!(got.to_string().len() <= MAX_BODY_BYTES);
        let body = got["attachments"][0]["content"]["body"].as_array().unwrap();
        assert_eq!(body[2]["type"], "FactSet", "{body:?}");
        assert!(!got.to_string().contains("more alert"));
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
