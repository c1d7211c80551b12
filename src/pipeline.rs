//! The one pipeline every live command drives: the sampler on its own thread
//! ([`SamplerThread`]) → the engine → kill/exec actions → their audit records as alert events
//! ([`Pipeline`]). `gpuwatch daemon` (the `daemon` module) and `run`/`attach` ([`watch`]) are thin
//! drivers that decide where events go (the notification dispatcher, stderr, a job report);
//! `record` reuses the sampler thread; `replay` and `test` feed the engine in virtual time
//! (`engine::replay`) with no actions at all.
//!
//! The sequence "engine events → actions → audit records → `kill_action` events" exists only
//! in [`Pipeline::act`].

pub mod status;
pub mod watch;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::action::{ActionRunner, AuditRecord};
use crate::engine::Engine;
use crate::model::job::JobSample;
use crate::model::{AlertEvent, DeviceId, ProcSample, Snapshot};
use crate::sampler::{Sampler, SamplerConfig, SamplerError, Ticker};

/// Exit status of a command that needs NVML and found none.
pub const EXIT_NO_NVML: i32 = 2;

/// The sampler on its own thread, sending one snapshot per interval. A slow NVML call delays
/// only this thread: the receiver keeps its own timers.
///
/// One thread does a tick's whole work: it wakes on its timer, reads the GPUs itself
/// ([`Sampler::begin`] with `inline`), assembles the snapshot and delivers it — a tick wakes one
/// thread once, as the bare NVML calls would. Reading on the loop's own thread risks the loop on a
/// call that never returns (a wedged driver), so the loop is a relay: while a read runs, the
/// loop's state is left where a watchdog thread can take it, and a [`Deadman`] timer armed for the
/// sampler's split time (or the tick's deadline, if sooner) wakes the watchdog only when the read
/// has not ended by then. If the read is then inside an NVML call for the split time, or still
/// running at the tick's deadline, the watchdog takes the state and runs the loop from there on:
/// it finishes the tick as when the reads ran on the sampler's threads all along (the pool moves
/// the GPUs after a blocked call to a thread of their own and reports the blocked one stalled
/// once its call times out; a GPU not read by the deadline is a gap), and the GPUs are read on
/// the sampler's threads while the read taken over has not returned. When it returns, its thread
/// finds the loop gone and becomes the watchdog in the other's stead, and reads run inline again
/// — once the pool is as it started: a GPU split off after a blocked call stays on a thread of
/// its own until every thread has answered for a while (`sampler::worker`). A slow moment (a
/// loaded machine, a driver busy for a second) thus costs a tick's hand-off, not every tick's
/// from then on.
///
/// [`Deadman`]: crate::sys::deadman::Deadman
pub struct SamplerThread {
    rx: mpsc::Receiver<Snapshot>,
    stop: StopSignal,
    relay: Option<Arc<Relay>>,
    devices: Vec<DeviceId>,
    stats: Arc<std::sync::Mutex<TickStats>>,
}

/// The sampling loop's state, owned by the thread that runs the loop (see [`SamplerThread`]).
struct LoopState {
    sampler: Sampler,
    ticker: Ticker,
    until: Option<Instant>,
    keep_times: bool,
    deliver: Box<dyn FnMut(Snapshot) -> bool + Send>,
    /// The tick whose read is running (its stamp and start), while the state waits in the relay.
    open: Option<(i64, Instant)>,
}

/// Where the loop's state waits while a read runs inline, and how the loop's end is told.
struct Relay {
    slot: std::sync::Mutex<RelaySlot>,
    stop: StopSignal,
    stats: Arc<std::sync::Mutex<TickStats>>,
    deadman: Option<crate::sys::deadman::Deadman>,
    /// Whether a watchdog thread waits on the deadman (without one, reads are never inline).
    watched: AtomicBool,
    /// Set when the loop has ended: true when it ended by a panic.
    ended: std::sync::Mutex<Option<bool>>,
    ended_cv: std::sync::Condvar,
}

#[derive(Default)]
struct RelaySlot {
    /// Which loop thread owns the loop; a thread that finds a newer number after its read
    /// was taken over.
    epoch: u64,
    state: Option<LoopState>,
    /// The read running inline.
    reading: Option<Reading>,
}

/// A read running inline, as the watchdog sees it.
#[derive(Clone)]
struct Reading {
    /// The loop thread that runs it.
    epoch: u64,
    /// Which call it is in, and since when.
    busy: Arc<crate::sampler::Busy>,
    /// A call blocked this long is taken over.
    split: Duration,
    /// The tick's deadline: a read still running then is taken over (its late GPUs are gaps).
    deadline: Instant,
}

