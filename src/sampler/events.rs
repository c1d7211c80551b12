//! XID events: one NVML event set with every GPU that supports critical XID events registered,
//! drained without blocking (`nvmlEventSetWait_v2` with a zero timeout) once per tick, at most
//! once a second ([`DRAIN_EVERY`]), so events land in the next snapshot (at most a second late at
//! faster ticks; one tick more when the XID thread had not run by the end of the tick, see
//! [`XidThread::ask_drain`]).
//!
//! Why not a thread blocked in the wait: the events are only consumed at tick granularity anyway,
//! a zero-timeout wait returns at once, and a waiting thread costs a wake-up per wait period (the
//! simulated library wakes every 250 ms), which was about a tenth of gpuwatch's whole sampling
//! CPU at 100 ms ticks.
//!
//! Why not on the sampling thread itself: a driver call can wedge whatever its timeout says
//! (see `real-drivers.md`), and a wedged wait there would blind every GPU. [`XidThread`] owns the
//! event set on a thread of its own: the sampling thread asks it to drain at each tick and takes
//! what came back by the tick's deadline; a drain that has not returned is not asked again (its
//! events come with a later tick, stamped with the time it was asked), and one blocked longer
//! than the call timeout is said once. GPUs that did not answer when the set was built (stalled
//! at start) are registered when they first answer ([`XidThread::register`]).

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, EventSet, Nvml};

