//! WeCom (企业微信) group bot: `{"msgtype":"text","text":{"content":…}}`, content ≤ 2048 bytes,
//! `@all` mentioned for firing critical alerts. WeCom answers 200 with `errcode == 0`.

use serde_json::{json, Value};

use super::render::{text, truncate_bytes};
use super::Notification;
use crate::model::{AlertStatus, Severity};

/// The request body.
pub fn render(n: &Notification) -> Value {
    let mentioned: Vec<&str> =
        if n.status == AlertStatus::Firing && n.severity() == Severity::Critical {
            vec!["@all"]
        } else {
            Vec::new()
        };
    json!({
        "msgtype": "text",
        "text": {"content": truncate_bytes(&text(n), 2048), "mentioned_list": mentioned},
    })
}

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::*;

    #[test]
    fn golden() {
        let n = notification((0..40).map(|g| alert(g, AlertStatus::Firing)).collect());
        let got = render(&n);
        assert_eq!(got["msgtype"], "text");
        let c = got["text"]["content"].as_str().unwrap();
        assert!(c.len() <= 2048);
        assert!(
            c.starts_with("[CRITICAL] XidCritical on node7: GPUs 0,1,"),
            "{c}"
        );
        assert_eq!(got["text"]["mentioned_list"][0], "@all");
    }
}