impl Relay {
    fn slot(&self) -> std::sync::MutexGuard<'_, RelaySlot> {
        self.slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn end(&self, panicked: bool) {
        let mut e = self
            .ended
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if e.is_none() {
            *e = Some(panicked);
        }
        self.ended_cv.notify_all();
        drop(e);
        // the watchdog sees the end and returns
        if let Some(d) = &self.deadman {
            d.arm(Duration::ZERO);
        }
    }

    fn has_ended(&self) -> Option<bool> {
        *self
            .ended
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits up to `grace` (for ever: `None`) for the loop to end; what [`Relay::end`] was told.
    fn wait_end(&self, grace: Option<Duration>) -> Option<bool> {
        let deadline = grace.map(|g| Instant::now() + g);
        let mut e = self
            .ended
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        loop {
            if let Some(p) = *e {
                return Some(p);
            }
            e = match deadline {
                None => self
                    .ended_cv
                    .wait(e)
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    self.ended_cv
                        .wait_timeout(e, left)
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0
                }
            };
        }
    }
}

/// One thread of the relay, for its whole life: it runs the loop from `start` (the sampler
/// thread; the watchdog starts without), watches while another thread runs it, and trades the
/// two jobs as reads are taken over — in a loop, not by calls nested in each other, so that any
/// number of takeovers leaves the stack as it was.
fn relay_thread(relay: &Arc<Relay>, mut start: Option<(LoopState, u64)>) {
    loop {
        if let Some((st, epoch)) = start.take() {
            if !run_loop(relay, st, epoch) || relay.has_ended().is_some() {
                return;
            }
            // Taken over, and the read is back: the loop goes on on the other thread, and this
            // one watches it; reads run inline again.
            crate::sys::name_thread("gpuwatch-watchdog");
            relay.watched.store(true, Ordering::Release);
            tracing::debug!("the GPU read that was taken over returned; reads run inline again");
        }
        match watchdog(relay) {
            Some(taken) => {
                crate::sys::name_thread("gpuwatch-sampler");
                start = Some(taken);
            }
            None => return,
        }
    }
}

/// Runs the sampling loop on this thread as loop number `epoch`, from `st` (finishing its open
/// tick first); ends the relay when the loop ends. True when the loop was taken over (it goes on
/// on another thread, and this one may watch it: [`relay_thread`]).
fn run_loop(relay: &Arc<Relay>, st: LoopState, epoch: u64) -> bool {
    relay.stop.attach(std::thread::current());
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        loop_ticks(relay, st, epoch)
    }));
    match run {
        Ok(false) => true,
        Ok(true) => {
            relay.end(false);
            false
        }
        Err(_) => {
            // A panic in a read that was taken over ends nothing: the loop goes on elsewhere
            // (and this thread stops). Else the loop ends here, its state dropped (a panic
            // during a read left it in the slot) before the end is told.
            let left = {
                let mut slot = relay.slot();
                if slot.epoch != epoch {
                    return false;
                }
                slot.reading = None;
                slot.state.take()
            };
            drop(left);
            relay.end(true);
            false
        }
    }
}

/// The ticks of [`run_loop`]: true when the loop ended, false when it was taken over.
fn loop_ticks(relay: &Arc<Relay>, mut st: LoopState, epoch: u64) -> bool {
    if let Some((time_ms, t0)) = st.open.take() {
        if !finish_tick(relay, &mut st, time_ms, t0) {
            return true;
        }
    }
    loop {
        let due = st.ticker.next(Instant::now());
        if st.until.is_some_and(|u| due >= u) {
            break;
        }
        // One sleep per tick; a stop wakes it at once.
        if !relay.stop.sleep_until(due) {
            break;
        }
        let t0 = Instant::now();
        let time_ms = crate::sampler::now_ms();
        let inline = st
            .sampler
            .begin(time_ms, relay.watched.load(Ordering::Acquire));
        if let Some(read) = inline {
            st.open = Some((time_ms, t0));
            match read_relayed(relay, st, read, epoch) {
                Some(back) => st = back,
                None => return false,
            }
            st.open = None;
        }
        if !finish_tick(relay, &mut st, time_ms, t0) {
            return true;
        }
    }
    if st.ticker.missed() > 0 {
        tracing::warn!(
            missed = st.ticker.missed(),
            "late sampling ticks were skipped"
        );
    }
    true
}

