//! Shipped scenarios (embedded in the library, so a name works from any directory) and the
//! environment variables that choose and tune the scenario.

use std::path::{Path, PathBuf};

use crate::scenario::{self, Scenario, ScenarioError};
use crate::sim::{env_faults, Sim};

/// Every shipped scenario: (name, TOML text). The names are an interface.
pub const SHIPPED: &[(&str, &str)] = &[
    ("healthy", include_str!("../scenarios/healthy.toml")),
    (
        "dataloader-stall",
        include_str!("../scenarios/dataloader-stall.toml"),
    ),
    ("memory-leak", include_str!("../scenarios/memory-leak.toml")),
    ("oom", include_str!("../scenarios/oom.toml")),
    ("small-batch", include_str!("../scenarios/small-batch.toml")),
    (
        "thermal-throttle",
        include_str!("../scenarios/thermal-throttle.toml"),
    ),
    (
        "power-anomaly",
        include_str!("../scenarios/power-anomaly.toml"),
    ),
    ("ecc-errors", include_str!("../scenarios/ecc-errors.toml")),
    ("xid-79", include_str!("../scenarios/xid-79.toml")),
    ("nccl-hang", include_str!("../scenarios/nccl-hang.toml")),
    ("straggler", include_str!("../scenarios/straggler.toml")),
    ("rank-dead", include_str!("../scenarios/rank-dead.toml")),
    ("overnight", include_str!("../scenarios/overnight.toml")),
    (
        "launch-bound",
        include_str!("../scenarios/launch-bound.toml"),
    ),
    (
        "no-tensor-cores",
        include_str!("../scenarios/no-tensor-cores.toml"),
    ),
    (
        "memory-bound",
        include_str!("../scenarios/memory-bound.toml"),
    ),
    ("mig", include_str!("../scenarios/mig.toml")),
    ("nvlink-down", include_str!("../scenarios/nvlink-down.toml")),
];

/// Scenario used when `NVML_SIM_SCENARIO` is unset.
pub const DEFAULT_SCENARIO: &str = "healthy";

/// Loads a shipped scenario by name.
pub fn shipped(name: &str) -> Option<Result<Scenario, ScenarioError>> {
    SHIPPED.iter().find(|(n, _)| *n == name).map(|(n, text)| {
        let mut s = scenario::parse(text, &format!("<shipped scenario {n}>"), None)?;
        if s.name.is_empty() {
            s.name = (*n).to_string();
        }
        Ok(s)
    })
}

/// Resolves `NVML_SIM_SCENARIO`'s value: a shipped name, else a TOML path.
pub fn resolve(value: &str) -> Result<Scenario, String> {
    if let Some(result) = shipped(value) {
        return result.map_err(|e| e.to_string());
    }
    let path = Path::new(value);
    if path.exists() || value.contains('/') || value.ends_with(".toml") {
        return scenario::load_file(path).map_err(|e| e.to_string());
    }
    Err(format!(
        "NVML_SIM_SCENARIO={value}: no such shipped scenario and no such file (shipped: {})",
        SHIPPED.iter().map(|s| s.0).collect::<Vec<_>>().join(", ")
    ))
}

