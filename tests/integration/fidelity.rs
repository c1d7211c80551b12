//! Fidelity: `gpustat --json` and `nvitop --once` (real Python NVML clients, pip-installed into a
//! private virtualenv by `.ci/run`) read the simulated library through `LD_LIBRARY_PATH` and a
//! `libnvidia-ml.so.1` link, and must report the same GPU names, memory, utilization and process
//! PIDs as `gpuwatch status --json` for the same scenario.
//!
//! The peers are found in `$GPUWATCH_PEERS` (a virtualenv directory) or `<repo>/.venv-ci`. When
//! they are missing the test prints SKIP, except under `CI=true`, where it fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::common::{self, sim_lib};

const MIB: u64 = 1_048_576;

fn peers() -> Option<PathBuf> {
    let dir = std::env::var_os("GPUWATCH_PEERS").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-ci"),
        PathBuf::from,
    );
    let ok = ["gpustat", "nvitop"]
        .iter()
        .all(|b| dir.join("bin").join(b).exists());
    if ok {
        return Some(dir);
    }
    let msg = format!(
        "SKIP fidelity: gpustat/nvitop not found in {} (run `bash .ci/run` or set GPUWATCH_PEERS to a virtualenv with nvidia-ml-py gpustat nvitop)",
        dir.display()
    );
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}");
    eprintln!("{msg}");
    None
}

/// A directory holding `libnvidia-ml.so.1` → the simulated library.
fn lib_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(sim_lib(), dir.path().join("libnvidia-ml.so.1")).expect("symlink");
    dir
}

/// Scenario clock settings shared by gpuwatch and the peers: frozen at `start_s` so every
/// process sees the same values.
fn frozen(start_s: &str) -> [(&'static str, &str); 2] {
    [("NVML_SIM_TIME_SCALE", "0"), ("NVML_SIM_START_S", start_s)]
}

fn run_peer(
    peers: &Path,
    lib: &Path,
    scenario: &str,
    clock: &[(&str, &str)],
    args: &[&str],
) -> String {
    let (bin, rest) = args.split_first().expect("a program");
    let mut cmd = Command::new(peers.join("bin").join(bin));
    cmd.args(rest)
        .env("LD_LIBRARY_PATH", lib)
        .env("NVML_SIM_SCENARIO", scenario)
        .env_remove("NVML_SIM_TIME_SCALE")
        .env_remove("NVML_SIM_START_S")
        .env_remove("NVML_SIM_CONTROL")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env("COLUMNS", "160")
        .env("TERM", "dumb");
    for (k, v) in clock {
        cmd.env(k, v);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {bin}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{bin} failed:\n{stdout}\n{stderr}");
    stdout
}

/// A scenario with constant values, and processes at real PIDs (this test process and init) so
/// that psutil in gpustat and nvitop can resolve them.
fn constant_scenario(dir: &Path) -> String {
    let me = std::process::id();
    let text = format!(
        r#"name = "fidelity"
description = "constant values, for comparing NVML clients"

[devices]
count = 4
name = "NVIDIA H100 80GB HBM3"
memory_total_mib = 81559

[devices.metrics]
gpu_util_pct = 87
mem_util_pct = 41
memory_used_mib = 60000
temperature_c = 61
power_w = 450

[[device]]
index = 2
name = "NVIDIA A100-SXM4-40GB"
memory_total_mib = 40960

[device.metrics]
gpu_util_pct = 12
memory_used_mib = 1234

[[process]]
gpu = 0
pid = {me}
used_memory_mib = 30000

[[process]]
gpu = 2
pid = 1
used_memory_mib = 1000
"#
    );
    let path = dir.join("fidelity.toml");
    std::fs::write(&path, text).expect("write scenario");
    path.display().to_string()
}

struct Ours {
    lost: bool,
    name: String,
    pci_bus_id: String,
    used_mib: u64,
    total_mib: u64,
    util: u64,
    pids: Vec<u64>,
}

fn ours(scenario: &str, clock: &[(&str, &str)]) -> Vec<Ours> {
    let doc = common::sim(scenario, &["status", "--json"], clock).json();
    doc["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|g| {
            let mut pids: Vec<u64> = g["processes"]
                .as_array()
                .expect("processes")
                .iter()
                .filter_map(|p| p["pid"].as_u64())
                .collect();
            pids.sort_unstable();
            Ours {
                lost: g["state"] == "lost",
                name: g["name"].as_str().unwrap_or_default().to_string(),
                pci_bus_id: g["pci_bus_id"].as_str().unwrap_or_default().to_string(),
                used_mib: g["metrics"]["mem_used"].as_u64().unwrap_or(0) / MIB,
                total_mib: g["metrics"]["mem_total"].as_u64().unwrap_or(0) / MIB,
                util: g["metrics"]["util"].as_u64().unwrap_or(999),
                pids,
            }
        })
        .collect()
}

fn compare_gpustat(
    peers: &Path,
    lib: &Path,
    scenario: &str,
    clock: &[(&str, &str)],
    ours: &[Ours],
) {
    let out = run_peer(peers, lib, scenario, clock, &["gpustat", "--json"]);
    let doc: Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("gpustat JSON: {e}\n{out}"));
    let theirs = doc["gpus"].as_array().expect("gpustat gpus");
    assert_eq!(theirs.len(), ours.len(), "GPU count");
    for (t, o) in theirs.iter().zip(ours) {
        if o.lost {
            let name = t["name"].as_str().unwrap_or_default().to_ascii_lowercase();
            assert!(
                name.contains("lost"),
                "{scenario}: gpustat should see the lost GPU: {t}"
            );
            continue;
        }
        assert_eq!(t["name"].as_str(), Some(o.name.as_str()), "{scenario}");
        let total = t["memory.total"].as_u64();
        assert_eq!(total, Some(o.total_mib), "{scenario}: memory.total of {t}");
        let used = t["memory.used"].as_u64();
        assert_eq!(used, Some(o.used_mib), "{scenario}: memory.used of {t}");
        let util = t["utilization.gpu"].as_u64();
        assert_eq!(util, Some(o.util), "{scenario}: utilization of {t}");
        let mut pids: Vec<u64> = t["processes"]
            .as_array()
            .map(|ps| ps.iter().filter_map(|p| p["pid"].as_u64()).collect())
            .unwrap_or_default();
        pids.sort_unstable();
        // gpustat lists the processes psutil finds: those `/proc` shows (a training job's
        // ranks at PIDs no host process has are left out)
        let shown: Vec<u64> = o
            .pids
            .iter()
            .copied()
            .filter(|p| Path::new(&format!("/proc/{p}")).exists())
            .collect();
        assert_eq!(pids, shown, "{scenario}: process PIDs of {t}");
    }
}

