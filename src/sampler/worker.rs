//! Worker threads for NVML calls, so that a call that blocks — for ever in a wedged driver —
//! delays only its own GPU. A [`Pool`] starts with one thread reading every GPU in turn (one
//! hand-off per tick: the cheapest way to sample) and answers per GPU as it goes. When a call has
//! been blocked longer than the pool's split time, the GPUs after it are moved to a new thread at
//! once (asked again within the same tick), and the blocked thread keeps only the GPU it is stuck
//! on; each thread's [`Busy`] marker tells which GPU and function it is in, and since when.
//!
//! A request lists its GPUs in the order their answers were last taken, the oldest first (GPU
//! order while every GPU answers every tick): reads slower than a tick's budget, though no call
//! blocks long enough to be split off, then reach every GPU in turn rather than only the first
//! ones, tick after tick.
//!
//! A thread blocked inside the driver cannot be cancelled. It is left where it is: while its
//! call has not returned it is sent nothing (no backlog builds up), the sampler reports its GPU
//! stalled once the call timeout has passed, and the other GPUs keep being sampled; when the call
//! returns, the thread's late answers are discarded and it takes requests for its GPU again.
//!
//! A periodic sampler may run the first thread's request on its own thread instead
//! ([`Pool::ask_inline`], while the pool is as it started): the answers are the same and a tick
//! hands nothing off. The pool counts such a read as its first thread's request, so a call
//! blocked in it is split off by whoever collects the answers, as above — the caller must make
//! sure someone does (`pipeline::SamplerThread`'s watchdog takes its loop over, and asks the
//! threads until the blocked read returns).
//!
//! A split is not for ever: a driver that blocked for a while (a GPU reset, recovery after an
//! XID, a machine so loaded that a call was held off) usually answers promptly again, and every
//! extra thread costs a wake-up per tick. Once every thread has answered every ask for
//! [`REJOIN_FIRST`] after the split (doubling after each rejoin, up to [`REJOIN_MAX`], and back
//! to the first wait when a split comes an hour or more after the last rejoin), the GPUs rejoin the
//! largest thread and the others end ([`Pool::rejoin`]); the GPUs that move get a fresh read
//! state, as at a split, and the pool is as it started again (reads may run inline).
//!
//! A thread that cannot be started (`EAGAIN` at the user's or the system's thread limit) leaves
//! its GPUs unread — reported stalled — only until a later try starts it: the pool tries again
//! at the asks after 1 s, then 2 s, 4 s, … (at most a minute apart), and says so in the log.

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use nvml_wrapper::error::NvmlError;

use crate::model::NvmlFunction;

/// Stack size of a worker thread (they only call NVML and fill small structs).
const STACK_BYTES: usize = 256 * 1024;

/// The wait before the first new try to start a thread that could not be started; it doubles
/// with each failed try up to [`RESTART_MAX`].
const RESTART_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between two tries.
const RESTART_MAX: Duration = Duration::from_secs(60);

/// How long every thread of a split pool must answer every ask before its GPUs rejoin one
/// thread; the wait doubles after each rejoin (a driver that keeps blocking is not merged back
/// every few seconds) up to [`REJOIN_MAX`].
const REJOIN_FIRST: Duration = Duration::from_secs(10);
/// The longest wait before a rejoin.
const REJOIN_MAX: Duration = Duration::from_secs(3600);