/// Runs `read` on this thread while `st` waits in the relay for the watchdog (see
/// [`SamplerThread`]); the state back, or `None` when the watchdog took the loop over while the
/// read was blocked or late (this thread then watches in the watchdog's stead:
/// [`relay_thread`]).
fn read_relayed(
    relay: &Relay,
    st: LoopState,
    read: crate::sampler::TickRead,
    epoch: u64,
) -> Option<LoopState> {
    let split = st.sampler.split_after();
    let deadline = st
        .sampler
        .deadline()
        .unwrap_or_else(|| Instant::now() + split);
    let Some(deadman) = &relay.deadman else {
        // not reached: reads are inline only while watched, and watched only with a timer
        read.run();
        return Some(st);
    };
    {
        let mut slot = relay.slot();
        slot.reading = Some(Reading {
            epoch,
            busy: read.busy(),
            split,
            deadline,
        });
        slot.state = Some(st);
    }
    deadman.arm(split.min(deadline.saturating_duration_since(Instant::now())));
    read.run();
    let mut slot = relay.slot();
    if slot.epoch != epoch {
        return None;
    }
    deadman.disarm();
    slot.reading = None;
    slot.state.take()
}

/// Finishes the tick stamped `time_ms` begun at `t0`, books its time and delivers the snapshot;
/// false when the receiver is gone.
fn finish_tick(relay: &Relay, st: &mut LoopState, time_ms: i64, t0: Instant) -> bool {
    let snap = st.sampler.finish(time_ms);
    let took = t0.elapsed();
    if let Ok(mut s) = relay.stats.lock() {
        s.taken += 1;
        s.missed = st.ticker.missed();
        let micros = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
        s.last_micros = Some(micros);
        if st.keep_times && s.micros.len() < 1_000_000 {
            s.micros.push(micros);
        }
    }
    (st.deliver)(snap)
}

/// Starts the watchdog thread of `relay` (without one, reads never run inline).
fn start_watchdog(relay: &Arc<Relay>) {
    let r = relay.clone();
    // The default stack: after a takeover this thread runs the loop.
    let started = std::thread::Builder::new()
        .name("gpuwatch-watchdog".into())
        .spawn(move || relay_thread(&r, None));
    match started {
        Ok(_) => relay.watched.store(true, Ordering::Release),
        Err(e) => {
            relay.watched.store(false, Ordering::Release);
            tracing::warn!(
                "cannot start the sampling watchdog ({e}): the GPUs are read on the sampler's \
                 threads"
            );
        }
    }
}

/// The watchdog: wakes when a read outlives its split time or its tick's deadline; takes the
/// loop over when the read is then blocked in a call, or past the deadline (see
/// [`SamplerThread`]): the loop's state and its new number, for this thread to run it. `None`
/// when the loop ended or the timer failed.
fn watchdog(relay: &Arc<Relay>) -> Option<(LoopState, u64)> {
    let deadman = relay.deadman.as_ref()?;
    while deadman.wait() {
        if relay.has_ended().is_some() {
            return None;
        }
        let mut slot = relay.slot();
        let Some(reading) = slot.reading.clone() else {
            continue; // the read ended as the timer expired
        };
        if reading.epoch != slot.epoch {
            continue;
        }
        let now = Instant::now();
        let blocked = reading.busy.blocked(now).map(|(_, d)| d);
        let over = now >= reading.deadline;
        match blocked {
            Some(d) if d >= reading.split => {}
            _ if over => {}
            // Between calls, or in one not yet that long (a preempted read): looked at again
            // when the call in progress would reach the split time, or at the tick's deadline.
            d => {
                let call_left = reading.split.saturating_sub(d.unwrap_or_default());
                deadman.arm(call_left.min(reading.deadline.saturating_duration_since(now)));
                continue;
            }
        }
        let Some(st) = slot.state.take() else {
            continue;
        };
        slot.epoch += 1;
        slot.reading = None;
        let next = slot.epoch;
        // Until the read taken over returns (its thread then watches: `relay_thread`), the
        // GPUs are read on the sampler's threads, as before a loop read inline.
        relay.watched.store(false, Ordering::Release);
        drop(slot);
        let why = if over {
            "overran its tick"
        } else {
            "blocks in NVML"
        };
        tracing::debug!(
            "a GPU read {why}; the sampling loop moves to the watchdog's thread and the GPUs are \
             read on the sampler's threads until the read returns"
        );
        return Some((st, next));
    }
    // The timer failed: no more inline reads without a watchdog.
    relay.watched.store(false, Ordering::Release);
    tracing::warn!(
        "the sampling watchdog's timer failed: the GPUs are read on the sampler's threads"
    );
    None
}

