//! Slack incoming webhook: `{"text": …}` with the title in bold and the plain-text body.
//! Slack answers 200 `ok`; 429 carries `Retry-After`.

use serde_json::{json, Value};

use super::{render as text, Notification};
use super::channel::{HookBody, JsonHook};

/// Escapes Slack's three control characters.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The request body.
pub fn render(n: &Notification) -> Value {
    // Slack cuts a message's text at 40 000 characters.
    let body = text::truncate_bytes(&text::text(n), 39_000);
    let rest = body.split_once('\n').map_or("", |(_, r)| r);
    json!({
        "text": format!("*{}*\n{}", escape(&text::title(n)), escape(rest.trim_start_matches('\n'))),
        "username": "gpuwatch",
    })
}

/// The `slack` channel: POST to a Slack incoming-webhook `url`.
pub type Slack = JsonHook<SlackBody>;

/// The `slack` body.
#[derive(Debug)]
pub struct SlackBody;

impl HookBody for SlackBody {
    const TYPE: &'static str = "slack";

    fn body(n: &Notification) -> Value {
        render(n)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::*;
    use crate::model::AlertStatus;

    #[test]
    fn golden() {
        let n = notification(vec![alert(1, AlertStatus::Firing)]);
        let got = render(&n);
        let t = got["text"].as_str().unwrap();
        assert!(
            t.starts_with("*[CRITICAL] XidCritical on node7: GPU 1*\nGPU 1 reported XID 79"),
            "{t}"
        );
        assert!(t.contains("  Values: xid=79\n"), "{t}");
        assert_eq!(got["username"], "gpuwatch");
    }
}
