//! The wall time of every NVML call gpuwatch's sampler (and `doctor`) makes, per call: min,
//! median and max over N calls on one GPU. `bench/real-gpu.sh` runs it on a real driver to
//! replace the estimates in `../shared/docs/real-drivers.md` with measurements.
//!
//!     cargo run --release --example nvml_latency -- [--nvml-lib PATH] [--sim SCENARIO]
//!                                                   [--gpu N] [--calls 50]
//!
//! Prints one line per function (`FUNCTION  n  min_us  median_us  max_us`, or `not supported`).
//! An unsupported call is listed, not an error; no NVML at all exits 2.

use std::ffi::OsString;
use std::time::Instant;

use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, RetirementCause, TemperatureSensor,
};
use nvml_wrapper::{Device, Nvml};

use gpuwatch::model::{Source, METRICS};

struct Args {
    lib: Option<String>,
    sim: Option<String>,
    gpu: u32,
    calls: usize,
}

fn args() -> Result<Args, String> {
    let mut out = Args {
        lib: std::env::var("GPUWATCH_NVML_LIB").ok(),
        sim: None,
        gpu: 0,
        calls: 50,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--nvml-lib" => out.lib = Some(value()?),
            "--sim" => out.sim = Some(value()?),
            "--gpu" => out.gpu = value()?.parse().map_err(|e| format!("--gpu: {e}"))?,
            "--calls" => out.calls = value()?.parse().map_err(|e| format!("--calls: {e}"))?,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(out)
}

/// Times `f` `n` times: (min, median, max) in µs, or `None` when the first call fails.
fn time<T, E>(n: usize, mut f: impl FnMut() -> Result<T, E>) -> Option<(f64, f64, f64)> {
    let mut us = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
        let t = Instant::now();
        let ok = f().is_ok();
        let el = t.elapsed().as_secs_f64() * 1e6;
        if !ok {
            return None;
        }
        us.push(el);
    }
    us.sort_by(f64::total_cmp);
    Some((us[0], us[us.len() / 2], us[us.len() - 1]))
}

fn row(name: &str, n: usize, r: Option<(f64, f64, f64)>) {
    match r {
        Some((min, med, max)) => {
            println!("{name:<48} {n:>4} {min:>10.1} {med:>10.1} {max:>10.1}");
        }
        None => println!("{name:<48} {n:>4} not supported"),
    }
}

