//! The dispatcher: a worker thread running a tokio current-thread runtime, fed by a channel, so a
//! slow SMTP server or webhook never stalls sampling. It feeds engine events to the
//! [`Grouper`], writes every resulting [`Notification`] to the [`Outbox`] before sending,
//! sends (one message in flight per channel, keeping order), retries with exponential backoff,
//! raises `notifier_failing` through the other channels when a channel keeps failing (and
//! resolves it when the channel recovers), pings the dead-man heartbeat URL while the daemon
//! reports healthy ticks, and persists the grouper state to `state_dir/notify-state.json`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::{debug, error, info, warn};

use super::grouping::{Grouper, GrouperState};
use super::outbox::{write_atomic, Outbox, OutboxEntry};
use super::settings::{ChannelSpec, NotifySettings};
use super::transport::{SendError, Transport};
use super::{now_ms, Notification, Reason};
use crate::model::{AlertEvent, AlertStatus, DeviceId, ProcSample, Severity};

/// Name of the grouper state file in the state directory.
pub const STATE_FILE: &str = "notify-state.json";

/// How often the outbox is looked at for messages another process put there, ms.
const ADOPT_EVERY_MS: i64 = 10_000;

/// What the daemon tells the dispatcher.
#[derive(Debug)]
pub enum Input {
    /// Alert transitions from the engine.
    Events(Vec<AlertEvent>),
    /// Wakes the worker after ticks came while it may have thought the sampling loop dead (see
    /// [`Dispatcher::healthy`]: the ticks themselves are booked without a message).
    Healthy,
    /// Where the daemon's silences are read (once, at the start; see [`Grouper::set_silences`]).
    Silences(crate::silence::Feed),
    /// New settings (SIGHUP reload).
    Reload(Box<NotifySettings>),
    /// Finish in-flight sends (up to the grace period), save state, exit.
    Stop,
    /// Send every waiting group now and exit once everything is delivered or at the deadline
    /// (UTC ms); what is still undelivered stays in the outbox.
    Drain(i64),
    /// Everything sent before it has been ingested and the grouper state saved to disk: the
    /// dispatcher's persisted mark becomes this number (see [`Dispatcher::mark`]).
    Mark(u64),
}

/// Sleeps for `d` on `alarm` (woken once, at the time; see `sys::deadman`), or on tokio's
/// timer where no timerfd could be made.
async fn sleep_on(
    alarm: Option<&tokio::io::unix::AsyncFd<crate::sys::deadman::Deadman>>,
    d: Duration,
) {
    let Some(alarm) = alarm else {
        return tokio::time::sleep(d).await;
    };
    if d.is_zero() {
        return;
    }
    alarm.get_ref().arm(d);
    loop {
        match alarm.readable().await {
            Ok(mut ready) => {
                // (a one-shot timer read once is not readable again until armed again)
                let fired = ready.get_inner().expired();
                ready.clear_ready();
                if fired {
                    return;
                }
            }
            Err(_) => return tokio::time::sleep(d).await,
        }
    }
}

/// Handle to the dispatcher thread.
pub struct Dispatcher {
    tx: mpsc::UnboundedSender<Input>,
    thread: Option<std::thread::JoinHandle<()>>,
    delivery: Arc<std::sync::Mutex<Delivery>>,
    /// The last mark handed out, and the last one the worker reached (see [`Dispatcher::mark`]).
    marks: (std::sync::atomic::AtomicU64, Arc<Persisted>),
    /// The sampling loop's completed ticks (the dead-man heartbeat), shared with the worker.
    beats: Arc<Beats>,
    /// Whether a heartbeat is configured (the settings the worker was last given): without
    /// one, ticks never wake the worker.
    heartbeat: std::sync::atomic::AtomicBool,
    /// The devices and processes messages name, read by the worker's grouper when it makes
    /// messages ([`Dispatcher::set_context`]).
    context: super::grouping::SharedContext,
}

/// When the sampling loop last completed a tick and the spacing of its last two, shared by the
/// daemon's loop and the worker without a message per tick: at 1 s ticks a message each woke the
/// worker's thread every second for nothing. A message ([`Input::Healthy`]) wakes the worker at
/// most every [`Beats::WAKE_EVERY_MS`], so a loop that comes back after a stall is seen (and the
/// heartbeat pinged again) within that time — only where a heartbeat is configured, since
/// nothing else needs it.
#[derive(Debug)]
struct Beats {
    /// UTC ms of the last completed tick; `i64::MIN`: none yet.
    last: std::sync::atomic::AtomicI64,
    /// Time between the last two, ms.
    gap: std::sync::atomic::AtomicI64,
    /// When a tick last sent a wake-up; `i64::MIN`: never.
    woken: std::sync::atomic::AtomicI64,
}