#[cfg(test)]
thread_local! {
    /// Tests: how many of the next thread starts on this thread fail (as `EAGAIN` would).
    static FAILING_STARTS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Starts a thread (in tests, fails while `FAILING_STARTS` says so).
fn start_thread(
    builder: std::thread::Builder,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<()> {
    #[cfg(test)]
    if FAILING_STARTS.with(|n| n.replace(n.get().saturating_sub(1))) > 0 {
        return Err(std::io::Error::from_raw_os_error(libc::EAGAIN));
    }
    builder.spawn(f).map(drop)
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Which NVML function a worker is inside, and since when; shared with the sampler.
#[derive(Debug, Default)]
pub(crate) struct Busy {
    /// 0 = not in a call, else 1 + the function's position in [`NvmlFunction::ALL`].
    call: AtomicU8,
    /// When the call started, µs on the monotonic clock (coarse: see
    /// [`crate::sys::coarse_monotonic_us`]).
    since_us: AtomicI64,
    /// The GPU (position) the thread is reading.
    gpu: AtomicUsize,
    /// 1 + the one GPU (position) the thread keeps after a split; 0 = not split (it reads all
    /// it is asked for). Set while the thread may still be inside the request that listed the
    /// others, so it does not read GPUs that moved to another thread once its call returns.
    only: AtomicUsize,
}

impl Busy {
    /// Marks the start of a call to `f`.
    pub(crate) fn enter(&self, f: NvmlFunction) {
        let code = u8::try_from(f.pos() + 1).unwrap_or(u8::MAX);
        self.since_us
            .store(crate::sys::coarse_monotonic_us(), Ordering::Release);
        self.call.store(code, Ordering::Release);
    }

    /// Marks the end of the current call.
    pub(crate) fn leave(&self) {
        self.call.store(0, Ordering::Release);
    }

    /// Runs `call` between [`Busy::enter`] and [`Busy::leave`].
    pub(crate) fn around<T>(&self, f: NvmlFunction, call: impl FnOnce() -> T) -> T {
        self.enter(f);
        let out = call();
        self.leave();
        out
    }

    /// Runs an NVML `call` like [`Busy::around`], counting its failure (see [`CallFailures`]).
    pub(crate) fn call<T>(
        &self,
        f: NvmlFunction,
        call: impl FnOnce() -> Result<T, NvmlError>,
    ) -> Result<T, NvmlError> {
        let out = self.around(f, call);
        if let Err(e) = &out {
            call_failures().error(f, e);
        }
        out
    }

    /// Marks the GPU (position) the following calls are about.
    pub(crate) fn set_gpu(&self, pos: usize) {
        self.gpu.store(pos, Ordering::Release);
    }

    /// The GPU the thread is reading.
    pub(crate) fn gpu(&self) -> usize {
        self.gpu.load(Ordering::Acquire)
    }

    /// Restricts the thread to GPU `pos` (a split).
    fn keep_only(&self, pos: usize) {
        self.only.store(pos + 1, Ordering::Release);
    }

    /// Lets the thread read every GPU it is asked for again (a rejoin).
    fn read_all(&self) {
        self.only.store(0, Ordering::Release);
    }

    /// Whether the thread still reads GPU `pos`.
    fn reads(&self, pos: usize) -> bool {
        let only = self.only.load(Ordering::Acquire);
        only == 0 || only == pos + 1
    }

    /// The function the worker is inside at `now` and for how long, if any.
    pub(crate) fn blocked(&self, now: Instant) -> Option<(NvmlFunction, Duration)> {
        let code = self.call.load(Ordering::Acquire);
        if code == 0 {
            return None;
        }
        let since = self.since_us.load(Ordering::Acquire);
        let for_us = crate::sys::monotonic_us(now).saturating_sub(since).max(0);
        let f = NvmlFunction::ALL
            .get(usize::from(code) - 1)
            .copied()
            .unwrap_or(NvmlFunction::Unknown);
        Some((f, Duration::from_micros(u64::try_from(for_us).unwrap_or(0))))
    }
}

const FUNCTIONS: usize = NvmlFunction::ALL.len() + 1;

/// NVML calls that failed, and calls that did not return within the call timeout, per function,
/// since the start. One table per process, as NVML is loaded once per process.
#[derive(Debug)]
pub struct CallFailures {
    errors: [AtomicU64; FUNCTIONS],
    timeouts: [AtomicU64; FUNCTIONS],
}

/// The process's [`CallFailures`].
pub fn call_failures() -> &'static CallFailures {
    static TABLE: CallFailures = CallFailures {
        errors: [const { AtomicU64::new(0) }; FUNCTIONS],
        timeouts: [const { AtomicU64::new(0) }; FUNCTIONS],
    };
    &TABLE
}

fn function_pos(f: NvmlFunction) -> usize {
    f.pos().min(FUNCTIONS - 1)
}

impl CallFailures {
    /// Counts a failed call. "Not supported" and "nothing there" are answers about the GPU,
    /// not failures, and are not counted.
    pub(crate) fn error(&self, f: NvmlFunction, e: &NvmlError) {
        if !matches!(
            e,
            NvmlError::NotSupported
                | NvmlError::FunctionNotFound
                | NvmlError::FailedToLoadSymbol(_)
                | NvmlError::NotFound
                | NvmlError::NoData
        ) {
            self.errors[function_pos(f)].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a call that passed the call timeout without returning.
    pub(crate) fn timeout(&self, f: NvmlFunction) {
        self.timeouts[function_pos(f)].fetch_add(1, Ordering::Relaxed);
    }

    /// Per function: (failed calls, timed-out calls) since the start, every function listed.
    pub fn counts(&self) -> Vec<(NvmlFunction, u64, u64)> {
        NvmlFunction::ALL
            .iter()
            .chain([&NvmlFunction::Unknown])
            .enumerate()
            .map(|(i, f)| {
                (
                    *f,
                    self.errors[i].load(Ordering::Relaxed),
                    self.timeouts[i].load(Ordering::Relaxed),
                )
            })
            .collect()
    }
}

/// One request to a thread: the ask it belongs to, the tick time, the GPUs to read in order.
struct Request {
    seq: u64,
    time_ms: i64,
    positions: Vec<usize>,
}

/// One message from a thread: an answer for a GPU, or (`None`) the end of a request. Answers are
/// left in the pool's shared list (no wake-up each); only the end of a request is sent, so a
/// tick costs the sampler one wake-up however many GPUs there are.
struct Reply<R> {
    group: usize,
    seq: u64,
    part: Option<(usize, R)>,
}

/// One thread of a pool and the GPUs it reads.
struct Group<S> {
    id: usize,
    tx: mpsc::Sender<Request>,
    busy: Arc<Busy>,
    members: Vec<usize>,
    /// The ask whose request it has not finished, and how many GPUs of it are still to come.
    outstanding: Option<(u64, usize)>,
    alive: bool,
    /// While not alive: the failed tries to start its thread, and when to try again.
    restart: Option<(u32, Instant)>,
    /// Its GPUs' read states, shared by its thread and a caller that reads inline
    /// ([`Pool::ask_inline`]); locked for a request's whole read.
    states: States<S>,
}

/// Per-GPU read states of one thread, by GPU position (created on first use).
type States<S> = Arc<Mutex<Vec<Option<S>>>>;

/// Per-GPU state of a pool thread, created on first use.
pub(crate) type Factory<S> = Arc<dyn Fn(usize, Arc<Busy>) -> S + Send + Sync>;
/// One GPU's read: the state, the thread's busy marker, the tick time.
pub(crate) type Work<S, R> = Arc<dyn Fn(&mut S, &Busy, i64) -> R + Send + Sync>;

/// What serves a thread's requests: its thread, or a caller reading inline.
struct Serving<S, R> {
    id: usize,
    marker: Arc<Busy>,
    states: States<S>,
    replies: mpsc::Sender<Reply<R>>,
    parts: Arc<Mutex<Vec<Reply<R>>>>,
    factory: Factory<S>,
    work: Work<S, R>,
}

impl<S, R> Serving<S, R> {
    /// Reads the GPUs of `req` in order (those the thread still reads after a split), leaving
    /// each answer in the pool's list, then sends the end of the request. False when the pool
    /// is gone.
    fn serve(&self, req: Request) -> bool {
        let mut states = self
            .states
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for pos in req.positions {
            if !self.marker.reads(pos) {
                continue;
            }
            self.marker.set_gpu(pos);
            let Some(slot) = states.get_mut(pos) else {
                continue;
            };
            let state = slot.get_or_insert_with(|| (self.factory)(pos, self.marker.clone()));
            // A panic in a read (a bug meeting odd driver data) costs this GPU's answer at
            // this tick and its state, not the thread: the GPU is read afresh at the next
            // tick, the others go on.
            let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                (self.work)(state, &self.marker, req.time_ms)
            }));
            let Ok(out) = read else {
                self.marker.leave();
                *slot = None;
                tracing::error!("reading GPU position {pos} failed (a panic, logged above); it is read afresh at the next tick");
                continue;
            };
            let part = Reply {
                group: self.id,
                seq: req.seq,
                part: Some((pos, out)),
            };
            match self.parts.lock() {
                Ok(mut v) => v.push(part),
                Err(_) => return false,
            }
        }
        drop(states);
        let done = Reply {
            group: self.id,
            seq: req.seq,
            part: None,
        };
        self.replies.send(done).is_ok()
    }
}

/// A request of the pool's first thread that the caller runs on its own thread (see
/// [`Pool::ask_inline`]).
pub(crate) struct InlineRead<S, R> {
    /// `None` once run.
    req: Option<Request>,
    serving: Serving<S, R>,
}

impl<S, R> InlineRead<S, R> {
    /// The busy marker of the reads: which GPU and call they are in, and since when.
    pub(crate) fn busy(&self) -> Arc<Busy> {
        self.serving.marker.clone()
    }

    /// Reads the GPUs on the calling thread, as the pool's thread would have. A call that
    /// blocks blocks the caller (another thread must collect meanwhile; see the module docs).
    pub(crate) fn run(mut self) {
        if let Some(req) = self.req.take() {
            let _ = self.serving.serve(req);
        }
    }
}

impl<S, R> Drop for InlineRead<S, R> {
    /// A read dropped without being run ends its request unanswered, so the pool's first
    /// thread is not left waiting for it for ever.
    fn drop(&mut self) {
        if let Some(req) = self.req.take() {
            let _ = self.serving.replies.send(Reply {
                group: self.serving.id,
                seq: req.seq,
                part: None,
            });
        }
    }
}

/// Threads reading `n` GPUs (see the module docs). Answers of the current ask are collected by
/// GPU position.
pub(crate) struct Pool<S, R> {
    name: &'static str,
    n: usize,
    groups: Vec<Group<S>>,
    replies_tx: mpsc::Sender<Reply<R>>,
    replies: mpsc::Receiver<Reply<R>>,
    /// Answers the threads have left, not yet booked.
    parts: Arc<Mutex<Vec<Reply<R>>>>,
    /// The list swapped with `parts` when they are booked (each keeps its capacity: no
    /// allocation per tick).
    booking: Vec<Reply<R>>,
    factory: Factory<S>,
    work: Work<S, R>,
    /// How long a call may block before the GPUs after it move to a new thread.
    split_after: Duration,
    /// The wait before the first new try to start a thread ([`RESTART_FIRST`]).
    restart_after: Duration,
    /// The calm a split pool waits for before its GPUs rejoin one thread ([`REJOIN_FIRST`],
    /// doubled at each rejoin), and since when every thread has answered every ask.
    rejoin_after: Duration,
    calm_since: Option<Instant>,
    /// When the GPUs last rejoined.
    rejoined: Option<Instant>,
    next_group: usize,
    seq: u64,
    time_ms: i64,
    /// Per GPU: wanted in the current ask, asked, answered.
    wanted: Vec<bool>,
    pending: Vec<bool>,
    got: Vec<Option<R>>,
    /// Per GPU: the ask whose answer was last taken (0: never). A request lists the GPUs that
    /// answered longest ago first, so reads slower than a tick rotate over the GPUs instead of always
    /// reaching the first ones only.
    answered: Vec<u64>,
}

impl<S: Send + 'static, R: Send + 'static> Pool<S, R> {
    /// A pool for `n` GPUs: one thread (named `name`) reading all of them.
    pub(crate) fn new(
        name: &'static str,
        n: usize,
        split_after: Duration,
        factory: Factory<S>,
        work: Work<S, R>,
    ) -> Pool<S, R> {
        let (replies_tx, replies) = mpsc::channel();
        let mut pool = Pool {
            name,
            n,
            groups: Vec::new(),
            replies_tx,
            replies,
            parts: Arc::new(Mutex::new(Vec::new())),
            booking: Vec::new(),
            factory,
            work,
            split_after,
            restart_after: RESTART_FIRST,
            rejoin_after: REJOIN_FIRST,
            calm_since: None,
            rejoined: None,
            next_group: 0,
            seq: 0,
            time_ms: 0,
            wanted: vec![false; n],
            pending: vec![false; n],
            got: (0..n).map(|_| None).collect(),
            answered: vec![0; n],
        };
        let all: Vec<usize> = (0..n).collect();
        if n > 0 {
            pool.spawn_group(all);
        }
        pool
    }

    fn spawn_group(&mut self, members: Vec<usize>) -> usize {
        let id = self.next_group;
        self.next_group += 1;
        let busy = Arc::new(Busy::default());
        let states = self.new_states();
        let started = self.start(id, busy.clone(), states.clone());
        let (tx, alive, restart) = match started {
            Ok(tx) => (tx, true, None),
            Err(e) => {
                let wait = self.restart_wait(1);
                tracing::error!(
                    "{}: cannot start a sampling thread for GPU positions {members:?}: {e}; \
                     they are not read (reported stalled) until it starts; trying again in {}",
                    self.name,
                    crate::values::format_duration_ms(duration_ms(wait)),
                );
                (mpsc::channel().0, false, Some((1, Instant::now() + wait)))
            }
        };
        self.groups.push(Group {
            id,
            tx,
            busy,
            members,
            outstanding: None,
            alive,
            restart,
            states,
        });
        id
    }

    /// A new thread's read states: none yet (each made on its GPU's first read).
    fn new_states(&self) -> States<S> {
        Arc::new(Mutex::new((0..self.n).map(|_| None).collect()))
    }

    /// The wait before try `failures + 1` to start a thread.
    fn restart_wait(&self, failures: u32) -> Duration {
        let factor = 1u32 << failures.saturating_sub(1).min(16);
        self.restart_after.saturating_mul(factor).min(RESTART_MAX)
    }

    /// Tries again to start the threads that could not be started, or ended, once their wait
    /// has passed.
    fn restart_dead(&mut self) {
        let now = Instant::now();
        for g in 0..self.groups.len() {
            let due = match self.groups[g].restart {
                Some((failures, at)) if !self.groups[g].alive && now >= at => failures,
                _ => continue,
            };
            let id = self.next_group;
            self.next_group += 1;
            let busy = Arc::new(Busy::default());
            let states = self.new_states();
            match self.start(id, busy.clone(), states.clone()) {
                Ok(tx) => {
                    let group = &mut self.groups[g];
                    let after = match due {
                        0 => String::new(),
                        1 => " after 1 failed try".to_string(),
                        n => format!(" after {n} failed tries"),
                    };
                    tracing::warn!(
                        "{}: started the sampling thread for GPU positions {:?}{after}; they are \
                         read again",
                        self.name,
                        group.members,
                    );
                    *group = Group {
                        id,
                        tx,
                        busy,
                        members: std::mem::take(&mut group.members),
                        outstanding: None,
                        alive: true,
                        restart: None,
                        states,
                    };
                }
                Err(e) => {
                    let wait = self.restart_wait(due + 1);
                    let group = &mut self.groups[g];
                    tracing::warn!(
                        "{}: still cannot start a sampling thread for GPU positions {:?}: {e} \
                         ({} failed tries); trying again in {}",
                        self.name,
                        group.members,
                        due + 1,
                        crate::values::format_duration_ms(duration_ms(wait)),
                    );
                    group.restart = Some((due + 1, now + wait));
                }
            }
        }
    }

    /// After a split: once every thread has answered every ask (none still busy with an
    /// earlier one, none dead) for the rejoin wait, moves every GPU to the thread that reads the
    /// most and lets the others end (their channels close). The GPUs that move start from a
    /// fresh read state, as the ones moved by a split did (a thread's states hold its busy
    /// marker), and the next rejoin waits twice as long.
    fn rejoin(&mut self) {
        let now = Instant::now();
        if self.groups.len() < 2 {
            // (calm is counted from the split on, not from before it)
            self.calm_since = None;
            return;
        }
        let calm = self
            .groups
            .iter()
            .all(|g| g.alive && g.outstanding.is_none());
        if !calm {
            self.calm_since = None;
            return;
        }
        let since = *self.calm_since.get_or_insert(now);
        if now.duration_since(since) < self.rejoin_after {
            return;
        }
        let keep = (0..self.groups.len())
            .max_by_key(|g| (self.groups[*g].members.len(), std::cmp::Reverse(*g)))
            .unwrap_or(0);
        let mut group = self.groups.swap_remove(keep);
        let moved: Vec<usize> = self
            .groups
            .iter()
            .flat_map(|g| g.members.iter().copied())
            .collect();
        // (the other threads end when their senders go with the groups)
        self.groups.clear();
        if let Ok(mut states) = group.states.lock() {
            for pos in &moved {
                if let Some(s) = states.get_mut(*pos) {
                    *s = None;
                }
            }
        }
        group.members = (0..self.n).collect();
        group.busy.read_all();
        tracing::debug!(
            "{}: every thread answered for {}; GPU positions {moved:?} rejoin the others on one \
             thread",
            self.name,
            crate::values::format_duration_ms(duration_ms(self.rejoin_after)),
        );
        self.groups.push(group);
        self.rejoin_after = self.rejoin_after.saturating_mul(2).min(REJOIN_MAX);
        self.calm_since = None;
        self.rejoined = Some(now);
    }

    /// Starts thread `id` of the pool; its requests go to the sender returned.
    fn start(
        &self,
        id: usize,
        busy: Arc<Busy>,
        states: States<S>,
    ) -> std::io::Result<mpsc::Sender<Request>> {
        let (tx, rx) = mpsc::channel::<Request>();
        let serving = self.serving(id, busy, states);
        let builder = std::thread::Builder::new()
            .name(format!("{}-{id}", self.name))
            .stack_size(STACK_BYTES);
        start_thread(builder, move || {
            while let Ok(req) = rx.recv() {
                if !serving.serve(req) {
                    return;
                }
            }
        })?;
        Ok(tx)
    }

    /// Starts a new ask at `time_ms` for the GPUs `want` selects: every thread that is free
    /// is sent its wanted GPUs. (Answers to an earlier ask still coming are discarded.)
    pub(crate) fn ask(&mut self, time_ms: i64, want: impl Fn(usize) -> bool) {
        self.next_ask(time_ms, want);
        for g in 0..self.groups.len() {
            let positions = self.request_for(g);
            self.send(g, positions);
        }
    }

    /// Starts ask `seq + 1` at `time_ms` for the GPUs `want` selects: books the answers still
    /// coming from earlier asks, tries again to start threads that could not be started, and
    /// clears what the ask before waited for and got.
    fn next_ask(&mut self, time_ms: i64, want: impl Fn(usize) -> bool) {
        self.drain_stale();
        self.restart_dead();
        self.rejoin();
        self.seq += 1;
        self.time_ms = time_ms;
        for pos in 0..self.n {
            self.wanted[pos] = want(pos);
            self.pending[pos] = false;
            self.got[pos] = None;
        }
    }

    /// The GPUs of group `g` the current ask wants, those answered longest ago first.
    fn request_for(&self, g: usize) -> Vec<usize> {
        let mut positions: Vec<usize> = self.groups[g]
            .members
            .iter()
            .copied()
            .filter(|p| self.wanted[*p])
            .collect();
        self.oldest_first(&mut positions);
        positions
    }

    /// Orders `positions` by the ask each last answered, the longest ago first (in GPU order
    /// while they all answer every tick).
    fn oldest_first(&self, positions: &mut [usize]) {
        let key = |p: &usize| (self.answered.get(*p).copied().unwrap_or(0), *p);
        // (in order already while every GPU answers every tick)
        if !positions.windows(2).all(|w| key(&w[0]) <= key(&w[1])) {
            positions.sort_by_key(key);
        }
    }

    /// Starts a new ask at `time_ms` for every GPU, as [`Pool::ask`] does, but for the calling
    /// thread to answer itself: while the pool is as it started (one thread reading every GPU,
    /// alive and free), the request that thread would have been sent is returned instead, to be
    /// run with [`InlineRead::run`] on the caller's thread (no hand-off, no wake-up) before the
    /// answers are collected. Otherwise (`None`) the threads were asked as by [`Pool::ask`].
    ///
    /// The pool sees an inline read as its first thread's request: it is outstanding until it
    /// ends, and a call in it blocked past the split time is split off by [`Pool::collect`] like
    /// any other — whoever collects (another thread, once the reader is stuck) moves the other
    /// GPUs to a new thread.
    pub(crate) fn ask_inline(&mut self, time_ms: i64) -> Option<InlineRead<S, R>> {
        let single = self.groups.len() == 1
            && self.groups[0].alive
            && self.groups[0].outstanding.is_none()
            && self.groups[0].members.len() == self.n;
        if !single || self.n == 0 {
            self.ask(time_ms, |_| true);
            return None;
        }
        self.next_ask(time_ms, |_| true);
        let positions = self.request_for(0);
        self.mark_sent(0, &positions);
        let group = &self.groups[0];
        let serving = self.serving(group.id, group.busy.clone(), group.states.clone());
        Some(InlineRead {
            req: Some(Request {
                seq: self.seq,
                time_ms,
                positions,
            }),
            serving,
        })
    }

    /// How thread `id` (or a caller reading inline for it) serves requests.
    fn serving(&self, id: usize, marker: Arc<Busy>, states: States<S>) -> Serving<S, R> {
        Serving {
            id,
            marker,
            states,
            replies: self.replies_tx.clone(),
            parts: self.parts.clone(),
            factory: self.factory.clone(),
            work: self.work.clone(),
        }
    }

    /// Sends group `g` the current ask for `positions` unless it is busy.
    fn send(&mut self, g: usize, positions: Vec<usize>) {
        let group = &mut self.groups[g];
        if positions.is_empty() || group.outstanding.is_some() || !group.alive {
            return;
        }
        let req = Request {
            seq: self.seq,
            time_ms: self.time_ms,
            positions: positions.clone(),
        };
        if group.tx.send(req).is_err() {
            // The thread ended (it never does unless the pool is broken): a new one is started
            // at the next ask.
            tracing::error!(
                "{}: the sampling thread for GPU positions {:?} ended; starting a new one",
                self.name,
                group.members
            );
            group.alive = false;
            group.restart = Some((0, Instant::now()));
            return;
        }
        self.mark_sent(g, &positions);
    }

    /// Books the request of the current ask for `positions` as sent to group `g`: they are
    /// awaited, and the group is busy until it has answered them.
    fn mark_sent(&mut self, g: usize, positions: &[usize]) {
        for p in positions {
            self.pending[*p] = true;
        }
        self.groups[g].outstanding = Some((self.seq, positions.len()));
    }

    /// Books the answers left and the ends of requests already sent, without waiting.
    fn drain_stale(&mut self) {
        self.drain_parts();
        while let Ok(r) = self.replies.try_recv() {
            self.drain_parts();
            self.handle(r);
        }
    }

    /// Books the answers the threads have left.
    fn drain_parts(&mut self) {
        let mut taken = std::mem::take(&mut self.booking);
        match self.parts.lock() {
            Ok(mut v) => std::mem::swap(&mut *v, &mut taken),
            Err(_) => return,
        }
        for r in taken.drain(..) {
            self.handle(r);
        }
        self.booking = taken;
    }

    /// Books a reply: an answer of the current ask is kept; a thread whose request is fully
    /// answered is free again (its end-of-request message only confirms it).
    fn handle(&mut self, r: Reply<R>) {
        if let Some(g) = self.groups.iter_mut().find(|g| g.id == r.group) {
            if let Some((seq, left)) = g.outstanding {
                if seq == r.seq {
                    let left = if r.part.is_some() {
                        left.saturating_sub(1)
                    } else {
                        0
                    };
                    g.outstanding = (left > 0).then_some((seq, left));
                }
            }
            // The end of a request of the current ask: what its GPUs did not answer (a read
            // that panicked) will not come; nothing more is waited for.
            if r.part.is_none() && r.seq == self.seq {
                for p in &g.members {
                    if let Some(x) = self.pending.get_mut(*p) {
                        *x = false;
                    }
                }
            }
        }
        if let Some((pos, out)) = r.part {
            if r.seq == self.seq && pos < self.n {
                self.pending[pos] = false;
                self.got[pos] = Some(out);
            }
        }
    }

    /// Collects answers of the current ask until all came or `deadline`; moves the GPUs after a
    /// call blocked longer than the split time to a new thread, asked at once. With `also_until`,
    /// keeps waiting (within the deadline) until that instant even when nothing is pending (the
    /// sampler waits for a blocked call to reach the stall timeout).
    pub(crate) fn collect(&mut self, deadline: Instant, also_until: Option<Instant>) {
        loop {
            self.drain_stale();
            self.split_blocked();
            let now = Instant::now();
            let waiting = self.pending.contains(&true);
            let hold = also_until.is_some_and(|t| t > now);
            if (!waiting && !hold) || now >= deadline {
                return;
            }
            let mut wake = deadline;
            if let Some(t) = also_until.filter(|t| *t > now) {
                wake = wake.min(t);
            }
            // A working thread that reads several GPUs is looked at again by the time a call it
            // is in (or starts now) would reach the split time.
            for g in &self.groups {
                if g.members.len() > 1 && g.outstanding.is_some() {
                    let d = g.busy.blocked(now).map_or(Duration::ZERO, |(_, d)| d);
                    wake = wake.min(now + self.split_after.saturating_sub(d));
                }
            }
            match self
                .replies
                .recv_timeout(wake.saturating_duration_since(now))
            {
                Ok(r) => self.handle(r),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// Splits every thread blocked longer than the split time in one GPU's call: the blocked
    /// thread keeps that GPU, a new thread takes the others and is asked for those still wanted.
    fn split_blocked(&mut self) {
        let now = Instant::now();
        let mut splits = Vec::new();
        for (g, group) in self.groups.iter().enumerate() {
            if group.members.len() < 2 {
                continue;
            }
            if let Some((_, d)) = group.busy.blocked(now) {
                if d >= self.split_after {
                    splits.push((g, group.busy.gpu()));
                }
            }
        }
        if !splits.is_empty() {
            self.calm_since = None;
            // a driver calm for an hour since the last rejoin starts from the first wait again
            if self
                .rejoined
                .is_some_and(|t| now.duration_since(t) >= REJOIN_MAX)
            {
                self.rejoin_after = REJOIN_FIRST;
            }
        }
        for (g, stuck) in splits {
            let others: Vec<usize> = self.groups[g]
                .members
                .iter()
                .copied()
                .filter(|p| *p != stuck)
                .collect();
            self.groups[g].members = vec![stuck];
            self.groups[g].busy.keep_only(stuck);
            tracing::debug!(
                "{}: GPU position {stuck} blocks; {} others move to a new thread",
                self.name,
                others.len()
            );
            let ask: Vec<usize> = others
                .iter()
                .copied()
                .filter(|p| self.wanted[*p] && self.got[*p].is_none())
                .collect();
            let new = self.spawn_group(others);
            let idx = self.groups.iter().position(|x| x.id == new).unwrap_or(0);
            self.send(idx, ask);
        }
    }

    /// The answer for GPU `pos` in the current ask, if it came.
    pub(crate) fn take(&mut self, pos: usize) -> Option<R> {
        let out = self.got.get_mut(pos).and_then(Option::take);
        if out.is_some() {
            // (an answer booked after its tick was collected is never taken: it does not count)
            self.answered[pos] = self.seq;
        }
        out
    }

    /// Whether an answer of the current ask is still awaited.
    pub(crate) fn waiting(&self) -> bool {
        self.pending.contains(&true)
    }

    /// The call GPU `pos` has been blocked in for at least `timeout`, if any (a GPU whose thread
    /// could not be started counts as blocked).
    pub(crate) fn stalled(
        &self,
        pos: usize,
        now: Instant,
        timeout: Duration,
    ) -> Option<NvmlFunction> {
        let g = self.groups.iter().find(|g| g.members.contains(&pos))?;
        if !g.alive {
            return Some(NvmlFunction::Unknown);
        }
        if g.busy.gpu() != pos {
            return None;
        }
        match g.busy.blocked(now) {
            Some((f, d)) if d >= timeout => Some(f),
            _ => None,
        }
    }

    /// When GPU `pos`'s current call (if it is in one) reaches `timeout`.
    pub(crate) fn stall_instant(&self, pos: usize, timeout: Duration) -> Option<Instant> {
        let g = self.groups.iter().find(|g| g.members.contains(&pos))?;
        if g.busy.gpu() != pos {
            return None;
        }
        let now = Instant::now();
        let (_, d) = g.busy.blocked(now)?;
        Some(now + timeout.saturating_sub(d))
    }

    /// Threads in the pool.
    #[cfg(test)]
    pub(crate) fn threads(&self) -> usize {
        self.groups.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPU 2 blocks from its second read on until released; the others answer at once.
    #[test]
    fn a_blocked_gpu_is_split_off_and_the_others_answer_in_the_same_tick() {
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Arc::new(std::sync::Mutex::new(release_rx));
        let factory: Factory<(usize, u32)> = Arc::new(|pos, _| (pos, 0));
        let work: Work<(usize, u32), (usize, u32)> = Arc::new(move |st, busy, _t| {
            st.1 += 1;
            if st.0 == 2 && st.1 == 2 {
                busy.around(NvmlFunction::PowerUsage, || {
                    let _ = release_rx.lock().map(|r| r.recv());
                });
            }
            *st
        });
        let mut pool = Pool::new("test", 4, Duration::from_millis(20), factory, work);
        let soon = || Instant::now() + Duration::from_secs(5);
        pool.ask(1, |_| true);
        pool.collect(soon(), None);
        assert_eq!(pool.threads(), 1);
        for p in 0..4 {
            assert_eq!(pool.take(p), Some((p, 1)));
        }
        // Second tick: GPU 2 blocks; 0 and 1 answered before, 3 moves to a new thread.
        pool.ask(2, |_| true);
        pool.collect(Instant::now() + Duration::from_millis(300), None);
        assert_eq!(pool.take(0), Some((0, 2)));
        assert_eq!(pool.take(1), Some((1, 2)));
        assert_eq!(pool.take(2), None);
        assert_eq!(
            pool.take(3).map(|a| a.0),
            Some(3),
            "asked again on the new thread"
        );
        assert_eq!(pool.threads(), 2);
        let t = Duration::from_millis(10);
        assert_eq!(
            pool.stalled(2, Instant::now(), t),
            Some(NvmlFunction::PowerUsage)
        );
        assert_eq!(pool.stalled(0, Instant::now(), t), None);
        // Third tick: the blocked thread gets nothing; the others answer.
        pool.ask(3, |_| true);
        pool.collect(soon(), None);
        assert!(pool.take(0).is_some() && pool.take(3).is_some());
        assert_eq!(pool.take(2), None);
        // Released: its late answer is discarded; then it answers for GPU 2 again.
        release_tx.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        pool.ask(4, |_| true);
        pool.collect(soon(), None);
        assert_eq!(pool.take(2), Some((2, 3)));
        assert!(pool.stalled(2, Instant::now(), Duration::ZERO).is_none());
        assert!(!pool.waiting());
    }

    /// An inline read answers as the thread would; when it blocks, whoever collects splits it
    /// off like a blocked thread (the others answer in the same tick, on a new thread), and once
    /// it returns the GPU is read by the pool's own first thread, not inline while the pool is
    /// split (until a rejoin: the next test).
    #[test]
    fn an_inline_read_answers_like_the_thread_and_is_split_off_when_it_blocks() {
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Arc::new(std::sync::Mutex::new(release_rx));
        let readers = Arc::new(Mutex::new(Vec::new()));
        let seen = readers.clone();
        let factory: Factory<(usize, u32)> = Arc::new(|pos, _| (pos, 0));
        let work: Work<(usize, u32), (usize, u32)> = Arc::new(move |st, busy, _t| {
            st.1 += 1;
            if let Ok(mut v) = seen.lock() {
                v.push((st.0, std::thread::current().name().map(str::to_string)));
            }
            if st.0 == 2 && st.1 == 2 {
                busy.around(NvmlFunction::PowerUsage, || {
                    let _ = release_rx.lock().map(|r| r.recv());
                });
            }
            *st
        });
        let mut pool = Pool::new("test", 4, Duration::from_millis(20), factory, work);
        let soon = || Instant::now() + Duration::from_secs(5);
        // First tick, inline on this thread: no thread of the pool reads.
        let read = pool
            .ask_inline(1)
            .expect("inline while the pool is as it started");
        read.run();
        pool.collect(soon(), None);
        for p in 0..4 {
            assert_eq!(pool.take(p), Some((p, 1)));
        }
        let me = std::thread::current().name().map(str::to_string);
        assert!(readers.lock().unwrap().iter().all(|(_, t)| *t == me));
        // Second tick: the inline read blocks on GPU 2 on another thread; collecting here
        // splits it off and GPU 3 is read on a new thread within the tick.
        let read = pool.ask_inline(2).expect("inline");
        let reader = std::thread::spawn(move || read.run());
        pool.collect(Instant::now() + Duration::from_millis(300), None);
        assert_eq!(pool.take(0), Some((0, 2)));
        assert_eq!(pool.take(1), Some((1, 2)));
        assert_eq!(pool.take(2), None);
        assert_eq!(pool.take(3).map(|a| a.0), Some(3));
        assert_eq!(pool.threads(), 2);
        let t = Duration::from_millis(10);
        assert_eq!(
            pool.stalled(2, Instant::now(), t),
            Some(NvmlFunction::PowerUsage)
        );
        // Split: not inline.
        assert!(pool.ask_inline(3).is_none(), "the threads were asked");
        pool.collect(soon(), None);
        assert!(pool.take(0).is_some() && pool.take(3).is_some());
        assert_eq!(pool.take(2), None);
        // Released: the reader ends without reading GPU 3 (it moved), and GPU 2 is then read
        // by the pool's first thread with the state the inline reads left.
        release_tx.send(()).unwrap();
        reader.join().unwrap();
        pool.ask(4, |_| true);
        pool.collect(soon(), None);
        assert_eq!(pool.take(2), Some((2, 3)));
        let reads = readers.lock().unwrap().clone();
        assert_eq!(
            reads.iter().filter(|(p, _)| *p == 3).count(),
            4,
            "{reads:?}"
        );
        let last2 = reads.iter().rev().find(|(p, _)| *p == 2).unwrap();
        assert_eq!(last2.1.as_deref(), Some("test-0"));
    }

    /// A split is undone once every thread has answered every ask for the rejoin wait: the
    /// GPUs rejoin the thread that read the most, the pool reads inline again, the GPU that
    /// moved starts from a fresh state, and the next rejoin waits twice as long. A thread still
    /// blocked holds the rejoin off.
    #[test]
    fn a_split_pool_rejoins_one_thread_once_every_thread_answers_again() {
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Arc::new(std::sync::Mutex::new(release_rx));
        let blocked = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let factory: Factory<(usize, u32)> = Arc::new(|pos, _| (pos, 0));
        let work: Work<(usize, u32), (usize, u32)> = Arc::new(move |st, busy, _t| {
            st.1 += 1;
            if st.0 == 2 && st.1 == 2 && !blocked.swap(true, Ordering::SeqCst) {
                busy.around(NvmlFunction::PowerUsage, || {
                    let _ = release_rx.lock().map(|r| r.recv());
                });
            }
            *st
        });
        let mut pool = Pool::new("test", 4, Duration::from_millis(20), factory, work);
        pool.rejoin_after = Duration::from_millis(200);
        let soon = || Instant::now() + Duration::from_secs(5);
        let mut tick = 0;
        let mut ask = |pool: &mut Pool<(usize, u32), (usize, u32)>, budget: Duration| {
            tick += 1;
            pool.ask(tick, |_| true);
            pool.collect(Instant::now() + budget, None);
            (0..4).map(|p| pool.take(p)).collect::<Vec<_>>()
        };
        ask(&mut pool, Duration::from_secs(5));
        ask(&mut pool, Duration::from_millis(300));
        assert_eq!(pool.threads(), 2, "GPU 2 split off");
        // Still blocked: no rejoin however long.
        std::thread::sleep(Duration::from_millis(250));
        ask(&mut pool, Duration::from_millis(50));
        std::thread::sleep(Duration::from_millis(250));
        let got = ask(&mut pool, Duration::from_millis(50));
        assert_eq!(pool.threads(), 2);
        assert_eq!(got[2], None);
        // Released: calm from the next ask on; not before the wait.
        release_tx.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(150));
        let got = ask(&mut pool, Duration::from_secs(5));
        assert_eq!(got[2], Some((2, 3)), "read again on its own thread");
        assert_eq!(pool.threads(), 2, "not before the calm wait");
        std::thread::sleep(Duration::from_millis(250));
        let got = ask(&mut pool, Duration::from_secs(5));
        assert_eq!(pool.threads(), 1, "rejoined");
        assert_eq!(got[2], Some((2, 1)), "the GPU that moved starts afresh");
        assert!(got.iter().all(Option::is_some), "{got:?}");
        assert_eq!(pool.rejoin_after, Duration::from_millis(400));
        // As it started: inline again, answering for every GPU.
        let read = pool.ask_inline(99).expect("inline after the rejoin");
        read.run();
        pool.collect(soon(), None);
        assert!((0..4).all(|p| pool.take(p).is_some()));
    }

    /// An inline read dropped without being run leaves no request outstanding: the next ask
    /// reads every GPU.
    #[test]
    fn an_inline_read_dropped_unrun_blocks_nothing() {
        let factory: Factory<(usize, u32)> = Arc::new(|pos, _| (pos, 0));
        let work: Work<(usize, u32), (usize, u32)> = Arc::new(|st, _, _| {
            st.1 += 1;
            *st
        });
        let mut pool = Pool::new("test", 2, Duration::from_millis(20), factory, work);
        drop(pool.ask_inline(1));
        pool.collect(Instant::now() + Duration::from_secs(1), None);
        assert!(!pool.waiting());
        let read = pool.ask_inline(2).expect("inline again");
        read.run();
        pool.collect(Instant::now() + Duration::from_secs(5), None);
        assert_eq!(pool.take(0), Some((0, 1)));
        assert_eq!(pool.take(1), Some((1, 1)));
    }

    /// Reads slower than a tick's budget (each call under the split time, so nothing is split
    /// off) rotate over the GPUs: every GPU answers within a few ticks, not only the first ones.
    #[test]
    fn reads_slower_than_a_tick_reach_every_gpu_in_turn() {
        let factory: Factory<usize> = Arc::new(|pos, _| pos);
        let work: Work<usize, usize> = Arc::new(|st, busy, _t| {
            busy.around(NvmlFunction::PowerUsage, || {
                std::thread::sleep(Duration::from_millis(15));
            });
            *st
        });
        let mut pool = Pool::new("test", 6, Duration::from_millis(500), factory, work);
        let mut seen = [0u32; 6];
        for tick in 1..=12 {
            pool.ask(tick, |_| true);
            pool.collect(Instant::now() + Duration::from_millis(40), None);
            for (p, n) in seen.iter_mut().enumerate() {
                if pool.take(p).is_some() {
                    *n += 1;
                }
            }
            // the rest of the request ends before the next tick
            std::thread::sleep(Duration::from_millis(80));
        }
        assert!(seen.iter().all(|n| *n >= 2), "answers per GPU: {seen:?}");
        assert_eq!(pool.threads(), 1);
    }

    /// After a split, the blocked thread does not read the GPUs that moved to another thread
    /// once its call returns (it was still inside the request that listed them).
    #[test]
    fn a_split_thread_does_not_read_the_gpus_it_gave_away() {
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Arc::new(std::sync::Mutex::new(release_rx));
        let reads: Arc<Vec<AtomicU64>> = Arc::new((0..4).map(|_| AtomicU64::new(0)).collect());
        let counted = reads.clone();
        let factory: Factory<(usize, u32)> = Arc::new(|pos, _| (pos, 0));
        let work: Work<(usize, u32), usize> = Arc::new(move |st, busy, _t| {
            st.1 += 1;
            counted[st.0].fetch_add(1, Ordering::SeqCst);
            if st.0 == 1 && st.1 == 2 {
                busy.around(NvmlFunction::PowerUsage, || {
                    let _ = release_rx.lock().map(|r| r.recv());
                });
            }
            st.0
        });
        let mut pool = Pool::new("test", 4, Duration::from_millis(20), factory, work);
        pool.ask(1, |_| true);
        pool.collect(Instant::now() + Duration::from_secs(5), None);
        pool.ask(2, |_| true);
        pool.collect(Instant::now() + Duration::from_millis(300), None);
        assert_eq!(pool.threads(), 2);
        release_tx.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        for (pos, n) in reads.iter().enumerate() {
            assert_eq!(
                n.load(Ordering::SeqCst),
                2,
                "GPU position {pos} read twice, once a tick"
            );
        }
    }

    /// Issue 25 §11: a thread that cannot be started (EAGAIN) leaves its GPUs stalled only until
    /// a later try starts it, after the wait; before, they stayed unread for ever.
    #[test]
    fn a_thread_that_cannot_be_started_is_started_later() {
        let factory: Factory<(usize, u32)> = Arc::new(|pos, _| (pos, 0));
        let work: Work<(usize, u32), (usize, u32)> = Arc::new(|st, _, _| {
            st.1 += 1;
            *st
        });
        // The start in `new` and the first new try fail.
        FAILING_STARTS.with(|n| n.set(2));
        let mut pool = Pool::new("test", 2, Duration::from_millis(20), factory, work);
        // Waits of 200 ms, 400 ms, … rather than 1 s, 2 s, … (the first was set in `new`).
        pool.restart_after = Duration::from_millis(200);
        pool.groups[0].restart = Some((1, Instant::now() + pool.restart_after));
        let soon = || Instant::now() + Duration::from_millis(100);
        let answers = |pool: &mut Pool<_, _>| -> Vec<Option<(usize, u32)>> {
            (0..2).map(|p| pool.take(p)).collect()
        };
        pool.ask(1, |_| true);
        pool.collect(soon(), None);
        assert_eq!(answers(&mut pool), [None, None]);
        let stalled = pool.stalled(0, Instant::now(), Duration::from_secs(3600));
        assert_eq!(stalled, Some(NvmlFunction::Unknown), "said stalled");
        // Not tried again before the wait.
        assert_eq!(FAILING_STARTS.with(std::cell::Cell::get), 1);
        std::thread::sleep(Duration::from_millis(250));
        pool.ask(2, |_| true);
        pool.collect(soon(), None);
        assert_eq!(answers(&mut pool), [None, None], "the second try fails too");
        assert_eq!(FAILING_STARTS.with(std::cell::Cell::get), 0);
        // The wait doubles: 400 ms after the second failure.
        pool.ask(3, |_| true);
        pool.collect(soon(), None);
        assert_eq!(answers(&mut pool), [None, None], "before the doubled wait");
        std::thread::sleep(Duration::from_millis(450));
        pool.ask(4, |_| true);
        pool.collect(Instant::now() + Duration::from_secs(5), None);
        assert_eq!(answers(&mut pool), [Some((0, 1)), Some((1, 1))]);
        assert_eq!(pool.stalled(0, Instant::now(), Duration::ZERO), None);
        assert_eq!(pool.threads(), 1);
    }

    #[test]
    fn the_wait_between_tries_doubles_up_to_a_minute() {
        let factory: Factory<u32> = Arc::new(|_, _| 0);
        let work: Work<u32, u32> = Arc::new(|_, _, _| 0);
        let pool = Pool::new("test", 0, Duration::from_millis(20), factory, work);
        let waits: Vec<u64> = [1, 2, 3, 6, 7, 40]
            .iter()
            .map(|k| pool.restart_wait(*k).as_secs())
            .collect();
        assert_eq!(waits, [1, 2, 4, 32, 60, 60]);
    }

    /// A read that panics loses its GPU's answer at that tick and its state, not the thread:
    /// the other GPUs answer, and the GPU is read afresh at the next tick.
    #[test]
    fn a_panicking_read_costs_one_answer() {
        let factory: Factory<(usize, u32)> = Arc::new(|pos, _| (pos, 0));
        let work: Work<(usize, u32), (usize, u32)> = Arc::new(|st, _, _| {
            st.1 += 1;
            assert!(!(st.0 == 1 && st.1 == 2), "odd driver data");
            *st
        });
        let mut pool = Pool::new("test", 3, Duration::from_millis(20), factory, work);
        let soon = || Instant::now() + Duration::from_secs(5);
        for tick in 1..=3 {
            pool.ask(tick, |_| true);
            pool.collect(soon(), None);
            let got: Vec<Option<(usize, u32)>> = (0..3).map(|p| pool.take(p)).collect();
            match tick {
                2 => assert_eq!(got, [Some((0, 2)), None, Some((2, 2))]),
                3 => assert_eq!(
                    got,
                    [Some((0, 3)), Some((1, 1)), Some((2, 3))],
                    "fresh state"
                ),
                _ => assert!(got.iter().all(Option::is_some)),
            }
        }
        assert_eq!(pool.threads(), 1);
    }
}
