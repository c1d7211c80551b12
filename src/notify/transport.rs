//! The thin I/O layer: sends one rendered [`Notification`] through one channel over HTTP
//! (reqwest) or SMTP (lettre), every send bounded by the channel's timeout, and classifies the
//! outcome: network errors, timeouts, 429, 5xx and transient SMTP replies are retryable (with the
//! server's `Retry-After` / `retry_after` when given); other 4xx, body-level error codes
//! (Feishu, DingTalk, WeCom, Telegram) and permanent SMTP replies are not. Error text never
//! contains a secret: URLs are stripped from reqwest errors and every message is redacted.

use std::time::Duration;

use serde_json::Value;

use super::settings::{ChannelKind, ChannelSpec, EmailSpec, Target, TlsMode};
use super::{
    alertmanager, dingtalk, discord, email, feishu, slack, teams, telegram, webhook, wecom,
};
use super::{secret::Secret, Notification};

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
    fn retry(message: impl Into<String>) -> SendError {
        SendError {
            retryable: true,
            retry_after_ms: None,
            message: message.into(),
        }
    }

    fn permanent(message: impl Into<String>) -> SendError {
        SendError {
            retryable: false,
            retry_after_ms: None,
            message: message.into(),
        }
    }
}

/// A prepared HTTP request.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    /// Where to POST.
    pub url: Secret,
    /// JSON body.
    pub body: Value,
}

/// Renders `n` for an HTTP channel at `now_ms` (signatures need the time). Pure.
pub fn prepare_http(
    spec: &ChannelSpec,
    n: &Notification,
    now_ms: i64,
) -> Result<HttpRequest, SendError> {
    let Target::Http {
        url,
        secret,
        chat_id,
    } = &spec.target
    else {
        return Err(SendError::permanent("not an HTTP channel"));
    };
    let body = match spec.kind {
        ChannelKind::Webhook => webhook::render(n),
        ChannelKind::Slack => slack::render(n),
        ChannelKind::Discord => discord::render(n),
        ChannelKind::Teams => teams::render(n),
        ChannelKind::Telegram => telegram::render(n, chat_id.as_deref().unwrap_or_default()),
        ChannelKind::Feishu => {
            feishu::render_signed(n, secret.as_ref().map(Secret::expose), now_ms)
        }
        ChannelKind::Dingtalk => dingtalk::render(n),
        ChannelKind::Wecom => wecom::render(n),
        ChannelKind::Alertmanager => alertmanager::render(n),
        ChannelKind::Email => return Err(SendError::permanent("not an HTTP channel")),
    };
    let url = match (spec.kind, secret) {
        (ChannelKind::Dingtalk, Some(s)) => Secret::new(
            dingtalk::signed_url(url.expose(), s.expose(), now_ms).map_err(SendError::permanent)?,
        ),
        _ => url.clone(),
    };
    Ok(HttpRequest { url, body })
}

/// Decides whether an HTTP response means success. Pure.
pub fn check_response(
    kind: ChannelKind,
    status: u16,
    retry_after_header: Option<&str>,
    body: &str,
) -> Result<(), SendError> {
    let json: Option<Value> = serde_json::from_str(body).ok();
    let short_body = super::render::truncate_chars(body.trim(), 300);
    if status == 429 || status == 408 || (500..600).contains(&status) {
        let retry_after_ms = retry_after_header
            .and_then(|h| h.trim().parse::<f64>().ok())
            .or_else(|| {
                json.as_ref().and_then(|j| {
                    j.get("retry_after")
                        .or_else(|| j.get("parameters").and_then(|p| p.get("retry_after")))
                        .and_then(Value::as_f64)
                })
            })
            .map(secs_to_ms);
        return Err(SendError {
            retryable: true,
            retry_after_ms,
            message: format!("HTTP {status}: {short_body}"),
        });
    }
    if !(200..300).contains(&status) {
        return Err(SendError::permanent(format!("HTTP {status}: {short_body}")));
    }
    let code = |keys: &[&str]| -> Option<i64> {
        let j = json.as_ref()?;
        keys.iter().find_map(|k| j.get(*k).and_then(Value::as_i64))
    };
    let body_error = match kind {
        ChannelKind::Feishu => code(&["code", "StatusCode"]).filter(|c| *c != 0),
        ChannelKind::Dingtalk | ChannelKind::Wecom => code(&["errcode"]).filter(|c| *c != 0),
        ChannelKind::Telegram => match json
            .as_ref()
            .and_then(|j| j.get("ok"))
            .and_then(Value::as_bool)
        {
            Some(false) => code(&["error_code"]).or(Some(-1)),
            _ => None,
        },
        _ => None,
    };
    match body_error {
        None => Ok(()),
        Some(c) => {
            // Rate-limit codes: Feishu 11232, DingTalk 130101, WeCom 45009.
            let retryable = matches!(c, 11232 | 130_101 | 45009);
            Err(SendError {
                retryable,
                retry_after_ms: retryable.then_some(60_000),
                message: format!("HTTP {status} but error code {c}: {short_body}"),
            })
        }
    }
}

