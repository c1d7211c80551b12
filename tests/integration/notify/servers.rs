//! Real servers on loopback for the notification tests (no protocol mocks): an HTTP receiver that
//! records every request and can answer 500 or hang, a silent TCP listener (an SMTP server that
//! never greets), the aiosmtpd-based SMTP server in `tests/fixtures/notify/smtp_server.py`, and a
//! handle on a `gpuwatch daemon` subprocess.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A free loopback port (bound then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `f` every 50 ms until it returns `Some`, or panics after `timeout` with `what`.
pub fn wait_until<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How the HTTP receiver answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// 200 with every API's success marker: `{"ok":true,"code":0,"errcode":0,"status":1,
    /// "Code":"OK"}`.
    Ok,
    /// This status with a short body.
    Status(u16),
    /// Read the request, never answer (until the receiver is dropped).
    Hang,
    /// This status with a body that echoes the method, path, query and body, as many real
    /// endpoints do (`Cannot POST /robot/send?access_token=…`).
    Echo(u16),
}

/// One recorded request.
#[derive(Debug, Clone)]
pub struct Request {
    /// `POST`, `GET`, …
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// Body text.
    pub body: String,
    /// The mode it was answered with.
    pub answered: Mode,
    /// When it arrived.
    #[allow(dead_code)]
    pub at: Instant,
}

impl Request {
    /// Header value by (lower-case) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// A real HTTP/1.1 server on 127.0.0.1 recording requests.
pub struct HttpReceiver {
    /// Its port.
    pub port: u16,
    mode: Arc<Mutex<Mode>>,
    requests: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
}

impl HttpReceiver {
    /// Starts on a free port.
    pub fn start() -> HttpReceiver {
        Self::start_on(0)
    }

    /// Starts on `port` (0: any).
    pub fn start_on(port: u16) -> HttpReceiver {
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let mode = Arc::new(Mutex::new(Mode::Ok));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (m, r, s) = (mode.clone(), requests.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (m, r, s) = (m.clone(), r.clone(), s.clone());
                std::thread::spawn(move || serve(conn, &m, &r, &s));
            }
        });
        HttpReceiver {
            port,
            mode,
            requests,
            stop,
        }
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Changes how later requests are answered.
    pub fn set_mode(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }

    /// Requests answered 2xx so far.
    pub fn accepted(&self) -> Vec<Request> {
        self.requests()
            .into_iter()
            .filter(|r| r.answered == Mode::Ok)
            .collect()
    }

    /// Waits until at least `n` requests were accepted; returns them.
    pub fn wait_accepted(&self, n: usize, timeout: Duration) -> Vec<Request> {
        wait_until(timeout, &format!("{n} accepted HTTP requests"), || {
            let got = self.accepted();
            (got.len() >= n).then_some(got)
        })
    }
}

impl Drop for HttpReceiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve(
    mut conn: TcpStream,
    mode: &Mutex<Mode>,
    requests: &Mutex<Vec<Request>>,
    stop: &AtomicBool,
) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(clone) = conn.try_clone() else { return };
    let mut reader = BufReader::new(clone);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let path = parts.next().unwrap_or("").to_string();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let len: usize = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let answered = *mode.lock().unwrap();
        let echo = format!("Cannot {method} {path}: {}", String::from_utf8_lossy(&body));
        requests.lock().unwrap().push(Request {
            method,
            path,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
            answered,
            at: Instant::now(),
        });
        let (status, text) = match answered {
            Mode::Ok => (
                200,
                r#"{"ok":true,"code":0,"errcode":0,"status":1,"Code":"OK"}"#.to_string(),
            ),
            Mode::Status(s) => (s, format!("injected failure {s}")),
            Mode::Echo(s) => (s, echo),
            Mode::Hang => {
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                return;
            }
        };
        let resp = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: keep-alive\r\n\r\n{text}",
            text.len()
        );
        if conn.write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

/// A TCP listener that accepts connections and never says anything (an SMTP server that never
/// greets, an HTTP server that never answers).
pub struct SilentServer {
    /// Its port.
    pub port: u16,
    _listener: TcpListener,
    held: Arc<Mutex<Vec<TcpStream>>>,
}

impl SilentServer {
    /// Starts on a free port.
    pub fn start() -> SilentServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let held = Arc::new(Mutex::new(Vec::new()));
        let l = listener.try_clone().unwrap();
        let h = held.clone();
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                h.lock().unwrap().push(c);
            }
        });
        SilentServer {
            port,
            _listener: listener,
            held,
        }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.held.lock().unwrap().len()
    }
}

/// How an [`SmtpServer`] speaks TLS, with the certificate and key it presents (PEM files).
#[derive(Debug, Clone, Copy)]
pub struct SmtpTls<'a> {
    /// Implicit TLS (`true`, the handshake first) or STARTTLS offered (`false`; not required,
    /// so a client that falls back to plain text is seen doing it).
    pub implicit: bool,
    /// The server certificate (PEM).
    pub cert: &'a Path,
    /// Its private key (PEM).
    pub key: &'a Path,
}

/// The aiosmtpd server from `tests/fixtures/notify/smtp_server.py`.
pub struct SmtpServer {
    /// Its port.
    pub port: u16,
    /// Where messages land.
    pub maildir: PathBuf,
    child: Child,
    _stdin: ChildStdin,
}

impl SmtpServer {
    /// Starts on a free port, writing to `maildir`; `auth` = `Some("user:password")` requires AUTH.
    pub fn start(maildir: &Path, auth: Option<&str>) -> SmtpServer {
        Self::start_on(free_port(), maildir, auth)
    }

