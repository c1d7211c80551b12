//! Per-GPU worker threads: every NVML call on a device runs on a thread of its own, so a call
//! that blocks — 20 ms for `nvmlDeviceGetPcieThroughput`, for ever in a wedged driver — delays
//! only that device's answer. The sampler sends each worker a request per tick and waits for the
//! answers until the tick's deadline; a worker that is still inside a call when the sampler
//! looks shows, through its [`Busy`] marker, which function and since when.
//!
//! A thread blocked inside the driver cannot be cancelled. It is left where it is: while its
//! call has not returned the sampler sends it nothing (no backlog builds up), reports the device
//! as stalled, and keeps sampling the others; when the call returns, the worker answers its old
//! request (discarded as stale) and takes requests again.

use std::sync::atomic::{AtomicI64, AtomicU8, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::model::NvmlFunction;

/// Stack size of a worker thread (they only call NVML and fill small structs).
const STACK_BYTES: usize = 256 * 1024;

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn micros_since_epoch(t: Instant) -> i64 {
    i64::try_from(t.saturating_duration_since(epoch()).as_micros()).unwrap_or(i64::MAX)
}

/// Which NVML function a worker is inside, and since when; shared with the sampler.
#[derive(Debug, Default)]
pub(crate) struct Busy {
    /// 0 = not in a call, else 1 + the function's position in [`NvmlFunction::ALL`].
    call: AtomicU8,
    /// When the call started, µs since the process's sampler epoch.
    since_us: AtomicI64,
}

impl Busy {
    /// Marks the start of a call to `f`.
    pub(crate) fn enter(&self, f: NvmlFunction) {
        let code = NvmlFunction::ALL
            .iter()
            .position(|g| *g == f)
            .map_or(u8::MAX, |i| u8::try_from(i + 1).unwrap_or(u8::MAX));
        self.since_us
            .store(micros_since_epoch(Instant::now()), Ordering::Release);
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

    /// The function the worker is inside at `now` and for how long, if any.
    pub(crate) fn blocked(&self, now: Instant) -> Option<(NvmlFunction, Duration)> {
        let code = self.call.load(Ordering::Acquire);
        if code == 0 {
            return None;
        }
        let since = self.since_us.load(Ordering::Acquire);
        let for_us = micros_since_epoch(now).saturating_sub(since).max(0);
        let f = NvmlFunction::ALL
            .get(usize::from(code) - 1)
            .copied()
            .unwrap_or(NvmlFunction::Unknown);
        Some((f, Duration::from_micros(u64::try_from(for_us).unwrap_or(0))))
    }
}

/// One request: its sequence number and the tick time it is for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request {
    pub seq: u64,
    pub time_ms: i64,
}

/// A worker thread owning state `S` (a device's slot) and answering requests with `R`.
pub(crate) struct Worker<R> {
    tx: mpsc::Sender<Request>,
    rx: mpsc::Receiver<(u64, R)>,
    busy: Arc<Busy>,
    /// The request sent and not yet answered, with when it was sent.
    outstanding: Option<(u64, Instant)>,
    next_seq: u64,
    /// Whether the thread exists (spawning can fail; the device then shows as stalled).
    alive: bool,
}

impl<R: Send + 'static> Worker<R> {
    /// Starts a thread named `name` that owns `state` and answers each request with
    /// `work(&mut state, &busy, request)`.
    pub(crate) fn spawn<S: Send + 'static>(
        name: String,
        mut state: S,
        busy: Arc<Busy>,
        mut work: impl FnMut(&mut S, &Busy, Request) -> R + Send + 'static,
    ) -> Worker<R> {
        let (tx, req_rx) = mpsc::channel::<Request>();
        let (reply_tx, rx) = mpsc::channel();
        let marker = busy.clone();
        let spawned = std::thread::Builder::new()
            .name(name)
            .stack_size(STACK_BYTES)
            .spawn(move || {
                while let Ok(req) = req_rx.recv() {
                    let out = work(&mut state, &marker, req);
                    if reply_tx.send((req.seq, out)).is_err() {
                        break;
                    }
                }
            });
        let alive = match spawned {
            Ok(_) => true,
            Err(e) => {
                tracing::error!("cannot start a sampling thread: {e}");
                false
            }
        };
        Worker {
            tx,
            rx,
            busy,
            outstanding: None,
            next_seq: 0,
            alive,
        }
    }

    /// Sends a request for `time_ms` unless the previous one is still unanswered (a worker
    /// blocked in a call gets no backlog). True when sent.
    pub(crate) fn request(&mut self, time_ms: i64) -> bool {
        self.collect_stale();
        if self.outstanding.is_some() || !self.alive {
            return false;
        }
        self.next_seq += 1;
        let req = Request {
            seq: self.next_seq,
            time_ms,
        };
        if self.tx.send(req).is_err() {
            self.alive = false;
            return false;
        }
        self.outstanding = Some((req.seq, Instant::now()));
        true
    }

    /// Takes answers to requests already given up on (their values are too old to use).
    fn collect_stale(&mut self) {
        while self.outstanding.is_some() {
            match self.rx.try_recv() {
                Ok((seq, _)) => {
                    if self.outstanding.is_some_and(|(s, _)| s == seq) {
                        self.outstanding = None;
                    }
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    self.alive = false;
                    self.outstanding = None;
                }
            }
        }
    }

    /// Waits until `deadline` for the answer to the outstanding request.
    pub(crate) fn wait(&mut self, deadline: Instant) -> Option<R> {
        let (seq, _) = self.outstanding?;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok((s, out)) if s == seq => {
                    self.outstanding = None;
                    return Some(out);
                }
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => return None,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    self.alive = false;
                    self.outstanding = None;
                    return None;
                }
            }
        }
    }

    /// Takes the answer to the outstanding request if it is there, without waiting.
    pub(crate) fn try_take(&mut self) -> Option<R> {
        self.wait(Instant::now())
    }

    /// Whether a request is unanswered.
    pub(crate) fn pending(&self) -> bool {
        self.outstanding.is_some()
    }

    /// The call the worker has been blocked in for at least `timeout` at `now`, if any. A worker
    /// that could not be started counts as blocked from the start.
    pub(crate) fn stalled(&self, now: Instant, timeout: Duration) -> Option<NvmlFunction> {
        if !self.alive {
            return Some(NvmlFunction::Unknown);
        }
        match self.busy.blocked(now) {
            Some((f, d)) if d >= timeout => Some(f),
            _ => None,
        }
    }

    /// When the current call (if any) reaches `timeout`.
    pub(crate) fn stall_instant(&self, timeout: Duration) -> Option<Instant> {
        let now = Instant::now();
        let (_, d) = self.busy.blocked(now)?;
        Some(now + timeout.saturating_sub(d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_worker_is_seen_blocked_and_gets_no_backlog() {
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = std::sync::Mutex::new(release_rx);
        let mut w = Worker::spawn(
            "test-worker".into(),
            0u32,
            Arc::new(Busy::default()),
            move |n: &mut u32, busy, req| {
                *n += 1;
                if req.time_ms == 2 {
                    busy.around(NvmlFunction::PowerUsage, || {
                        let _ = release_rx.lock().map(|r| r.recv());
                    });
                }
                *n
            },
        );
        let soon = || Instant::now() + Duration::from_secs(5);
        assert!(w.request(1));
        assert_eq!(w.wait(soon()), Some(1));
        assert!(w.request(2));
        assert_eq!(w.wait(Instant::now() + Duration::from_millis(50)), None);
        assert!(!w.request(3), "no request while one is unanswered");
        std::thread::sleep(Duration::from_millis(20));
        let blocked = w.stalled(Instant::now(), Duration::from_millis(10));
        assert_eq!(blocked, Some(NvmlFunction::PowerUsage));
        assert!(w.stalled(Instant::now(), Duration::from_secs(60)).is_none());
        release_tx.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        // The late answer is discarded; the worker takes requests again.
        assert!(w.request(4));
        assert_eq!(w.wait(soon()), Some(3));
        assert!(w.stalled(Instant::now(), Duration::ZERO).is_none());
    }
}
