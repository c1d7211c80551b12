//! The GPM exports (`nvmlGpm*`): support query, sample alloc/free/get and the metrics between two
//! samples (the model is in `crate::gpm`). A GPU answers only when its scenario says `gpm`
//! (Hopper and later by default); elsewhere `nvmlGpmQueryDeviceSupport` says unsupported and
//! the other device calls answer `NOT_SUPPORTED`, as a real driver does on an A100. On a GPU with
//! MIG on, `nvmlGpmMigSampleGet` samples one GPU instance.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_uint};
use std::ptr::{addr_of, addr_of_mut};

use nvml_wrapper_sys::bindings::*;

use super::{dev, entry, put, CALL_GPU};
use crate::gpm::{self, Taken};
use crate::sim::{self, code};

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    device: nvmlDevice_t,
    support: *mut nvmlGpmSupport_t,
) -> nvmlReturn_t {
    entry("nvmlGpmQueryDeviceSupport", || {
        let d = dev("nvmlGpmQueryDeviceSupport", device)?;
        if support.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: non-null pointer to the caller's nvmlGpmSupport_t.
        let version = unsafe { addr_of!((*support).version).read() };
        if version != gpm::VERSION {
            return Err(code::ARGUMENT_VERSION_MISMATCH);
        }
        // SAFETY: as above.
        unsafe { addr_of_mut!((*support).isSupportedDevice).write(c_uint::from(d.spec().gpm)) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmQueryIfStreamingEnabled(
    device: nvmlDevice_t,
    state: *mut c_uint,
) -> nvmlReturn_t {
    entry("nvmlGpmQueryIfStreamingEnabled", || {
        let d = dev("nvmlGpmQueryIfStreamingEnabled", device)?;
        if !d.spec().gpm {
            return Err(code::NOT_SUPPORTED);
        }
        // streaming (the driver sampling on its own) is off; clients take their own samples
        unsafe { put(state, 0) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSetStreamingEnabled(
    device: nvmlDevice_t,
    _state: c_uint,
) -> nvmlReturn_t {
    entry("nvmlGpmSetStreamingEnabled", || {
        let d = dev("nvmlGpmSetStreamingEnabled", device)?;
        if !d.spec().gpm {
            return Err(code::NOT_SUPPORTED);
        }
        // accepted; it changes nothing a client can observe here
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(sample: *mut nvmlGpmSample_t) -> nvmlReturn_t {
    entry("nvmlGpmSampleAlloc", || {
        sim::current()?;
        if sample.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        let handle = gpm::alloc() as nvmlGpmSample_t;
        unsafe { put(sample, handle) }
    })
}

/// Frees a sample; answers even after `nvmlShutdown` (nvml-wrapper's `GpmSample` drop calls it
/// whenever the sample goes).
#[no_mangle]
pub extern "C" fn nvmlGpmSampleFree(sample: nvmlGpmSample_t) -> nvmlReturn_t {
    entry("nvmlGpmSampleFree", || gpm::free(sample as usize))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleGet(
    device: nvmlDevice_t,
    sample: nvmlGpmSample_t,
) -> nvmlReturn_t {
    entry("nvmlGpmSampleGet", || {
        let d = dev("nvmlGpmSampleGet", device)?;
        if !d.spec().gpm {
            return Err(code::NOT_SUPPORTED);
        }
        gpm::fill(
            sample as usize,
            Taken {
                gpu: d.gpu,
                t_s: d.t,
                gpu_instance: None,
            },
        )
    })
}

/// A sample of one GPU instance of a GPU with MIG on (`device` is the GPU's handle, not a MIG
/// device's): `NOT_SUPPORTED` without GPM or with MIG off (and for a MIG device handle),
/// `INVALID_ARGUMENT` for a GPU instance the GPU does not have. Costs what `nvmlGpmSampleGet`
/// does (`latency.rs`).
#[no_mangle]
pub unsafe extern "C" fn nvmlGpmMigSampleGet(
    device: nvmlDevice_t,
    gpu_instance_id: c_uint,
    sample: nvmlGpmSample_t,
) -> nvmlReturn_t {
    const NAME: &str = "nvmlGpmMigSampleGet";
    entry(NAME, || {
        let d = dev(NAME, device)?;
        let mig = &d.spec().mig;
        if !d.spec().gpm || !mig.active() {
            return Err(code::NOT_SUPPORTED);
        }
        if !mig
            .devices
            .iter()
            .any(|m| m.gpu_instance_id == gpu_instance_id)
        {
            return Err(code::INVALID_ARGUMENT);
        }
        gpm::fill(
            sample as usize,
            Taken {
                gpu: d.gpu,
                t_s: d.t,
                gpu_instance: Some(gpu_instance_id),
            },
        )
    })
}

/// Writes one metric's answer at `m` (a slot of the caller's `metrics[]`).
unsafe fn answer(m: *mut nvmlGpmMetric_t, result: Result<f64, u32>, id: u32) {
    let (rc, value) = match result {
        Ok(v) => (code::SUCCESS, v),
        Err(c) => (c, 0.0),
    };
    let (short, long, unit) = match (rc, gpm::info(id)) {
        (code::SUCCESS, Some((s, l, u))) => (s.as_ptr(), l.as_ptr(), u.as_ptr()),
        _ => (std::ptr::null(), std::ptr::null(), std::ptr::null()),
    };
    // SAFETY: `m` points into the caller's metrics array (checked by the caller); the strings
    // are 'static and NUL-terminated, and clients only read them.
    unsafe {
        addr_of_mut!((*m).nvmlReturn).write(rc);
        addr_of_mut!((*m).value).write(value);
        addr_of_mut!((*m).metricInfo.shortName).write(short as *mut c_char);
        addr_of_mut!((*m).metricInfo.longName).write(long as *mut c_char);
        addr_of_mut!((*m).metricInfo.unit).write(unit as *mut c_char);
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmMetricsGet(request: *mut nvmlGpmMetricsGet_t) -> nvmlReturn_t {
    const NAME: &str = "nvmlGpmMetricsGet";
    entry(NAME, || {
        let sim = sim::current()?;
        if request.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // Fields are read and written one by one through raw pointers: a client built against
        // an older header passes a shorter metrics[] array (98 entries in CUDA 12.0's), so no
        // reference to the whole struct is made.
        // SAFETY: non-null pointer to the caller's request header.
        let (version, count, s1, s2) = unsafe {
            (
                addr_of!((*request).version).read(),
                addr_of!((*request).numMetrics).read(),
                addr_of!((*request).sample1).read(),
                addr_of!((*request).sample2).read(),
            )
        };
        if version != gpm::VERSION {
            return Err(code::ARGUMENT_VERSION_MISMATCH);
        }
        if count > gpm::METRIC_MAX {
            return Err(code::INVALID_ARGUMENT);
        }
        let a = gpm::taken(s1 as usize)?;
        let b = gpm::taken(s2 as usize)?;
        // two samples of one GPU, or of one GPU instance
        if a.gpu != b.gpu || a.gpu_instance != b.gpu_instance {
            return Err(code::INVALID_ARGUMENT);
        }
        CALL_GPU.with(|c| c.set(Some(a.gpu)));
        sim.hang(NAME, a.gpu);
        let now = sim.now_s();
        sim.inject(NAME, Some(a.gpu), now)?;
        if sim.is_lost(a.gpu, now) {
            return Err(code::GPU_IS_LOST);
        }
        // SAFETY: the caller's metrics[] holds at least `numMetrics` entries (NVML's contract).
        let metrics = unsafe { addr_of_mut!((*request).metrics) }.cast::<nvmlGpmMetric_t>();
        let mut memo = gpm::Means::default();
        for i in 0..count as usize {
            // SAFETY: i < numMetrics, within the caller's array.
            let m = unsafe { metrics.add(i) };
            // SAFETY: as above.
            let id = unsafe { addr_of!((*m).metricId).read() };
            let result = gpm::value(&sim, a.gpu, a.gpu_instance, id, (a.t_s, b.t_s), &mut memo);
            // SAFETY: as above.
            unsafe { answer(m, result, id) };
        }
        Ok(())
    })
}
