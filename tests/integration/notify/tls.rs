//! Email over STARTTLS and implicit TLS (issue 11), against the real aiosmtpd server speaking TLS
//! on loopback with certificates made here by the `openssl` command-line tool: a test CA, a
//! server certificate for 127.0.0.1 / localhost signed by it, one for another host name and an
//! expired one. With the CA in the channel's `ca_file` mail goes out encrypted; a certificate
//! for the wrong name, an expired one or an untrusted CA is refused with the reason, retried by
//! the outbox, and nothing but `EHLO` / `STARTTLS` is ever sent in plain text.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::servers::{unfold_email, wait_until, Daemon, SmtpServer, SmtpTls};
use super::{event, route, write_config, T};

const AUTH: &str = "gw:TlsPaSsWoRd42";

/// `openssl` settings for the test CA: `req` for the CA itself and the requests, `ca` for
/// signing with explicit validity dates (`openssl x509 -req` on OpenSSL 3.0 cannot set them).
const OPENSSL_CNF: &str = "\
[req]
distinguished_name = req_dn
[req_dn]
[ca_cert]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[ca]
default_ca = test_ca
[test_ca]
certificate = ca.pem
private_key = ca.key
database = index.txt
new_certs_dir = issued
serial = serial
default_md = sha256
policy = any_name
unique_subject = no
copy_extensions = none
[any_name]
commonName = supplied
[localhost]
subjectAltName = IP:127.0.0.1, DNS:localhost
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
authorityKeyIdentifier = keyid
[wrong_host]
subjectAltName = DNS:wrong.example.org
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
authorityKeyIdentifier = keyid
";

/// Runs `openssl ARGS` in `dir`; panics with its output when it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl command-line tool");
    assert!(
        out.status.success(),
        "openssl {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The test PKI in `dir`: `ca.pem`, and for each server certificate NAME `NAME.pem` + `NAME.key`.
pub(crate) struct Pki {
    dir: PathBuf,
}

impl Pki {
    /// Makes a CA and three server certificates signed by it (P-256 keys: quick on slow CI):
    /// `good` (127.0.0.1 and localhost, valid now), `wrong` (only wrong.example.org) and
    /// `expired` (127.0.0.1, valid only on 1-2 January 2020).
    pub(crate) fn make(dir: &Path) -> Pki {
        std::fs::create_dir_all(dir.join("issued")).unwrap();
        std::fs::write(dir.join("openssl.cnf"), OPENSSL_CNF).unwrap();
        std::fs::write(dir.join("index.txt"), "").unwrap();
        std::fs::write(dir.join("serial"), "1000\n").unwrap();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
        let mut ca = vec!["req", "-config", "openssl.cnf", "-x509", "-nodes"];
        ca.extend(ec);
        ca.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "30",
            "-subj",
            "/CN=gpuwatch test CA",
            "-extensions",
            "ca_cert",
        ]);
        openssl(dir, &ca);
        let dates_now = ["-days", "30"];
        let dates_2020 = [
            "-startdate",
            "20200101000000Z",
            "-enddate",
            "20200102000000Z",
        ];
        for (name, extensions, dates) in [
            ("good", "localhost", &dates_now[..]),
            ("wrong", "wrong_host", &dates_now[..]),
            ("expired", "localhost", &dates_2020[..]),
        ] {
            let (key, csr, pem) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.pem"),
            );
            let subject = format!("/CN={name}");
            let mut req = vec!["req", "-config", "openssl.cnf", "-new", "-nodes"];
            req.extend(ec);
            req.extend(["-keyout", &key, "-out", &csr, "-subj", &subject]);
            openssl(dir, &req);
            let mut sign = vec![
                "ca",
                "-batch",
                "-config",
                "openssl.cnf",
                "-notext",
                "-in",
                &csr,
                "-out",
                &pem,
                "-extensions",
                extensions,
            ];
            sign.extend(dates);
            openssl(dir, &sign);
        }
        Pki {
            dir: dir.to_path_buf(),
        }
    }

    pub(crate) fn cert(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.pem"))
    }

    pub(crate) fn key(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.key"))
    }

    /// An aiosmtpd server (AUTH required) presenting certificate `name`.
    fn server(&self, maildir: &Path, name: &str, implicit: bool) -> SmtpServer {
        SmtpServer::start_tls(
            maildir,
            Some(AUTH),
            SmtpTls {
                implicit,
                cert: &self.cert(name),
                key: &self.key(name),
            },
        )
    }
}

