//! Every command that writes a file the user names, against every kind of path: a regular file
//! (replaced), a missing one (created), `/dev/null` (written in place — as root, which CI is, a
//! rename over it replaces the machine's `/dev/null`), a FIFO whose reader must receive every byte,
//! a symbolic link (followed: the link stays a link) and a directory (an error naming it).
//!
//! `/dev/null` is checked after every case; should a regression ever replace it, the check puts
//! the character device back (`mknod c 1 3`, mode 0666) and fails the test.

#![allow(clippy::unwrap_used)]

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::common;

const LOG: &str = "tests/fixtures/logs/smi-csv-units.csv";

/// Whether `/dev/null` is still the null device; if it is not, restores it and says what it was.
fn dev_null_replaced() -> Option<String> {
    let null = Path::new("/dev/null");
    let meta = std::fs::symlink_metadata(null).ok();
    let ok = meta
        .as_ref()
        .is_some_and(|m| m.file_type().is_char_device() && m.rdev() == libc::makedev(1, 3));
    if ok {
        return None;
    }
    let what = format!("{meta:?}");
    let _ = std::fs::remove_file(null);
    let c = std::ffi::CString::new("/dev/null").unwrap();
    // SAFETY: a valid path; restores the null device (as root) after a regression replaced it.
    unsafe {
        libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3));
        libc::chmod(c.as_ptr(), 0o666);
    }
    Some(what)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Regular,
    Missing,
    DevNull,
    Fifo,
    Symlink,
    Directory,
}

const KINDS: [Kind; 6] = [
    Kind::Regular,
    Kind::Missing,
    Kind::DevNull,
    Kind::Fifo,
    Kind::Symlink,
    Kind::Directory,
];

/// How a command treats the file's old contents.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// Replaced by the output.
    Replace,
    /// Appended to (`--tee`).
    Append,
}

/// One command writing to `{OUT}`, and a check of what it wrote.
struct Case {
    name: &'static str,
    args: &'static [&'static str],
    sim: bool,
    mode: Mode,
    looks_right: fn(&str) -> bool,
}

const CASES: &[Case] = &[
    Case {
        name: "import",
        args: &["import", LOG, "--out", "{OUT}"],
        sim: false,
        mode: Mode::Replace,
        looks_right: |t| t.starts_with("timestamp,index,") && t.lines().count() > 2,
    },
    Case {
        name: "export",
        args: &["export", "--openmetrics", LOG, "--out", "{OUT}"],
        sim: false,
        mode: Mode::Replace,
        looks_right: |t| t.contains("DCGM_FI_DEV_GPU_UTIL") && t.ends_with("# EOF\n"),
    },
    Case {
        name: "report",
        args: &["report", LOG, "--out", "{OUT}"],
        sim: false,
        mode: Mode::Replace,
        looks_right: |t| t.contains("<html") && t.trim_end().ends_with("</html>"),
    },
    Case {
        name: "record",
        args: &[
            "record",
            "--interval",
            "100ms",
            "--duration",
            "250ms",
            "--out",
            "{OUT}",
        ],
        sim: true,
        mode: Mode::Replace,
        looks_right: |t| t.starts_with("timestamp,index,") && t.lines().count() > 8,
    },
    Case {
        name: "run --report-json",
        args: &[
            "run",
            "--no-rules",
            "--no-report",
            "--quiet",
            "--report-json",
            "{OUT}",
            "--",
            "true",
        ],
        sim: false,
        mode: Mode::Replace,
        looks_right: |t| {
            serde_json::from_str::<serde_json::Value>(t).is_ok_and(|v| v["exit_code"] == 0)
        },
    },
    Case {
        name: "run --tee",
        args: &[
            "run",
            "--no-rules",
            "--no-report",
            "--quiet",
            "--tee",
            "{OUT}",
            "--",
            "echo",
            "hello from the job",
        ],
        sim: false,
        mode: Mode::Append,
        looks_right: |t| t.ends_with("hello from the job\n"),
    },
];

