//! Alibaba Cloud SMS (阿里云短信服务): the `SendSms` RPC API (version 2017-05-25) at
//! `https://dysmsapi.aliyuncs.com/`, a POST whose form body is the signed parameter set.
//!
//! Signature version 1.0: sort the parameters by name, percent-encode names and values (RFC 3986:
//! only `A-Z a-z 0-9 - _ . ~` stay, space is `%20`), join as `k=v&…` (the canonicalized query
//! string), `StringToSign = "POST&" + enc("/") + "&" + enc(canonicalized)`, `Signature =
//! base64(HMAC-SHA1(key = AccessKeySecret + "&", StringToSign))`. `SignatureNonce` is fresh per
//! send (Aliyun rejects a reused one). The text goes into the template variable
//! `template_variable` (default `content`) of `template_code`; all recipients in one request.
//! Aliyun refuses a variable longer than its limit — 35 characters by default for a notification
//! template ("单个模板变量的长度可以超过默认的 35 字符上限" once the limit is lifted, and a whole
//! message of signature, template and variables at most 500 characters: Alibaba Cloud help,
//! "长变量短信发送与字符限制是什么?", help.aliyun.com/zh/document_detail/3041859.html) — so the
//! text is cut to `template_variable_max_chars` (default [`DEFAULT_VARIABLE_CHARS`]; at most
//! [`MAX_VARIABLE_CHARS`] for a template whose limit Aliyun lifted), ending in `…`.
//! Aliyun answers JSON with `Code == "OK"`; `isv.BUSINESS_LIMIT_CONTROL` and `Throttling.*` are
//! its rate limits (retried).

use std::collections::BTreeMap;
use std::path::PathBuf;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;

use super::{check_numbers, fit_chars, short_line};
use crate::notify::channel::{
    body_error, check_url, judge_status, percent_encode, Channel, HttpRequest, Method, RenderEnv,
    Request, Response, Section, SectionError,
};
use crate::notify::secret::Secret;
use crate::notify::transport::SendError;
use crate::notify::Notification;

/// The public endpoint.
pub const API_URL: &str = "https://dysmsapi.aliyuncs.com/";

/// Aliyun's default limit on one template variable of a notification template, in characters.
pub const DEFAULT_VARIABLE_CHARS: usize = 35;
/// The most one variable can hold once Aliyun lifted the limit: a whole message (signature,
/// template text and variables) is at most 500 characters.
pub const MAX_VARIABLE_CHARS: usize = 500;

/// `[[channel]] type = "sms"`, `provider = "aliyun"` keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AliyunSection {
    /// Endpoint (default the public one; for a proxy or a test receiver).
    url: Option<String>,
    /// AccessKey ID.
    access_key_id: Option<String>,
    access_key_id_env: Option<String>,
    access_key_id_file: Option<PathBuf>,
    /// AccessKey secret.
    access_key_secret: Option<String>,
    access_key_secret_env: Option<String>,
    access_key_secret_file: Option<PathBuf>,
    /// Approved signature name (签名).
    sign_name: Option<String>,
    /// Approved template code, `SMS_…`.
    template_code: Option<String>,
    /// The template variable that receives the text (default `content`).
    template_variable: Option<String>,
    /// The most characters the variable may hold (default 35, Aliyun's default limit).
    template_variable_max_chars: Option<usize>,
    /// Recipients.
    #[serde(default)]
    to: Vec<String>,
}

/// Aliyun settings.
#[derive(Debug)]
pub struct Aliyun {
    url: String,
    access_key_id: Secret,
    access_key_secret: Secret,
    sign_name: String,
    template_code: String,
    template_variable: String,
    /// The most characters of text the variable gets.
    variable_max_chars: usize,
    to: Vec<String>,
}

