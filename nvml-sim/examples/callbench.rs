//! Measures what a sampler tick costs against the simulated library: for every GPU, the ~20
//! nvml-wrapper calls a sampler makes, repeated; prints the time per call and per tick.
//!
//!     cargo build --release -p nvml-sim --lib --examples
//!     target/release/examples/callbench target/release/libnvml_sim.so [ticks]
//!
//! The library's real-driver call latency is on by default (~0.4 s per 8-GPU tick, mostly
//! `nvmlDeviceGetPcieThroughput`); `NVML_SIM_LATENCY=0` measures the bare call cost.

use std::ffi::OsString;
use std::time::Instant;

use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor,
};
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::Nvml;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args_os().skip(1);
    let lib: OsString = args
        .next()
        .unwrap_or_else(|| OsString::from("target/release/libnvml_sim.so"));
    let ticks: u32 = args
        .next()
        .and_then(|a| a.to_str().and_then(|s| s.parse().ok()))
        .unwrap_or(2000);
    let nvml = Nvml::builder().lib_path(&lib).init()?;
    let count = nvml.device_count()?;
    let devices: Vec<_> = (0..count)
        .filter_map(|i| nvml.device_by_index(i).ok())
        .collect();
    let mut calls = 0u64;
    let start = Instant::now();
    for _ in 0..ticks {
        for d in &devices {
            let _ = d.utilization_rates();
            let _ = d.memory_info();
            let _ = d.temperature(TemperatureSensor::Gpu);
            let _ = d.power_usage();
            let _ = d.enforced_power_limit();
            let _ = d.total_energy_consumption();
            let _ = d.clock_info(Clock::SM);
            let _ = d.clock_info(Clock::Memory);
            let _ = d.current_throttle_reasons();
            let _ = d.performance_state();
            let _ = d.fan_speed(0);
            let _ = d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile);
            let _ = d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile);
            let _ = d.pcie_throughput(PcieUtilCounter::Send);
            let _ = d.pcie_throughput(PcieUtilCounter::Receive);
            let _ = d.pcie_replay_counter();
            let _ = d.encoder_utilization();
            let _ = d.decoder_utilization();
            let _ = d.field_values_for(&[FieldId(82), FieldId(142), FieldId(143)]);
            let _ = d.running_compute_processes();
            calls += 21;
        }
    }
    let elapsed = start.elapsed();
    println!(
        "{count} GPUs, {ticks} ticks, {calls} calls: {:.2} µs/call, {:.1} µs/tick",
        elapsed.as_secs_f64() * 1e6 / calls as f64,
        elapsed.as_secs_f64() * 1e6 / f64::from(ticks)
    );
    Ok(())
}
