//! Slack incoming webhook: `{"text": …}` with the title in bold and the plain-text body.
//! Slack answers 200 `ok`; 429 carries `Retry-After`.

use serde_json::{json, Value};

use super::{render as text, Notification};
use super::channel::{Channel, ChannelType, HttpRequest, RenderEnv, Request, Section, SectionError, UrlSection};
use super::secret::Secret;

/// Escapes Slack's three control characters.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The request body.
pub fn render(n: &Notification) -> Value {
    let body = text::text(n);
    let rest = body.split_once('\n').map_or("", |(_, r)| r);
    json!({
        "text": format!("*{}*\n{}", escape(&text::title(n)), escape(rest.trim_start_matches('\n'))),
        "username": "gpuwatch",
    })
}

/// The `slack` channel: POST to a Slack incoming-webhook `url`.
#[derive(Debug)]
pub struct Slack {
    url: Secret,
}

impl ChannelType for Slack {
    const TYPE: &'static str = "slack";

    fn parse(section: &mut Section<'_>) -> Result<Self, SectionError> {
        let c: UrlSection = section.deserialize()?;
        Ok(Slack {
            url: c.required(section)?,
        })
    }
}

impl Channel for Slack {
    fn secrets(&self) -> Vec<&Secret> {
        vec![&self.url]
    }

    fn render(&self, n: &Notification, _env: &RenderEnv) -> Result<Vec<Request>, String> {
        Ok(vec![Request::Http(HttpRequest::post_json(
            self.url.clone(),
            &n.id,
            &render(n),
        ))])
    }
}

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::*;
    use crate::model::AlertStatus;

    #[test]
    fn golden() {
        let n = notification(vec![alert(1, AlertStatus::Firing)]);
        let got = render(&n);
        let t = got["text"].as_str().unwrap();
        assert!(
            t.starts_with("*[CRITICAL] XidCritical on node7: GPU 1*\nGPU 1 reported XID 79"),
            "{t}"
        );
        assert!(t.contains("  Values: xid=79\n"), "{t}");
        assert_eq!(got["username"], "gpuwatch");
    }
}
