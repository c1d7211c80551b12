//! GPM (GPU Performance Monitoring, Hopper and later): the samples `nvmlGpmSampleAlloc` hands
//! out and what `nvmlGpmMetricsGet` computes from two of them.
//!
//! A real sample is a snapshot of the GPU's activity counters (cycles each SM had a warp, cycles
//! the tensor pipes were busy, DRAM bytes, PCIe and NVLink bytes …); a metric is the change
//! between two snapshots over the time between them. Here a sample records which GPU and what
//! scenario time it was taken at, and a metric is the mean of the scenario's signal over the
//! span between the two samples (midpoint rule on a grid of at most [`MAX_STEPS`] steps, so a
//! square wave sampled a second apart gives its duty cycle, not the value at one instant). The
//! value depends only on the two times: the same pair always gives the same numbers.
//!
//! Handles are the addresses of small heap allocations kept in a table, so a freed or foreign
//! handle is an `INVALID_ARGUMENT`, never a dereference.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::scenario::Metric;
use crate::sim::{code, Sim};

/// `NVML_GPM_METRICS_GET_VERSION` / `NVML_GPM_SUPPORT_VERSION`.
pub const VERSION: u32 = 1;
/// One past the largest metric id the 12.x header knows (`NVML_GPM_METRIC_MAX`).
pub const METRIC_MAX: u32 = 210;
/// Grid step of the mean, scenario seconds (a driver's utilization sample period is 1/6 to 1 s),
/// and the most steps one mean takes.
const STEP_S: f64 = 0.1;
const MAX_STEPS: f64 = 2000.0;
/// Instances of the video engines a Hopper board has (H100: 7 NVDEC, 7 NVJPG, 1 NVOFA), and its
/// NVLink links (18 on an H100 SXM).
pub const NVDEC: u32 = 7;
pub const NVJPG: u32 = 7;
pub const NVOFA: u32 = 1;
pub const NVLINKS: u32 = 18;

/// What a sample holds once `nvmlGpmSampleGet` filled it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Taken {
    /// Scenario index of the GPU.
    pub gpu: usize,
    /// Scenario time of the snapshot.
    pub t_s: f64,
}

/// Allocated samples by handle address: `None` until filled.
static SAMPLES: Mutex<Option<HashMap<usize, Option<Taken>>>> = Mutex::new(None);

fn with_samples<T>(f: impl FnOnce(&mut HashMap<usize, Option<Taken>>) -> T) -> T {
    let mut g = SAMPLES.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

/// Allocates a sample; returns its handle (a unique, non-null address).
pub fn alloc() -> usize {
    let addr = Box::into_raw(Box::new(0u8)) as usize;
    with_samples(|m| m.insert(addr, None));
    addr
}

/// Frees a sample (`INVALID_ARGUMENT` for a handle that is not a live sample).
pub fn free(handle: usize) -> Result<(), u32> {
    with_samples(|m| m.remove(&handle)).ok_or(code::INVALID_ARGUMENT)?;
    // SAFETY: `handle` came from `Box::into_raw` in `alloc` and was in the table until now, so
    // it is freed exactly once.
    drop(unsafe { Box::from_raw(handle as *mut u8) });
    Ok(())
}

/// Fills a sample with a snapshot of `gpu` at `t_s`.
pub fn fill(handle: usize, taken: Taken) -> Result<(), u32> {
    with_samples(|m| match m.get_mut(&handle) {
        Some(slot) => {
            *slot = Some(taken);
            Ok(())
        }
        None => Err(code::INVALID_ARGUMENT),
    })
}

/// The snapshot a sample holds (`INVALID_ARGUMENT` when unknown or never filled).
pub fn taken(handle: usize) -> Result<Taken, u32> {
    with_samples(|m| m.get(&handle).copied().flatten()).ok_or(code::INVALID_ARGUMENT)
}

/// Live samples (for tests: every alloc must be freed).
pub fn live() -> usize {
    with_samples(|m| m.len())
}

/// What a metric id reads, when the simulator answers it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reading {
    /// A percentage signal's mean.
    Pct(Metric),
    /// A KB/s signal's mean in MiB/s (KB read as KiB, as clients read the PCIe throughput),
    /// divided among `share` links.
    MibPerS(Metric, u32),
}

