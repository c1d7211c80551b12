//! Twilio Messages API: `POST {url}/2010-04-01/Accounts/{account_sid}/Messages.json`, form
//! fields `To`, `From` (or `MessagingServiceSid` when `from` is an `MG…` service id) and `Body`,
//! HTTP basic auth `account_sid:token`; one request per recipient. Twilio answers 201 with the
//! message resource; errors are JSON `{"code", "message", "status"}` with a 4xx status (429 for
//! its rate limit, retried).

use std::path::PathBuf;

use base64::Engine as _;
use serde::Deserialize;

use super::{check_numbers, short_text};
use crate::notify::channel::{
    check_url, Channel, HttpRequest, Method, RenderEnv, Request, Section, SectionError,
};
use crate::notify::secret::Secret;
use crate::notify::Notification;

/// The public API.
pub const API_URL: &str = "https://api.twilio.com";

/// `[[channel]] type = "sms"`, `provider = "twilio"` keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TwilioSection {
    /// API base (default the public API; for a proxy or a test receiver).
    url: Option<String>,
    /// Account SID (`AC…`).
    account_sid: Option<String>,
    /// Auth token.
    token: Option<String>,
    token_env: Option<String>,
    token_file: Option<PathBuf>,
    /// Sender: a Twilio number (E.164) or a Messaging Service SID (`MG…`).
    from: Option<String>,
    /// Recipients (E.164).
    #[serde(default)]
    to: Vec<String>,
}

/// Twilio settings.
#[derive(Debug)]
pub struct Twilio {
    url: String,
    account_sid: String,
    token: Secret,
    from: String,
    to: Vec<String>,
}

impl Twilio {
    /// Parses the provider's keys.
    pub fn parse(section: &mut Section<'_>) -> Result<Self, SectionError> {
        let c: TwilioSection = section.deserialize()?;
        let base = c.url.unwrap_or_else(|| API_URL.to_string());
        let account_sid = c.account_sid.ok_or("`account_sid` is required")?;
        if account_sid.is_empty() || !account_sid.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err("`account_sid` must be letters and digits (AC…)".into());
        }
        let url = format!(
            "{}/2010-04-01/Accounts/{account_sid}/Messages.json",
            base.trim_end_matches('/')
        );
        check_url(&url)?;
        let token = section.required_secret(
            "token",
            c.token.as_deref(),
            c.token_env.as_deref(),
            c.token_file.as_deref(),
        )?;
        let from = c.from.ok_or("`from` (a number or MG… service id) is required")?;
        check_numbers(&c.to)?;
        Ok(Twilio {
            url,
            account_sid,
            token,
            from,
            to: c.to,
        })
    }
}

impl Channel for Twilio {
    fn secrets(&self) -> Vec<&Secret> {
        vec![&self.token]
    }

    fn render(&self, n: &Notification, _env: &RenderEnv) -> Result<Vec<Request>, String> {
        let text = short_text(n);
        let auth = base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{}", self.account_sid, self.token.expose()));
        let sender = if self.from.starts_with("MG") {
            "MessagingServiceSid"
        } else {
            "From"
        };
        Ok(self
            .to
            .iter()
            .enumerate()
            .map(|(i, to)| {
                Request::Http(
                    HttpRequest::new(Method::Post, Secret::new(&self.url), &n.id)
                        .idempotency_key(&format!("{}-{}", n.id, i + 1))
                        .secret_header("Authorization", format!("Basic {auth}"))
                        .form(&[("To", to), (sender, &self.from), ("Body", &text)]),
                )
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::AlertStatus;
    use crate::notify::testdata::{alert, notification};

    #[test]
    fn a_messaging_service_sender_and_one_request_per_recipient() {
        let t = Twilio {
            url: format!("{API_URL}/2010-04-01/Accounts/AC1/Messages.json"),
            account_sid: "AC1".into(),
            token: Secret::new("tok"),
            from: "MG0123".into(),
            to: vec!["+1555".into(), "+1666".into(), "+1777".into()],
        };
        let n = notification(vec![alert(1, AlertStatus::Firing)]);
        let env = RenderEnv {
            now_ms: 0,
            nonce: String::new(),
        };
        let reqs = t.render(&n, &env).unwrap();
        assert_eq!(reqs.len(), 3);
        let Request::Http(r) = &reqs[2] else {
            panic!("http")
        };
        let body = String::from_utf8(r.body.clone()).unwrap();
        assert!(
            body.starts_with("To=%2B1777&MessagingServiceSid=MG0123&Body=%5BCRIT%5D"),
            "{body}"
        );
        let key = r.headers.iter().find(|h| h.name == "Idempotency-Key").unwrap();
        assert_eq!(key.value, format!("{}-3", n.id));
        let auth = r.headers.iter().find(|h| h.name == "Authorization").unwrap();
        assert!(auth.secret);
        assert_eq!(
            auth.value,
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode("AC1:tok")
            )
        );
    }
}
