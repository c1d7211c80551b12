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

/// What a sample holds once `nvmlGpmSampleGet` (or `nvmlGpmMigSampleGet`) filled it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Taken {
    /// Scenario index of the GPU.
    pub gpu: usize,
    /// Scenario time of the snapshot.
    pub t_s: f64,
    /// The GPU instance a MIG sample is of (`nvmlGpmMigSampleGet`); `None`: the whole GPU.
    pub gpu_instance: Option<u32>,
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

/// The mean of `f` (a value at a scenario time) over scenario time `[t1, t2]` (its value at `t1`
/// when the span is empty, as with a frozen clock).
pub fn mean(f: impl Fn(f64) -> f64, t1: f64, t2: f64) -> f64 {
    let (a, b) = if t1 <= t2 { (t1, t2) } else { (t2, t1) };
    let span = b - a;
    if span.is_nan() || span <= 0.0 {
        return f(a);
    }
    let steps = (span / STEP_S).ceil().clamp(1.0, MAX_STEPS);
    let dt = span / steps;
    let n = steps as usize;
    (0..n).map(|i| f(a + (i as f64 + 0.5) * dt)).sum::<f64>() / steps
}

/// Activity `metric` of GPU instance `gi` of `gpu` at `t_s`: the mean over its MIG devices
/// (its compute instances; one in the usual layout), 0 for an instance the GPU lacks.
pub fn instance_value(sim: &Sim, gpu: usize, gi: u32, metric: Metric, t_s: f64) -> f64 {
    let devices = &sim.device(gpu).mig.devices;
    let (sum, n) = devices
        .iter()
        .enumerate()
        .filter(|(_, d)| d.gpu_instance_id == gi)
        .fold((0.0, 0.0), |(s, n), (k, _)| {
            (s + sim.mig_metric(gpu, k, metric, t_s), n + 1.0)
        });
    if n > 0.0 {
        sum / n
    } else {
        0.0
    }
}

/// Activity `metric` of a whole GPU with MIG on at `t_s`: its GPU instances' values, each
/// weighted by its share of the GPU's SMs (compute slices of 7); slices no instance holds are
/// idle. This is what the GPU's own counters sum up to.
pub fn whole_gpu_value(sim: &Sim, gpu: usize, metric: Metric, t_s: f64) -> f64 {
    let devices = &sim.device(gpu).mig.devices;
    let mut seen: Vec<u32> = Vec::with_capacity(devices.len());
    let mut sum = 0.0;
    for d in devices {
        if seen.contains(&d.gpu_instance_id) {
            continue;
        }
        seen.push(d.gpu_instance_id);
        let share = f64::from(d.profile.compute_slices) / f64::from(crate::mig::COMPUTE_SLICES);
        sum += share * instance_value(sim, gpu, d.gpu_instance_id, metric, t_s);
    }
    sum
}

/// The means one `nvmlGpmMetricsGet` computed, so the metrics that read the same signal (seven
/// NVDECs, 36 NVLink directions) integrate it once.
#[derive(Debug, Default)]
pub struct Means(Vec<(Metric, f64)>);