/// Stops a sampling thread from any thread: sets the flag and wakes the thread from its wait
/// for the next tick (it sleeps once per tick, not in polling steps).
#[derive(Debug, Clone, Default)]
pub struct StopSignal {
    flag: Arc<AtomicBool>,
    /// The sampling thread, once started (a mutex, so a stop and the start cannot miss each
    /// other: whichever locks second sees the other's doing).
    thread: Arc<std::sync::Mutex<Option<std::thread::Thread>>>,
}

impl StopSignal {
    /// Asks the thread to stop after the tick in progress.
    pub fn stop(&self) {
        self.flag.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.lock().ok().and_then(|t| t.clone()) {
            t.unpark();
        }
    }

    /// Names the thread a stop wakes; wakes it at once if a stop came before.
    fn attach(&self, thread: std::thread::Thread) {
        if let Ok(mut t) = self.thread.lock() {
            *t = Some(thread.clone());
        }
        if self.is_set() {
            thread.unpark();
        }
    }

    /// Whether a stop was asked.
    pub fn is_set(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Sleeps the calling (sampling) thread until `due` or a stop, whichever comes first;
    /// returns false on a stop.
    fn sleep_until(&self, due: Instant) -> bool {
        loop {
            if self.is_set() {
                return false;
            }
            let left = due.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return true;
            }
            // An unpark (or a spurious wake) ends the park early: the loop looks again.
            std::thread::park_timeout(left);
        }
    }
}

/// How the sampling thread kept its schedule: ticks taken and skipped, and the wall time each
/// tick's sample took.
#[derive(Debug, Clone, Default)]
pub struct TickStats {
    /// Ticks sampled.
    pub taken: u64,
    /// Ticks skipped because the previous one ran late (see [`Ticker`]).
    pub missed: u64,
    /// Wall time of each sample, µs (the first 1,000,000 ticks), kept only when asked for
    /// (`record --stats`): a daemon would hold 4 MB of them after 12 days, for nothing.
    pub micros: Vec<u32>,
    /// The newest sample's wall time, µs.
    pub last_micros: Option<u32>,
}

impl TickStats {
    /// The `q`-quantile (0–1) of the sample wall times, ms.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        let mut v = self.micros.clone();
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss,
            reason = "an index within the vector"
        )]
        let i = ((v.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
        Some(f64::from(v[i]) / 1000.0)
    }
}

impl std::fmt::Debug for SamplerThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SamplerThread")
            .field("devices", &self.devices.len())
            .finish_non_exhaustive()
    }
}

impl SamplerThread {
    /// Opens NVML with `cfg` and starts sampling every `interval`, the first sample at once.
    /// With `until`, the thread ends (closing the channel) at the first tick due at or after it.
    pub fn open(
        cfg: &SamplerConfig,
        interval: Duration,
        until: Option<Instant>,
    ) -> Result<SamplerThread, SamplerError> {
        let sampler = Sampler::open(cfg)?;
        Ok(SamplerThread::start(sampler, interval, until))
    }

    /// Starts sampling with an open sampler; snapshots go to [`SamplerThread::receiver`].
    pub fn start(sampler: Sampler, interval: Duration, until: Option<Instant>) -> SamplerThread {
        let (tx, rx) = mpsc::channel();
        let mut thread =
            SamplerThread::start_with(sampler, interval, until, false, move |s| tx.send(s).is_ok());
        thread.rx = rx;
        thread
    }