/// Every per-device call, with the NVML symbol it makes.
fn device_calls(nvml: &Nvml, dev: &Device<'_>, gpu: u32, n: usize) {
    let fields: Vec<nvml_wrapper::structs::device::FieldId> = METRICS
        .iter()
        .filter_map(|m| match m.source {
            Source::Field(f) => Some(nvml_wrapper::structs::device::FieldId(f.field.id)),
            _ => None,
        })
        .collect();
    row(
        "nvmlDeviceGetHandleByIndex_v2",
        n,
        time(n, || nvml.device_by_index(gpu)),
    );
    row("nvmlDeviceGetUUID", n, time(n, || dev.uuid()));
    row("nvmlDeviceGetName", n, time(n, || dev.name()));
    row("nvmlDeviceGetPciInfo_v3", n, time(n, || dev.pci_info()));
    row(
        "nvmlDeviceGetMinorNumber",
        n,
        time(n, || dev.minor_number()),
    );
    row(
        "nvmlDeviceGetUtilizationRates",
        n,
        time(n, || dev.utilization_rates()),
    );
    row(
        "nvmlDeviceGetMemoryInfo_v2",
        n,
        time(n, || dev.memory_info()),
    );
    row(
        "nvmlDeviceGetTemperature",
        n,
        time(n, || dev.temperature(TemperatureSensor::Gpu)),
    );
    row("nvmlDeviceGetPowerUsage", n, time(n, || dev.power_usage()));
    row(
        "nvmlDeviceGetEnforcedPowerLimit",
        n,
        time(n, || dev.enforced_power_limit()),
    );
    row(
        "nvmlDeviceGetTotalEnergyConsumption",
        n,
        time(n, || dev.total_energy_consumption()),
    );
    row(
        "nvmlDeviceGetClockInfo(SM)",
        n,
        time(n, || dev.clock_info(Clock::SM)),
    );
    row(
        "nvmlDeviceGetClockInfo(MEM)",
        n,
        time(n, || dev.clock_info(Clock::Memory)),
    );
    row(
        "nvmlDeviceGetCurrentClocksEventReasons",
        n,
        time(n, || dev.current_throttle_reasons()),
    );
    row(
        "nvmlDeviceGetPerformanceState",
        n,
        time(n, || dev.performance_state()),
    );
    row("nvmlDeviceGetFanSpeed_v2", n, time(n, || dev.fan_speed(0)));
    row(
        "nvmlDeviceGetTotalEccErrors(corrected)",
        n,
        time(n, || {
            dev.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
        }),
    );
    row(
        "nvmlDeviceGetTotalEccErrors(uncorrected)",
        n,
        time(n, || {
            dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
        }),
    );
    row(
        "nvmlDeviceGetRetiredPages(dbe)",
        n,
        time(n, || dev.retired_pages(RetirementCause::DoubleBitEccError)),
    );
    row(
        "nvmlDeviceGetRetiredPagesPendingStatus",
        n,
        time(n, || dev.are_pages_pending_retired()),
    );
    row(
        "nvmlDeviceGetPcieReplayCounter",
        n,
        time(n, || dev.pcie_replay_counter()),
    );
    row(
        "nvmlDeviceGetEncoderUtilization",
        n,
        time(n, || dev.encoder_utilization()),
    );
    row(
        "nvmlDeviceGetDecoderUtilization",
        n,
        time(n, || dev.decoder_utilization()),
    );
    let label = format!("nvmlDeviceGetFieldValues(x{})", fields.len());
    row(&label, n, time(n, || dev.field_values_for(&fields)));
    row(
        "nvmlDeviceGetPcieThroughput(RX)",
        n,
        time(n, || dev.pcie_throughput(PcieUtilCounter::Receive)),
    );
    row(
        "nvmlDeviceGetComputeRunningProcesses_v3",
        n,
        time(n, || dev.running_compute_processes()),
    );
    row(
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        n,
        time(n, || dev.running_graphics_processes()),
    );
    // doctor's one-shot queries
    row(
        "nvmlDeviceGetPersistenceMode",
        n,
        time(n, || dev.is_in_persistent_mode()),
    );
    row(
        "nvmlDeviceGetCurrPcieLinkGeneration",
        n,
        time(n, || dev.current_pcie_link_gen()),
    );
    row(
        "nvmlDeviceGetMaxPcieLinkGeneration",
        n,
        time(n, || dev.max_pcie_link_gen()),
    );
    row(
        "nvmlDeviceGetApplicationsClock(SM)",
        n,
        time(n, || dev.applications_clock(Clock::SM)),
    );
    row("nvmlDeviceGetEccMode", n, time(n, || dev.is_ecc_enabled()));
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("nvml_latency: {e}");
            std::process::exit(1);
        }
    };
    if let Some(s) = &a.sim {
        std::env::set_var("NVML_SIM_SCENARIO", s);
    }
    let lib = OsString::from(a.lib.clone().unwrap_or_else(|| "libnvidia-ml.so.1".into()));
    let t = Instant::now();
    let nvml = match Nvml::builder().lib_path(&lib).init() {
        Ok(n) => n,
        Err(e) => {
            eprintln!(
                "nvml_latency: cannot load NVML from {}: {e}",
                lib.to_string_lossy()
            );
            std::process::exit(2);
        }
    };
    let init_us = t.elapsed().as_secs_f64() * 1e6;
    let dev = match nvml.device_by_index(a.gpu) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("nvml_latency: GPU {}: {e}", a.gpu);
            std::process::exit(2);
        }
    };
    println!(
        "# NVML call latency, GPU {}, {} calls each, wall time in µs",
        a.gpu, a.calls
    );
    println!(
        "{:<48} {:>4} {:>10} {:>10} {:>10}",
        "FUNCTION", "N", "MIN_US", "MEDIAN_US", "MAX_US"
    );
    row("nvmlInit_v2", 1, Some((init_us, init_us, init_us)));
    let n = a.calls;
    row("nvmlDeviceGetCount_v2", n, time(n, || nvml.device_count()));
    row(
        "nvmlSystemGetDriverVersion",
        n,
        time(n, || nvml.sys_driver_version()),
    );
    device_calls(&nvml, &dev, a.gpu, n);
}
