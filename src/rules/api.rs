//! The script API: one file per object rules see — [`gpu`] (with its metric series and window
//! methods), [`host`], [`process`] and [`job`] — and here the shared helpers: units, `param`,
//! durations and the `()`-propagating operators.
//!
//! Handles are cheap by-value clones of an `Arc<GpuHistory>` plus the evaluation time; every
//! window method is registered by value (no `&mut` chains). A method that cannot answer for lack
//! of data returns `()` and marks the evaluation as "no data" (see `rules::EvalResult::NoData`).

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use rhai::{Array, Dynamic, Engine, EvalAltResult, ImmutableString, Map, Position};

pub mod gpu;
pub mod host;
pub mod job;
pub mod process;

pub use gpu::{GpuHandle, Series};
pub use host::HostHandle;
pub use job::JobHandle;
pub use process::ProcessHandle;

pub(crate) type RhaiResult = Result<Dynamic, Box<EvalAltResult>>;

thread_local! {
    /// Set when a window method returned `()` for lack of data during the current evaluation.
    pub(crate) static NODATA: Cell<bool> = const { Cell::new(false) };
    /// True while a rule file's top level runs (the only time `rule(..)` may be called).
    pub(crate) static LOADING: Cell<bool> = const { Cell::new(false) };
    /// Parameters of the rule (or file) being evaluated, for `param()`.
    pub(crate) static PARAMS: RefCell<Option<Arc<Map>>> = const { RefCell::new(None) };
    /// The host's or process's fields the evaluation being traced has read, one bit each (each
    /// scope numbers its own; `None` while none is traced).
    static FIELDS_READ: Cell<Option<u16>> = const { Cell::new(None) };
}

/// Notes that the evaluation being traced read the fields `bits` of its host or process.
pub(crate) fn read_fields(bits: u16) {
    FIELDS_READ.with(|f| {
        if let Some(read) = f.get() {
            f.set(Some(read | bits));
        }
    });
}

/// Starts tracing the host's or process's fields the evaluation about to run reads (what it
/// reads of a GPU is traced by `gpu::start_trace`).
pub(crate) fn start_fields_trace() {
    FIELDS_READ.with(|f| f.set(Some(0)));
}

/// Stops tracing: the fields the evaluation read.
pub(crate) fn finish_fields_trace() -> u16 {
    FIELDS_READ.with(Cell::take).unwrap_or(0)
}

pub(crate) fn nodata() -> Dynamic {
    NODATA.with(|c| c.set(true));
    Dynamic::UNIT
}

/// The longest string `join` makes (the sandbox's string limit).
const MAX_JOINED_BYTES: usize = 64 * 1024;

/// The longest window a rule may ask for: a window keeps its samples for as long as a rule asks
/// (a year of 1 s samples would be gigabytes, copied whole by a percentile).
pub(crate) const MAX_WINDOW_MS: i64 = 24 * 3_600_000;

/// A duration argument: `"90s"`, `"5m"`, `"1h"` or a number of seconds; at most
/// [`MAX_WINDOW_MS`].
pub(crate) fn duration_ms(d: &Dynamic) -> Result<i64, Box<EvalAltResult>> {
    let ms = any_duration_ms(d)?;
    if ms > MAX_WINDOW_MS {
        return Err(format!(
            "a window of {} is longer than the longest a rule may ask for (24h)",
            crate::values::format_duration_ms(ms)
        )
        .into());
    }
    Ok(ms)
}

/// A duration argument with no upper bound (a rule's `for`, `repeat`, `every`).
pub(crate) fn any_duration_ms(d: &Dynamic) -> Result<i64, Box<EvalAltResult>> {
    if let Some(s) = d.read_lock::<ImmutableString>() {
        return crate::values::parse_duration_ms(&s).map_err(Into::into);
    }
    let secs = number(d).ok_or_else(|| -> Box<EvalAltResult> {
        format!(
            "expected a duration such as \"5m\" or a number of seconds, got {}",
            d.type_name()
        )
        .into()
    })?;
    if !(0.0..=1e9).contains(&secs) {
        return Err(format!("duration {secs} s out of range").into());
    }
    #[expect(clippy::cast_possible_truncation, reason = "range checked")]
    Ok((secs * 1000.0).round() as i64)
}

/// An int or float as f64.
pub(crate) fn number(d: &Dynamic) -> Option<f64> {
    if let Ok(f) = d.as_float() {
        return Some(f);
    }
    #[expect(clippy::cast_precision_loss, reason = "script integers are small")]
    d.as_int().ok().map(|i| i as f64)
}

pub(crate) fn num_arg(d: &Dynamic) -> Result<f64, Box<EvalAltResult>> {
    number(d).ok_or_else(|| format!("expected a number, got {}", d.type_name()).into())
}

