//! The channel registry: what a channel type is, and the one list of them.
//!
//! A channel type is one file under `notify/` with a struct implementing [`Channel`] (render the
//! request(s) for a [`Notification`], judge the response) and [`ChannelType`] (its `type` name
//! and how it parses its own `[[channel]]` table). The list is the `channel::registry!` call in
//! `notify.rs`.
//!
//! **Adding a channel**: write `notify/<name>.rs` (copy the shape of `gotify.rs`: a
//! `#[serde(deny_unknown_fields)]` section struct, `ChannelType::parse`, `Channel::render`, and
//! `Channel::judge` when the API reports failures inside a 2xx body, as `feishu.rs` does), and
//! add one line `<name>::<Type>,` to `registry!` in `notify.rs`. Then document its keys in
//! `config.example.toml` and `docs/notifications.md`, and bless its golden file
//! (`GPUWATCH_BLESS=1 cargo test --lib notify::golden`).
//!
//! The common keys `name`, `type`, `send_resolved`, `timeout` and `max_alerts` are read by
//! `settings`; a channel's parser sees the rest of its table, with positions into the config
//! file, so errors name `file:line:column`. [`transport`](super::transport) only carries the
//! rendered bytes.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::secret::{self, Secret};
use super::transport::SendError;
use super::Notification;

/// Declares the channel modules and [`CHANNELS`](super::CHANNELS), one line per channel type:
/// `module::Type,` where `notify/module.rs` defines `Type: ChannelType`.
macro_rules! registry {
    ($($module:ident :: $ty:ident),+ $(,)?) => {
        $(pub mod $module;)+

        /// Every channel type (an unknown `type` error lists them in this order).
        pub static CHANNELS: &[channel::Registration] = &[
            $(channel::Registration::of::<$module::$ty>(),)+
        ];
    };
}
pub(crate) use registry;

/// A channel as configured: renders requests and judges responses. Pure: the clock and nonces
/// come in through [`RenderEnv`], so golden tests are exact.
pub trait Channel: fmt::Debug + Send + Sync {
    /// Every secret this channel holds (each is masked in errors, logs and golden files).
    fn secrets(&self) -> Vec<&Secret>;

    /// The request(s) that deliver `n` (several for e.g. one SMS per recipient; sent in order,
    /// the first failure fails the send).
    fn render(&self, n: &Notification, env: &RenderEnv) -> Result<Vec<Request>, String>;

    /// Whether an HTTP response means delivered. Default: [`judge_status`].
    fn judge(&self, response: &Response) -> Result<(), SendError> {
        judge_status(response).map(drop)
    }

    /// A plain-text letter to one person (`to`) through this channel's server and sender:
    /// e-mail channels only (`None` elsewhere). `slurm epilog --mail-domain` sends a job's
    /// summary to its user this way.
    fn letter(
        &self,
        _to: &str,
        _subject: &str,
        _text: &str,
    ) -> Option<Result<Vec<Request>, String>> {
        None
    }
}

/// A channel type: its `type` name and its config parser.
pub trait ChannelType: Channel + Sized + 'static {
    /// The `type = "…"` value.
    const TYPE: &'static str;

    /// Parses the channel's own keys (the common ones are already taken out of `section`).
    fn parse(section: &mut Section<'_>) -> Result<Self, SectionError>;
}

/// One entry of [`CHANNELS`](super::CHANNELS).
#[derive(Clone, Copy)]
pub struct Registration {
    /// The `type` name.
    pub type_name: &'static str,
    parse: fn(&mut Section<'_>) -> Result<Box<dyn Channel>, SectionError>,
}

impl Registration {
    /// The entry for channel type `C`.
    pub const fn of<C: ChannelType>() -> Registration {
        Registration {
            type_name: C::TYPE,
            parse: parse_boxed::<C>,
        }
    }

    /// Parses a section of this type.
    pub fn parse(&self, section: &mut Section<'_>) -> Result<Box<dyn Channel>, SectionError> {
        (self.parse)(section)
    }
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.type_name)
    }
}

fn parse_boxed<C: ChannelType>(
    section: &mut Section<'_>,
) -> Result<Box<dyn Channel>, SectionError> {
    C::parse(section).map(|c| Box::new(c) as Box<dyn Channel>)
}

/// The registered channel type called `name`.
pub fn find(name: &str) -> Option<&'static Registration> {
    super::CHANNELS.iter().find(|r| r.type_name == name)
}