impl Default for Beats {
    fn default() -> Beats {
        Beats {
            last: std::sync::atomic::AtomicI64::new(i64::MIN),
            gap: std::sync::atomic::AtomicI64::new(0),
            woken: std::sync::atomic::AtomicI64::new(i64::MIN),
        }
    }
}

impl Beats {
    /// How often completed ticks wake the worker at most, ms (well inside the shortest
    /// heartbeat window, 30 s).
    const WAKE_EVERY_MS: i64 = 10_000;

    /// Books a tick completed at `t`; whether the worker should be woken.
    fn beat(&self, t: i64) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let prev = self.last.swap(t, Relaxed);
        if prev != i64::MIN {
            self.gap.store((t - prev).max(0), Relaxed);
        }
        let woken = self.woken.load(Relaxed);
        let wake = woken == i64::MIN || t < woken || t - woken >= Self::WAKE_EVERY_MS;
        if wake {
            self.woken.store(t, Relaxed);
        }
        wake
    }

    /// The last tick's time (if any) and the spacing of the last two, ms.
    fn read(&self) -> (Option<i64>, i64) {
        use std::sync::atomic::Ordering::Relaxed;
        let last = self.last.load(Relaxed);
        ((last != i64::MIN).then_some(last), self.gap.load(Relaxed))
    }
}

/// The highest [`Input::Mark`] the worker has reached, and a way to wait for it.
#[derive(Debug, Default)]
struct Persisted {
    mark: std::sync::Mutex<u64>,
    reached: std::sync::Condvar,
}

/// How delivery goes, for `/metrics`: messages waiting in the outbox, and per channel the sends
/// that succeeded and failed since the start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delivery {
    pub queued: usize,
    pub channels: BTreeMap<String, (u64, u64)>,
}

impl Dispatcher {
    /// Opens the outbox and state under `state_dir` and starts the worker thread.
    pub fn start(settings: NotifySettings, state_dir: &Path) -> anyhow::Result<Dispatcher> {
        crate::sys::create_private_dir(state_dir)
            .map_err(|e| anyhow::anyhow!("cannot create state_dir {}: {e}", state_dir.display()))?;
        let outbox = Outbox::open(state_dir)
            .map_err(|e| anyhow::anyhow!("cannot open outbox in {}: {e}", state_dir.display()))?;
        let state_path = state_dir.join(STATE_FILE);
        let state = match std::fs::read(&state_path) {
            Ok(bytes) => serde_json::from_slice::<GrouperState>(&bytes).unwrap_or_else(|e| {
                warn!(path = %state_path.display(), "ignoring unreadable notify state: {e}");
                GrouperState::default()
            }),
            Err(_) => GrouperState::default(),
        };
        let transport = Transport::new()?;
        let (tx, rx) = mpsc::unbounded_channel();
        let delivery = Arc::new(std::sync::Mutex::new(Delivery::default()));
        let shared = delivery.clone();
        let persisted = Arc::new(Persisted::default());
        let reached = persisted.clone();
        let beats = Arc::new(Beats::default());
        let heartbeat = std::sync::atomic::AtomicBool::new(settings.heartbeat.is_some());
        let mut worker = Worker::new(settings, outbox, state_path, state, transport);
        worker.delivery = shared;
        worker.persisted = reached;
        worker.beats = beats.clone();
        let context = worker.grouper.context();
        let thread = std::thread::Builder::new()
            .name("gpuwatch-notify".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        error!("cannot start the notification runtime: {e}");
                        return;
                    }
                };
                rt.block_on(worker.run(rx));
            })?;
        Ok(Dispatcher {
            tx,
            thread: Some(thread),
            delivery,
            marks: (std::sync::atomic::AtomicU64::new(0), persisted),
            beats,
            heartbeat,
            context,
        })
    }

    /// The latest device identities (none: kept as they were) and, when it was refreshed, the
    /// process list, for the messages made from now on. Nothing is sent: the worker reads them
    /// when it makes messages, so a new process list every few seconds wakes no thread.
    pub fn set_context(&self, devices: Vec<DeviceId>, processes: Option<Vec<ProcSample>>) {
        self.context
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .update(devices, processes);
    }

    /// Puts a mark behind everything sent so far; once [`Dispatcher::wait_persisted`] says it
    /// was reached, the worker has ingested those inputs and saved its state. The daemon saves
    /// the engine's alert state only then: a `kill -9` between the two saves leaves the engine
    /// behind the dispatcher (its transitions are evaluated again and their events ingested
    /// again, which changes nothing), never ahead of it (an event the engine counts as
    /// announced that the dispatcher never heard of would be lost).
    pub fn mark(&self) -> u64 {
        let n = self
            .marks
            .0
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let _ = self.tx.send(Input::Mark(n));
        n
    }

    /// Waits up to `timeout` for mark `n`; whether it was reached.
    pub fn wait_persisted(&self, n: u64, timeout: Duration) -> bool {
        let p = &self.marks.1;
        let Ok(mark) = p.mark.lock() else {
            return false;
        };
        p.reached
            .wait_timeout_while(mark, timeout, |m| *m < n)
            .is_ok_and(|(m, _)| *m >= n)
    }

    /// Delivery counts so far.
    pub fn delivery(&self) -> Delivery {
        self.delivery.lock().map(|d| d.clone()).unwrap_or_default()
    }

    /// The sampling loop completed a tick at `time_ms` (drives the dead-man heartbeat; no
    /// message unless the worker is to be woken for the heartbeat, see [`Beats`]).
    pub fn healthy(&self, time_ms: i64) {
        if self.beats.beat(time_ms) && self.heartbeat.load(std::sync::atomic::Ordering::Relaxed) {
            self.send(Input::Healthy);
        }
    }

    /// Queues an input (never blocks).
    pub fn send(&self, input: Input) {
        if let Input::Reload(s) = &input {
            self.heartbeat
                .store(s.heartbeat.is_some(), std::sync::atomic::Ordering::Relaxed);
        }
        let _ = self.tx.send(input);
    }

    /// A sender other threads can keep.
    pub fn sender(&self) -> mpsc::UnboundedSender<Input> {
        self.tx.clone()
    }

    /// Sends every waiting group now (ignoring `group_wait`), waits until everything is
    /// delivered or `timeout` passed, then stops. For short-lived processes (`daemon --events`,
    /// job notifications); what is still undelivered stays in the outbox.
    pub fn drain(mut self, timeout: Duration) {
        let deadline = now_ms() + i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX / 2);
        let _ = self.tx.send(Input::Drain(deadline));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Stops the worker: in-flight sends get their timeout to finish; everything unsent stays in
    /// the outbox for the next start.
    pub fn stop(mut self) {
        let _ = self.tx.send(Input::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = self.tx.send(Input::Stop);
            let _ = t.join();
        }
    }
}

