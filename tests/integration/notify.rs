//! Notification delivery against real loopback servers: an HTTP receiver and an aiosmtpd SMTP
//! server started by the tests. Events are fed to `gpuwatch daemon --events -` (the same
//! dispatcher, grouper, outbox and transports the sampling daemon uses).

#![allow(clippy::unwrap_used)]

mod channels;
pub mod servers;
pub(crate) mod tls;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use servers::{
    free_port, unfold_email, wait_until, Daemon, HttpReceiver, Mode, SilentServer, SmtpServer,
};

const T: Duration = Duration::from_secs(20);

/// An alert event as the engine emits it.
pub fn event(name: &str, gpu: u32, severity: &str, status: &str) -> Value {
    let now = chrono::Utc::now().timestamp_millis();
    json!({
        "fingerprint": format!("{name}-{gpu}"),
        "name": name,
        "severity": severity,
        "status": status,
        "labels": {
            "alertname": name, "severity": severity, "gpu": gpu.to_string(),
            "uuid": format!("GPU-{gpu:08}-1111-2222-3333-444444444444"), "hostname": "testhost"
        },
        "annotations": {
            "summary": format!("GPU {gpu} fell off the bus (XID 79)"),
            "values": "xid=79",
            "next_steps": "Drain the node and power-cycle it."
        },
        "starts_at_ms": now - 1000,
        "ends_at_ms": if status == "resolved" { Some(now) } else { None },
        "at_ms": now,
        "repeat": false,
        "gpu": gpu,
    })
}

/// A config file in `dir` with `[daemon]`, `[notify]` and the given channel/route text.
/// `notify` lines override the test defaults (`retry_initial = "200ms"`, `retry_max = "1s"`,
/// `timeout = "2s"`).
pub fn write_config(dir: &Path, notify: &str, rest: &str) -> PathBuf {
    let path = dir.join("config.toml");
    let mut lines = vec![notify.to_string()];
    for (key, default) in [
        ("retry_initial", "\"200ms\""),
        ("retry_max", "\"1s\""),
        ("timeout", "\"2s\""),
    ] {
        if !notify.contains(&format!("{key} =")) {
            lines.push(format!("{key} = {default}"));
        }
    }
    std::fs::write(
        &path,
        format!(
            "[daemon]\nstate_dir = \"state\"\nhostname = \"testhost\"\n\n[notify]\n{}\n\n{rest}",
            lines.join("\n")
        ),
    )
    .unwrap();
    path
}

fn webhook_channel(name: &str, url: &str) -> String {
    format!("[[channel]]\nname = \"{name}\"\ntype = \"webhook\"\nurl = \"{url}\"\n")
}

fn email_channel(name: &str, port: u16) -> String {
    format!(
        "[[channel]]\nname = \"{name}\"\ntype = \"email\"\nsmtp = \"127.0.0.1:{port}\"\ntls = \"none\"\nfrom = \"gpuwatch@example.org\"\nto = [\"oncall@example.org\", \"boss@example.org\"]\n"
    )
}

/// A route to `channels`; `extra` lines override the defaults (`group_by = ["alertname"]`,
/// `group_wait = "0s"`, `group_interval = "1s"`).
fn route(channels: &[&str], extra: &str) -> String {
    let list: Vec<String> = channels.iter().map(|c| format!("\"{c}\"")).collect();
    let mut lines = vec![
        "severity = [\"warning\", \"critical\"]".to_string(),
        format!("channels = [{}]", list.join(", ")),
    ];
    for (key, default) in [
        ("group_by", "[\"alertname\"]"),
        ("group_wait", "\"0s\""),
        ("group_interval", "\"1s\""),
    ] {
        if !extra.contains(&format!("{key} =")) {
            lines.push(format!("{key} = {default}"));
        }
    }
    format!("[[route]]\n{}\n{extra}\n", lines.join("\n"))
}