/// An email channel to `127.0.0.1:port` with `tls` (`"starttls"` / `"tls"`), AUTH, and
/// `ca_file` when given (relative to the config's directory).
fn tls_channel(name: &str, port: u16, tls: &str, ca_file: Option<&str>) -> String {
    let (user, password) = AUTH.split_once(':').unwrap();
    let ca = ca_file.map_or(String::new(), |f| format!("ca_file = \"{f}\"\n"));
    format!(
        "[[channel]]\nname = \"{name}\"\ntype = \"email\"\nsmtp = \"127.0.0.1:{port}\"\ntls = \"{tls}\"\nfrom = \"gpuwatch@example.org\"\nto = [\"oncall@example.org\"]\nusername = \"{user}\"\npassword = \"{password}\"\n{ca}"
    )
}

/// `gpuwatch notify-test --config CONFIG`: exit code and stdout lines.
fn notify_test(config: &Path) -> (Option<i32>, Vec<String>) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .args(["notify-test", "--config"])
        .arg(config)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Shown with a failing test's output.
    eprintln!(
        "notify-test stderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        out.status.code(),
        stdout.lines().map(str::to_string).collect(),
    )
}

/// The outbox entries (`state/outbox/*.json`) in `dir`.
fn outbox_entries(dir: &Path) -> Vec<Value> {
    let Ok(rd) = std::fs::read_dir(dir.join("state/outbox")) else {
        return Vec::new();
    };
    rd.flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter_map(|p| serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok())
        .collect()
}

/// Asserts that `server` got nothing but `EHLO` and `STARTTLS` in plain text (STARTTLS) or no
/// command at all before the handshake (implicit TLS), and no message.
fn assert_nothing_in_plain_text(server: &SmtpServer, implicit: bool, what: &str) {
    let plain = server.plain_text_commands();
    if implicit {
        assert!(plain.is_empty(), "{what}: plain-text commands {plain:?}");
    } else {
        assert!(
            plain.iter().all(|c| c == "EHLO" || c == "STARTTLS"),
            "{what}: plain-text commands {plain:?}"
        );
    }
    assert!(
        server.messages().iter().all(|m| m["tls"] == true),
        "{what}: a message arrived in plain text"
    );
}

