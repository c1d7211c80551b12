//! The `host` object of `scope: "host"` rules: every present GPU, the host name, how fresh
//! the samples are, and the expected GPUs NVML does not enumerate (`host.missing_gpus`).

use rhai::{Array, Dynamic, Engine, Map};

use crate::model::MissingGpu;

use super::GpuHandle;

/// The host as a rule with `scope: "host"` sees it (`host`).
#[derive(Debug, Clone)]
pub struct HostHandle {
    /// Every GPU seen at the latest snapshot.
    pub gpus: Vec<GpuHandle>,
    /// Host name.
    pub hostname: String,
    /// Evaluation time, UTC ms.
    pub now_ms: i64,
    /// Seconds since the latest snapshot (`None` before the first).
    pub sample_age_s: Option<f64>,
    /// Sampling interval in seconds, configured or observed.
    pub interval_s: Option<f64>,
    /// How much faster than the wall clock time runs (`--speed`; 1 otherwise).
    pub clock_speed: f64,
    /// Expected GPUs NVML does not enumerate (from the latest snapshot).
    pub missing: Vec<MissingGpu>,
}

/// One missing GPU as a script sees it: `#{ pci_bus_id, uuid, name, why, description }`
/// (`uuid` and `name` are `""` when unknown, `why` is `on_bus`, `seen_before` or
/// `expected_count`).
fn missing_map(m: &MissingGpu) -> Dynamic {
    let mut map = Map::new();
    map.insert("pci_bus_id".into(), m.pci_bus_id.clone().into());
    map.insert("uuid".into(), m.uuid.clone().into());
    map.insert("name".into(), m.name.clone().into());
    map.insert(
        "why".into(),
        m.why.map_or("", crate::model::MissingWhy::as_str).into(),
    );
    map.insert("description".into(), m.describe().into());
    Dynamic::from_map(map)
}

/// Registers the `Host` type and its properties.
pub(super) fn register(engine: &mut Engine) {
    engine.register_type_with_name::<HostHandle>("Host");
    engine.register_get("gpus", |h: &mut HostHandle| -> Array {
        h.gpus.iter().cloned().map(Dynamic::from).collect()
    });
    engine.register_get("hostname", |h: &mut HostHandle| h.hostname.clone());
    engine.register_get("missing_gpus", |h: &mut HostHandle| -> Array {
        h.missing.iter().map(missing_map).collect()
    });
    engine.register_get("clock_speed", |h: &mut HostHandle| h.clock_speed);
    engine.register_get("sample_age", |h: &mut HostHandle| {
        h.sample_age_s.map_or(Dynamic::UNIT, Dynamic::from_float)
    });
    engine.register_get("interval", |h: &mut HostHandle| {
        h.interval_s.map_or(Dynamic::UNIT, Dynamic::from_float)
    });
    engine.register_get("now", |h: &mut HostHandle| {
        #[expect(clippy::cast_precision_loss, reason = "ms")]
        Dynamic::from_float(h.now_ms as f64 / 1000.0)
    });
}
