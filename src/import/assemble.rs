//! Readings to snapshots: which rows make one tick, in time order, whatever order the file had.
//!
//! * A tick is one sampling instant: rows that share a timestamp (gpuwatch), a burst of one row
//!   per GPU a few milliseconds apart (nvidia-smi writes each GPU in turn), one table, one dmon
//!   round, one script instant. A keyed row (GPU index, UUID or bus id) joins the newest tick
//!   that lacks its GPU and started less than half an interval before it; a row for a GPU the
//!   tick already has starts a new tick. A positional row (a log with no GPU column) is GPU
//!   *n* of its burst: bursts are split by a pause of more than [`BURST_GAP_MS`], every
//!   `--gpus N` rows, and at the latest after [`BURST_MAX_MS`] or [`BURST_MAX_ROWS`] rows (a
//!   log sampled every few milliseconds has no pauses at all).
//! * Several writers appending to one file put rows out of time order. Ticks stay open for
//!   [`REORDER_MS`] of log time (at most [`MAX_OPEN`] of them): a late row joins or starts the
//!   tick where it belongs. A row older than everything still open starts a new *segment* (its
//!   own time line; `replay` restarts the rules there) instead of rewriting what was emitted.
//! * The same GPU at the same time again (a duplicated line, a header-less re-append) is dropped.
//! * Nothing fills gaps: a missing tick stays missing.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::{Imported, Key, Reading};
use crate::model::{ProcSample, Snapshot, XidEvent};

/// Rows of a positional burst are at most this far apart.
pub const BURST_GAP_MS: i64 = 50;
/// A positional burst lasts at most this long from its first row...
pub const BURST_MAX_MS: i64 = 1_000;
/// ... and holds at most this many rows (GPUs).
pub const BURST_MAX_ROWS: usize = 1024;
/// How long (log time) a tick stays open for late rows.
pub const REORDER_MS: i64 = 60_000;
/// At most this many ticks stay open (bounds memory on fast logs).
pub const MAX_OPEN: usize = 1024;

/// A row's process list in an emitted tick: GPU index, GPU UUID, the list.
type RowProcs = (u32, String, Arc<Vec<ProcSample>>);

struct Tick {
    time_ms: i64,
    last_row_ms: i64,
    rows: Vec<Reading>,
    closed: bool,
}

/// The most rows a new tick is given room for: a box's GPUs, with room to spare (an open tick
/// reserves it whatever it ends up holding, and up to [`MAX_OPEN`] ticks are open).
const ROOM_MAX: usize = 16;

impl Tick {
    /// A tick of `r` and room for `rows` rows, at most [`ROOM_MAX`] (rows are large: a
    /// vector grown from one row copies them at 2, 4, 8, …; a larger tick still grows).
    fn new(r: Reading, rows: usize) -> Tick {
        let time_ms = r.time_ms;
        let mut v = Vec::with_capacity(rows.clamp(1, ROOM_MAX));
        v.push(r);
        Tick {
            time_ms,
            last_row_ms: time_ms,
            rows: v,
            closed: false,
        }
    }

    fn has(&self, index: u32) -> Option<&Reading> {
        self.rows.iter().find(|x| x.sample.id.index == index)
    }
}

/// What the assembler did besides making ticks.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AssembleStats {
    /// Rows dropped because the same GPU at the same time was already there.
    pub duplicates: u64,
    /// Rows that arrived after a later tick had started.
    pub reordered: u64,
    /// Times a row older than every open tick started a new segment.
    pub new_segments: u64,
    /// MIG rows (`GPU/GI/CI`) whose GPU has no row at their time: dropped.
    pub orphan_mig: u64,
}

/// Groups readings into ticks (see the module docs).
pub struct Assembler {
    open: VecDeque<Tick>,
    ready: VecDeque<Imported>,
    segment: u32,
    /// The time of the last tick emitted in this segment.
    emitted_ms: Option<i64>,
    /// Time between the two newest ticks started in order.
    interval_ms: Option<i64>,
    gpus: Option<u32>,
    named: HashMap<String, u32>,
    /// Per GPU index, the process list of its last row in file order (see
    /// [`Reading::procs_same`]).
    last_procs: HashMap<u32, Arc<Vec<ProcSample>>>,
    /// The process lists of the last tick emitted, by row (index, UUID), and its segment: a tick
    /// whose rows list the same is emitted with `processes: None` ("unchanged", as the sampler
    /// says it), so nothing copies or compares eight lists every second.
    emitted_procs: (Vec<RowProcs>, Option<u32>),
    /// Rows of the last tick emitted: the room a new tick is given.
    rows_hint: usize,
    pub stats: AssembleStats,
}