#[derive(Debug, Default)]
struct Health {
    consecutive_failures: u32,
    failing: bool,
    last_error: String,
}

enum Done {
    Send {
        id: String,
        channel: String,
        result: Result<(), SendError>,
    },
    Ping(Result<(), SendError>),
}

struct Worker {
    settings: Arc<NotifySettings>,
    grouper: Grouper,
    outbox: Outbox,
    state_path: PathBuf,
    saved_state: String,
    transport: Transport,
    pending: BTreeMap<String, OutboxEntry>,
    /// Ids of pending messages the outbox could not store (disk full, read-only, …): they live
    /// only in memory, and a stop must say so rather than claim they are kept.
    unsaved: std::collections::BTreeSet<String>,
    in_flight: HashSet<String>,
    tasks: JoinSet<Done>,
    /// What each running task holds: a channel's send (`Some`), or the heartbeat ping.
    task_channels: HashMap<tokio::task::Id, Option<String>>,
    health: HashMap<String, Health>,
    /// The sampling loop's completed ticks ([`Dispatcher::healthy`]).
    beats: Arc<Beats>,
    last_ping_ms: i64,
    ping_in_flight: bool,
    drain_deadline_ms: Option<i64>,
    /// When the outbox was last looked at for messages another process put there.
    last_adopt_ms: i64,
    /// Shared with the [`Dispatcher`] handle (for `/metrics`).
    delivery: Arc<std::sync::Mutex<Delivery>>,
    /// The last [`Input::Mark`] reached, shared with the handle.
    persisted: Arc<Persisted>,
}

impl Worker {
    /// Publishes the queue length and a send's outcome (`ok`), if one.
    fn count(&self, channel: Option<(&str, bool)>) {
        if let Ok(mut d) = self.delivery.lock() {
            d.queued = self.pending.len();
            if let Some((c, ok)) = channel {
                let e = d.channels.entry(c.to_string()).or_default();
                if ok {
                    e.0 += 1;
                } else {
                    e.1 += 1;
                }
            }
        }
    }

