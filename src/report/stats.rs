//! Per-GPU numbers of a run, accumulated one sample at a time (bounded memory for any log
//! length): span, samples and gaps, utilization distribution, memory peak and trend, temperature
//! against the slowdown threshold, power and energy, time per clock-event (throttle) reason, ECC
//! counts, XIDs, processes seen; and the four chart series.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::series::Series;
use crate::model::{GpuSample, Metric, MetricValues};

/// A sample stands for the time until the next one: at most twice the log's usual spacing, and
/// at most this long before that spacing is known (a longer pause is a gap, not time at the last
/// value).
pub const MAX_SAMPLE_MS: i64 = 60_000;
/// Temperature taken as the slowdown threshold where the log does not carry the GPU's own.
pub const FALLBACK_SLOWDOWN_C: f64 = 85.0;

/// The mean of a (sum, count), when there was a value.
fn gpm_mean((sum, n): (f64, u64)) -> Option<f64> {
    (n > 0).then(|| sum / n as f64)
}

/// Mean and percentiles.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Dist {
    pub mean: f64,
    pub p50: f64,
    pub p95: f64,
}

/// One GPU's numbers (see the module docs); `None` where the log had no such values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuSummary {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub samples: u64,
    pub first_ms: i64,
    pub last_ms: i64,
    /// Typical time between samples (median), seconds.
    pub interval_s: f64,
    /// Pauses longer than twice the typical interval.
    pub gaps: u64,
    pub gap_s: f64,
    pub util: Option<Dist>,
    pub util_below_50_s: f64,
    /// Means of GPM's SM active, tensor active and DRAM active, percent (Hopper and later; absent
    /// in logs without them).
    #[serde(default)]
    pub sm_active_mean: Option<f64>,
    #[serde(default)]
    pub tensor_active_mean: Option<f64>,
    #[serde(default)]
    pub dram_active_mean: Option<f64>,
    pub mem_peak_bytes: Option<f64>,
    pub mem_total_bytes: Option<f64>,
    /// Least-squares slope of memory used, MiB per hour.
    pub mem_trend_mib_per_h: Option<f64>,
    pub mem_headroom_bytes: Option<f64>,
    pub temp_max_c: Option<f64>,
    /// The threshold used: the GPU's own slowdown temperature where the log has it.
    pub temp_slowdown_c: f64,
    pub temp_slowdown_known: bool,
    pub temp_above_slowdown_s: f64,
    pub power_mean_w: Option<f64>,
    pub power_max_w: Option<f64>,
    pub energy_kwh: Option<f64>,
    /// Seconds with each clock-event reason active.
    pub throttle_s: BTreeMap<String, f64>,
    pub ecc_corrected: Option<f64>,
    pub ecc_uncorrected: Option<f64>,
    /// (time ms, XID).
    pub xids: Vec<(i64, u64)>,
    /// Processes seen: `pid name`.
    pub processes: Vec<String>,
}

/// The charts of one GPU.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GpuCharts {
    pub util: Series,
    pub mem_used_gib: Series,
    pub temp: Series,
    pub power: Series,
    pub mem_total_gib: Option<f64>,
}

/// Streaming accumulator of one GPU.
#[derive(Debug, Default)]
pub struct GpuAcc {
    index: u32,
    name: String,
    uuid: String,
    samples: u64,
    first_ms: Option<i64>,
    last_ms: i64,
    /// Time between samples, histogram in 10 ms steps (for the median interval).
    dts: BTreeMap<i64, u64>,
    /// Pauses over 1.5 s (gap candidates, judged against the median at the end).
    long_dts: Vec<i64>,
    util_hist: Vec<u64>,
    util_n: u64,
    util_sum: f64,
    util_below_50_ms: i64,
    /// Sums and counts of SM active, tensor active and DRAM active (GPM).
    gpm: [(f64, u64); 3],
    mem_peak: Option<f64>,
    mem_total: Option<f64>,
    /// Least squares of (hours since first, MiB).
    reg: [f64; 5],
    temp_max: Option<f64>,
    slowdown: Option<f64>,
    above_ms: i64,
    power_sum: f64,
    power_n: u64,
    power_max: Option<f64>,
    power_joules: f64,
    energy_counter: (Option<f64>, f64),
    throttle_ms: BTreeMap<&'static str, i64>,
    ecc: [(Option<f64>, Option<f64>); 2],
    xids: Vec<(i64, u64)>,
    procs: BTreeSet<String>,
    prev: Option<(i64, MetricValues)>,
    /// The usual spacing of the samples so far: the most frequent bucket of `dts`, ms (none
    /// before the second sample).
    mode_dt: Option<i64>,
    pub charts: GpuCharts,
}

impl GpuAcc {
    /// A new accumulator for GPU `index`.
    pub fn new(index: u32) -> GpuAcc {
        GpuAcc {
            index,
            util_hist: vec![0; 101],
            ..GpuAcc::default()
        }
    }