impl Assembler {
    /// `gpus`: rows per positional burst (`--gpus N`).
    pub fn new(gpus: Option<u32>) -> Assembler {
        Assembler {
            open: VecDeque::new(),
            ready: VecDeque::new(),
            segment: 0,
            emitted_ms: None,
            interval_ms: None,
            gpus,
            named: HashMap::new(),
            last_procs: HashMap::new(),
            emitted_procs: (Vec::new(), None),
            rows_hint: 1,
            stats: AssembleStats::default(),
        }
    }

    /// Half an interval once the interval is known, else a minute.
    fn join_window(&self) -> i64 {
        self.interval_ms
            .map_or(60_000, |iv| (iv / 2).clamp(1, 60_000))
    }

    /// Takes one row.
    pub fn push(&mut self, mut r: Reading) {
        match std::mem::replace(&mut r.key, Key::Index) {
            Key::Index => self.share_procs(&mut r),
            Key::Named(name) => {
                let next = u32::try_from(self.named.len()).unwrap_or(u32::MAX);
                r.sample.id.index = *self.named.entry(name).or_insert(next);
            }
            Key::Position => return self.push_positional(r),
            Key::Mig => return self.push_mig(r),
        }
        self.push_keyed(r);
        self.flush(false);
    }

    /// Resolves an indexed row's process list in file order: a new list becomes its GPU's last,
    /// a list "as before" is that last one (before the row can join a tick, or be dropped).
    fn share_procs(&mut self, r: &mut Reading) {
        let index = r.sample.id.index;
        if r.procs_same {
            r.procs_shared = self.last_procs.get(&index).cloned();
        } else if let Some(list) = r.procs.take() {
            let list = Arc::new(list);
            self.last_procs.insert(index, Arc::clone(&list));
            r.procs_shared = Some(list);
        }
    }

    fn push_positional(&mut self, mut r: Reading) {
        let gpus = self.gpus;
        let full = move |t: &Tick| {
            t.rows.len() >= BURST_MAX_ROWS
                || gpus.is_some_and(|n| t.rows.len() >= usize::try_from(n).unwrap_or(usize::MAX))
        };
        if let Some(t) = self.open.back_mut() {
            let gap = r.time_ms - t.last_row_ms;
            let span = r.time_ms - t.time_ms;
            if !t.closed && !full(t) && (0..=BURST_GAP_MS).contains(&gap) && span <= BURST_MAX_MS {
                r.sample.id.index = u32::try_from(t.rows.len()).unwrap_or(u32::MAX);
                t.last_row_ms = r.time_ms;
                t.rows.push(r);
                if full(self.open.back().expect("just pushed")) {
                    self.end_tick();
                }
                return;
            }
        }
        r.sample.id.index = 0;
        self.start_tick(r);
        if self.open.back().is_some_and(full) {
            self.end_tick();
        }
        self.flush(false);
    }

    /// A MIG device's row joins its GPU's row of the same time in an open tick (a gpuwatch
    /// recording writes it right after that row); without one it is dropped.
    fn push_mig(&mut self, mut r: Reading) {
        let index = r.sample.id.index;
        for t in self.open.iter_mut().rev() {
            if let Some(row) = t
                .rows
                .iter_mut()
                .find(|x| x.sample.id.index == index && x.time_ms == r.time_ms)
            {
                for mut m in r.mig.drain(..) {
                    if !row.mig.iter().any(|o| o.uuid == m.uuid) {
                        // MIG devices are recorded in their index order
                        m.index = u32::try_from(row.mig.len()).unwrap_or(u32::MAX);
                        row.mig.push(m);
                    }
                }
                return;
            }
        }
        self.stats.orphan_mig += 1;
    }

