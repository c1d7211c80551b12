//! Call counts for benchmarks: with `NVML_SIM_CALL_COUNTS=<file>` the library counts every call
//! of every exported function (and, inside `nvmlDeviceGetFieldValues`, every field id asked,
//! as `nvmlDeviceGetFieldValues[<id>]`) and writes the counts to that file when the process
//! exits (`atexit`), one `<symbol> <count>` line each, sorted. `bench/sampler.sh` compares the
//! counts of gpuwatch with those of `bench/floor.rs` to show that both made the same calls.
//!
//! Off (the default), counting costs one relaxed load per call.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

/// 0: not decided yet, 1: off, 2: on.
static STATE: AtomicU8 = AtomicU8::new(0);
static COUNTS: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

extern "C" fn write_counts() {
    let Some(path) = std::env::var_os("NVML_SIM_CALL_COUNTS").filter(|v| !v.is_empty()) else {
        return;
    };
    let counts = COUNTS.lock().unwrap_or_else(|p| p.into_inner());
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
                // (the library is never unloaded by the clients that count).
                unsafe { libc::atexit(write_counts) };
            }
            STATE.load(Ordering::Relaxed) == 2
        }
    }
}

/// Counts one call of `symbol`.
pub fn call(symbol: &str) {
    if on() {
        let mut c = COUNTS.lock().unwrap_or_else(|p| p.into_inner());
        match c.get_mut(symbol) {
            Some(n) => *n += 1,
            None => {
                c.insert(symbol.to_owned(), 1);
            }
        }
    }
}

/// Counts one field id asked in `nvmlDeviceGetFieldValues`.
pub fn field(id: u32) {
    if on() {
        *COUNTS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(format!("nvmlDeviceGetFieldValues[{id}]"))
            .or_insert(0) += 1;
    }
}
