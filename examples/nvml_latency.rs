//! The wall time of every NVML call gpuwatch's sampler (and `doctor`) makes, per call: min,
//! median and max over N calls on one GPU, and the CPU time the calling thread spent in each.
//! `bench/real-gpu.sh` runs it on a real driver; nvml-sim's default costs come from its table
//! (`tests/fixtures/real/nvml-latency.txt`).
//!
//!     cargo run --release --example nvml_latency -- [--nvml-lib PATH] [--sim SCENARIO]
//!                                                   [--gpu N] [--calls 50]
//!
//! Prints one line per function (`FUNCTION  n  min_us  median_us  max_us  cpu_us`, or `not
//! supported`): wall time, and the median CPU time the calling thread spent in the call.
//! An unsupported call is listed, not an error; no NVML at all exits 2.

use std::ffi::OsString;
use std::time::Instant;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, RetirementCause, TemperatureSensor,
};
use nvml_wrapper::structs::device::FieldId;
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

/// The calling thread's CPU time (user + system) in µs.
fn thread_cpu_us() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e6 + ts.tv_nsec as f64 / 1e3
}

/// Wall time min, median and max, and median CPU time of the calling thread, in µs.
type Timing = (f64, f64, f64, f64);

/// Times `f` `n` times, or `None` when the first call fails.
fn time<T, E>(n: usize, mut f: impl FnMut() -> Result<T, E>) -> Option<Timing> {
    time_if(n, move || f().is_ok())
}

/// Times `f` `n` times while it answers true.
fn time_if(n: usize, mut f: impl FnMut() -> bool) -> Option<Timing> {
    let mut us = Vec::with_capacity(n);
    let mut cpu = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
        let c = thread_cpu_us();
        let t = Instant::now();
        let ok = f();
        let el = t.elapsed().as_secs_f64() * 1e6;
        cpu.push(thread_cpu_us() - c);
        if !ok {
            return None;
        }
        us.push(el);
    }
    us.sort_by(f64::total_cmp);
    cpu.sort_by(f64::total_cmp);
    Some((
        us[0],
        us[us.len() / 2],
        us[us.len() - 1],
        cpu[cpu.len() / 2],
    ))
}

fn row(name: &str, n: usize, r: Option<Timing>) {
    match r {
        Some((min, med, max, cpu)) => {
            println!("{name:<48} {n:>4} {min:>10.1} {med:>10.1} {max:>10.1} {cpu:>10.1}");
        }
        None => println!("{name:<48} {n:>4} not supported"),
    }
}

/// Every per-device call, with the NVML symbol it makes.
fn device_calls(nvml: &Nvml, dev: &Device<'_>, gpu: u32, n: usize) {
    let named: Vec<(&str, u32)> = METRICS
        .iter()
        .filter_map(|m| match m.source {
            Source::Field(f) => Some((m.key, f.field.id)),
            _ => None,
        })
        .collect();
    let fields: Vec<FieldId> = named.iter().map(|(_, id)| FieldId(*id)).collect();
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
    for (key, id) in &named {
        let label = format!("nvmlDeviceGetFieldValues({key})");
        row(&label, n, time(n, || dev.field_values_for(&[FieldId(*id)])));
    }
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
    row(
        "nvmlDeviceGetProcessUtilization",
        n,
        time(n, || dev.process_utilization_stats(None)),
    );
    gpm_calls(nvml, dev, n);
    // the XID drain: a zero-timeout wait on an event set, once per tick
    match nvml.create_event_set().and_then(|set| {
        dev.register_events(EventTypes::CRITICAL_XID_ERROR, set)
            .map_err(|e| e.error)
    }) {
        Ok(set) => row(
            "nvmlEventSetWait_v2(0 ms)",
            n,
            time_if(n, || {
                matches!(
                    set.wait(0),
                    Ok(_) | Err(nvml_wrapper::error::NvmlError::Timeout)
                )
            }),
        ),
        Err(_) => row("nvmlEventSetWait_v2(0 ms)", n, None),
    }
}