const OLD: &str = "old contents\n";

/// Runs `case` writing to a path of `kind`; returns a description of what went wrong.
fn check(case: &Case, kind: Kind) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let out: PathBuf = match kind {
        Kind::Regular => {
            let p = dir.path().join("out.file");
            std::fs::write(&p, OLD).unwrap();
            p
        }
        Kind::Missing => dir.path().join("new.file"),
        Kind::DevNull => PathBuf::from("/dev/null"),
        Kind::Fifo => {
            let p = dir.path().join("pipe");
            let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
            // SAFETY: a valid path in our temporary directory.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            p
        }
        Kind::Symlink => {
            std::fs::write(dir.path().join("real.file"), OLD).unwrap();
            let p = dir.path().join("link.file");
            std::os::unix::fs::symlink("real.file", &p).unwrap();
            p
        }
        Kind::Directory => {
            let p = dir.path().join("a-dir");
            std::fs::create_dir(&p).unwrap();
            std::fs::write(p.join("keep"), "x").unwrap();
            p
        }
    };
    let out_s = out.to_str().unwrap().to_string();
    let args: Vec<&str> = case
        .args
        .iter()
        .map(|a| if *a == "{OUT}" { out_s.as_str() } else { a })
        .collect();
    // The test holds the FIFO open for reading and writing while gpuwatch runs: its reader's
    // open returns at once and it sees end of file only when this handle and gpuwatch's are
    // closed — also when a regression renamed a file over the FIFO and never opened it.
    let hold = (kind == Kind::Fifo).then(|| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&out)
            .unwrap()
    });
    let reader = (kind == Kind::Fifo).then(|| {
        let mut f = std::fs::File::open(&out).unwrap();
        std::thread::spawn(move || {
            let mut text = String::new();
            f.read_to_string(&mut text).map(|_| text)
        })
    });
    if case.sim {
        common::sim_lib();
    }
    let mut full = Vec::new();
    if case.sim {
        full.extend(["--sim", "healthy"]);
    }
    full.extend(args);
    let out_run = common::command(&full, &[])
        .env_remove("GPUWATCH_CONFIG")
        .output()
        .expect("running gpuwatch");
    let run = common::Run {
        code: out_run.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out_run.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out_run.stderr).into_owned(),
    };
    drop(hold);
    let fifo_text = reader.map(|r| r.join().unwrap().unwrap_or_default());
    if let Some(what) = dev_null_replaced() {
        return Err(format!(
            "/dev/null was replaced ({what}); restored it. stderr: {}",
            run.stderr
        ));
    }
    let fail = |why: &str| Err(format!("{why}; exit {}, stderr: {}", run.code, run.stderr));
    match kind {
        Kind::Directory => {
            if run.code == 0 {
                return fail("writing to a directory succeeded");
            }
            if !run.stderr.contains(&out_s) || !run.stderr.contains("directory") {
                return fail("the error does not name the directory");
            }
            if !out.is_dir() || !out.join("keep").exists() {
                return fail("the directory was changed");
            }
            return Ok(());
        }
        _ if run.code != 0 => return fail("failed"),
        _ => {}
    }
    let written = match kind {
        Kind::DevNull => {
            return Ok(());
        }
        Kind::Fifo => {
            let ft = std::fs::symlink_metadata(&out).unwrap().file_type();
            if !ft.is_fifo() {
                return fail("the FIFO is no longer a FIFO");
            }
            fifo_text.unwrap_or_default()
        }
        Kind::Symlink => {
            let ft = std::fs::symlink_metadata(&out).unwrap().file_type();
            if !ft.is_symlink() {
                return fail("the link is no longer a link");
            }
            std::fs::read_to_string(dir.path().join("real.file")).unwrap_or_default()
        }
        _ => std::fs::read_to_string(&out).unwrap_or_default(),
    };
    let had_old = matches!(kind, Kind::Regular | Kind::Symlink);
    let body = match case.mode {
        Mode::Append if had_old => match written.strip_prefix(OLD) {
            Some(rest) => rest,
            None => return fail(&format!("appending lost the old contents: {written:?}")),
        },
        _ => written.as_str(),
    };
    if case.mode == Mode::Replace && written.contains(OLD.trim_end()) {
        return fail("the old contents are still there");
    }
    if !(case.looks_right)(body) {
        let head: String = written.chars().take(300).collect();
        return fail(&format!(
            "unexpected output ({} bytes): {head:?}",
            written.len()
        ));
    }
    let leftovers: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".part") || n.contains(".tmp"))
        .collect();
    if !leftovers.is_empty() {
        return fail(&format!("temporary files left behind: {leftovers:?}"));
    }
    Ok(())
}

