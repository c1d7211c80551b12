//! Shared helpers for the integration tests: build the simulated NVML library once, run the real
//! `gpuwatch` binary as a subprocess (NVML state is per process) and capture what it prints.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// Every scenario nvml-sim ships.
pub const SCENARIOS: &[&str] = &[
    "healthy",
    "dataloader-stall",
    "memory-leak",
    "oom",
    "small-batch",
    "thermal-throttle",
    "power-anomaly",
    "ecc-errors",
    "xid-79",
    "nccl-hang",
    "straggler",
    "rank-dead",
    "overnight",
];

/// Environment variables that would change what gpuwatch or the simulated library does; removed
/// from every child so the tests do not depend on the caller's shell.
const SCRUBBED_ENV: &[&str] = &[
    "GPUWATCH_NVML_LIB",
    "GPUWATCH_LOG",
    "NVML_SIM_SCENARIO",
    "NVML_SIM_TIME_SCALE",
    "NVML_SIM_CONTROL",
    "NVML_SIM_SYSFS",
    "NVML_SIM_HIDE",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
];

/// The `gpuwatch` binary under test.
pub fn gpuwatch_exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_gpuwatch"))
}

/// Builds the nvml-sim cdylib once per test run (`cargo test` does not build a member's cdylib)
/// and returns the path of `libnvml_sim.so`, which sits next to the gpuwatch binary, where
/// `--sim` looks for it.
pub fn sim_lib() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let exe_dir = gpuwatch_exe()
            .parent()
            .expect("the test binary lives in a target directory");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-q", "-p", "nvml-sim"])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if exe_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("running cargo build -p nvml-sim");
        assert!(status.success(), "cargo build -p nvml-sim failed");
        let lib = exe_dir.join("libnvml_sim.so");
        assert!(lib.exists(), "{} missing after the build", lib.display());
        lib
    })
}

/// What a finished gpuwatch run left behind.
#[derive(Debug)]
pub struct Run {
    /// Exit code (-1 when killed by a signal).
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Run {
    /// Asserts exit code 0 and returns stdout parsed as JSON.
    pub fn json(&self) -> serde_json::Value {
        assert_eq!(self.code, 0, "gpuwatch failed: {}", self.stderr);
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }
}

/// A `gpuwatch` command with a scrubbed environment plus `envs`.
pub fn command(args: &[&str], envs: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(gpuwatch_exe());
    cmd.args(args).stdin(Stdio::null());
    for k in SCRUBBED_ENV {
        cmd.env_remove(k);
    }
    // State that defaults under $HOME (the end-of-run recordings of `run`) goes to a directory
    // of this test process, never the caller's home; so does what goes under $TMPDIR (the kept
    // state directories of `--sim --speed` daemons), one directory per test run.
    cmd.env("HOME", test_home());
    cmd.env("TMPDIR", test_home().join("tmp"));
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd
}

/// Runs gpuwatch to completion.
pub fn gpuwatch(args: &[&str], envs: &[(&str, &str)]) -> Run {
    let out = command(args, envs).output().expect("running gpuwatch");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs gpuwatch with `--sim SCENARIO` (building the simulated library first).
pub fn sim(scenario: &str, args: &[&str], envs: &[(&str, &str)]) -> Run {
    sim_lib();
    let mut all = vec!["--sim", scenario];
    all.extend_from_slice(args);
    gpuwatch(&all, envs)
}

/// A shipped scenario whose training job is the client's parent (`pid = "parent"` for `"job"`),
/// written to `dir`: for the tests that need GPU processes `/proc` shows — this test process
/// when it starts gpuwatch — with an owner to account by.
pub fn scenario_with_parent(name: &str, dir: &Path) -> PathBuf {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("nvml-sim/scenarios")
        .join(format!("{name}.toml"));
    let text = std::fs::read_to_string(&shipped).expect("shipped scenario");
    assert!(
        text.contains("pid = \"job\""),
        "{name} has no job processes"
    );
    let path = dir.join(format!("{name}-parent.toml"));
    std::fs::write(&path, text.replace("pid = \"job\"", "pid = \"parent\"")).expect("write");
    path
}

/// Splits a gpuwatch CSV recording into its header and rows, checking every row has as many
/// fields as the header (a cut-off line would not).
pub fn csv_rows(text: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut lines = text.lines();
    let header: Vec<String> = lines
        .next()
        .expect("a header line")
        .split(',')
        .map(str::to_string)
        .collect();
    let rows: Vec<Vec<String>> = lines.map(split_csv_line).collect();
    for r in &rows {
        assert_eq!(r.len(), header.len(), "row with a wrong field count: {r:?}");
    }
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "recording does not end in a newline"
    );
    (header, rows)
}

/// Splits one CSV line, honouring RFC 4180 quotes.
pub fn split_csv_line(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    fields.push(cur);
    fields
}

/// The value of column `name` in `row`.
pub fn col<'a>(header: &[String], row: &'a [String], name: &str) -> &'a str {
    let i = header
        .iter()
        .position(|h| h == name)
        .unwrap_or_else(|| panic!("no column {name}"));
    &row[i]
}

