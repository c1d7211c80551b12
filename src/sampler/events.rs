//! XID events: one NVML event set with every GPU that supports critical XID events registered,
//! drained without blocking (`nvmlEventSetWait_v2` with a zero timeout) by the sampling thread at
//! every tick, so events land in the next snapshot.
//!
//! Why not a thread blocked in the wait: the events are only consumed at tick granularity anyway,
//! a zero-timeout wait returns at once (it never stalls a tick), and a waiting thread costs a
//! wake-up per wait period (the simulated library wakes every 250 ms), which was about a tenth
//! of gpuwatch's whole sampling CPU at 100 ms ticks.

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, EventSet, Nvml};

use crate::model::XidEvent;

/// At most this many events are taken per tick (a storm cannot stall sampling; the rest wait
/// for the next tick).
const MAX_PER_TICK: usize = 64;

/// One registered GPU: its raw handle (as an address, to match `EventData.device`), index, UUID.
struct Registered {
    handle: usize,
    index: u32,
    uuid: String,
}

/// The event set and the GPUs registered in it.
pub(crate) struct XidListener {
    set: EventSet<'static>,
    registered: Vec<Registered>,
    /// Set after a failed wait was logged, so a broken set logs once.
    warned: bool,
}

impl XidListener {
    /// Registers every device in `devices` (handle, index, uuid) that supports XID events.
    /// `None` when no device supports them or the event API is missing. Every GPU left without
    /// XID monitoring, and why, is added to `missing` (the caller says so loudly).
    pub(crate) fn start(
        nvml: &'static Nvml,
        devices: &[(&Device<'static>, u32, &str)],
        missing: &mut Vec<String>,
    ) -> Option<XidListener> {
        let mut set = match nvml.create_event_set() {
            Ok(s) => s,
            Err(e) => {
                missing.push(format!("XID events unavailable on every GPU: {e}"));
                return None;
            }
        };
        let mut registered: Vec<Registered> = Vec::new();
        let mut ok_devices: Vec<&Device<'static>> = Vec::new();
        for (dev, index, uuid) in devices {
            match dev.supported_event_types() {
                Ok(t) if t.contains(EventTypes::CRITICAL_XID_ERROR) => {}
                Ok(_) => {
                    missing.push(format!("GPU {index}: XID events not supported"));
                    continue;
                }
                Err(e) => {
                    missing.push(format!("GPU {index}: XID event support unknown: {e}"));
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
                    missing.push(format!(
                        "GPU {index}: cannot register XID events: {}",
                        e.error
                    ));
                    set = Self::rebuild(nvml, &ok_devices)?;
                }
            }
        }
        if registered.is_empty() {
            return None;
        }
        Some(XidListener {
            set,
            registered,
            warned: false,
        })
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

    /// Takes the events that arrived since the last call, stamped `time_ms`, without blocking.
    pub(crate) fn drain(&mut self, time_ms: i64) -> Vec<XidEvent> {
        let mut out = Vec::new();
        for _ in 0..MAX_PER_TICK {
            let ev = match self.set.wait(0) {
                Ok(ev) => ev,
                Err(NvmlError::Timeout) => break,
                Err(e) => {
                    if !self.warned {
                        self.warned = true;
                        tracing::debug!("XID event wait failed: {e}");
                    }
                    break;
                }
            };
            if !ev.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                continue;
            }
            // SAFETY: only the pointer value is read.
            let handle = unsafe { ev.device.handle() } as usize;
            let Some(dev) = self.registered.iter().find(|r| r.handle == handle) else {
                tracing::debug!("XID event for an unknown device handle");
                continue;
            };
            let xid = match ev.event_data {
                Some(XidError::Value(v)) => v,
                Some(XidError::Unknown) | None => 999,
            };
            tracing::info!("GPU {}: XID {xid}", dev.index);
            out.push(XidEvent::new(time_ms, dev.index, dev.uuid.clone(), xid));
        }
        out
    }
}
