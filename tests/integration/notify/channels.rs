//! The channel types added with the registry (ntfy, Pushover, Gotify, Matrix, SMS through Twilio
//! and Aliyun) sent through the real transport (`gpuwatch notify-test`) to a loopback HTTP
//! receiver, with their secrets from `*_env` and `*_file`. The Aliyun request's signature is
//! recomputed here from the received form, per Aliyun's documented algorithm.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::process::Command;

use base64::Engine as _;

use super::servers::{HttpReceiver, Mode, Request};
use super::write_config;

/// Secrets, each delivered through an environment variable or a file.
const NTFY_TOKEN: &str = "tk_NtFyToKeN4242";
const PUSHOVER_TOKEN: &str = "aPpToKeNpUsH4242";
const PUSHOVER_USER: &str = "uSeRkEyPuSh4242";
const GOTIFY_TOKEN: &str = "GoTiFyToKeN4242";
const MATRIX_TOKEN: &str = "syt_MaTrIxToKeN4242";
const TWILIO_TOKEN: &str = "TwIlIoToKeN4242";
const ALIYUN_ID: &str = "LTAIaLiYuNiD4242";
const ALIYUN_SECRET: &str = "aLiYuNsEcReT4242";
const TWILIO_SID: &str = "AC00000000000000000000000000004242";

/// Percent-decoding of a form value (`+` is a space).
fn form_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

/// The form fields of a request body, in order.
fn form(r: &Request) -> Vec<(String, String)> {
    r.body
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap();
            (form_decode(k), form_decode(v))
        })
        .collect()
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> &'a str {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no form field {name}: {fields:?}"))
}

/// RFC 3986 encoding as Aliyun specifies it (unreserved kept, space `%20`, `*` `%2A`).
fn aliyun_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Aliyun signature version 1.0, recomputed from the received parameters.
fn aliyun_signature(method: &str, params: &[(String, String)], secret: &str) -> String {
    let sorted: BTreeMap<&str, &str> = params
        .iter()
        .filter(|(k, _)| k != "Signature")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let canonical = sorted
        .iter()
        .map(|(k, v)| format!("{}={}", aliyun_encode(k), aliyun_encode(v)))
        .collect::<Vec<_>>()
        .join("&");
    let string_to_sign = format!(
        "{method}&{}&{}",
        aliyun_encode("/"),
        aliyun_encode(&canonical)
    );
    let key = ring::hmac::Key::new(
        ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
        format!("{secret}&").as_bytes(),
    );
    base64::engine::general_purpose::STANDARD
        .encode(ring::hmac::sign(&key, string_to_sign.as_bytes()).as_ref())
}