    fn push_keyed(&mut self, r: Reading) {
        let index = r.sample.id.index;
        let window = self.join_window();
        // Newest first: almost every row belongs to the newest tick or starts the next one.
        let mut after = None;
        for (pos, t) in self.open.iter_mut().enumerate().rev() {
            if r.time_ms < t.time_ms {
                // A row a little before the tick's first one (its writer was slower).
                if !t.closed && t.time_ms - r.time_ms <= BURST_GAP_MS && t.has(index).is_none() {
                    t.time_ms = r.time_ms;
                    t.rows.push(r);
                    return;
                }
                continue;
            }
            if let Some(old) = t.has(index) {
                if old.time_ms == r.time_ms {
                    self.stats.duplicates += 1;
                    return;
                }
            } else if !t.closed && r.time_ms - t.time_ms < window {
                t.last_row_ms = t.last_row_ms.max(r.time_ms);
                t.rows.push(r);
                return;
            }
            after = Some(pos);
            break;
        }
        match after {
            Some(pos) if pos + 1 == self.open.len() => self.start_tick(r),
            Some(pos) => {
                self.stats.reordered += 1;
                self.open.insert(pos + 1, Tick::new(r, 1));
            }
            None if self.emitted_ms.is_none_or(|e| r.time_ms > e) => {
                if !self.open.is_empty() {
                    self.stats.reordered += 1;
                }
                self.open.push_front(Tick::new(r, 1));
            }
            None => {
                // Older than everything emitted: a new time line.
                self.flush(true);
                self.segment += 1;
                self.emitted_ms = None;
                self.interval_ms = None;
                self.stats.new_segments += 1;
                self.start_tick(r);
            }
        }
    }

    fn start_tick(&mut self, r: Reading) {
        if let Some(prev) = self.open.back() {
            let iv = r.time_ms - prev.time_ms;
            if iv > 0 {
                self.interval_ms = Some(iv);
            }
        }
        self.open.push_back(Tick::new(r, self.rows_hint));
    }

    /// Closes the newest tick (the format knows it is complete: a table ended).
    pub fn end_tick(&mut self) {
        if let Some(t) = self.open.back_mut() {
            t.closed = true;
        }
    }

    /// Emits ticks that can no longer change (`all`: every open tick).
    pub fn flush(&mut self, all: bool) {
        while let (Some(front), Some(back)) = (self.open.front(), self.open.back()) {
            let settled = back.time_ms - front.time_ms > REORDER_MS || self.open.len() > MAX_OPEN;
            if !(all || settled) {
                break;
            }
            let t = self.open.pop_front().expect("front exists");
            self.emitted_ms = Some(t.time_ms);
            let snap = self.snapshot(t);
            self.ready.push_back(snap);
        }
    }

    /// The next finished tick, if any.
    pub fn pop(&mut self) -> Option<Imported> {
        self.ready.pop_front()
    }

