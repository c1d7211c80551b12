//! Call counts for benchmarks: with `NVML_SIM_CALL_COUNTS=<file>` the library counts every call
//! that goes through its call guard (every NVML function but `nvmlErrorString`) and, inside
//! `nvmlDeviceGetFieldValues`, every field id asked (as `nvmlDeviceGetFieldValues[<id>]`), and
//! writes the counts to that file when the process exits (`atexit`), one `<symbol> <count>` line
//! each, sorted. `bench/sampler.sh` compares the counts of gpuwatch with those of
//! `bench/floor.rs` to show that both made the same calls.
//!
//! Counting is lock-free (a fixed table of atomics keyed by the symbol's address), so it adds
//! the same few nanoseconds per call to a multi-threaded client as to a single-threaded one.
//! Off (the default), it costs one relaxed load per call.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// 0: not decided yet, 1: off, 2: on.
static STATE: AtomicU8 = AtomicU8::new(0);

/// Slots of the symbol table (there are about 200 symbols).
const SLOTS: usize = 1024;
/// Field ids counted (NVML's are below 1024).
const FIELDS: usize = 1024;

static KEYS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static LENS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static COUNTS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
static FIELD_COUNTS: [AtomicU64; FIELDS] = [const { AtomicU64::new(0) }; FIELDS];

extern "C" fn write_counts() {
    let Some(path) = std::env::var_os("NVML_SIM_CALL_COUNTS").filter(|v| !v.is_empty()) else {
        return;
    };
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for i in 0..SLOTS {
        let key = KEYS[i].load(Ordering::Acquire);
        let len = LENS[i].load(Ordering::Acquire);
        if key == 0 || len == 0 {
            continue;
        }
        // SAFETY: `key` and `len` are the address and length of a `&'static str` given to
        // `call`, which lives as long as the library.
        let bytes = unsafe { std::slice::from_raw_parts(key as *const u8, len) };
        let name = String::from_utf8_lossy(bytes).into_owned();
        *counts.entry(name).or_insert(0) += COUNTS[i].load(Ordering::Relaxed);
    }
    for (id, c) in FIELD_COUNTS.iter().enumerate() {
        let c = c.load(Ordering::Relaxed);
        if c > 0 {
            counts.insert(format!("nvmlDeviceGetFieldValues[{id}]"), c);
        }
    }
    let text: String = counts.iter().map(|(k, v)| format!("{k} {v}\n")).collect();
    if let Err(e) = std::fs::write(&path, text) {
        eprintln!("nvml-sim: cannot write the call counts to {path:?}: {e}");
    }
}

fn on() -> bool {
    match STATE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let wanted = std::env::var_os("NVML_SIM_CALL_COUNTS").is_some_and(|v| !v.is_empty());
            // The first caller to decide registers the writer.
            if STATE
                .compare_exchange(
                    0,
                    if wanted { 2 } else { 1 },
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
                && wanted
            {
                // SAFETY: registers a plain `extern "C" fn()` that lives as long as the process
                // (the clients that count never unload the library).
                unsafe { libc::atexit(write_counts) };
            }
            STATE.load(Ordering::Relaxed) == 2
        }
    }
}

/// Counts one call of `symbol`.
pub fn call(symbol: &'static str) {
    if !on() || symbol.is_empty() {
        return;
    }
    let key = symbol.as_ptr() as usize;
    let mut i = (key >> 3).wrapping_mul(0x9E37_79B9) % SLOTS;
    for _ in 0..SLOTS {
        let k = KEYS[i].load(Ordering::Acquire);
        if k == 0 {
            match KEYS[i].compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    LENS[i].store(symbol.len(), Ordering::Release);
                    COUNTS[i].fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Err(other) if other == key => {
                    COUNTS[i].fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Err(_) => {}
            }
        } else if k == key {
            COUNTS[i].fetch_add(1, Ordering::Relaxed);
            return;
        }
        i = (i + 1) % SLOTS;
    }
}

/// Counts one field id asked in `nvmlDeviceGetFieldValues`.
pub fn field(id: u32) {
    if on() {
        if let Some(c) = FIELD_COUNTS.get(id as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }
}
