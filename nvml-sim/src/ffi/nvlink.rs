//! NVLink getters (`nvmlDeviceGetNvLink*`) and the NVLink field values, from the scenario's
//! links (see `crate::nvlink`). A GPU without NVLink answers NOT_SUPPORTED; a link it does not
//! have INVALID_ARGUMENT.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::field_id::*;
use nvml_wrapper_sys::bindings::*;

use super::{dev, entry, put, Dev};
use crate::nvlink::{LinkSpec, Remote};
use crate::sim::code;

/// `nvmlIntNvLinkDeviceType_t`: GPU 0, IBM NPU 1, NVSwitch 2.
const DEVICE_TYPE_GPU: u32 = 0;
const DEVICE_TYPE_SWITCH: u32 = 2;
/// PCI device id of an NVSwitch (third generation, HGX H100), NVIDIA's vendor id below.
const SWITCH_PCI_DEVICE_ID: u32 = 0x22A3_10DE;

/// Link `link` of the call's GPU: NOT_SUPPORTED without NVLink, INVALID_ARGUMENT past its links.
fn link_of(d: &Dev, link: c_uint) -> Result<LinkSpec, u32> {
    let links = d.sim.scenario.nvlink.links_of(d.gpu);
    if links.is_empty() {
        return Err(code::NOT_SUPPORTED);
    }
    links
        .get(link as usize)
        .copied()
        .ok_or(code::INVALID_ARGUMENT)
}

fn c_chars<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (dst, src) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *dst = src as c_char;
    }
    out
}