/// Issue 11 (a, b): with the test CA in `ca_file`, STARTTLS and implicit TLS deliver, AUTH and
/// the message travel encrypted, and only EHLO/STARTTLS precede the handshake.
#[test]
fn starttls_and_implicit_tls_deliver_with_ca_file() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::make(&tmp.path().join("pki"));
    let starttls = pki.server(&tmp.path().join("mail-starttls"), "good", false);
    let implicit = pki.server(&tmp.path().join("mail-tls"), "good", true);
    let config = write_config(
        tmp.path(),
        "timeout = \"10s\"",
        &format!(
            "{}{}",
            tls_channel("starttls", starttls.port, "starttls", Some("pki/ca.pem")),
            tls_channel("implicit", implicit.port, "tls", Some("pki/ca.pem")),
        ),
    );
    let (code, lines) = notify_test(&config);
    assert_eq!(code, Some(0), "{lines:?}");
    assert!(lines[0].starts_with("ok    starttls (email)"), "{lines:?}");
    assert!(lines[1].starts_with("ok    implicit (email)"), "{lines:?}");

    for (server, is_implicit, what) in [(&starttls, false, "starttls"), (&implicit, true, "tls")] {
        let mails = server.wait_messages(1, T);
        assert_eq!(mails.len(), 1, "{what}");
        assert_eq!(mails[0]["tls"], true, "{what}: {}", mails[0]);
        assert_eq!(mails[0]["auth_login"], "gw", "{what}");
        assert_eq!(mails[0]["rcpt_tos"][0], "oncall@example.org", "{what}");
        let data = unfold_email(mails[0]["data"].as_str().unwrap());
        assert!(
            data.contains("Subject: [TEST] gpuwatch_test"),
            "{what}: {data}"
        );
        assert_nothing_in_plain_text(server, is_implicit, what);
        // The credentials and the message: each once, and over TLS.
        let commands = server.commands();
        let sensitive: Vec<(&str, bool)> = commands
            .iter()
            .filter_map(|c| Some((c["command"].as_str()?, c["tls"] == true)))
            .filter(|(verb, _)| matches!(*verb, "AUTH" | "MAIL" | "RCPT" | "DATA"))
            .collect();
        assert_eq!(
            sensitive,
            [
                ("AUTH", true),
                ("MAIL", true),
                ("RCPT", true),
                ("DATA", true)
            ],
            "{what}"
        );
    }
    assert_eq!(
        starttls.plain_text_commands(),
        ["EHLO", "STARTTLS"],
        "STARTTLS comes first"
    );
}