/// Parses a human memory amount as nvitop prints it (`58.59GiB`, `1234MiB`) into MiB.
fn human_mib(s: &str) -> Option<f64> {
    let s = s.trim();
    let split = s.find(|c: char| c.is_ascii_alphabetic())?;
    let (n, unit) = s.split_at(split);
    let n: f64 = n.trim().parse().ok()?;
    Some(match unit {
        "B" => n / MIB as f64,
        "KiB" => n / 1024.0,
        "MiB" => n,
        "GiB" => n * 1024.0,
        "TiB" => n * 1024.0 * 1024.0,
        _ => return None,
    })
}

fn compare_nvitop(peers: &Path, lib: &Path, scenario: &str, clock: &[(&str, &str)], ours: &[Ours]) {
    let out = run_peer(peers, lib, scenario, clock, &["nvitop", "--once"]);
    // Every GPU's bus id appears, in order; the next line holds "used / total" memory and util.
    let lines: Vec<&str> = out.lines().collect();
    let mut found = 0;
    for o in ours {
        if o.lost {
            assert!(
                out.contains("GPU is Lost"),
                "{scenario}: nvitop should show the lost GPU:\n{out}"
            );
            found += 1;
            continue;
        }
        let short = o.pci_bus_id.trim_start_matches('0');
        let i = lines
            .iter()
            .position(|l| l.contains(&o.pci_bus_id) || (!short.is_empty() && l.contains(short)))
            .unwrap_or_else(|| panic!("nvitop does not show {}:\n{out}", o.pci_bus_id));
        let name_shown = lines[i]
            .split('│')
            .nth(1)
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .collect::<Vec<_>>()
            .join(" ");
        let words: Vec<&str> = name_shown
            .split_whitespace()
            .filter(|w| *w != "On" && *w != "Off")
            .collect();
        assert!(
            words
                .iter()
                .all(|w| o.name.contains(w.trim_end_matches('…'))),
            "name {:?} vs nvitop {name_shown:?}",
            o.name
        );
        let mem_line = lines[i + 1];
        let cell = mem_line
            .split('│')
            .find(|c| c.contains(" / ") && c.contains("iB"))
            .unwrap_or_else(|| panic!("no memory cell in {mem_line:?}"));
        let (used, total) = cell.split_once(" / ").expect("used / total");
        let used = human_mib(used).expect("used");
        let total = human_mib(total).expect("total");
        assert!(
            (used - o.used_mib as f64).abs() <= used * 0.01 + 1.0,
            "used {used} vs {}",
            o.used_mib
        );
        assert!(
            (total - o.total_mib as f64).abs() <= total * 0.01 + 1.0,
            "total {total} vs {}",
            o.total_mib
        );
        let util = mem_line
            .split_whitespace()
            .filter_map(|w| w.strip_suffix('%'))
            .filter_map(|w| w.parse::<u64>().ok())
            .next_back();
        assert_eq!(util, Some(o.util), "utilization in {mem_line:?}");
        found += 1;
    }
    assert_eq!(found, ours.len());
    for o in ours {
        for pid in &o.pids {
            assert!(
                out.lines()
                    .any(|l| l.split_whitespace().any(|w| w == pid.to_string())),
                "nvitop does not list PID {pid}:\n{out}"
            );
        }
    }
}