/// GPM (Hopper and later), as the sampler makes it every tick: one `nvmlGpmSampleGet` into a
/// sample allocated once, and `nvmlGpmMetricsGet` of every id of the table's GPM rows between
/// it and the previous one. Rows say `not supported` on GPUs without GPM.
fn gpm_calls(nvml: &Nvml, dev: &Device<'_>, n: usize) {
    use gpuwatch::model::METRICS;
    use nvml_wrapper::enums::gpm::GpmMetricId;
    use nvml_wrapper::gpm::gpm_metrics_get;
    row(
        "nvmlGpmQueryDeviceSupport",
        n,
        time(n, || dev.gpm_support()),
    );
    let supported = dev.gpm_support().unwrap_or(false);
    // alloc + get (what nvml-wrapper's gpm_sample() makes)
    let mut kept = Vec::new();
    row(
        "nvmlGpmSampleAlloc+nvmlGpmSampleGet",
        n,
        if supported {
            time(n, || dev.gpm_sample().map(|s| kept.push(s)))
        } else {
            None
        },
    );
    // get alone, into a sample already allocated (what the sampler does)
    let get = kept.first().and_then(|s| {
        let sym = nvml.lib().nvmlGpmSampleGet.as_ref().ok()?;
        time(n, || {
            // SAFETY: our library's symbol; the device and the sample belong to it.
            let rc = unsafe { sym(dev.handle(), s.handle()) };
            if rc == 0 {
                Ok(())
            } else {
                Err(rc)
            }
        })
    });
    row("nvmlGpmSampleGet", n, get);
    let ids: Vec<GpmMetricId> = METRICS
        .iter()
        .filter_map(|d| match d.source {
            Source::Gpm(m) => Some(m.ids()),
            _ => None,
        })
        .flatten()
        .filter_map(|id| GpmMetricId::try_from(id).ok())
        .collect();
    let metrics = match (kept.first(), kept.last()) {
        (Some(a), Some(b)) if kept.len() > 1 => time(n, || gpm_metrics_get(nvml, a, b, &ids)),
        _ => None,
    };
    row(&format!("nvmlGpmMetricsGet(x{})", ids.len()), n, metrics);
    // what the GPU reads now, over 1 s
    if let Ok(first) = dev.gpm_sample() {
        std::thread::sleep(std::time::Duration::from_secs(1));
        if let Ok(second) = dev.gpm_sample() {
            if let Ok(got) = gpm_metrics_get(nvml, &first, &second, &ids) {
                let line: Vec<String> = got
                    .iter()
                    .flatten()
                    .map(|r| format!("{:?}={:.1}", r.metric_id, r.value))
                    .collect();
                println!("# GPM over 1 s: {}", line.join(" "));
            }
        }
    }
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
    let c = thread_cpu_us();
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
    let init_cpu = thread_cpu_us() - c;
    let dev = match nvml.device_by_index(a.gpu) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("nvml_latency: GPU {}: {e}", a.gpu);
            std::process::exit(2);
        }
    };
    println!(
        "# NVML call latency, GPU {}, {} calls each: wall time in µs, and the median CPU time \
         the calling thread spent in a call",
        a.gpu, a.calls
    );
    println!(
        "{:<48} {:>4} {:>10} {:>10} {:>10} {:>10}",
        "FUNCTION", "N", "MIN_US", "MEDIAN_US", "MAX_US", "CPU_US"
    );
    row(
        "nvmlInit_v2",
        1,
        Some((init_us, init_us, init_us, init_cpu)),
    );
    let n = a.calls;
    row("nvmlDeviceGetCount_v2", n, time(n, || nvml.device_count()));
    row(
        "nvmlSystemGetDriverVersion",
        n,
        time(n, || nvml.sys_driver_version()),
    );
    device_calls(&nvml, &dev, a.gpu, n);
}
