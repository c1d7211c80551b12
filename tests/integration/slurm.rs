//! Issue 29: `[actions.drain]` against a real Slurm. The test starts a one-node cluster of its
//! own — `munged`, `slurmctld` and `slurmd` from Debian's packages, a config it writes, private
//! ports and sockets, no GPUs in Slurm's view — and runs `gpuwatch daemon` on simulated GPUs
//! with the drain action on:
//! * GPU 3 falls off the bus (XID 79): the node is drained with a `gpuwatch:` reason naming the
//!   alert and the GPU, within the interval + 2 s (measured, with slack for a loaded machine);
//! * a node an admin drained is left as it is (their reason stays);
//! * a condition that clears: the drain is resumed after `resume_after`, and `scontrol show
//!   node` is clean again;
//! * an admin who re-drains the node (their own reason) while gpuwatch's condition holds keeps
//!   it drained after the condition clears.
//!
//! Needs root (slurmd) and the packages (`.ci/run` installs them); without them it prints SKIP,
//! except under `CI=true`, where it fails.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use crate::notify::servers::{free_port, Daemon};

/// The node's name in the test cluster.
const NODE: &str = "gpunode1";

/// A one-node Slurm cluster, stopped (every daemon killed) when dropped.
struct Slurm {
    dir: tempfile::TempDir,
    children: Vec<Child>,
    /// The `scontrol` on the PATH.
    scontrol: PathBuf,
}

impl Slurm {
    /// Starts the cluster and waits until the node is idle; `None` (SKIP) without root or the
    /// packages outside CI.
    fn start() -> Option<Slurm> {
        Slurm::start_with(None)
    }