/// `param(name, default)`: the `[rules.params]` override for the current rule, else `default`.
/// An override of another kind than the default (a string for a number, …) is an error: rhai
/// compares mismatched types as `false`, which would silently disable the rule.
fn param(key: &str, default: Dynamic) -> RhaiResult {
    let found = PARAMS.with(|p| p.borrow().as_ref().and_then(|m| m.get(key).cloned()));
    let Some(v) = found else {
        return Ok(default);
    };
    let expected = if default.is_float() || default.is_int() {
        match number(&v) {
            Some(n) if default.is_float() => return Ok(Dynamic::from_float(n)),
            Some(_) => return Ok(v),
            None => "a number",
        }
    } else if default.is_string() && !v.is_string() && number(&v).is_none() {
        "a string or a number (e.g. a duration: \"10m\" or seconds)"
    } else if default.is_bool() && !v.is_bool() {
        "true or false"
    } else {
        return Ok(v);
    };
    Err(format!(
        "[rules.params] parameter `{key}` must be {expected}, not {} ({v})",
        v.type_name()
    )
    .into())
}

macro_rules! unit_ops {
    ($engine:expr, $($op:literal),*) => {$(
        $engine.register_fn($op, |_: (), _: f64| Dynamic::UNIT);
        $engine.register_fn($op, |_: f64, _: ()| Dynamic::UNIT);
        $engine.register_fn($op, |_: (), _: i64| Dynamic::UNIT);
        $engine.register_fn($op, |_: i64, _: ()| Dynamic::UNIT);
        $engine.register_fn($op, |_: (), _: ()| Dynamic::UNIT);
    )*};
}

/// Registers the whole script API on `engine`: the four handles, then the shared helpers.
pub(crate) fn register(engine: &mut Engine) {
    gpu::register(engine);
    host::register(engine);
    process::register(engine);
    job::register(engine);
    // Units: MiB(4) is 4 MiB in bytes; to_MiB(bytes) is the reverse. `()` stays `()`.
    for (name, scale) in [
        ("KiB", 1024.0),
        ("MiB", 1_048_576.0),
        ("GiB", 1_073_741_824.0),
    ] {
        engine.register_fn(name, move |x: Dynamic| match number(&x) {
            Some(v) => Dynamic::from_float(v * scale),
            None => Dynamic::UNIT,
        });
        engine.register_fn(format!("to_{name}"), move |x: Dynamic| match number(&x) {
            Some(v) => Dynamic::from_float(v / scale),
            None => Dynamic::UNIT,
        });
        // Exact overloads resolve without the search over `Dynamic` parameters.
        engine.register_fn(name, move |x: f64| x * scale);
        #[expect(clippy::cast_precision_loss, reason = "script integers are small")]
        engine.register_fn(name, move |x: i64| x as f64 * scale);
        engine.register_fn(format!("to_{name}"), move |x: f64| x / scale);
    }
    // Rounding helper for summaries: fmt(x, digits).
    engine.register_fn("fmt", |x: Dynamic, digits: i64| -> String {
        match number(&x) {
            Some(v) => format!("{v:.*}", usize::try_from(digits.clamp(0, 12)).unwrap_or(0)),
            None => "n/a".to_string(),
        }
    });
    engine.register_fn("fmt", |x: f64, digits: i64| -> String {
        format!("{x:.*}", usize::try_from(digits.clamp(0, 12)).unwrap_or(0))
    });
    engine.register_fn("param", |key: &str, default: Dynamic| param(key, default));
    engine.register_fn(
        "join",
        |a: Array, sep: &str| -> Result<String, Box<EvalAltResult>> {
            // Checked while it is built: rhai checks a string's size only once it is made.
            let mut out = String::new();
            for (i, item) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                out.push_str(&item.to_string());
                if out.len() > MAX_JOINED_BYTES {
                    return Err("join: the result is over 64 KiB".into());
                }
            }
            Ok(out)
        },
    );
    engine.register_fn("is_nodata", |x: Dynamic| x.is_unit());

    // `()` means "no data": arithmetic with it stays `()`; comparisons with it are false
    // (rhai's default for mismatched types).
    unit_ops!(engine, "+", "-", "*", "/", "%");
    engine.register_fn("abs", |_: ()| Dynamic::UNIT);
}

/// Position of the innermost error and its message without the position.
pub(crate) fn split_error(err: Box<EvalAltResult>) -> (Position, String) {
    let outer_pos = err.position();
    let mut err = err;
    loop {
        match *err {
            EvalAltResult::ErrorInFunctionCall(_, _, inner, _) => err = inner,
            other => {
                let mut other = other;
                let pos = other.take_position();
                let pos = if pos.is_none() { outer_pos } else { pos };
                let msg = match other {
                    EvalAltResult::ErrorTooManyOperations(_) => format!(
                        "too many operations (limit {}): runaway loop stopped",
                        super::MAX_OPERATIONS
                    ),
                    _ => other.to_string(),
                };
                return (pos, msg);
            }
        }
    }
}