    /// Adds a sample taken at `t` (the snapshot's time).
    pub fn push(&mut self, t: i64, g: &GpuSample) {
        if self.name.is_empty() {
            self.name.clone_from(&g.id.name);
        }
        if self.uuid.is_empty() {
            self.uuid.clone_from(&g.id.uuid);
        }
        self.samples += 1;
        self.first_ms.get_or_insert(t);
        self.last_ms = t;
        // The previous sample stands for the time until this one.
        if let Some((pt, prev)) = self.prev.take() {
            let dt = t - pt;
            // The usual spacing so far (the most frequent one): a sample stands for at most
            // twice it (a longer pause is a gap, not time at the last value), and only pauses
            // well past it are kept as possible gaps (memory stays bounded on slow logs).
            let typical = self.mode_dt;
            let bucket = dt / 10 * 10;
            let count = {
                let c = self.dts.entry(bucket).or_default();
                *c += 1;
                *c
            };
            if typical.is_none_or(|t| count > self.dts.get(&t).copied().unwrap_or(0)) {
                self.mode_dt = Some(bucket);
            }
            if dt > 1500 && typical.is_none_or(|t| dt > t + t / 2) {
                self.long_dts.push(dt);
            }
            let credit = typical.map_or(MAX_SAMPLE_MS, |t| 2 * t.max(10));
            self.account(&prev, dt.clamp(0, credit));
        }
        let v = |m| g.get(m);
        if let Some(u) = v(Metric::Util) {
            self.util_n += 1;
            self.util_sum += u;
            self.util_hist[u.round().clamp(0.0, 100.0) as usize] += 1;
            self.charts.util.push(t, u);
        }
        for (acc, m) in
            self.gpm
                .iter_mut()
                .zip([Metric::SmActive, Metric::TensorActive, Metric::DramActive])
        {
            if let Some(x) = v(m) {
                acc.0 += x;
                acc.1 += 1;
            }
        }
        if let Some(m) = v(Metric::MemUsed) {
            self.mem_peak = Some(self.mem_peak.map_or(m, |p: f64| p.max(m)));
            let x = (t - self.first_ms.unwrap_or(t)) as f64 / 3.6e6;
            let y = m / 1_048_576.0;
            for (acc, add) in self.reg.iter_mut().zip([1.0, x, y, x * x, x * y]) {
                *acc += add;
            }
            self.charts.mem_used_gib.push(t, m / 1_073_741_824.0);
        }
        if let Some(m) = v(Metric::MemTotal) {
            self.mem_total = Some(m);
            self.charts.mem_total_gib = Some(m / 1_073_741_824.0);
        }
        if let Some(c) = v(Metric::Temp) {
            self.temp_max = Some(self.temp_max.map_or(c, |p: f64| p.max(c)));
            self.charts.temp.push(t, c);
        }
        if let Some(s) = v(Metric::TempSlowdown) {
            self.slowdown = Some(s);
        }
        if let Some(p) = v(Metric::Power) {
            self.power_sum += p;
            self.power_n += 1;
            self.power_max = Some(self.power_max.map_or(p, |m: f64| m.max(p)));
            self.charts.power.push(t, p);
        }
        if let Some(e) = v(Metric::Energy) {
            // Sum of increases: a counter reset (driver reload) loses nothing counted before.
            let (last, sum) = &mut self.energy_counter;
            if let Some(l) = *last {
                if e >= l {
                    *sum += e - l;
                }
            }
            *last = Some(e);
        }
        for (i, m) in [Metric::EccCorrected, Metric::EccUncorrected]
            .iter()
            .enumerate()
        {
            if let Some(x) = v(*m) {
                let (first, last) = &mut self.ecc[i];
                first.get_or_insert(x);
                *last = Some(x);
            }
        }
        self.prev = Some((t, g.values.clone()));
    }

    /// Time-weighted parts: `g` held for `dt` ms.
    fn account(&mut self, g: &MetricValues, dt: i64) {
        if g.get(Metric::Util).is_some_and(|u| u < 50.0) {
            self.util_below_50_ms += dt;
        }
        let limit = self.slowdown.unwrap_or(FALLBACK_SLOWDOWN_C);
        if g.get(Metric::Temp).is_some_and(|c| c >= limit) {
            self.above_ms += dt;
        }
        if let Some(p) = g.get(Metric::Power) {
            self.power_joules += p * dt as f64 / 1000.0;
        }
        if let Some(mask) = g.get(Metric::ClockEventReasons) {
            for name in crate::model::clock_event_names(mask as u64) {
                *self.throttle_ms.entry(name).or_default() += dt;
            }
        }
    }

    /// Notes an XID on this GPU.
    pub fn xid(&mut self, t: i64, xid: u64) {
        if self.xids.len() < 1000 {
            self.xids.push((t, xid));
        }
    }

    /// Notes a process seen on this GPU.
    pub fn process(&mut self, pid: u32, name: Option<&str>) {
        if self.procs.len() < 100 {
            self.procs.insert(match name {
                Some(n) => format!("{pid} {n}"),
                None => pid.to_string(),
            });
        }
    }