use std::sync::mpsc;
use std::time::{Duration, Instant};

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
            if !supports_xids(dev, *index, missing) {
                continue;
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

    /// Registers more devices (e.g. one that was stalled when the set was built); each one that
    /// cannot be registered, and why, is added to `missing`.
    fn add(
        &mut self,
        nvml: &'static Nvml,
        devices: &[(&Device<'static>, u32, &str)],
        missing: &mut Vec<String>,
    ) {
        for (dev, index, uuid) in devices {
            if self.registered.iter().any(|r| r.index == *index)
                || !supports_xids(dev, *index, missing)
            {
                continue;
            }
            // Registration consumes the set (and frees it on failure): work on a fresh one with
            // the devices already registered, then this one.
            let handles: Vec<Device<'static>> = self
                .registered
                .iter()
                .filter_map(|r| nvml.device_by_index(r.index).ok())
                .collect();
            let before: Vec<&Device<'static>> = handles.iter().collect();
            let Some(base) = Self::rebuild(nvml, &before) else {
                missing.push(format!(
                    "GPU {index}: cannot register XID events again on the GPUs registered before"
                ));
                continue;
            };
            match dev.register_events(EventTypes::CRITICAL_XID_ERROR, base) {
                Ok(s) => {
                    self.set = s;
                    self.registered.push(Registered {
                        // SAFETY: only the pointer value is read, to compare with event data.
                        handle: unsafe { dev.handle() } as usize,
                        index: *index,
                        uuid: (*uuid).to_string(),
                    });
                }
                Err(e) => missing.push(format!(
                    "GPU {index}: cannot register XID events: {}",
                    e.error
                )),
            }
        }
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
            // (the xid_error alert that follows tells it to a person)
            tracing::debug!("GPU {}: XID {xid}", dev.index);
            out.push(XidEvent::new(time_ms, dev.index, dev.uuid.clone(), xid));
        }
        out
    }
}

/// Whether `dev` (GPU `index`) supports critical XID events; when not, why is added to
/// `missing`.
fn supports_xids(dev: &Device<'static>, index: u32, missing: &mut Vec<String>) -> bool {
    match dev.supported_event_types() {
        Ok(t) if t.contains(EventTypes::CRITICAL_XID_ERROR) => true,
        Ok(_) => {
            missing.push(format!("GPU {index}: XID events not supported"));
            false
        }
        Err(e) => {
            missing.push(format!("GPU {index}: XID event support unknown: {e}"));
            false
        }
    }
}

/// What the sampling thread asks of the XID thread.
enum Ask {
    /// Take the events that arrived, stamped with this time.
    Drain(i64),
    /// Register these GPUs (index, UUID).
    Register(Vec<(u32, String)>),
}

/// What it answers.
enum Answer {
    Events(Vec<XidEvent>),
    /// The GPUs left without XID events, and why (after a registration).
    Registered(Vec<String>),
}

/// The event set on a thread of its own (see the module documentation).
pub(crate) struct XidThread {
    ask: mpsc::Sender<Ask>,
    answers: mpsc::Receiver<Answer>,
    /// When the drain or registration still unanswered was asked.
    outstanding: Option<Instant>,
    /// A blocked wait was said.
    said: bool,
    call_timeout: Duration,
    /// When the last drain was asked (see [`DRAIN_EVERY`]).
    last_drain: Option<Instant>,
    /// Events received and not yet handed out ([`XidThread::take`]).
    received: Vec<XidEvent>,
}

/// Drains are asked at most this often: at ticks of a second or longer, at every tick; at
/// faster ticks, the tick at or after each second (an event lands in a snapshot at most a
/// second late, stamped with the time its drain was asked). A drain costs the XID thread a
/// wake-up — at 100 ms ticks, most of what gpuwatch spent on XIDs (the sampling thread takes the
/// answer after the devices', without a wake-up of its own).
pub const DRAIN_EVERY: Duration = Duration::from_secs(1);

impl XidThread {
    /// Starts the thread and registers `devices` (index, UUID), waiting up to `call_timeout`
    /// for it; the GPUs left without XID events, and why, are added to `missing`. `None` when
    /// the thread cannot start.
    pub(crate) fn start(
        nvml: &'static Nvml,
        devices: Vec<(u32, String)>,
        call_timeout: Duration,
        missing: &mut Vec<String>,
    ) -> Option<XidThread> {
        let (ask_tx, ask_rx) = mpsc::channel::<Ask>();
        let (answer_tx, answers) = mpsc::channel::<Answer>();
        let spawned = std::thread::Builder::new()
            .name("gpuwatch-xid".into())
            .spawn(move || serve(nvml, &ask_rx, &answer_tx));
        if let Err(e) = spawned {
            missing.push(format!(
                "XID events unavailable on every GPU: no thread: {e}"
            ));
            return None;
        }
        let mut t = XidThread {
            ask: ask_tx,
            answers,
            outstanding: None,
            last_drain: None,
            said: false,
            call_timeout,
            received: Vec::new(),
        };
        if devices.is_empty() {
            return Some(t);
        }
        t.send(Ask::Register(devices));
        match t.answers.recv_timeout(call_timeout) {
            Ok(Answer::Registered(lines)) => {
                t.outstanding = None;
                missing.extend(lines);
            }
            Ok(Answer::Events(_)) | Err(_) => missing.push(format!(
                "XID event registration did not return within {} ms; XIDs are read once it does",
                call_timeout.as_millis()
            )),
        }
        Some(t)
    }

    fn send(&mut self, ask: Ask) {
        if self.ask.send(ask).is_ok() {
            self.outstanding.get_or_insert_with(Instant::now);
        }
    }

    /// Registers GPUs that answer now but did not when the set was built (logged).
    pub(crate) fn register(&mut self, devices: Vec<(u32, String)>) {
        for (index, _) in &devices {
            tracing::info!("GPU {index} answers now: registering its XID events");
        }
        self.send(Ask::Register(devices));
    }

    /// Asks the thread to drain, unless a drain or registration is still unanswered or the
    /// last drain was asked less than [`DRAIN_EVERY`] ago; its answer is taken by
    /// [`XidThread::take`]. The sampler asks before it reads the devices and takes after,
    /// without waiting but at its first tick: the drain returns in microseconds and its answer
    /// is there by then unless the XID thread was not scheduled yet (busy cores); it is then
    /// taken at the next tick, its events stamped with the time the drain was asked. The
    /// sampling thread is never woken for it.
    pub(crate) fn ask_drain(&mut self, time_ms: i64) {
        // Answers that came after their tick's deadline.
        while let Ok(a) = self.answers.try_recv() {
            self.book(a);
        }
        // a tick a few ms early still drains
        let due = self
            .last_drain
            .is_none_or(|t| t.elapsed() + Duration::from_millis(50) >= DRAIN_EVERY);
        if self.outstanding.is_none() && due {
            self.last_drain = Some(Instant::now());
            self.send(Ask::Drain(time_ms));
        }
    }

    /// The XIDs that came in since the last call; with `wait`, waiting for an unanswered drain
    /// until `deadline` (see [`XidThread::ask_drain`]).
    pub(crate) fn take(&mut self, deadline: Instant, wait: bool) -> Vec<XidEvent> {
        while self.outstanding.is_some() {
            let answer = if wait {
                self.answers
                    .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                    .ok()
            } else {
                self.answers.try_recv().ok()
            };
            match answer {
                Some(a) => self.book(a),
                None => break,
            }
        }
        if let Some(since) = self.outstanding {
            if !self.said && since.elapsed() >= self.call_timeout {
                self.said = true;
                tracing::error!(
                    "nvmlEventSetWait has not returned for {} ms: XID events are not read until \
                     it does (sampling goes on)",
                    since.elapsed().as_millis()
                );
            }
        }
        std::mem::take(&mut self.received)
    }

    /// Books an answer: the drain or registration it answers is no longer outstanding, and its
    /// events wait in [`XidThread::received`].
    fn book(&mut self, answer: Answer) {
        self.outstanding = None;
        if self.said {
            self.said = false;
            tracing::warn!("nvmlEventSetWait returned again: XID events are read again");
        }
        match answer {
            Answer::Events(e) => self.received.extend(e),
            Answer::Registered(lines) => {
                for l in lines {
                    tracing::warn!("{l}: XIDs on it will not be reported");
                }
            }
        }
    }
}

/// The XID thread's loop: one answer per question, until the sampler is dropped.
fn serve(nvml: &'static Nvml, asks: &mpsc::Receiver<Ask>, answers: &mpsc::Sender<Answer>) {
    let mut listener: Option<XidListener> = None;
    while let Ok(ask) = asks.recv() {
        let answer = match ask {
            Ask::Drain(time_ms) => Answer::Events(
                listener
                    .as_mut()
                    .map(|l| l.drain(time_ms))
                    .unwrap_or_default(),
            ),
            Ask::Register(devices) => {
                let mut missing = Vec::new();
                let mut handles: Vec<(Device<'static>, u32, String)> = Vec::new();
                for (i, u) in devices {
                    match nvml.device_by_index(i) {
                        Ok(h) => handles.push((h, i, u)),
                        Err(e) => missing.push(format!("GPU {i}: no handle for XID events: {e}")),
                    }
                }
                let regs: Vec<(&Device<'static>, u32, &str)> = handles
                    .iter()
                    .map(|(h, i, u)| (h, *i, u.as_str()))
                    .collect();
                match &mut listener {
                    Some(l) => l.add(nvml, &regs, &mut missing),
                    None => listener = XidListener::start(nvml, &regs, &mut missing),
                }
                Answer::Registered(missing)
            }
        };
        if answers.send(answer).is_err() {
            return;
        }
    }
}