fn notify_test(config: &std::path::Path, env: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .args(["notify-test", "--config"])
        .arg(config)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn new_channel_types_deliver_to_loopback_receivers_with_secrets_from_env_and_files() {
    let tmp = tempfile::tempdir().unwrap();
    let hook = HttpReceiver::start();
    let base = hook.url("");
    std::fs::write(tmp.path().join("ntfy.token"), format!("{NTFY_TOKEN}\n")).unwrap();
    std::fs::write(tmp.path().join("pushover.user"), PUSHOVER_USER).unwrap();
    std::fs::write(tmp.path().join("matrix.token"), MATRIX_TOKEN).unwrap();
    std::fs::write(tmp.path().join("aliyun.secret"), ALIYUN_SECRET).unwrap();
    let config = write_config(
        tmp.path(),
        "",
        &format!(
            "[[channel]]\nname = \"nt\"\ntype = \"ntfy\"\nurl = \"{base}/gpu-alerts\"\ntoken_file = \"ntfy.token\"\n\
             [[channel]]\nname = \"po\"\ntype = \"pushover\"\nurl = \"{base}/1/messages.json\"\ntoken_env = \"GW_TEST_PUSHOVER_TOKEN\"\nuser_file = \"pushover.user\"\n\
             [[channel]]\nname = \"go\"\ntype = \"gotify\"\nurl = \"{base}/gotify/\"\ntoken_env = \"GW_TEST_GOTIFY_TOKEN\"\n\
             [[channel]]\nname = \"mx\"\ntype = \"matrix\"\nurl = \"{base}\"\nroom = \"!ops:example.org\"\ntoken_file = \"matrix.token\"\n\
             [[channel]]\nname = \"tw\"\ntype = \"sms\"\nprovider = \"twilio\"\nurl = \"{base}\"\naccount_sid = \"{TWILIO_SID}\"\ntoken_env = \"GW_TEST_TWILIO_TOKEN\"\nfrom = \"+15005550006\"\nto = [\"+15551230001\", \"+15551230002\"]\n\
             [[channel]]\nname = \"ali\"\ntype = \"sms\"\nprovider = \"aliyun\"\nurl = \"{base}/aliyun/\"\naccess_key_id_env = \"GW_TEST_ALIYUN_ID\"\naccess_key_secret_file = \"aliyun.secret\"\nsign_name = \"GPU监控\"\ntemplate_code = \"SMS_123456789\"\nto = [\"13800000000\"]\n"
        ),
    );
    let env = [
        ("GW_TEST_PUSHOVER_TOKEN", PUSHOVER_TOKEN),
        ("GW_TEST_GOTIFY_TOKEN", GOTIFY_TOKEN),
        ("GW_TEST_TWILIO_TOKEN", TWILIO_TOKEN),
        ("GW_TEST_ALIYUN_ID", ALIYUN_ID),
    ];
    let (code, out) = notify_test(&config, &env);
    assert_eq!(code, 0, "{out}");
    for line in [
        "ok    nt (ntfy)",
        "ok    po (pushover)",
        "ok    go (gotify)",
        "ok    mx (matrix)",
        "ok    tw (sms)",
        "ok    ali (sms)",
    ] {
        assert!(out.contains(line), "{line:?} missing:\n{out}");
    }
    let reqs = hook.requests();
    let find = |prefix: &str| -> Vec<&Request> {
        let got: Vec<&Request> = reqs.iter().filter(|r| r.path.starts_with(prefix)).collect();
        assert!(!got.is_empty(), "no request to {prefix}: {reqs:?}");
        got
    };

    // ntfy: POST to the topic, title / priority / tags in headers, token from a file.
    let nt = find("/gpu-alerts")[0];
    assert_eq!(nt.method, "POST");
    assert_eq!(
        nt.header("authorization"),
        Some(format!("Bearer {NTFY_TOKEN}").as_str())
    );
    assert!(nt
        .header("title")
        .unwrap()
        .starts_with("[TEST] gpuwatch_test on testhost"));
    assert_eq!(nt.header("priority"), Some("2"));
    assert!(nt.header("tags").is_some());
    assert!(nt.header("content-type").unwrap().starts_with("text/plain"));
    assert!(nt.body.contains("-- gpuwatch on testhost"), "{}", nt.body);

    // Pushover: a form with token (env) and user (file).
    let po = form(find("/1/messages.json")[0]);
    assert_eq!(field(&po, "token"), PUSHOVER_TOKEN);
    assert_eq!(field(&po, "user"), PUSHOVER_USER);
    assert!(field(&po, "title").starts_with("[TEST] gpuwatch_test"));
    assert_eq!(field(&po, "priority"), "-1");
    assert!(!field(&po, "message").is_empty());

    // Gotify: POST {url}/message with X-Gotify-Key (env).
    let go = find("/gotify/message")[0];
    assert_eq!(go.header("x-gotify-key"), Some(GOTIFY_TOKEN));
    let body = go.json();
    assert!(body["title"].as_str().unwrap().starts_with("[TEST]"));
    assert_eq!(body["priority"], 2);

    // Matrix: PUT to the room with the notification id as transaction id, token from a file.
    let mx = find("/_matrix/client/v3/rooms/%21ops%3Aexample.org/send/m.room.message/")[0];
    assert_eq!(mx.method, "PUT");
    assert_eq!(
        mx.path.rsplit('/').next(),
        mx.header("x-gpuwatch-notification-id"),
        "txnId is the notification id"
    );
    assert_eq!(
        mx.header("authorization"),
        Some(format!("Bearer {MATRIX_TOKEN}").as_str())
    );
    let body = mx.json();
    assert_eq!(body["msgtype"], "m.text");
    assert_eq!(body["format"], "org.matrix.custom.html");
    assert!(body["body"]
        .as_str()
        .unwrap()
        .starts_with("[TEST] gpuwatch_test"));

    // Twilio: one request per recipient, basic auth sid:token (env).
    let tw = find(&format!("/2010-04-01/Accounts/{TWILIO_SID}/Messages.json"));
    assert_eq!(tw.len(), 2);
    let basic =
        base64::engine::general_purpose::STANDARD.encode(format!("{TWILIO_SID}:{TWILIO_TOKEN}"));
    let mut to = Vec::new();
    for r in &tw {
        assert_eq!(
            r.header("authorization"),
            Some(format!("Basic {basic}").as_str())
        );
        let f = form(r);
        assert_eq!(field(&f, "From"), "+15005550006");
        let text = field(&f, "Body");
        assert!(text.starts_with("[TEST] testhost: gpuwatch_test"), "{text}");
        assert!(text.chars().count() <= 160, "{text}");
        to.push(field(&f, "To").to_string());
    }
    to.sort();
    assert_eq!(to, ["+15551230001", "+15551230002"]);

    // Aliyun: the signature checks out against the secret (file) and the fields are all there.
    let ali = find("/aliyun/")[0];
    assert_eq!(ali.method, "POST");
    let f = form(ali);
    assert_eq!(field(&f, "AccessKeyId"), ALIYUN_ID);
    assert_eq!(field(&f, "Action"), "SendSms");
    assert_eq!(field(&f, "PhoneNumbers"), "13800000000");
    assert_eq!(field(&f, "SignName"), "GPU监控");
    assert_eq!(field(&f, "TemplateCode"), "SMS_123456789");
    assert_eq!(field(&f, "SignatureMethod"), "HMAC-SHA1");
    assert_eq!(field(&f, "SignatureVersion"), "1.0");
    assert_eq!(field(&f, "SignatureNonce").len(), 32);
    let param: serde_json::Value = serde_json::from_str(field(&f, "TemplateParam")).unwrap();
    assert!(param["content"]
        .as_str()
        .unwrap()
        .starts_with("[TEST] testhost"));
    assert!(chrono::DateTime::parse_from_rfc3339(field(&f, "Timestamp")).is_ok());
    assert_eq!(
        field(&f, "Signature"),
        aliyun_signature("POST", &f, ALIYUN_SECRET),
        "signature recomputed by the receiver"
    );
    assert_ne!(
        field(&f, "Signature"),
        aliyun_signature("POST", &f, "wrong-secret")
    );

    // Rejections name the HTTP status and never a secret.
    hook.set_mode(Mode::Status(401));
    let (code, out) = notify_test(&config, &env);
    assert_eq!(code, 1, "{out}");
    assert_eq!(out.matches("HTTP 401").count(), 6, "{out}");
    for secret in [
        NTFY_TOKEN,
        PUSHOVER_TOKEN,
        PUSHOVER_USER,
        GOTIFY_TOKEN,
        MATRIX_TOKEN,
        TWILIO_TOKEN,
        ALIYUN_ID,
        ALIYUN_SECRET,
    ] {
        assert!(!out.contains(secret), "secret {secret} leaked:\n{out}");
    }
}

#[test]
fn check_reports_new_channel_errors_with_positions() {
    let tmp = tempfile::tempdir().unwrap();
    let config = write_config(
        tmp.path(),
        "",
        "[[channel]]\nname = \"sms\"\ntype = \"sms\"\nprovider = \"aliyun\"\naccess_key_id = \"id\"\naccess_key_secret_env = \"GW_TEST_UNSET_ALIYUN\"\nsign_name = \"s\"\ntemplate_code = \"SMS_1\"\nto = [\"13800000000\"]\n\
         [[channel]]\nname = \"nt\"\ntype = \"ntfy\"\nurl = \"https://ntfy.sh/x\"\npriority = 5\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .args(["check", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("config.toml:12:8: channel \"sms\": `access_key_secret_env`: environment variable GW_TEST_UNSET_ALIYUN is not set"),
        "{err}"
    );
    assert!(
        err.contains("config.toml:24:1: channel \"nt\": unknown field `priority`"),
        "{err}"
    );
}
