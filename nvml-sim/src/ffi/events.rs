//! Event sets: XID (and ECC) events from the scenario, delivered through `nvmlEventSetWait_v2`.
//!
//! A set receives each event on a registered GPU whose type is in the registered mask and whose
//! scenario time is at or after the registration; every event is delivered once per set. The wait
//! sleeps until the next due event or the timeout (real time), whichever comes first.

#![allow(clippy::missing_safety_doc)]

use std::collections::{HashMap, HashSet};
use std::ffi::{c_uint, c_ulonglong};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nvml_wrapper_sys::bindings::*;

use super::{dev, entry, handle_of, put, system};
use crate::scenario::EventKind;
use crate::sim::{self, code};

/// Event type bits.
pub const SINGLE_BIT_ECC: u64 = 0x1;
pub const DOUBLE_BIT_ECC: u64 = 0x2;
pub const PSTATE: u64 = 0x4;
pub const XID: u64 = 0x8;
pub const CLOCK: u64 = 0x10;

#[derive(Default)]
struct SetState {
    /// (gpu, mask, registered at scenario time)
    registrations: Vec<(usize, u64, f64)>,
    /// (index in scenario.events, event type) already delivered
    delivered: HashSet<(usize, u64)>,
}

static SETS: Mutex<Option<HashMap<usize, SetState>>> = Mutex::new(None);
static NEXT_SET: AtomicUsize = AtomicUsize::new(0x5e70_0000);

/// (type, data) pairs an event produces.
fn deliverables(kind: &EventKind) -> Vec<(u64, u64)> {
    match kind {
        EventKind::Xid(x) if x.nvml => vec![(XID, x.code)],
        EventKind::Ecc {
            corrected,
            uncorrected,
        } => {
            let mut v = Vec::new();
            if *corrected > 0 {
                v.push((SINGLE_BIT_ECC, 0));
            }
            if *uncorrected > 0 {
                v.push((DOUBLE_BIT_ECC, 0));
            }
            v
        }
        _ => Vec::new(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    entry("nvmlEventSetCreate", || {
        system("nvmlEventSetCreate")?;
        let id = NEXT_SET.fetch_add(0x10, Ordering::Relaxed);
        let mut sets = SETS.lock().unwrap_or_else(|p| p.into_inner());
        sets.get_or_insert_with(HashMap::new)
            .insert(id, SetState::default());
        unsafe { put(set, id as nvmlEventSet_t) }
    })
}

#[no_mangle]
pub extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    entry("nvmlEventSetFree", || {
        sim::current()?;
        let mut sets = SETS.lock().unwrap_or_else(|p| p.into_inner());
        match sets.as_mut().and_then(|m| m.remove(&(set as usize))) {
            Some(_) => Ok(()),
            None => Err(code::INVALID_ARGUMENT),
        }
    })
}

fn supported_types(ecc: bool) -> u64 {
    let base = PSTATE | XID | CLOCK;
    if ecc {
        base | SINGLE_BIT_ECC | DOUBLE_BIT_ECC
    } else {
        base
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetSupportedEventTypes", || {
        let d = dev("nvmlDeviceGetSupportedEventTypes", device)?;
        unsafe { put(types, supported_types(d.spec().ecc_enabled)) }
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    entry("nvmlDeviceRegisterEvents", || {
        let d = dev("nvmlDeviceRegisterEvents", device)?;
        let supported = supported_types(d.spec().ecc_enabled);
        if types & !supported != 0 {
            return Err(code::NOT_SUPPORTED);
        }
        let mut sets = SETS.lock().unwrap_or_else(|p| p.into_inner());
        let state = sets
            .as_mut()
            .and_then(|m| m.get_mut(&(set as usize)))
            .ok_or(code::INVALID_ARGUMENT)?;
        state.registrations.push((d.gpu, types, d.t));
        Ok(())
    })
}

/// One pending event for a set, or the scenario time of the next one (if any).
enum Poll {
    Ready(nvmlEventData_t),
    Wait(Option<f64>),
}

fn poll(set: usize, sim: &sim::Sim) -> Result<Poll, u32> {
    let now = sim.now_s();
    let mut sets = SETS.lock().unwrap_or_else(|p| p.into_inner());
    let state = sets
        .as_mut()
        .and_then(|m| m.get_mut(&set))
        .ok_or(code::INVALID_ARGUMENT)?;
    let mut next: Option<f64> = None;
    for (i, ev) in sim.scenario.events.iter().enumerate() {
        for (etype, data) in deliverables(&ev.kind) {
            let registered = state.registrations.iter().any(|(gpu, mask, since)| {
                *gpu == ev.gpu as usize && mask & etype != 0 && ev.at_s >= *since
            });
            if !registered || state.delivered.contains(&(i, etype)) {
                continue;
            }
            if ev.at_s <= now {
                state.delivered.insert((i, etype));
                return Ok(Poll::Ready(nvmlEventData_t {
                    device: handle_of(ev.gpu as usize),
                    eventType: etype,
                    eventData: data,
                    gpuInstanceId: u32::MAX,
                    computeInstanceId: u32::MAX,
                }));
            }
            next = Some(next.map_or(ev.at_s, |n: f64| n.min(ev.at_s)));
        }
    }
    Ok(Poll::Wait(next))
}

unsafe fn wait(
    name: &'static str,
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    entry(name, || {
        system(name)?;
        if data.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
        loop {
            // re-checked every round, so a shutdown while waiting ends the wait
            let sim = sim::current()?;
            match poll(set as usize, &sim)? {
                Poll::Ready(event) => return unsafe { put(data, event) },
                Poll::Wait(next) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(code::TIMEOUT);
                    }
                    let mut sleep = deadline - now;
                    if let (Some(at), true) = (next, sim.time_scale() > 0.0) {
                        let real_s = ((at - sim.now_s()) / sim.time_scale()).max(0.0);
                        sleep = sleep.min(Duration::from_secs_f64(real_s + 0.000_5));
                    }
                    // wake regularly so a freed set or a shutdown is noticed
                    std::thread::sleep(sleep.min(Duration::from_millis(250)));
                }
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    unsafe { wait("nvmlEventSetWait_v2", set, data, timeout_ms) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    unsafe { wait("nvmlEventSetWait", set, data, timeout_ms) }
}
