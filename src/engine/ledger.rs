//! The XID ledger: every XID of the last week on every GPU, persisted with the alert state so it
//! survives restarts and reboots. It answers the two questions fleet tools (NVSentinel's health
//! events analyzer, gpud) ask of a new XID: has this GPU had this code before (the same code on
//! the same GPU again points at the hardware; five fatal ones in a day: call support), and did
//! other GPUs report it at the same time (the same code on several GPUs at once points at the
//! application or the node, not one board)?
//!
//! Pure data: the engine records each XID of a snapshot at its time and puts the answer into the
//! GPU's history ([`XidNote::repeats`], [`XidNote::gpus`]) for the rules to read.

use std::collections::VecDeque;

use crate::model::{LedgerEntry, XidEvent, XidNote};

/// How long the ledger keeps entries.
pub const RETENTION_MS: i64 = 7 * 24 * 3600 * 1000;
/// The window in which the same code on the same GPU counts as a repeat.
pub const REPEAT_WINDOW_MS: i64 = 24 * 3600 * 1000;
/// At most this many entries are kept (oldest dropped first).
pub const MAX_ENTRIES: usize = 4096;

/// The burst window in which the same code on several GPUs is one incident: 15 s for XID 13
/// (graphics engine exceptions come in bursts from one bad kernel), 3 minutes otherwise.
pub fn burst_window_ms(code: u64) -> i64 {
    if code == 13 {
        15_000
    } else {
        180_000
    }
}

/// The ledger, oldest entry first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct XidLedger {
    entries: VecDeque<LedgerEntry>,
}

impl XidLedger {
    /// A ledger holding `entries` (from the state file), sorted by time.
    pub fn from_entries(entries: &[LedgerEntry]) -> XidLedger {
        let mut v: Vec<LedgerEntry> = entries.to_vec();
        v.sort_by_key(|e| e.time_ms);
        XidLedger {
            entries: v.into_iter().collect(),
        }
    }

    /// The entries to persist.
    pub fn entries(&self) -> Vec<LedgerEntry> {
        self.entries.iter().cloned().collect()
    }

    /// Records `x` (unless the ledger already has it: a restart replaying carried XIDs) and
    /// returns its note: how often this GPU had the code in the repeat window and how many GPUs
    /// reported it in the burst window, both counting this one.
    pub fn record(&mut self, x: &XidEvent) -> XidNote {
        let known = self
            .entries
            .iter()
            .rev()
            .any(|e| e.time_ms == x.time_ms && e.code == x.xid && e.uuid == x.gpu_uuid);
        if !known {
            let pos = self.entries.partition_point(|e| e.time_ms <= x.time_ms);
            self.entries.insert(
                pos,
                LedgerEntry {
                    uuid: x.gpu_uuid.clone(),
                    gpu: x.gpu_index,
                    time_ms: x.time_ms,
                    code: x.xid,
                    pid: x.pid,
                },
            );
        }
        let cutoff = x.time_ms - RETENTION_MS;
        while self.entries.front().is_some_and(|e| e.time_ms < cutoff) {
            self.entries.pop_front();
        }
        while self.entries.len() > MAX_ENTRIES {
            self.entries.pop_front();
        }
        let same_gpu = |e: &LedgerEntry| {
            if x.gpu_uuid.is_empty() {
                e.gpu == x.gpu_index
            } else {
                e.uuid == x.gpu_uuid
            }
        };
        // Repeats are incidents: reports closer together than the burst window are one.
        let burst = burst_window_ms(x.xid);
        let mut repeats = 0usize;
        let mut last_counted: Option<i64> = None;
        for e in self.entries.iter().filter(|e| {
            e.code == x.xid
                && same_gpu(e)
                && e.time_ms <= x.time_ms
                && x.time_ms - e.time_ms < REPEAT_WINDOW_MS
        }) {
            if last_counted.is_none_or(|t| e.time_ms - t > burst) {
                repeats += 1;
                last_counted = Some(e.time_ms);
            }
        }
        let mut gpus: Vec<(&str, u32)> = Vec::new();
        for e in self
            .entries
            .iter()
            .filter(|e| e.code == x.xid && (e.time_ms - x.time_ms).abs() <= burst)
        {
            if !gpus.contains(&(e.uuid.as_str(), e.gpu)) {
                gpus.push((e.uuid.as_str(), e.gpu));
            }
        }
        XidNote {
            pid: x.pid,
            process: x.process.clone(),
            detail: x.detail.clone(),
            repeats: u32::try_from(repeats).unwrap_or(u32::MAX).max(1),
            gpus: u32::try_from(gpus.len()).unwrap_or(u32::MAX).max(1),
            ..XidNote::new(x.time_ms, x.xid)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(t_s: i64, gpu: u32, code: u64) -> XidEvent {
        XidEvent::new(t_s * 1000, gpu, format!("GPU-{gpu}"), code)
    }

    #[test]
    fn repeats_on_one_gpu_and_bursts_across_gpus() {
        let mut l = XidLedger::default();
        assert_eq!(l.record(&ev(0, 0, 31)).repeats, 1);
        // Again on the same GPU an hour later: a repeat, on one GPU.
        let n = l.record(&ev(3600, 0, 31));
        assert_eq!((n.repeats, n.gpus), (2, 1));
        // The same code on GPU 1 a minute later: two GPUs in the burst window.
        let n = l.record(&ev(3660, 1, 31));
        assert_eq!((n.repeats, n.gpus), (1, 2));
        // Reports within the burst window are one incident, not repeats.
        assert_eq!(l.record(&ev(3700, 0, 31)).repeats, 2);
        // XID 13's burst window is 15 s.
        l.record(&ev(10_000, 2, 13));
        assert_eq!(l.record(&ev(10_020, 3, 13)).gpus, 1);
        // A day later the first ones no longer count as repeats.
        assert_eq!(l.record(&ev(3600 + 86_400, 0, 31)).repeats, 1);
        // Recording the same event twice (a restart) does not count it twice.
        let again = l.record(&ev(3600 + 86_400, 0, 31));
        assert_eq!(again.repeats, 1);
    }

    #[test]
    fn survives_a_round_trip_and_forgets_after_a_week() {
        let mut l = XidLedger::default();
        l.record(&ev(0, 0, 79));
        let back = XidLedger::from_entries(&l.entries());
        assert_eq!(back, l);
        let mut back = back;
        let n = back.record(&ev(60, 0, 79));
        assert_eq!(n.repeats, 2);
        back.record(&ev(8 * 86_400, 0, 79));
        assert_eq!(back.entries().len(), 1);
    }
}