fn outbox_files(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("state/outbox"))
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn webhook_body_is_alertmanager_v4_and_email_has_the_context() {
    let tmp = tempfile::tempdir().unwrap();
    let hook = HttpReceiver::start();
    let smtp = SmtpServer::start(&tmp.path().join("mail"), None);
    let config = write_config(
        tmp.path(),
        "",
        &format!(
            "{}{}{}",
            webhook_channel("ops", &hook.url("/hook")),
            email_channel("mail", smtp.port),
            route(&["ops", "mail"], "")
        ),
    );
    let mut d = Daemon::events(&config, &tmp.path().join("log"), &[]);
    d.send(&json!({
        "devices": [{"index": 3, "minor": 3, "uuid": "GPU-00000003-1111-2222-3333-444444444444",
                     "pci_bus_id": "00000000:0A:00.0", "name": "NVIDIA A100-SXM4-80GB"}],
        "processes": [{"pid": 31337, "gpu_index": 3, "gpu_uuid": "GPU-00000003-1111-2222-3333-444444444444",
                       "used_mem_bytes": 21474836480u64, "kind": "compute", "uid": 1000, "user": "alice",
                       "command": "python train.py --epochs 90", "container": null, "runtime_s": 3600.0}]
    }));
    d.send(&event("XidCritical", 3, "critical", "firing"));

    let reqs = hook.wait_accepted(1, T);
    let r = &reqs[0];
    assert_eq!(r.method, "POST");
    assert_eq!(r.path, "/hook");
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("idempotency-key").map(str::len), Some(32));
    let body = r.json();
    assert_eq!(body["version"], "4");
    assert_eq!(body["status"], "firing");
    assert_eq!(body["receiver"], "ops");
    assert_eq!(body["groupLabels"], json!({"alertname": "XidCritical"}));
    assert_eq!(body["commonLabels"]["alertname"], "XidCritical");
    assert_eq!(
        body["commonAnnotations"]["summary"],
        "GPU 3 fell off the bus (XID 79)"
    );
    assert_eq!(body["truncatedAlerts"], 0);
    let a = &body["alerts"][0];
    assert_eq!(a["status"], "firing");
    for (k, v) in [
        ("alertname", "XidCritical"),
        ("severity", "critical"),
        ("gpu", "3"),
        ("uuid", "GPU-00000003-1111-2222-3333-444444444444"),
        ("hostname", "testhost"),
    ] {
        assert_eq!(a["labels"][k], v, "label {k}");
    }
    assert_eq!(
        a["annotations"]["summary"],
        "GPU 3 fell off the bus (XID 79)"
    );
    assert_eq!(a["endsAt"], "0001-01-01T00:00:00Z");
    assert_eq!(a["fingerprint"], "XidCritical-3");
    assert!(chrono::DateTime::parse_from_rfc3339(a["startsAt"].as_str().unwrap()).is_ok());

    let mails = smtp.wait_messages(1, T);
    let m = &mails[0];
    assert_eq!(m["mail_from"], "gpuwatch@example.org");
    assert_eq!(
        m["rcpt_tos"],
        json!(["oncall@example.org", "boss@example.org"])
    );
    let data = unfold_email(m["data"].as_str().unwrap());
    assert!(
        data.contains("Subject: [CRITICAL] XidCritical on testhost: GPU 3"),
        "{data}"
    );
    assert!(data.contains("multipart/alternative"), "{data}");
    assert!(data.contains("text/html"), "{data}");
    for needle in [
        "Host: testhost",
        "GPU 3 (NVIDIA A100-SXM4-80GB, GPU-00000003-1111-2222-3333-444444444444)",
        "Rule: XidCritical",
        "FIRING (critical)",
        "GPU 3 fell off the bus (XID 79)",
        "Values: xid=79",
        "Started: ",
        "pid 31337 user alice mem 20480 MiB",
        "python train.py --epochs 90",
        "Next: Drain the node and power-cycle it.",
    ] {
        assert!(data.contains(needle), "email lacks {needle:?}:\n{data}");
    }
    // Without a chart, no image part.
    assert!(!data.contains("image/png"), "{data}");
    // Delivered entries leave the outbox.
    wait_until(T, "empty outbox", || {
        (outbox_files(tmp.path()) == 0).then_some(())
    });
    assert!(d.finish(T).success());
    assert_eq!(hook.accepted().len(), 1, "exactly one webhook");
    assert_eq!(smtp.messages().len(), 1, "exactly one email");
}

/// Issue 13: the HTML part of an alert email shows the rule's metric over its window as an
/// inline PNG (`cid:`), with a caption giving min, max and the last value.
#[test]
fn email_carries_the_chart_of_the_alert() {
    let tmp = tempfile::tempdir().unwrap();
    let smtp = SmtpServer::start(&tmp.path().join("mail"), None);
    let config = write_config(
        tmp.path(),
        "",
        &format!(
            "{}{}",
            email_channel("mail", smtp.port),
            route(&["mail"], "")
        ),
    );
    let mut d = Daemon::events(&config, &tmp.path().join("log"), &[]);
    let mut ev = event("TemperatureHigh", 2, "warning", "firing");
    let now = chrono::Utc::now().timestamp_millis();
    let points: Vec<Value> = (0..60)
        .map(|i| json!([now - (60 - i) * 10_000, 60.0 + f64::from(i as u32) / 2.0]))
        .collect();
    ev["chart"] =
        json!({"metric": "temp", "unit": "celsius", "window_ms": 600_000, "points": points});
    d.send(&ev);
    let mails = smtp.wait_messages(1, T);
    let data = unfold_email(mails[0]["data"].as_str().unwrap());
    assert!(data.contains("multipart/related"), "{data}");
    assert!(data.contains("Content-Type: image/png"), "{data}");
    let cid = data
        .split("src=3D\"cid:")
        .nth(1)
        .or_else(|| data.split("src=\"cid:").nth(1))
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no cid: image in the HTML part: {data}"));
    let cid = cid.trim_end_matches('\\').replace("=\n", "");
    assert!(
        data.contains(&format!("Content-ID: <{cid}>")),
        "{cid} in {data}"
    );
    assert!(
        data.contains("temp over the last 10 min"),
        "caption: {data}"
    );
    assert!(d.finish(T).success());
}

