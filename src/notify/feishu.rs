//! Feishu / Lark custom bot: `{"msg_type":"text","content":{"text":…}}`, signed when a secret is
//! set: `timestamp` (unix seconds) and `sign = base64(HMAC-SHA256(key = "{timestamp}\n{secret}",
//! message = ""))` added to the body. Feishu answers HTTP 200 even on failure: the body's
//! `code` must be 0.

use base64::Engine as _;

use serde_json::{json, Value};

use super::channel::{
    body_error, json_code, judge_status, Channel, ChannelType, HttpRequest, RenderEnv, Request,
    Response, Section, SectionError, SignedUrlSection,
};
use super::render::{text, truncate_bytes};

/// The longest text sent (the service refuses bodies over about 20 KB).
const MAX_TEXT_BYTES: usize = 18_000;
use super::secret::Secret;
use super::transport::SendError;
use super::Notification;

/// The unsigned request body.
pub fn render(n: &Notification) -> Value {
    // Feishu refuses request bodies over 20 KB (a night's digest can be longer).
    json!({"msg_type": "text", "content": {"text": truncate_bytes(&text(n), MAX_TEXT_BYTES)}})
}

/// The signature for `timestamp_s` (unix seconds).
pub fn sign(secret: &str, timestamp_s: i64) -> String {
    let string_to_sign = format!("{timestamp_s}\n{secret}");
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, string_to_sign.as_bytes());
    let tag = ring::hmac::sign(&key, b"");
    base64::engine::general_purpose::STANDARD.encode(tag.as_ref())
}

/// The body signed at `now_ms`.
pub fn render_signed(n: &Notification, secret: Option<&str>, now_ms: i64) -> Value {
    let mut body = render(n);
    if let (Some(secret), Value::Object(map)) = (secret, &mut body) {
        let ts = now_ms.div_euclid(1000);
        map.insert("timestamp".into(), Value::String(ts.to_string()));
        map.insert("sign".into(), Value::String(sign(secret, ts)));
    }
    body
}

/// The `feishu` channel: POST to a Feishu / Lark custom-bot `url`, signed with `secret`.
#[derive(Debug)]
pub struct Feishu {
    url: Secret,
    secret: Option<Secret>,
}

impl ChannelType for Feishu {
    const TYPE: &'static str = "feishu";

    fn parse(section: &mut Section<'_>) -> Result<Self, SectionError> {
        let c: SignedUrlSection = section.deserialize()?;
        let (url, secret) = c.resolve(section)?;
        Ok(Feishu { url, secret })
    }
}

impl Channel for Feishu {
    fn secrets(&self) -> Vec<&Secret> {
        std::iter::once(&self.url).chain(&self.secret).collect()
    }

    fn render(&self, n: &Notification, env: &RenderEnv) -> Result<Vec<Request>, String> {
        let body = render_signed(n, self.secret.as_ref().map(Secret::expose), env.now_ms);
        Ok(vec![Request::Http(HttpRequest::post_json(
            self.url.clone(),
            &n.id,
            &body,
        ))])
    }

    /// Feishu answers HTTP 200 even on failure: `code` (or `StatusCode`) must be 0; 11232 is
    /// its rate limit.
    fn judge(&self, r: &Response) -> Result<(), SendError> {
        let json = judge_status(r)?;
        match json_code(json.as_ref(), &["code", "StatusCode"]).filter(|c| *c != 0) {
            None => Ok(()),
            Some(c) => Err(body_error(r, c, c == 11232)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::*;
    use crate::model::AlertStatus;

    #[test]
    fn signature_matches_the_reference_algorithm() {
        // HMAC-SHA256 with key "1599360473\ntest" over the empty message, base64.
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"1599360473\ntest");
        let expected =
            base64::engine::general_purpose::STANDARD.encode(ring::hmac::sign(&key, b"").as_ref());
        assert_eq!(sign("test", 1_599_360_473), expected);
        assert_eq!(sign("test", 1_599_360_473).len(), 44);
    }

    #[test]
    fn golden() {
        let n = notification(vec![alert(1, AlertStatus::Firing)]);
        let got = render_signed(&n, Some("s3cret"), 1_599_360_473_123);
        assert_eq!(got["msg_type"], "text");
        assert!(got["content"]["text"]
            .as_str()
            .unwrap()
            .starts_with("[CRITICAL]"));
        assert_eq!(got["timestamp"], "1599360473");
        assert_eq!(got["sign"], sign("s3cret", 1_599_360_473));
        assert!(render_signed(&n, None, 0).get("sign").is_none());
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
        let c = Feishu {
            url: Secret::new("http://x"),
            secret: None,
        };
        let e = c
            .judge(&response(200, r#"{"code":19021,"msg":"sign match fail"}"#))
            .unwrap_err();
        assert!(!e.retryable && e.message.contains("19021"));
        assert!(c.judge(&response(200, r#"{"code":0}"#)).is_ok());
        assert!(c.judge(&response(200, r#"{"code":11232}"#)).unwrap_err().retryable);
    }

    /// A long digest is cut to what Feishu takes (bodies over 20 KB are refused).
    #[test]
    fn long_messages_are_cut() {
        let alerts: Vec<_> = (0..100)
            .map(|g| {
                let mut a = alert(g, AlertStatus::Firing);
                a.annotations.insert("description".into(), "x".repeat(900));
                a
            })
            .collect();
        let body = serde_json::to_string(&render(&notification(alerts))).unwrap();
        assert!(body.len() < 20_000, "{}", body.len());
    }
}
