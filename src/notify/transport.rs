//! The thin I/O layer: carries the request(s) a channel rendered (see [`channel`](super::channel))
//! over HTTP (reqwest) or SMTP (lettre), every send bounded by the channel's timeout, and hands
//! HTTP responses back to the channel to judge. Network errors, timeouts and transient SMTP
//! replies are retryable; permanent SMTP replies are not. Error text never contains a secret:
//! URLs are stripped from reqwest errors and every message is redacted.

use std::time::Duration;

use super::channel::{Method, RenderEnv, Request, Response, SmtpRequest, TlsMode};
use super::secret::Secret;
use super::settings::ChannelSpec;
use super::Notification;

/// Why a send failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendError {
    /// Worth retrying (network, timeout, 429, 5xx, transient SMTP).
    pub retryable: bool,
    /// The server asked to wait this long.
    pub retry_after_ms: Option<i64>,
    /// What happened, secret-free.
    pub message: String,
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)?;
        if !self.retryable {
            f.write_str(" (permanent)")?;
        }
        Ok(())
    }
}

impl SendError {
    /// A retryable failure.
    pub fn retry(message: impl Into<String>) -> SendError {
        SendError {
            retryable: true,
            retry_after_ms: None,
            message: message.into(),
        }
    }

    /// A permanent failure.
    pub fn permanent(message: impl Into<String>) -> SendError {
        SendError {
            retryable: false,
            retry_after_ms: None,
            message: message.into(),
        }
    }
}

/// Installs the ring TLS provider for rustls (once; later calls are no-ops).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Sends notifications. Cheap to clone.
#[derive(Clone)]
pub struct Transport {
    http: reqwest::Client,
}

