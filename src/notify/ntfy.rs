//! ntfy (<https://ntfy.sh> or a self-hosted server): `POST {topic URL}` with the message as the
//! plain-text body (≤ 4096 bytes, ntfy's message limit) and the title, priority and tags in
//! headers (`Title`, `Priority` 1–5, `Tags`). A non-ASCII title is sent RFC 2047-encoded
//! (`=?UTF-8?B?…?=`), which ntfy decodes. With `token`: `Authorization: Bearer {token}`. ntfy
//! answers 200 with the message as JSON; 429 when the visitor rate limit is hit.

use std::path::PathBuf;

use base64::Engine as _;
use serde::Deserialize;

use super::channel::{
    Channel, ChannelType, HttpRequest, Method, RenderEnv, Request, Section, SectionError,
    UrlSection,
};
use super::render::{text, title, truncate_bytes};
use super::secret::Secret;
use super::{Notification, Reason};
use crate::model::{AlertStatus, Severity};

/// `[[channel]] type = "ntfy"` keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NtfySection {
    /// The topic URL, e.g. `https://ntfy.sh/gpu-alerts-7f3a` (a secret: on a public server the
    /// topic name is the password).
    url: Option<String>,
    url_env: Option<String>,
    url_file: Option<PathBuf>,
    /// Access token (optional).
    token: Option<String>,
    token_env: Option<String>,
    token_file: Option<PathBuf>,
}

/// The `ntfy` channel.
#[derive(Debug)]
pub struct Ntfy {
    url: Secret,
    token: Option<Secret>,
}

impl ChannelType for Ntfy {
    const TYPE: &'static str = "ntfy";

    fn parse(section: &mut Section<'_>) -> Result<Self, SectionError> {
        let c: NtfySection = section.deserialize()?;
        let url = UrlSection {
            url: c.url,
            url_env: c.url_env,
            url_file: c.url_file,
        }
        .required(section)?;
        let token = section.secret(
            "token",
            c.token.as_deref(),
            c.token_env.as_deref(),
            c.token_file.as_deref(),
        )?;
        Ok(Ntfy { url, token })
    }
}

/// ntfy priority: 5 (urgent) for firing critical, 4 warning, 3 info, 2 resolved or test.
fn priority(n: &Notification) -> u8 {
    match (n.reason, n.status, n.severity()) {
        (Reason::Test, _, _) | (_, AlertStatus::Resolved, _) => 2,
        (_, _, Severity::Critical) => 5,
        (_, _, Severity::Warning) => 4,
        (_, _, Severity::Info) => 3,
    }
}

/// ntfy tags (emoji short codes shown before the title).
fn tags(n: &Notification) -> &'static str {
    match (n.status, n.severity()) {
        (AlertStatus::Resolved, _) => "white_check_mark,gpuwatch",
        (_, Severity::Critical) => "rotating_light,gpuwatch",
        (_, Severity::Warning) => "warning,gpuwatch",
        (_, Severity::Info) => "information_source,gpuwatch",
    }
}

/// A header value: as is when printable ASCII, else RFC 2047 base64.
pub fn header_text(s: &str) -> String {
    if s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        s.to_string()
    } else {
        format!(
            "=?UTF-8?B?{}?=",
            base64::engine::general_purpose::STANDARD.encode(s.as_bytes())
        )
    }
}

/// The request.
pub fn render(n: &Notification, url: Secret, token: Option<&Secret>) -> HttpRequest {
    let body = text(n);
    let rest = body.split_once('\n').map_or("", |(_, r)| r).trim_start();
    let mut req = HttpRequest::new(Method::Post, url, &n.id)
        .header("Title", header_text(&title(n)))
        .header("Priority", priority(n).to_string())
        .header("Tags", tags(n))
        .header("Markdown", "no");
    if let Some(t) = token {
        req = req.secret_header("Authorization", format!("Bearer {}", t.expose()));
    }
    req.body(
        "text/plain; charset=utf-8",
        truncate_bytes(rest, 4096).into_bytes(),
    )
}

impl Channel for Ntfy {
    fn secrets(&self) -> Vec<&Secret> {
        std::iter::once(&self.url).chain(&self.token).collect()
    }

    fn render(&self, n: &Notification, _env: &RenderEnv) -> Result<Vec<Request>, String> {
        Ok(vec![Request::Http(render(
            n,
            self.url.clone(),
            self.token.as_ref(),
        ))])
    }
}

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::*;

    #[test]
    fn headers_carry_title_priority_and_tags() {
        let n = notification(vec![alert(1, AlertStatus::Firing)]);
        let r = render(&n, Secret::new("http://x/t"), Some(&Secret::new("tk_1")));
        let h = |name: &str| {
            r.headers
                .iter()
                .find(|h| h.name == name)
                .map(|h| h.value.as_str())
        };
        assert_eq!(h("Title"), Some("[CRITICAL] XidCritical on node7: GPU 1"));
        assert_eq!(h("Priority"), Some("5"));
        assert_eq!(h("Tags"), Some("rotating_light,gpuwatch"));
        assert_eq!(h("Authorization"), Some("Bearer tk_1"));
        let body = String::from_utf8(r.body).unwrap();
        assert!(body.starts_with("GPU 1 reported XID 79"), "{body}");
    }

    #[test]
    fn non_ascii_titles_are_rfc2047_encoded() {
        assert_eq!(header_text("GPU 1"), "GPU 1");
        assert_eq!(header_text("节点"), "=?UTF-8?B?6IqC54K5?=");
    }
}