/// Builds the simulation from the environment:
/// `NVML_SIM_SCENARIO`, `NVML_SIM_TIME_SCALE`, `NVML_SIM_START_S`, `NVML_SIM_CONTROL`,
/// `NVML_SIM_NOT_SUPPORTED`, `NVML_SIM_HIDE`, `NVML_SIM_HANG`, `NVML_SIM_LATENCY`.
pub fn load_from_env() -> Result<Sim, String> {
    let value = std::env::var("NVML_SIM_SCENARIO")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_SCENARIO.to_string());
    let mut scenario = resolve(value.trim())?;
    let time_scale = match std::env::var("NVML_SIM_TIME_SCALE") {
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s >= 0.0 && s.is_finite() => s,
            _ => {
                return Err(format!(
                    "NVML_SIM_TIME_SCALE={v} is not a number >= 0 (0 freezes the clock)"
                ))
            }
        },
        Err(_) => scenario.time_scale,
    };
    let offset_s = match std::env::var("NVML_SIM_START_S") {
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s >= 0.0 && s.is_finite() => s,
            _ => {
                return Err(format!(
                    "NVML_SIM_START_S={v} is not a time in seconds >= 0"
                ))
            }
        },
        Err(_) => scenario.start_s,
    };
    if let Ok(list) = std::env::var("NVML_SIM_NOT_SUPPORTED") {
        scenario.faults.extend(env_faults(&list));
    }
    let count = scenario.devices.len() as u32;
    if let Ok(list) = std::env::var("NVML_SIM_HIDE") {
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item.parse::<u32>() {
                Ok(g) if g < count => scenario.devices[g as usize].hidden = true,
                _ => {
                    return Err(format!(
                        "NVML_SIM_HIDE={list}: `{item}` is not a GPU index below {count}"
                    ))
                }
            }
        }
    }
    if let Ok(v) = std::env::var("NVML_SIM_HANG") {
        let hangs =
            scenario::parse_env_hangs(&v, count).map_err(|m| format!("NVML_SIM_HANG={v}: {m}"))?;
        scenario.hangs.extend(hangs);
    }
    let latency = crate::latency::Latency::new(
        scenario.latency.clone(),
        std::env::var("NVML_SIM_LATENCY").ok().as_deref(),
    )?;
    let control = std::env::var_os("NVML_SIM_CONTROL")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let mut sim = Sim::new(scenario, time_scale, offset_s, control);
    sim.latency = latency;
    Ok(sim)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{EventKind, Metric};

    #[test]
    fn every_shipped_scenario_parses_with_eight_gpus() {
        for (name, _) in SHIPPED {
            let s = shipped(name)
                .unwrap()
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(s.name, *name);
            // `mig` is three GPUs of two models
            let gpus = if *name == "mig" { 3 } else { 8 };
            assert_eq!(s.devices.len(), gpus, "{name}");
            assert_eq!(s.driver_version, "550.54.15");
            assert!(!s.description.is_empty(), "{name}");
            let sim = Sim::new(s, 1.0, 0.0, None);
            for gpu in 0..gpus {
                for t in [0.0, 1.0, 29.0, 31.0, 61.0, 300.0, 3600.0] {
                    for m in Metric::ALL {
                        let v = sim.metric(gpu, m, t);
                        assert!(v.is_finite(), "{name} gpu {gpu} {m:?} at {t}");
                    }
                }
            }
        }
    }

    fn sim(name: &str) -> Sim {
        Sim::new(shipped(name).unwrap().unwrap(), 1.0, 0.0, None)
    }

    fn mean(f: impl Fn(f64) -> f64, from: f64, to: f64) -> f64 {
        let n = 10_007;
        (0..n)
            .map(|i| f(from + (to - from) * i as f64 / n as f64))
            .sum::<f64>()
            / n as f64
    }

    #[test]
    fn healthy_is_busy_and_steady() {
        let s = sim("healthy");
        for gpu in 0..8 {
            let util = mean(|t| s.metric(gpu, Metric::GpuUtilPct, t), 0.0, 600.0);
            let power = mean(|t| s.metric(gpu, Metric::PowerW, t), 0.0, 600.0);
            assert!((93.0..=97.0).contains(&util), "util {util}");
            assert!((580.0..=620.0).contains(&power), "power {power}");
            assert_eq!(s.counters(gpu, 1e6), Default::default());
            assert_eq!(s.processes(gpu, 1.0, false).len(), 1);
        }
    }

    #[test]
    fn dataloader_stall_means_45_percent_and_idles_a_second_in_three() {
        let s = sim("dataloader-stall");
        let util = mean(|t| s.metric(0, Metric::GpuUtilPct, t), 0.0, 300.0);
        assert!((43.0..=47.0).contains(&util), "{util}");
        assert_eq!(s.metric(0, Metric::GpuUtilPct, 2.5), 0.0);
        assert!(s.metric(0, Metric::GpuUtilPct, 1.0) > 60.0);
        assert_eq!(s.clock_event_reasons(0, 2.5) & 1, 1);
    }

    #[test]
    fn memory_leak_grows_100_mb_per_minute() {
        let s = sim("memory-leak");
        let grown = s.memory_used_bytes(0, 600.0) as f64 - s.memory_used_bytes(0, 0.0) as f64;
        let per_min = grown / 10.0;
        assert!((per_min - 100e6).abs() < 1e6, "{per_min}");
    }

    #[test]
    fn oom_fills_gpu0_at_45s() {
        let s = sim("oom");
        let d = s.device(0);
        assert!(s.memory_used_bytes(0, 44.0) < d.memory_total_bytes / 10 * 8);
        assert_eq!(
            s.memory_used_bytes(0, 46.0),
            d.memory_total_bytes - d.memory_reserved_bytes
        );
        assert!(s.memory_used_bytes(1, 46.0) < d.memory_total_bytes / 10 * 8);
    }

    #[test]
    fn thermal_throttle_gpu4() {
        let s = sim("thermal-throttle");
        assert!(s.metric(4, Metric::TemperatureC, 10.0) < 75.0);
        let hot = s.metric(4, Metric::TemperatureC, 200.0);
        assert!((88.0..=90.0).contains(&hot), "{hot}");
        assert_eq!(s.clock_event_reasons(4, 59.0), 0);
        assert_eq!(s.clock_event_reasons(4, 61.0), 0x20);
        assert_eq!(s.clock_event_reasons(4, 91.0), 0x60);
        assert!(s.metric(4, Metric::SmClockMhz, 100.0) < 1300.0);
        assert_eq!(s.clock_event_reasons(3, 100.0), 0);
    }

    #[test]
    fn power_anomaly_spikes_and_drop() {
        let s = sim("power-anomaly");
        assert!(s.metric(2, Metric::PowerW, 22.0) > 700.0);
        assert!(s.metric(2, Metric::PowerW, 30.0) < 700.0);
        assert!(s.metric(2, Metric::PowerW, 82.0) > 700.0);
        assert_eq!(s.clock_event_reasons(2, 22.0), 4);
        assert!(s.metric(5, Metric::PowerW, 89.0) > 500.0);
        assert!(s.metric(5, Metric::PowerW, 91.0) < 80.0);
        assert!(s.metric(5, Metric::GpuUtilPct, 91.0) > 90.0);
    }

    #[test]
    fn ecc_errors_on_gpu2() {
        let s = sim("ecc-errors");
        assert_eq!(s.counters(2, 19.0).ecc_corrected, 0);
        assert_eq!(s.counters(2, 20.0).ecc_corrected, 4);
        assert_eq!(s.counters(2, 59.0).ecc_uncorrected, 0);
        let c = s.counters(2, 60.0);
        assert_eq!(
            (c.ecc_uncorrected, c.remapped_uncorrectable, c.remap_pending),
            (1, 1, true)
        );
        assert_eq!(s.counters(2, 1e5).ecc_corrected, 10);
        assert_eq!(s.counters(2, 1e5).ecc_uncorrected, 1);
        assert_eq!(s.counters(1, 1e5), Default::default());
    }

    #[test]
    fn xid_79_loses_gpu3_only() {
        let s = sim("xid-79");
        assert!(!s.is_lost(3, 29.9));
        assert!(s.is_lost(3, 30.0));
        assert!((0..8).filter(|g| *g != 3).all(|g| !s.is_lost(g, 1e6)));
        assert!(s.scenario.events.iter().any(|e| e.gpu == 3
            && e.at_s == 30.0
            && matches!(&e.kind, EventKind::Xid(x) if x.code == 79)));
    }

    #[test]
    fn nccl_hang_full_util_idle_power() {
        let s = sim("nccl-hang");
        for gpu in 0..8 {
            assert!(s.metric(gpu, Metric::PowerW, 20.0) > 500.0);
            for t in [31.0, 120.0, 600.0] {
                assert_eq!(s.metric(gpu, Metric::GpuUtilPct, t), 100.0);
                let p = s.metric(gpu, Metric::PowerW, t);
                assert!((85.0..=95.0).contains(&p), "{p}");
            }
            // NCCL's spinning kernels: one block per channel, most SMs empty; no math, no
            // memory traffic (not the default derived from 100 % utilization)
            let sm = mean(|t| s.metric(gpu, Metric::SmActivePct, t), 31.0, 600.0);
            assert!((10.0..=15.0).contains(&sm), "{sm}");
            assert!(mean(|t| s.metric(gpu, Metric::SmActivePct, t), 0.0, 29.0) > 75.0);
            assert!(s.metric(gpu, Metric::TensorActivePct, 120.0) < 1.0);
            assert!(s.metric(gpu, Metric::DramActivePct, 120.0) < 1.0);
            assert!(s.metric(gpu, Metric::GrEngineActivePct, 120.0) > 95.0);
        }
    }

    #[test]
    fn straggler_gpu0_lags_its_peers_for_ten_minutes() {
        let s = sim("straggler");
        let util = |gpu, from, to| mean(|t| s.metric(gpu, Metric::GpuUtilPct, t), from, to);
        assert!((76.0..=82.0).contains(&util(0, 0.0, 59.0)));
        let lagging = util(0, 60.0, 659.0);
        assert!((6.0..=10.0).contains(&lagging), "{lagging}");
        assert!((76.0..=82.0).contains(&util(0, 660.0, 900.0)));
        assert!(s.metric(0, Metric::PowerW, 300.0) < 150.0);
        for gpu in 1..8 {
            assert!((76.0..=82.0).contains(&util(gpu, 60.0, 659.0)), "{gpu}");
            assert!(s.metric(gpu, Metric::PowerW, 300.0) > 400.0);
        }
        assert!(s.memory_used_bytes(0, 300.0) > 60_000 * 1024 * 1024);
    }

    #[test]
    fn rank_dead_gpu3_exits_while_the_others_hang() {
        let s = sim("rank-dead");
        assert!(s.metric(3, Metric::GpuUtilPct, 59.0) > 90.0);
        assert_eq!(s.metric(3, Metric::GpuUtilPct, 60.0), 0.0);
        assert_eq!(s.memory_used_bytes(3, 61.0), 4 * 1024 * 1024);
        assert!(s.metric(3, Metric::PowerW, 120.0) < 75.0);
        assert_eq!(s.clock_event_reasons(3, 120.0), 1);
        let procs = |t: f64| {
            s.scenario
                .processes
                .iter()
                .filter(|p| p.gpu == 3 && p.from_s <= t && t < p.until_s)
                .count()
        };
        assert_eq!((procs(59.0), procs(60.0)), (1, 0));
        for gpu in (0..8).filter(|g| *g != 3) {
            assert!(s.metric(gpu, Metric::PowerW, 30.0) > 500.0);
            for t in [61.0, 300.0, 3600.0] {
                assert_eq!(s.metric(gpu, Metric::GpuUtilPct, t), 100.0);
                let p = s.metric(gpu, Metric::PowerW, t);
                assert!((85.0..=95.0).contains(&p), "{p}");
                assert!(s.memory_used_bytes(gpu, t) > 60_000 * 1024 * 1024);
                let sm = s.metric(gpu, Metric::SmActivePct, t);
                assert!((10.0..=15.0).contains(&sm), "{sm}");
            }
        }
        assert_eq!(s.metric(3, Metric::SmActivePct, 120.0), 0.0);
        assert!(s.metric(3, Metric::SmActivePct, 30.0) > 75.0);
    }

    #[test]
    fn overnight_mix() {
        let s = sim("overnight");
        let util1 = mean(|t| s.metric(1, Metric::GpuUtilPct, t), 0.0, 300.0);
        assert!((43.0..=47.0).contains(&util1), "{util1}");
        assert!(s.memory_used_bytes(2, 3600.0) > s.memory_used_bytes(2, 0.0) + 5_000_000_000);
        assert_eq!(s.clock_event_reasons(3, 250.0), 0x60);
        assert_eq!(s.counters(4, 130.0).ecc_uncorrected, 1);
        assert!(s.is_lost(5, 600.0) && !s.is_lost(5, 599.0));
        assert_eq!(s.metric(6, Metric::GpuUtilPct, 100.0), 0.0);
        assert_eq!(s.memory_used_bytes(6, 100.0), 20480 * 1024 * 1024);
        assert_eq!(s.clock_event_reasons(6, 100.0), 1);
    }

    #[test]
    fn mig_splits_an_a100_and_an_h100() {
        let s = sim("mig");
        let a100 = &s.device(0).mig;
        assert!(a100.active() && a100.devices.len() == 7);
        assert!(a100.devices.iter().all(|m| m.profile.name == "1g.10gb"));
        let h100: Vec<&str> = s
            .device(1)
            .mig
            .devices
            .iter()
            .map(|m| m.profile.name.as_str())
            .collect();
        assert_eq!(h100, ["3g.40gb", "2g.20gb", "1g.10gb"]);
        assert!(!s.device(2).mig.active() && s.device(2).mig.capable);
        // one process per A100 MIG device, each with its own amount; the GPU's used memory is
        // their sum
        let procs = s.processes(0, 100.0, false);
        assert_eq!(procs.len(), 7);
        let mut used: Vec<u64> = (0..7)
            .map(|k| s.mig_memory_used_bytes(0, k, 100.0))
            .collect();
        assert_eq!(s.memory_used_bytes(0, 100.0), used.iter().sum::<u64>());
        used.dedup();
        assert_eq!(used.len(), 7, "{used:?}");
        assert_eq!(s.mig_memory_used_bytes(1, 0, 5.0), 30000 * 1024 * 1024);
        assert_eq!(s.mig_memory_used_bytes(1, 2, 5.0), 0, "the 1g.10gb is idle");
        assert_eq!(
            s.processes(1, 5.0, false)
                .iter()
                .map(|p| p.mig)
                .collect::<Vec<_>>(),
            [Some(0), Some(1)]
        );
        assert_eq!(s.processes(2, 5.0, false)[0].mig, None);
    }

    #[test]
    fn mig_scenario_errors() {
        let bad = |text: &str| {
            crate::scenario::parse(text, "t.toml", None)
                .unwrap_err()
                .to_string()
        };
        let head =
            "[devices]\ncount = 2\n[[device]]\nindex = 0\nmig = [\"3g.40gb\", \"1g.10gb\"]\n";
        let e = bad(&format!("{head}[[process]]\ngpu = 0\npid = 1\n"));
        assert!(e.contains("needs `mig`"), "{e}");
        let e = bad(&format!("{head}[[process]]\ngpu = 1\nmig = 0\npid = 1\n"));
        assert!(e.contains("MIG disabled"), "{e}");
        let e = bad(&format!("{head}[[process]]\ngpu = 0\nmig = 5\npid = 1\n"));
        assert!(e.contains("out of range"), "{e}");
        let e = bad("[[device]]\nindex = 0\nmig = [\"4g.40gb\", \"4g.40gb\"]\n");
        assert!(e.starts_with("t.toml:3:"), "{e}");
        assert!(e.contains("compute slices"), "{e}");
        let e = bad("[[device]]\nindex = 0\nmig = [\"1g.10gb\", { profile = \"2g.20gb\", placement = 0 }]\n");
        assert!(e.contains("overlaps"), "{e}");
        let e = bad("[[device]]\nindex = 0\nname = \"NVIDIA L40S\"\nmig = [\"1g.10gb\"]\n");
        assert!(e.contains("does not support MIG"), "{e}");
    }

    /// The GPM scenarios: each one's pattern in its GPM signals, and on every GPU.
    #[test]
    fn gpm_scenarios() {
        let s = sim("launch-bound");
        for gpu in 0..8 {
            let util = mean(|t| s.metric(gpu, Metric::GpuUtilPct, t), 60.0, 600.0);
            let sm = mean(|t| s.metric(gpu, Metric::SmActivePct, t), 60.0, 600.0);
            let power = mean(|t| s.metric(gpu, Metric::PowerW, t), 60.0, 600.0);
            assert!(util >= 98.0 && (8.0..=12.0).contains(&sm), "{util} {sm}");
            assert!(
                (200.0..=260.0).contains(&power),
                "not an NCCL hang: {power}"
            );
            assert!(mean(|t| s.metric(gpu, Metric::SmActivePct, t), 0.0, 59.0) > 75.0);
            assert!(s.device(gpu).gpm);
        }
        let s = sim("no-tensor-cores");
        let sm = mean(|t| s.metric(3, Metric::SmActivePct, t), 20.0, 600.0);
        let tensor = mean(|t| s.metric(3, Metric::TensorActivePct, t), 20.0, 600.0);
        let hmma = mean(|t| s.metric(3, Metric::HmmaActivePct, t), 20.0, 600.0);
        assert!(
            sm > 80.0 && tensor < 1.0 && hmma < 1.0,
            "{sm} {tensor} {hmma}"
        );
        let s = sim("memory-bound");
        let dram = mean(|t| s.metric(5, Metric::DramActivePct, t), 20.0, 600.0);
        let util = mean(|t| s.metric(5, Metric::GpuUtilPct, t), 20.0, 600.0);
        assert!(dram > 90.0 && util > 97.0, "{dram} {util}");
    }

    #[test]
    fn unknown_name_lists_shipped() {
        let err = resolve("no-such-scenario").unwrap_err();
        assert!(
            err.contains("healthy") && err.contains("overnight"),
            "{err}"
        );
    }
}