    /// [`Slurm::start`]; with `epilog`, the node has two GPUs as GRES (`gres.conf` naming two
    /// device files of the test's own) and runs `gpuwatch slurm epilog` with that config as its
    /// Epilog.
    fn start_with(epilog: Option<&Path>) -> Option<Slurm> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "the Slurm test cannot run: slurmd needs root"
            );
            eprintln!("SKIP slurm: slurmd needs root");
            return None;
        }
        // (under CI a missing one fails here: .ci/run installs slurmctld slurmd slurm-client munge)
        let found: Option<Vec<PathBuf>> = ["munged", "slurmctld", "slurmd", "scontrol"]
            .iter()
            .map(|n| common::installed(&[n]))
            .collect();
        let Some([munged, slurmctld, slurmd, scontrol]) =
            found.and_then(|f| <[PathBuf; 4]>::try_from(f).ok())
        else {
            eprintln!(
                "SKIP slurm: munged, slurmctld, slurmd or scontrol missing (Debian: apt-get install slurmctld slurmd slurm-client munge)"
            );
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for sub in ["munge", "state", "spool", "log", "run"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        let key: Vec<u8> = (0..1024u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let key_path = d.join("munge/munge.key");
        std::fs::write(&key_path, key).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o400)).unwrap();
        std::fs::set_permissions(d.join("munge"), std::fs::Permissions::from_mode(0o700)).unwrap();
        // munged wants every directory above its socket searchable by all
        for open in [d, &d.join("run")] {
            std::fs::set_permissions(open, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let mut slurm = Slurm {
            dir,
            children: Vec::new(),
            scontrol,
        };
        let d = slurm.dir.path().to_path_buf();
        let munge = |f: &str| d.join("munge").join(f).display().to_string();
        slurm.spawn(
            Command::new(munged)
                .arg("--foreground")
                .arg(format!("--key-file={}", munge("munge.key")))
                .arg(format!("--socket={}", d.join("run/munge.sock").display()))
                .arg(format!("--pid-file={}", munge("pid")))
                .arg(format!("--log-file={}", munge("log")))
                .arg(format!("--seed-file={}", munge("seed"))),
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while !d.join("run/munge.sock").exists() {
            assert!(
                Instant::now() < deadline,
                "munged did not start: {}",
                std::fs::read_to_string(d.join("log/stderr.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let p = |s: &str| d.join(s).display().to_string();
        let conf = format!(
            "ClusterName=gwtest\n\
             SlurmctldHost=localhost(127.0.0.1)\n\
             AuthType=auth/munge\n\
             AuthInfo=socket={sock}\n\
             CredType=cred/munge\n\
             SlurmUser=root\n\
             SlurmdUser=root\n\
             SlurmctldPort={ctld}\n\
             SlurmdPort={slurmd}\n\
             StateSaveLocation={state}\n\
             SlurmdSpoolDir={spool}\n\
             SlurmctldPidFile={run}/slurmctld.pid\n\
             SlurmdPidFile={run}/slurmd.pid\n\
             SlurmctldLogFile={log}/slurmctld.log\n\
             SlurmdLogFile={log}/slurmd.log\n\
             ProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\n\
             JobAcctGatherType=jobacct_gather/none\n\
             AccountingStorageType=accounting_storage/none\n\
             SchedulerType=sched/builtin\n\
             SelectType=select/cons_tres\n\
             MpiDefault=none\n\
             ReturnToService=2\n\
             {gres_types}\
             NodeName={NODE} NodeAddr=127.0.0.1 NodeHostname=localhost CPUs=1 {gres}State=UNKNOWN\n\
             PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP\n",
            sock = d.join("run/munge.sock").display(),
            ctld = free_port(),
            slurmd = free_port(),
            state = p("state"),
            spool = p("spool"),
            run = p("run"),
            log = p("log"),
            gres_types = if epilog.is_some() {
                "GresTypes=gpu\n"
            } else {
                ""
            },
            gres = if epilog.is_some() { "Gres=gpu:2 " } else { "" },
        );
        let conf = match epilog {
            Some(config) => {
                // two device files of our own (char devices, as /dev/nvidiaN are)
                std::fs::create_dir_all(d.join("dev")).unwrap();
                for n in 0..2 {
                    let dev = d.join(format!("dev/nvidia{n}"));
                    let c = std::ffi::CString::new(dev.to_str().unwrap()).unwrap();
                    // SAFETY: a valid path; makes a char device like /dev/null (1, 3).
                    let rc = unsafe {
                        libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3))
                    };
                    assert_eq!(rc, 0, "mknod {}", dev.display());
                }
                std::fs::write(
                    d.join("gres.conf"),
                    format!("NodeName={NODE} Name=gpu File={}\n", p("dev/nvidia[0-1]")),
                )
                .unwrap();
                let script = d.join("epilog.sh");
                std::fs::write(
                    &script,
                    format!(
                        "#!/bin/sh\nexport SLURM_CONF={}\nexec {} slurm epilog --config {} 2>>{}\n",
                        d.join("slurm.conf").display(),
                        common::gpuwatch_exe().display(),
                        config.display(),
                        p("log/epilog.log"),
                    ),
                )
                .unwrap();
                std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
                format!("{conf}Epilog={}\n", script.display())
            }
            None => conf,
        };
        std::fs::write(d.join("slurm.conf"), conf).unwrap();
        let conf = d.join("slurm.conf");
        slurm.spawn(
            Command::new(slurmctld)
                .arg("-D")
                .arg("-i")
                .arg("-f")
                .arg(&conf),
        );
        slurm.spawn(
            Command::new(slurmd)
                .args(["-D", "-N", NODE, "-f"])
                .arg(&conf),
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let state = slurm.node().0;
            if state.starts_with("IDLE") && !state.contains("NOT_RESPONDING") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the node did not come up ({state}):\n{}",
                slurm.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        Some(slurm)
    }

    fn spawn(&mut self, cmd: &mut Command) {
        let child = cmd
            .env("SLURM_CONF", self.conf())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.dir.path().join("log/stderr.log"))
                    .unwrap(),
            )
            .spawn()
            .unwrap();
        self.children.push(child);
    }

    fn conf(&self) -> PathBuf {
        self.dir.path().join("slurm.conf")
    }

    fn logs(&self) -> String {
        ["slurmctld.log", "slurmd.log", "stderr.log"]
            .iter()
            .map(|f| {
                std::fs::read_to_string(self.dir.path().join("log").join(f)).unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// `scontrol ARGS` against this cluster: (success, output).
    fn scontrol(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(&self.scontrol)
            .args(args)
            .env("SLURM_CONF", self.conf())
            .output()
            .unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    /// The node's (state, reason) as `scontrol show node` says.
    fn node(&self) -> (String, String) {
        let (_, out) = self.scontrol(&["show", "node", NODE, "--oneliner"]);
        let state = out
            .split_whitespace()
            .find_map(|f| f.strip_prefix("State="))
            .unwrap_or_default()
            .to_string();
        let reason = out
            .find(" Reason=")
            .map(|i| out[i + 8..].trim().to_string())
            .unwrap_or_default();
        (state, reason)
    }

    fn drain_as_admin(&self, reason: &str) {
        let r = format!("Reason={reason}");
        let node = format!("NodeName={NODE}");
        let (ok, out) = self.scontrol(&["update", &node, "State=DRAIN", &r]);
        assert!(ok, "{out}");
    }

    fn resume(&self) {
        let node = format!("NodeName={NODE}");
        let (ok, out) = self.scontrol(&["update", &node, "State=RESUME"]);
        assert!(ok, "{out}");
        let (state, _) = self.node();
        assert!(!state.contains("DRAIN"), "{state}");
    }

    /// Waits until `what` holds of (state, reason); the time it took.
    fn wait_node(&self, limit: Duration, what: &str, ok: impl Fn(&str, &str) -> bool) -> Duration {
        let start = Instant::now();
        loop {
            let (state, reason) = self.node();
            if ok(&state, &reason) {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < limit,
                "{what} within {limit:?}: state {state}, reason {reason:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        for c in self.children.iter_mut().rev() {
            // SAFETY: kill(2) on our own child.
            unsafe {
                libc::kill(c.id() as i32, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for c in self.children.iter_mut().rev() {
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A config in `dir` with the drain action on and `rules` (stock rule names or a directory).
fn config(slurm: &Slurm, dir: &Path, rules: &Path, resume_after: &str) -> PathBuf {
    let path = dir.join("config.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[daemon]
interval = "1s"
state_dir = "{state}"
rules = ["{rules}"]
hostname = "{NODE}.lab.example"

[actions.drain]
enabled = true
dry_run = false
scontrol = "{scontrol}"
resume = true
resume_after = "{resume_after}"
timeout = "10s"
"#,
            state = dir.join("state").display(),
            rules = rules.display(),
            scontrol = slurm.scontrol.display(),
        ),
    )
    .unwrap();
    path
}

fn daemon(slurm: &Slurm, scenario: &str, config: &Path, log: &Path, start_s: &str) -> Daemon {
    let conf = slurm.conf();
    crate::daemon::daemon(
        scenario,
        config,
        log,
        &[
            ("NVML_SIM_START_S", start_s),
            ("SLURM_CONF", conf.to_str().unwrap()),
            // (simulated GPUs drain only as a dry run without it)
            ("GPUWATCH_SIM_REAL_DRAIN", "1"),
        ],
    )
}

/// The decisions in a drain audit log, in order.
fn decisions(state: &Path) -> Vec<String> {
    common::audit_decisions(&state.join("drain-audit.jsonl"))
}

fn wait_decision(state: &Path, want: &str, limit: Duration, log: &Path) {
    let start = Instant::now();
    while !decisions(state).iter().any(|d| d == want) {
        assert!(
            start.elapsed() < limit,
            "no {want:?} in the drain audit log within {limit:?}: {:?}\n{}",
            decisions(state),
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn stop(mut d: Daemon) {
    d.signal(libc::SIGTERM);
    d.wait(Duration::from_secs(30));
}

#[test]
fn a_lost_gpu_drains_the_node_and_only_gpuwatchs_own_drain_is_resumed() {
    let Some(slurm) = Slurm::start() else {
        return;
    };
    let limit = Duration::from_secs(30);

    // 1. XID 79 on GPU 3, 3 s after start: drained with gpuwatch's reason.
    let tmp = tempfile::tempdir().unwrap();
    let rules = common::stock_rules(tmp.path(), &["xid_error", "gpu_lost"]);
    let cfg = config(&slurm, tmp.path(), &rules, "2s");
    let log = tmp.path().join("daemon.log");
    let d = daemon(&slurm, "xid-79", &cfg, &log, "27");
    let fault = Instant::now() + Duration::from_secs(3);
    slurm.wait_node(limit, "gpuwatch's drain", |s, r| {
        s.contains("DRAIN") && r.starts_with("gpuwatch: ")
    });
    let late = Instant::now().saturating_duration_since(fault);
    eprintln!("drained {late:?} after the fault (at most: the scenario starts after the spawn)");
    assert!(
        late <= Duration::from_secs(1 + 2 + 3),
        "the node was drained {late:?} after the fault: more than the interval + 2 s (+3 s slack)"
    );
    let (_, reason) = slurm.node();
    assert!(reason.contains("GPU 3"), "{reason}");
    assert!(
        reason.contains("xid_error") || reason.contains("gpu_lost"),
        "{reason}"
    );
    let state = tmp.path().join("state");
    wait_decision(&state, "drain", limit, &log);
    std::thread::sleep(Duration::from_secs(2));
    stop(d);
    assert_eq!(
        decisions(&state),
        ["drain"],
        "once per node (xid_error and gpu_lost)"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("Slurm node gpunode1 drained"), "{text}");
    // A restart while the GPU is still lost: the drain stays, though resume is on and 2 s is
    // long past (the condition is the engine's firing alert, and a lost GPU holds any resume).
    let d = daemon(&slurm, "xid-79", &cfg, &log, "60");
    std::thread::sleep(Duration::from_secs(6));
    stop(d);
    let (node_state, reason) = slurm.node();
    assert!(node_state.contains("DRAIN"), "{node_state}");
    assert!(reason.contains("GPU 3"), "{reason}");
    assert_eq!(
        decisions(&state),
        ["drain"],
        "no resume while GPU 3 is lost"
    );

    // 2. An admin's drain: left as it is, said once.
    slurm.resume();
    slurm.drain_as_admin("maintenance: fan 3 noisy");
    let tmp = tempfile::tempdir().unwrap();
    let rules = common::stock_rules(tmp.path(), &["xid_error", "gpu_lost"]);
    let cfg = config(&slurm, tmp.path(), &rules, "1s");
    let log = tmp.path().join("daemon.log");
    let d = daemon(&slurm, "xid-79", &cfg, &log, "28");
    let state = tmp.path().join("state");
    wait_decision(&state, "left_alone", limit, &log);
    std::thread::sleep(Duration::from_secs(2));
    stop(d);
    let (node_state, reason) = slurm.node();
    assert!(node_state.contains("DRAIN"), "{node_state}");
    assert!(reason.starts_with("maintenance: fan 3 noisy"), "{reason}");
    assert!(!decisions(&state).contains(&"drain".to_string()));

    // 3. A condition that clears: drained, then resumed after resume_after, the node clean.
    slurm.resume();
    let tmp = tempfile::tempdir().unwrap();
    let rules = hot_rule(tmp.path(), "drain");
    let scenario = hot_scenario(tmp.path(), 2, 8);
    let cfg = config(&slurm, tmp.path(), &rules, "2s");
    let log = tmp.path().join("daemon.log");
    let d = daemon(&slurm, scenario.to_str().unwrap(), &cfg, &log, "0");
    slurm.wait_node(limit, "gpuwatch's drain", |s, r| {
        s.contains("DRAIN") && r.starts_with("gpuwatch: hot_gpu GPU 0")
    });
    slurm.wait_node(limit, "the resume", |s, _| !s.contains("DRAIN"));
    let state = tmp.path().join("state");
    wait_decision(&state, "resume", limit, &log);
    stop(d);
    assert_eq!(decisions(&state), ["drain", "resume"]);
    let (node_state, reason) = slurm.node();
    assert!(
        !node_state.contains("DRAIN") && reason.is_empty(),
        "scontrol show node is clean: {node_state} {reason:?}"
    );

    // 4. An admin re-drains the node while gpuwatch's condition holds: never resumed.
    let tmp = tempfile::tempdir().unwrap();
    let rules = hot_rule(tmp.path(), "drain");
    let scenario = hot_scenario(tmp.path(), 2, 12);
    let cfg = config(&slurm, tmp.path(), &rules, "1s");
    let log = tmp.path().join("daemon.log");
    let d = daemon(&slurm, scenario.to_str().unwrap(), &cfg, &log, "0");
    slurm.wait_node(limit, "gpuwatch's drain", |s, r| {
        s.contains("DRAIN") && r.starts_with("gpuwatch: ")
    });
    slurm.drain_as_admin("admin: keep drained, RMA");
    let state = tmp.path().join("state");
    wait_decision(&state, "left_alone", limit, &log);
    stop(d);
    let (node_state, reason) = slurm.node();
    assert!(node_state.contains("DRAIN"), "{node_state}");
    assert!(reason.starts_with("admin: keep drained, RMA"), "{reason}");
    assert!(!decisions(&state).contains(&"resume".to_string()));

    // 5. `doctor --slurm` as HealthCheckProgram: a lost GPU drains the node with doctor's
    // finding, a fit node is resumed when the drain was doctor's, an admin's drain never is.
    slurm.resume();
    let tmp = tempfile::tempdir().unwrap();
    let rules = common::stock_rules(tmp.path(), &["gpu_lost"]);
    let cfg = config(&slurm, tmp.path(), &rules, "1s");
    let doctor = |scenario: &str| {
        let started = Instant::now();
        let run = common::sim(
            scenario,
            &["doctor", "--slurm", "--config", cfg.to_str().unwrap()],
            &[
                ("NVML_SIM_START_S", "40"),
                ("SLURM_CONF", slurm.conf().to_str().unwrap()),
                ("GPUWATCH_SIM_REAL_DRAIN", "1"),
            ],
        );
        eprintln!("doctor --slurm on {scenario}: {:?}", started.elapsed());
        run
    };
    let sick = doctor("xid-79");
    assert_eq!(sick.code, 1, "{}{}", sick.stdout, sick.stderr);
    assert!(sick.stdout.contains("is unfit"), "{}", sick.stdout);
    assert!(
        sick.stderr.contains("node gpunode1 drained"),
        "{}",
        sick.stderr
    );
    let (node_state, reason) = slurm.node();
    assert!(node_state.contains("DRAIN"), "{node_state}");
    assert!(reason.starts_with("gpuwatch: doctor GPU 3"), "{reason}");
    let fit = doctor("healthy");
    assert_eq!(fit.code, 0, "{}{}", fit.stdout, fit.stderr);
    assert!(fit.stdout.contains("resumed"), "{}", fit.stdout);
    assert!(!slurm.node().0.contains("DRAIN"));
    slurm.drain_as_admin("admin: PSU swap");
    let fit = doctor("healthy");
    assert_eq!(fit.code, 0);
    assert!(fit.stdout.contains("not resumed"), "{}", fit.stdout);
    let sick = doctor("xid-79");
    assert_eq!(sick.code, 1);
    assert!(sick.stderr.contains("someone else"), "{}", sick.stderr);
    assert!(slurm.node().1.starts_with("admin: PSU swap"));

    // 6. `slurm prolog`: a job on healthy GPUs (or none) starts; a job given the lost GPU is
    // refused and the node drained with the job and the finding.
    slurm.resume();
    let conf = slurm.conf();
    let prolog = |gpus: Option<&str>| {
        let mut env = vec![
            ("NVML_SIM_START_S", "40"),
            ("SLURM_CONF", conf.to_str().unwrap()),
            ("SLURM_JOB_ID", "4242"),
            ("GPUWATCH_SIM_REAL_DRAIN", "1"),
        ];
        if let Some(g) = gpus {
            env.push(("SLURM_JOB_GPUS", g));
        }
        common::sim(
            "xid-79",
            &["slurm", "prolog", "--config", cfg.to_str().unwrap()],
            &env,
        )
    };
    assert_eq!(prolog(None).code, 0, "a job without GPUs");
    let ok = prolog(Some("0,1"));
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    assert!(!slurm.node().0.contains("DRAIN"));
    let refused = prolog(Some("2,3"));
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("job 4242 refused"),
        "{}",
        refused.stderr
    );
    let (node_state, reason) = slurm.node();
    assert!(node_state.contains("DRAIN"), "{node_state}");
    assert!(
        reason.starts_with("gpuwatch: prolog job 4242 GPU 3"),
        "{reason}"
    );

    // 7. Simulated GPUs never drain a real node by default: a dry run that says so.
    slurm.resume();
    let sim = common::sim(
        "xid-79",
        &["doctor", "--slurm", "--config", cfg.to_str().unwrap()],
        &[
            ("NVML_SIM_START_S", "40"),
            ("SLURM_CONF", conf.to_str().unwrap()),
        ],
    );
    assert_eq!(sim.code, 1);
    assert!(
        sim.stderr.contains("dry run: would drain"),
        "{}",
        sim.stderr
    );
    assert!(!slurm.node().0.contains("DRAIN"));
}

/// A rule that asks for `action` (a drain, a taint) while GPU 0 is above 80 °C.
pub(crate) fn hot_rule(dir: &Path, action: &str) -> PathBuf {
    let rules = dir.join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::write(
        rules.join("hot_gpu.rhai"),
        r#"rule(#{
    name: "hot_gpu",
    severity: "critical",
    action: "ACTION",
    check: |gpu| {
        let t = gpu.temp.last();
        if gpu.index == 0 && t != () && t > 80 { `GPU 0 at ${fmt(t, 0)} °C` }
    },
});
"#
        .replace("ACTION", action),
    )
    .unwrap();
    rules
}

/// 8 GPUs at 60 °C, 90 °C from `from_s` to `to_s`.
pub(crate) fn hot_scenario(dir: &Path, from_s: u32, to_s: u32) -> PathBuf {
    let path = dir.join("hot.toml");
    std::fs::write(
        &path,
        format!(
            r#"name = "hot"
description = "90 °C from {from_s} s to {to_s} s"

[devices]
count = 8
name = "NVIDIA H100 80GB HBM3"
memory_total_mib = 81559
power_limit_w = 700

[devices.metrics]
gpu_util_pct = 95
temperature_c = {{ type = "steps", points = [[0, 60], [{from_s}, 90], [{to_s}, 60]] }}
"#
        ),
    )
    .unwrap();
    path
}

/// A daemon on `gpus` simulated GPUs at 95 % with the process `pid` on GPU 0 (30000 MiB), the
/// rule `busy_gpu` (info, a GPU with processes) and `rules` (file name, source) beside it, every
/// alert to a webhook at once, `/metrics` on a free port and `config` appended to its config.
pub(crate) struct WatchedProcess {
    pub daemon: Daemon,
    pub hook: crate::notify::servers::HttpReceiver,
    pub port: u16,
    pub log: PathBuf,
}

impl WatchedProcess {
    /// The scenario: `gpus` GPUs at 95 %, `pid` on GPU 0.
    pub fn scenario(dir: &Path, pid: u32, gpus: u32) -> PathBuf {
        let scenario = dir.join("watched.toml");
        std::fs::write(
            &scenario,
            format!(
                r#"name = "watched"
description = "a process on GPU 0"

[devices]
count = {gpus}
name = "NVIDIA H100 80GB HBM3"
memory_total_mib = 81559

[devices.metrics]
gpu_util_pct = 95
temperature_c = 60

[[process]]
gpu = 0
pid = {pid}
used_memory_mib = 30000
"#
            ),
        )
        .unwrap();
        scenario
    }

    /// Starts the daemon on `scenario` ([`WatchedProcess::scenario`]).
    pub fn start(
        dir: &Path,
        scenario: &Path,
        rules: &[(&str, &str)],
        config: &str,
    ) -> WatchedProcess {
        let rule_dir = dir.join("rules");
        std::fs::create_dir_all(&rule_dir).unwrap();
        std::fs::write(
            rule_dir.join("busy_gpu.rhai"),
            "rule(#{ name: \"busy_gpu\", severity: \"info\", check: |gpu| { if gpu.process_count > 0 { `GPU ${gpu.index} busy` } } });\n",
        )
        .unwrap();
        for (name, source) in rules {
            std::fs::write(rule_dir.join(name), source).unwrap();
        }
        let hook = crate::notify::servers::HttpReceiver::start();
        let port = free_port();
        let cfg = dir.join("config.toml");
        std::fs::write(
            &cfg,
            format!(
                r#"[daemon]
interval = "1s"
state_dir = "{state}"
rules = ["{rules}"]

[exporter]
listen = "127.0.0.1:{port}"

[[channel]]
name = "ops"
type = "webhook"
url = "{url}"

[[route]]
severity = ["info", "warning", "critical"]
channels = ["ops"]
group_wait = "0s"

{config}
"#,
                state = dir.join("state").display(),
                rules = rule_dir.display(),
                url = hook.url("/hook"),
            ),
        )
        .unwrap();
        let log = dir.join("log");
        let daemon = crate::daemon::daemon(scenario.to_str().unwrap(), &cfg, &log, &[]);
        WatchedProcess {
            daemon,
            hook,
            port,
            log,
        }
    }
}

/// The processes of a Slurm job (found by their cgroup) name it: `hpc_job="77"` on the DCGM
/// series of their GPU on `/metrics` (not on the other GPUs'), and on the alerts about that GPU.
#[test]
fn a_slurm_jobs_gpu_carries_hpc_job_on_metrics_and_alerts() {
    use crate::notify::servers::wait_until;
    // a cgroup shaped as Slurm makes a job step's (`…slurm…/job_77/step_0`)
    let Some(step) = common::InCgroup::start("gwtest_slurm", "job_77/step_0") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let scenario = WatchedProcess::scenario(tmp.path(), step.child.id(), 2);
    let watched = WatchedProcess::start(tmp.path(), &scenario, &[], "");
    let (port, hook) = (watched.port, &watched.hook);
    let page = wait_until(Duration::from_secs(30), "hpc_job on /metrics", || {
        crate::exporter::get(port, "/metrics", "text/plain")
            .map(|r| r.2)
            .filter(|p| p.contains("hpc_job"))
    });
    let util: Vec<&str> = page
        .lines()
        .filter(|l| l.starts_with("DCGM_FI_DEV_GPU_UTIL{"))
        .collect();
    assert!(
        util.iter()
            .any(|l| l.contains("gpu=\"0\"") && l.contains(",hpc_job=\"77\"}")),
        "{util:?}"
    );
    assert!(
        util.iter()
            .any(|l| l.contains("gpu=\"1\"") && !l.contains("hpc_job")),
        "{util:?}"
    );
    let sent = hook.wait_accepted(1, Duration::from_secs(30));
    assert!(
        sent[0].body.contains("\"hpc_job\":\"77\""),
        "{}",
        sent[0].body
    );
    stop(watched.daemon);
}

/// The epilog's summary: an `sbatch` job on one of the node's two GPUs (GRES) ends, and the
/// Epilog (`gpuwatch slurm epilog`) writes its GPU summary from the daemon's recording into the
/// job's working directory and `state_dir/jobs/`; `gpuwatch job` prints it later.
#[test]
fn an_sbatch_jobs_epilog_writes_its_gpu_summary() {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("config.toml");
    let Some(slurm) = Slurm::start_with(Some(&config_path)) else {
        return;
    };
    let state = dir.path().join("state");
    // the drain action's config (nothing drains on healthy GPUs), recording every tick
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules");
    assert_eq!(config(&slurm, dir.path(), &rules, "1m"), config_path);
    let smtp = crate::notify::servers::SmtpServer::start(&dir.path().join("mail"), None);
    let mut text = std::fs::read_to_string(&config_path).unwrap();
    text.push_str("\n[recording]\nenabled = true\n");
    // the e-mail channel the epilog mails a job's user through (its server and sender)
    text.push_str(&format!(
        "\n[[channel]]\nname = \"mail\"\ntype = \"email\"\nsmtp = \"127.0.0.1:{}\"\ntls = \"none\"\nfrom = \"gpuwatch@lab.example\"\nto = [\"oncall@lab.example\"]\n",
        smtp.port
    ));
    std::fs::write(&config_path, text).unwrap();
    let config = config_path;
    let log = dir.path().join("daemon.log");
    let d = daemon(&slurm, "healthy", &config, &log, "0");
    let recording = state.join("recording/metrics.csv");
    let start = Instant::now();
    while std::fs::read_to_string(&recording)
        .unwrap_or_default()
        .lines()
        .count()
        < 1 + 2 * 8
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the daemon did not record:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let sbatch = common::installed(&["sbatch"]).expect("sbatch (slurm-client)");
    let out = Command::new(sbatch)
        .args(["--parsable", "--gres=gpu:1", "--wrap", "sleep 3", "-o"])
        .arg(work.join("out.txt"))
        .arg("-D")
        .arg(&work)
        .env("SLURM_CONF", slurm.conf())
        .output()
        .unwrap();
    let job = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        out.status.success() && !job.is_empty(),
        "sbatch: {}{}",
        job,
        String::from_utf8_lossy(&out.stderr)
    );
    let file = work.join(format!("gpuwatch-job-{job}.txt"));
    let start = Instant::now();
    while !file.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no {} within 60 s; epilog log:\n{}\n{}",
            file.display(),
            std::fs::read_to_string(slurm.dir.path().join("log/epilog.log")).unwrap_or_default(),
            slurm.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let text = std::fs::read_to_string(&file).unwrap();
    eprintln!("{text}");
    assert!(
        text.starts_with(&format!(
            "gpuwatch: job {job} of root on {NODE}, GPU 0 (SLURM_JOB_GPUS)"
        )),
        "{text}"
    );
    assert!(text.contains("  GPU 0: utilization mean"), "{text}");
    assert!(!text.contains("  GPU 1:"), "only the job's GPU: {text}");
    assert!(text.contains("diagnosis:"), "{text}");
    // the saved summary, and `gpuwatch job` printing it later
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.join(format!("jobs/{job}.json"))).unwrap())
            .unwrap();
    assert_eq!(saved["gpus"], serde_json::json!([0]));
    assert!(saved["run"]["gpus"][0]["util"]["mean"].as_f64().unwrap() > 50.0);
    let later = common::gpuwatch(&["job", &job, "--config", config.to_str().unwrap()], &[]);
    assert_eq!(later.code, 0, "{}", later.stderr);
    assert_eq!(later.stdout, text);
    // The work-directory copy is written as the job's user, never through what the user left
    // there: a job of `nobody` gets a file owned by nobody; a link in its place is refused and
    // what it points to is left alone.
    let users_dir = dir.path().join("nobody-work");
    std::fs::create_dir(&users_dir).unwrap();
    std::os::unix::fs::chown(&users_dir, Some(65534), Some(65534)).unwrap();
    let start = (std::time::SystemTime::now() - Duration::from_secs(3))
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string();
    let by_hand = |id: &str| {
        common::gpuwatch(
            &[
                "slurm",
                "epilog",
                "--config",
                config.to_str().unwrap(),
                "--mail-domain",
                "lab.example",
            ],
            &[
                ("SLURM_JOB_ID", id),
                ("SLURM_JOB_GPUS", "1"),
                ("SLURM_JOB_UID", "65534"),
                ("SLURM_JOB_GID", "65534"),
                ("SLURM_JOB_USER", "nobody"),
                ("SLURM_JOB_START_TIME", &start),
                ("SLURM_JOB_WORK_DIR", users_dir.to_str().unwrap()),
                ("SLURM_CONF", slurm.conf().to_str().unwrap()),
            ],
        )
    };
    let run = by_hand("90001");
    assert_eq!(run.code, 0, "{}", run.stderr);
    let written = users_dir.join("gpuwatch-job-90001.txt");
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(&written).unwrap_or_else(|e| panic!("{e}: {}", run.stderr));
    assert_eq!((meta.uid(), meta.mode() & 0o777), (65534, 0o600));
    let text = std::fs::read_to_string(&written).unwrap();
    assert!(
        text.starts_with("gpuwatch: job 90001 of nobody on gpunode1, GPU 1 (SLURM_JOB_GPUS)"),
        "{text}"
    );
    // and mailed to the job's user
    let mails = smtp.wait_messages(1, Duration::from_secs(20));
    assert_eq!(
        mails[0]["rcpt_tos"][0], "nobody@lab.example",
        "{:?}",
        mails[0]
    );
    let mail = crate::notify::servers::unfold_email(mails[0]["data"].as_str().unwrap());
    assert!(
        mail.contains("Subject: GPU summary of job 90001 on gpunode1"),
        "{mail}"
    );
    assert!(mail.contains("GPU 1: utilization mean"), "{mail}");
    let precious = dir.path().join("precious");
    std::fs::write(&precious, "root's").unwrap();
    std::os::unix::fs::symlink(&precious, users_dir.join("gpuwatch-job-90002.txt")).unwrap();
    let run = by_hand("90002");
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr.contains("gpuwatch-job-90002.txt"),
        "{}",
        run.stderr
    );
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "root's");
    // AdminComment goes through the accounting database (sacctmgr): this cluster has none, so
    // the epilog says why it could not, and still exits 0 (a failing epilog drains the node)
    let again = common::gpuwatch(
        &[
            "slurm",
            "epilog",
            "--config",
            config.to_str().unwrap(),
            "--to",
            "admin-comment",
        ],
        &[
            ("SLURM_JOB_ID", job.as_str()),
            ("SLURM_JOB_GPUS", "0"),
            ("SLURM_CONF", slurm.conf().to_str().unwrap()),
        ],
    );
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert!(
        again
            .stderr
            .contains(&format!("job {job}: AdminComment: `"))
            && again.stderr.contains("sacctmgr -i modify job where JobID="),
        "{}",
        again.stderr
    );
    stop(d);
}
