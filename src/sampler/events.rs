//! The XID event listener: one NVML event set with every GPU that supports critical XID events
//! registered, waited on by a separate thread so that a sampling tick never blocks on it. Events
//! are queued with the time they arrived and drained into the next snapshot.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, EventSet, Nvml};

use crate::model::XidEvent;

/// How long one `nvmlEventSetWait_v2` call may block; bounds how long the thread lingers after
/// the sampler is dropped.
const WAIT_MS: u32 = 500;

/// One registered GPU: its raw handle (as an address, to match `EventData.device`), index, UUID.
struct Registered {
    handle: usize,
    index: u32,
    uuid: String,
}

/// A running listener. Dropping it tells the thread to stop (it exits within [`WAIT_MS`]).
pub(crate) struct XidListener {
    stop: Arc<AtomicBool>,
    queue: Arc<Mutex<Vec<XidEvent>>>,
}

impl XidListener {
    /// Registers every device in `devices` (handle, index, uuid) that supports XID events and
    /// starts the waiting thread. `None` when no device supports them or the event API is
    /// missing.
    pub(crate) fn start(
        nvml: &'static Nvml,
        devices: &[(&Device<'static>, u32, &str)],
    ) -> Option<XidListener> {
        let mut set = match nvml.create_event_set() {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("XID events unavailable: {e}");
                return None;
            }
        };
        let mut registered: Vec<Registered> = Vec::new();
        let mut ok_devices: Vec<&Device<'static>> = Vec::new();
        for (dev, index, uuid) in devices {
            match dev.supported_event_types() {
                Ok(t) if t.contains(EventTypes::CRITICAL_XID_ERROR) => {}
                Ok(_) => {
                    tracing::debug!("GPU {index}: XID events not supported");
                    continue;
                }
                Err(e) => {
                    tracing::debug!("GPU {index}: XID event support unknown: {e}");
                    continue;
                }
            }
            match dev.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(s) => {
                    set = s;
                    ok_devices.push(dev);
                    registered.push(Registered {
                        // SAFETY: only the pointer value is read, to compare with event data.
                        handle: unsafe { dev.handle() } as usize,
                        index: *index,
                        uuid: (*uuid).to_string(),
                    });
                }
                Err(e) => {
                    // A failed registration frees the set: build a new one with the devices that
                    // registered before.
                    tracing::debug!("GPU {index}: cannot register XID events: {}", e.error);
                    set = Self::rebuild(nvml, &ok_devices)?;
                }
            }
        }
        if registered.is_empty() {
            return None;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let queue = Arc::new(Mutex::new(Vec::new()));
        let (stop2, queue2) = (Arc::clone(&stop), Arc::clone(&queue));
        let spawned = std::thread::Builder::new()
            .name("gpuwatch-xid".into())
            .spawn(move || wait_loop(&set, &registered, &stop2, &queue2));
        if let Err(e) = spawned {
            tracing::warn!("cannot start the XID event thread: {e}");
            return None;
        }
        Some(XidListener { stop, queue })
    }

    fn rebuild(nvml: &'static Nvml, devices: &[&Device<'static>]) -> Option<EventSet<'static>> {
        let mut set = nvml.create_event_set().ok()?;
        for dev in devices {
            set = dev
                .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                .ok()?;
        }
        Some(set)
    }

    /// Takes the events received since the last call.
    pub(crate) fn drain(&self) -> Vec<XidEvent> {
        match self.queue.lock() {
            Ok(mut q) => std::mem::take(&mut *q),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        }
    }
}

impl Drop for XidListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn wait_loop(
    set: &EventSet<'static>,
    registered: &[Registered],
    stop: &AtomicBool,
    queue: &Mutex<Vec<XidEvent>>,
) {
    while !stop.load(Ordering::Relaxed) {
        let began = Instant::now();
        match set.wait(WAIT_MS) {
            Ok(ev) => {
                if !ev.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                    continue;
                }
                // SAFETY: only the pointer value is read.
                let handle = unsafe { ev.device.handle() } as usize;
                let Some(dev) = registered.iter().find(|r| r.handle == handle) else {
                    tracing::debug!("XID event for an unknown device handle");
                    continue;
                };
                let xid = match ev.event_data {
                    Some(XidError::Value(v)) => v,
                    Some(XidError::Unknown) | None => 999,
                };
                let event = XidEvent {
                    time_ms: super::now_ms(),
                    gpu_index: dev.index,
                    gpu_uuid: dev.uuid.clone(),
                    xid,
                };
                tracing::info!("GPU {}: XID {xid}", dev.index);
                match queue.lock() {
                    Ok(mut q) => q.push(event),
                    Err(poisoned) => poisoned.into_inner().push(event),
                }
            }
            Err(e) => {
                // Never spin: if the library returned early (a timeout that did not wait, an
                // error), sleep out the rest of the wait period; after a real error, longer.
                let floor = match e {
                    NvmlError::Timeout => Duration::from_millis(u64::from(WAIT_MS)),
                    _ => {
                        tracing::debug!("XID event wait failed: {e}");
                        Duration::from_secs(1)
                    }
                };
                let spent = began.elapsed();
                if spent < floor {
                    std::thread::sleep(floor - spent);
                }
            }
        }
    }
}