    fn new(
        settings: NotifySettings,
        outbox: Outbox,
        state_path: PathBuf,
        state: GrouperState,
        transport: Transport,
    ) -> Worker {
        let settings = Arc::new(settings);
        let saved_state = serde_json::to_string(&state).unwrap_or_default();
        Worker {
            grouper: Grouper::new(settings.clone(), state),
            settings,
            outbox,
            state_path,
            saved_state,
            transport,
            pending: BTreeMap::new(),
            unsaved: std::collections::BTreeSet::new(),
            in_flight: HashSet::new(),
            tasks: JoinSet::new(),
            task_channels: HashMap::new(),
            health: HashMap::new(),
            beats: Arc::default(),
            last_ping_ms: 0,
            ping_in_flight: false,
            drain_deadline_ms: None,
            last_adopt_ms: i64::MIN,
            delivery: Arc::default(),
            persisted: Arc::default(),
        }
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Input>) {
        match self.outbox.load() {
            Ok((entries, problems)) => {
                for p in problems {
                    error!("corrupt outbox entry set aside: {p}");
                }
                if !entries.is_empty() {
                    info!(
                        count = entries.len(),
                        "resuming undelivered notifications from the outbox"
                    );
                }
                let now = now_ms();
                for mut e in entries {
                    e.next_attempt_ms = e.next_attempt_ms.min(now);
                    self.pending.insert(e.notification.id.clone(), e);
                }
            }
            Err(e) => error!("cannot read the outbox: {e}"),
        }
        self.last_adopt_ms = now_ms();
        let alarm = crate::sys::deadman::Deadman::nonblocking()
            .ok()
            .and_then(|d| {
                // SAFETY: the timer owns its descriptor, which stays open and the same until the
                // timer is dropped, and the timer is dropped only with the `AsyncFd`.
                unsafe {
                    tokio::io::unix::AsyncFd::register_with_interest(
                        d,
                        tokio::io::Interest::READABLE,
                    )
                }
                .ok()
            });
        loop {
            let now = now_ms();
            if now - self.last_adopt_ms >= ADOPT_EVERY_MS {
                self.adopt(now);
            }
            let made = self.grouper.tick(now);
            for n in made {
                self.enqueue(n, now);
            }
            self.save_state();
            if let Some(deadline) = self.drain_deadline_ms {
                if (self.pending.is_empty() && self.tasks.is_empty()) || now >= deadline {
                    break;
                }
            }
            self.start_due(now);
            self.heartbeat(now);
            let mut wake = self.next_wakeup(now);
            if let Some(deadline) = self.drain_deadline_ms {
                wake = wake.min(deadline);
            }
            let sleep =
                Duration::from_millis(u64::try_from((wake - now).clamp(0, 3_600_000)).unwrap_or(0));
            tokio::select! {
                msg = rx.recv() => match msg {
                    None | Some(Input::Stop) => break,
                    Some(input) => self.handle(input),
                },
                Some(done) = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => {
                    self.joined(done);
                }
                () = sleep_on(alarm.as_ref(), sleep) => {}
            }
        }
        // Graceful stop: drain what is already queued, let in-flight sends finish.
        while let Ok(input) = rx.try_recv() {
            if !matches!(input, Input::Stop) {
                self.handle(input);
            }
        }
        let now = now_ms();
        let made = self.grouper.tick(now);
        for n in made {
            self.enqueue(n, now);
        }
        self.save_state();
        let grace = Duration::from_millis(
            u64::try_from(
                self.settings
                    .channels
                    .iter()
                    .map(|c| c.timeout_ms)
                    .max()
                    .unwrap_or(0),
            )
            .unwrap_or(10_000)
                + 1000,
        );
        let _ = tokio::time::timeout(grace, async {
            while let Some(done) = self.tasks.join_next_with_id().await {
                self.joined(done);
            }
        })
        .await;
        self.save_state();
        // One more try for what the outbox could not take; then say exactly what is kept.
        let retry: Vec<OutboxEntry> = self
            .unsaved
            .iter()
            .filter_map(|id| self.pending.get(id).cloned())
            .collect();
        for entry in &retry {
            self.persist(entry, "cannot write to the outbox at stop");
        }
        self.unsaved.retain(|id| self.pending.contains_key(id));
        let lost = self.unsaved.len();
        let kept = self.pending.len() - lost;
        if lost > 0 {
            error!(
                kept,
                lost,
                outbox = %self.outbox.dir().display(),
                "notification dispatcher stopped; {lost} undelivered message(s) could not be written \
                 to the outbox (disk full or read-only?) and are lost"
            );
        } else {
            info!(
                queued = kept,
                "notification dispatcher stopped; undelivered messages stay in the outbox"
            );
        }
    }

    /// Writes `entry` to the outbox, remembering whether it is stored.
    fn persist(&mut self, entry: &OutboxEntry, what: &str) {
        let id = entry.notification.id.clone();
        match self.outbox.put(entry) {
            Ok(()) => {
                self.unsaved.remove(&id);
            }
            Err(e) => {
                error!(id = %id, "{what}: {e}");
                self.unsaved.insert(id);
            }
        }
    }