/// A home directory for the children of this test process (removed by no one: it is under the
/// system's temporary directory and named by the process id).
pub fn test_home() -> &'static Path {
    static HOME: OnceLock<PathBuf> = OnceLock::new();
    HOME.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("gpuwatch-test-home-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("tmp")).expect("test home");
        dir
    })
}

/// The first of `names` on the PATH. Missing, the caller skips its check, except under CI
/// (`CI` set), where `.ci/run` installs them and a missing one fails the test.
pub fn installed(names: &[&str]) -> Option<PathBuf> {
    let found = names.iter().find_map(|name| {
        Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
    });
    assert!(
        found.is_some() || std::env::var_os("CI").is_none(),
        "{} is missing (.ci/run installs it)",
        names.join(" / ")
    );
    found
}

/// A rules directory `dir/rules` holding copies of the stock rules `names`.
pub fn stock_rules(dir: &Path, names: &[&str]) -> PathBuf {
    let rules = dir.join("rules");
    std::fs::create_dir_all(&rules).expect("rules dir");
    for name in names {
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("rules/{name}.rhai")),
            rules.join(format!("{name}.rhai")),
        )
        .expect("copy a stock rule");
    }
    rules
}

/// A `sleep` moved into a cgroup of the test's own, `BASE/NAME_PID/INNER` (on cgroup v2, or on
/// v1's pids hierarchy), shaped as a scheduler makes them (`…slurm…/job_77/step_0`,
/// `…kubepods…/pod<uid>`); moved back and removed when dropped.
pub struct InCgroup {
    pub child: std::process::Child,
    dirs: Vec<PathBuf>,
    root_procs: PathBuf,
}

impl InCgroup {
    /// `None` (SKIP) where cgroups cannot be made: not root, or a read-only cgroupfs.
    pub fn start(name: &str, inner: &str) -> Option<InCgroup> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI runs as root"
            );
            eprintln!("SKIP: making cgroups needs root");
            return None;
        }
        let base = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            PathBuf::from("/sys/fs/cgroup")
        } else {
            PathBuf::from("/sys/fs/cgroup/pids")
        };
        let child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("sleep");
        let top = base.join(format!("{name}_{}", child.id()));
        let leaf = top.join(inner);
        let dirs: Vec<PathBuf> = leaf
            .ancestors()
            .take_while(|d| d.starts_with(&top))
            .map(Path::to_path_buf)
            .collect();
        let held = InCgroup {
            dirs,
            root_procs: base.join("cgroup.procs"),
            child,
        };
        if let Err(e) = std::fs::create_dir_all(&leaf) {
            eprintln!("SKIP: cannot make a cgroup under {}: {e}", base.display());
            return None;
        }
        std::fs::write(leaf.join("cgroup.procs"), held.child.id().to_string())
            .expect("move into the cgroup");
        let seen = std::fs::read_to_string(format!("/proc/{}/cgroup", held.child.id()))
            .expect("its cgroup");
        assert!(seen.contains(inner), "{seen}");
        Some(held)
    }
}

impl Drop for InCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.root_procs, self.child.id().to_string());
        let _ = self.child.kill();
        let _ = self.child.wait();
        for d in &self.dirs {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// The Python of the test virtualenv: `$GPUWATCH_PEERS/bin/python` (`.ci/run` sets it), else
/// `<repo>/.venv-ci/bin/python`.
pub fn peers_python() -> PathBuf {
    std::env::var_os("GPUWATCH_PEERS")
        .map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-ci"),
            PathBuf::from,
        )
        .join("bin/python")
}

/// Waits (at most a minute) for the first line `child` prints on its piped stdout and returns it
/// (a server saying `ready`); the rest of its output is not read.
pub fn first_line(child: &mut std::process::Child) -> String {
    use std::io::BufRead as _;
    let out = child.stdout.take().expect("a piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    rx.recv_timeout(std::time::Duration::from_secs(60))
        .expect("no first line within a minute")
        .trim_end()
        .to_string()
}

/// The `decision` of each line of an audit log (the drain's, the taint's), in order.
pub fn audit_decisions(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("an audit line");
            v["decision"].as_str().expect("a decision").to_string()
        })
        .collect()
}