/// Every registered `type` name, `a | b | …`.
pub fn type_names() -> String {
    super::CHANNELS
        .iter()
        .map(|r| r.type_name)
        .collect::<Vec<_>>()
        .join(" | ")
}

// ---------------------------------------------------------------------------------------------
// Parsing.

/// A config problem in a channel section: where (byte offset into the config file, when known;
/// otherwise the channel's `name`) and what. Never contains a secret value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SectionError {
    /// Byte offset into the config text.
    pub offset: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl From<String> for SectionError {
    fn from(message: String) -> Self {
        SectionError {
            offset: None,
            message,
        }
    }
}

impl From<&str> for SectionError {
    fn from(message: &str) -> Self {
        message.to_string().into()
    }
}

/// One `[[channel]]` table (less the common keys) with its positions in the config file.
pub struct Section<'a> {
    table: DeTable<'a>,
    span: Range<usize>,
    /// Whether spans point into the config file (false for a config built without its text).
    positions: bool,
    base_dir: &'a Path,
}

impl<'a> Section<'a> {
    /// A section from the parsed config text.
    pub fn new(
        table: DeTable<'a>,
        span: Range<usize>,
        positions: bool,
        base_dir: &'a Path,
    ) -> Self {
        Section {
            table,
            span,
            positions,
            base_dir,
        }
    }

    /// Directory relative `*_file` paths resolve against.
    pub fn base_dir(&self) -> &Path {
        self.base_dir
    }

    /// Takes key `key` out of the table (for a discriminator such as `provider`), as a string.
    pub fn take_string(&mut self, key: &str) -> Result<Option<Spanned<String>>, SectionError> {
        let Some(v) = self.table.remove(key) else {
            return Ok(None);
        };
        let span = v.span();
        match v.get_ref().as_str() {
            Some(s) => Ok(Some(Spanned::new(span, s.to_string()))),
            None => Err(self.error_at(span.start, format!("`{key}` must be a string"))),
        }
    }

    /// An error pointing at byte `offset`.
    pub fn error_at(&self, offset: usize, message: impl Into<String>) -> SectionError {
        SectionError {
            offset: self.positions.then_some(offset),
            message: message.into(),
        }
    }

    /// Deserializes the table into the channel's own struct (use `deny_unknown_fields`); errors
    /// point at the offending key or value, and never quote a value (it may be a secret).
    pub fn deserialize<T: DeserializeOwned>(&self) -> Result<T, SectionError> {
        let value = Spanned::new(self.span.clone(), DeValue::Table(self.table.clone()));
        T::deserialize(toml::de::ValueDeserializer::from(value)).map_err(|e| SectionError {
            offset: if self.positions {
                e.span().map(|s| s.start).or(Some(self.span.start))
            } else {
                None
            },
            message: without_values(e.message()),
        })
    }

    /// Resolves a secret given as `key`, `key_env` or `key_file` (see [`secret::resolve`]).
    pub fn secret(
        &self,
        key: &str,
        inline: Option<&str>,
        env: Option<&str>,
        file: Option<&Path>,
    ) -> Result<Option<Secret>, SectionError> {
        secret::resolve(key, inline, env, file, self.base_dir).map_err(SectionError::from)
    }

    /// Like [`Section::secret`], but the value is required.
    pub fn required_secret(
        &self,
        key: &str,
        inline: Option<&str>,
        env: Option<&str>,
        file: Option<&Path>,
    ) -> Result<Secret, SectionError> {
        self.secret(key, inline, env, file)?
            .ok_or_else(|| format!("`{key}` (or `{key}_env`, `{key}_file`) is required").into())
    }
}

/// `message` (a serde error) without the quoted value of `invalid type: string "…"` /
/// `invalid value: …` (a mistyped secret must not reach a log), keeping the kind of value.
pub fn without_values(message: &str) -> String {
    static QUOTED: std::sync::LazyLock<Option<regex::Regex>> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r#"(invalid (?:type|value): [a-z ]+?) (?:`[^`]*`|"[^"]*"|'[^']*')"#).ok()
    });
    match QUOTED.as_ref() {
        Some(re) => re.replace_all(message, "$1").into_owned(),
        None => message.to_string(),
    }
}