    /// Starts sampling with an open sampler; each snapshot goes to `deliver`, which returns
    /// false to stop (its receiver is gone). [`SamplerThread::receiver`] then receives nothing.
    /// With `keep_times`, [`SamplerThread::stats`] keeps every tick's sample wall time (the
    /// first million), else only the newest.
    pub fn start_with(
        mut sampler: Sampler,
        interval: Duration,
        until: Option<Instant>,
        keep_times: bool,
        deliver: impl FnMut(Snapshot) -> bool + Send + 'static,
    ) -> SamplerThread {
        let devices = sampler.devices();
        // Ticks wait at most half an interval for slow devices (a late one is a gap).
        sampler.set_tick_budget(interval / 2);
        let (_, rx) = mpsc::channel();
        let stop = StopSignal::default();
        let stats = Arc::new(std::sync::Mutex::new(TickStats::default()));
        let deadman = match crate::sys::deadman::Deadman::new() {
            Ok(d) => Some(d),
            Err(e) => {
                tracing::warn!(
                    "no timer for the sampling watchdog ({e}): the GPUs are read on the \
                     sampler's threads"
                );
                None
            }
        };
        let relay = Arc::new(Relay {
            slot: std::sync::Mutex::new(RelaySlot::default()),
            stop: stop.clone(),
            stats: stats.clone(),
            deadman,
            watched: AtomicBool::new(false),
            ended: std::sync::Mutex::new(None),
            ended_cv: std::sync::Condvar::new(),
        });
        if relay.deadman.is_some() {
            start_watchdog(&relay);
        }
        let st = LoopState {
            sampler,
            ticker: Ticker::new(Instant::now(), interval),
            until,
            keep_times,
            deliver: Box::new(deliver),
            open: None,
        };
        let r = relay.clone();
        let spawned = std::thread::Builder::new()
            .name("gpuwatch-sampler".into())
            .spawn(move || relay_thread(&r, Some((st, 0))));
        let relay = match spawned {
            Ok(_) => Some(relay),
            Err(e) => {
                tracing::error!("cannot start the sampler thread: {e}");
                relay.end(false);
                None
            }
        };
        SamplerThread {
            rx,
            stop,
            relay,
            devices,
            stats,
        }
    }

    /// How the thread kept its schedule so far.
    pub fn stats(&self) -> TickStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Ticks taken and skipped so far, and the newest sample's wall time (µs): cheap enough
    /// for every tick (no copy of the history).
    pub fn last_tick(&self) -> (u64, u64, Option<u32>) {
        self.stats
            .lock()
            .map(|s| (s.taken, s.missed, s.last_micros))
            .unwrap_or_default()
    }

    /// Whether the sampling thread has ended (a daemon's never ends by itself).
    pub fn has_ended(&self) -> bool {
        self.relay.as_ref().is_none_or(|r| r.has_ended().is_some())
    }

    /// The GPUs found at start.
    pub fn devices(&self) -> &[DeviceId] {
        &self.devices
    }

    /// The snapshots, in order.
    pub fn receiver(&self) -> &mpsc::Receiver<Snapshot> {
        &self.rx
    }

    /// What stops the thread from elsewhere (e.g. a signal handler thread).
    pub fn stop_signal(&self) -> StopSignal {
        self.stop.clone()
    }

    /// Waits for the thread to end by itself (at `until`, on a stop, or when `deliver` says so).
    /// Fails when the thread panicked.
    pub fn join(&mut self) -> anyhow::Result<()> {
        match self.relay.take().and_then(|r| r.wait_end(None)) {
            Some(true) => Err(anyhow::anyhow!("the sampling thread failed (see the log)")),
            _ => Ok(()),
        }
    }

    /// Stops the thread, waiting at most `grace` for it: a sampler stuck in an NVML call that
    /// never returns must not hold up the caller, so it is then left behind.
    pub fn stop(mut self, grace: Duration) {
        self.stop.stop();
        let Some(relay) = self.relay.take() else {
            return;
        };
        if relay.wait_end(Some(grace)).is_none() {
            tracing::warn!("the sampler thread is busy in an NVML call; going on without it");
        }
    }
}

impl Drop for SamplerThread {
    fn drop(&mut self) {
        self.stop.stop();
    }
}

/// What in `snap` forbids resuming a drained node: a GPU lost, missing, waiting for NVIDIA's
/// recovery action (a reset or a reboot) or with a row remap pending.
fn resume_blocker(snap: &Snapshot) -> Option<String> {
    use crate::model::{DeviceState, Metric};
    if let Some(m) = snap.missing.first() {
        return Some(format!("a GPU is missing ({})", m.pci_bus_id));
    }
    snap.gpus.iter().find_map(|g| {
        let i = g.id.index;
        if g.state == DeviceState::Lost {
            Some(format!("GPU {i} is lost"))
        } else if g.get(Metric::RecoveryAction).is_some_and(|v| v > 0.0) {
            Some(format!("GPU {i} waits for NVIDIA's recovery action"))
        } else if g.get(Metric::RemapPending).is_some_and(|v| v > 0.0) {
            Some(format!(
                "GPU {i} has a row remap pending (a reset applies it)"
            ))
        } else {
            None
        }
    })
}

/// The engine and the actions it drives: snapshots (or the clock) in, alert events out —
/// the engine's own, a `kill_action` event for every audited kill decision and a `node_drain`
/// event for every drain decision.
pub struct Pipeline {
    engine: Engine,
    actions: ActionRunner,
    /// Says which events' actions are held (silenced alerts).
    hold: Option<Hold>,
}