/// The PCI identity of the far end of a link.
fn remote_pci(d: &Dev, spec: &LinkSpec) -> nvmlPciInfo_t {
    match spec.remote {
        Remote::Gpu { gpu, .. } => {
            let s = d.sim.device(gpu as usize);
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
        Remote::Switch { bus } => nvmlPciInfo_t {
            busIdLegacy: c_chars::<16>(&format!("0000:{bus:02X}:00.0")),
            domain: 0,
            bus,
            device: 0,
            pciDeviceId: SWITCH_PCI_DEVICE_ID,
            pciSubSystemId: 0,
            busId: c_chars::<32>(&format!("00000000:{bus:02X}:00.0")),
        },
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: nvmlDevice_t,
    link: c_uint,
    is_active: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetNvLinkState", || {
        let d = dev("nvmlDeviceGetNvLinkState", device)?;
        link_of(&d, link)?;
        let (up, _) = d.sim.scenario.nvlink.state(d.gpu, link, d.t);
        unsafe { put(is_active, nvmlEnableState_t::from(up)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkVersion(
    device: nvmlDevice_t,
    link: c_uint,
    version: *mut c_uint,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetNvLinkVersion", || {
        let d = dev("nvmlDeviceGetNvLinkVersion", device)?;
        let spec = link_of(&d, link)?;
        // a real driver answers nvmlNvlinkVersion_t (6 = NVLINK_VERSION_4_0 on an H100), not
        // the generation
        unsafe { put(version, crate::nvlink::nvml_version(spec.version)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkCapability(
    device: nvmlDevice_t,
    link: c_uint,
    _capability: nvmlNvLinkCapability_t,
    cap_result: *mut c_uint,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetNvLinkCapability", || {
        let d = dev("nvmlDeviceGetNvLinkCapability", device)?;
        link_of(&d, link)?;
        unsafe { put(cap_result, 1) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: nvmlDevice_t,
    link: c_uint,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetNvLinkRemotePciInfo_v2", || {
        let d = dev("nvmlDeviceGetNvLinkRemotePciInfo_v2", device)?;
        let spec = link_of(&d, link)?;
        unsafe { put(pci, remote_pci(&d, &spec)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    device: nvmlDevice_t,
    link: c_uint,
    kind: *mut nvmlIntNvLinkDeviceType_t,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetNvLinkRemoteDeviceType", || {
        let d = dev("nvmlDeviceGetNvLinkRemoteDeviceType", device)?;
        let spec = link_of(&d, link)?;
        let t = match spec.remote {
            Remote::Gpu { .. } => DEVICE_TYPE_GPU,
            Remote::Switch { .. } => DEVICE_TYPE_SWITCH,
        };
        unsafe { put(kind, t) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkErrorCounter(
    device: nvmlDevice_t,
    link: c_uint,
    counter: nvmlNvLinkErrorCounter_t,
    value: *mut c_ulonglong,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetNvLinkErrorCounter", || {
        let d = dev("nvmlDeviceGetNvLinkErrorCounter", device)?;
        link_of(&d, link)?;
        if counter > 4 {
            return Err(code::INVALID_ARGUMENT);
        }
        let n = d
            .sim
            .scenario
            .nvlink
            .errors(d.gpu, link, counter as usize, d.t);
        unsafe { put(value, n) }
    })
}

/// The per-link field ids of one kind: links 0–5, then 6–11.
fn per_link(id: u32, first: u32, second: u32) -> Option<u32> {
    if (first..first + 6).contains(&id) {
        Some(id - first)
    } else if (second..second + 6).contains(&id) {
        Some(id - second + 6)
    } else {
        None
    }
}

/// An NVLink field of `nvmlDeviceGetFieldValues` (ULL unless noted; NOT_SUPPORTED without
/// NVLink or for a link the GPU lacks): error counters per link and in total (32–59, 96–119),
/// speeds (84–89, 132–137: UINT, MB/s, 0 for a link that is down; 90: the speed the links that
/// are up share, see `Nvlink::common_speed`), link count (91; UINT) and
/// the throughput counters (138–141, KiB; raw = data here).
pub(super) fn field_value(d: &Dev, id: u32) -> Result<(nvmlValueType_t, nvmlValue_t), u32> {
    const UINT: nvmlValueType_t = nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT;
    const ULL: nvmlValueType_t = nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    let nv = &d.sim.scenario.nvlink;
    let links = nv.links_of(d.gpu).len() as u32;
    if links == 0 {
        return Err(code::NOT_SUPPORTED);
    }
    let ull = |v: u64| Ok((ULL, nvmlValue_t { ullVal: v }));
    let ui = |v: u32| Ok((UINT, nvmlValue_t { uiVal: v }));
    let errors = |counter: usize, link: Option<u32>| -> Result<u64, u32> {
        match link {
            Some(l) if l >= links => Err(code::NOT_SUPPORTED),
            Some(l) => Ok(nv.errors(d.gpu, l, counter, d.t)),
            None => Ok((0..links).map(|l| nv.errors(d.gpu, l, counter, d.t)).sum()),
        }
    };
    // counter order: 0 replay, 1 recovery, 2 CRC flit, 3 CRC data
    let kinds: [(usize, u32, u32, u32); 4] = [
        (
            2,
            NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0,
            NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L6,
            NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
        ),
        (
            3,
            NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0,
            NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6,
            NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
        ),
        (
            0,
            NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0,
            NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L6,
            NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
        ),
        (
            1,
            NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L0,
            NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L6,
            NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
        ),
    ];
    for (counter, first, second, total) in kinds {
        if id == total {
            return ull(errors(counter, None)?);
        }
        if let Some(l) = per_link(id, first, second) {
            return ull(errors(counter, Some(l))?);
        }
    }
    if let Some(l) = per_link(
        id,
        NVML_FI_DEV_NVLINK_SPEED_MBPS_L0,
        NVML_FI_DEV_NVLINK_SPEED_MBPS_L6,
    ) {
        if l >= links {
            return Err(code::NOT_SUPPORTED);
        }
        return ui(nv.state(d.gpu, l, d.t).1);
    }
    match id {
        // the speed the links share: one link trained lower (an event) shows in its own
        // field (links 0–11), not here — on a real H100 every NVLink 4 link runs the same speed
        NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON => ui(nv.common_speed(d.gpu, d.t)),
        NVML_FI_DEV_NVLINK_LINK_COUNT => ui(links),
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX | NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX => {
            ull(crate::nvlink::throughput_kib(&d.sim, d.gpu, d.t, true))
        }
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX | NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX => {
            ull(crate::nvlink::throughput_kib(&d.sim, d.gpu, d.t, false))
        }
        _ => Err(code::NOT_SUPPORTED),
    }
}