/// What a channel that POSTs one JSON body to one secret `url` says: its `type`, its body, and
/// how its service answers. [`JsonHook`] is the whole channel; a file supplies only this.
pub trait HookBody: fmt::Debug + Send + Sync + 'static {
    /// The `type = "…"` value.
    const TYPE: &'static str;

    /// The JSON body for `n`.
    fn body(n: &Notification) -> serde_json::Value;

    /// Whether the response means delivered. Default: [`judge_status`].
    fn judge(response: &Response) -> Result<(), SendError> {
        judge_status(response).map(drop)
    }
}

/// A channel configured by `url` alone that POSTs `B`'s JSON body there.
#[derive(Debug)]
pub struct JsonHook<B> {
    url: Secret,
    body: std::marker::PhantomData<B>,
}

impl<B: HookBody> ChannelType for JsonHook<B> {
    const TYPE: &'static str = B::TYPE;

    fn parse(section: &mut Section<'_>) -> Result<Self, SectionError> {
        let c: UrlSection = section.deserialize()?;
        Ok(JsonHook {
            url: c.required(section)?,
            body: std::marker::PhantomData,
        })
    }
}

impl<B: HookBody> Channel for JsonHook<B> {
    fn secrets(&self) -> Vec<&Secret> {
        vec![&self.url]
    }

    fn render(&self, n: &Notification, _env: &RenderEnv) -> Result<Vec<Request>, String> {
        Ok(vec![Request::Http(HttpRequest::post_json(
            self.url.clone(),
            &n.id,
            &B::body(n),
        ))])
    }

    fn judge(&self, response: &Response) -> Result<(), SendError> {
        B::judge(response)
    }
}

/// The keys of a bot that takes a secret `url` and an optional signing `secret` (Feishu,
/// DingTalk), each also as `*_env` / `*_file`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedUrlSection {
    /// The endpoint.
    pub url: Option<String>,
    /// The endpoint from an environment variable.
    pub url_env: Option<String>,
    /// The endpoint from a file.
    pub url_file: Option<PathBuf>,
    /// The signing secret.
    pub secret: Option<String>,
    /// The signing secret from an environment variable.
    pub secret_env: Option<String>,
    /// The signing secret from a file.
    pub secret_file: Option<PathBuf>,
}

impl SignedUrlSection {
    /// The resolved URL (required) and signing secret (optional).
    pub fn resolve(self, section: &Section<'_>) -> Result<(Secret, Option<Secret>), SectionError> {
        let url = UrlSection {
            url: self.url,
            url_env: self.url_env,
            url_file: self.url_file,
        }
        .required(section)?;
        let secret = section.secret(
            "secret",
            self.secret.as_deref(),
            self.secret_env.as_deref(),
            self.secret_file.as_deref(),
        )?;
        Ok((url, secret))
    }
}

/// The `url` / `url_env` / `url_file` keys of channels that only need a URL.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UrlSection {
    /// The endpoint (a secret: webhook URLs embed tokens).
    pub url: Option<String>,
    /// The URL from an environment variable.
    pub url_env: Option<String>,
    /// The URL from a file.
    pub url_file: Option<PathBuf>,
}

impl UrlSection {
    /// The resolved, validated URL, or `None` when not given.
    pub fn resolve(&self, section: &Section<'_>) -> Result<Option<Secret>, SectionError> {
        let url = section.secret(
            "url",
            self.url.as_deref(),
            self.url_env.as_deref(),
            self.url_file.as_deref(),
        )?;
        if let Some(u) = &url {
            check_url(u.expose())?;
        }
        Ok(url)
    }

    /// The resolved, validated URL; required.
    pub fn required(&self, section: &Section<'_>) -> Result<Secret, SectionError> {
        self.resolve(section)?
            .ok_or_else(|| "`url` (or `url_env`, `url_file`) is required".into())
    }
}

/// Checks that `url` parses and is `http` or `https` (the message never contains it: it may
/// carry a token). `ftp://`, `file://` and the like are refused.
pub fn check_url(url: &str) -> Result<(), SectionError> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("`url` is not a valid URL ({e})"))?;
    match parsed.scheme() {
        "http" | "https" => Ok(()),
        other => Err(format!("`url` must be http:// or https://, not {other}://").into()),
    }
}

/// A secret resolved from a URL section, trimmed of a trailing `/` (a base URL).
pub fn base_url(url: &Secret) -> String {
    url.expose().trim_end_matches('/').to_string()
}

// ---------------------------------------------------------------------------------------------
// Requests and responses.

