//! `bench/real-gpu.sh --sim` (issue 12 §5) runs in CI against nvml-sim with the binaries the
//! test build already made, so the script for the day a real GPU is at hand cannot rot.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common;

/// `examples/nvml_latency`, built next to the gpuwatch binary (`cargo test --test integration`
/// does not build examples).
fn latency_example() -> PathBuf {
    let dir = common::gpuwatch_exe().parent().unwrap();
    let exe = dir.join("examples/nvml_latency");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-q", "--example", "nvml_latency"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    assert!(cmd.status().unwrap().success(), "building nvml_latency");
    assert!(exe.exists(), "{}", exe.display());
    exe
}

#[test]
fn real_gpu_script_runs_against_the_simulator() {
    let tmp = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .arg(root.join("bench/real-gpu.sh"))
        .arg("--sim")
        .current_dir(root)
        .env("GPUWATCH_BIN", common::gpuwatch_exe())
        .env("NVML_SIM_LIB", common::sim_lib())
        .env("NVML_LATENCY_BIN", latency_example())
        .env("REAL_GPU_OUT", tmp.path())
        .env("REAL_GPU_RECORD_S", "3")
        .env_remove("NVML_SIM_SYSFS")
        .env_remove("NVML_SIM_HIDE")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("8 GPUs, driver 550.54.15, 0 missing"),
        "{text}"
    );
    // the simulated training job (no host PID: someone else's) holds every GPU
    assert!(text.contains("8 findings"), "{text}");
    assert!(
        text.contains("(an unknown user, python train.py)"),
        "{text}"
    );
    assert!(text.contains("skipped: nvidia-smi comparison"), "{text}");
    assert!(text.contains("0 out of tolerance"), "{text}");
    assert!(text.contains("skipped: PyTorch trace"), "{text}");
    // The latency table: a header and a row per call, with min/median/max.
    let table = std::fs::read_to_string(tmp.path().join("nvml-latency.txt")).unwrap();
    assert!(
        table.contains("FUNCTION") && table.contains("MEDIAN_US"),
        "{table}"
    );
    for f in [
        "nvmlDeviceGetFieldValues",
        "nvmlDeviceGetPcieThroughput(RX)",
        "nvmlDeviceGetComputeRunningProcesses_v3",
    ] {
        let row = table
            .lines()
            .find(|l| l.starts_with(f))
            .unwrap_or_else(|| panic!("{f} in {table}"));
        // min, median, max wall time and the CPU time of a call
        assert_eq!(row.split_whitespace().count(), 6, "{row}");
    }
    assert!(table.contains("CPU_US"), "{table}");
    // the minute a real H200 gave both tools stays within tolerance
    let real = std::fs::read_to_string(tmp.path().join("compare-real.txt")).unwrap();
    assert!(
        real.contains("NVIDIA-SMI") && real.contains(" 0 out of tolerance"),
        "{real}"
    );
    let (_, rows) =
        common::csv_rows(&std::fs::read_to_string(tmp.path().join("record.csv")).unwrap());
    assert!(rows.len() >= 8, "{} rows", rows.len());
}

#[test]
fn real_gpu_script_without_a_driver_says_so_and_exits_0() {
    if Path::new("/proc/driver/nvidia/version").exists() {
        return; // a GPU machine: the script would run for real
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .arg(root.join("bench/real-gpu.sh"))
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    if text.is_empty() {
        return; // the loader cache lists an NVIDIA library here
    }
    assert!(out.status.success());
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.starts_with("no NVIDIA driver found") && text.contains("--sim"),
        "{text}"
    );
}