    fn handle(&mut self, input: Input) {
        match input {
            Input::Events(events) => {
                let now = now_ms();
                for e in &events {
                    debug!(alert = %e.name, status = ?e.status, gpu = ?e.gpu, "alert event");
                }
                self.grouper.ingest(now, &events);
                self.save_state();
            }
            Input::Silences(list) => self.grouper.set_silences(list),
            // (only a wake-up: the tick is in `beats`)
            Input::Healthy => {}
            Input::Reload(s) => {
                let s = Arc::new(*s);
                self.grouper.set_settings(s.clone());
                self.settings = s;
                info!("notification settings reloaded");
            }
            Input::Drain(deadline) => {
                self.grouper.flush_all();
                self.drain_deadline_ms = Some(deadline);
            }
            Input::Mark(n) => {
                // The inputs before it are handled; their state must be on disk.
                self.save_state();
                if let Ok(mut m) = self.persisted.mark.lock() {
                    *m = n;
                }
                self.persisted.reached.notify_all();
            }
            Input::Stop => {}
        }
    }

    /// Takes the messages another process put in the outbox (a `gpuwatch run` that could not
    /// deliver before it exited hands them over), each at its own next attempt.
    fn adopt(&mut self, now: i64) {
        self.last_adopt_ms = now;
        let pending = &self.pending;
        match self.outbox.load_new(|id| pending.contains_key(id)) {
            Ok((entries, problems)) => {
                for p in problems {
                    error!("corrupt outbox entry set aside: {p}");
                }
                for e in entries {
                    info!(channel = %e.notification.channel, id = %e.notification.id, "queued by another gpuwatch: {}", super::render::title(&e.notification));
                    self.pending.insert(e.notification.id.clone(), e);
                }
                self.count(None);
            }
            Err(e) => warn!("cannot read the outbox: {e}"),
        }
    }

    fn save_state(&mut self) {
        let Ok(json) = serde_json::to_string(self.grouper.state()) else {
            return;
        };
        if json == self.saved_state {
            return;
        }
        match write_atomic(&self.state_path, json.as_bytes()) {
            Ok(()) => self.saved_state = json,
            Err(e) => error!(path = %self.state_path.display(), "cannot save notify state: {e}"),
        }
    }

    fn enqueue(&mut self, n: Notification, now: i64) {
        let entry = OutboxEntry {
            notification: n,
            attempts: 0,
            next_attempt_ms: now,
            last_error: None,
        };
        self.persist(&entry, "cannot write to the outbox (sending anyway)");
        info!(
            channel = %entry.notification.channel,
            id = %entry.notification.id,
            alerts = entry.notification.alerts.len(),
            reason = %entry.notification.reason.as_str(),
            "queued: {}",
            super::render::title(&entry.notification)
        );
        self.pending.insert(entry.notification.id.clone(), entry);
        self.count(None);
    }

    /// The pending messages that may be sent next: per channel and group, the oldest (a later
    /// message of a group never overtakes an earlier one in backoff — a resolution must not
    /// arrive before the firing message it ends), oldest first.
    fn heads(&self) -> Vec<&OutboxEntry> {
        let mut all: Vec<&OutboxEntry> = self.pending.values().collect();
        all.sort_by(|a, b| {
            (a.notification.created_ms, &a.notification.id)
                .cmp(&(b.notification.created_ms, &b.notification.id))
        });
        let mut seen = HashSet::new();
        all.into_iter()
            .filter(|e| {
                seen.insert((
                    e.notification.channel.as_str(),
                    e.notification.group_key.as_str(),
                ))
            })
            .collect()
    }

    fn start_due(&mut self, now: i64) {
        let due: Vec<&OutboxEntry> = self
            .heads()
            .into_iter()
            .filter(|e| {
                e.next_attempt_ms <= now && !self.in_flight.contains(&e.notification.channel)
            })
            .collect();
        let mut start: Vec<(String, String)> = Vec::new();
        let mut seen = HashSet::new();
        for e in due {
            if seen.insert(e.notification.channel.clone()) {
                start.push((e.notification.id.clone(), e.notification.channel.clone()));
            }
        }
        for (id, channel) in start {
            let Some(spec) = self.settings.channel(&channel).cloned() else {
                if let Some(mut e) = self.pending.remove(&id) {
                    e.last_error = Some(format!("channel {channel:?} is no longer configured"));
                    error!(
                        id,
                        channel, "dropping message for a removed channel (kept in outbox/dead)"
                    );
                    let _ = self.outbox.bury(&e);
                }
                continue;
            };
            let Some(entry) = self.pending.get(&id) else {
                continue;
            };
            let n = entry.notification.clone();
            let transport = self.transport.clone();
            self.in_flight.insert(channel.clone());
            let task = self.tasks.spawn(async move {
                let result = transport.send(&spec, &n).await;
                Done::Send {
                    id: n.id,
                    channel: spec.name,
                    result,
                }
            });
            self.task_channels.insert(task.id(), Some(channel));
        }
    }

