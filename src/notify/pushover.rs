//! Pushover: `POST https://api.pushover.net/1/messages.json` (form fields `token`, `user`,
//! `title` ≤ 250 characters, `message` ≤ 1024 characters, `priority`, `timestamp`). Priority: 1
//! (high, bypasses the user's quiet hours) for firing critical alerts — 2 (emergency: repeated
//! every `retry` seconds until acknowledged or `expire`) with `emergency = true` — 0 for
//! warnings, -1 for info, resolved and test messages. Pushover answers 200 with `{"status":1}`;
//! 4xx with `{"status":0,"errors":[…]}` is permanent, 429 (over quota) and 5xx are retried.

use std::path::PathBuf;

use serde::Deserialize;

use super::channel::{
    body_error, check_url, judge_status, Channel, ChannelType, HttpRequest, Method, RenderEnv,
    Request, Response, Section, SectionError,
};
use super::render::{text, title, truncate_chars};
use super::secret::Secret;
use super::transport::SendError;
use super::{Notification, Reason};
use crate::model::{AlertStatus, Severity};

/// The public API endpoint.
pub const API_URL: &str = "https://api.pushover.net/1/messages.json";

/// Seconds between repeats of an emergency message, and when they stop.
const EMERGENCY_RETRY_S: &str = "60";
const EMERGENCY_EXPIRE_S: &str = "3600";

/// `[[channel]] type = "pushover"` keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PushoverSection {
    /// API endpoint (default the public API; for a proxy or a test receiver).
    url: Option<String>,
    /// Application API token.
    token: Option<String>,
    token_env: Option<String>,
    token_file: Option<PathBuf>,
    /// User (or group) key.
    user: Option<String>,
    user_env: Option<String>,
    user_file: Option<PathBuf>,
    /// Send firing critical alerts as emergency (priority 2) messages.
    #[serde(default)]
    emergency: bool,
}

/// The `pushover` channel.
#[derive(Debug)]
pub struct Pushover {
    url: String,
    token: Secret,
    user: Secret,
    emergency: bool,
}

impl ChannelType for Pushover {
    const TYPE: &'static str = "pushover";

    fn parse(section: &mut Section<'_>) -> Result<Self, SectionError> {
        let c: PushoverSection = section.deserialize()?;
        let url = c.url.unwrap_or_else(|| API_URL.to_string());
        check_url(&url)?;
        let token = section.required_secret(
            "token",
            c.token.as_deref(),
            c.token_env.as_deref(),
            c.token_file.as_deref(),
        )?;
        let user = section.required_secret(
            "user",
            c.user.as_deref(),
            c.user_env.as_deref(),
            c.user_file.as_deref(),
        )?;
        Ok(Pushover {
            url,
            token,
            user,
            emergency: c.emergency,
        })
    }
}

/// Pushover priority (-2…2) for `n`.
fn priority(n: &Notification, emergency: bool) -> i8 {
    match (n.reason, n.status, n.severity()) {
        (Reason::Test, _, _) | (_, AlertStatus::Resolved, _) | (_, _, Severity::Info) => -1,
        (_, _, Severity::Critical) if emergency => 2,
        (_, _, Severity::Critical) => 1,
        (_, _, Severity::Warning) => 0,
    }
}

impl Channel for Pushover {
    fn secrets(&self) -> Vec<&Secret> {
        vec![&self.token, &self.user]
    }

    fn render(&self, n: &Notification, _env: &RenderEnv) -> Result<Vec<Request>, String> {
        let body = text(n);
        let rest = body.split_once('\n').map_or("", |(_, r)| r).trim_start();
        let title = truncate_chars(&title(n), 250);
        let message = truncate_chars(rest, 1024);
        let priority = priority(n, self.emergency);
        let priority_text = priority.to_string();
        let timestamp = n.created_ms.div_euclid(1000).to_string();
        let mut fields = vec![
            ("token", self.token.expose()),
            ("user", self.user.expose()),
            ("title", title.as_str()),
            ("message", message.as_str()),
            ("priority", priority_text.as_str()),
            ("timestamp", timestamp.as_str()),
        ];
        if priority == 2 {
            fields.push(("retry", EMERGENCY_RETRY_S));
            fields.push(("expire", EMERGENCY_EXPIRE_S));
        }
        Ok(vec![Request::Http(
            HttpRequest::new(Method::Post, Secret::new(&self.url), &n.id).form(&fields),
        )])
    }

    /// 2xx with `"status": 1`.
    fn judge(&self, r: &Response) -> Result<(), SendError> {
        let json = judge_status(r)?;
        match json
            .as_ref()
            .and_then(|j| j.get("status"))
            .and_then(serde_json::Value::as_i64)
        {
            Some(1) | None => Ok(()),
            Some(s) => Err(body_error(r, format!("status {s}"), false)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::*;

    #[test]
    fn priorities() {
        let n = notification(vec![alert(1, AlertStatus::Firing)]);
        assert_eq!(priority(&n, false), 1);
        assert_eq!(priority(&n, true), 2);
        let n = notification(vec![alert(1, AlertStatus::Resolved)]);
        assert_eq!(priority(&n, true), -1);
    }

    #[test]
    fn judges_status_field() {
        let p = Pushover {
            url: API_URL.into(),
            token: Secret::new("t"),
            user: Secret::new("u"),
            emergency: false,
        };
        let r = |status: u16, body: &str| Response {
            status,
            retry_after: None,
            body: body.into(),
        };
        assert!(p.judge(&r(200, r#"{"status":1,"request":"x"}"#)).is_ok());
        let e = p
            .judge(&r(400, r#"{"status":0,"errors":["user key is invalid"]}"#))
            .unwrap_err();
        assert!(!e.retryable && e.message.contains("user key is invalid"));
        assert!(p.judge(&r(429, "")).unwrap_err().retryable);
    }
}
