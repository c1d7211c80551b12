//! Golden files: for every channel type, the entire rendered request — method, URL, every header
//! the channel sets and the whole body (email: envelope, headers and both parts) — for one fixed
//! notification, clock and nonce, with secrets masked as `***`. The files live in
//! `tests/fixtures/notify/golden/`; a mismatch prints a line diff, and `GPUWATCH_BLESS=1 cargo
//! test --lib notify::golden` rewrites them. The transport adds `User-Agent`, `Host` and
//! `Content-Length` on the wire; those are not part of a channel's rendering.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::channel::{RenderEnv, Request};
use super::settings::ChannelSpec;
use super::testdata::{alert, notification};
use super::Notification;
use crate::model::AlertStatus;

/// The fixed clock: 2026-12-02T15:20:00.500Z, the fixture notification's creation time.
const NOW_MS: i64 = 1_796_224_800_500;
/// The fixed nonce.
const NONCE: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f0";

/// (golden file name, the channel's `[[channel]]` keys after `name`).
const CASES: &[(&str, &str)] = &[
    ("webhook", "type = \"webhook\"\nurl = \"https://hooks.example.org/gpu/whsecret42\"\n"),
    (
        "slack",
        "type = \"slack\"\nurl = \"https://hooks.slack.com/services/T0/B0/slacksecret42\"\n",
    ),
    (
        "discord",
        "type = \"discord\"\nurl = \"https://discord.com/api/webhooks/1/discordsecret42\"\n",
    ),
    (
        "teams",
        "type = \"teams\"\nurl = \"https://prod.example.logic.azure.com/workflows/teamssecret42\"\n",
    ),
    (
        "telegram",
        "type = \"telegram\"\ntoken = \"123456:tgsecret42\"\nchat_id = -1001234567890\n",
    ),
    (
        "feishu",
        "type = \"feishu\"\nurl = \"https://open.feishu.cn/open-apis/bot/v2/hook/fshooksecret42\"\nsecret = \"fssignsecret42\"\n",
    ),
    (
        "dingtalk",
        "type = \"dingtalk\"\nurl = \"https://oapi.dingtalk.com/robot/send?access_token=dtsecret42\"\nsecret = \"SECdtsignsecret42\"\n",
    ),
    (
        "wecom",
        "type = \"wecom\"\nurl = \"https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=wcsecret42\"\n",
    ),
    ("alertmanager", "type = \"alertmanager\"\nurl = \"http://am.internal:9093\"\n"),
    (
        "email",
        "type = \"email\"\nsmtp = \"smtp.example.org:587\"\nfrom = \"gpuwatch@example.org\"\nto = [\"oncall@example.org\", \"lead@example.org\"]\nusername = \"gpuwatch\"\npassword = \"smtpsecret42\"\n",
    ),
    (
        "ntfy",
        "type = \"ntfy\"\nurl = \"https://ntfy.sh/gpu-alerts-ntfysecret42\"\ntoken = \"tk_ntfytoken42\"\n",
    ),
    (
        "pushover",
        "type = \"pushover\"\ntoken = \"apppushtoken42\"\nuser = \"userpushkey42\"\n",
    ),
    (
        "gotify",
        "type = \"gotify\"\nurl = \"https://gotify.example.org\"\ntoken = \"gotifytoken42\"\n",
    ),
    (
        "matrix",
        "type = \"matrix\"\nurl = \"https://matrix.example.org\"\nroom = \"!gpuops:example.org\"\ntoken = \"syt_matrixtoken42\"\n",
    ),
    (
        "sms-twilio",
        "type = \"sms\"\nprovider = \"twilio\"\naccount_sid = \"AC0123456789abcdef0123456789abcdef\"\ntoken = \"twiliotoken42\"\nfrom = \"+15005550006\"\nto = [\"+15551230001\", \"+15551230002\"]\n",
    ),
    (
        "sms-aliyun",
        "type = \"sms\"\nprovider = \"aliyun\"\naccess_key_id = \"LTAIaliyunkeyid42\"\naccess_key_secret = \"aliyunkeysecret42\"\nsign_name = \"GPU监控\"\ntemplate_code = \"SMS_123456789\"\nto = [\"13800000000\", \"13900000000\"]\n",
    ),
];

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/notify/golden")
}

fn spec(keys: &str) -> ChannelSpec {
    #[derive(serde::Deserialize)]
    struct Doc {
        channel: Vec<super::settings::ChannelSection>,
    }
    let text = format!("[[channel]]\nname = \"ops\"\n{keys}");
    let doc: Doc = toml::from_str(&text).expect("channel table");
    let settings = super::settings::NotifySettings::from_config(&super::settings::NotifyConfig {
        notify: &super::settings::NotifySection::default(),
        channels: &doc.channel,
        routes: &[],
        hostname: "golden",
        base_dir: Path::new("."),
        path: Path::new("golden.toml"),
        text: &text,
    })
    .expect("channel");
    settings.channels[0].clone()
}

fn fixture() -> Notification {
    notification(vec![alert(1, AlertStatus::Firing)])
}

