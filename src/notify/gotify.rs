//! Gotify: `POST {url}/message` with the application token in the `X-Gotify-Key` header and a
//! JSON body `{"title", "message", "priority", "extras"}`. Priority: 8 for firing critical
//! alerts (Android shows it as a heads-up notification), 5 warning, 2 info, resolved and test.
//! Gotify answers 200 with the stored message; 401/403 for a bad token.

use std::path::PathBuf;

use serde::Deserialize;
use serde_json::{json, Value};

use super::channel::{
    base_url, check_url, Channel, ChannelType, HttpRequest, RenderEnv, Request, Section,
    SectionError, UrlSection,
};
use super::render::{text, title};
use super::secret::Secret;
use super::{Notification, Reason};
use crate::model::{AlertStatus, Severity};

/// `[[channel]] type = "gotify"` keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GotifySection {
    /// The server, e.g. `https://gotify.example.org`.
    url: Option<String>,
    url_env: Option<String>,
    url_file: Option<PathBuf>,
    /// Application token.
    token: Option<String>,
    token_env: Option<String>,
    token_file: Option<PathBuf>,
}

/// The `gotify` channel.
#[derive(Debug)]
pub struct Gotify {
    /// `{url}/message`.
    url: Secret,
    token: Secret,
}

impl ChannelType for Gotify {
    const TYPE: &'static str = "gotify";

    fn parse(section: &mut Section<'_>) -> Result<Self, SectionError> {
        let c: GotifySection = section.deserialize()?;
        let server = UrlSection {
            url: c.url,
            url_env: c.url_env,
            url_file: c.url_file,
        }
        .required(section)?;
        let url = Secret::new(format!("{}/message", base_url(&server)));
        check_url(url.expose())?;
        let token = section.required_secret(
            "token",
            c.token.as_deref(),
            c.token_env.as_deref(),
            c.token_file.as_deref(),
        )?;
        Ok(Gotify { url, token })
    }
}

/// Gotify priority (0–10).
fn priority(n: &Notification) -> u8 {
    match (n.reason, n.status, n.severity()) {
        (Reason::Test, _, _) | (_, AlertStatus::Resolved, _) | (_, _, Severity::Info) => 2,
        (_, _, Severity::Critical) => 8,
        (_, _, Severity::Warning) => 5,
    }
}

/// The request body.
pub fn render(n: &Notification) -> Value {
    let body = text(n);
    let rest = body.split_once('\n').map_or("", |(_, r)| r).trim_start();
    json!({
        "title": title(n),
        "message": rest,
        "priority": priority(n),
        "extras": {"client::display": {"contentType": "text/plain"}},
    })
}

impl Channel for Gotify {
    fn secrets(&self) -> Vec<&Secret> {
        vec![&self.url, &self.token]
    }

    fn render(&self, n: &Notification, _env: &RenderEnv) -> Result<Vec<Request>, String> {
        Ok(vec![Request::Http(
            HttpRequest::post_json(self.url.clone(), &n.id, &render(n))
                .secret_header("X-Gotify-Key", self.token.expose()),
        )])
    }
}

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::*;

    #[test]
    fn body() {
        let n = notification(vec![alert(1, AlertStatus::Firing)]);
        let got = render(&n);
        assert_eq!(got["title"], "[CRITICAL] XidCritical on node7: GPU 1");
        assert_eq!(got["priority"], 8);
        assert!(got["message"]
            .as_str()
            .unwrap()
            .starts_with("GPU 1 reported XID 79"));
    }
}