/// What metric `id` (`NVML_GPM_METRIC_*`) reads; `Err` is the per-metric return code: an id
/// outside the header's range is `INVALID_ARGUMENT`, one not modelled (C2C, caches, context
/// switches, NVENC, engine instances the board does not have) `NOT_SUPPORTED`.
pub fn reading(id: u32) -> Result<Reading, u32> {
    use Metric as M;
    use Reading::{MibPerS, Pct};
    Ok(match id {
        0 => return Err(code::INVALID_ARGUMENT),
        1 => Pct(M::GrEngineActivePct),
        2 => Pct(M::SmActivePct),
        3 => Pct(M::SmOccupancyPct),
        4 => Pct(M::IntegerActivePct),
        5 => Pct(M::TensorActivePct),
        6 => Pct(M::DfmaActivePct),
        7 => Pct(M::HmmaActivePct),
        9 => Pct(M::ImmaActivePct),
        10 => Pct(M::DramActivePct),
        11 => Pct(M::Fp64ActivePct),
        12 => Pct(M::Fp32ActivePct),
        13 => Pct(M::Fp16ActivePct),
        20 => MibPerS(M::PcieTxKbS, 1),
        21 => MibPerS(M::PcieRxKbS, 1),
        30..=37 if id - 30 < NVDEC => Pct(M::NvdecUtilPct),
        40..=47 if id - 40 < NVJPG => Pct(M::NvjpgUtilPct),
        50..=51 if id - 50 < NVOFA => Pct(M::NvofaUtilPct),
        60 => MibPerS(M::NvlinkRxKbS, 1),
        61 => MibPerS(M::NvlinkTxKbS, 1),
        // per link: L0 RX = 62, L0 TX = 63, … L17 TX = 97
        62..=97 if (id - 62) / 2 < NVLINKS => {
            let m = if id % 2 == 0 {
                M::NvlinkRxKbS
            } else {
                M::NvlinkTxKbS
            };
            MibPerS(m, NVLINKS)
        }
        METRIC_MAX.. => return Err(code::INVALID_ARGUMENT),
        _ => return Err(code::NOT_SUPPORTED),
    })
}

/// Short name, long name and unit of a metric id the simulator answers (NUL-terminated, for
/// `nvmlGpmMetric_t.metricInfo`).
pub fn info(id: u32) -> Option<(&'static str, &'static str, &'static str)> {
    reading(id).ok()?;
    Some(match id {
        1 => ("GR\0", "Graphics engine active\0", "%\0"),
        2 => ("SM\0", "SM active\0", "%\0"),
        3 => ("SMOCC\0", "SM occupancy\0", "%\0"),
        4 => ("INT\0", "Integer pipe active\0", "%\0"),
        5 => ("TENSOR\0", "Any tensor pipe active\0", "%\0"),
        6 => ("DFMA\0", "DFMA tensor pipe active\0", "%\0"),
        7 => ("HMMA\0", "HMMA tensor pipe active\0", "%\0"),
        9 => ("IMMA\0", "IMMA tensor pipe active\0", "%\0"),
        10 => ("DRAM\0", "DRAM bandwidth used\0", "%\0"),
        11 => ("FP64\0", "FP64 pipe active\0", "%\0"),
        12 => ("FP32\0", "FP32 pipe active\0", "%\0"),
        13 => ("FP16\0", "FP16 pipe active\0", "%\0"),
        20 => ("PCIETX\0", "PCIe transmit\0", "MiB/s\0"),
        21 => ("PCIERX\0", "PCIe receive\0", "MiB/s\0"),
        30..=37 => ("NVDEC\0", "NVDEC utilization\0", "%\0"),
        40..=47 => ("NVJPG\0", "NVJPG utilization\0", "%\0"),
        50..=51 => ("NVOFA\0", "NVOFA utilization\0", "%\0"),
        60 => ("NVLRX\0", "NVLink receive, all links\0", "MiB/s\0"),
        61 => ("NVLTX\0", "NVLink transmit, all links\0", "MiB/s\0"),
        62..=97 => ("NVL\0", "NVLink bandwidth, one link\0", "MiB/s\0"),
        _ => return None,
    })
}

/// The mean of `metric` on `gpu` over scenario time `[t1, t2]` (its value at `t1` when the span
/// is empty, as with a frozen clock).
pub fn mean(sim: &Sim, gpu: usize, metric: Metric, t1: f64, t2: f64) -> f64 {
    let (a, b) = if t1 <= t2 { (t1, t2) } else { (t2, t1) };
    let span = b - a;
    if span.is_nan() || span <= 0.0 {
        return sim.metric(gpu, metric, a);
    }
    let steps = (span / STEP_S).ceil().clamp(1.0, MAX_STEPS);
    let dt = span / steps;
    let n = steps as usize;
    (0..n)
        .map(|i| sim.metric(gpu, metric, a + (i as f64 + 0.5) * dt))
        .sum::<f64>()
        / steps
}

/// The means one `nvmlGpmMetricsGet` computed, so the metrics that read the same signal (seven
/// NVDECs, 36 NVLink directions) integrate it once.
#[derive(Debug, Default)]
pub struct Means(Vec<(Metric, f64)>);

