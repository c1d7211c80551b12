//! The `gpu` object: one GPU's identity, state, processes and metric series (`gpu.util`), with
//! the window functions as by-value methods.

use std::sync::Arc;

use rhai::{Array, Dynamic, Engine, ImmutableString, Map};

use super::{duration_ms, nodata, num_arg, number, RhaiResult};
use crate::model::{clock_event_mask, DeviceState, Metric, METRICS};
use crate::window::{Agg, GpuHistory};

/// One GPU as a rule sees it (`gpu`).
#[derive(Debug, Clone)]
pub struct GpuHandle {
    pub(crate) hist: Arc<GpuHistory>,
    pub(crate) now_ms: i64,
}

impl GpuHandle {
    /// A handle on `hist` evaluated at `now_ms`.
    pub fn new(hist: Arc<GpuHistory>, now_ms: i64) -> Self {
        GpuHandle { hist, now_ms }
    }
}

/// One metric of one GPU (`gpu.util`), with the window functions as methods.
#[derive(Debug, Clone)]
pub struct Series {
    hist: Arc<GpuHistory>,
    metric: Metric,
    now_ms: i64,
}

impl Series {
    /// `()` for a missing result; the evaluation counts as "no data" unless the metric has no
    /// samples at all (not supported by this GPU or log), which is permanent, not a gap.
    fn missing(&self) -> Dynamic {
        if self.hist.window(self.metric).is_empty() {
            Dynamic::UNIT
        } else {
            nodata()
        }
    }

    fn agg(&self, agg: Agg, d: &Dynamic, arg: f64) -> RhaiResult {
        let dur = duration_ms(d)?;
        Ok(
            match self.hist.aggregate(self.metric, agg, self.now_ms, dur, arg) {
                Some(v) => Dynamic::from_float(v),
                None => self.missing(),
            },
        )
    }

    fn last_default(&self) -> Dynamic {
        // Newest value if it is at most 3 sampling intervals (at least 5 s) old.
        let fresh_ms = (self.hist.interval_ms * 3).max(5000);
        match self.hist.window(self.metric).newest() {
            Some((t, v)) if self.now_ms - t <= fresh_ms && t <= self.now_ms => {
                Dynamic::from_float(v)
            }
            _ => self.missing(),
        }
    }

    fn all(&self, d: &Dynamic, x: &Dynamic, above: bool) -> RhaiResult {
        let dur = duration_ms(d)?;
        let x = num_arg(x)?;
        let agg = if above {
            Agg::FracAbove
        } else {
            Agg::FracBelow
        };
        Ok(
            match self.hist.aggregate(self.metric, agg, self.now_ms, dur, x) {
                Some(f) => Dynamic::from_bool(f >= 1.0),
                None => self.missing(),
            },
        )
    }
}

fn processes(h: &GpuHistory) -> Array {
    h.processes
        .iter()
        .map(|p| {
            let mut m = Map::new();
            m.insert("pid".into(), Dynamic::from_int(i64::from(p.pid)));
            #[expect(
                clippy::cast_precision_loss,
                reason = "bytes fit f64 exactly below 2^53"
            )]
            m.insert(
                "used_bytes".into(),
                p.used_mem_bytes
                    .map_or(Dynamic::UNIT, |b| Dynamic::from_float(b as f64)),
            );
            m.insert(
                "user".into(),
                p.user.clone().map_or(Dynamic::UNIT, Dynamic::from),
            );
            m.insert(
                "command".into(),
                p.command.clone().map_or(Dynamic::UNIT, Dynamic::from),
            );
            m.insert(
                "runtime_s".into(),
                p.runtime_s.map_or(Dynamic::UNIT, Dynamic::from_float),
            );
            Dynamic::from_map(m)
        })
        .collect()
}

fn throttled_now(g: &GpuHandle, name: &str) -> RhaiResult {
    let mask =
        clock_event_mask(name).ok_or_else(|| format!("unknown clock event reason {name:?}"))?;
    let s = Series {
        hist: g.hist.clone(),
        metric: Metric::ClockEventReasons,
        now_ms: g.now_ms,
    };
    let last = s.last_default();
    Ok(match number(&last) {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "bitmask"
        )]
        Some(v) => Dynamic::from_bool((v as u64) & mask != 0),
        None => Dynamic::UNIT,
    })
}