/// Says whether an event's actions are held (its alert is silenced).
pub type Hold = Box<dyn Fn(&AlertEvent) -> bool + Send>;

/// Whether `e` is a firing event with actions that `hold` holds.
fn held(hold: &Hold, e: &AlertEvent) -> bool {
    e.status == crate::model::AlertStatus::Firing && !e.actions.is_empty() && hold(e)
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("rules", &self.engine.rule_count())
            .finish_non_exhaustive()
    }
}

impl Pipeline {
    /// A pipeline over `engine` and `actions`.
    pub fn new(engine: Engine, actions: ActionRunner) -> Pipeline {
        Pipeline {
            engine,
            actions,
            hold: None,
        }
    }

    /// Holds the actions of the events `hold` says (silenced alerts): they are not acted on.
    pub fn set_hold(&mut self, hold: Hold) {
        self.hold = Some(hold);
    }

    /// Ingests a snapshot: the engine's events at its time, then the actions they ask for.
    pub fn observe(&mut self, snap: &Snapshot) -> Vec<AlertEvent> {
        let events = self.engine.observe(snap);
        if self.actions.drain_mut().enabled() || self.actions.taint_mut().enabled() {
            let blocker = resume_blocker(snap);
            self.actions.drain_mut().note_gpus(blocker.clone());
            self.actions.taint_mut().note_gpus(blocker);
        }
        self.act(events, snap.time_ms, snap.processes.as_deref())
    }

    /// Advances the clock with no new sample (host rules such as `collector_stale`).
    pub fn advance(&mut self, now_ms: i64) -> Vec<AlertEvent> {
        let events = self.engine.advance(now_ms);
        self.act(events, now_ms, None)
    }

    /// Evaluates the job rules for one job sample.
    pub fn evaluate_job(&mut self, sample: &JobSample) -> Vec<AlertEvent> {
        let events = self.engine.evaluate_job(sample, sample.time_ms);
        self.act(events, sample.time_ms, None)
    }

    /// The one "events → actions → audit → events" sequence: routes `events` to kill/exec
    /// actions, advances the kill ladders (with the latest process list when one came), and
    /// appends every audit record as a `kill_action` event.
    pub fn act(
        &mut self,
        mut events: Vec<AlertEvent>,
        now_ms: i64,
        processes: Option<&[ProcSample]>,
    ) -> Vec<AlertEvent> {
        if self.actions.drain_mut().enabled() {
            let firing = self.node_conditions(now_ms, &crate::model::Action::Drain);
            self.actions.drain_mut().sync(firing, now_ms);
        }
        if self.actions.taint_mut().enabled() {
            let firing = self.node_conditions(now_ms, &crate::model::Action::Taint);
            self.actions.taint_mut().sync(firing, now_ms);
        }
        // A silence holds what a firing alert asks for; a resolution always reaches the runner
        // (it only stops things).
        let mut audits = match &self.hold {
            Some(hold) if events.iter().any(|e| held(hold, e)) => {
                let acting: Vec<AlertEvent> = events
                    .iter()
                    .filter(|e| {
                        let on_hold = held(hold, e);
                        if on_hold {
                            tracing::warn!(alert = %e.name, gpu = %e.gpu.map_or_else(String::new, |g| g.to_string()), "action held: the alert is silenced");
                        }
                        !on_hold
                    })
                    .cloned()
                    .collect();
                self.actions.handle(&acting, now_ms)
            }
            _ => self.actions.handle(&events, now_ms),
        };
        // A silence added while a kill ladder runs stops it before its next step.
        if let Some(hold) = &self.hold {
            audits.extend(
                self.actions
                    .cancel_where(|e| hold(e), now_ms, "the alert is silenced"),
            );
        }
        // The ladders' records say when each step is taken (now, not the time of the sample that
        // led here: a late sample would make a grace look cut short); their schedule runs on the
        // monotonic clock, read at the same moment.
        audits.extend(self.actions.tick(crate::sys::now_ms(), processes));
        events.extend(audits.iter().map(AuditRecord::to_alert_event));
        events.extend(
            self.actions
                .drain_records()
                .iter()
                .filter(|r| r.notify)
                .map(crate::action::drain::DrainRecord::to_alert_event),
        );
        events
    }