    /// Starts on `port`.
    pub fn start_on(port: u16, maildir: &Path, auth: Option<&str>) -> SmtpServer {
        Self::start_with(port, maildir, auth, None)
    }

    /// Starts on a free port, speaking TLS as `tls` says.
    pub fn start_tls(maildir: &Path, auth: Option<&str>, tls: SmtpTls<'_>) -> SmtpServer {
        Self::start_with(free_port(), maildir, auth, Some(tls))
    }

    /// Starts on `port`, with TLS when `tls` is given.
    pub fn start_with(
        port: u16,
        maildir: &Path,
        auth: Option<&str>,
        tls: Option<SmtpTls<'_>>,
    ) -> SmtpServer {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/notify/smtp_server.py");
        // CI installs aiosmtpd into the .ci/run virtualenv ($GPUWATCH_PEERS).
        let python = std::env::var_os("GPUWATCH_PEERS").map_or_else(
            || PathBuf::from("python3"),
            |venv| PathBuf::from(venv).join("bin/python"),
        );
        let mut cmd = Command::new(python);
        cmd.arg(script).arg(port.to_string()).arg(maildir);
        if let Some(a) = auth {
            cmd.arg(a);
        }
        if let Some(t) = tls {
            cmd.arg("--tls")
                .arg(if t.implicit { "tls" } else { "starttls" })
                .arg("--cert")
                .arg(t.cert)
                .arg("--key")
                .arg(t.key);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 with aiosmtpd (pip install aiosmtpd)");
        let stdin = child.stdin.take().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(
            line.trim(),
            "ready",
            "smtp_server.py did not start (is aiosmtpd installed?)"
        );
        SmtpServer {
            port,
            maildir: maildir.to_path_buf(),
            child,
            _stdin: stdin,
        }
    }

    /// Answer DATA with 451 while `on`.
    pub fn refuse(&self, on: bool) {
        let flag = self.maildir.join("refuse");
        if on {
            std::fs::write(flag, b"").unwrap();
        } else {
            let _ = std::fs::remove_file(flag);
        }
    }

    /// Every message received so far (sorted by file name).
    pub fn messages(&self) -> Vec<serde_json::Value> {
        read_maildir(&self.maildir)
    }

    /// Every connection (`{"event": "connect"}`, noted before any TLS handshake) and command
    /// (`{"command": "MAIL", "tls": true, "peer": PORT}`, the verb only) seen so far, in order.
    pub fn commands(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.maildir.join("commands.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.commands()
            .iter()
            .filter(|c| c["event"] == "connect")
            .count()
    }

    /// The verbs of the commands that arrived in plain text (not over TLS), in order.
    pub fn plain_text_commands(&self) -> Vec<String> {
        self.commands()
            .iter()
            .filter(|c| c["tls"] == false)
            .filter_map(|c| c["command"].as_str().map(str::to_string))
            .collect()
    }

    /// Waits until at least `n` messages arrived.
    pub fn wait_messages(&self, n: usize, timeout: Duration) -> Vec<serde_json::Value> {
        wait_until(timeout, &format!("{n} emails"), || {
            let m = self.messages();
            (m.len() >= n).then_some(m)
        })
    }
}

/// Messages in a maildir written by smtp_server.py.
pub fn read_maildir(dir: &Path) -> Vec<serde_json::Value> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "json"));
    files.sort();
    files
        .iter()
        .map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap())
        .collect()
}

impl Drop for SmtpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Decodes a quoted-printable / base64-free email body well enough to search it: joins soft
/// line breaks and decodes `=XX` escapes.
pub fn unfold_email(data: &str) -> String {
    let joined = data.replace("=\r\n", "").replace("=\n", "");
    let bytes = joined.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'=' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&joined[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A `gpuwatch daemon` subprocess.
pub struct Daemon {
    child: Child,
    stdin: Option<ChildStdin>,
    /// Where its stderr goes.
    pub log: PathBuf,
}

impl Daemon {
    /// Starts `gpuwatch daemon --config CONFIG --events -` (stderr to `log`) with `env`.
    pub fn events(config: &Path, log: &Path, env: &[(&str, &str)]) -> Daemon {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpuwatch"));
        cmd.arg("daemon")
            .arg("--config")
            .arg(config)
            .arg("--events")
            .arg("-");
        Self::spawn(cmd, log, env, true)
    }

    /// Starts any gpuwatch command line (stderr to `log`).
    pub fn spawn(mut cmd: Command, log: &Path, env: &[(&str, &str)], pipe_stdin: bool) -> Daemon {
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.env("GPUWATCH_LOG", "debug");
        let mut child = cmd
            .stdin(if pipe_stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        Daemon {
            child,
            stdin,
            log: log.to_path_buf(),
        }
    }

    /// Sends one JSON line.
    pub fn send(&mut self, line: &serde_json::Value) {
        let stdin = self.stdin.as_mut().expect("events mode");
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// The process id.
    #[allow(dead_code)]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal.
    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our own child.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }

    /// `kill -9`, then reap.
    pub fn kill9(mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
        self.stdin = None;
    }

    /// Closes stdin (end of events) and waits for the exit status (panics after `timeout`).
    pub fn finish(mut self, timeout: Duration) -> std::process::ExitStatus {
        self.stdin = None;
        self.wait(timeout)
    }

    /// Waits for exit.
    pub fn wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        wait_until(timeout, "daemon exit", || self.child.try_wait().unwrap())
    }

    /// Everything logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