impl Aliyun {
    /// Parses the provider's keys.
    pub fn parse(section: &mut Section<'_>) -> Result<Self, SectionError> {
        let c: AliyunSection = section.deserialize()?;
        let url = c.url.unwrap_or_else(|| API_URL.to_string());
        check_url(&url)?;
        let access_key_id = section.required_secret(
            "access_key_id",
            c.access_key_id.as_deref(),
            c.access_key_id_env.as_deref(),
            c.access_key_id_file.as_deref(),
        )?;
        let access_key_secret = section.required_secret(
            "access_key_secret",
            c.access_key_secret.as_deref(),
            c.access_key_secret_env.as_deref(),
            c.access_key_secret_file.as_deref(),
        )?;
        let sign_name = c.sign_name.ok_or("`sign_name` is required")?;
        let template_code = c.template_code.ok_or("`template_code` is required")?;
        check_numbers(&c.to)?;
        let variable_max_chars = c
            .template_variable_max_chars
            .unwrap_or(DEFAULT_VARIABLE_CHARS);
        if !(1..=MAX_VARIABLE_CHARS).contains(&variable_max_chars) {
            return Err(format!(
                "`template_variable_max_chars` = {variable_max_chars}: must be 1 to \
                 {MAX_VARIABLE_CHARS} (Aliyun's default limit is {DEFAULT_VARIABLE_CHARS}; a whole \
                 message is at most {MAX_VARIABLE_CHARS} characters)"
            )
            .into());
        }
        Ok(Aliyun {
            url,
            access_key_id,
            access_key_secret,
            sign_name,
            template_code,
            template_variable: c.template_variable.unwrap_or_else(|| "content".into()),
            variable_max_chars,
            to: c.to,
        })
    }
}