    /// The conditions for `[actions.drain]` (`action` drain) or `[actions.taint]` (taint) as
    /// they stand: the engine's firing critical alerts whose rule (as loaded now) declares
    /// `action` and that no silence holds.
    fn node_conditions(
        &self,
        now_ms: i64,
        action: &crate::model::Action,
    ) -> std::collections::BTreeMap<String, crate::action::drain::Condition> {
        let rules = self.engine.rules().rules();
        self.engine
            .alerts()
            .filter(|i| {
                i.phase == crate::alert::Phase::Firing
                    && i.severity == crate::model::Severity::Critical
                    && i.actions.contains(action)
            })
            .filter_map(|i| {
                let name = i.labels.get("alertname").unwrap_or(&i.key);
                let declared = rules
                    .iter()
                    .any(|r| r.spec.name == *name && r.spec.actions.contains(action));
                let held = self
                    .hold
                    .as_ref()
                    .is_some_and(|hold| hold(&i.as_event(now_ms)));
                (declared && !held).then(|| {
                    let summary = i.annotations.get("summary").map_or("", String::as_str);
                    (
                        i.fingerprint.clone(),
                        crate::action::drain::Condition::new(name, i.gpu, summary),
                    )
                })
            })
            .collect()
    }

    /// Simulated GPUs: the drain is a dry run (see [`crate::action::drain::simulated_dry_run`]).
    pub fn set_simulated(&mut self, sim: bool) {
        let dry = crate::action::drain::simulated_dry_run(sim);
        self.actions.drain_mut().set_simulated(dry);
        self.actions.taint_mut().set_simulated(dry);
    }

    /// Stops the kill ladders whose rule no longer declares `action: kill` (after a rules
    /// reload); their audit records as `kill_action` events.
    pub fn cancel_undeclared_kills(&mut self, now_ms: i64) -> Vec<AlertEvent> {
        let rules = self.engine.rules().rules();
        let declared = |ev: &AlertEvent| {
            rules.iter().any(|r| {
                r.spec.name == ev.name && r.spec.actions.contains(&crate::model::Action::Kill)
            })
        };
        self.actions
            .cancel_where(
                |ev| !declared(ev),
                now_ms,
                "its rule no longer declares action: kill",
            )
            .iter()
            .map(AuditRecord::to_alert_event)
            .collect()
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The engine, to reload rules.
    pub fn engine_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }

    /// The action runner.
    pub fn actions(&self) -> &ActionRunner {
        &self.actions
    }

    /// Applies a reloaded `[actions]` (see [`ActionRunner::reload`]); the new policy version.
    pub fn reload_actions(&mut self, actions: &crate::action::ActionsSection) -> u64 {
        self.actions.reload(actions)
    }

    /// Waits for running exec actions (each bounded by its own timeout).
    pub fn finish(&mut self) {
        self.actions.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Action, AlertStatus, Severity};

    fn kill_event(pid: u32) -> AlertEvent {
        let mut e = AlertEvent::notice(
            "fp".into(),
            "gpu_memory_quota",
            Severity::Warning,
            AlertStatus::Firing,
            std::collections::BTreeMap::new(),
            std::collections::BTreeMap::new(),
            0,
        );
        e.gpu = Some(0);
        e.actions = vec![Action::Kill];
        e.target_pid = Some(pid);
        e
    }

    /// A pipeline whose kill policy lets anyone's process be killed after `grace_ms`, with a
    /// hold that says "silenced" while its flag is set, and a `sleep` process on GPU 0 to be the
    /// target (kill it at the end).
    struct Held {
        _dir: tempfile::TempDir,
        p: Pipeline,
        silenced: std::sync::Arc<std::sync::atomic::AtomicBool>,
        child: std::process::Child,
        procs: [ProcSample; 1],
    }