/// Registers the `Gpu` and `Series` types, their properties and the window methods.
#[expect(clippy::too_many_lines, reason = "one registration list")]
pub(super) fn register(engine: &mut Engine) {
    engine.register_type_with_name::<GpuHandle>("Gpu");
    engine.register_type_with_name::<Series>("Series");

    for desc in METRICS {
        let metric = desc.id;
        engine.register_get(desc.key, move |g: &mut GpuHandle| Series {
            hist: g.hist.clone(),
            metric,
            now_ms: g.now_ms,
        });
    }
    engine.register_get("index", |g: &mut GpuHandle| i64::from(g.hist.id.index));
    engine.register_get("uuid", |g: &mut GpuHandle| g.hist.id.uuid.clone());
    engine.register_get("name", |g: &mut GpuHandle| g.hist.id.name.clone());
    engine.register_get("pci_bus_id", |g: &mut GpuHandle| {
        g.hist.id.pci_bus_id.clone()
    });
    engine.register_get("lost", |g: &mut GpuHandle| {
        g.hist.state == DeviceState::Lost
    });
    engine.register_get("processes", |g: &mut GpuHandle| processes(&g.hist));
    engine.register_get("process_count", |g: &mut GpuHandle| {
        i64::try_from(g.hist.processes.len()).unwrap_or(i64::MAX)
    });
    engine.register_get("interval", |g: &mut GpuHandle| {
        #[expect(clippy::cast_precision_loss, reason = "small")]
        if g.hist.interval_ms > 0 {
            Dynamic::from_float(g.hist.interval_ms as f64 / 1000.0)
        } else {
            Dynamic::UNIT
        }
    });
    engine.register_fn("throttled", |g: GpuHandle, name: &str| {
        throttled_now(&g, name)
    });
    engine.register_fn(
        "throttled",
        |g: GpuHandle, name: &str, d: Dynamic| -> RhaiResult {
            let mask = clock_event_mask(name)
                .ok_or_else(|| format!("unknown clock event reason {name:?}"))?;
            let dur = duration_ms(&d)?;
            #[expect(clippy::cast_precision_loss, reason = "bitmask below 2^53")]
            let arg = mask as f64;
            let series = Series {
                hist: g.hist.clone(),
                metric: Metric::ClockEventReasons,
                now_ms: g.now_ms,
            };
            Ok(
                match g
                    .hist
                    .aggregate(Metric::ClockEventReasons, Agg::FracBits, g.now_ms, dur, arg)
                {
                    Some(v) => Dynamic::from_float(v),
                    None => series.missing(),
                },
            )
        },
    );
    engine.register_fn("xids", |g: GpuHandle, d: Dynamic| -> RhaiResult {
        let dur = duration_ms(&d)?;
        Ok(Dynamic::from_array(
            g.hist
                .xids_in(g.now_ms, dur)
                .into_iter()
                .map(|c| Dynamic::from_int(i64::try_from(c).unwrap_or(i64::MAX)))
                .collect(),
        ))
    });
    engine.register_fn("to_string", |g: &mut GpuHandle| {
        format!("GPU {}", g.hist.id.index)
    });

    // Window methods, by value.
    engine.register_fn("last", |s: Series| s.last_default());
    for (name, agg) in [
        ("last", Agg::Last),
        ("mean", Agg::Mean),
        ("avg", Agg::Mean),
        ("min", Agg::Min),
        ("max", Agg::Max),
        ("stddev", Agg::Stddev),
        ("delta", Agg::Delta),
        ("increase", Agg::Increase),
        ("rate", Agg::Rate),
        ("slope", Agg::Slope),
    ] {
        window_method(engine, name, move |s, d| s.agg(agg, d, 0.0));
    }
    window_method(engine, "count", |s, d| {
        let dur = duration_ms(d)?;
        let n = s
            .hist
            .aggregate(s.metric, Agg::Count, s.now_ms, dur, 0.0)
            .unwrap_or(0.0);
        #[expect(clippy::cast_possible_truncation, reason = "a count")]
        Ok(Dynamic::from_int(n as i64))
    });
    window_method2(engine, "percentile", |s, d, p| {
        s.agg(Agg::Percentile, d, num_arg(p)?)
    });
    window_method2(engine, "pct", |s, d, p| {
        s.agg(Agg::Percentile, d, num_arg(p)?)
    });
    window_method2(engine, "frac_above", |s, d, x| {
        s.agg(Agg::FracAbove, d, num_arg(x)?)
    });
    window_method2(engine, "frac_below", |s, d, x| {
        s.agg(Agg::FracBelow, d, num_arg(x)?)
    });
    window_method2(engine, "all_above", |s, d, x| s.all(d, x, true));
    window_method2(engine, "all_below", |s, d, x| s.all(d, x, false));
    engine.register_fn(
        "idle_runs",
        |s: Series, d: Dynamic, x: Dynamic| -> RhaiResult {
            let dur = duration_ms(&d)?;
            let x = num_arg(&x)?;
            let stats = s
                .hist
                .window(s.metric)
                .runs_below(s.now_ms, dur, x, s.hist.interval_ms);
            let Some(r) = stats else {
                return Ok(s.missing());
            };
            let mut m = Map::new();
            m.insert(
                "runs".into(),
                Dynamic::from_int(i64::try_from(r.runs).unwrap_or(i64::MAX)),
            );
            m.insert("share".into(), Dynamic::from_float(r.share));
            m.insert(
                "period".into(),
                r.period_s.map_or(Dynamic::UNIT, Dynamic::from_float),
            );
            m.insert(
                "period_cv".into(),
                r.period_cv.map_or(Dynamic::UNIT, Dynamic::from_float),
            );
            m.insert("median_len".into(), Dynamic::from_float(r.median_len_s));
            Ok(Dynamic::from_map(m))
        },
    );
    engine.register_fn("maxima", |s: Series, d: Dynamic, n: i64| -> RhaiResult {
        let dur = duration_ms(&d)?;
        let n = usize::try_from(n.clamp(1, 1000)).unwrap_or(1);
        Ok(
            match s
                .hist
                .window(s.metric)
                .maxima(s.now_ms, dur, n, s.hist.interval_ms)
            {
                Some(v) => Dynamic::from_array(v.into_iter().map(Dynamic::from_float).collect()),
                None => s.missing(),
            },
        )
    });
    engine.register_fn("age", |s: Series| -> Dynamic {
        match s.hist.window(s.metric).newest() {
            #[expect(clippy::cast_precision_loss, reason = "ms")]
            Some((t, _)) => Dynamic::from_float((s.now_ms - t) as f64 / 1000.0),
            None => s.missing(),
        }
    });
    engine.register_get("supported", |s: &mut Series| {
        !s.hist.window(s.metric).is_empty()
    });
    engine.register_get("key", |s: &mut Series| s.metric.key().to_string());
    engine.register_get("unit", |s: &mut Series| s.metric.desc().unit.to_string());
}