/// The canonicalized query string of `params` (sorted by the map).
pub fn canonicalize(params: &BTreeMap<&str, String>) -> String {
    params
        .iter()
        .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// Signature version 1.0 of `canonical` for `method`.
pub fn sign(method: &str, canonical: &str, access_key_secret: &str) -> String {
    let string_to_sign = format!(
        "{method}&{}&{}",
        percent_encode("/"),
        percent_encode(canonical)
    );
    let key = ring::hmac::Key::new(
        ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
        format!("{access_key_secret}&").as_bytes(),
    );
    base64::engine::general_purpose::STANDARD
        .encode(ring::hmac::sign(&key, string_to_sign.as_bytes()).as_ref())
}

/// `YYYY-MM-DDThh:mm:ssZ`.
fn timestamp(ms: i64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms)
        .unwrap_or_default()
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

impl Channel for Aliyun {
    fn secrets(&self) -> Vec<&Secret> {
        vec![&self.access_key_id, &self.access_key_secret]
    }

    fn render(&self, n: &Notification, env: &RenderEnv) -> Result<Vec<Request>, String> {
        let mut template_param = serde_json::Map::new();
        template_param.insert(
            self.template_variable.clone(),
            Value::String(fit_chars(&short_line(n), self.variable_max_chars)),
        );
        let params: BTreeMap<&str, String> = [
            ("AccessKeyId", self.access_key_id.expose().to_string()),
            ("Action", "SendSms".into()),
            ("Format", "JSON".into()),
            ("PhoneNumbers", self.to.join(",")),
            ("RegionId", "cn-hangzhou".into()),
            ("SignName", self.sign_name.clone()),
            ("SignatureMethod", "HMAC-SHA1".into()),
            ("SignatureNonce", env.nonce.clone()),
            ("SignatureVersion", "1.0".into()),
            ("TemplateCode", self.template_code.clone()),
            ("TemplateParam", Value::Object(template_param).to_string()),
            ("Timestamp", timestamp(env.now_ms)),
            ("Version", "2017-05-25".into()),
        ]
        .into_iter()
        .collect();
        let canonical = canonicalize(&params);
        let signature = sign("POST", &canonical, self.access_key_secret.expose());
        let body = format!("{canonical}&Signature={}", percent_encode(&signature));
        Ok(vec![Request::Http(
            HttpRequest::new(Method::Post, Secret::new(&self.url), &n.id)
                .body("application/x-www-form-urlencoded", body.into_bytes()),
        )])
    }

    /// `Code` must be `"OK"`.
    fn judge(&self, r: &Response) -> Result<(), SendError> {
        let json = judge_status(r)?;
        let code = json
            .as_ref()
            .and_then(|j| j.get("Code"))
            .and_then(Value::as_str)
            .unwrap_or("(no Code)");
        if code == "OK" {
            return Ok(());
        }
        let rate_limited = code == "isv.BUSINESS_LIMIT_CONTROL" || code.starts_with("Throttling");
        Err(body_error(r, code, rate_limited))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_matches_the_documented_example() {
        // Aliyun's documented signature example (SendSms, AccessKeySecret "testSecret").
        let params: BTreeMap<&str, String> = [
            ("AccessKeyId", "testId"),
            ("Action", "SendSms"),
            ("Format", "XML"),
            ("OutId", "123"),
            ("PhoneNumbers", "15300000001"),
            ("RegionId", "cn-hangzhou"),
            ("SignName", "阿里云短信测试专用"),
            ("SignatureMethod", "HMAC-SHA1"),
            ("SignatureNonce", "45e25e9b-0a6f-4070-8c85-2956eda1b466"),
            ("SignatureVersion", "1.0"),
            ("TemplateCode", "SMS_71390007"),
            ("TemplateParam", "{\"customer\":\"test\"}"),
            ("Timestamp", "2017-07-12T02:42:19Z"),
            ("Version", "2017-05-25"),
        ]
        .into_iter()
        .map(|(k, v)| (k, v.to_string()))
        .collect();
        let canonical = canonicalize(&params);
        assert!(canonical.starts_with("AccessKeyId=testId&Action=SendSms&Format=XML&OutId=123"));
        assert!(canonical.contains("&Timestamp=2017-07-12T02%3A42%3A19Z&"));
        assert_eq!(
            sign("GET", &canonical, "testSecret"),
            "zJDF+Lrzhj/ThnlvIToysFRq6t4="
        );
    }

    fn aliyun(max: usize) -> Aliyun {
        Aliyun {
            url: API_URL.into(),
            access_key_id: Secret::new("id"),
            access_key_secret: Secret::new("s"),
            sign_name: "s".into(),
            template_code: "t".into(),
            template_variable: "content".into(),
            variable_max_chars: max,
            to: vec!["13800000000".into()],
        }
    }

    /// The template variable's value in a rendered request.
    fn variable(a: &Aliyun, n: &Notification) -> String {
        let env = RenderEnv {
            now_ms: 0,
            nonce: "n".into(),
        };
        let reqs = a.render(n, &env).unwrap();
        let Request::Http(r) = &reqs[0] else {
            panic!("http")
        };
        let body = String::from_utf8(r.body.clone()).unwrap();
        let raw = body
            .split('&')
            .find_map(|kv| kv.strip_prefix("TemplateParam="))
            .unwrap();
        let mut bytes = Vec::new();
        let mut it = raw.bytes();
        while let Some(b) = it.next() {
            if b == b'%' {
                let hex: String = [it.next().unwrap(), it.next().unwrap()]
                    .iter()
                    .map(|&c| c as char)
                    .collect();
                bytes.push(u8::from_str_radix(&hex, 16).unwrap());
            } else {
                bytes.push(b);
            }
        }
        let json: Value = serde_json::from_slice(&bytes).unwrap();
        json["content"].as_str().unwrap().to_string()
    }

    /// Issue 25 §11: the text is cut to Aliyun's limit for one template variable (35 characters
    /// by default, Chinese characters counting one each), or to the configured one.
    #[test]
    fn the_text_fits_the_template_variable_limit() {
        use crate::model::AlertStatus;
        use crate::notify::testdata::{alert, notification};
        let n = notification(vec![
            alert(1, AlertStatus::Firing),
            alert(2, AlertStatus::Firing),
        ]);
        let v = variable(&aliyun(DEFAULT_VARIABLE_CHARS), &n);
        assert_eq!(v.chars().count(), 35, "{v}");
        assert!(v.starts_with("[CRIT] node7: XidCritical GPU 1"), "{v}");
        assert!(v.ends_with('…'), "{v}");
        let mut n = n;
        n.hostname = "训练节点七".into();
        n.alerts[0].annotations.insert(
            "summary".into(),
            "显卡掉线，请立即排查并重启节点。".repeat(5),
        );
        let v = variable(&aliyun(DEFAULT_VARIABLE_CHARS), &n);
        assert!(v.chars().count() <= 35, "{v}");
        assert!(v.starts_with("[CRIT] 训练节点七: XidCritical"), "{v}");
        // A template whose limit Aliyun lifted gets the whole line, up to the configured length.
        let v = variable(&aliyun(500), &n);
        assert!(v.chars().count() > 70 && v.chars().count() <= 500, "{v}");
        assert!(v.ends_with("重启节点。"), "{v}");
        let short = notification(vec![alert(1, AlertStatus::Resolved)]);
        let mut short = short;
        short.alerts[0]
            .annotations
            .insert("summary".into(), "ok".into());
        assert_eq!(
            variable(&aliyun(DEFAULT_VARIABLE_CHARS), &short),
            "[OK] node7: XidCritical GPU 1 - ok"
        );
    }

    /// `template_variable_max_chars` is 1 to 500.
    #[test]
    fn the_variable_limit_is_checked() {
        use crate::notify::settings::{
            ChannelSection, NotifyConfig, NotifySection, NotifySettings,
        };
        #[derive(serde::Deserialize)]
        struct Doc {
            channel: Vec<ChannelSection>,
        }
        let load = |extra: &str| {
            let text = format!(
                "[[channel]]\nname = \"sms\"\ntype = \"sms\"\nprovider = \"aliyun\"\n\
                 access_key_id = \"id\"\naccess_key_secret = \"s\"\nsign_name = \"s\"\n\
                 template_code = \"SMS_1\"\nto = [\"13800000000\"]\n{extra}"
            );
            let doc: Doc = toml::from_str(&text).unwrap();
            NotifySettings::from_config(&NotifyConfig {
                notify: &NotifySection::default(),
                channels: &doc.channel,
                routes: &[],
                hostname: "h",
                base_dir: std::path::Path::new("."),
                path: std::path::Path::new("c.toml"),
                text: &text,
            })
            .map(|_| ())
            .map_err(|e| format!("{e:#}"))
        };
        assert!(load("").is_ok());
        assert!(load("template_variable_max_chars = 120\n").is_ok());
        for bad in ["0", "501"] {
            let err = load(&format!("template_variable_max_chars = {bad}\n")).unwrap_err();
            assert!(err.contains("`template_variable_max_chars` = "), "{err}");
            assert!(err.contains("must be 1 to 500"), "{err}");
        }
    }

    #[test]
    fn judges_code() {
        let a = aliyun(DEFAULT_VARIABLE_CHARS);
        let r = |body: &str| Response {
            status: 200,
            retry_after: None,
            body: body.into(),
        };
        assert!(a.judge(&r(r#"{"Code":"OK","BizId":"1"}"#)).is_ok());
        let e = a
            .judge(&r(r#"{"Code":"isv.BUSINESS_LIMIT_CONTROL"}"#))
            .unwrap_err();
        assert!(e.retryable);
        let e = a
            .judge(&r(r#"{"Code":"isv.SMS_SIGNATURE_ILLEGAL"}"#))
            .unwrap_err();
        assert!(!e.retryable && e.message.contains("isv.SMS_SIGNATURE_ILLEGAL"));
    }
}