#[test]
fn grouping_collapses_a_multi_gpu_fault_into_one_message() {
    let tmp = tempfile::tempdir().unwrap();
    let hook = HttpReceiver::start();
    let smtp = SmtpServer::start(&tmp.path().join("mail"), None);
    let config = write_config(
        tmp.path(),
        "",
        &format!(
            "{}{}{}",
            webhook_channel("ops", &hook.url("/hook")),
            email_channel("mail", smtp.port),
            route(&["ops", "mail"], "group_wait = \"1s\"")
        ),
    );
    let mut d = Daemon::events(&config, &tmp.path().join("log"), &[]);
    for gpu in 0..8 {
        d.send(&event("PowerBrake", gpu, "warning", "firing"));
    }
    let reqs = hook.wait_accepted(1, T);
    let mails = smtp.wait_messages(1, T);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(hook.accepted().len(), 1, "one webhook for eight GPUs");
    assert_eq!(smtp.messages().len(), 1, "one email for eight GPUs");
    assert_eq!(reqs[0].json()["alerts"].as_array().unwrap().len(), 8);
    let data = unfold_email(mails[0]["data"].as_str().unwrap());
    assert!(data.contains("GPUs 0,1,2,3,4,5,6,7 (8 firing)"), "{data}");
    assert!(d.finish(T).success());
}

#[test]
fn webhook_500_and_timeouts_are_retried_with_the_same_id() {
    let tmp = tempfile::tempdir().unwrap();
    let hook = HttpReceiver::start();
    hook.set_mode(Mode::Status(500));
    let slow = HttpReceiver::start();
    slow.set_mode(Mode::Hang);
    let config = write_config(
        tmp.path(),
        "failing_after = 100",
        &format!(
            "{}{}timeout = \"500ms\"\n{}",
            webhook_channel("ops", &hook.url("/hook")),
            webhook_channel("slow", &slow.url("/slow")),
            route(&["ops", "slow"], "")
        ),
    );
    let mut d = Daemon::events(&config, &tmp.path().join("log"), &[]);
    d.send(&event("EccErrors", 0, "warning", "firing"));
    wait_until(T, "two failed attempts on each", || {
        (hook.requests().len() >= 2 && slow.requests().len() >= 2).then_some(())
    });
    assert_eq!(outbox_files(tmp.path()), 2, "both still queued");
    hook.set_mode(Mode::Ok);
    slow.set_mode(Mode::Ok);
    let ok = hook.wait_accepted(1, T);
    let ok_slow = slow.wait_accepted(1, T);
    let ids: Vec<_> = hook
        .requests()
        .iter()
        .map(|r| r.header("idempotency-key").unwrap().to_string())
        .collect();
    assert!(
        ids.iter().all(|i| *i == ids[0]),
        "retries keep the id: {ids:?}"
    );
    assert_eq!(
        ok[0].json()["alerts"][0]["labels"]["alertname"],
        "EccErrors"
    );
    assert_eq!(
        ok_slow[0].json()["alerts"][0]["labels"]["alertname"],
        "EccErrors"
    );
    wait_until(T, "empty outbox", || {
        (outbox_files(tmp.path()) == 0).then_some(())
    });
    let log = d.log_text();
    assert!(log.contains("HTTP 500"), "{log}");
    assert!(log.contains("send failed, will retry"), "{log}");
    assert!(d.finish(T).success());
}

#[test]
fn smtp_refusing_or_down_is_retried() {
    let tmp = tempfile::tempdir().unwrap();
    let maildir = tmp.path().join("mail");
    std::fs::create_dir_all(&maildir).unwrap();
    let smtp = SmtpServer::start(&maildir, None);
    smtp.refuse(true);
    let down_port = free_port();
    let config = write_config(
        tmp.path(),
        "",
        &format!(
            "{}{}{}",
            email_channel("mail", smtp.port),
            email_channel("mail2", down_port),
            route(&["mail", "mail2"], "")
        ),
    );
    let mut d = Daemon::events(&config, &tmp.path().join("log"), &[]);
    d.send(&event("EccErrors", 1, "critical", "firing"));
    wait_until(T, "refusals logged", || {
        let log = d.log_text();
        (log.matches("451").count() >= 2 && log.contains("mail2")).then_some(())
    });
    assert!(smtp.messages().is_empty());
    smtp.refuse(false);
    let second = SmtpServer::start_on(down_port, &tmp.path().join("mail2"), None);
    // (notifier_failing messages about the other channel may arrive too.)
    for server in [&smtp, &second] {
        wait_until(T, "the EccErrors email", || {
            server
                .messages()
                .iter()
                .any(|m| {
                    unfold_email(m["data"].as_str().unwrap())
                        .contains("Subject: [CRITICAL] EccErrors")
                })
                .then_some(())
        });
    }
    assert!(d.finish(T).success());
}

