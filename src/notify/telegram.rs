//! Telegram bot `sendMessage`: HTML parse mode (MarkdownV2 needs heavy escaping), text ≤ 4096
//! characters, silent (no sound) unless critical. Telegram answers `{"ok":true}`; 429 carries
//! `parameters.retry_after`.

use std::path::PathBuf;

use serde::Deserialize;
use serde_json::{json, Value};

use super::render::{html_escape, text, title, truncate_chars};
use super::channel::{
    base_url, check_url, judge_status, json_code, body_error, Channel, ChannelType, HttpRequest,
    RenderEnv, Request, Response, Section, SectionError,
};
use super::secret::Secret;
use super::transport::SendError;
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

/// `[[channel]] type = "telegram"` keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TelegramSection {
    /// API base (default `https://api.telegram.org`).
    url: Option<String>,
    url_env: Option<String>,
    url_file: Option<PathBuf>,
    /// Bot token.
    token: Option<String>,
    token_env: Option<String>,
    token_file: Option<PathBuf>,
    /// Chat id: a number or `"@channelname"`.
    chat_id: Option<toml::Value>,
}

/// The `telegram` channel: `POST {url}/bot{token}/sendMessage`.
#[derive(Debug)]
pub struct Telegram {
    /// The full `sendMessage` URL (embeds the token).
    url: Secret,
    token: Secret,
    chat_id: String,
}

impl ChannelType for Telegram {
    const TYPE: &'static str = "telegram";

    fn parse(section: &mut Section<'_>) -> Result<Self, SectionError> {
        let c: TelegramSection = section.deserialize()?;
        let base = section.secret(
            "url",
            c.url.as_deref(),
            c.url_env.as_deref(),
            c.url_file.as_deref(),
        )?;
        let token = section.required_secret(
            "token",
            c.token.as_deref(),
            c.token_env.as_deref(),
            c.token_file.as_deref(),
        )?;
        let chat_id = match c.chat_id {
            None => return Err("`chat_id` is required".into()),
            Some(toml::Value::String(s)) => s,
            Some(toml::Value::Integer(i)) => i.to_string(),
            Some(_) => return Err("`chat_id` must be a number or a string".into()),
        };
        let base = base.map_or_else(|| "https://api.telegram.org".to_string(), |u| base_url(&u));
        let url = Secret::new(format!("{base}/bot{}/sendMessage", token.expose()));
        check_url(url.expose())?;
        Ok(Telegram {
            url,
            token,
            chat_id,
        })
    }
}

impl Channel for Telegram {
    /// The token first, so redacted text keeps the URL's shape (`…/bot***/sendMessage`).
    fn secrets(&self) -> Vec<&Secret> {
        vec![&self.token, &self.url]
    }

    fn render(&self, n: &Notification, _env: &RenderEnv) -> Result<Vec<Request>, String> {
        Ok(vec![Request::Http(HttpRequest::post_json(
            self.url.clone(),
            &n.id,
            &render(n, &self.chat_id),
        ))])
    }

    /// `{"ok": false, "error_code": …}` is a failure even with HTTP 200.
    fn judge(&self, r: &Response) -> Result<(), SendError> {
        let json = judge_status(r)?;
        match json
            .as_ref()
            .and_then(|j| j.get("ok"))
            .and_then(Value::as_bool)
        {
            Some(false) => Err(body_error(
                r,
                json_code(json.as_ref(), &["error_code"]).unwrap_or(-1),
                false,
            )),
            _ => Ok(()),
        }
    }
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

    fn response(status: u16, body: &str) -> Response {
        Response {
            status,
            retry_after: None,
            body: body.into(),
        }
    }

    #[test]
    fn judges_ok_false() {
        let c = Telegram {
            url: Secret::new("http://x"),
            token: Secret::new("t"),
            chat_id: "1".into(),
        };
        assert!(c.judge(&response(200, r#"{"ok":false,"error_code":400}"#)).is_err());
        assert!(c.judge(&response(200, r#"{"ok":true}"#)).is_ok());
        let e = c
            .judge(&Response {
                status: 429,
                retry_after: None,
                body: r#"{"ok":false,"parameters":{"retry_after":3}}"#.into(),
            })
            .unwrap_err();
        assert_eq!(e.retry_after_ms, Some(3000));
    }
}