#[test]
fn gpustat_and_nvitop_agree_with_status_json() {
    let Some(peers) = peers() else { return };
    let lib = lib_dir();
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario = constant_scenario(dir.path());
    let o = ours(&scenario, &[]);
    assert_eq!(o.len(), 4);
    assert!(o[0].pids.contains(&u64::from(std::process::id())));
    compare_gpustat(&peers, lib.path(), &scenario, &[], &o);
    compare_nvitop(&peers, lib.path(), &scenario, &[], &o);
}

/// Every shipped scenario, frozen at an interesting moment, its training job made the client's
/// parent (this test process: shipped, the ranks have PIDs no host process has, which gpustat
/// and nvitop, listing what psutil finds, would leave out) so that the PIDs are compared too.
#[test]
fn gpustat_and_nvitop_agree_on_shipped_scenarios() {
    let Some(peers) = peers() else { return };
    let lib = lib_dir();
    let moments = [
        ("healthy", "10"),
        ("dataloader-stall", "2.5"),
        ("memory-leak", "600"),
        ("oom", "50"),
        ("small-batch", "10"),
        ("thermal-throttle", "120"),
        ("power-anomaly", "22"),
        ("ecc-errors", "130"),
        ("xid-79", "40"),
        ("nccl-hang", "90"),
        ("overnight", "700"),
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, at) in moments {
        let clock = frozen(at);
        let own = common::scenario_with_parent(name, dir.path());
        let scenario = own.to_str().expect("utf-8");
        let o = ours(scenario, &clock);
        assert!(
            o.iter()
                .filter(|g| !g.lost)
                .all(|g| g.pids == [u64::from(std::process::id())]),
            "{name}"
        );
        compare_gpustat(&peers, lib.path(), scenario, &clock, &o);
        if ["healthy", "overnight"].contains(&name) {
            compare_nvitop(&peers, lib.path(), scenario, &clock, &o);
        }
    }
}

