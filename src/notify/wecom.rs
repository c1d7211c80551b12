//! WeCom (企业微信) group bot: `{"msgtype":"text","text":{"content":…}}`, content ≤ 2048 bytes,
//! `@all` mentioned for firing critical alerts. WeCom answers 200 with `errcode == 0`.

use serde_json::{json, Value};

use super::render::{text, truncate_bytes};
use super::Notification;
use super::channel::{body_error, json_code, judge_status, HookBody, JsonHook, Response};
use super::transport::SendError;
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

/// The `wecom` channel: POST to a WeCom group-bot `url`.
pub type Wecom = JsonHook<WecomBody>;

/// The `wecom` body.
#[derive(Debug)]
pub struct WecomBody;

impl HookBody for WecomBody {
    const TYPE: &'static str = "wecom";

    fn body(n: &Notification) -> Value {
        render(n)
    }

    fn judge(r: &Response) -> Result<(), SendError> {
        let json = judge_status(r)?;
        match json_code(json.as_ref(), &["errcode"]).filter(|c| *c != 0) {
            None => Ok(()),
            // 45009: rate limit.
            Some(c) => Err(body_error(r, c, c == 45009)),
        }
    }
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

    fn response(status: u16, body: &str) -> Response {
        Response {
            status,
            retry_after: None,
            body: body.into(),
        }
    }

    #[test]
    fn judges_the_body_code() {
        assert!(
            WecomBody::judge(&response(200, r#"{"errcode":45009}"#))
                .unwrap_err()
                .retryable
        );
        assert!(WecomBody::judge(&response(200, r#"{"errcode":0}"#)).is_ok());
    }
}
