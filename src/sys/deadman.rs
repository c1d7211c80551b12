//! A one-shot timer that wakes a waiting thread only when it expires: armed before work that
//! may block for ever and disarmed after it, it costs the worker two system calls and the
//! waiting thread no wake-up at all while the work ends in time (a `timerfd`).
//!
//! Made [`Deadman::nonblocking`], it is a descriptor an event loop waits on
//! (`tokio::io::unix::AsyncFd`): the notification worker sleeps until its next due time on one,
//! woken once at the time, where tokio's timer wheel wakes a thread at every level it moves a
//! long sleep down (a 10 s sleep costs three wake-ups).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// See the module docs.
#[derive(Debug)]
pub struct Deadman {
    fd: OwnedFd,
}

impl Deadman {
    /// A disarmed timer on the monotonic clock.
    pub fn new() -> std::io::Result<Deadman> {
        Self::with_flags(libc::TFD_CLOEXEC)
    }

    /// A disarmed timer whose reads never block: for an event loop to wait on (see
    /// [`Deadman::expired`]).
    pub fn nonblocking() -> std::io::Result<Deadman> {
        Self::with_flags(libc::TFD_CLOEXEC | libc::TFD_NONBLOCK)
    }

    fn with_flags(flags: libc::c_int) -> std::io::Result<Deadman> {
        // SAFETY: timerfd_create takes a clock id and flags and returns a new descriptor or -1.
        let raw = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, flags) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor just returned to us and owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Deadman { fd })
    }

    /// Makes the timer expire `after` from now (at least a nanosecond); replaces any earlier
    /// setting.
    pub fn arm(&self, after: Duration) {
        let after = after.max(Duration::from_nanos(1));
        self.set(libc::timespec {
            tv_sec: libc::time_t::try_from(after.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: libc::c_long::from(after.subsec_nanos()),
        });
    }

    /// Stops the timer; an expiry not yet waited for is cleared too.
    pub fn disarm(&self) {
        self.set(libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        });
    }

    fn set(&self, value: libc::timespec) {
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: value,
        };
        // SAFETY: a descriptor we own and a valid itimerspec; the old value is not asked for.
        let rc =
            unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if rc != 0 {
            tracing::error!(
                "cannot set a timer (timerfd_settime): {}",
                std::io::Error::last_os_error()
            );
        }
    }

    /// Whether the timer expired since it was last armed or found expired (a timer made
    /// [`Deadman::nonblocking`]; one made with [`Deadman::new`] blocks here until it expires).
    pub fn expired(&self) -> bool {
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into `buf` from a descriptor we own.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        n == 8
    }

    /// Blocks until the timer expires (at once if it expired since the last wait). False when
    /// the descriptor fails.
    pub fn wait(&self) -> bool {
        let mut buf = [0u8; 8];
        loop {
            // SAFETY: reads at most 8 bytes into `buf` from a descriptor we own.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n == 8 {
                return true;
            }
            if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return false;
        }
    }
}

impl AsRawFd for Deadman {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_disarmed_timer_does_not_wake_and_an_armed_one_does() {
        let d = std::sync::Arc::new(Deadman::new().unwrap());
        d.arm(Duration::from_millis(30));
        d.disarm();
        let waiter = d.clone();
        let t0 = Instant::now();
        let h = std::thread::spawn(move || waiter.wait());
        std::thread::sleep(Duration::from_millis(80));
        assert!(!h.is_finished(), "disarmed: no expiry");
        d.arm(Duration::from_millis(10));
        assert!(h.join().unwrap());
        assert!(t0.elapsed() >= Duration::from_millis(80));
    }

    #[test]
    fn a_nonblocking_timer_says_whether_it_expired() {
        let d = Deadman::nonblocking().unwrap();
        assert!(!d.expired(), "never armed");
        d.arm(Duration::from_secs(30));
        assert!(!d.expired(), "not yet");
        d.arm(Duration::from_millis(20));
        std::thread::sleep(Duration::from_millis(40));
        assert!(d.expired());
        assert!(!d.expired(), "told once");
        d.arm(Duration::from_millis(10));
        std::thread::sleep(Duration::from_millis(30));
        d.arm(Duration::from_secs(60));
        assert!(!d.expired(), "armed again: an expiry before is forgotten");
    }
}