/// Metric `id` between two samples of `gpu` taken at `t1` and `t2` — of GPU instance `gi` when
/// they are MIG samples. A GPU instance answers the activities of its SMs and memory
/// (`Metric::per_mig_device`); its bandwidths and video engines are the GPU's (`NOT_SUPPORTED`).
/// On a GPU with MIG on, the whole GPU's activities are its instances' (`whole_gpu_value`).
pub fn value(
    sim: &Sim,
    gpu: usize,
    gi: Option<u32>,
    id: u32,
    (t1, t2): (f64, f64),
    memo: &mut Means,
) -> Result<f64, u32> {
    let r = reading(id)?;
    let (m, scale) = match r {
        Reading::Pct(m) => (m, 1.0),
        Reading::MibPerS(m, share) => (m, 1.0 / 1024.0 / f64::from(share)),
    };
    let activity = matches!(r, Reading::Pct(_)) && m.per_mig_device();
    if gi.is_some() && !activity {
        return Err(code::NOT_SUPPORTED);
    }
    let mean = match memo.0.iter().find(|(k, _)| *k == m) {
        Some((_, v)) => *v,
        None => {
            let v = match gi {
                Some(gi) => mean(|t| instance_value(sim, gpu, gi, m, t), t1, t2),
                None if activity && sim.device(gpu).mig.active() => {
                    mean(|t| whole_gpu_value(sim, gpu, m, t), t1, t2)
                }
                None => mean(|t| sim.metric(gpu, m, t), t1, t2),
            };
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
        let t = Taken {
            gpu: 1,
            t_s: 2.0,
            gpu_instance: Some(5),
        };
        fill(a, t).unwrap();
        assert_eq!(taken(a), Ok(t));
        free(a).unwrap();
        assert_eq!(free(a), Err(code::INVALID_ARGUMENT), "double free");
        assert_eq!(
            fill(
                a,
                Taken {
                    gpu: 0,
                    t_s: 0.0,
                    gpu_instance: None
                }
            ),
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
        value(s, 0, None, id, (t1, t2), &mut Means::default()).unwrap()
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

    /// An H100 split 3g.40gb (a process on it) + 2g.20gb (idle, with an SM-active signal of its
    /// own) + 1g.10gb (idle): each GPU instance reads its own activity.
    const MIG_H100: &str = "[devices]\ncount = 1\nname = \"NVIDIA H100 80GB HBM3\"\n\
        memory_total_mib = 81559\n[devices.metrics]\ngpu_util_pct = 90\nmem_util_pct = 40\n\
        pcie_tx_kb_s = 1024\n[[device]]\nindex = 0\nmig = [\"3g.40gb\", \
        { profile = \"2g.20gb\", metrics = { sm_active_pct = 30 } }, \"1g.10gb\"]\n\
        [[process]]\ngpu = 0\nmig = 0\npid = 4194400\nused_memory_mib = 1000\n";

    fn mig_v(s: &Sim, gi: Option<u32>, id: u32) -> Result<f64, u32> {
        value(s, 0, gi, id, (0.0, 10.0), &mut Means::default())
    }

    #[test]
    fn a_gpu_instance_reads_its_own_activity() {
        let s = sim(MIG_H100);
        let gis: Vec<u32> = s
            .device(0)
            .mig
            .devices
            .iter()
            .map(|d| d.gpu_instance_id)
            .collect();
        assert_eq!(gis, [1, 5, 13]);
        // the 3g.40gb runs the GPU's workload: GR 90 %, SM 85 % of it, DRAM 0.8 × memory util
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(mig_v(&s, Some(1), 1).unwrap(), 90.0));
        assert!(close(mig_v(&s, Some(1), 2).unwrap(), 76.5));
        assert!(close(mig_v(&s, Some(1), 10).unwrap(), 32.0));
        // the idle 2g.20gb: its own SM-active signal, and what follows from it
        assert!(close(mig_v(&s, Some(5), 2).unwrap(), 30.0));
        assert!(close(mig_v(&s, Some(5), 5).unwrap(), 15.0));
        assert_eq!(mig_v(&s, Some(5), 1), Ok(0.0), "no work of its own");
        // the idle 1g.10gb reads 0
        for id in [1, 2, 3, 5, 10, 12] {
            assert_eq!(mig_v(&s, Some(13), id), Ok(0.0), "{id}");
        }
        // bandwidths and video engines are the GPU's, not an instance's
        for id in [20, 21, 30, 40, 60, 62] {
            assert_eq!(mig_v(&s, Some(1), id), Err(code::NOT_SUPPORTED), "{id}");
        }
        // the whole GPU: its instances weighted by their compute slices (3/7 and 2/7)
        let whole = mig_v(&s, None, 2).unwrap();
        assert!(close(whole, 3.0 / 7.0 * 76.5 + 2.0 / 7.0 * 30.0), "{whole}");
        assert!(
            close(mig_v(&s, None, 20).unwrap(), 1.0),
            "PCIe is the GPU's"
        );
    }

    #[test]
    fn a_mig_device_takes_only_its_own_metrics() {
        let bad = MIG_H100.replace("sm_active_pct = 30", "power_w = 30");
        let e = crate::scenario::parse(&bad, "t.toml", None).unwrap_err();
        assert!(
            e.message
                .contains("`metrics.power_w` is not a MIG device's metric"),
            "{e}"
        );
    }
}