#[test]
fn outbox_survives_kill_9_and_everything_arrives_when_the_receiver_is_back() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(
        tmp.path(),
        "",
        &format!(
            "{}{}",
            webhook_channel("ops", &format!("http://127.0.0.1:{port}/hook")),
            route(&["ops"], "group_by = [\"...\"]")
        ),
    );
    let log = tmp.path().join("log");
    let mut d = Daemon::events(&config, &log, &[]);
    d.send(&event("XidCritical", 0, "critical", "firing"));
    d.send(&event("EccErrors", 1, "warning", "firing"));
    wait_until(T, "two queued messages", || {
        (outbox_files(tmp.path()) == 2).then_some(())
    });
    wait_until(T, "a failed attempt", || {
        d.log_text()
            .contains("send failed, will retry")
            .then_some(())
    });
    d.kill9();
    assert_eq!(
        outbox_files(tmp.path()),
        2,
        "queued messages survive kill -9"
    );

    let hook = HttpReceiver::start_on(port);
    let d = Daemon::events(&config, &log, &[]);
    let got = hook.wait_accepted(2, T);
    let mut names: Vec<String> = got
        .iter()
        .map(|r| {
            r.json()["alerts"][0]["labels"]["alertname"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    names.sort();
    assert_eq!(names, ["EccErrors", "XidCritical"]);
    wait_until(T, "empty outbox", || {
        (outbox_files(tmp.path()) == 0).then_some(())
    });
    assert!(d.log_text().contains("resuming undelivered notifications"));
    assert!(d.finish(T).success());
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        hook.accepted().len(),
        2,
        "no duplicates after a clean delivery"
    );
}

#[test]
fn graceful_stop_keeps_what_is_waiting_in_a_group() {
    let tmp = tempfile::tempdir().unwrap();
    let hook = HttpReceiver::start();
    let config = write_config(
        tmp.path(),
        "",
        &format!(
            "{}{}",
            webhook_channel("ops", &hook.url("/hook")),
            route(&["ops"], "group_wait = \"2s\"")
        ),
    );
    let log = tmp.path().join("log");
    let mut d = Daemon::events(&config, &log, &[]);
    d.send(&event("ThermalSlowdown", 2, "warning", "firing"));
    std::thread::sleep(Duration::from_millis(500));
    d.signal(libc::SIGTERM);
    assert!(d.wait(T).success());
    assert!(hook.requests().is_empty(), "group_wait had not passed");
    // The group is in the saved state; the restarted daemon sends it.
    let d = Daemon::events(&config, &log, &[]);
    let got = hook.wait_accepted(1, T);
    assert_eq!(
        got[0].json()["alerts"][0]["labels"]["alertname"],
        "ThermalSlowdown"
    );
    assert!(d.finish(T).success());
}

#[test]
fn failing_channel_raises_notifier_failing_through_the_others() {
    let tmp = tempfile::tempdir().unwrap();
    let hook = HttpReceiver::start();
    let dead_port = free_port();
    let config = write_config(
        tmp.path(),
        "failing_after = 2",
        &format!(
            "{}{}{}",
            webhook_channel("ops", &hook.url("/hook")),
            webhook_channel("dead", &format!("http://127.0.0.1:{dead_port}/x")),
            route(&["dead"], "")
        ),
    );
    let mut d = Daemon::events(&config, &tmp.path().join("log"), &[]);
    d.send(&event("XidCritical", 0, "critical", "firing"));
    let got = hook.wait_accepted(1, T);
    let body = got[0].json();
    assert_eq!(body["alerts"][0]["labels"]["alertname"], "notifier_failing");
    assert_eq!(body["alerts"][0]["labels"]["channel"], "dead");
    let summary = body["alerts"][0]["annotations"]["summary"]
        .as_str()
        .unwrap();
    assert!(
        summary.contains("\"dead\" (webhook) keeps failing: cannot connect"),
        "{summary}"
    );
    // The channel comes back: the queued alert arrives and notifier_failing resolves.
    let back = HttpReceiver::start_on(dead_port);
    let arrived = back.wait_accepted(1, T);
    assert_eq!(
        arrived[0].json()["alerts"][0]["labels"]["alertname"],
        "XidCritical"
    );
    let got = hook.wait_accepted(2, T);
    assert_eq!(got[1].json()["status"], "resolved");
    assert!(d.finish(T).success());
}

#[test]
fn secrets_from_the_environment_never_show_in_logs() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let smtp_port = free_port();
    let url = format!("http://127.0.0.1:{port}/hooks/T000/B000/XyZsEcReTtOkEn42");
    let config = write_config(
        tmp.path(),
        "",
        &format!(
            "[[channel]]\nname = \"chat\"\ntype = \"slack\"\nurl_env = \"GW_TEST_SLACK_URL\"\n\
             [[channel]]\nname = \"tg\"\ntype = \"telegram\"\nurl = \"http://127.0.0.1:{port}\"\ntoken_env = \"GW_TEST_TG_TOKEN\"\nchat_id = 42\n\
             [[channel]]\nname = \"mail\"\ntype = \"email\"\nsmtp = \"127.0.0.1:{smtp_port}\"\ntls = \"none\"\nfrom = \"a@example.org\"\nto = [\"b@example.org\"]\nusername = \"gw\"\npassword_env = \"GW_TEST_SMTP_PASS\"\n\
             {}",
            route(&["chat", "tg", "mail"], "")
        ),
    );
    let env = [
        ("GW_TEST_SLACK_URL", url.as_str()),
        ("GW_TEST_TG_TOKEN", "123456:TgSeCrEtToKeN"),
        ("GW_TEST_SMTP_PASS", "SmTpPaSsWoRd!"),
    ];
    let mut d = Daemon::events(&config, &tmp.path().join("log"), &env);
    d.send(&event("XidCritical", 0, "critical", "firing"));
    wait_until(T, "failures on all three channels", || {
        let log = d.log_text();
        (log.contains("channel=chat")
            && log.contains("channel=tg")
            && log.contains("channel=mail")
            && log.matches("will retry").count() >= 3)
            .then_some(())
    });
    // Now with a receiver that rejects with 404 (the error text echoes the request).
    let hook = HttpReceiver::start_on(port);
    hook.set_mode(Mode::Status(404));
    wait_until(T, "a 404", || {
        d.log_text().contains("HTTP 404").then_some(())
    });
    let smtp = SmtpServer::start_on(
        smtp_port,
        &tmp.path().join("mail"),
        Some("gw:SmTpPaSsWoRd!"),
    );
    let m = smtp.wait_messages(1, T);
    assert_eq!(m[0]["auth_login"], "gw", "AUTH used");
    assert!(d.finish(T).success());
    // notify-test failures print errors too.
    let out = Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .args(["notify-test", "--config"])
        .arg(&config)
        .envs(env)
        .output()
        .unwrap();
    let all = format!(
        "{}{}{}",
        std::fs::read_to_string(tmp.path().join("log")).unwrap(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("HTTP 404"), "{all}");
    for secret in ["XyZsEcReTtOkEn42", "TgSeCrEtToKeN", "SmTpPaSsWoRd"] {
        assert!(!all.contains(secret), "secret {secret} leaked:\n{all}");
    }
    // And the outbox holds no secrets either.
    for e in std::fs::read_dir(tmp.path().join("state/outbox"))
        .unwrap()
        .flatten()
    {
        if e.path().is_file() {
            let text = std::fs::read_to_string(e.path()).unwrap();
            assert!(!text.contains("XyZsEcReTtOkEn42") && !text.contains("TgSeCrEtToKeN"));
        }
    }
}

#[test]
fn notify_test_reports_a_dead_channel() {
    let tmp = tempfile::tempdir().unwrap();
    let hook = HttpReceiver::start();
    let smtp = SmtpServer::start(&tmp.path().join("mail"), None);
    let silent = SilentServer::start();
    let dead_port = free_port();
    let config = write_config(
        tmp.path(),
        "timeout = \"1s\"",
        &format!(
            "{}{}{}{}",
            webhook_channel("ops", &hook.url("/hook")),
            email_channel("mail", smtp.port),
            webhook_channel("dead", &format!("http://127.0.0.1:{dead_port}/x")),
            email_channel("mute", silent.port),
        ),
    );
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .args(["notify-test", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "bounded by the timeout"
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    assert!(lines[0].starts_with("ok    ops (webhook)"), "{stdout}");
    assert!(lines[1].starts_with("ok    mail (email)"), "{stdout}");
    assert!(
        lines[2].starts_with("FAIL  dead (webhook): cannot connect"),
        "{stdout}"
    );
    assert!(
        lines[3].starts_with("FAIL  mute (email): SMTP 127.0.0.1:") && lines[3].contains("1000 ms"),
        "{stdout}"
    );
    assert!(silent.connections() >= 1);
    let test_msg = hook.accepted()[0].json();
    assert_eq!(
        test_msg["alerts"][0]["labels"]["alertname"],
        "gpuwatch_test"
    );
    assert_eq!(smtp.messages().len(), 1);

    let out = Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .args(["notify-test", "--channel", "ops", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
}

#[test]
fn bad_config_names_file_line_column() {
    let tmp = tempfile::tempdir().unwrap();
    let config = write_config(
        tmp.path(),
        "",
        "[[channel]]\nname = \"x\"\ntype = \"email\"\nsmtp = \"h:25\"\nfrom = \"a@b.c\"\nto = [\"d@e.f\"]\nusername = \"u\"\npassword_env = \"GW_TEST_DEFINITELY_UNSET\"\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .args(["notify-test", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        err.contains("config.toml:12:8: channel \"x\": `password_env`: environment variable GW_TEST_DEFINITELY_UNSET is not set"),
        "{err}"
    );
}

#[test]
fn heartbeat_pings_and_sighup_reloads_channels() {
    let tmp = tempfile::tempdir().unwrap();
    let hb = HttpReceiver::start();
    let first = HttpReceiver::start();
    let second = HttpReceiver::start();
    let write = |url: &str| {
        write_config(
            tmp.path(),
            &format!(
                "heartbeat_url = \"{}\"\nheartbeat_interval = \"1s\"",
                hb.url("/ping")
            ),
            &format!(
                "{}{}",
                webhook_channel("ops", url),
                route(&["ops"], "group_by = [\"...\"]")
            ),
        )
    };
    let config = write(&first.url("/a"));
    let mut d = Daemon::events(&config, &tmp.path().join("log"), &[]);
    let pings = hb.wait_accepted(2, T);
    assert_eq!(pings[0].method, "GET");
    assert_eq!(pings[0].path, "/ping");
    d.send(&event("XidCritical", 0, "critical", "firing"));
    first.wait_accepted(1, T);
    // A broken edit keeps the running configuration.
    std::fs::write(&config, "[[channel]]\nname = 1\n").unwrap();
    d.signal(libc::SIGHUP);
    wait_until(T, "reload error", || {
        d.log_text()
            .contains("reload failed, keeping the old configuration")
            .then_some(())
    });
    d.send(&event("XidCritical", 1, "critical", "firing"));
    first.wait_accepted(2, T);
    // A good edit switches the channel.
    write(&second.url("/b"));
    d.signal(libc::SIGHUP);
    wait_until(T, "reload", || {
        d.log_text()
            .contains("configuration reloaded")
            .then_some(())
    });
    d.send(&event("XidCritical", 2, "critical", "firing"));
    let got = second.wait_accepted(1, T);
    assert_eq!(got[0].json()["alerts"][0]["labels"]["gpu"], "2");
    assert!(d.finish(T).success());
    assert_eq!(first.accepted().len(), 2);
}

#[test]
fn every_http_channel_type_posts_its_native_body() {
    let tmp = tempfile::tempdir().unwrap();
    let hook = HttpReceiver::start();
    let base = hook.url("");
    let config = write_config(
        tmp.path(),
        "",
        &format!(
            "[[channel]]\nname = \"wh\"\ntype = \"webhook\"\nurl = \"{base}/webhook\"\n\
             [[channel]]\nname = \"sl\"\ntype = \"slack\"\nurl = \"{base}/slack\"\n\
             [[channel]]\nname = \"dc\"\ntype = \"discord\"\nurl = \"{base}/discord\"\n\
             [[channel]]\nname = \"tm\"\ntype = \"teams\"\nurl = \"{base}/teams\"\n\
             [[channel]]\nname = \"tg\"\ntype = \"telegram\"\nurl = \"{base}\"\ntoken = \"42:abc\"\nchat_id = -100\n\
             [[channel]]\nname = \"fs\"\ntype = \"feishu\"\nurl = \"{base}/feishu\"\nsecret = \"fsecret\"\n\
             [[channel]]\nname = \"dt\"\ntype = \"dingtalk\"\nurl = \"{base}/dingtalk?access_token=t\"\nsecret = \"SECd\"\n\
             [[channel]]\nname = \"wc\"\ntype = \"wecom\"\nurl = \"{base}/wecom?key=k\"\n\
             [[channel]]\nname = \"am\"\ntype = \"alertmanager\"\nurl = \"{base}\"\n"
        ),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .args(["notify-test", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("ok    ")).count(),
        9,
        "{stdout}"
    );
    let reqs = hook.requests();
    let find = |prefix: &str| {
        reqs.iter()
            .find(|r| r.path.starts_with(prefix))
            .unwrap_or_else(|| panic!("no request to {prefix}"))
            .json()
    };
    assert_eq!(find("/webhook")["version"], "4");
    assert!(find("/slack")["text"]
        .as_str()
        .unwrap()
        .starts_with("*[TEST] gpuwatch_test"));
    assert_eq!(find("/discord")["username"], "gpuwatch");
    assert_eq!(
        find("/teams")["attachments"][0]["content"]["type"],
        "AdaptiveCard"
    );
    let tg = find("/bot42:abc/sendMessage");
    assert_eq!(
        (tg["chat_id"].as_i64(), tg["parse_mode"].as_str()),
        (Some(-100), Some("HTML"))
    );
    let fs = find("/feishu");
    assert_eq!(fs["msg_type"], "text");
    assert_eq!(fs["sign"].as_str().map(str::len), Some(44));
    let dt = reqs
        .iter()
        .find(|r| r.path.starts_with("/dingtalk"))
        .unwrap();
    assert!(
        dt.path.contains("access_token=t&timestamp=") && dt.path.contains("&sign="),
        "{}",
        dt.path
    );
    assert_eq!(dt.json()["msgtype"], "text");
    assert_eq!(find("/wecom")["msgtype"], "text");
    let am = find("/api/v2/alerts");
    assert_eq!(am[0]["labels"]["alertname"], "gpuwatch_test");
}

#[test]
fn end_of_events_input_delivers_waiting_groups_before_exiting() {
    let tmp = tempfile::tempdir().unwrap();
    let hook = HttpReceiver::start();
    let config = write_config(
        tmp.path(),
        "",
        &format!(
            "{}{}",
            webhook_channel("ops", &hook.url("/hook")),
            route(&["ops"], "group_wait = \"30s\"")
        ),
    );
    let mut d = Daemon::events(&config, &tmp.path().join("log"), &[]);
    d.send(&event("JobFinished", 0, "warning", "firing"));
    let start = Instant::now();
    assert!(d.finish(T).success());
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "did not wait for group_wait"
    );
    assert_eq!(hook.accepted().len(), 1);
    assert_eq!(outbox_files(tmp.path()), 0);
}

#[test]
fn check_validates_channels_and_routes() {
    let tmp = tempfile::tempdir().unwrap();
    let config = write_config(
        tmp.path(),
        "",
        "[[channel]]\nname = \"ops\"\ntype = \"webhook\"\nurl_env = \"GW_TEST_UNSET_HOOK\"\n[[route]]\nchannels = [\"opz\"]\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .args(["check", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("config.toml:12:8: channel \"ops\": `url_env`: environment variable GW_TEST_UNSET_HOOK is not set"), "{err}");
    assert!(
        err.contains("config.toml:16:13: route names unknown channel \"opz\""),
        "{err}"
    );
}

/// Issue 11: tokens inside channel URLs never leak, even when the receiver echoes the request
/// (path, query and body) in its error: not in `notify-test`'s output, the daemon log, or any
/// file gpuwatch writes (outbox, dead letters, state).
#[test]
fn echoed_url_tokens_never_reach_output_or_files() {
    let tmp = tempfile::tempdir().unwrap();
    let hook = HttpReceiver::start();
    hook.set_mode(Mode::Echo(404));
    let base = hook.url("");
    let base = base.trim_end_matches('/');
    let secrets = [
        "123456789:AAbbCCddEEffGGhh",
        "0f9e8d7c6b5a4d3c",
        "6f1c2a3b-9d8e-4f00-aa11-223344556677",
        "T01234567",
        "B7654321",
        "xyzXYZ0123456789",
    ];
    let config = write_config(
        tmp.path(),
        "give_up_after = \"2s\"\nfailing_after = 1",
        &format!(
            "[[channel]]\nname = \"tg\"\ntype = \"telegram\"\nurl = \"{base}\"\ntoken = \"{}\"\nchat_id = 42\n\n\
             [[channel]]\nname = \"dt\"\ntype = \"dingtalk\"\nurl = \"{base}/robot/send?access_token={}\"\n\n\
             [[channel]]\nname = \"fs\"\ntype = \"feishu\"\nurl = \"{base}/open-apis/bot/v2/hook/{}\"\n\n\
             [[channel]]\nname = \"wh\"\ntype = \"webhook\"\nurl = \"{base}/hooks/{}/{}/{}\"\n\n{}",
            secrets[0],
            secrets[1],
            secrets[2],
            secrets[3],
            secrets[4],
            secrets[5],
            route(&["tg", "dt", "fs", "wh"], "group_wait = \"0s\"")
        ),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .args(["notify-test", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(stdout.matches("FAIL").count(), 4, "{stdout}");
    assert!(stdout.contains("404"), "{stdout}");
    let mut d = Daemon::events(&config, &tmp.path().join("log"), &[]);
    d.send(&event("XidCritical", 3, "critical", "firing"));
    // Retries, give-up into dead letters, notifier_failing through the others.
    wait_until(T, "the echoes", || {
        (hook.requests().len() >= 8).then_some(())
    });
    std::thread::sleep(Duration::from_secs(3));
    assert!(d.finish(T).success());
    // Every request really carried the secrets, and the receiver echoed them.
    assert!(hook.requests().iter().any(|r| r.path.contains(secrets[1])));
    let mut seen = vec![
        ("notify-test output".to_string(), stdout),
        (
            "daemon log".to_string(),
            std::fs::read_to_string(tmp.path().join("log")).unwrap(),
        ),
    ];
    let mut stack = vec![tmp.path().join("state")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                seen.push((
                    p.display().to_string(),
                    String::from_utf8_lossy(&bytes).into_owned(),
                ));
            }
        }
    }
    assert!(
        seen.len() > 3,
        "nothing was written: {:?}",
        seen.iter().map(|s| &s.0).collect::<Vec<_>>()
    );
    for (what, text) in &seen {
        for s in secrets {
            assert!(!text.contains(s), "{s} leaked into {what}:\n{text}");
        }
    }
}

/// Issue 11: when the outbox cannot be written (disk full, read-only), a stop says the
/// undelivered messages are lost instead of claiming they stay in the outbox.
#[test]
fn a_stop_does_not_claim_an_unwritable_outbox_kept_anything() {
    let tmp = tempfile::tempdir().unwrap();
    let dead_port = free_port();
    let config = write_config(
        tmp.path(),
        "",
        &format!(
            "{}{}",
            webhook_channel("dead", &format!("http://127.0.0.1:{dead_port}/x")),
            route(&["dead"], "group_wait = \"0s\"")
        ),
    );
    let mut d = Daemon::events(&config, &tmp.path().join("log"), &[]);
    wait_until(T, "the outbox", || {
        tmp.path().join("state/outbox").is_dir().then_some(())
    });
    // The outbox becomes unwritable: its directory is now a file.
    let outbox = tmp.path().join("state/outbox");
    std::fs::remove_dir_all(&outbox).unwrap();
    std::fs::write(&outbox, "not a directory").unwrap();
    d.send(&event("XidCritical", 3, "critical", "firing"));
    wait_until(T, "the failed write", || {
        d.log_text()
            .contains("cannot write to the outbox")
            .then_some(())
    });
    d.signal(libc::SIGTERM);
    assert!(d.wait(T).success());
    let log = d.log_text();
    assert!(
        log.contains("could not be written to the outbox") && log.contains("are lost"),
        "{log}"
    );
    assert!(
        !log.contains("undelivered messages stay in the outbox"),
        "{log}"
    );
}

/// A job's notices that it could not deliver before it exited are handed to the daemon's outbox,
/// which a running daemon takes within seconds (it used to read its outbox only at start); a
/// notice quiet hours held is handed over too, due when the quiet hours end (it used to be
/// deleted with the job's directory).
#[test]
fn a_job_hands_undelivered_and_held_notices_to_the_daemon() {
    let tmp = tempfile::tempdir().unwrap();
    let hook = HttpReceiver::start();
    let dead = format!("http://127.0.0.1:{}/hook", free_port());
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules");
    let write = |name: &str, url: &str, extra: &str| {
        let p = tmp.path().join(name);
        std::fs::write(
            &p,
            format!(
                "[daemon]\ninterval = \"1s\"\nstate_dir = \"state\"\nrules = [{rules:?}]\nhostname = \"simhost\"\n\
                 [job]\nnotify_timeout = \"1s\"\n{extra}\n\
                 [[channel]]\nname = \"ops\"\ntype = \"webhook\"\nurl = \"{url}\"\n",
                rules = rules.display().to_string()
            ),
        )
        .unwrap();
        p
    };
    let daemon_cfg = write("daemon.toml", &hook.url("/hook"), "");
    let job_cfg = write("job.toml", &dead, "");
    let d = crate::daemon::daemon("healthy", &daemon_cfg, &tmp.path().join("log"), &[]);
    let run = |cfg: &Path| {
        crate::common::sim(
            "healthy",
            &[
                "run",
                "--quiet",
                "--no-report",
                "--config",
                cfg.to_str().unwrap(),
                "--",
                "true",
            ],
            &[],
        )
    };
    let r = run(&job_cfg);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains("queued in"), "{}", r.stderr);
    let got = wait_until(
        Duration::from_secs(30),
        "the daemon sends the job's notice",
        || {
            hook.accepted()
                .into_iter()
                .map(|r| r.json())
                .find(|b| b["alerts"][0]["labels"]["alertname"] == "job_finished")
        },
    );
    assert_eq!(got["status"], "firing", "{got}");
    // the receiver has it; the daemon removes it from the outbox once it has read the answer
    let outbox_json = || {
        std::fs::read_dir(tmp.path().join("state/outbox"))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
                    .count()
            })
            .unwrap_or(0)
    };
    wait_until(
        Duration::from_secs(10),
        "the delivered notice leaves the outbox",
        || (outbox_json() == 0).then_some(()),
    );
    drop(d);

    // Quiet hours around now (UTC): the info notice is held, then handed over for their end.
    let now_min = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 60)
        % 1440;
    let hhmm = |m: u64| format!("{:02}:{:02}", (m % 1440) / 60, m % 60);
    let quiet = format!(
        "[notify.quiet_hours]\nstart = \"{}\"\nend = \"{}\"\ntimezone = \"UTC\"\n",
        hhmm(now_min + 1440 - 60),
        hhmm(now_min + 60)
    );
    let quiet_cfg = write("quiet.toml", &hook.url("/hook"), &quiet);
    let before = hook.accepted().len();
    let r = run(&quiet_cfg);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(hook.accepted().len(), before, "held during quiet hours");
    let outbox = tmp.path().join("state/outbox");
    let held: Vec<Value> = std::fs::read_dir(&outbox)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .map(|e| serde_json::from_slice(&std::fs::read(e.path()).unwrap()).unwrap())
        .collect();
    assert_eq!(held.len(), 1, "{held:?}");
    let due = held[0]["next_attempt_ms"].as_i64().unwrap();
    let now_ms = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    assert!(
        due > now_ms + 30 * 60_000,
        "due at the end of quiet hours: {due} vs {now_ms}"
    );
}
