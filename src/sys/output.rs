//! Files the user names for output (`--out`, `--report-json`, `--tee`): one place decides how
//! each kind of path is written, so no command can replace what is not its file.
//!
//! - a regular file or a missing path is written atomically: a temporary file beside it, fsync,
//!   rename over it (an interrupted write never leaves half a file under the name asked for);
//!   a file that existed keeps its permission bits;
//! - a character device (`/dev/null`, a terminal), a FIFO or a Unix socket is written in place
//!   and never renamed over or removed: renaming a file over `/dev/null` as root replaces the
//!   system's `/dev/null` for every program on the machine;
//! - a symbolic link is followed (up to 40 links): what it points to is written by these rules
//!   and the link stays a link, pointing at the new file — as `sed -i --follow-symlinks` and
//!   editors do, so a link kept in a dotfile repository or a shared results directory keeps
//!   working;
//! - a directory is an error naming it; a block device is refused (a report written over a disk
//!   destroys it, and no command here means that);
//! - `-` is standard output where the command's output is a stream ([`Dash::Stdout`]).

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// What `-` means for an output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dash {
    /// Standard output: the command's output is a stream.
    Stdout,
    /// Refused with this reason (e.g. standard output carries the job's own output).
    Refused(&'static str),
}

/// Where an output goes, after following links.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Standard output (`-`).
    Stdout,
    /// A regular file, or a path where none exists yet: written atomically at this path.
    File {
        /// The path written (the link's target when the name was a symbolic link).
        path: PathBuf,
        /// The permission bits of the file it replaces, if one exists.
        mode: Option<u32>,
    },
    /// A character device or FIFO, opened and written in place.
    InPlace {
        /// The device or FIFO.
        path: PathBuf,
        /// What it is, for messages ("character device", "FIFO").
        kind: &'static str,
    },
    /// A Unix socket: connected to and written as a stream.
    Socket(PathBuf),
}

fn err(kind: io::ErrorKind, msg: String) -> io::Error {
    io::Error::new(kind, msg)
}

/// Where output named `path` goes. Errors name the path: a directory, a block device, a loop of
/// links, `-` where it is refused.
pub fn target(path: &Path, dash: Dash) -> io::Result<Target> {
    if path.as_os_str() == "-" {
        return match dash {
            Dash::Stdout => Ok(Target::Stdout),
            Dash::Refused(why) => Err(err(
                io::ErrorKind::InvalidInput,
                format!("`-` (standard output) cannot be used here: {why}; name a file"),
            )),
        };
    }
    let mut at = path.to_path_buf();
    for _ in 0..40 {
        let meta = match std::fs::symlink_metadata(&at) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(Target::File {
                    path: at,
                    mode: None,
                })
            }
            Err(e) => {
                return Err(err(
                    e.kind(),
                    format!("cannot write {}: {e}", path.display()),
                ));
            }
        };
        let ft = meta.file_type();
        if ft.is_symlink() {
            let link = std::fs::read_link(&at)
                .map_err(|e| err(e.kind(), format!("cannot follow {}: {e}", at.display())))?;
            at = match at.parent() {
                Some(dir) if link.is_relative() => dir.join(link),
                _ => link,
            };
            continue;
        }
        let shown = || {
            if at == path {
                path.display().to_string()
            } else {
                format!("{} (→ {})", path.display(), at.display())
            }
        };
        return if ft.is_file() {
            Ok(Target::File {
                path: at,
                mode: Some(meta.permissions().mode() & 0o7777),
            })
        } else if ft.is_dir() {
            Err(err(
                io::ErrorKind::IsADirectory,
                format!(
                    "{} is a directory: name a file in it (e.g. {})",
                    shown(),
                    Path::new(&at).join("out").display()
                ),
            ))
        } else if ft.is_char_device() {
            Ok(Target::InPlace {
                path: at,
                kind: "character device",
            })
        } else if ft.is_fifo() {
            Ok(Target::InPlace {
                path: at,
                kind: "FIFO",
            })
        } else if ft.is_socket() {
            Ok(Target::Socket(at))
        } else if ft.is_block_device() {
            Err(err(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is a block device: refusing to write over it (name a file)",
                    shown()
                ),
            ))
        } else {
            Err(err(
                io::ErrorKind::InvalidInput,
                format!("{} is not a file gpuwatch can write", shown()),
            ))
        };
    }
    Err(err(
        io::ErrorKind::InvalidInput,
        format!("{}: too many levels of symbolic links", path.display()),
    ))
}

impl Target {
    /// Opens a device, FIFO or socket for writing in place (no truncation, no creation). A FIFO
    /// blocks here until a reader opens it, as the shell's `>` does.
    fn open_in_place(&self) -> io::Result<File> {
        match self {
            Target::InPlace { path, .. } => OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NOCTTY)
                .open(path)
                .map_err(|e| err(e.kind(), format!("cannot open {}: {e}", path.display()))),
            Target::Socket(path) => std::os::unix::net::UnixStream::connect(path)
                .map(|s| File::from(std::os::fd::OwnedFd::from(s)))
                .map_err(|e| {
                    err(
                        e.kind(),
                        format!("cannot connect to socket {}: {e}", path.display()),
                    )
                }),
            _ => Err(err(
                io::ErrorKind::InvalidInput,
                "not a device, FIFO or socket".into(),
            )),
        }
    }

    /// Whether this is a regular file (or a missing path) that is replaced atomically.
    pub fn is_file(&self) -> bool {
        matches!(self, Target::File { .. })
    }

    /// Opens a file that is only ever appended to (`--tee`, a recording): a regular or missing
    /// file is opened for appending (created with the usual 0666 & ~umask), anything else in
    /// place. Nothing is ever renamed or removed.
    pub fn open_append(&self) -> io::Result<File> {
        match self {
            Target::File { path, .. } => OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| err(e.kind(), format!("cannot open {}: {e}", path.display()))),
            Target::Stdout => Err(err(
                io::ErrorKind::InvalidInput,
                "standard output is not a file".into(),
            )),
            _ => self.open_in_place(),
        }
    }
}