/// What a render may depend on besides the notification: the clock and a nonce (fixed in
/// golden tests).
#[derive(Debug, Clone)]
pub struct RenderEnv {
    /// Now, UTC ms (signatures, timestamps).
    pub now_ms: i64,
    /// A fresh random value for this send (hex), for APIs that reject replayed nonces.
    pub nonce: String,
}

impl RenderEnv {
    /// The real clock and a random nonce.
    pub fn now() -> RenderEnv {
        use ring::rand::SecureRandom as _;
        use std::fmt::Write as _;
        let mut bytes = [0u8; 16];
        let _ = ring::rand::SystemRandom::new().fill(&mut bytes);
        let mut nonce = String::with_capacity(32);
        for b in bytes {
            let _ = write!(nonce, "{b:02x}");
        }
        RenderEnv {
            now_ms: super::now_ms(),
            nonce,
        }
    }
}

/// One thing to send.
#[derive(Debug, Clone)]
pub enum Request {
    /// An HTTP request.
    Http(HttpRequest),
    /// An email through an SMTP server.
    Smtp(SmtpRequest),
}

/// HTTP methods the channels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// POST.
    Post,
    /// PUT.
    Put,
}

impl Method {
    /// `POST` / `PUT`.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Post => "POST",
            Method::Put => "PUT",
        }
    }
}

/// One HTTP header; `secret` ones (credentials) are masked whole in golden files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Name.
    pub name: String,
    /// Value.
    pub value: String,
    /// Holds a credential.
    pub secret: bool,
}

/// A rendered HTTP request: every byte the channel decides.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    /// Method.
    pub method: Method,
    /// Full URL (a secret: it may embed tokens).
    pub url: Secret,
    /// Headers, in order (the transport adds `User-Agent`, `Host`, `Content-Length`).
    pub headers: Vec<Header>,
    /// The body.
    pub body: Vec<u8>,
}

impl HttpRequest {
    /// A request carrying `n`'s id in `Idempotency-Key` and `X-Gpuwatch-Notification-Id`.
    pub fn new(method: Method, url: Secret, id: &str) -> HttpRequest {
        HttpRequest {
            method,
            url,
            headers: Vec::new(),
            body: Vec::new(),
        }
        .header("Idempotency-Key", id)
        .header("X-Gpuwatch-Notification-Id", id)
    }

    /// A POST of `body` as JSON.
    pub fn post_json(url: Secret, id: &str, body: &Value) -> HttpRequest {
        HttpRequest::new(Method::Post, url, id).json(body)
    }

    /// Replaces the `Idempotency-Key` (for a notification sent as several requests).
    #[must_use]
    pub fn idempotency_key(mut self, key: &str) -> HttpRequest {
        for h in &mut self.headers {
            if h.name == "Idempotency-Key" {
                h.value = key.to_string();
            }
        }
        self
    }

    /// Adds a header.
    #[must_use]
    pub fn header(mut self, name: &str, value: impl Into<String>) -> HttpRequest {
        self.headers.push(Header {
            name: name.into(),
            value: value.into(),
            secret: false,
        });
        self
    }

    /// Adds a credential header (masked in golden files).
    #[must_use]
    pub fn secret_header(mut self, name: &str, value: impl Into<String>) -> HttpRequest {
        self.headers.push(Header {
            name: name.into(),
            value: value.into(),
            secret: true,
        });
        self
    }

    /// Sets a JSON body (and `Content-Type`).
    #[must_use]
    pub fn json(self, body: &Value) -> HttpRequest {
        let bytes = serde_json::to_vec(body).unwrap_or_default();
        self.body("application/json", bytes)
    }

    /// Sets a form body (and `Content-Type`).
    #[must_use]
    pub fn form(self, fields: &[(&str, &str)]) -> HttpRequest {
        self.body(
            "application/x-www-form-urlencoded",
            form_encode(fields).into_bytes(),
        )
    }

    /// Sets the body and its `Content-Type`.
    #[must_use]
    pub fn body(mut self, content_type: &str, body: Vec<u8>) -> HttpRequest {
        self.body = body;
        self.header("Content-Type", content_type)
    }
}

