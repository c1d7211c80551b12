//! The exported NVML C ABI: call guards (init check, handle resolution, GPU-lost, fault
//! injection, debug logging, panic containment) and the system-level functions.
//!
//! Device getters live in `ffi/device.rs`, event sets in `ffi/events.rs`, GPM in `ffi/gpm.rs`,
//! NOT_SUPPORTED stubs in `ffi/stubs.rs`. Layouts come from `nvml_wrapper_sys::bindings`; sizes
//! are asserted below.

// Exported functions take raw pointers from C callers; their contract is NVML's documentation.
#![allow(clippy::missing_safety_doc)]

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

use nvml_wrapper_sys::bindings::*;

use crate::sim::{self, code, Sim};

mod device;
mod events;
mod gpm;
mod mig;
mod nvlink;
mod stubs;

// Compile-time layout checks (x86_64 / aarch64 Linux), so a binding change cannot shift a layout.
const _: () = {
    assert!(std::mem::size_of::<nvmlUtilization_t>() == 8);
    assert!(std::mem::size_of::<nvmlMemory_t>() == 24);
    assert!(std::mem::size_of::<nvmlMemory_v2_t>() == 40);
    assert!(std::mem::size_of::<nvmlProcessInfo_t>() == 24);
    assert!(std::mem::size_of::<nvmlPciInfo_t>() == 68);
    assert!(std::mem::size_of::<nvmlProcessUtilizationSample_t>() == 32);
    assert!(std::mem::size_of::<nvmlValue_t>() == 8);
    assert!(std::mem::size_of::<nvmlSample_t>() == 16);
    assert!(std::mem::size_of::<nvmlFieldValue_t>() == 40);
    assert!(std::mem::size_of::<nvmlEventData_t>() == 32);
    assert!(std::mem::size_of::<nvmlBAR1Memory_t>() == 24);
    assert!(std::mem::size_of::<nvmlTemperature_t>() == 12);
    assert!(std::mem::size_of::<nvmlViolationTime_t>() == 16);
    assert!(std::mem::size_of::<nvmlGpmSupport_t>() == 8);
    assert!(std::mem::size_of::<nvmlGpmMetric_t>() == 40);
    assert!(std::mem::offset_of!(nvmlGpmMetricsGet_t, metrics) == 24);
};

/// Version word of `nvmlMemory_v2_t` (`sizeof | 2 << 24`).
pub const MEMORY_V2_VERSION: u32 = 40 | (2 << 24);
/// Version word of `nvmlTemperature_v1_t`.
pub const TEMPERATURE_V1_VERSION: u32 = 12 | (1 << 24);

/// Opaque device handles: addresses inside this array (never dereferenced by clients).
static HANDLES: [u8; crate::MAX_DEVICES] = [0; crate::MAX_DEVICES];

/// The handle of device `index`.
pub fn handle_of(index: usize) -> nvmlDevice_t {
    HANDLES.as_ptr().wrapping_add(index) as nvmlDevice_t
}

/// The scenario index of a handle, if it is one of ours and the device is enumerated.
fn index_of(handle: nvmlDevice_t, sim: &Sim) -> Option<usize> {
    let offset = (handle as usize).wrapping_sub(HANDLES.as_ptr() as usize);
    (offset < sim.device_count() && sim.nvml_index(offset).is_some()).then_some(offset)
}

fn debug_enabled() -> bool {
    static DEBUG: OnceLock<bool> = OnceLock::new();
    *DEBUG.get_or_init(|| std::env::var("NVML_SIM_DEBUG").is_ok_and(|v| !v.is_empty() && v != "0"))
}

thread_local! {
    /// The GPU index of the current call, for the debug log.
    static CALL_GPU: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Runs an export's body: contains panics (→ UNKNOWN), sleeps for the function's latency once a
/// scenario is loaded (like a real driver; see `latency.rs`) and logs the call when
/// NVML_SIM_DEBUG=1.
pub(crate) fn entry(name: &'static str, body: impl FnOnce() -> Result<(), u32>) -> nvmlReturn_t {
    CALL_GPU.with(|c| c.set(None));
    crate::counts::call(name);
    // The call's latency passes before it answers, so the answer is the state at its return (a
    // PCIe throughput is the window ending then). nvmlInit* spends its cost inside `sim::init`
    // (the first before the scenario clock starts; later ones only when NVML was shut down:
    // initialising an initialised library only counts it up).
    if let Some(sim) = sim::loaded().filter(|_| !name.starts_with("nvmlInit")) {
        let cost = sim.latency.of(name);
        if !cost.is_zero() {
            crate::latency::spend_cost(cost);
        }
    }
    let result = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => code::SUCCESS,
        Ok(Err(c)) => c,
        Err(_) => code::UNKNOWN,
    };
    if debug_enabled() {
        let gpu = CALL_GPU.with(Cell::get);
        let t = sim::current().map(|s| s.now_s()).unwrap_or(0.0);
        match gpu {
            Some(g) => eprintln!(
                "nvml-sim: t={t:.3}s {name}(gpu {g}) -> {result} {}",
                crate::errors::name_of(result)
            ),
            None => eprintln!(
                "nvml-sim: t={t:.3}s {name}() -> {result} {}",
                crate::errors::name_of(result)
            ),
        }
    }
    result
}

