//! DingTalk custom robot: `{"msgtype":"text","text":{"content":…}}`; when a secret is set the URL
//! gets `&timestamp=<unix ms>&sign=<urlencode(base64(HMAC-SHA256(key = secret,
//! message = "{timestamp}\n{secret}")))>`. DingTalk answers 200 with `errcode == 0`; a robot in
//! "keyword" mode needs its keyword in the text (the title always contains `gpuwatch`-style
//! tags and the host name).

use base64::Engine as _;
use serde_json::{json, Value};

use super::render::text;
use super::Notification;
use crate::model::{AlertStatus, Severity};

/// The request body.
pub fn render(n: &Notification) -> Value {
    json!({
        "msgtype": "text",
        "text": {"content": text(n)},
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
}