    /// Books a finished task; one that failed (a panic) frees what it held — its channel, or
    /// the heartbeat — so that neither stops for good.
    fn joined(&mut self, done: Result<(tokio::task::Id, Done), tokio::task::JoinError>) {
        match done {
            Ok((task, done)) => {
                self.task_channels.remove(&task);
                self.finish(done);
            }
            Err(e) => match self.task_channels.remove(&e.id()) {
                Some(Some(channel)) => {
                    error!(channel, "a send failed unexpectedly ({e}); it is retried");
                    self.in_flight.remove(&channel);
                }
                _ => {
                    error!("the heartbeat ping failed unexpectedly ({e})");
                    self.ping_in_flight = false;
                }
            },
        }
    }

    /// Whether the sampling loop counts as alive at `now`: it completed a tick within the
    /// heartbeat interval (at least 30 s), or within two of its own tick spacings when it samples
    /// less often than that.
    fn healthy(&self, now: i64, interval_ms: i64) -> bool {
        let (last, gap) = self.beats.read();
        let window = interval_ms.max(30_000).max(2 * gap);
        last.is_some_and(|t| now - t <= window)
    }

    fn heartbeat(&mut self, now: i64) {
        let Some((interval, url)) = self
            .settings
            .heartbeat
            .as_ref()
            .map(|hb| (hb.interval_ms, hb.url.clone()))
        else {
            return;
        };
        if !self.healthy(now, interval) || self.ping_in_flight || now - self.last_ping_ms < interval
        {
            return;
        }
        self.ping_in_flight = true;
        self.last_ping_ms = now;
        let transport = self.transport.clone();
        let task = self
            .tasks
            .spawn(async move { Done::Ping(transport.ping(&url, Duration::from_secs(10)).await) });
        self.task_channels.insert(task.id(), None);
    }

    fn next_wakeup(&self, now: i64) -> i64 {
        let mut wake = (now + 3_600_000).min(self.last_adopt_ms.saturating_add(ADOPT_EVERY_MS));
        if let Some(t) = self.grouper.next_wakeup(now) {
            wake = wake.min(t);
        }
        for e in self.heads() {
            if !self.in_flight.contains(&e.notification.channel) {
                wake = wake.min(e.next_attempt_ms);
            }
        }
        if let Some(hb) = &self.settings.heartbeat {
            // Not while unhealthy (the ping would be skipped: waking for it would spin); the next
            // completed tick wakes the loop anyway.
            if !self.ping_in_flight && self.healthy(now, hb.interval_ms) {
                wake = wake.min(self.last_ping_ms + hb.interval_ms);
            }
        }
        wake.max(now)
    }

    fn finish(&mut self, done: Done) {
        let now = now_ms();
        let (id, channel, result) = match done {
            Done::Ping(r) => {
                self.ping_in_flight = false;
                match r {
                    Ok(()) => debug!("heartbeat sent"),
                    Err(e) => warn!("heartbeat ping failed: {e}"),
                }
                return;
            }
            Done::Send {
                id,
                channel,
                result,
            } => (id, channel, result),
        };
        self.in_flight.remove(&channel);
        let ok = result.is_ok();
        self.finish_send(id, &channel, result, now);
        self.count(Some((&channel, ok)));
    }

    /// The outcome of one send: out of the outbox, or retried later, or given up.
    fn finish_send(&mut self, id: String, channel: &str, result: Result<(), SendError>, now: i64) {
        let channel = channel.to_string();
        match result {
            Ok(()) => {
                if let Some(e) = self.pending.remove(&id) {
                    info!(channel, id, attempts = e.attempts + 1, "delivered");
                }
                self.unsaved.remove(&id);
                if let Err(e) = self.outbox.remove(&id) {
                    error!(id, "cannot remove a delivered message from the outbox: {e}");
                }
                // The channel works again: retry its other messages now.
                for e in self.pending.values_mut() {
                    if e.notification.channel == channel {
                        e.next_attempt_ms = e.next_attempt_ms.min(now);
                    }
                }
                let h = self.health.entry(channel.clone()).or_default();
                h.consecutive_failures = 0;
                if h.failing {
                    h.failing = false;
                    info!(channel, "channel recovered");
                    self.notifier_failing(&channel, AlertStatus::Resolved, now);
                }
            }
            Err(err) => {
                let Some(mut entry) = self.pending.remove(&id) else {
                    return;
                };
                entry.attempts += 1;
                entry.last_error = Some(err.message.clone());
                let age = now - entry.notification.created_ms;
                if !err.retryable || age > self.settings.delivery.give_up_after_ms {
                    error!(
                        channel,
                        id,
                        attempts = entry.attempts,
                        "giving up on message (kept in outbox/dead): {err}"
                    );
                    if let Err(e) = self.outbox.bury(&entry) {
                        error!(id, "cannot move message to outbox/dead: {e}");
                    }
                } else {
                    let delay = self
                        .settings
                        .delivery
                        .backoff_ms(entry.attempts)
                        .max(err.retry_after_ms.unwrap_or(0));
                    entry.next_attempt_ms = now + delay;
                    warn!(
                        channel,
                        id,
                        attempts = entry.attempts,
                        retry_in_ms = delay,
                        "send failed, will retry: {err}"
                    );
                    self.persist(&entry, "cannot update the outbox");
                    let next = entry.next_attempt_ms;
                    for e in self.pending.values_mut() {
                        if e.notification.channel == channel {
                            e.next_attempt_ms = e.next_attempt_ms.max(next);
                        }
                    }
                    self.pending.insert(id, entry);
                }
                let failing_after = self.settings.delivery.failing_after;
                let h = self.health.entry(channel.clone()).or_default();
                h.consecutive_failures += 1;
                h.last_error = err.message;
                if !h.failing && h.consecutive_failures >= failing_after {
                    h.failing = true;
                    error!(
                        channel,
                        failures = h.consecutive_failures,
                        "channel keeps failing"
                    );
                    self.notifier_failing(&channel, AlertStatus::Firing, now);
                }
            }
        }
    }