/// The whole request(s), secrets masked.
pub fn dump(spec: &ChannelSpec, n: &Notification) -> String {
    let env = RenderEnv {
        now_ms: NOW_MS,
        nonce: NONCE.into(),
    };
    let requests = spec.channel.render(n, &env).expect("render");
    let mut out = String::new();
    let total = requests.len();
    for (i, req) in requests.iter().enumerate() {
        if total > 1 {
            let _ = writeln!(out, "### request {} of {total}", i + 1);
        }
        match req {
            Request::Http(h) => {
                let _ = writeln!(out, "{} {}", h.method.as_str(), spec.redact(h.url.expose()));
                for header in &h.headers {
                    let value = if header.secret {
                        "***".to_string()
                    } else {
                        spec.redact(&header.value)
                    };
                    let _ = writeln!(out, "{}: {value}", header.name);
                }
                out.push('\n');
                let body = String::from_utf8_lossy(&h.body);
                match serde_json::from_slice::<serde_json::Value>(&h.body) {
                    Ok(json) if !h.body.is_empty() => {
                        let pretty = serde_json::to_string_pretty(&json).unwrap_or_default();
                        // The wire form is compact; the same bytes pretty-printed for review.
                        assert_eq!(
                            serde_json::to_string(&json).unwrap_or_default(),
                            body,
                            "the body is canonical compact JSON"
                        );
                        out.push_str(&spec.redact(&pretty));
                    }
                    _ => out.push_str(&spec.redact(&body)),
                }
                out.push('\n');
            }
            Request::Smtp(m) => {
                let s = &m.server;
                let envelope = m.message.envelope();
                let _ = writeln!(
                    out,
                    "SMTP {}:{} tls={:?} auth={}",
                    s.host,
                    s.port,
                    s.tls,
                    match (&s.username, &s.password) {
                        (Some(u), Some(_)) => format!("{u}:***"),
                        (Some(u), None) => u.clone(),
                        _ => "none".into(),
                    }
                );
                let _ = writeln!(
                    out,
                    "MAIL FROM:<{}>",
                    envelope.from().map(ToString::to_string).unwrap_or_default()
                );
                for to in envelope.to() {
                    let _ = writeln!(out, "RCPT TO:<{to}>");
                }
                out.push('\n');
                let raw = String::from_utf8_lossy(&m.message.formatted()).replace("\r\n", "\n");
                out.push_str(&spec.redact(&mask_email(&raw)));
                out.push('\n');
            }
        }
    }
    for secret in spec.secrets() {
        assert!(
            !out.contains(secret.expose()),
            "a secret of {} reached the golden text",
            spec.kind.as_str()
        );
    }
    out
}

/// Replaces the volatile parts of a formatted email: `Date:` and the MIME boundary.
fn mask_email(raw: &str) -> String {
    let mut out = String::new();
    let boundary = raw
        .split("boundary=\"")
        .nth(1)
        .and_then(|r| r.split('"').next());
    for line in raw.lines() {
        if line.starts_with("Date: ") {
            out.push_str("Date: ***");
        } else {
            match boundary {
                Some(b) if !b.is_empty() => out.push_str(&line.replace(b, "BOUNDARY")),
                _ => out.push_str(line),
            }
        }
        out.push('\n');
    }
    out
}

/// A line diff (longest common subsequence), `-` expected, `+` actual, with 2 lines of context.
pub fn diff(expected: &str, actual: &str) -> String {
    let a: Vec<&str> = expected.lines().collect();
    let b: Vec<&str> = actual.lines().collect();
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut ops: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', a[i]));
            i += 1;
        } else {
            ops.push(('+', b[j]));
            j += 1;
        }
    }
    let near_change = |k: usize| {
        ops[k.saturating_sub(2)..(k + 3).min(ops.len())]
            .iter()
            .any(|(op, _)| *op != ' ')
    };
    let mut out = String::new();
    let mut skipped = false;
    for (k, (op, line)) in ops.iter().enumerate() {
        if near_change(k) {
            let _ = writeln!(out, "{op} {line}");
            skipped = false;
        } else if !skipped {
            out.push_str("  …\n");
            skipped = true;
        }
    }
    out
}

#[test]
fn every_registered_channel_has_a_golden_case() {
    for r in super::CHANNELS {
        assert!(
            CASES
                .iter()
                .any(|(name, _)| name.split('-').next() == Some(r.type_name)),
            "channel type {:?} has no golden file case",
            r.type_name
        );
    }
}

#[test]
fn requests_match_their_golden_files() {
    let bless = std::env::var_os("GPUWATCH_BLESS").is_some_and(|v| v == "1");
    let dir = golden_dir();
    let mut failures = Vec::new();
    for (name, keys) in CASES {
        let got = dump(&spec(keys), &fixture());
        let path = dir.join(format!("{name}.txt"));
        if bless {
            std::fs::create_dir_all(&dir).expect("golden dir");
            std::fs::write(&path, &got).expect("write golden");
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(want) if want == got => {}
            Ok(want) => failures.push(format!(
                "{} differs (- golden, + now):\n{}",
                path.display(),
                diff(&want, &got)
            )),
            Err(e) => failures.push(format!("{}: {e}", path.display())),
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n\nIf the change is intended: GPUWATCH_BLESS=1 cargo test --lib notify::golden",
        failures.join("\n\n")
    );
}

#[test]
fn diff_shows_changed_lines_with_context() {
    let d = diff("a\nb\nc\nd\ne\nf\ng\n", "a\nb\nc\nD\ne\nf\ng\n");
    assert_eq!(d, "  …\n  b\n  c\n- d\n+ D\n  e\n  f\n  …\n");
}
