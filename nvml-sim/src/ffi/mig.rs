//! MIG: MIG mode, MIG device handles (`nvmlDeviceGetMigDeviceHandleByIndex`, by `MIG-` UUID),
//! their parent, GPU / compute instance ids, name, UUID, memory and processes, GPU-instance
//! profiles and GPU instances with their placements.
//!
//! A MIG device handle answers the getters here and memory info and the process lists
//! (`ffi/device.rs`); every other device call on it answers NOT_SUPPORTED. Calls on it run the
//! parent GPU's checks (hangs, faults, GPU_IS_LOST).

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_uint};

use nvml_wrapper_sys::bindings::*;

use super::{dev, entry, guard, handle_of, index_of, put, put_str, Dev};
use crate::mig::{MigDevice, Profile, MAX_MIG_DEVICES};
use crate::sim::{self, code, Sim};

const SLOTS: usize = crate::MAX_DEVICES * MAX_MIG_DEVICES;

/// Opaque MIG device handles: addresses inside this array, `gpu * 7 + k`.
static MIG_HANDLES: [u8; SLOTS] = [0; SLOTS];
/// Opaque GPU-instance handles (`nvmlGpuInstance_t`), the same layout.
static GI_HANDLES: [u8; SLOTS] = [0; SLOTS];

fn mig_handle(gpu: usize, k: usize) -> nvmlDevice_t {
    MIG_HANDLES.as_ptr().wrapping_add(gpu * MAX_MIG_DEVICES + k) as nvmlDevice_t
}

fn gi_handle(gpu: usize, k: usize) -> nvmlGpuInstance_t {
    GI_HANDLES.as_ptr().wrapping_add(gpu * MAX_MIG_DEVICES + k) as nvmlGpuInstance_t
}

/// (slot gpu, k) of an address in `base`, when the GPU is enumerated and has MIG device `k`.
fn slot_of(addr: usize, base: *const u8, sim: &Sim) -> Option<(usize, usize)> {
    let offset = addr.wrapping_sub(base as usize);
    if offset >= SLOTS {
        return None;
    }
    let (gpu, k) = (offset / MAX_MIG_DEVICES, offset % MAX_MIG_DEVICES);
    if gpu >= sim.device_count() || sim.nvml_index(gpu).is_none() {
        return None;
    }
    let mig = &sim.device(gpu).mig;
    (mig.active() && k < mig.devices.len()).then_some((gpu, k))
}

/// The (GPU, MIG device index) a MIG device handle stands for.
pub(crate) fn mig_of(handle: nvmlDevice_t, sim: &Sim) -> Option<(usize, usize)> {
    slot_of(handle as usize, MIG_HANDLES.as_ptr(), sim)
}

/// What a handle names: the GPU itself, or one of its MIG devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum On {
    Gpu,
    Mig(usize),
}

/// Resolves a GPU or MIG device handle (a MIG device runs its GPU's checks).
pub(crate) fn dev_or_mig(name: &'static str, handle: nvmlDevice_t) -> Result<(Dev, On), u32> {
    let sim = sim::current()?;
    if index_of(handle, &sim).is_some() {
        return dev(name, handle).map(|d| (d, On::Gpu));
    }
    let (gpu, k) = mig_of(handle, &sim).ok_or(code::INVALID_ARGUMENT)?;
    guard(name, sim, gpu).map(|d| (d, On::Mig(k)))
}

impl Dev {
    /// MIG device `k` of this GPU.
    pub fn mig_device(&self, k: usize) -> Option<&MigDevice> {
        self.spec().mig.devices.get(k)
    }
}

/// The handle of the MIG device with this `MIG-` UUID.
pub(crate) unsafe fn handle_by_uuid(
    sim: &Sim,
    wanted: &str,
    out: *mut nvmlDevice_t,
) -> Result<(), u32> {
    for (gpu, d) in sim.scenario.devices.iter().enumerate() {
        if d.hidden || !d.mig.active() {
            continue;
        }
        if let Some(k) = d
            .mig
            .devices
            .iter()
            .position(|m| m.uuid.eq_ignore_ascii_case(wanted))
        {
            let mut parent: nvmlDevice_t = std::ptr::null_mut();
            unsafe { super::give_handle("nvmlDeviceGetHandleByUUID", sim, gpu, &mut parent)? };
            return unsafe { put(out, mig_handle(gpu, k)) };
        }
    }
    Err(code::NOT_FOUND)
}