    /// Sends (or resolves) the `notifier_failing` alert for `failed` through every other channel.
    fn notifier_failing(&mut self, failed: &str, status: AlertStatus, now: i64) {
        let Some(spec) = self.settings.channel(failed).cloned() else {
            return;
        };
        let last_error = self
            .health
            .get(failed)
            .map(|h| h.last_error.clone())
            .unwrap_or_default();
        let event = notifier_failing_event(
            &spec,
            &self.settings.hostname,
            &last_error,
            status,
            now,
            self.outbox.dir(),
        );
        let others: Vec<ChannelSpec> = self
            .settings
            .channels
            .iter()
            .filter(|c| c.name != failed && (status == AlertStatus::Firing || c.send_resolved))
            .cloned()
            .collect();
        for other in others {
            let mut n = Notification {
                id: String::new(),
                channel: other.name.clone(),
                group_key: format!("notifier_failing:{failed}"),
                group_labels: event.labels.clone(),
                status,
                reason: Reason::NotifierFailing,
                alerts: vec![event.clone()],
                truncated_alerts: 0,
                created_ms: now,
                repeat_interval_ms: 4 * 3_600_000,
                hostname: self.settings.hostname.clone(),
                devices: Vec::new(),
                processes: Vec::new(),
                note: None,
            };
            n.compute_id();
            self.enqueue(n, now);
        }
    }
}

