//! The `host` object of `scope: "host"` rules: every present GPU, the host name, and how fresh
//! the samples are.

use rhai::{Array, Dynamic, Engine};

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
}

/// Registers the `Host` type and its properties.
pub(super) fn register(engine: &mut Engine) {
    engine.register_type_with_name::<HostHandle>("Host");
    engine.register_get("gpus", |h: &mut HostHandle| -> Array {
        h.gpus.iter().cloned().map(Dynamic::from).collect()
    });
    engine.register_get("hostname", |h: &mut HostHandle| h.hostname.clone());
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
