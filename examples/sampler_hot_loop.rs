//! Hot-loop cost of one sampling tick (sample + CSV render) without sleeping between ticks, to
//! separate gpuwatch's own work from scheduler wake-ups and cold caches (see docs/benchmarks.md):
//!
//!     cargo build --release -p nvml-sim --example sampler_hot_loop
//!     NVML_SIM_SCENARIO=healthy target/release/examples/sampler_hot_loop target/release/libnvml_sim.so

use std::time::{Duration, Instant};

fn main() {
    let lib = std::env::args()
        .nth(1)
        .expect("usage: sampler_hot_loop PATH/TO/libnvidia-ml.so [TICKS]");
    let ticks: u32 = std::env::args()
        .nth(2)
        .map_or(20_000, |n| n.parse().expect("TICKS is a number"));
    let cfg = gpuwatch::sampler::SamplerConfig {
        nvml_lib: Some(lib.into()),
        ..Default::default()
    };
    let mut sampler = gpuwatch::sampler::Sampler::open(&cfg).expect("opening NVML");
    let mut rows = gpuwatch::record::CsvRows::new();
    let mut buf = String::new();
    let mut sampling = Duration::ZERO;
    let start = Instant::now();
    for i in 0..ticks {
        let t = Instant::now();
        // 100 ms of sample time per tick, so the process list refreshes every 50 ticks.
        let snap = sampler.sample_at(1_700_000_000_000 + i64::from(i) * 100);
        sampling += t.elapsed();
        buf.clear();
        rows.render(&snap, &mut buf);
    }
    let total = start.elapsed();
    println!(
        "{} GPUs, {ticks} ticks: {:?}/tick ({:?} sampling, {:?} CSV)",
        sampler.devices().len(),
        total / ticks,
        sampling / ticks,
        (total - sampling) / ticks
    );
}
