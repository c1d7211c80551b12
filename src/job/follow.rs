//! Following a log file like `tail -F`: new bytes as they are appended, surviving truncation
//! (`> log`) and rotation (rename + new file at the same path).
//!
//! On open the follower starts at most [`INITIAL_BACKLOG_BYTES`] before the end, so the current
//! step is known at once without reading a multi-gigabyte log.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// How much of an existing file is read when following starts.
pub const INITIAL_BACKLOG_BYTES: u64 = 64 * 1024;

/// Most bytes returned by one [`LogFollower::poll`].
const MAX_POLL_BYTES: usize = 4 << 20;

/// Follows one path.
#[derive(Debug)]
pub struct LogFollower {
    path: PathBuf,
    file: Option<File>,
    inode: u64,
    pos: u64,
    /// True until the first open: start near the end instead of at 0.
    first_open: bool,
}

impl LogFollower {
    /// A follower of `path` (which need not exist yet).
    pub fn new(path: &Path) -> LogFollower {
        LogFollower {
            path: path.to_path_buf(),
            file: None,
            inode: 0,
            pos: 0,
            first_open: true,
        }
    }

    /// The followed path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Returns the bytes appended since the last call (possibly none). Errors (missing file,
    /// permissions) are not fatal: the follower retries on the next call.
    pub fn poll(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        let current = std::fs::metadata(&self.path).ok();
        if let Some(file) = &mut self.file {
            let rotated = current.as_ref().is_some_and(|m| m.ino() != self.inode);
            // Drain what was appended to the open file (the old one, when rotated).
            if let Ok(meta) = file.metadata() {
                if meta.len() < self.pos {
                    // Truncated in place: start over.
                    self.pos = 0;
                    let _ = file.seek(SeekFrom::Start(0));
                }
            }
            read_new(file, &mut self.pos, &mut out);
            if rotated || current.is_none() {
                self.file = None;
            }
        }
        if self.file.is_none() {
            if let (Some(meta), Ok(mut file)) = (current, File::open(&self.path)) {
                let start = if self.first_open {
                    meta.len().saturating_sub(INITIAL_BACKLOG_BYTES)
                } else {
                    0
                };
                if file.seek(SeekFrom::Start(start)).is_ok() {
                    self.inode = meta.ino();
                    self.pos = start;
                    let skip_partial = start > 0;
                    let mut fresh = Vec::new();
                    read_new(&mut file, &mut self.pos, &mut fresh);
                    if skip_partial {
                        // Drop the partial first line of the backlog.
                        let cut = fresh.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
                        fresh.drain(..cut);
                    }
                    out.extend_from_slice(&fresh);
                    self.file = Some(file);
                    self.first_open = false;
                }
            }
        }
        out
    }
}

fn read_new(file: &mut File, pos: &mut u64, out: &mut Vec<u8>) {
    let mut buf = [0u8; 64 * 1024];
    while out.len() < MAX_POLL_BYTES {
        match file.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                *pos += n as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn follows_appends_truncation_and_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.log");
        let mut f = LogFollower::new(&path);
        assert!(f.poll().is_empty(), "missing file is not an error");

        std::fs::write(&path, "step 1\n").unwrap();
        assert_eq!(f.poll(), b"step 1\n");
        let mut log = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        log.write_all(b"step 2\n").unwrap();
        assert_eq!(f.poll(), b"step 2\n");
        assert!(f.poll().is_empty());

        // Truncation.
        std::fs::write(&path, "step 3\n").unwrap();
        assert_eq!(f.poll(), b"step 3\n");

        // Rotation: the old file gets a last line, then a new file appears.
        log.write_all(b"tail of old\n").unwrap();
        std::fs::rename(&path, dir.path().join("train.log.1")).unwrap();
        log.write_all(b"after rename\n").unwrap();
        std::fs::write(&path, "step 4\n").unwrap();
        let got = String::from_utf8(f.poll()).unwrap();
        assert_eq!(got, "tail of old\nafter rename\nstep 4\n");
    }

    #[test]
    fn starts_near_the_end_of_a_big_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.log");
        let mut text = String::new();
        for i in 0..20_000 {
            text.push_str(&format!("step {i}\n"));
        }
        std::fs::write(&path, &text).unwrap();
        let got = String::from_utf8(LogFollower::new(&path).poll()).unwrap();
        assert!(got.len() <= INITIAL_BACKLOG_BYTES as usize);
        assert!(got.starts_with("step "), "partial first line dropped");
        assert!(got.ends_with("step 19999\n"));
    }
}