/// RFC 3986 percent-encoding of everything but the unreserved characters (`A-Z a-z 0-9 - _ . ~`):
/// for path segments and for Aliyun's canonical query string.
pub fn percent_encode(s: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// `application/x-www-form-urlencoded` encoding of `fields`, in order.
pub fn form_encode(fields: &[(&str, &str)]) -> String {
    let mut s = reqwest::Url::parse("http://x/").map_or_else(
        |_| String::new(),
        |mut u| {
            u.query_pairs_mut().extend_pairs(fields.iter().copied());
            u.query().unwrap_or_default().to_string()
        },
    );
    if fields.is_empty() {
        s.clear();
    }
    s
}

/// SMTP connection security.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// Plain SMTP (a local relay).
    None,
    /// STARTTLS required (port 587).
    Starttls,
    /// Implicit TLS (port 465).
    Tls,
}

/// An SMTP server and its login.
#[derive(Debug, Clone)]
pub struct SmtpServer {
    /// Host.
    pub host: String,
    /// Port.
    pub port: u16,
    /// Connection security.
    pub tls: TlsMode,
    /// AUTH user.
    pub username: Option<String>,
    /// AUTH password.
    pub password: Option<Secret>,
    /// Extra trust anchors (the channel's `ca_file`), trusted in addition to the webpki roots
    /// for `starttls` and `tls`.
    pub ca_certs: Vec<rustls::pki_types::CertificateDer<'static>>,
}

/// A rendered email and where to send it.
#[derive(Debug, Clone)]
pub struct SmtpRequest {
    /// The server.
    pub server: SmtpServer,
    /// The whole message (headers, text and HTML parts).
    pub message: lettre::Message,
}

/// An HTTP response, as far as judging goes.
#[derive(Debug, Clone, Default)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// The `Retry-After` header.
    pub retry_after: Option<String>,
    /// The body text.
    pub body: String,
}

impl Response {
    /// The body cut to 300 characters, for error messages.
    pub fn short_body(&self) -> String {
        super::render::truncate_chars(self.body.trim(), 300)
    }

    /// The body as JSON, when it is.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_str(&self.body).ok()
    }
}

/// The status-code verdict every HTTP channel shares: 408, 429 and 5xx are retryable (after
/// `Retry-After`, or a JSON `retry_after` / `parameters.retry_after` in seconds, or
/// `retry_after_ms`), other non-2xx are permanent. On 2xx, the body as JSON (if it is).
pub fn judge_status(r: &Response) -> Result<Option<Value>, SendError> {
    let json = r.json();
    let status = r.status;
    if status == 429 || status == 408 || (500..600).contains(&status) {
        let retry_after_ms = r
            .retry_after
            .as_deref()
            .and_then(|h| h.trim().parse::<f64>().ok())
            .or_else(|| {
                json.as_ref().and_then(|j| {
                    j.get("retry_after")
                        .or_else(|| j.get("parameters").and_then(|p| p.get("retry_after")))
                        .and_then(Value::as_f64)
                })
            })
            .map(secs_to_ms)
            .or_else(|| {
                json.as_ref()
                    .and_then(|j| j.get("retry_after_ms"))
                    .and_then(Value::as_f64)
                    .map(|ms| secs_to_ms(ms / 1000.0))
            });
        return Err(SendError {
            retryable: true,
            retry_after_ms,
            message: format!("HTTP {status}: {}", r.short_body()),
        });
    }
    if !(200..300).contains(&status) {
        return Err(SendError::permanent(format!(
            "HTTP {status}: {}",
            r.short_body()
        )));
    }
    Ok(json)
}

/// The error for a 2xx response whose body reports failure with `code`; `retryable` for the
/// API's rate-limit codes (retried after a minute).
pub fn body_error(r: &Response, code: impl fmt::Display, retryable: bool) -> SendError {
    SendError {
        retryable,
        retry_after_ms: retryable.then_some(60_000),
        message: format!(
            "HTTP {} but error code {code}: {}",
            r.status,
            r.short_body()
        ),
    }
}

/// The first integer among `keys` of a JSON object.
pub fn json_code(json: Option<&Value>, keys: &[&str]) -> Option<i64> {
    let j = json?;
    keys.iter().find_map(|k| j.get(*k).and_then(Value::as_i64))
}