/// The `notifier_failing` alert for channel `spec`.
pub fn notifier_failing_event(
    spec: &ChannelSpec,
    hostname: &str,
    last_error: &str,
    status: AlertStatus,
    now: i64,
    outbox_dir: &Path,
) -> AlertEvent {
    let mut labels = BTreeMap::new();
    labels.insert("alertname".into(), "notifier_failing".into());
    labels.insert("severity".into(), "warning".into());
    labels.insert("hostname".into(), hostname.into());
    labels.insert("channel".into(), spec.name.clone());
    let mut annotations = BTreeMap::new();
    annotations.insert(
        "summary".into(),
        match status {
            AlertStatus::Firing => format!(
                "Notification channel {:?} ({}) keeps failing: {last_error}",
                spec.name,
                spec.kind.as_str()
            ),
            AlertStatus::Resolved => format!(
                "Notification channel {:?} ({}) delivers again",
                spec.name,
                spec.kind.as_str()
            ),
        },
    );
    annotations.insert(
        "next_steps".into(),
        format!(
            "Check the endpoint and credentials of channel {:?} (`gpuwatch notify-test --channel {}`). \
             Undelivered messages stay queued in {} and are retried.",
            spec.name,
            spec.name,
            outbox_dir.display()
        ),
    );
    AlertEvent::notice(
        format!("notifier_failing:{}", spec.name),
        "notifier_failing",
        Severity::Warning,
        status,
        labels,
        annotations,
        now,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker for the configuration `text`, with its outbox in a temporary directory (kept
    /// while the directory handle lives) and no outbox look-up due during the test.
    fn worker(text: &str) -> (tempfile::TempDir, Worker) {
        let dir = tempfile::tempdir().unwrap();
        let config = crate::config::parse(text, Path::new("/etc/gpuwatch/config.toml")).unwrap();
        let mut w = Worker::new(
            config.notify_settings().unwrap(),
            Outbox::open(dir.path()).unwrap(),
            dir.path().join("notify-state.json"),
            GrouperState::default(),
            Transport::new().unwrap(),
        );
        w.last_adopt_ms = i64::MAX / 2;
        (dir, w)
    }

    /// A mark is reached only once the events sent before it are ingested and the grouper's
    /// state holding them is on disk (the daemon saves its alert state only then).
    #[test]
    fn a_mark_is_reached_once_the_events_before_it_are_saved() {
        let dir = tempfile::tempdir().unwrap();
        let text =
            "[[channel]]\nname = \"ops\"\ntype = \"webhook\"\nurl = \"http://127.0.0.1:1/\"\n";
        let config = crate::config::parse(text, Path::new("/etc/gpuwatch/config.toml")).unwrap();
        let d = Dispatcher::start(config.notify_settings().unwrap(), dir.path()).unwrap();
        let state = dir.path().join(STATE_FILE);
        let mut labels = BTreeMap::new();
        labels.insert("alertname".to_string(), "gpu_lost".to_string());
        let event = AlertEvent {
            fingerprint: "fp-gpu-lost-3".into(),
            name: "gpu_lost".into(),
            severity: crate::model::Severity::Critical,
            status: AlertStatus::Firing,
            labels,
            annotations: BTreeMap::new(),
            starts_at_ms: 1,
            ends_at_ms: None,
            at_ms: 1,
            repeat: false,
            gpu: Some(3),
            actions: Vec::new(),
            target_pid: None,
            target_start: None,
            target_local: false,
            chart: None,
            once: false,
            ended: None,
        };
        d.send(Input::Events(vec![event]));
        let mark = d.mark();
        assert!(d.wait_persisted(mark, Duration::from_secs(10)));
        let saved = std::fs::read_to_string(&state).unwrap();
        assert!(saved.contains("fp-gpu-lost-3"), "{saved}");
        assert!(!d.wait_persisted(mark + 1, Duration::from_millis(10)));
        d.stop();
    }

    /// While the sampling loop is not healthy the heartbeat is not due, so the loop does not
    /// wake for it (it would spin: the ping is skipped, its time stays in the past); a loop that
    /// samples less often than the heartbeat interval stays healthy between its ticks.
    #[test]
    fn an_unhealthy_loop_does_not_wake_for_the_heartbeat() {
        let (_dir, mut w) = worker(
            "[notify]\nheartbeat_url = \"http://127.0.0.1:9/ping\"\nheartbeat_interval = \"1m\"\n",
        );
        let t0 = 1_800_000_000_000;
        w.beats.beat(t0);
        w.last_ping_ms = t0;
        assert_eq!(
            w.next_wakeup(t0 + 1_000),
            t0 + 60_000,
            "healthy: the next ping"
        );
        // No tick for 5 minutes (a stalled sampler): no wake-up before an hour.
        assert!(w.next_wakeup(t0 + 300_000) > t0 + 300_000 + 60_000);
        // Ticks every 2 minutes (interval = "2m"): healthy between them.
        w.beats.beat(t0 + 120_000);
        w.beats.beat(t0 + 240_000);
        assert!(w.healthy(t0 + 330_000, 60_000));
        assert_eq!(w.next_wakeup(t0 + 330_000), t0 + 330_000, "the ping is due");
    }

    /// A later message of a group waits behind an earlier one in backoff (on the same channel);
    /// another group's message does not.
    #[test]
    fn a_later_message_of_a_group_does_not_overtake_one_in_backoff() {
        let (_dir, mut w) = worker("");
        let message = |created_ms: i64, group: &str, status| {
            let mut n = super::super::testdata::notification(vec![super::super::testdata::alert(
                0, status,
            )]);
            n.created_ms = created_ms;
            n.group_key = group.into();
            n.compute_id();
            n
        };
        let t = 1_800_000_000_000;
        let firing = message(t, "g1", AlertStatus::Firing);
        let first = firing.id.clone();
        w.enqueue(firing, t);
        w.pending.get_mut(&first).unwrap().next_attempt_ms = t + 60_000;
        w.enqueue(message(t + 1_000, "g1", AlertStatus::Resolved), t + 1_000);
        let other = message(t + 2_000, "g2", AlertStatus::Firing);
        let other_id = other.id.clone();
        w.enqueue(other, t + 2_000);
        let heads: Vec<String> = w
            .heads()
            .iter()
            .map(|e| e.notification.id.clone())
            .collect();
        assert_eq!(heads, [first.clone(), other_id.clone()]);
        w.in_flight.insert("ops".into());
        assert_eq!(
            w.next_wakeup(t + 3_000),
            t + 3_000 + 3_600_000,
            "the channel is busy"
        );
        w.in_flight.clear();
        w.pending.remove(&other_id);
        assert_eq!(w.next_wakeup(t + 3_000), t + 60_000, "behind the backoff");
    }
}