/// A MIG device's name: the GPU's, then ` MIG ` and the profile (`NVIDIA A100-SXM4-80GB MIG
/// 1g.10gb`), as real drivers name them.
fn mig_name(d: &Dev, k: usize) -> String {
    let profile = d.mig_device(k).map_or("", |m| m.profile.name.as_str());
    format!("{} MIG {profile}", d.spec().name)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    buf: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetName", || {
        let (d, on) = dev_or_mig("nvmlDeviceGetName", device)?;
        let name = match on {
            On::Gpu => d.spec().name.clone(),
            On::Mig(k) => mig_name(&d, k),
        };
        unsafe { put_str(buf, length, &name) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    buf: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetUUID", || {
        let (d, on) = dev_or_mig("nvmlDeviceGetUUID", device)?;
        let uuid = match on {
            On::Gpu => d.spec().uuid.clone(),
            On::Mig(k) => d.mig_device(k).map(|m| m.uuid.clone()).unwrap_or_default(),
        };
        unsafe { put_str(buf, length, &uuid) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetMigMode", || {
        let d = dev("nvmlDeviceGetMigMode", device)?;
        let mig = &d.spec().mig;
        if !mig.capable {
            return Err(code::NOT_SUPPORTED);
        }
        unsafe {
            put(current, c_uint::from(mig.enabled))?;
            put(pending, c_uint::from(mig.pending))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetMaxMigDeviceCount", || {
        let d = dev("nvmlDeviceGetMaxMigDeviceCount", device)?;
        if !d.spec().mig.capable {
            return Err(code::NOT_SUPPORTED);
        }
        unsafe { put(count, MAX_MIG_DEVICES as c_uint) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    is_mig: *mut c_uint,
) -> nvmlReturn_t {
    entry("nvmlDeviceIsMigDeviceHandle", || {
        let (_, on) = dev_or_mig("nvmlDeviceIsMigDeviceHandle", device)?;
        unsafe { put(is_mig, c_uint::from(on != On::Gpu)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetMigDeviceHandleByIndex", || {
        let d = dev("nvmlDeviceGetMigDeviceHandleByIndex", device)?;
        let cfg = &d.spec().mig;
        if !cfg.capable {
            return Err(code::NOT_SUPPORTED);
        }
        let k = index as usize;
        if k >= MAX_MIG_DEVICES {
            return Err(code::INVALID_ARGUMENT);
        }
        if !cfg.active() || k >= cfg.devices.len() {
            return Err(code::NOT_FOUND);
        }
        unsafe { put(mig, mig_handle(d.gpu, k)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    entry(
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        || match dev_or_mig("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", mig)? {
            (d, On::Mig(_)) => unsafe { put(device, handle_of(d.gpu)) },
            (_, On::Gpu) => Err(code::INVALID_ARGUMENT),
        },
    )
}

unsafe fn instance_id(
    name: &'static str,
    device: nvmlDevice_t,
    id: *mut c_uint,
    pick: fn(&MigDevice) -> u32,
) -> nvmlReturn_t {
    entry(name, || match dev_or_mig(name, device)? {
        (d, On::Mig(k)) => {
            let m = d.mig_device(k).ok_or(code::INVALID_ARGUMENT)?;
            unsafe { put(id, pick(m)) }
        }
        (_, On::Gpu) => Err(code::NOT_SUPPORTED),
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    unsafe {
        instance_id("nvmlDeviceGetGpuInstanceId", device, id, |m| {
            m.gpu_instance_id
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    unsafe {
        instance_id("nvmlDeviceGetComputeInstanceId", device, id, |m| {
            m.compute_instance_id
        })
    }
}

// --- GPU-instance profiles -------------------------------------------------------------------

/// `nvmlGpuInstanceProfileInfo_v2_t` / `_v3_t` version words (`sizeof | N << 24`).
pub const PROFILE_INFO_V2_VERSION: u32 = 152 | (2 << 24);
pub const PROFILE_INFO_V3_VERSION: u32 = 152 | (3 << 24);

const _: () = {
    assert!(std::mem::size_of::<nvmlGpuInstanceProfileInfo_t>() == 48);
    assert!(std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() == 152);
    assert!(std::mem::size_of::<nvmlGpuInstanceProfileInfo_v3_t>() == 152);
    assert!(std::mem::size_of::<nvmlGpuInstanceInfo_t>() == 24);
};

/// The profile `profile` (`NVML_GPU_INSTANCE_PROFILE_*`) of a MIG-capable GPU.
fn profile_of(d: &Dev, profile: c_uint) -> Result<Profile, u32> {
    let s = d.spec();
    if !s.mig.capable {
        return Err(code::NOT_SUPPORTED);
    }
    if profile >= NVML_GPU_INSTANCE_PROFILE_COUNT {
        return Err(code::INVALID_ARGUMENT);
    }
    let total_mib = s.memory_total_bytes as f64 / (1024.0 * 1024.0);
    crate::mig::profiles(&s.name, total_mib)
        .into_iter()
        .find(|p| p.nvml_profile == profile)
        .ok_or(code::NOT_SUPPORTED)
}

fn profile_info(p: &Profile) -> nvmlGpuInstanceProfileInfo_t {
    nvmlGpuInstanceProfileInfo_t {
        id: p.id,
        isP2pSupported: 0,
        sliceCount: p.compute_slices,
        instanceCount: p.instances,
        multiprocessorCount: p.multiprocessors,
        copyEngineCount: p.copy_engines,
        decoderCount: p.decoders,
        encoderCount: 0,
        jpegCount: p.jpegs,
        ofaCount: p.ofas,
        memorySizeMB: p.memory_mib,
    }
}

fn c_name(s: &str) -> [c_char; 96] {
    let mut out = [0 as c_char; 96];
    for (dst, src) in out.iter_mut().zip(s.bytes().take(95)) {
        *dst = src as c_char;
    }
    out
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetGpuInstanceProfileInfo", || {
        let d = dev("nvmlDeviceGetGpuInstanceProfileInfo", device)?;
        let p = profile_of(&d, profile)?;
        unsafe { put(info, profile_info(&p)) }
    })
}

/// The versioned form: `_v2` (with `isP2pSupported`) or `_v3` (with `capabilities`), both with
/// the profile's name (`MIG 1g.10gb`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetGpuInstanceProfileInfoV", || {
        let d = dev("nvmlDeviceGetGpuInstanceProfileInfoV", device)?;
        if info.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: non-null pointer to the caller's struct; the version word comes first in both.
        let version = unsafe { (*info).version };
        let p = profile_of(&d, profile)?;
        let v1 = profile_info(&p);
        let name = c_name(&format!("MIG {}", p.name));
        match version {
            PROFILE_INFO_V2_VERSION => unsafe {
                put(
                    info,
                    nvmlGpuInstanceProfileInfo_v2_t {
                        version,
                        id: v1.id,
                        isP2pSupported: v1.isP2pSupported,
                        sliceCount: v1.sliceCount,
                        instanceCount: v1.instanceCount,
                        multiprocessorCount: v1.multiprocessorCount,
                        copyEngineCount: v1.copyEngineCount,
                        decoderCount: v1.decoderCount,
                        encoderCount: v1.encoderCount,
                        jpegCount: v1.jpegCount,
                        ofaCount: v1.ofaCount,
                        memorySizeMB: v1.memorySizeMB,
                        name,
                    },
                )
            },
            PROFILE_INFO_V3_VERSION => unsafe {
                put(
                    info.cast::<nvmlGpuInstanceProfileInfo_v3_t>(),
                    nvmlGpuInstanceProfileInfo_v3_t {
                        version,
                        id: v1.id,
                        sliceCount: v1.sliceCount,
                        instanceCount: v1.instanceCount,
                        multiprocessorCount: v1.multiprocessorCount,
                        copyEngineCount: v1.copyEngineCount,
                        decoderCount: v1.decoderCount,
                        encoderCount: v1.encoderCount,
                        jpegCount: v1.jpegCount,
                        ofaCount: v1.ofaCount,
                        memorySizeMB: v1.memorySizeMB,
                        name,
                        capabilities: 0,
                    },
                )
            },
            _ => Err(code::ARGUMENT_VERSION_MISMATCH),
        }
    })
}

// --- GPU instances ---------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: nvmlDevice_t,
    id: c_uint,
    gpu_instance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetGpuInstanceById", || {
        let d = dev("nvmlDeviceGetGpuInstanceById", device)?;
        let cfg = &d.spec().mig;
        if !cfg.capable || !cfg.active() {
            return Err(code::NOT_SUPPORTED);
        }
        let k = cfg
            .devices
            .iter()
            .position(|m| m.gpu_instance_id == id)
            .ok_or(code::NOT_FOUND)?;
        unsafe { put(gpu_instance, gi_handle(d.gpu, k)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gpu_instance: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> nvmlReturn_t {
    entry("nvmlGpuInstanceGetInfo", || {
        let sim = sim::current()?;
        let (gpu, k) = slot_of(gpu_instance as usize, GI_HANDLES.as_ptr(), &sim)
            .ok_or(code::INVALID_ARGUMENT)?;
        let d = guard("nvmlGpuInstanceGetInfo", sim, gpu)?;
        let m = d.mig_device(k).ok_or(code::INVALID_ARGUMENT)?;
        unsafe {
            put(
                info,
                nvmlGpuInstanceInfo_t {
                    device: handle_of(gpu),
                    id: m.gpu_instance_id,
                    profileId: m.profile.id,
                    placement: nvmlGpuInstancePlacement_t {
                        start: m.placement_start,
                        size: m.profile.memory_slices,
                    },
                },
            )
        }
    })
}