/// Context of a device call.
pub(crate) struct Dev {
    pub sim: Arc<Sim>,
    pub gpu: usize,
    pub t: f64,
}

impl Dev {
    pub fn spec(&self) -> &crate::scenario::DeviceSpec {
        self.sim.device(self.gpu)
    }
    pub fn metric(&self, m: crate::scenario::Metric) -> f64 {
        self.sim.metric(self.gpu, m, self.t)
    }
}

/// Resolves a device handle: UNINITIALIZED, INVALID_ARGUMENT, hangs, injected faults,
/// GPU_IS_LOST. A MIG device handle answers NOT_SUPPORTED (after its GPU's checks): only the
/// MIG-aware getters take one (`mig::dev_or_mig`).
pub(crate) fn dev(name: &'static str, handle: nvmlDevice_t) -> Result<Dev, u32> {
    let sim = sim::current()?;
    let Some(gpu) = index_of(handle, &sim) else {
        let (gpu, _) = mig::mig_of(handle, &sim).ok_or(code::INVALID_ARGUMENT)?;
        guard(name, sim, gpu)?;
        return Err(code::NOT_SUPPORTED);
    };
    guard(name, sim, gpu)
}

/// The checks of a call on `gpu` (hangs, injected faults, GPU_IS_LOST), for the debug log's GPU.
pub(crate) fn guard(name: &'static str, sim: Arc<Sim>, gpu: usize) -> Result<Dev, u32> {
    CALL_GPU.with(|c| c.set(Some(gpu)));
    sim.hang(name, gpu);
    let t = sim.now_s();
    sim.inject(name, Some(gpu), t)?;
    if sim.is_lost(gpu, t) {
        return Err(code::GPU_IS_LOST);
    }
    Ok(Dev { sim, gpu, t })
}

/// A system-level call: UNINITIALIZED and injected faults.
pub(crate) fn system(name: &'static str) -> Result<Arc<Sim>, u32> {
    let sim = sim::current()?;
    sim.inject(name, None, sim.now_s())?;
    Ok(sim)
}

/// Writes `value` through `ptr` (INVALID_ARGUMENT when null).
pub(crate) unsafe fn put<T>(ptr: *mut T, value: T) -> Result<(), u32> {
    if ptr.is_null() {
        return Err(code::INVALID_ARGUMENT);
    }
    // SAFETY: non-null pointer to caller-owned storage for a T, per the NVML contract.
    unsafe { ptr.write(value) };
    Ok(())
}

/// Copies `s` and a NUL into a caller buffer of `length` bytes (INSUFFICIENT_SIZE when short).
pub(crate) unsafe fn put_str(buf: *mut c_char, length: c_uint, s: &str) -> Result<(), u32> {
    if buf.is_null() {
        return Err(code::INVALID_ARGUMENT);
    }
    let bytes = s.as_bytes();
    if bytes.len() + 1 > length as usize {
        return Err(code::INSUFFICIENT_SIZE);
    }
    // SAFETY: the caller provides `length` writable bytes; we write len + 1 <= length.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), bytes.len());
        *buf.add(bytes.len()) = 0;
    }
    Ok(())
}

/// Reads a caller's C string (INVALID_ARGUMENT when null or not UTF-8).
pub(crate) unsafe fn get_str<'a>(ptr: *const c_char) -> Result<&'a str, u32> {
    if ptr.is_null() {
        return Err(code::INVALID_ARGUMENT);
    }
    // SAFETY: NVML's contract: a NUL-terminated string.
    unsafe { CStr::from_ptr(ptr) }
        .to_str()
        .map_err(|_| code::INVALID_ARGUMENT)
}

// ---------------------------------------------------------------------------------------------
// Init and system

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    entry("nvmlInit_v2", || sim::init("nvmlInit_v2"))
}