/// What [`refused`] leaves running for more checks.
struct Refusal {
    /// The config, PKI, maildirs and state directory.
    tmp: tempfile::TempDir,
    /// Each server, whether it speaks implicit TLS, and its channel's name.
    servers: Vec<(SmtpServer, bool, &'static str)>,
    /// The daemon, still retrying.
    daemon: Daemon,
}

/// A refused server certificate (issue 11 c, d, e), for STARTTLS and implicit TLS at once: the
/// servers present certificate `cert` and the channels trust `ca_file` (besides the built-in
/// roots). `notify-test` names the problem (every string of `expected`); the daemon keeps the
/// message in the outbox with that reason and retries it (each server sees the client come
/// back); nothing goes out in plain text.
fn refused(cert: &str, ca_file: Option<&str>, expected: &[&str]) -> Refusal {
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::make(&tmp.path().join("pki"));
    let servers = vec![
        (
            pki.server(&tmp.path().join("mail-starttls"), cert, false),
            false,
            "starttls",
        ),
        (
            pki.server(&tmp.path().join("mail-tls"), cert, true),
            true,
            "implicit",
        ),
    ];
    let config = write_config(
        tmp.path(),
        "timeout = \"10s\"\nfailing_after = 1000",
        &format!(
            "{}{}{}",
            tls_channel("starttls", servers[0].0.port, "starttls", ca_file),
            tls_channel("implicit", servers[1].0.port, "tls", ca_file),
            route(&["starttls", "implicit"], ""),
        ),
    );

    let (code, lines) = notify_test(&config);
    assert_eq!(code, Some(1), "{lines:?}");
    for ((server, _, name), line) in servers.iter().zip(&lines) {
        let head = format!(
            "FAIL  {name} (email): SMTP 127.0.0.1:{}: TLS: server certificate refused: ",
            server.port
        );
        assert!(line.starts_with(&head), "{line}");
        for e in expected {
            assert!(line.contains(e), "{e:?} not in {line}");
        }
    }
    let tried: Vec<usize> = servers.iter().map(|s| s.0.connections()).collect();
    assert!(
        tried.iter().all(|&n| n >= 1),
        "notify-test connected: {tried:?}"
    );

    let mut daemon = Daemon::events(&config, &tmp.path().join("log"), &[]);
    daemon.send(&event("XidCritical", 3, "critical", "firing"));
    // Each channel's message stays in the outbox with the reason, and is tried again.
    wait_until(
        T,
        "two failed attempts per channel, with the reason",
        || {
            let entries = outbox_entries(tmp.path());
            servers
                .iter()
                .all(|(_, _, name)| {
                    entries.iter().any(|e| {
                        let error = e["last_error"].as_str().unwrap_or_default();
                        e["notification"]["channel"] == *name
                            && e["attempts"].as_u64().unwrap_or(0) >= 2
                            && error.contains("TLS: server certificate refused")
                            && expected.iter().all(|x| error.contains(x))
                    })
                })
                .then_some(())
        },
    );
    wait_until(T, "the servers seeing the retries", || {
        servers
            .iter()
            .zip(&tried)
            .all(|((s, _, _), &before)| s.connections() >= before + 2)
            .then_some(())
    });
    let log = daemon.log_text();
    assert!(log.contains("send failed, will retry"), "{log}");
    assert!(!log.contains("giving up"), "{log}");
    assert!(
        !log.contains("TlsPaSsWoRd42"),
        "the password reached the log"
    );
    for (server, implicit, name) in &servers {
        assert!(
            server.messages().is_empty(),
            "{name}: a message got through"
        );
        assert_nothing_in_plain_text(server, *implicit, name);
    }
    Refusal {
        tmp,
        servers,
        daemon,
    }
}

/// Issue 11 (c): a certificate for another host name is refused, naming both names; once the
/// server presents a valid certificate the queued messages go out, encrypted.
#[test]
fn wrong_host_name_is_refused_retried_and_never_sent_in_plain_text() {
    let Refusal {
        tmp,
        servers,
        daemon,
    } = refused(
        "wrong",
        Some("pki/ca.pem"),
        &[
            "certificate not valid for name \"127.0.0.1\"",
            "wrong.example.org",
        ],
    );
    // The same ports, now with the right certificate: the outbox's retries deliver.
    let pki = Pki {
        dir: tmp.path().join("pki"),
    };
    let mut fixed = Vec::new();
    for (old, implicit, name) in servers {
        let (port, maildir) = (old.port, old.maildir.clone());
        drop(old);
        let tls = SmtpTls {
            implicit,
            cert: &pki.cert("good"),
            key: &pki.key("good"),
        };
        fixed.push((
            SmtpServer::start_with(port, &maildir, Some(AUTH), Some(tls)),
            implicit,
            name,
        ));
    }
    for (server, implicit, name) in &fixed {
        let mails = server.wait_messages(1, T);
        assert_eq!(mails[0]["tls"], true, "{name}");
        let data = unfold_email(mails[0]["data"].as_str().unwrap());
        assert!(
            data.contains("Subject: [CRITICAL] XidCritical"),
            "{name}: {data}"
        );
        assert_nothing_in_plain_text(server, *implicit, name);
    }
    wait_until(T, "an empty outbox", || {
        outbox_entries(tmp.path()).is_empty().then_some(())
    });
    assert!(daemon.finish(T).success());
}

/// Issue 11 (d): an expired certificate (from a trusted CA, for the right name) is refused with
/// its end date.
#[test]
fn expired_certificate_is_refused_retried_and_never_sent_in_plain_text() {
    let r = refused(
        "expired",
        Some("pki/ca.pem"),
        &["certificate expired: not valid after 2020-01-02T00:00:00Z"],
    );
    assert!(!outbox_entries(r.tmp.path()).is_empty());
}

/// Issue 11 (e): without `ca_file` the test CA is not trusted (only the built-in roots are).
#[test]
fn untrusted_ca_without_ca_file_is_refused_retried_and_never_sent_in_plain_text() {
    let r = refused(
        "good",
        None,
        &["certificate issuer not trusted (UnknownIssuer"],
    );
    assert!(!outbox_entries(r.tmp.path()).is_empty());
}
