//! Device getters: identity, utilization, memory, thermals, power, clocks, throttle reasons,
//! ECC / retired pages / remapped rows, PCIe, processes, field values and samples.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::field_id::*;
use nvml_wrapper_sys::bindings::*;

use super::mig::{dev_or_mig, On};
use super::{dev, entry, put, put_str, Dev, MEMORY_V2_VERSION, TEMPERATURE_V1_VERSION};
use crate::scenario::{MemoryRepair, Metric};
use crate::sim::{code, wall_now_us, ProcessEntry};

/// NVML_VALUE_NOT_AVAILABLE for unsigned long long fields.
const VALUE_NOT_AVAILABLE: u64 = u64::MAX;
/// gpuInstanceId / computeInstanceId when MIG is off.
const NO_INSTANCE: u32 = u32::MAX;

/// `NVML_FI_DEV_PCIE_COUNT_TX_BYTES` / `_RX_BYTES` (not in nvml-wrapper-sys's bindings).
pub const FI_PCIE_COUNT_TX_BYTES: u32 = 197;
pub const FI_PCIE_COUNT_RX_BYTES: u32 = 198;
/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` (r570+; UINT: 0 none, 1 GPU reset, 2 node reboot,
/// 3 drain P2P, 4 drain and reset).
pub const FI_GET_GPU_RECOVERY_ACTION: u32 = 230;

/// What reading one field costs inside `nvmlDeviceGetFieldValues`, on the CPU (H200, driver
/// 580.159.04: the energy counter 3.1 ms — as much as `nvmlDeviceGetTotalEnergyConsumption` —,
/// each PCIe byte counter 0.13 ms, the replay counter 0.15 ms, every other field about a µs).
fn field_cost(field_id: u32) -> std::time::Duration {
    use crate::latency::us;
    match field_id {
        NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION => std::time::Duration::from_millis(3),
        NVML_FI_DEV_PCIE_REPLAY_COUNTER => us(145),
        FI_PCIE_COUNT_TX_BYTES | FI_PCIE_COUNT_RX_BYTES => us(130),
        _ => std::time::Duration::ZERO,
    }
}

/// A getter writing one value: `getter!(symbol, type, |d| expr -> Result<type, u32>)`.
macro_rules! getter {
    ($name:ident, $ty:ty, |$d:ident| $val:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(device: nvmlDevice_t, out: *mut $ty) -> nvmlReturn_t {
            entry(stringify!($name), || {
                let $d = dev(stringify!($name), device)?;
                let value: Result<$ty, u32> = $val;
                unsafe { put(out, value?) }
            })
        }
    };
}

/// A getter writing a string into a caller buffer.
macro_rules! string_getter {
    ($name:ident, |$d:ident| $val:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            device: nvmlDevice_t,
            buf: *mut c_char,
            length: c_uint,
        ) -> nvmlReturn_t {
            entry(stringify!($name), || {
                let $d = dev(stringify!($name), device)?;
                let value: String = $val;
                unsafe { put_str(buf, length, &value) }
            })
        }
    };
}

// --- identity -------------------------------------------------------------------------------

// nvmlDeviceGetName and nvmlDeviceGetUUID answer MIG device handles too: ffi/mig.rs
string_getter!(nvmlDeviceGetSerial, |d| d.spec().serial.clone());
string_getter!(nvmlDeviceGetVbiosVersion, |d| d
    .spec()
    .vbios_version
    .clone());
string_getter!(nvmlDeviceGetBoardPartNumber, |d| d
    .spec()
    .board_part_number
    .clone());
getter!(nvmlDeviceGetIndex, c_uint, |d| Ok(
    d.sim.nvml_index(d.gpu).unwrap_or(d.gpu) as c_uint
));
getter!(nvmlDeviceGetMinorNumber, c_uint, |d| Ok(d.spec().minor));
getter!(nvmlDeviceGetArchitecture, nvmlDeviceArchitecture_t, |d| Ok(
    d.spec().architecture
));
getter!(nvmlDeviceGetBrand, nvmlBrandType_t, |d| {
    let _ = &d;
    Ok(nvmlBrandType_enum_NVML_BRAND_NVIDIA)
});
getter!(nvmlDeviceGetPersistenceMode, nvmlEnableState_t, |d| Ok(
    d.spec().persistence_mode as u32
));
getter!(nvmlDeviceGetDisplayActive, nvmlEnableState_t, |d| {
    let _ = &d;
    Ok(0)
});
getter!(nvmlDeviceGetDisplayMode, nvmlEnableState_t, |d| {
    let _ = &d;
    Ok(0)
});
getter!(nvmlDeviceGetComputeMode, nvmlComputeMode_t, |d| Ok(d
    .spec()
    .compute_mode));
getter!(nvmlDeviceGetNumFans, c_uint, |d| Ok(d.spec().num_fans));
getter!(nvmlDeviceGetCurrPcieLinkGeneration, c_uint, |d| Ok(d
    .spec()
    .pcie_link_gen));
// the max the link can reach in this system: min(GPU max, slot max)
getter!(nvmlDeviceGetMaxPcieLinkGeneration, c_uint, |d| Ok(d
    .spec()
    .pcie_gen
    .min(d.spec().pcie_slot_max_gen)));
// the GPU's own max
getter!(nvmlDeviceGetGpuMaxPcieLinkGeneration, c_uint, |d| Ok(d
    .spec()
    .pcie_gen));
getter!(nvmlDeviceGetCurrPcieLinkWidth, c_uint, |d| Ok(d
    .spec()
    .pcie_link_width));
getter!(nvmlDeviceGetMaxPcieLinkWidth, c_uint, |d| Ok(d
    .spec()
    .pcie_width));
getter!(nvmlDeviceGetPowerManagementMode, nvmlEnableState_t, |d| {
    let _ = &d;
    Ok(1)
});

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetCudaComputeCapability", || {
        let d = dev("nvmlDeviceGetCudaComputeCapability", device)?;
        unsafe {
            put(major, d.spec().cuda_cc_major)?;
            put(minor, d.spec().cuda_cc_minor)
        }
    })
}

fn c_chars<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (dst, src) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *dst = src as c_char;
    }
    out
}

fn pci_info(d: &Dev) -> nvmlPciInfo_t {
    let s = d.spec();
    nvmlPciInfo_t {
        busIdLegacy: c_chars::<16>(&s.bus_id_legacy()),
        domain: s.pci_domain,
        bus: s.pci_bus,
        device: s.pci_device,
        pciDeviceId: s.pci_device_id,
        pciSubSystemId: s.pci_subsystem_id,
        busId: c_chars::<32>(&s.bus_id()),
    }
}

getter!(nvmlDeviceGetPciInfo_v3, nvmlPciInfo_t, |d| Ok(pci_info(&d)));
getter!(nvmlDeviceGetPciInfo_v2, nvmlPciInfo_t, |d| Ok(pci_info(&d)));
getter!(nvmlDeviceGetPciInfo, nvmlPciInfo_t, |d| Ok(pci_info(&d)));

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    device: nvmlDevice_t,
    current: *mut nvmlEnableState_t,
    pending: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetEccMode", || {
        let d = dev("nvmlDeviceGetEccMode", device)?;
        unsafe {
            put(current, d.spec().ecc_enabled as u32)?;
            put(pending, d.spec().ecc_pending as u32)
        }
    })
}

// --- utilization / memory -------------------------------------------------------------------

// Not on a GPU split into MIG devices, as on real drivers.
getter!(nvmlDeviceGetUtilizationRates, nvmlUtilization_t, |d| {
    if d.spec().mig.active() {
        return Err(code::NOT_SUPPORTED);
    }
    Ok(nvmlUtilization_t {
        gpu: d.metric(Metric::GpuUtilPct).round() as u32,
        memory: d.metric(Metric::MemUtilPct).round() as u32,
    })
});

unsafe fn codec_util(
    name: &'static str,
    metric: Metric,
    device: nvmlDevice_t,
    util: *mut c_uint,
    period_us: *mut c_uint,
) -> nvmlReturn_t {
    entry(name, || {
        let d = dev(name, device)?;
        unsafe {
            put(util, d.metric(metric).round() as u32)?;
            put(period_us, 167_000)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEncoderUtilization(
    device: nvmlDevice_t,
    util: *mut c_uint,
    period_us: *mut c_uint,
) -> nvmlReturn_t {
    unsafe {
        codec_util(
            "nvmlDeviceGetEncoderUtilization",
            Metric::EncoderUtilPct,
            device,
            util,
            period_us,
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDecoderUtilization(
    device: nvmlDevice_t,
    util: *mut c_uint,
    period_us: *mut c_uint,
) -> nvmlReturn_t {
    unsafe {
        codec_util(
            "nvmlDeviceGetDecoderUtilization",
            Metric::DecoderUtilPct,
            device,
            util,
            period_us,
        )
    }
}

/// (total, reserved, free, used) bytes of the GPU, or of one of its MIG devices (which has no
/// reserved memory of its own).
fn memory(d: &Dev, on: On) -> (u64, u64, u64, u64) {
    if let On::Mig(k) = on {
        let total = d.mig_device(k).map_or(0, |m| m.memory_total_bytes);
        let used = d.sim.mig_memory_used_bytes(d.gpu, k, d.t);
        return (total, 0, total.saturating_sub(used), used);
    }
    let s = d.spec();
    let used = d.sim.memory_used_bytes(d.gpu, d.t);
    let free = s
        .memory_total_bytes
        .saturating_sub(s.memory_reserved_bytes)
        .saturating_sub(used);
    (s.memory_total_bytes, s.memory_reserved_bytes, free, used)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    out: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetMemoryInfo", || {
        let (d, on) = dev_or_mig("nvmlDeviceGetMemoryInfo", device)?;
        // v1 folds the reserved memory into `used`, as the real driver does.
        let (total, reserved, free, used) = memory(&d, on);
        unsafe {
            put(
                out,
                nvmlMemory_t {
                    total,
                    free,
                    used: used + reserved,
                },
            )
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    out: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetMemoryInfo_v2", || {
        let (d, on) = dev_or_mig("nvmlDeviceGetMemoryInfo_v2", device)?;
        if out.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: non-null pointer to the caller's struct.
        let version = unsafe { (*out).version };
        if version != MEMORY_V2_VERSION {
            return Err(code::ARGUMENT_VERSION_MISMATCH);
        }
        let (total, reserved, free, used) = memory(&d, on);
        unsafe {
            put(
                out,
                nvmlMemory_v2_t {
                    version,
                    total,
                    reserved,
                    free,
                    used,
                },
            )
        }
    })
}

/// A GPU's BAR1 aperture, bytes.
const BAR1_TOTAL: u64 = 128 * 1024 * 1024 * 1024;

/// BAR1 of the GPU, or of one of its MIG devices: as real drivers answer (`nvidia-smi`'s MIG
/// table), a MIG device's aperture is its share of the GPU's by memory slices less 1 MiB
/// (`32767MiB` for a 3g.20gb of an A100 40GB), 4 MiB of it used while a process runs on it.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetBAR1MemoryInfo(
    device: nvmlDevice_t,
    out: *mut nvmlBAR1Memory_t,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetBAR1MemoryInfo", || {
        let (d, on) = dev_or_mig("nvmlDeviceGetBAR1MemoryInfo", device)?;
        let (total, used) = match on {
            On::Gpu => (BAR1_TOTAL, 45 * 1024 * 1024),
            On::Mig(k) => {
                let slices = d.mig_device(k).map_or(1, |m| m.profile.memory_slices);
                let total = (BAR1_TOTAL / u64::from(crate::mig::MEMORY_SLICES))
                    .saturating_mul(u64::from(slices))
                    .saturating_sub(1024 * 1024);
                let busy = d
                    .sim
                    .processes(d.gpu, d.t, false)
                    .iter()
                    .any(|p| p.mig == Some(k as u32));
                (total, if busy { 4 * 1024 * 1024 } else { 0 })
            }
        };
        unsafe {
            put(
                out,
                nvmlBAR1Memory_t {
                    bar1Total: total,
                    bar1Free: total - used,
                    bar1Used: used,
                },
            )
        }
    })
}

// --- thermals / power -----------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor: nvmlTemperatureSensors_t,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetTemperature", || {
        let d = dev("nvmlDeviceGetTemperature", device)?;
        if sensor != 0 {
            return Err(code::INVALID_ARGUMENT);
        }
        unsafe { put(temp, d.metric(Metric::TemperatureC).round().max(0.0) as u32) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureV(
    device: nvmlDevice_t,
    temperature: *mut nvmlTemperature_t,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetTemperatureV", || {
        let d = dev("nvmlDeviceGetTemperatureV", device)?;
        if temperature.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: non-null pointer to the caller's struct.
        let (version, sensor) = unsafe { ((*temperature).version, (*temperature).sensorType) };
        if version != TEMPERATURE_V1_VERSION {
            return Err(code::ARGUMENT_VERSION_MISMATCH);
        }
        if sensor != 0 {
            return Err(code::INVALID_ARGUMENT);
        }
        let value = nvmlTemperature_t {
            version,
            sensorType: sensor,
            temperature: d.metric(Metric::TemperatureC).round() as c_int,
        };
        unsafe { put(temperature, value) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    device: nvmlDevice_t,
    threshold: nvmlTemperatureThresholds_t,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetTemperatureThreshold", || {
        let d = dev("nvmlDeviceGetTemperatureThreshold", device)?;
        let s = d.spec();
        let value = match threshold {
            0 => s.temp_shutdown_c,
            1 => s.temp_slowdown_c,
            2 => s.temp_mem_max_c,
            3 => s.temp_gpu_max_c,
            _ => return Err(code::NOT_SUPPORTED),
        };
        unsafe { put(temp, value) }
    })
}

fn power_mw(d: &Dev) -> u32 {
    (d.metric(Metric::PowerW) * 1000.0).round() as u32
}

getter!(nvmlDeviceGetPowerUsage, c_uint, |d| Ok(power_mw(&d)));
getter!(nvmlDeviceGetEnforcedPowerLimit, c_uint, |d| Ok(d
    .spec()
    .power_limit_mw));
getter!(nvmlDeviceGetPowerManagementLimit, c_uint, |d| Ok(d
    .spec()
    .power_limit_mw));
getter!(nvmlDeviceGetPowerManagementDefaultLimit, c_uint, |d| Ok(d
    .spec()
    .power_default_limit_mw));
getter!(nvmlDeviceGetTotalEnergyConsumption, c_ulonglong, |d| Ok(d
    .sim
    .energy_mj(d.gpu, d.t)));

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimitConstraints(
    device: nvmlDevice_t,
    min_limit: *mut c_uint,
    max_limit: *mut c_uint,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetPowerManagementLimitConstraints", || {
        let d = dev("nvmlDeviceGetPowerManagementLimitConstraints", device)?;
        unsafe {
            put(min_limit, d.spec().power_min_limit_mw)?;
            put(max_limit, d.spec().power_max_limit_mw)
        }
    })
}

fn pstate(d: &Dev) -> nvmlPstates_t {
    d.metric(Metric::Pstate).round() as nvmlPstates_t
}

getter!(nvmlDeviceGetPerformanceState, nvmlPstates_t, |d| Ok(
    pstate(&d)
));
getter!(nvmlDeviceGetPowerState, nvmlPstates_t, |d| Ok(pstate(&d)));

getter!(nvmlDeviceGetFanSpeed, c_uint, |d| {
    if d.spec().num_fans == 0 {
        Err(code::NOT_SUPPORTED)
    } else {
        Ok(d.metric(Metric::FanPct).round() as u32)
    }
});

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed_v2(
    device: nvmlDevice_t,
    fan: c_uint,
    speed: *mut c_uint,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetFanSpeed_v2", || {
        let d = dev("nvmlDeviceGetFanSpeed_v2", device)?;
        if d.spec().num_fans == 0 {
            return Err(code::NOT_SUPPORTED);
        }
        if fan >= d.spec().num_fans {
            return Err(code::INVALID_ARGUMENT);
        }
        unsafe { put(speed, d.metric(Metric::FanPct).round() as u32) }
    })
}

// --- clocks ---------------------------------------------------------------------------------

fn clock_metric(clock_type: nvmlClockType_t) -> Result<Metric, u32> {
    match clock_type {
        0 => Ok(Metric::GraphicsClockMhz),
        1 => Ok(Metric::SmClockMhz),
        2 => Ok(Metric::MemClockMhz),
        3 => Ok(Metric::VideoClockMhz),
        _ => Err(code::INVALID_ARGUMENT),
    }
}

fn max_clock(d: &Dev, clock_type: nvmlClockType_t) -> Result<u32, u32> {
    let s = d.spec();
    match clock_type {
        0 | 1 => Ok(s.max_sm_clock_mhz),
        2 => Ok(s.max_mem_clock_mhz),
        3 => Ok(s.max_video_clock_mhz),
        _ => Err(code::INVALID_ARGUMENT),
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    clock_type: nvmlClockType_t,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetClockInfo", || {
        let d = dev("nvmlDeviceGetClockInfo", device)?;
        let m = clock_metric(clock_type)?;
        unsafe { put(clock, d.metric(m).round() as u32) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: nvmlDevice_t,
    clock_type: nvmlClockType_t,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetMaxClockInfo", || {
        let d = dev("nvmlDeviceGetMaxClockInfo", device)?;
        unsafe { put(clock, max_clock(&d, clock_type)?) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClock(
    device: nvmlDevice_t,
    clock_type: nvmlClockType_t,
    clock_id: nvmlClockId_t,
    mhz: *mut c_uint,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetClock", || {
        let d = dev("nvmlDeviceGetClock", device)?;
        // 0 current, 1 applications target, 2 applications default, 3 customer boost max
        let value = match clock_id {
            0 => d.metric(clock_metric(clock_type)?).round() as u32,
            1 => app_clock_of(&d, clock_type)?,
            2 | 3 => max_clock(&d, clock_type)?,
            _ => return Err(code::INVALID_ARGUMENT),
        };
        unsafe { put(mhz, value) }
    })
}

/// The applications clock: `app_sm_clock_mhz` / `app_mem_clock_mhz` (default: the max clocks).
fn app_clock_of(d: &Dev, clock_type: nvmlClockType_t) -> Result<u32, u32> {
    let s = d.spec();
    match clock_type {
        0 | 1 => Ok(s.app_sm_clock_mhz),
        2 => Ok(s.app_mem_clock_mhz),
        3 => Ok(s.max_video_clock_mhz),
        _ => Err(code::INVALID_ARGUMENT),
    }
}

unsafe fn app_clock(
    name: &'static str,
    device: nvmlDevice_t,
    clock_type: nvmlClockType_t,
    mhz: *mut c_uint,
    default: bool,
) -> nvmlReturn_t {
    entry(name, || {
        let d = dev(name, device)?;
        let v = if default {
            max_clock(&d, clock_type)?
        } else {
            app_clock_of(&d, clock_type)?
        };
        unsafe { put(mhz, v) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetApplicationsClock(
    device: nvmlDevice_t,
    clock_type: nvmlClockType_t,
    mhz: *mut c_uint,
) -> nvmlReturn_t {
    unsafe {
        app_clock(
            "nvmlDeviceGetApplicationsClock",
            device,
            clock_type,
            mhz,
            false,
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDefaultApplicationsClock(
    device: nvmlDevice_t,
    clock_type: nvmlClockType_t,
    mhz: *mut c_uint,
) -> nvmlReturn_t {
    unsafe {
        app_clock(
            "nvmlDeviceGetDefaultApplicationsClock",
            device,
            clock_type,
            mhz,
            true,
        )
    }
}

/// Every reason bit an H100 reports as supported.
const SUPPORTED_REASONS: u64 = 0x1FF;

getter!(
    nvmlDeviceGetCurrentClocksThrottleReasons,
    c_ulonglong,
    |d| Ok(d.sim.clock_event_reasons(d.gpu, d.t))
);
getter!(nvmlDeviceGetCurrentClocksEventReasons, c_ulonglong, |d| Ok(
    d.sim.clock_event_reasons(d.gpu, d.t)
));
getter!(
    nvmlDeviceGetSupportedClocksThrottleReasons,
    c_ulonglong,
    |d| {
        let _ = &d;
        Ok(SUPPORTED_REASONS)
    }
);
getter!(nvmlDeviceGetSupportedClocksEventReasons, c_ulonglong, |d| {
    let _ = &d;
    Ok(SUPPORTED_REASONS)
});

// --- ECC, retired pages, remapped rows, PCIe ------------------------------------------------

fn ecc_count(
    d: &Dev,
    error_type: nvmlMemoryErrorType_t,
    counter: nvmlEccCounterType_t,
) -> Result<u64, u32> {
    if !d.spec().ecc_enabled {
        return Err(code::NOT_SUPPORTED);
    }
    if counter > 1 {
        return Err(code::INVALID_ARGUMENT);
    }
    let c = d.sim.counters(d.gpu, d.t);
    match error_type {
        0 => Ok(c.ecc_corrected),
        1 => Ok(c.ecc_uncorrected),
        _ => Err(code::INVALID_ARGUMENT),
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: nvmlDevice_t,
    error_type: nvmlMemoryErrorType_t,
    counter: nvmlEccCounterType_t,
    count: *mut c_ulonglong,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetTotalEccErrors", || {
        let d = dev("nvmlDeviceGetTotalEccErrors", device)?;
        unsafe { put(count, ecc_count(&d, error_type, counter)?) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryErrorCounter(
    device: nvmlDevice_t,
    error_type: nvmlMemoryErrorType_t,
    counter: nvmlEccCounterType_t,
    location: nvmlMemoryLocation_t,
    count: *mut c_ulonglong,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetMemoryErrorCounter", || {
        let d = dev("nvmlDeviceGetMemoryErrorCounter", device)?;
        let total = ecc_count(&d, error_type, counter)?;
        let value = match location {
            // all simulated errors are in device memory
            2 => total,
            0 | 1 | 3 | 7 => 0,
            _ => return Err(code::NOT_SUPPORTED),
        };
        unsafe { put(count, value) }
    })
}

fn retired(d: &Dev, cause: nvmlPageRetirementCause_t) -> Result<Vec<(u64, u64)>, u32> {
    if d.spec().memory_repair != MemoryRepair::PageRetirement {
        return Err(code::NOT_SUPPORTED);
    }
    let want_dbe = match cause {
        0 => false,
        1 => true,
        _ => return Err(code::INVALID_ARGUMENT),
    };
    Ok(d.sim
        .counters(d.gpu, d.t)
        .retired_pages
        .into_iter()
        .filter(|(dbe, _, _)| *dbe == want_dbe)
        .map(|(_, addr, at)| (addr, d.sim.wall_us_of_scenario_time(at) / 1_000_000))
        .collect())
}

unsafe fn retired_pages(
    name: &'static str,
    device: nvmlDevice_t,
    cause: nvmlPageRetirementCause_t,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> nvmlReturn_t {
    entry(name, || {
        let d = dev(name, device)?;
        let pages = retired(&d, cause)?;
        if count.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: non-null, caller-owned.
        let cap = unsafe { *count } as usize;
        unsafe { put(count, pages.len() as c_uint)? };
        if pages.is_empty() {
            return Ok(());
        }
        if cap < pages.len() || addresses.is_null() {
            return Err(code::INSUFFICIENT_SIZE);
        }
        for (i, (addr, ts)) in pages.iter().enumerate() {
            // SAFETY: the caller provides `cap >= len` slots in each array.
            unsafe {
                *addresses.add(i) = *addr;
                if !timestamps.is_null() {
                    *timestamps.add(i) = *ts;
                }
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(
    device: nvmlDevice_t,
    cause: nvmlPageRetirementCause_t,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
) -> nvmlReturn_t {
    unsafe {
        retired_pages(
            "nvmlDeviceGetRetiredPages",
            device,
            cause,
            count,
            addresses,
            std::ptr::null_mut(),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    device: nvmlDevice_t,
    cause: nvmlPageRetirementCause_t,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> nvmlReturn_t {
    unsafe {
        retired_pages(
            "nvmlDeviceGetRetiredPages_v2",
            device,
            cause,
            count,
            addresses,
            timestamps,
        )
    }
}

getter!(
    nvmlDeviceGetRetiredPagesPendingStatus,
    nvmlEnableState_t,
    |d| {
        if d.spec().memory_repair != MemoryRepair::PageRetirement {
            Err(code::NOT_SUPPORTED)
        } else {
            Ok(d.sim.counters(d.gpu, d.t).retired_pending as u32)
        }
    }
);

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: nvmlDevice_t,
    corr: *mut c_uint,
    unc: *mut c_uint,
    pending: *mut c_uint,
    failure: *mut c_uint,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetRemappedRows", || {
        let d = dev("nvmlDeviceGetRemappedRows", device)?;
        if d.spec().memory_repair != MemoryRepair::RowRemap {
            return Err(code::NOT_SUPPORTED);
        }
        let c = d.sim.counters(d.gpu, d.t);
        unsafe {
            put(corr, c.remapped_correctable as u32)?;
            put(unc, c.remapped_uncorrectable as u32)?;
            put(pending, c.remap_pending as u32)?;
            put(failure, c.remap_failure as u32)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieThroughput(
    device: nvmlDevice_t,
    counter: nvmlPcieUtilCounter_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetPcieThroughput", || {
        let d = dev("nvmlDeviceGetPcieThroughput", device)?;
        let m = match counter {
            0 => Metric::PcieTxKbS,
            1 => Metric::PcieRxKbS,
            _ => return Err(code::INVALID_ARGUMENT),
        };
        unsafe { put(value, d.metric(m).round().min(f64::from(u32::MAX)) as u32) }
    })
}

getter!(nvmlDeviceGetPcieReplayCounter, c_uint, |d| Ok(
    d.sim.counters(d.gpu, d.t).pcie_replay as u32
));

// --- processes ------------------------------------------------------------------------------

/// Writes a process list; a process on a MIG device carries its GPU and compute instance ids.
unsafe fn write_processes(
    d: &Dev,
    list: &[ProcessEntry],
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> Result<(), u32> {
    if count.is_null() {
        return Err(code::INVALID_ARGUMENT);
    }
    // SAFETY: non-null, caller-owned.
    let cap = unsafe { *count } as usize;
    unsafe { put(count, list.len() as c_uint)? };
    if list.is_empty() {
        return Ok(());
    }
    if infos.is_null() || cap < list.len() {
        return Err(code::INSUFFICIENT_SIZE);
    }
    for (i, p) in list.iter().enumerate() {
        let mig = p.mig.and_then(|k| d.mig_device(k as usize));
        let info = nvmlProcessInfo_t {
            pid: p.pid,
            usedGpuMemory: p.used_bytes.unwrap_or(VALUE_NOT_AVAILABLE),
            gpuInstanceId: mig.map_or(NO_INSTANCE, |m| m.gpu_instance_id),
            computeInstanceId: mig.map_or(NO_INSTANCE, |m| m.compute_instance_id),
        };
        // SAFETY: the caller provides `cap >= len` slots.
        unsafe { infos.add(i).write(info) };
    }
    Ok(())
}

macro_rules! process_list {
    ($name:ident, $graphics:expr, $mps:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            device: nvmlDevice_t,
            count: *mut c_uint,
            infos: *mut nvmlProcessInfo_t,
        ) -> nvmlReturn_t {
            entry(stringify!($name), || {
                // a GPU split into MIG devices lists all of them, each MIG device its own
                let (d, on) = dev_or_mig(stringify!($name), device)?;
                let mut list = if $mps {
                    Vec::new()
                } else {
                    d.sim.processes(d.gpu, d.t, $graphics)
                };
                if let On::Mig(k) = on {
                    list.retain(|p| p.mig == Some(k as u32));
                }
                unsafe { write_processes(&d, &list, count, infos) }
            })
        }
    };
}

process_list!(nvmlDeviceGetComputeRunningProcesses_v3, false, false);
process_list!(nvmlDeviceGetComputeRunningProcesses_v2, false, false);
process_list!(nvmlDeviceGetGraphicsRunningProcesses_v3, true, false);
process_list!(nvmlDeviceGetGraphicsRunningProcesses_v2, true, false);
process_list!(nvmlDeviceGetMPSComputeRunningProcesses_v3, false, true);
process_list!(nvmlDeviceGetMPSComputeRunningProcesses_v2, false, true);

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: nvmlDevice_t,
    samples: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen_us: c_ulonglong,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetProcessUtilization", || {
        let d = dev("nvmlDeviceGetProcessUtilization", device)?;
        if d.spec().mig.active() {
            return Err(code::NOT_SUPPORTED);
        }
        if count.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        let now_us = wall_now_us();
        let procs = d.sim.processes(d.gpu, d.t, false);
        if procs.is_empty() || last_seen_us >= now_us {
            return Err(code::NOT_FOUND);
        }
        let util = d.metric(Metric::GpuUtilPct);
        let mem_util = d.metric(Metric::MemUtilPct);
        let share = 1.0 / procs.len() as f64;
        // SAFETY: non-null, caller-owned.
        let cap = unsafe { *count } as usize;
        unsafe { put(count, procs.len() as c_uint)? };
        if samples.is_null() || cap < procs.len() {
            return Err(code::INSUFFICIENT_SIZE);
        }
        for (i, p) in procs.iter().enumerate() {
            let sample = nvmlProcessUtilizationSample_t {
                pid: p.pid,
                timeStamp: now_us,
                smUtil: p.sm_util_pct.unwrap_or((util * share).round() as u32),
                memUtil: (mem_util * share).round() as u32,
                encUtil: 0,
                decUtil: 0,
            };
            // SAFETY: the caller provides `cap >= len` slots.
            unsafe { samples.add(i).write(sample) };
        }
        Ok(())
    })
}

// --- field values ---------------------------------------------------------------------------

/// One field's (value type, value) or its per-field error.
fn field_value(d: &Dev, id: u32) -> Result<(nvmlValueType_t, nvmlValue_t), u32> {
    const UINT: nvmlValueType_t = nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT;
    const ULL: nvmlValueType_t = nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    let s = d.spec();
    let ui = |v: u32| Ok((UINT, nvmlValue_t { uiVal: v }));
    let ull = |v: u64| Ok((ULL, nvmlValue_t { ullVal: v }));
    let remap = || {
        if s.memory_repair == MemoryRepair::RowRemap {
            Ok(d.sim.counters(d.gpu, d.t))
        } else {
            Err(code::NOT_SUPPORTED)
        }
    };
    let retire = || {
        if s.memory_repair == MemoryRepair::PageRetirement {
            Ok(d.sim.counters(d.gpu, d.t))
        } else {
            Err(code::NOT_SUPPORTED)
        }
    };
    match id {
        NVML_FI_DEV_ECC_CURRENT | NVML_FI_DEV_ECC_PENDING => ui(s.ecc_enabled as u32),
        NVML_FI_DEV_ECC_SBE_VOL_TOTAL | NVML_FI_DEV_ECC_SBE_AGG_TOTAL => ull(ecc_count(d, 0, 0)?),
        NVML_FI_DEV_ECC_DBE_VOL_TOTAL | NVML_FI_DEV_ECC_DBE_AGG_TOTAL => ull(ecc_count(d, 1, 0)?),
        NVML_FI_DEV_RETIRED_SBE => {
            ull(retire()?.retired_pages.iter().filter(|p| !p.0).count() as u64)
        }
        NVML_FI_DEV_RETIRED_DBE => {
            ull(retire()?.retired_pages.iter().filter(|p| p.0).count() as u64)
        }
        NVML_FI_DEV_RETIRED_PENDING => ull(retire()?.retired_pending as u64),
        NVML_FI_DEV_MEMORY_TEMP => ui(d.metric(Metric::MemoryTemperatureC).round().max(0.0) as u32),
        NVML_FI_DEV_PCIE_REPLAY_COUNTER => ull(d.sim.counters(d.gpu, d.t).pcie_replay),
        NVML_FI_DEV_REMAPPED_COR => ui(remap()?.remapped_correctable as u32),
        NVML_FI_DEV_REMAPPED_UNC => ui(remap()?.remapped_uncorrectable as u32),
        NVML_FI_DEV_REMAPPED_PENDING => ui(remap()?.remap_pending as u32),
        NVML_FI_DEV_REMAPPED_FAILURE => ui(remap()?.remap_failure as u32),
        NVML_FI_DEV_POWER_AVERAGE | NVML_FI_DEV_POWER_INSTANT => ui(power_mw(d)),
        NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION => ull(d.sim.energy_mj(d.gpu, d.t)),
        FI_PCIE_COUNT_TX_BYTES | FI_PCIE_COUNT_RX_BYTES => {
            if !s.pcie_byte_counters {
                return Err(code::NOT_SUPPORTED);
            }
            ull(d.sim.pcie_bytes(d.gpu, d.t, id == FI_PCIE_COUNT_TX_BYTES))
        }
        FI_GET_GPU_RECOVERY_ACTION => {
            if !s.recovery_action_supported {
                return Err(code::NOT_SUPPORTED);
            }
            ui(d.sim.recovery_action(d.gpu, d.t))
        }
        _ => super::nvlink::field_value(d, id),
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: nvmlDevice_t,
    count: c_int,
    values: *mut nvmlFieldValue_t,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetFieldValues", || {
        let d = dev("nvmlDeviceGetFieldValues", device)?;
        if count < 0 || (count > 0 && values.is_null()) {
            return Err(code::INVALID_ARGUMENT);
        }
        let ts = wall_now_us() as i64;
        // Each answered field adds its own cost (the energy counter is milliseconds of driver
        // CPU, see `field_cost`), unless latency is off or the call is overridden.
        let field_costs = d.sim.latency.field_costs();
        let mut cost = std::time::Duration::ZERO;
        for i in 0..count as usize {
            // SAFETY: the caller provides `count` entries.
            let fv = unsafe { &mut *values.add(i) };
            fv.timestamp = ts;
            fv.latencyUsec = 0;
            crate::counts::field(fv.fieldId);
            match field_value(&d, fv.fieldId) {
                Ok((value_type, value)) => {
                    fv.valueType = value_type;
                    fv.value = value;
                    fv.nvmlReturn = code::SUCCESS;
                    if field_costs {
                        cost += field_cost(fv.fieldId);
                    }
                }
                Err(c) => {
                    fv.value = nvmlValue_t { ullVal: 0 };
                    fv.nvmlReturn = c;
                }
            }
        }
        crate::latency::spin(cost);
        Ok(())
    })
}

// --- samples --------------------------------------------------------------------------------

/// Real-time interval between simulated driver samples.
const SAMPLE_PERIOD_US: u64 = 166_667;
/// Samples kept in the simulated driver buffer.
const SAMPLE_BUFFER: u64 = 120;

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSamples(
    device: nvmlDevice_t,
    sample_type: nvmlSamplingType_t,
    last_seen_us: c_ulonglong,
    value_type: *mut nvmlValueType_t,
    count: *mut c_uint,
    samples: *mut nvmlSample_t,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetSamples", || {
        let d = dev("nvmlDeviceGetSamples", device)?;
        let (metric, scale) = match sample_type {
            0 => (Metric::PowerW, 1000.0),
            1 | 2 if d.spec().mig.active() => return Err(code::NOT_SUPPORTED),
            1 => (Metric::GpuUtilPct, 1.0),
            2 => (Metric::MemUtilPct, 1.0),
            3 => (Metric::EncoderUtilPct, 1.0),
            4 => (Metric::DecoderUtilPct, 1.0),
            5 => (Metric::SmClockMhz, 1.0),
            6 => (Metric::MemClockMhz, 1.0),
            _ => return Err(code::NOT_SUPPORTED),
        };
        if count.is_null() || value_type.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        let now_us = wall_now_us();
        let start_us = d.sim.wall_us_of_scenario_time(0.0).max(1);
        let newest = now_us - (now_us.saturating_sub(start_us)) % SAMPLE_PERIOD_US;
        let oldest = newest
            .saturating_sub((SAMPLE_BUFFER - 1) * SAMPLE_PERIOD_US)
            .max(start_us);
        let first = if last_seen_us >= oldest {
            // first sample strictly after last_seen
            oldest + ((last_seen_us - oldest) / SAMPLE_PERIOD_US + 1) * SAMPLE_PERIOD_US
        } else {
            oldest
        };
        let n = if first > newest {
            0
        } else {
            (newest - first) / SAMPLE_PERIOD_US + 1
        };
        if n == 0 {
            return Err(code::NOT_FOUND);
        }
        unsafe { put(value_type, nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT)? };
        // SAFETY: non-null, caller-owned.
        let cap = u64::from(unsafe { *count });
        if samples.is_null() {
            return unsafe { put(count, n as c_uint) };
        }
        let n = n.min(cap);
        for i in 0..n {
            let ts = first + i * SAMPLE_PERIOD_US;
            let t = d.sim.scenario_time_of_wall_us(ts);
            let v = (d.sim.metric(d.gpu, metric, t) * scale).round() as u32;
            let sample = nvmlSample_t {
                timeStamp: ts,
                sampleValue: nvmlValue_t { uiVal: v },
            };
            // SAFETY: the caller provides `cap >= n` slots.
            unsafe { samples.add(i as usize).write(sample) };
        }
        unsafe { put(count, n as c_uint) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn field_costs_are_the_h200_measurements() {
        assert_eq!(field_cost(83), Duration::from_millis(3));
        assert_eq!(field_cost(94), Duration::from_micros(145));
        assert_eq!(field_cost(198), Duration::from_micros(130));
        assert_eq!(field_cost(197), Duration::from_micros(130));
        assert_eq!(field_cost(1), Duration::ZERO);
    }
}