    fn held(grace_ms: i64, silenced: bool) -> Held {
        let dir = tempfile::tempdir().unwrap();
        let mut actions = crate::action::ActionsSection::default();
        actions.kill.grace = crate::values::DurationSetting::from_ms(grace_ms);
        actions.kill.allow_users = vec!["*".into()];
        actions.kill.allow_root = true;
        actions.kill.min_uid = 0;
        let rules =
            crate::rules::RuleSet::load(&[], &crate::rules::RulesConfig::default()).unwrap();
        let engine = Engine::new(rules, crate::engine::EngineOptions::default());
        let mut p = Pipeline::new(engine, ActionRunner::new(&actions, dir.path(), "h"));
        let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(silenced));
        let hold = flag.clone();
        p.set_hold(Box::new(move |_| {
            hold.load(std::sync::atomic::Ordering::SeqCst)
        }));
        let child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let procs = [ProcSample::compute(child.id(), 0, "GPU-0", Some(1 << 30))];
        Held {
            _dir: dir,
            p,
            silenced: flag,
            child,
            procs,
        }
    }

    /// A silenced alert's kill is held; the same alert unsilenced starts the ladder.
    #[test]
    fn held_events_start_no_kill() {
        let Held {
            _dir,
            mut p,
            silenced,
            mut child,
            procs,
        } = held(0, true);
        let pid = child.id();
        let audits =
            |events: &[AlertEvent]| events.iter().filter(|e| e.name == "kill_action").count();
        p.act(vec![kill_event(pid)], 0, None);
        let out = p.act(Vec::new(), 1, Some(&procs));
        assert_eq!(audits(&out), 0, "held: {out:?}");
        silenced.store(false, std::sync::atomic::Ordering::SeqCst);
        p.act(vec![kill_event(pid)], 2, None);
        let out = p.act(Vec::new(), 3, Some(&procs));
        assert_eq!(audits(&out), 1, "not held: {out:?}");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// A silence added while a kill ladder runs stops it (audited), and a resolution reaches
    /// the runner even while its alert is silenced.
    #[test]
    fn a_silence_stops_a_running_kill() {
        let Held {
            _dir,
            mut p,
            silenced,
            mut child,
            procs,
        } = held(60_000, false);
        let pid = child.id();
        let decisions = |events: &[AlertEvent]| -> Vec<String> {
            events
                .iter()
                .filter(|e| e.name == "kill_action")
                .filter_map(|e| e.labels.get("decision").cloned())
                .collect()
        };
        let out = p.act(vec![kill_event(pid)], 0, Some(&procs));
        assert_eq!(decisions(&out), ["would_warn"], "{out:?}");
        assert_eq!(p.actions().active_kills(), 1);
        silenced.store(true, std::sync::atomic::Ordering::SeqCst);
        let out = p.act(Vec::new(), 2, Some(&procs));
        assert_eq!(decisions(&out), ["cancelled"], "{out:?}");
        assert_eq!(p.actions().active_kills(), 0);
        // A new ladder, then its alert resolves while silenced: the resolution cancels it.
        silenced.store(false, std::sync::atomic::Ordering::SeqCst);
        p.act(vec![kill_event(pid)], 3, Some(&procs));
        assert_eq!(p.actions().active_kills(), 1);
        silenced.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut resolved = kill_event(pid);
        resolved.status = AlertStatus::Resolved;
        resolved.actions.clear();
        let out = p.act(vec![resolved], 5, Some(&procs));
        assert_eq!(p.actions().active_kills(), 0, "{out:?}");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// A kill about a process on a MIG device names the device in its `kill_action` event.
    #[test]
    fn a_kill_names_the_mig_device() {
        let Held {
            _dir,
            mut p,
            silenced: _,
            mut child,
            procs,
        } = held(60_000, false);
        let pid = child.id();
        let mig = crate::model::MigSample {
            gpu_uuid: "GPU-0".into(),
            uuid: "MIG-x".into(),
            mem_used_bytes: Some(1 << 30),
            mem_total_bytes: Some(9728 << 20),
            pids: vec![pid],
            ..crate::model::MigSample::one_g(0, 3)
        };
        let gpu = crate::model::GpuSample {
            time_ms: 0,
            id: crate::model::DeviceId {
                index: 0,
                uuid: "GPU-0".into(),
                ..Default::default()
            },
            state: crate::model::DeviceState::Ok,
            values: Default::default(),
        };
        p.observe(&Snapshot {
            time_ms: 0,
            gpus: vec![gpu],
            processes: Some(procs.to_vec()),
            mig: vec![mig],
            ..Snapshot::default()
        });
        // A process alert names the MIG device its process runs on (label `mig`, set by the
        // engine: engine::mig_tests); the kill's audit record and notice carry it.
        let mut ev = kill_event(pid);
        ev.labels.insert("mig".into(), "MIG 1g.10gb 0/10/0".into());
        let out = p.act(vec![ev], 1, Some(&procs));
        let kill = out.iter().find(|e| e.name == "kill_action").unwrap();
        assert_eq!(kill.labels["mig"], "MIG 1g.10gb 0/10/0", "{kill:?}");
        let audit =
            std::fs::read_to_string(_dir.path().join("kill-audit.jsonl")).unwrap_or_default();
        assert!(audit.contains("\"mig\":\"MIG 1g.10gb 0/10/0\""), "{audit}");
        assert!(
            kill.annotations["summary"].ends_with("on MIG 1g.10gb 0/10/0"),
            "{kill:?}"
        );
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
