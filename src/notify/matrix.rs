//! Matrix: a client-server API send, `PUT {url}/_matrix/client/v3/rooms/{room}/send/
//! m.room.message/{txnId}` with `Authorization: Bearer {token}` and an `m.text` event (plain
//! `body` plus `org.matrix.custom.html` `formatted_body`). The transaction id is the
//! notification's stable id, so the homeserver drops a retried duplicate. The bot user must have
//! joined `room` (a room id, `!…:server`). Matrix answers 200 `{"event_id": …}`; 429
//! `M_LIMIT_EXCEEDED` carries `retry_after_ms`.

use std::path::PathBuf;

use serde::Deserialize;
use serde_json::{json, Value};

use super::channel::{
    base_url, check_url, percent_encode, Channel, ChannelType, HttpRequest, Method, RenderEnv,
    Request, Section, SectionError, UrlSection,
};
use super::render::{html_escape, text, title};
use super::secret::Secret;
use super::Notification;

/// `[[channel]] type = "matrix"` keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MatrixSection {
    /// The homeserver, e.g. `https://matrix.example.org`.
    url: Option<String>,
    url_env: Option<String>,
    url_file: Option<PathBuf>,
    /// Room id, `!abcdef:example.org`.
    room: Option<String>,
    /// Access token of the bot user.
    token: Option<String>,
    token_env: Option<String>,
    token_file: Option<PathBuf>,
}

/// The `matrix` channel.
#[derive(Debug)]
pub struct Matrix {
    homeserver: Secret,
    room: String,
    token: Secret,
}

impl ChannelType for Matrix {
    const TYPE: &'static str = "matrix";

    fn parse(section: &mut Section<'_>) -> Result<Self, SectionError> {
        let c: MatrixSection = section.deserialize()?;
        let homeserver = UrlSection {
            url: c.url,
            url_env: c.url_env,
            url_file: c.url_file,
        }
        .required(section)?;
        let room = c.room.ok_or("`room` (a room id, \"!…:server\") is required")?;
        if !room.starts_with('!') || !room.contains(':') {
            return Err(format!(
                "`room` must be a room id like \"!abc:example.org\", not {room:?}"
            )
            .into());
        }
        let token = section.required_secret(
            "token",
            c.token.as_deref(),
            c.token_env.as_deref(),
            c.token_file.as_deref(),
        )?;
        let m = Matrix {
            homeserver,
            room,
            token,
        };
        check_url(m.url("0").expose())?;
        Ok(m)
    }
}

impl Matrix {
    fn url(&self, txn_id: &str) -> Secret {
        Secret::new(format!(
            "{}/_matrix/client/v3/rooms/{}/send/m.room.message/{}",
            base_url(&self.homeserver),
            percent_encode(&self.room),
            percent_encode(txn_id)
        ))
    }
}

/// The event content.
pub fn render(n: &Notification) -> Value {
    // Homeservers refuse events over 64 KiB: the text and its HTML copy share that.
    let body = super::render::truncate_bytes(&text(n), 24_000);
    let rest = body.split_once('\n').map_or("", |(_, r)| r).trim_start();
    let html = format!(
        "<b>{}</b><br>{}",
        html_escape(&title(n)),
        html_escape(rest).replace('\n', "<br>")
    );
    json!({
        "msgtype": "m.text",
        "body": body,
        "format": "org.matrix.custom.html",
        "formatted_body": html,
    })
}

impl Channel for Matrix {
    fn secrets(&self) -> Vec<&Secret> {
        vec![&self.homeserver, &self.token]
    }

    fn render(&self, n: &Notification, _env: &RenderEnv) -> Result<Vec<Request>, String> {
        Ok(vec![Request::Http(
            HttpRequest::new(Method::Put, self.url(&n.id), &n.id)
                .secret_header("Authorization", format!("Bearer {}", self.token.expose()))
                .json(&render(n)),
        )])
    }
}

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::*;
    use crate::model::AlertStatus;

    #[test]
    fn event_and_url() {
        let n = notification(vec![alert(1, AlertStatus::Firing)]);
        let got = render(&n);
        assert_eq!(got["msgtype"], "m.text");
        assert!(got["formatted_body"]
            .as_str()
            .unwrap()
            .starts_with("<b>[CRITICAL] XidCritical on node7: GPU 1</b><br>GPU 1 reported"));
        let m = Matrix {
            homeserver: Secret::new("https://hs.example/"),
            room: "!abc:hs.example".into(),
            token: Secret::new("syt_x"),
        };
        assert_eq!(
            m.url("id1").expose(),
            "https://hs.example/_matrix/client/v3/rooms/%21abc%3Ahs.example/send/m.room.message/id1"
        );
    }
}
