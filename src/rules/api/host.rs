//! The `host` object of `scope: "host"` rules: every present GPU, the host name, how fresh
//! the samples are, and the expected GPUs NVML does not enumerate (`host.missing_gpus`).

use rhai::{Array, Dynamic, Engine, Map};

use crate::model::MissingGpu;

use super::{read_fields as read, GpuHandle};

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
    /// The indices of `gpus`, in their order (kept by [`HostHandle::clone_fields`], which drops
    /// the GPUs).
    pub present: Vec<u32>,
}

/// The host fields a host-scope evaluation can read, one bit each.
const HOSTNAME: u16 = 1;
const MISSING: u16 = 2;
const CLOCK_SPEED: u16 = 4;
const SAMPLE_AGE: u16 = 8;
const INTERVAL: u16 = 16;
const NOW: u16 = 32;
/// `host.gpus`: the GPUs present (what the evaluation read of each is in its GPU trace).
const GPUS: u16 = 64;

/// Stops tracing: what the evaluation of `host` read, unless it had an effect. (`seen`: the
/// host's fields, [`HostHandle::clone_fields`]; `gpus`: what it read of its GPUs, as
/// `gpu::finish_trace` gives it — none when it had an effect.)
pub(crate) fn finish_trace(seen: HostHandle, gpus: Option<super::gpu::Trace>) -> Option<HostTrace> {
    let read = super::finish_fields_trace();
    Some(HostTrace {
        read,
        seen,
        gpus: gpus?,
    })
}

/// The host fields one host-scope evaluation read, with their values, and what it read of each
/// GPU. Such an evaluation is a function of them alone (it had no effect: see `gpu::Trace`), so
/// while they read the same its result can be reused — `collector_stale` and `gpu_missing` run
/// at every sample, `rank_dead` reads every GPU every 10 s and finds the same on a healthy box.
#[derive(Debug, Clone)]
pub struct HostTrace {
    read: u16,
    seen: HostHandle,
    gpus: super::gpu::Trace,
}

fn same(a: Option<f64>, b: Option<f64>) -> bool {
    a.map(f64::to_bits) == b.map(f64::to_bits)
}

impl HostTrace {
    /// Whether every field the evaluation read still has the same value in `host` (the GPUs
    /// present included) and every input it read of a GPU (`gpu(index)`) the same value.
    pub fn holds<'a>(
        &self,
        host: &HostHandle,
        gpu: impl Fn(u32) -> Option<&'a crate::window::GpuHistory>,
    ) -> bool {
        let (r, s) = (self.read, &self.seen);
        (r & GPUS == 0 || s.present == host.present)
            && (r & HOSTNAME == 0 || s.hostname == host.hostname)
            && (r & MISSING == 0 || s.missing == host.missing)
            && (r & CLOCK_SPEED == 0 || s.clock_speed.to_bits() == host.clock_speed.to_bits())
            && (r & SAMPLE_AGE == 0 || same(s.sample_age_s, host.sample_age_s))
            && (r & INTERVAL == 0 || same(s.interval_s, host.interval_s))
            && (r & NOW == 0 || s.now_ms == host.now_ms)
            && self.gpus.holds_on(gpu, host.now_ms)
    }
}

impl HostHandle {
    /// A copy without the GPUs (their indices kept in `present`).
    pub(crate) fn clone_fields(&self) -> HostHandle {
        HostHandle {
            gpus: Vec::new(),
            present: self.present.clone(),
            hostname: self.hostname.clone(),
            now_ms: self.now_ms,
            sample_age_s: self.sample_age_s,
            interval_s: self.interval_s,
            clock_speed: self.clock_speed,
            missing: self.missing.clone(),
        }
    }
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
        read(GPUS);
        h.gpus.iter().cloned().map(Dynamic::from).collect()
    });
    engine.register_get("hostname", |h: &mut HostHandle| {
        read(HOSTNAME);
        h.hostname.clone()
    });
    engine.register_get("missing_gpus", |h: &mut HostHandle| -> Array {
        read(MISSING);
        h.missing.iter().map(missing_map).collect()
    });
    engine.register_get("clock_speed", |h: &mut HostHandle| {
        read(CLOCK_SPEED);
        h.clock_speed
    });
    engine.register_get("sample_age", |h: &mut HostHandle| {
        read(SAMPLE_AGE);
        h.sample_age_s.map_or(Dynamic::UNIT, Dynamic::from_float)
    });
    engine.register_get("interval", |h: &mut HostHandle| {
        read(INTERVAL);
        h.interval_s.map_or(Dynamic::UNIT, Dynamic::from_float)
    });
    engine.register_get("now", |h: &mut HostHandle| {
        read(NOW);
        #[expect(clippy::cast_precision_loss, reason = "ms")]
        Dynamic::from_float(h.now_ms as f64 / 1000.0)
    });
}