#[expect(clippy::cast_possible_truncation, reason = "clamped to a day")]
fn secs_to_ms(s: f64) -> i64 {
    (s.clamp(0.0, 86_400.0) * 1000.0).round() as i64
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
        let http = reqwest::Client::builder()
            .user_agent(concat!("gpuwatch/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| {
                anyhow::anyhow!("cannot build the HTTP client: {}", describe_reqwest(e))
            })?;
        Ok(Transport { http })
    }

    /// Sends `n` through `spec`, bounded by the channel timeout.
    pub async fn send(&self, spec: &ChannelSpec, n: &Notification) -> Result<(), SendError> {
        let timeout = Duration::from_millis(u64::try_from(spec.timeout_ms).unwrap_or(10_000));
        let result = match &spec.target {
            Target::Email(e) => {
                match tokio::time::timeout(timeout, send_email(e, n, timeout)).await {
                    Ok(r) => r,
                    Err(_) => Err(SendError::retry(format!(
                        "SMTP {}:{} did not finish within {} ms",
                        e.host, e.port, spec.timeout_ms
                    ))),
                }
            }
            Target::Http { .. } => {
                let req = prepare_http(spec, n, super::now_ms())?;
                self.post(spec.kind, &req, &n.id, timeout).await
            }
        };
        result.map_err(|mut e| {
            e.message = spec.redact(&e.message);
            e
        })
    }

    async fn post(
        &self,
        kind: ChannelKind,
        req: &HttpRequest,
        id: &str,
        timeout: Duration,
    ) -> Result<(), SendError> {
        let fut = async {
            let resp = self
                .http
                .post(req.url.expose())
                .header("Idempotency-Key", id)
                .header("X-Gpuwatch-Notification-Id", id)
                .json(&req.body)
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
            check_response(kind, status, retry_after.as_deref(), &body)
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

async fn send_email(
    spec: &EmailSpec,
    n: &Notification,
    timeout: Duration,
) -> Result<(), SendError> {
    use lettre::transport::smtp::authentication::Credentials;
    use lettre::transport::smtp::client::{Tls, TlsParameters};
    use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};

    let message = email::message(spec, n).map_err(SendError::permanent)?;
    let tls = match spec.tls {
        TlsMode::None => Tls::None,
        TlsMode::Starttls | TlsMode::Tls => {
            let params = TlsParameters::new(spec.host.clone())
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
    match transport.send(message).await {
        Ok(_) => Ok(()),
        Err(e) => {
            let msg = format!("SMTP {}:{}: {e}", spec.host, spec.port);
            let msg = spec
                .password
                .as_ref()
                .map_or(msg.clone(), |p| p.redact(&msg));
            if e.is_permanent() {
                Err(SendError::permanent(msg))
            } else {
                Err(SendError::retry(msg))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_responses() {
        assert!(check_response(ChannelKind::Webhook, 200, None, "").is_ok());
        assert!(check_response(ChannelKind::Discord, 204, None, "").is_ok());
        let e = check_response(ChannelKind::Webhook, 500, None, "boom").unwrap_err();
        assert!(e.retryable && e.message == "HTTP 500: boom");
        let e = check_response(ChannelKind::Slack, 429, Some("7"), "").unwrap_err();
        assert_eq!((e.retryable, e.retry_after_ms), (true, Some(7000)));
        let e =
            check_response(ChannelKind::Discord, 429, None, r#"{"retry_after": 1.5}"#).unwrap_err();
        assert_eq!(e.retry_after_ms, Some(1500));
        let e = check_response(
            ChannelKind::Telegram,
            429,
            None,
            r#"{"ok":false,"parameters":{"retry_after":3}}"#,
        )
        .unwrap_err();
        assert_eq!(e.retry_after_ms, Some(3000));
        assert!(
            !check_response(ChannelKind::Webhook, 404, None, "")
                .unwrap_err()
                .retryable
        );
        let e = check_response(
            ChannelKind::Feishu,
            200,
            None,
            r#"{"code":19021,"msg":"sign match fail"}"#,
        )
        .unwrap_err();
        assert!(!e.retryable && e.message.contains("19021"));
        assert!(check_response(ChannelKind::Feishu, 200, None, r#"{"code":0}"#).is_ok());
        assert!(check_response(ChannelKind::Dingtalk, 200, None, r#"{"errcode":310000}"#).is_err());
        assert!(
            check_response(ChannelKind::Wecom, 200, None, r#"{"errcode":45009}"#)
                .unwrap_err()
                .retryable
        );
        assert!(check_response(
            ChannelKind::Telegram,
            200,
            None,
            r#"{"ok":false,"error_code":400}"#
        )
        .is_err());
    }
}