impl Transport {
    /// Builds the HTTP client.
    pub fn new() -> anyhow::Result<Transport> {
        install_crypto_provider();
        // Redirects are followed only within the same host and port: a channel's secret headers
        // (`X-Gotify-Key`, bearer tokens) must never reach another host a server sends us to
        // (reqwest drops only `Authorization` and cookies on such a hop).
        let same_host = reqwest::redirect::Policy::custom(|attempt| {
            let first = attempt.previous().first();
            let same = first.is_some_and(|p| {
                p.host_str() == attempt.url().host_str()
                    && p.port_or_known_default() == attempt.url().port_or_known_default()
            });
            if same && attempt.previous().len() < 5 {
                attempt.follow()
            } else {
                attempt.stop()
            }
        });
        let http = reqwest::Client::builder()
            .user_agent(concat!("gpuwatch/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .redirect(same_host)
            .build()
            .map_err(|e| {
                anyhow::anyhow!("cannot build the HTTP client: {}", describe_reqwest(e))
            })?;
        Ok(Transport { http })
    }

    /// Sends `n` through `spec`, bounded by the channel timeout (per request).
    pub async fn send(&self, spec: &ChannelSpec, n: &Notification) -> Result<(), SendError> {
        self.send_with(spec, n, &RenderEnv::now()).await
    }

    /// Sends `n` through `spec` rendered with `env` (tests fix the clock and nonce).
    pub async fn send_with(
        &self,
        spec: &ChannelSpec,
        n: &Notification,
        env: &RenderEnv,
    ) -> Result<(), SendError> {
        let requests = spec.channel.render(n, env).map_err(SendError::permanent);
        self.carry(spec, requests).await
    }

    /// Sends a plain-text letter to one person through e-mail channel `spec`
    /// ([`super::channel::Channel::letter`]).
    pub async fn send_letter(
        &self,
        spec: &ChannelSpec,
        to: &str,
        subject: &str,
        text: &str,
    ) -> Result<(), SendError> {
        let requests = match spec.channel.letter(to, subject, text) {
            Some(r) => r.map_err(SendError::permanent),
            None => Err(SendError::permanent(format!(
                "channel {:?} is not an e-mail channel",
                spec.name
            ))),
        };
        self.carry(spec, requests).await
    }

    /// Carries what a channel rendered, within its timeout; errors redacted of its secrets.
    async fn carry(
        &self,
        spec: &ChannelSpec,
        requests: Result<Vec<Request>, SendError>,
    ) -> Result<(), SendError> {
        let timeout = Duration::from_millis(u64::try_from(spec.timeout_ms).unwrap_or(10_000));
        let result = async {
            let requests = requests?;
            for req in &requests {
                match req {
                    Request::Smtp(mail) => {
                        match tokio::time::timeout(timeout, send_email(mail, timeout)).await {
                            Ok(r) => r?,
                            Err(_) => {
                                return Err(SendError::retry(format!(
                                    "SMTP {}:{} did not finish within {} ms",
                                    mail.server.host, mail.server.port, spec.timeout_ms
                                )))
                            }
                        }
                    }
                    Request::Http(http) => {
                        let mut response = self.http(http, timeout).await?;
                        // Redacted before any part of it is quoted: a token the receiver
                        // echoes must not be cut in two by the truncation of an error message.
                        response.body = spec.redact(&response.body);
                        spec.channel.judge(&response)?;
                    }
                }
            }
            Ok(())
        }
        .await;
        result.map_err(|mut e| {
            e.message = spec.redact(&e.message);
            e
        })
    }

    /// Carries one HTTP request; any answer is returned (judging is the channel's).
    async fn http(
        &self,
        req: &super::channel::HttpRequest,
        timeout: Duration,
    ) -> Result<Response, SendError> {
        let fut = async {
            let method = match req.method {
                Method::Post => reqwest::Method::POST,
                Method::Put => reqwest::Method::PUT,
            };
            let mut builder = self.http.request(method, req.url.expose());
            for h in &req.headers {
                builder = builder.header(h.name.as_str(), h.value.as_str());
            }
            let resp = builder
                .body(req.body.clone())
                .timeout(timeout)
                .send()
                .await
                .map_err(|e| SendError::retry(describe_reqwest(e)))?;
            let status = resp.status().as_u16();
            let retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let body = resp
                .text()
                .await
                .map_err(|e| SendError::retry(describe_reqwest(e)))?;
            Ok(Response {
                status,
                retry_after,
                body,
            })
        };
        match tokio::time::timeout(timeout + Duration::from_millis(500), fut).await {
            Ok(r) => r,
            Err(_) => Err(SendError::retry(format!(
                "no answer within {} ms",
                timeout.as_millis()
            ))),
        }
    }

    /// GETs the heartbeat URL.
    pub async fn ping(&self, url: &Secret, timeout: Duration) -> Result<(), SendError> {
        let r = self
            .http
            .get(url.expose())
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| SendError::retry(describe_reqwest(e)))?;
        if r.status().is_success() {
            Ok(())
        } else {
            Err(SendError::retry(format!("HTTP {}", r.status().as_u16())))
        }
    }
}

/// Describes a reqwest error without its URL: kind plus the source chain.
fn describe_reqwest(e: reqwest::Error) -> String {
    let e = e.without_url();
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else if e.is_request() {
        "request failed"
    } else if e.is_body() || e.is_decode() {
        "bad response body"
    } else {
        "HTTP error"
    };
    let mut msg = kind.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

async fn send_email(mail: &SmtpRequest, timeout: Duration) -> Result<(), SendError> {
    use lettre::transport::smtp::authentication::Credentials;
    use lettre::transport::smtp::client::{Certificate, CertificateStore, Tls, TlsParameters};
    use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};

    let spec = &mail.server;
    let tls = match spec.tls {
        TlsMode::None => Tls::None,
        TlsMode::Starttls | TlsMode::Tls => {
            // The webpki (Mozilla) roots, plus the channel's `ca_file`; the host name is checked
            // against the certificate. There is no fallback to plain text: `Required` fails
            // when the server offers no STARTTLS or the handshake fails.
            let mut builder = TlsParameters::builder(spec.host.clone())
                .certificate_store(CertificateStore::WebpkiRoots);
            for der in &spec.ca_certs {
                let cert = Certificate::from_der(der.to_vec())
                    .map_err(|e| SendError::permanent(format!("TLS setup: ca_file: {e}")))?;
                builder = builder.add_root_certificate(cert);
            }
            let params = builder
                .build_rustls()
                .map_err(|e| SendError::permanent(format!("TLS setup: {e}")))?;
            if spec.tls == TlsMode::Starttls {
                Tls::Required(params)
            } else {
                Tls::Wrapper(params)
            }
        }
    };
    let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(spec.host.clone())
        .port(spec.port)
        .tls(tls)
        .timeout(Some(timeout));
    if let (Some(user), Some(pass)) = (&spec.username, &spec.password) {
        builder = builder.credentials(Credentials::new(user.clone(), pass.expose().to_string()));
    }
    let transport = builder.build();
    match transport.send(mail.message.clone()).await {
        Ok(_) => Ok(()),
        Err(e) => {
            let what = rustls_error(&e).map_or_else(|| e.to_string(), describe_tls);
            let msg = format!("SMTP {}:{}: {what}", spec.host, spec.port);
            let msg = spec
                .password
                .as_ref()
                .map_or(msg.clone(), |p: &Secret| p.redact(&msg));
            if e.is_permanent() {
                Err(SendError::permanent(msg))
            } else {
                Err(SendError::retry(msg))
            }
        }
    }
}

/// The rustls error in `e`'s source chain, also inside an `io::Error` (as tokio-rustls reports
/// a failed handshake; `io::Error::source` skips the error it wraps).
fn rustls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut current = Some(e);
    while let Some(err) = current {
        if let Some(r) = err.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        let wrapped = err
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref);
        if let Some(r) = wrapped.and_then(|inner| rustls_error(inner)) {
            return Some(r);
        }
        current = err.source();
    }
    None
}

/// A TLS failure in words: which certificate check refused the server, or what else failed.
fn describe_tls(e: &rustls::Error) -> String {
    use rustls::CertificateError as C;
    let at = |t: rustls::pki_types::UnixTime| {
        i64::try_from(t.as_secs())
            .ok()
            .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
            .map_or_else(
                || format!("{} (UNIX)", t.as_secs()),
                |d| d.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
            )
    };
    let problem = match e {
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer => "certificate issuer not trusted (UnknownIssuer: it does not chain \
                                 to the built-in roots or to the channel's ca_file)"
                .to_string(),
            C::ExpiredContext { time, not_after } => format!(
                "certificate expired: not valid after {}, now {}",
                at(*not_after),
                at(*time)
            ),
            C::NotValidYetContext { time, not_before } => format!(
                "certificate not valid yet: not valid before {}, now {}",
                at(*not_before),
                at(*time)
            ),
            other => other.to_string(),
        },
        other => return format!("TLS handshake failed: {other}"),
    };
    format!("TLS: server certificate refused: {problem}")
}