#[expect(clippy::cast_possible_truncation, reason = "clamped to a day")]
fn secs_to_ms(s: f64) -> i64 {
    (s.clamp(0.0, 86_400.0) * 1000.0).round() as i64
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn resp(status: u16, retry_after: Option<&str>, body: &str) -> Response {
        Response {
            status,
            retry_after: retry_after.map(str::to_string),
            body: body.into(),
        }
    }

    #[test]
    fn status_verdicts() {
        assert!(judge_status(&resp(200, None, "")).is_ok());
        assert!(judge_status(&resp(204, None, "")).is_ok());
        let e = judge_status(&resp(500, None, "boom")).unwrap_err();
        assert!(e.retryable && e.message == "HTTP 500: boom");
        let e = judge_status(&resp(429, Some("7"), "")).unwrap_err();
        assert_eq!((e.retryable, e.retry_after_ms), (true, Some(7000)));
        let e = judge_status(&resp(429, None, r#"{"retry_after": 1.5}"#)).unwrap_err();
        assert_eq!(e.retry_after_ms, Some(1500));
        let e = judge_status(&resp(
            429,
            None,
            r#"{"ok":false,"parameters":{"retry_after":3}}"#,
        ))
        .unwrap_err();
        assert_eq!(e.retry_after_ms, Some(3000));
        let e = judge_status(&resp(
            429,
            None,
            r#"{"errcode":"M_LIMIT_EXCEEDED","retry_after_ms":2500}"#,
        ))
        .unwrap_err();
        assert_eq!(e.retry_after_ms, Some(2500));
        assert!(!judge_status(&resp(404, None, "")).unwrap_err().retryable);
    }

    #[test]
    fn every_type_is_registered_once() {
        let mut names: Vec<_> = super::super::CHANNELS.iter().map(|r| r.type_name).collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "duplicate type names");
        for t in [
            "webhook",
            "slack",
            "discord",
            "teams",
            "telegram",
            "feishu",
            "dingtalk",
            "wecom",
            "alertmanager",
            "email",
            "ntfy",
            "pushover",
            "gotify",
            "matrix",
            "sms",
        ] {
            assert!(find(t).is_some(), "{t} not registered");
        }
    }

    /// The keys a channel type accepts, from its own parser (serde lists them for an unknown key).
    fn accepted_keys(type_and_provider: &str) -> Vec<String> {
        let text = format!("[[channel]]\nname = \"x\"\n{type_and_provider}zz_probe = 1\n");
        let config = crate::config::parse(&text, Path::new("c.toml")).unwrap();
        let err = config.notify_settings().unwrap_err().to_string();
        let list = err
            .split("expected one of ")
            .nth(1)
            .unwrap_or_else(|| panic!("{err}"));
        list.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn every_key_of_every_type_is_documented_in_the_example_config() {
        let example = include_str!("../../config.example.toml");
        let blocks: Vec<&str> = example.split("[[channel]]").collect();
        let mut cases: Vec<(String, String)> = super::super::CHANNELS
            .iter()
            .filter(|r| r.type_name != "sms")
            .map(|r| (format!("type = \"{}\"\n", r.type_name), String::new()))
            .collect();
        for p in ["twilio", "aliyun"] {
            cases.push((
                format!("type = \"sms\"\nprovider = \"{p}\"\n"),
                format!("provider = \"{p}\""),
            ));
        }
        for (keys, provider) in cases {
            let type_line = keys.lines().next().unwrap_or_default().to_string();
            let block = blocks
                .iter()
                .find(|b| b.contains(&type_line) && b.contains(&provider))
                .unwrap_or_else(|| panic!("config.example.toml has no block for {keys:?}"));
            for key in accepted_keys(&keys) {
                let re = regex::Regex::new(&format!(r"\b{key}\b")).unwrap();
                assert!(
                    re.is_match(block),
                    "{keys:?}: key `{key}` is not documented in config.example.toml"
                );
            }
        }
    }

    #[test]
    fn type_errors_do_not_quote_the_value() {
        assert_eq!(
            without_values("invalid type: integer `123456`, expected a string"),
            "invalid type: integer, expected a string"
        );
        assert_eq!(
            without_values("invalid type: string \"hunter2\", expected a boolean"),
            "invalid type: string, expected a boolean"
        );
        assert_eq!(
            without_values("unknown field `x`, expected `url`"),
            "unknown field `x`, expected `url`"
        );
    }

    #[test]
    fn form_encoding() {
        assert_eq!(
            form_encode(&[("To", "+1 555"), ("Body", "a&b=c ü")]),
            "To=%2B1+555&Body=a%26b%3Dc+%C3%BC"
        );
        assert_eq!(form_encode(&[]), "");
        assert_eq!(percent_encode("!r:m.org ~*"), "%21r%3Am.org%20~%2A");
    }
}
