//! The daemon's control socket, `state_dir/control.sock` (mode 0600: the daemon's user only):
//! one JSON request line, one JSON answer line. The requests go to the daemon's loop (which owns
//! the engine and the silences) as [`super::Control::Ask`] and are answered there:
//!
//! * `{"ask":"alerts"}` → pending and firing alerts;
//! * `{"ask":"silence_add","matchers":["gpu=3"],"for_ms":7200000,"comment":"…","created_by":"…","until_pid":null}`;
//! * `{"ask":"silence_list"}`, `{"ask":"silence_expire","id":"…"}`;
//! * `{"ask":"reload"}` (as SIGHUP).
//!
//! The loop answers with an [`Answer`]: the bytes to write ([`reply`]), serialized once, straight
//! from the data it lists, never built as a JSON value tree first — or, for `silence_list`, a
//! snapshot of the silences (O(1)) that the client's own thread serializes into the socket as it
//! is read: 20,000 silences with long comments are 24 MB of JSON and a second of a debug build's
//! time, which must be neither the loop's time (it evaluates the rules) nor 24 MB per client.
//!
//! At most [`MAX_CLIENTS`] requests are served at once (more are answered "busy" at once), each
//! must arrive whole within [`REQUEST_DEADLINE`] and is at most 64 KiB, and its answer must be
//! read within [`ANSWER_DEADLINE`] in all: clients that connect and trickle bytes, or read a big
//! answer a little at a time, cannot pile up threads or memory nor keep a client's place.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use super::Control;

/// The socket's path in `state_dir`.
pub fn socket_path(state_dir: &Path) -> std::path::PathBuf {
    state_dir.join("control.sock")
}

/// Binds the socket (replacing a stale one), restricts it to the owner (and to group `group`
/// when given: `[daemon] control_group`), and serves it on its own thread.
pub fn start(
    state_dir: &Path,
    group: Option<u32>,
    tx: mpsc::Sender<Control>,
) -> std::io::Result<()> {
    crate::sys::create_private_dir(state_dir)?;
    let path = socket_path(state_dir);
    if std::os::unix::net::UnixStream::connect(&path).is_ok() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("another daemon answers on {}", path.display()),
        ));
    }
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    match group {
        None => std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?,
        Some(gid) => {
            // The group may pass through the state directory (not list or read it: its files
            // are 0600 and its directories 0700) and use the socket.
            std::os::unix::fs::chown(state_dir, None, Some(gid))?;
            std::fs::set_permissions(state_dir, std::fs::Permissions::from_mode(0o710))?;
            std::os::unix::fs::chown(&path, None, Some(gid))?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660))?;
        }
    }
    std::thread::Builder::new()
        .name("gpuwatch-control".into())
        .spawn(move || {
            let busy = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            for stream in listener.incoming() {
                let Ok(stream) = stream else {
                    // EMFILE and friends: do not spin.
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                };
                // One thread per client, at most MAX_CLIENTS of them, each for at most
                // REQUEST_DEADLINE: clients that trickle bytes cannot pile up threads.
                let n = busy.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                if n >= MAX_CLIENTS {
                    busy.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                    refuse_busy(stream);
                    continue;
                }
                let tx = tx.clone();
                let slot = Slot(busy.clone());
                let spawned = std::thread::Builder::new()
                    .name("gpuwatch-ctl-client".into())
                    .spawn(move || {
                        let _slot = slot;
                        serve(stream, &tx);
                    });
                if spawned.is_err() {
                    // The closure (and its slot) was dropped: the count is back.
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        })?;
    Ok(())
}

/// Requests served at once; more are answered "busy" at once.
pub const MAX_CLIENTS: usize = 16;
/// A request must arrive whole within this (a client that trickles bytes is cut off).
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(10);
/// An answer must be read whole within this, counted from the first byte written (a client that
/// reads a big answer a byte now and then is cut off: it held its place for as long as it kept
/// reading).
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(10);

/// The loop's answer to a request.
pub enum Answer {
    /// The bytes to write (one JSON document, without the newline): [`reply`].
    Bytes(Vec<u8>),
    /// `silence_list`: `{"ok":true,"now_ms":…,"silences":[…]}`, serialized by the client's
    /// thread straight into the socket from this snapshot of the silences.
    Silences {
        now_ms: i64,
        list: std::sync::Arc<Vec<crate::silence::Silence>>,
    },
}

impl From<Vec<u8>> for Answer {
    fn from(bytes: Vec<u8>) -> Answer {
        Answer::Bytes(bytes)
    }
}

/// The `silence_list` answer, borrowing the silences.
#[derive(serde::Serialize)]
struct List<'a> {
    ok: bool,
    now_ms: i64,
    silences: &'a [crate::silence::Silence],
}

impl Answer {
    /// Writes the answer and its newline to `out`.
    fn write_to(&self, out: impl std::io::Write) -> std::io::Result<()> {
        // 64 KiB at a time, not a write per JSON token.
        let mut out = std::io::BufWriter::with_capacity(64 * 1024, out);
        match self {
            Answer::Bytes(bytes) => out.write_all(bytes)?,
            Answer::Silences { now_ms, list } => serde_json::to_writer(
                &mut out,
                &List {
                    ok: true,
                    now_ms: *now_ms,
                    silences: list,
                },
            )
            .map_err(std::io::Error::other)?,
        }
        out.write_all(b"\n")?;
        out.flush()
    }
}

/// A socket written to until a deadline: each write waits at most for what is left of it.
struct Deadlined<'a> {
    stream: &'a std::os::unix::net::UnixStream,
    deadline: std::time::Instant,
}

