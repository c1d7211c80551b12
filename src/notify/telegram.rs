//! Telegram bot `sendMessage`: HTML parse mode (MarkdownV2 needs heavy escaping), text ≤ 4096
//! characters, silent (no sound) unless critical. Telegram answers `{"ok":true}`; 429 carries
//! `parameters.retry_after`.

use serde_json::{json, Value};

use super::render::{html_escape, text, title, truncate_chars};
use super::Notification;
use crate::model::{AlertStatus, Severity};

/// The request body for chat `chat_id`.
pub fn render(n: &Notification, chat_id: &str) -> Value {
    let body = text(n);
    let rest = body.split_once('\n').map_or("", |(_, r)| r);
    let html = format!("<b>{}</b>\n{}", html_escape(&title(n)), html_escape(rest));
    // Cut on the escaped text would risk a broken entity; cut the raw text instead.
    let html = if html.chars().count() > 4096 {
        let raw_max = 4096usize.saturating_sub(html_escape(&title(n)).len() + 9);
        format!(
            "<b>{}</b>\n{}",
            html_escape(&title(n)),
            html_escape(&truncate_chars(rest, raw_max / 2))
        )
    } else {
        html
    };
    let chat: Value = chat_id
        .parse::<i64>()
        .map_or_else(|_| Value::String(chat_id.into()), Value::from);
    json!({
        "chat_id": chat,
        "text": html,
        "parse_mode": "HTML",
        "disable_web_page_preview": true,
        "disable_notification": !(n.status == AlertStatus::Firing && n.severity() == Severity::Critical),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::*;

    #[test]
    fn golden() {
        let mut n = notification(vec![alert(1, AlertStatus::Firing)]);
        n.processes[0].command = Some("python train.py <a&b>".into());
        let got = render(&n, "-1001234");
        assert_eq!(got["chat_id"], -1_001_234);
        assert_eq!(got["parse_mode"], "HTML");
        assert_eq!(got["disable_notification"], false);
        let t = got["text"].as_str().unwrap();
        assert!(
            t.starts_with("<b>[CRITICAL] XidCritical on node7: GPU 1</b>\n"),
            "{t}"
        );
        assert!(t.contains("python train.py &lt;a&amp;b&gt;"), "{t}");
        let n = notification(vec![alert(1, AlertStatus::Resolved)]);
        assert_eq!(render(&n, "@chan")["chat_id"], "@chan");
        assert_eq!(render(&n, "@chan")["disable_notification"], true);
    }
}
