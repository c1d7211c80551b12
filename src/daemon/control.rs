//! The daemon's control socket, `state_dir/control.sock` (mode 0600: the daemon's user only):
//! one JSON request line, one JSON answer line. The requests go to the daemon's loop (which owns
//! the engine and the silences) as [`super::Control::Ask`] and are answered there:
//!
//! * `{"ask":"alerts"}` → pending and firing alerts;
//! * `{"ask":"silence_add","matchers":["gpu=3"],"for_ms":7200000,"comment":"…","created_by":"…","until_pid":null}`;
//! * `{"ask":"silence_list"}`, `{"ask":"silence_expire","id":"…"}`;
//! * `{"ask":"reload"}` (as SIGHUP).

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
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let tx = tx.clone();
                // One thread per client: a client that never sends a line holds only itself.
                let _ = std::thread::Builder::new()
                    .name("gpuwatch-ctl-client".into())
                    .spawn(move || serve(stream, &tx));
            }
        })?;
    Ok(())
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

fn serve(stream: std::os::unix::net::UnixStream, tx: &mpsc::Sender<Control>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let peer = peer_uid(&stream);
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut bytes = Vec::new();
    let mut reader = BufReader::new(stream).take(64 * 1024);
    let answer = match reader.read_until(b'\n', &mut bytes) {
        Ok(0) | Err(_) => return,
        // Invalid UTF-8 is answered, not dropped without a word.
        Ok(_) => match std::str::from_utf8(&bytes)
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
                    serde_json::json!({"ok": false, "error": "the daemon is stopping"})
                } else {
                    reply_rx
                        .recv_timeout(Duration::from_secs(10))
                        .unwrap_or_else(|_| {
                            serde_json::json!({"ok": false, "error": "the daemon did not answer in 10 s"})
                        })
                }
            }
            Err(e) => serde_json::json!({"ok": false, "error": e}),
        },
    };
    let _ = writeln!(writer, "{answer}");
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
    writeln!(s, "{ask}").map_err(|e| format!("{}: {e}", path.display()))?;
    let mut line = String::new();
    BufReader::new(s)
        .read_line(&mut line)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&line).map_err(|_| format!("{}: no answer", path.display()))?;
    if v["ok"] == true {
        Ok(v)
    } else {
        Err(v["error"].as_str().unwrap_or("failed").to_string())
    }
}
