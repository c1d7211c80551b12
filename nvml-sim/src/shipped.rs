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
    ("overnight", include_str!("../scenarios/overnight.toml")),
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
/// `NVML_SIM_NOT_SUPPORTED`.
pub fn load_from_env() -> Result<Sim, String> {
    let value = std::env::var("NVML_SIM_SCENARIO")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_SCENARIO.to_string());
    let mut scenario = resolve(value.trim())?;
    let time_scale = match std::env::var("NVML_SIM_TIME_SCALE") {
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s > 0.0 && s.is_finite() => s,
            _ => return Err(format!("NVML_SIM_TIME_SCALE={v} is not a positive number")),
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
        Err(_) => 0.0,
    };
    if let Ok(list) = std::env::var("NVML_SIM_NOT_SUPPORTED") {
        scenario.faults.extend(env_faults(&list));
    }
    let control = std::env::var_os("NVML_SIM_CONTROL")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    Ok(Sim::new(scenario, time_scale, offset_s, control))
}
