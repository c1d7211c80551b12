//! `nvml-sim`: a simulated `libnvidia-ml.so.1` driven by scenario files.
//!
//! Built as a cdylib with the soname `libnvidia-ml.so.1`, it exports the NVML C ABI that
//! nvml-wrapper, pynvml (gpustat, nvitop) and friends look up, with exact struct layouts, version
//! fields and return codes. What it reports comes from a scenario (`NVML_SIM_SCENARIO`: a shipped
//! name or a TOML path): devices, per-metric signals over scenario time, timed events (XID, ECC,
//! throttling, GPU lost), fault injection and processes. See `README.md` for the format.
//!
//! Modules: `signal` (signal shapes), `trace` (CSV replay), `scenario` (format + validation),
//! `shipped` (embedded scenarios, env), `sim` (runtime state), `errors` (return codes),
//! `ffi` (the exported C functions), `latency` (per-function call latency), `kmsg` (the
//! driver's kernel-log lines), `sysfs` (the fake sysfs tree), `gpm` (GPM samples and metrics),
//! `mig` (MIG profiles and the layout of MIG devices), `counts` (call counts for benchmarks).

pub mod counts;
pub mod errors;
pub mod ffi;
pub mod gpm;
pub mod kmsg;
pub mod latency;
pub mod mig;
pub mod nvlink;
pub mod scenario;
pub mod shipped;
pub mod signal;
pub mod sim;
pub mod sysfs;
pub mod trace;

/// Most devices a scenario may declare.
pub const MAX_DEVICES: usize = 64;