/// Metric `id` between two samples of `gpu` taken at `t1` and `t2`.
pub fn value(
    sim: &Sim,
    gpu: usize,
    id: u32,
    (t1, t2): (f64, f64),
    memo: &mut Means,
) -> Result<f64, u32> {
    let (m, scale) = match reading(id)? {
        Reading::Pct(m) => (m, 1.0),
        Reading::MibPerS(m, share) => (m, 1.0 / 1024.0 / f64::from(share)),
    };
    let mean = match memo.0.iter().find(|(k, _)| *k == m) {
        Some((_, v)) => *v,
        None => {
            let v = mean(sim, gpu, m, t1, t2);
            memo.0.push((m, v));
            v
        }
    };
    Ok(mean * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sim(text: &str) -> Sim {
        let s = crate::scenario::parse(text, "t.toml", None).unwrap();
        Sim::new(s, 1.0, 0.0, None)
    }

    #[test]
    fn samples_are_allocated_filled_and_freed_once() {
        let a = alloc();
        let b = alloc();
        assert_ne!(a, b);
        assert_ne!(a, 0);
        assert_eq!(taken(a), Err(code::INVALID_ARGUMENT), "not filled yet");
        fill(a, Taken { gpu: 1, t_s: 2.0 }).unwrap();
        assert_eq!(taken(a), Ok(Taken { gpu: 1, t_s: 2.0 }));
        free(a).unwrap();
        assert_eq!(free(a), Err(code::INVALID_ARGUMENT), "double free");
        assert_eq!(
            fill(a, Taken { gpu: 0, t_s: 0.0 }),
            Err(code::INVALID_ARGUMENT)
        );
        assert_eq!(free(12345), Err(code::INVALID_ARGUMENT), "foreign handle");
        free(b).unwrap();
    }

    #[test]
    fn metric_ids() {
        assert_eq!(reading(2), Ok(Reading::Pct(Metric::SmActivePct)));
        assert_eq!(reading(20), Ok(Reading::MibPerS(Metric::PcieTxKbS, 1)));
        assert_eq!(reading(36), Ok(Reading::Pct(Metric::NvdecUtilPct)));
        assert_eq!(
            reading(37),
            Err(code::NOT_SUPPORTED),
            "an H100 has 7 NVDECs"
        );
        assert_eq!(reading(51), Err(code::NOT_SUPPORTED), "and one NVOFA");
        assert_eq!(reading(62), Ok(Reading::MibPerS(Metric::NvlinkRxKbS, 18)));
        assert_eq!(reading(97), Ok(Reading::MibPerS(Metric::NvlinkTxKbS, 18)));
        assert_eq!(reading(100), Err(code::NOT_SUPPORTED), "C2C");
        assert_eq!(reading(8), Err(code::NOT_SUPPORTED));
        assert_eq!(reading(0), Err(code::INVALID_ARGUMENT));
        assert_eq!(reading(210), Err(code::INVALID_ARGUMENT));
        for id in 1..METRIC_MAX {
            assert_eq!(reading(id).is_ok(), info(id).is_some(), "{id}");
        }
    }

    fn v(s: &Sim, id: u32, t1: f64, t2: f64) -> f64 {
        value(s, 0, id, (t1, t2), &mut Means::default()).unwrap()
    }

    #[test]
    fn a_metric_is_the_mean_between_the_two_samples() {
        // a square wave: 80 % for 2 s of every 3 s, else 0; SM active 85 % of GR active
        let s = sim("[devices]\ncount = 1\n[devices.metrics]\n\
             gpu_util_pct = { type = \"square\", period_s = 3, duty = 0.6667, high = 80 }\n");
        let gr = v(&s, 1, 0.0, 30.0);
        assert!((gr - 53.33).abs() < 0.1, "{gr}");
        let sm = v(&s, 2, 0.0, 30.0);
        assert!((sm - 0.85 * gr).abs() < 0.01, "{sm}");
        assert_eq!(v(&s, 1, 0.5, 0.5), 80.0, "an empty span");
        assert_eq!(v(&s, 1, 2.1, 2.9), 0.0);
        assert_eq!(v(&s, 1, 30.0, 0.0), gr, "order does not matter");
        // PCIe: 5000 KB/s per util point → MiB/s; NVLink per link is an 18th of the total
        let busy = sim("[devices]\ncount = 1\n[devices.metrics]\ngpu_util_pct = 100\n");
        assert_eq!(v(&busy, 20, 0.0, 1.0), 500_000.0 / 1024.0);
        let total = v(&busy, 61, 0.0, 1.0);
        assert_eq!(total, 2_000_000.0 / 1024.0);
        assert!((v(&busy, 63, 0.0, 1.0) - total / 18.0).abs() < 1e-9);
    }
}
