//! DingTalk custom robot: `{"msgtype":"text","text":{"content":…}}`; when a secret is set the URL
//! gets `&timestamp=<unix ms>&sign=<urlencode(base64(HMAC-SHA256(key = secret,
//! message = "{timestamp}\n{secret}")))>`. DingTalk answers 200 with `errcode == 0`; a robot in
//! "keyword" mode needs its keyword in the text (the title always contains `gpuwatch`-style
//! tags and the host name).

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
use crate::model::{AlertStatus, Severity};

/// The request body.
pub fn render(n: &Notification) -> Value {
    json!({
        "msgtype": "text",
        // DingTalk refuses messages over about 20 KB (a night's digest can be longer).
        "text": {"content": truncate_bytes(&text(n), MAX_TEXT_BYTES)},
        "at": {"atMobiles": [], "isAtAll": n.status == AlertStatus::Firing && n.severity() == Severity::Critical},
    })
}

/// The signature for `timestamp_ms` (not yet URL-encoded).
pub fn sign(secret: &str, timestamp_ms: i64) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = ring::hmac::sign(&key, format!("{timestamp_ms}\n{secret}").as_bytes());
    base64::engine::general_purpose::STANDARD.encode(tag.as_ref())
}

/// `url` with `timestamp` and `sign` appended (URL-encoded).
pub fn signed_url(url: &str, secret: &str, now_ms: i64) -> Result<String, String> {
    let mut u = reqwest::Url::parse(url).map_err(|e| format!("bad URL: {e}"))?;
    u.query_pairs_mut()
        .append_pair("timestamp", &now_ms.to_string())
        .append_pair("sign", &sign(secret, now_ms));
    Ok(u.to_string())
}

/// The `dingtalk` channel: POST to a custom-robot `url`, signed on the URL with `secret`.
#[derive(Debug)]
pub struct Dingtalk {
    url: Secret,
    secret: Option<Secret>,
}

impl ChannelType for Dingtalk {
    const TYPE: &'static str = "dingtalk";

    fn parse(section: &mut Section<'_>) -> Result<Self, SectionError> {
        let c: SignedUrlSection = section.deserialize()?;
        let (url, secret) = c.resolve(section)?;
        Ok(Dingtalk { url, secret })
    }
}

impl Channel for Dingtalk {
    fn secrets(&self) -> Vec<&Secret> {
        std::iter::once(&self.url).chain(&self.secret).collect()
    }

    fn render(&self, n: &Notification, env: &RenderEnv) -> Result<Vec<Request>, String> {
        let url = match &self.secret {
            Some(s) => Secret::new(signed_url(self.url.expose(), s.expose(), env.now_ms)?),
            None => self.url.clone(),
        };
        Ok(vec![Request::Http(HttpRequest::post_json(
            url,
            &n.id,
            &render(n),
        ))])
    }

    /// `errcode` must be 0; 130101 is the rate limit.
    fn judge(&self, r: &Response) -> Result<(), SendError> {
        let json = judge_status(r)?;
        match json_code(json.as_ref(), &["errcode"]).filter(|c| *c != 0) {
            None => Ok(()),
            Some(c) => Err(body_error(r, c, c == 130_101)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::*;

    #[test]
    fn signed_url_is_encoded() {
        let url = signed_url(
            "https://oapi.dingtalk.com/robot/send?access_token=abc",
            "SECtest",
            1_700_000_000_000,
        )
        .unwrap();
        let sig = sign("SECtest", 1_700_000_000_000);
        let encoded = sig
            .replace('+', "%2B")
            .replace('/', "%2F")
            .replace('=', "%3D");
        assert_eq!(
            url,
            format!("https://oapi.dingtalk.com/robot/send?access_token=abc&timestamp=1700000000000&sign={encoded}")
        );
    }

    #[test]
    fn golden() {
        let n = notification(vec![alert(1, AlertStatus::Firing)]);
        let got = render(&n);
        assert_eq!(got["msgtype"], "text");
        assert_eq!(got["at"]["isAtAll"], true);
        assert!(got["text"]["content"].as_str().unwrap().contains("node7"));
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
        let c = Dingtalk {
            url: Secret::new("http://x"),
            secret: None,
        };
        assert!(c.judge(&response(200, r#"{"errcode":310000}"#)).is_err());
        assert!(c.judge(&response(200, r#"{"errcode":0}"#)).is_ok());
    }
}