/// One test per command, every kind of path in it: all failures are listed together.
fn command_case(name: &str) {
    let case = CASES.iter().find(|c| c.name == name).unwrap();
    let failures: Vec<String> = KINDS
        .iter()
        .filter_map(|k| check(case, *k).err().map(|e| format!("{k:?}: {e}")))
        .collect();
    assert!(failures.is_empty(), "{name}:\n{}", failures.join("\n"));
}

#[test]
fn import_out_every_kind_of_path() {
    command_case("import");
}

#[test]
fn export_out_every_kind_of_path() {
    command_case("export");
}

#[test]
fn report_out_every_kind_of_path() {
    command_case("report");
}

#[test]
fn record_out_every_kind_of_path() {
    command_case("record");
}

#[test]
fn run_report_json_every_kind_of_path() {
    command_case("run --report-json");
}

#[test]
fn run_tee_every_kind_of_path() {
    command_case("run --tee");
}

/// `-` is standard output for the stream commands, and refused where standard output is the job's.
#[test]
fn dash_is_standard_output_where_output_is_a_stream() {
    let run = common::gpuwatch(&["import", LOG, "--out", "-"], &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.starts_with("timestamp,index,"), "{}", run.stdout);
    assert!(!Path::new("-").exists());
    let run = common::gpuwatch(&["report", LOG, "--out", "-"], &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("<html"), "the page on stdout");
    assert!(
        !run.stdout.contains("diagnosis:"),
        "the summary goes to stderr"
    );
    let run = common::gpuwatch(
        &["run", "--no-rules", "--report-json", "-", "--", "true"],
        &[],
    );
    assert_ne!(run.code, 0);
    assert!(run.stderr.contains("job's own output"), "{}", run.stderr);
}

/// `record --max-size` rotates by renaming: refused for a device instead of renaming it.
#[test]
fn record_rotation_is_refused_for_a_device() {
    let run = common::sim(
        "healthy",
        &[
            "record",
            "--duration",
            "200ms",
            "--out",
            "/dev/null",
            "--max-size",
            "1KB",
        ],
        &[],
    );
    assert_ne!(run.code, 0);
    assert!(run.stderr.contains("not a regular file"), "{}", run.stderr);
    assert!(dev_null_replaced().is_none(), "/dev/null was replaced");
}

/// `record --stats` reports the sample wall time of the ticks it kept (only `record` keeps them:
/// a daemon keeps the newest, not a list that grows for days).
#[test]
fn record_stats_report_the_ticks_sample_times() {
    let run = common::sim(
        "healthy",
        &[
            "record",
            "--interval",
            "100ms",
            "--duration",
            "1s",
            "--out",
            "/dev/null",
            "--stats",
        ],
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let line = run
        .stderr
        .lines()
        .find(|l| l.starts_with("gpuwatch record: "))
        .unwrap_or_else(|| panic!("no stats line: {}", run.stderr));
    for part in ["median ", "p99 ", "max "] {
        let value = line
            .split(part)
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .unwrap_or_default();
        assert!(value.parse::<f64>().is_ok(), "{part}{value:?} in {line}");
    }
}