    fn snapshot(&mut self, mut t: Tick) -> Imported {
        self.rows_hint = t.rows.len();
        t.rows.sort_by_key(|r| r.sample.id.index);
        let mut snap = Snapshot {
            time_ms: t.time_ms,
            gpus: Vec::with_capacity(t.rows.len()),
            ..Snapshot::default()
        };
        let mut procs: Option<Vec<ProcSample>> = None;
        // The indexed rows' lists: (position in `snap.gpus`, list).
        let mut shared: Vec<(usize, Arc<Vec<ProcSample>>)> = Vec::new();
        let mut progress = None;
        for mut r in t.rows {
            let idx = r.sample.id.index;
            r.sample.time_ms = t.time_ms;
            for x in r.xids {
                snap.xids
                    .push(XidEvent::new(t.time_ms, idx, r.sample.id.uuid.clone(), x));
            }
            if let Some(list) = r.procs {
                procs
                    .get_or_insert_with(Vec::new)
                    .extend(list.into_iter().map(|mut p| {
                        p.gpu_index = idx;
                        p.gpu_uuid.clone_from(&r.sample.id.uuid);
                        p
                    }));
            }
            if let Some(list) = r.procs_shared.take() {
                shared.push((snap.gpus.len(), list));
            }
            if r.progress.is_some() {
                progress = r.progress;
            }
            for mut m in std::mem::take(&mut r.mig) {
                m.gpu_index = idx;
                m.gpu_uuid.clone_from(&r.sample.id.uuid);
                snap.mig.push(m);
            }
            snap.gpus.push(r.sample);
        }
        // A tick whose rows list what the last one's did (the same GPUs, boards and lists, in
        // the same time line) is "unchanged" (`None`), as the sampler's snapshots between two
        // process reads are; any other lists them all. (A tick of rows without lists says
        // nothing of them, as before.)
        if !shared.is_empty() {
            let (emitted, segment) = &self.emitted_procs;
            let same = *segment == Some(self.segment)
                && shared.len() == emitted.len()
                && shared
                    .iter()
                    .zip(emitted)
                    .all(|((at, list), (i, uuid, was))| {
                        let id = &snap.gpus[*at].id;
                        id.index == *i && id.uuid == *uuid && Arc::ptr_eq(list, was)
                    });
            if !same {
                let rows = shared
                    .into_iter()
                    .map(|(at, list)| {
                        let id = &snap.gpus[at].id;
                        (id.index, id.uuid.clone(), list)
                    })
                    .collect();
                self.emitted_procs = (rows, Some(self.segment));
            }
            if !same || procs.is_some() {
                let all = procs.get_or_insert_with(Vec::new);
                for (idx, uuid, list) in &self.emitted_procs.0 {
                    all.extend(list.iter().map(|p| ProcSample {
                        gpu_index: *idx,
                        gpu_uuid: uuid.clone(),
                        ..p.clone()
                    }));
                }
            }
        }
        snap.processes = procs;
        Imported {
            snapshot: snap,
            progress,
            segment: self.segment,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{GpuSample, Metric};

    fn row(t: i64, key: Key, index: u32, util: f64) -> Reading {
        let mut sample = GpuSample {
            time_ms: t,
            id: crate::model::DeviceId {
                index,
                ..Default::default()
            },
            state: crate::model::DeviceState::Ok,
            values: Default::default(),
        };
        sample.values.set(Metric::Util, Some(util));
        Reading {
            time_ms: t,
            key,
            sample,
            xids: Vec::new(),
            procs: None,
            procs_same: false,
            procs_shared: None,
            progress: None,
            mig: Vec::new(),
        }
    }

    /// A gpuwatch row of GPU `index` at `t` s listing `pids` (`None`: the same as its last row).
    fn listing(t: i64, index: u32, pids: Option<&[u32]>) -> Reading {
        let mut r = row(t * 1000, Key::Index, index, 50.0);
        r.sample.id.uuid = format!("GPU-{index}");
        match pids {
            Some(pids) => {
                r.procs = Some(
                    pids.iter()
                        .map(|p| ProcSample::compute(*p, 0, "", Some(1 << 30)))
                        .collect(),
                );
            }
            None => r.procs_same = true,
        }
        r
    }

    #[test]
    fn a_tick_listing_the_processes_of_the_tick_before_is_unchanged() {
        let mut a = Assembler::new(None);
        let rows = vec![
            listing(0, 0, Some(&[10])),
            listing(0, 1, Some(&[])),
            listing(1, 0, None),
            listing(1, 1, None),
            // GPU 1's list changes
            listing(2, 0, None),
            listing(2, 1, Some(&[11, 12])),
            listing(3, 0, None),
            listing(3, 1, None),
            // GPU 1's row is missing: the tick lists GPU 0's alone, as a tick always did
            listing(4, 0, None),
            listing(5, 0, None),
            listing(5, 1, None),
        ];
        for r in rows {
            a.push(r);
        }
        a.flush(true);
        let ticks: Vec<Option<Vec<(u32, String, u32)>>> = std::iter::from_fn(|| a.pop())
            .map(|t| {
                t.snapshot.processes.map(|l| {
                    l.into_iter()
                        .map(|p| (p.gpu_index, p.gpu_uuid, p.pid))
                        .collect()
                })
            })
            .collect();
        let gpu = |i: u32, pid: u32| (i, format!("GPU-{i}"), pid);
        assert_eq!(
            ticks,
            vec![
                Some(vec![gpu(0, 10)]),
                None,
                Some(vec![gpu(0, 10), gpu(1, 11), gpu(1, 12)]),
                None,
                Some(vec![gpu(0, 10)]),
                Some(vec![gpu(0, 10), gpu(1, 11), gpu(1, 12)]),
            ]
        );
    }

    #[test]
    fn a_new_segment_lists_its_processes_again() {
        let mut a = Assembler::new(None);
        for r in [
            listing(100, 0, Some(&[10])),
            listing(101, 0, None),
            // older than everything emitted, once flushed: a new time line
            listing(1, 0, None),
            listing(2, 0, None),
        ] {
            a.push(r);
            a.flush(true);
        }
        let ticks: Vec<(u32, Option<usize>)> = std::iter::from_fn(|| a.pop())
            .map(|t| (t.segment, t.snapshot.processes.map(|l| l.len())))
            .collect();
        assert_eq!(
            ticks,
            vec![(0, Some(1)), (0, None), (1, Some(1)), (1, None)]
        );
    }

    fn run(a: &mut Assembler, rows: Vec<Reading>) -> Vec<(u32, i64, Vec<u32>)> {
        for r in rows {
            a.push(r);
        }
        a.flush(true);
        std::iter::from_fn(|| a.pop())
            .map(|i| {
                (
                    i.segment,
                    i.snapshot.time_ms,
                    i.snapshot.gpus.iter().map(|g| g.id.index).collect(),
                )
            })
            .collect()
    }

    /// A MIG row whose GPU has no row at its time is dropped and counted (it was dropped
    /// silently).
    #[test]
    fn a_mig_row_without_its_gpu_is_counted() {
        let mut a = Assembler::new(None);
        let got = run(
            &mut a,
            vec![
                row(1_000, Key::Index, 0, 50.0),
                row(1_000, Key::Mig, 7, 0.0),
            ],
        );
        assert_eq!(got, vec![(0, 1_000, vec![0])]);
        assert_eq!(a.stats.orphan_mig, 1);
    }

    #[test]
    fn bursts_duplicates_and_late_rows() {
        let mut a = Assembler::new(None);
        let rows = vec![
            row(1000, Key::Index, 0, 1.0),
            row(1003, Key::Index, 1, 1.0),
            row(2000, Key::Index, 0, 1.0),
            row(2000, Key::Index, 0, 1.0), // duplicate
            row(2004, Key::Index, 1, 1.0),
            row(4000, Key::Index, 0, 1.0), // 3000 is a gap
            row(3001, Key::Index, 1, 1.0), // late: a tick of its own between 2000 and 4000
            row(4002, Key::Index, 1, 1.0),
        ];
        assert_eq!(
            run(&mut a, rows),
            [
                (0, 1000, vec![0, 1]),
                (0, 2000, vec![0, 1]),
                (0, 3001, vec![1]),
                (0, 4000, vec![0, 1])
            ]
        );
        assert_eq!(a.stats.duplicates, 1);
        assert_eq!(a.stats.reordered, 1);
    }

    /// A log without a GPU column sampled every 20 ms has no pauses: its bursts still end (at
    /// most a second from their first row), so it is not one endless tick held in memory.
    #[test]
    fn positional_bursts_are_bounded() {
        let mut a = Assembler::new(None);
        let rows: Vec<Reading> = (0..500)
            .map(|i| row(i * 20, Key::Position, 0, 1.0))
            .collect();
        let ticks = run(&mut a, rows);
        assert!(ticks.len() >= 9, "{}", ticks.len());
        assert!(ticks.iter().all(|t| t.2.len() <= 51), "{ticks:?}");
    }

    #[test]
    fn positional_bursts_and_segments() {
        let mut a = Assembler::new(None);
        let rows = vec![
            row(1000, Key::Position, 0, 1.0),
            row(1002, Key::Position, 0, 2.0),
            row(1004, Key::Position, 0, 3.0),
            row(2000, Key::Position, 0, 1.0),
            row(2001, Key::Position, 0, 1.0),
        ];
        assert_eq!(
            run(&mut a, rows),
            [(0, 1000, vec![0, 1, 2]), (0, 2000, vec![0, 1])]
        );
        let mut a = Assembler::new(Some(2));
        let rows = vec![
            row(1000, Key::Position, 0, 1.0),
            row(1000, Key::Position, 0, 2.0),
            row(1000, Key::Position, 0, 3.0),
        ];
        assert_eq!(
            run(&mut a, rows),
            [(0, 1000, vec![0, 1]), (0, 1000, vec![0])]
        );
        // Far back in time after ticks were emitted: a new segment.
        let mut a = Assembler::new(None);
        let mut rows: Vec<Reading> = (0..200)
            .map(|i| row(1000 * i, Key::Index, 0, 1.0))
            .collect();
        rows.push(row(500, Key::Index, 0, 1.0));
        rows.push(row(1500, Key::Index, 0, 1.0));
        let out = run(&mut a, rows);
        assert_eq!(out.len(), 202);
        assert_eq!(out[200], (1, 500, vec![0]));
        assert_eq!(out[201], (1, 1500, vec![0]));
        assert_eq!(a.stats.new_segments, 1);
    }
}