impl std::io::Write for Deadlined<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let left = self
            .deadline
            .saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.stream.set_write_timeout(Some(left))?;
        (&mut &*self.stream).write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A client's place among the [`MAX_CLIENTS`], given back when its thread ends.
struct Slot(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// An answer as the bytes written to the client: `answer` serialized as one JSON document (the
/// newline is the server's). Serializing a plain value cannot fail; should a type's
/// serialization fail, the answer says so.
pub fn reply(answer: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(answer).unwrap_or_else(|e| {
        serde_json::to_vec(
            &serde_json::json!({"ok": false, "error": format!("cannot serialize the answer: {e}")}),
        )
        .unwrap_or_default()
    })
}

/// Answers a client over the limit without reading its request (a short write timeout: a
/// client that does not read cannot hold the accepting thread).
fn refuse_busy(mut stream: std::os::unix::net::UnixStream) {
    let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
    let _ = writeln!(
        stream,
        "{}",
        serde_json::json!({"ok": false, "error": format!("busy: {MAX_CLIENTS} requests in progress; try again")})
    );
}

/// Reads one request line (at most 64 KiB) within [`REQUEST_DEADLINE`] in all; `None` when the
/// client sent nothing whole in time or went away.
fn read_request(stream: &mut std::os::unix::net::UnixStream) -> Option<Vec<u8>> {
    let deadline = std::time::Instant::now() + REQUEST_DEADLINE;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return None;
        }
        stream.set_read_timeout(Some(left)).ok()?;
        match stream.read(&mut chunk) {
            Ok(0) => return (!buf.is_empty()).then_some(buf),
            Ok(n) => {
                let chunk = chunk.get(..n)?;
                if let Some(end) = chunk.iter().position(|b| *b == b'\n') {
                    buf.extend_from_slice(chunk.get(..end)?);
                    return Some(buf);
                }
                buf.extend_from_slice(chunk);
                if buf.len() > 64 * 1024 {
                    return Some(buf);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

/// The uid of the process at the other end of `stream`, as the kernel says (`SO_PEERCRED`).
fn peer_uid(stream: &std::os::unix::net::UnixStream) -> Option<u32> {
    use std::os::fd::AsRawFd as _;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::ucred>()).ok()?;
    // SAFETY: getsockopt(2) on our own socket's fd, with a buffer of the size it is told.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::addr_of_mut!(cred).cast::<libc::c_void>(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred.uid)
}

fn serve(mut stream: std::os::unix::net::UnixStream, tx: &mpsc::Sender<Control>) {
    let peer = peer_uid(&stream);
    let Some(bytes) = read_request(&mut stream) else {
        return;
    };
    // Invalid UTF-8 is answered, not dropped without a word.
    let answer: Answer = match std::str::from_utf8(&bytes)
        .map_err(|e| format!("the request is not UTF-8 ({e})"))
        .and_then(|line| {
            serde_json::from_str::<serde_json::Value>(line)
                .map_err(|e| format!("not a JSON request: {e}"))
        }) {
        Ok(mut ask) => {
            // Who asks is what the kernel says, not what the request says (a member of the
            // control group cannot sign a silence with someone else's name).
            if let (Some(obj), Some(uid)) = (ask.as_object_mut(), peer) {
                let who = crate::sys::user_name(uid).unwrap_or_else(|| format!("uid {uid}"));
                obj.insert("created_by".into(), serde_json::Value::String(who));
            }
            let (reply_tx, reply_rx) = mpsc::channel();
            if tx.send(Control::Ask(ask, reply_tx)).is_err() {
                reply(&serde_json::json!({"ok": false, "error": "the daemon is stopping"})).into()
            } else {
                reply_rx
                    .recv_timeout(Duration::from_secs(10))
                    .unwrap_or_else(|_| {
                        reply(&serde_json::json!({"ok": false, "error": "the daemon did not answer in 10 s"})).into()
                    })
            }
        }
        Err(e) => reply(&serde_json::json!({"ok": false, "error": e})).into(),
    };
    let _ = answer.write_to(Deadlined {
        stream: &stream,
        deadline: std::time::Instant::now() + ANSWER_DEADLINE,
    });
}

/// Sends `ask`, returns the answer; `Err(line)` is the one line to print.
pub fn ask(path: &Path, ask: &serde_json::Value) -> Result<serde_json::Value, String> {
    ask_within(path, ask, Duration::from_secs(15))
}

/// [`ask`], waiting at most `timeout` for the answer (a live view must not freeze on a daemon
/// that is stopped or stuck in a slow disk).
pub fn ask_within(
    path: &Path,
    ask: &serde_json::Value,
    timeout: Duration,
) -> Result<serde_json::Value, String> {
    let mut s = std::os::unix::net::UnixStream::connect(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::PermissionDenied => format!(
            "cannot open {}: permission denied (the socket is its daemon's user's only)",
            path.display()
        ),
        _ => format!(
            "no gpuwatch daemon answers on {} ({e}); is it running with this --config?",
            path.display()
        ),
    })?;
    let _ = s.set_read_timeout(Some(timeout));
    let _ = s.set_write_timeout(Some(timeout));
    // A daemon at its client limit answers "busy" and closes without reading the request: the
    // write then fails (EPIPE) with the answer already waiting to be read.
    let sent = writeln!(s, "{ask}");
    let mut line = String::new();
    let read = BufReader::new(s).read_line(&mut line);
    if line.is_empty() {
        sent.and(read.map(drop))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let v: serde_json::Value =
        serde_json::from_str(&line).map_err(|_| format!("{}: no answer", path.display()))?;
    if v["ok"] == true {
        Ok(v)
    } else {
        Err(v["error"].as_str().unwrap_or("failed").to_string())
    }
}