/// gpustat and nvitop on the `mig` scenario (an A100 split 7 × 1g.10gb, an H100 split 3g.40gb +
/// 2g.20gb + 1g.10gb, an H100 with MIG off): both list the three GPUs without crashing — no
/// utilization on the GPUs with MIG on, as on real drivers — and nvitop lists every MIG device
/// under its GPU with its GPU and compute instance, memory and BAR1 (nvitop 1.x failed on a MIG
/// device whose BAR1 nvml-sim did not answer), and the processes on them.
#[test]
fn gpustat_and_nvitop_list_mig_devices() {
    let Some(peers) = peers() else { return };
    let lib = lib_dir();
    let clock = frozen("100");
    let status = common::sim("mig", &["status", "--json"], &clock).json();
    let o = ours("mig", &clock);
    assert_eq!(o.len(), 3);

    let out = run_peer(&peers, lib.path(), "mig", &clock, &["gpustat", "--json"]);
    let doc: Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("gpustat JSON: {e}\n{out}"));
    let theirs = doc["gpus"].as_array().expect("gpustat gpus");
    assert_eq!(theirs.len(), 3, "{out}");
    for (i, (t, g)) in theirs.iter().zip(&o).enumerate() {
        assert_eq!(t["name"].as_str(), Some(g.name.as_str()), "{t}");
        assert_eq!(t["memory.total"].as_u64(), Some(g.total_mib), "{t}");
        assert_eq!(t["memory.used"].as_u64(), Some(g.used_mib), "{t}");
        if i < 2 {
            assert_eq!(t["utilization.gpu"], Value::Null, "MIG on: {t}");
        } else {
            assert_eq!(t["utilization.gpu"].as_u64(), Some(g.util), "{t}");
        }
        // gpustat lists the processes psutil finds: none (no PID of the scenario is a host
        // process), where gpuwatch lists every one NVML reports
        let pids: Vec<u64> = t["processes"]
            .as_array()
            .map(|ps| ps.iter().filter_map(|p| p["pid"].as_u64()).collect())
            .unwrap_or_default();
        assert_eq!(pids, [0_u64; 0], "{t}");
        assert!(!g.pids.is_empty(), "{t}");
    }

    let out = run_peer(&peers, lib.path(), "mig", &clock, &["nvitop", "--once"]);
    // the GPU with MIG off as in the other scenarios
    compare_nvitop(&peers, lib.path(), "mig", &clock, &o[2..]);
    let lines: Vec<&str> = out.lines().collect();
    for (gpu, g) in status["gpus"].as_array().expect("gpus").iter().enumerate() {
        let bus = g["pci_bus_id"].as_str().expect("bus id");
        assert!(out.contains(bus), "nvitop does not show {bus}:\n{out}");
        for (k, m) in g["mig"].as_array().expect("mig").iter().enumerate() {
            // `│ 0:3      1g.10gb @ GI/CI:10/0 │   4525MiB /  9728MiB │ BAR1:  4.00MiB /  0% │`
            let head = format!("│ {gpu}:{k} ");
            let line = lines
                .iter()
                .find(|l| l.starts_with(&head))
                .unwrap_or_else(|| panic!("nvitop does not list MIG device {gpu}:{k}:\n{out}"));
            let cells: Vec<&str> = line.split('│').collect();
            let profile = m["profile"].as_str().expect("profile");
            let id = |key: &str| m[key].as_u64().expect("an id");
            let ids = format!(
                "{profile} @ GI/CI:{:>2}/{}",
                id("gpu_instance_id"),
                id("compute_instance_id")
            );
            assert!(cells[1].contains(&ids), "{ids:?} in {line}");
            let (used, total) = cells[2].split_once(" / ").expect("used / total");
            let (used, total) = (
                human_mib(used).expect("used"),
                human_mib(total).expect("total"),
            );
            let want = |key: &str| m[key].as_u64().expect("bytes") as f64 / MIB as f64;
            assert!(
                (used - want("memory_used_bytes")).abs() <= used * 0.01 + 1.0,
                "{line}"
            );
            assert!(
                (total - want("memory_total_bytes")).abs() <= total * 0.01 + 1.0,
                "{line}"
            );
            assert!(cells[3].contains("BAR1:"), "{line}");
            // the processes on it, `GPU:MIG PID`
            for pid in m["processes"].as_array().expect("pids") {
                let tag = format!("{gpu}:{k}");
                assert!(
                    lines.iter().any(|l| {
                        let mut w = l.trim_start_matches('│').split_whitespace();
                        w.next() == Some(tag.as_str()) && w.next() == Some(&pid.to_string())
                    }),
                    "nvitop does not list PID {pid} on {tag}:\n{out}"
                );
            }
        }
    }
    let mig_rows = lines.iter().filter(|l| l.contains(" @ GI/CI:")).count();
    assert_eq!(mig_rows, 10, "7 + 3 MIG devices:\n{out}");
}