/// An output being written; [`Output::finish`] completes it (for a regular file: the rename
/// that puts it in place). Dropped unfinished, a regular file's temporary file is removed and
/// the file named is left as it was.
pub struct Output {
    writer: BufWriter<Box<dyn Write + Send>>,
    /// (temporary file, final path, a handle on the temporary file to sync) while a regular
    /// file is being written.
    pending: Option<(PathBuf, PathBuf, File)>,
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Output")
            .field("pending", &self.pending)
            .finish_non_exhaustive()
    }
}

impl Output {
    /// Starts writing output named `path` (see the module's rules).
    pub fn create(path: &Path, dash: Dash) -> io::Result<Output> {
        Output::to(&target(path, dash)?)
    }

    /// Starts writing to `target`.
    pub fn to(target: &Target) -> io::Result<Output> {
        const BUF: usize = 1 << 20;
        match target {
            Target::Stdout => Ok(Output {
                writer: BufWriter::with_capacity(BUF, Box::new(io::stdout())),
                pending: None,
            }),
            Target::File { path, mode } => {
                let tmp = temp_beside(path);
                let f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(mode.unwrap_or(0o666))
                    .open(&tmp)
                    .map_err(|e| err(e.kind(), format!("cannot create {}: {e}", tmp.display())))?;
                if let Some(m) = mode {
                    // Exactly the replaced file's bits (the umask applied to the open).
                    let _ = f.set_permissions(std::fs::Permissions::from_mode(*m));
                }
                let handle = f.try_clone()?;
                Ok(Output {
                    writer: BufWriter::with_capacity(BUF, Box::new(f)),
                    pending: Some((tmp, path.clone(), handle)),
                })
            }
            other => {
                let f = other.open_in_place()?;
                Ok(Output {
                    writer: BufWriter::with_capacity(BUF, Box::new(f)),
                    pending: None,
                })
            }
        }
    }

    /// Flushes, and for a regular file fsyncs and renames it into place (then fsyncs its
    /// directory).
    pub fn finish(mut self) -> io::Result<()> {
        self.writer.flush()?;
        match self.pending.take() {
            Some((tmp, path, file)) => super::commit_temp(&file, &tmp, &path)
                .map_err(|e| err(e.kind(), format!("cannot replace {}: {e}", path.display()))),
            None => Ok(()),
        }
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.writer.write(buf)
    }
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.writer.write_all(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if let Some((tmp, _, _)) = self.pending.take() {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

/// A temporary file's name beside `path` (hidden, unique to this process and call).
fn temp_beside(path: &Path) -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = format!(".{name}.{}.{n}.part", std::process::id());
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.join(tmp),
        _ => PathBuf::from(tmp),
    }
}

/// Writes `bytes` as the whole output named `path` (see the module's rules).
pub fn write_output(path: &Path, dash: Dash, bytes: &[u8]) -> io::Result<()> {
    let mut out = Output::create(path, dash)?;
    out.write_all(bytes)?;
    out.finish()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn regular_missing_and_linked_files_are_replaced_and_links_stay_links() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.csv");
        write_output(&p, Dash::Stdout, b"one").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"one");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_output(&p, Dash::Stdout, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640, "a replaced file keeps its mode");
        let link = dir.path().join("link.csv");
        std::os::unix::fs::symlink("a.csv", &link).unwrap();
        write_output(&link, Dash::Stdout, b"three").unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&p).unwrap(), b"three");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 2, "no temporary file left behind");
    }

    #[test]
    fn directories_block_devices_loops_and_refused_dash_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let e = target(dir.path(), Dash::Stdout).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::os::unix::fs::symlink(&b, &a).unwrap();
        std::os::unix::fs::symlink(&a, &b).unwrap();
        let e = target(&a, Dash::Stdout).unwrap_err().to_string();
        assert!(e.contains("symbolic links"), "{e}");
        let e = target(Path::new("-"), Dash::Refused("the job's output"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("the job's output"), "{e}");
        assert_eq!(
            target(Path::new("-"), Dash::Stdout).unwrap(),
            Target::Stdout
        );
    }

    #[test]
    fn dev_null_is_written_in_place() {
        let t = target(Path::new("/dev/null"), Dash::Stdout).unwrap();
        assert!(matches!(
            t,
            Target::InPlace {
                kind: "character device",
                ..
            }
        ));
        write_output(Path::new("/dev/null"), Dash::Stdout, b"x").unwrap();
        let ft = std::fs::symlink_metadata("/dev/null").unwrap().file_type();
        assert!(ft.is_char_device());
    }

    #[test]
    fn an_unfinished_output_leaves_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.html");
        std::fs::write(&p, "old").unwrap();
        {
            let mut o = Output::create(&p, Dash::Stdout).unwrap();
            o.write_all(b"new, half").unwrap();
        }
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "old");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