/// Registers `name(series, duration)` with exact overloads for a duration given as a string, an
/// int or a float, and a `Dynamic` one for anything else (`()`). An exact overload resolves at
/// the first lookup; a `Dynamic` parameter alone would send every call through rhai's search
/// over argument-type permutations, whose cache does not outlive one evaluation.
fn window_method<F>(engine: &mut Engine, name: &str, f: F)
where
    F: Fn(&Series, &Dynamic) -> RhaiResult + Copy + Send + Sync + 'static,
{
    engine.register_fn(name, move |s: Series, d: ImmutableString| {
        f(&s, &Dynamic::from(d))
    });
    engine.register_fn(name, move |s: Series, d: i64| f(&s, &Dynamic::from_int(d)));
    engine.register_fn(name, move |s: Series, d: f64| {
        f(&s, &Dynamic::from_float(d))
    });
    engine.register_fn(name, move |s: Series, d: Dynamic| f(&s, &d));
}

/// [`window_method`] for `name(series, duration, number)`.
fn window_method2<F>(engine: &mut Engine, name: &str, f: F)
where
    F: Fn(&Series, &Dynamic, &Dynamic) -> RhaiResult + Copy + Send + Sync + 'static,
{
    engine.register_fn(name, move |s: Series, d: ImmutableString, x: f64| {
        f(&s, &Dynamic::from(d), &Dynamic::from_float(x))
    });
    engine.register_fn(name, move |s: Series, d: ImmutableString, x: i64| {
        f(&s, &Dynamic::from(d), &Dynamic::from_int(x))
    });
    engine.register_fn(name, move |s: Series, d: Dynamic, x: Dynamic| f(&s, &d, &x));
}