#[no_mangle]
pub extern "C" fn nvmlInit() -> nvmlReturn_t {
    entry("nvmlInit", || sim::init("nvmlInit"))
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    entry("nvmlInitWithFlags", || sim::init("nvmlInitWithFlags"))
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    entry("nvmlShutdown", sim::shutdown)
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    crate::errors::description(result)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    entry("nvmlSystemGetDriverVersion", || {
        let sim = system("nvmlSystemGetDriverVersion")?;
        unsafe { put_str(version, length, &sim.scenario.driver_version) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    entry("nvmlSystemGetNVMLVersion", || {
        let sim = system("nvmlSystemGetNVMLVersion")?;
        unsafe { put_str(version, length, &sim.scenario.nvml_version) }
    })
}

unsafe fn cuda_version(name: &'static str, out: *mut c_int) -> nvmlReturn_t {
    entry(name, || {
        let sim = system(name)?;
        unsafe { put(out, sim.scenario.cuda_driver_version) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> nvmlReturn_t {
    unsafe { cuda_version("nvmlSystemGetCudaDriverVersion", v) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> nvmlReturn_t {
    unsafe { cuda_version("nvmlSystemGetCudaDriverVersion_v2", v) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetProcessName(
    pid: c_uint,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    entry("nvmlSystemGetProcessName", || {
        let sim = system("nvmlSystemGetProcessName")?;
        if let Some(n) = sim.process_name(pid) {
            return unsafe { put_str(name, length, n) };
        }
        let comm =
            std::fs::read_to_string(format!("/proc/{pid}/comm")).map_err(|_| code::NOT_FOUND)?;
        unsafe { put_str(name, length, comm.trim_end()) }
    })
}

unsafe fn device_count(name: &'static str, count: *mut c_uint) -> nvmlReturn_t {
    entry(name, || {
        let sim = system(name)?;
        unsafe { put(count, sim.visible_count() as c_uint) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    unsafe { device_count("nvmlDeviceGetCount_v2", count) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> nvmlReturn_t {
    unsafe { device_count("nvmlDeviceGetCount", count) }
}

/// Returns the handle of `gpu` unless it is lost (GPU_IS_LOST, as the real driver does).
pub(crate) unsafe fn give_handle(
    name: &'static str,
    sim: &Sim,
    gpu: usize,
    out: *mut nvmlDevice_t,
) -> Result<(), u32> {
    CALL_GPU.with(|c| c.set(Some(gpu)));
    sim.hang(name, gpu);
    let t = sim.now_s();
    sim.inject(name, Some(gpu), t)?;
    if sim.is_lost(gpu, t) {
        return Err(code::GPU_IS_LOST);
    }
    unsafe { put(out, handle_of(gpu)) }
}

unsafe fn handle_by_index(
    name: &'static str,
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    entry(name, || {
        let sim = sim::current()?;
        let gpu = sim
            .visible_gpu(index as usize)
            .ok_or(code::INVALID_ARGUMENT)?;
        unsafe { give_handle(name, &sim, gpu, device) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    unsafe { handle_by_index("nvmlDeviceGetHandleByIndex_v2", index, device) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    unsafe { handle_by_index("nvmlDeviceGetHandleByIndex", index, device) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetHandleByUUID", || {
        let sim = sim::current()?;
        let wanted = unsafe { get_str(uuid) }?.trim();
        if wanted.starts_with("MIG-") {
            return unsafe { mig::handle_by_uuid(&sim, wanted, device) };
        }
        let gpu = sim
            .scenario
            .devices
            .iter()
            .position(|d| !d.hidden && d.uuid.eq_ignore_ascii_case(wanted))
            .ok_or(code::NOT_FOUND)?;
        unsafe { give_handle("nvmlDeviceGetHandleByUUID", &sim, gpu, device) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleBySerial(
    serial: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetHandleBySerial", || {
        let sim = sim::current()?;
        let wanted = unsafe { get_str(serial) }?.trim();
        let gpu = sim
            .scenario
            .devices
            .iter()
            .position(|d| !d.hidden && d.serial == wanted)
            .ok_or(code::NOT_FOUND)?;
        unsafe { give_handle("nvmlDeviceGetHandleBySerial", &sim, gpu, device) }
    })
}

unsafe fn handle_by_bus_id(
    name: &'static str,
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    entry(name, || {
        let sim = sim::current()?;
        let wanted = unsafe { get_str(bus_id) }?;
        let addr = crate::scenario::parse_bus_id(wanted).ok_or(code::INVALID_ARGUMENT)?;
        let gpu = sim
            .scenario
            .devices
            .iter()
            .position(|d| !d.hidden && (d.pci_domain, d.pci_bus, d.pci_device) == addr)
            .ok_or(code::NOT_FOUND)?;
        unsafe { give_handle(name, &sim, gpu, device) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    unsafe { handle_by_bus_id("nvmlDeviceGetHandleByPciBusId_v2", bus_id, device) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    unsafe { handle_by_bus_id("nvmlDeviceGetHandleByPciBusId", bus_id, device) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlUnitGetCount(count: *mut c_uint) -> nvmlReturn_t {
    entry("nvmlUnitGetCount", || {
        system("nvmlUnitGetCount")?;
        unsafe { put(count, 0) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGetExcludedDeviceCount(count: *mut c_uint) -> nvmlReturn_t {
    entry("nvmlGetExcludedDeviceCount", || {
        system("nvmlGetExcludedDeviceCount")?;
        unsafe { put(count, 0) }
    })
}