    /// The summary, and the charts.
    pub fn finish(self) -> (GpuSummary, GpuCharts) {
        let n: u64 = self.dts.values().sum();
        let mut seen = 0;
        let mut median_ms = 1000;
        for (dt, c) in &self.dts {
            seen += c;
            if seen * 2 >= n {
                median_ms = (*dt).max(10);
                break;
            }
        }
        let gaps: Vec<i64> = self
            .long_dts
            .iter()
            .copied()
            .filter(|d| *d > 2 * median_ms)
            .collect();
        let pct = |q: f64| {
            let want = (q * self.util_n as f64).ceil().max(1.0) as u64;
            let mut acc = 0;
            for (u, c) in self.util_hist.iter().enumerate() {
                acc += c;
                if acc >= want {
                    return u as f64;
                }
            }
            100.0
        };
        let util = (self.util_n > 0).then(|| Dist {
            mean: self.util_sum / self.util_n as f64,
            p50: pct(0.5),
            p95: pct(0.95),
        });
        let [k, sx, sy, sxx, sxy] = self.reg;
        let denom = k * sxx - sx * sx;
        let trend = (k >= 2.0 && denom.abs() > 1e-12).then(|| (k * sxy - sx * sy) / denom);
        let joules = if self.energy_counter.0.is_some() && self.energy_counter.1 > 0.0 {
            Some(self.energy_counter.1)
        } else {
            (self.power_n > 0).then_some(self.power_joules)
        };
        let summary = GpuSummary {
            index: self.index,
            name: self.name,
            uuid: self.uuid,
            samples: self.samples,
            first_ms: self.first_ms.unwrap_or(0),
            last_ms: self.last_ms,
            interval_s: median_ms as f64 / 1000.0,
            gaps: gaps.len() as u64,
            gap_s: gaps.iter().sum::<i64>() as f64 / 1000.0,
            util,
            util_below_50_s: self.util_below_50_ms as f64 / 1000.0,
            sm_active_mean: gpm_mean(self.gpm[0]),
            tensor_active_mean: gpm_mean(self.gpm[1]),
            dram_active_mean: gpm_mean(self.gpm[2]),
            mem_peak_bytes: self.mem_peak,
            mem_total_bytes: self.mem_total,
            mem_trend_mib_per_h: trend,
            mem_headroom_bytes: self.mem_total.zip(self.mem_peak).map(|(t, p)| t - p),
            temp_max_c: self.temp_max,
            temp_slowdown_c: self.slowdown.unwrap_or(FALLBACK_SLOWDOWN_C),
            temp_slowdown_known: self.slowdown.is_some(),
            temp_above_slowdown_s: self.above_ms as f64 / 1000.0,
            power_mean_w: (self.power_n > 0).then(|| self.power_sum / self.power_n as f64),
            power_max_w: self.power_max,
            energy_kwh: joules.map(|j| j / 3.6e6),
            throttle_s: self
                .throttle_ms
                .into_iter()
                .map(|(k, v)| (k.to_string(), v as f64 / 1000.0))
                .collect(),
            ecc_corrected: self.ecc[0]
                .0
                .zip(self.ecc[0].1)
                .map(|(a, b)| (b - a).max(0.0)),
            ecc_uncorrected: self.ecc[1]
                .0
                .zip(self.ecc[1].1)
                .map(|(a, b)| (b - a).max(0.0)),
            xids: self.xids,
            processes: self.procs.into_iter().collect(),
        };
        (summary, self.charts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DeviceId, DeviceState};

    fn sample(util: f64) -> GpuSample {
        let mut values = MetricValues::default();
        values.set(Metric::Util, Some(util));
        GpuSample {
            time_ms: 0,
            id: DeviceId::default(),
            state: DeviceState::Ok,
            values,
        }
    }

    /// A sample stands for at most twice the log's usual spacing: a 45 s pause in a 1 s log is
    /// a gap (and counted as one), not 45 s at the last value.
    #[test]
    fn a_pause_is_not_time_at_the_last_value() {
        let mut acc = GpuAcc::new(0);
        for t in 0..10 {
            acc.push(t * 1000, &sample(10.0));
        }
        acc.push(54_000, &sample(10.0));
        let (s, _) = acc.finish();
        // 9 spacings of 1 s, then the pause credited 2 s.
        assert!(
            (s.util_below_50_s - 11.0).abs() < 0.01,
            "{}",
            s.util_below_50_s
        );
        assert_eq!(s.sm_active_mean, None, "no GPM in the log: absent, not 0");
    }

    /// GPM's SM, tensor and DRAM activity are averaged over the samples that have them.
    #[test]
    fn gpm_means() {
        let mut acc = GpuAcc::new(0);
        for t in 0..4 {
            let mut g = sample(100.0);
            // the first sample has no GPM (no previous GPM sample at the first tick)
            if t > 0 {
                g.values.set(Metric::SmActive, Some(10.0 * t as f64));
                g.values.set(Metric::TensorActive, Some(1.0));
            }
            acc.push(t * 1000, &g);
        }
        let (s, _) = acc.finish();
        assert_eq!(s.sm_active_mean, Some(20.0));
        assert_eq!(s.tensor_active_mean, Some(1.0));
        assert_eq!(s.dram_active_mean, None);
    }
}
