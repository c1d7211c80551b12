//! Rolling windows: per (GPU, metric) timestamped history with gaps kept, and the exact
//! aggregates rules ask for.
//!
//! Every GPU has one [`GpuHistory`] holding a [`Window`] per metric of the metric table (the
//! engine fills only those of the metrics a rule file names: no rule can read the others), the
//! XID events it reported and its latest process list. A window is a queue of `(time_ms, value)`
//! points (stored small: 4 bytes a point while they all hold one value, 12 otherwise) trimmed
//! to its metric's *retention* (the longest duration the rules that name the metric use,
//! or any longer one a rule asked of the window, plus [`RETENTION_MARGIN_MS`]); a missed tick or
//! an absent value simply leaves no point, so gaps stay visible.
//!
//! Aggregates look at the half-open range `(now - duration, now]`, found with `partition_point`
//! (two binary searches), and scan only that range. Results are cached per evaluation tick in
//! the history (key: metric, function, duration, argument), so ten rules asking for
//! `gpu.util.mean("10m")` pay once; a window whose points all hold one value answers any
//! function but `slope` without the cache (no scan to save).
//!
//! **No data.** An aggregate gives `None` (rhai `()`) when the window is *too sparse*:
//! fewer samples than half of what the observed sampling interval predicts
//! (`count < ceil(0.5 × duration / interval)`, at least one sample), or fewer than two samples for
//! `delta`, `increase`, `rate` and `slope`. The interval is the median of the last 15 gaps between
//! this GPU's samples. A rule therefore cannot fire on missing data, including during the warm-up
//! after a start (a 10-minute window needs 5 minutes of samples first).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use crate::model::{
    DeviceId, DeviceState, GpuSample, Metric, MigSample, ProcSample, XidNote, METRIC_COUNT,
};

mod points;
use points::Points;

/// History kept beyond the longest duration a window must answer for.
pub const RETENTION_MARGIN_MS: i64 = 60_000;

/// Points per summary block.
const BLOCK: u64 = 64;
/// Points per small summary block (a block is eight of them).
const SMALL: u64 = 8;

/// Min, max and sum of one aligned block of [`BLOCK`] points.
#[derive(Debug, Clone, Copy)]
struct Block {
    min: f64,
    max: f64,
    sum: f64,
}

impl Block {
    const EMPTY: Block = Block {
        min: f64::INFINITY,
        max: f64::NEG_INFINITY,
        sum: 0.0,
    };

    fn add(&mut self, v: f64) {
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.sum += v;
    }
}

/// Adds the value of a new point to the summary of its block `number` in `blocks` (whose first
/// is number `first`), starting that block when the point is its first.
fn add_point(blocks: &mut VecDeque<Block>, first: &mut u64, number: u64, value: f64) {
    if blocks.is_empty() {
        *first = number;
    }
    if *first + blocks.len() as u64 <= number {
        blocks.push_back(Block::EMPTY);
    }
    if let Some(b) = blocks.back_mut() {
        b.add(value);
    }
}

/// Drops the summaries in `blocks` (whose first is number `first`) before block `number`.
fn drop_blocks(blocks: &mut VecDeque<Block>, first: &mut u64, number: u64) {
    while *first < number && !blocks.is_empty() {
        blocks.pop_front();
        *first += 1;
    }
}

/// Timestamped values of one metric of one GPU, oldest first.
///
/// A point more than 49.7 days older than the newest one is not kept (no window is as long;
/// a GPU that answers again after so long starts a new history, its counters without a baseline).
///
/// Besides the points, the window keeps min/max/sum per aligned block of 64 points and per
/// aligned small block of 8, so `min`, `max` and `mean` over an hour cost ~60 block reads plus at
/// most 14 small-block and 14 point reads (a minute: at most 21 reads, not 60).
#[derive(Debug, Clone, Default)]
pub struct Window {
    points: Points,
    /// Points ever evicted: the sequence number of `points[0]`.
    evicted: u64,
    /// Block summaries; `blocks[0]` is block number `first_block`.
    blocks: VecDeque<Block>,
    first_block: u64,
    /// Small block summaries; `small[0]` is small block number `first_small`.
    small: VecDeque<Block>,
    first_small: u64,
    /// Sequence numbers of points lower than their predecessor (counter resets), so `increase`
    /// over a range without one is `last - first`.
    drops: VecDeque<u64>,
    /// Sequence number of a counter baseline restored from the state file (see
    /// [`Window::push_baseline`]).
    baseline: Option<u64>,
}

/// The aggregate functions a window can compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Agg {
    /// Newest value in the window.
    Last,
    /// Arithmetic mean.
    Mean,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Percentile `arg` (0–100), nearest rank.
    Percentile,
    /// Population standard deviation.
    Stddev,
    /// Number of samples present (never "no data"; 0 for an empty window).
    Count,
    /// Last minus first value (may be negative).
    Delta,
    /// Sum of increases, counter resets (a drop) counted as a restart from 0.
    Increase,
    /// `Increase` per second of the span covered.
    Rate,
    /// Least-squares slope, units per second.
    Slope,
    /// Fraction (0–1) of samples strictly above `arg`.
    FracAbove,
    /// Fraction (0–1) of samples strictly below `arg`.
    FracBelow,
    /// Fraction of samples whose value has any bit of mask `arg` set.
    FracBits,
}

impl Window {
    /// Appends a point. Times must not go backwards; a point at the same time as the newest one
    /// replaces it, an older one is ignored.
    pub fn push(&mut self, time_ms: i64, value: f64) {
        match self.points.back() {
            Some(last) if last.0 == time_ms => {
                self.points.set_last_value(value);
                self.rebuild_last_block();
                let seq = self.evicted + self.points.len() as u64 - 1;
                if self.drops.back() == Some(&seq) {
                    self.drops.pop_back();
                }
                let n = self.points.len();
                if n >= 2 && self.points.value(n - 1) < self.points.value(n - 2) {
                    self.drops.push_back(seq);
                }
            }
            Some(last) if last.0 > time_ms => {}
            last => {
                // (a point 49 days after the oldest cannot be kept with it: no window is as long)
                while self
                    .points
                    .front_time()
                    .is_some_and(|t| time_ms.saturating_sub(t) > points::SPAN_MS)
                {
                    self.pop_oldest();
                }
                let seq = self.evicted + self.points.len() as u64;
                if last.is_some_and(|p| value < p.1) && !self.points.is_empty() {
                    self.drops.push_back(seq);
                }
                self.points.push_back(time_ms, value);
                add_point(&mut self.blocks, &mut self.first_block, seq / BLOCK, value);
                add_point(&mut self.small, &mut self.first_small, seq / SMALL, value);
            }
        }
    }

    /// Pushes a counter's value saved before a restart as the window's first point, so
    /// `delta`/`increase` over a range starting at it report what the counter gained while
    /// gpuwatch was down. Such a range is exact even while it is too sparse for the usual test
    /// (the first sample after a restart), so it needs only this point and one more. Ignored
    /// unless the window is empty.
    pub fn push_baseline(&mut self, time_ms: i64, value: f64) {
        if self.points.is_empty() {
            self.baseline = Some(self.evicted);
            self.push(time_ms, value);
        }
    }

    fn rebuild_last_block(&mut self) {
        let len = self.points.len() as u64;
        if len == 0 {
            return;
        }
        let last_seq = self.evicted + len - 1;
        let summary = |size: u64| {
            let start_seq = (last_seq / size * size).max(self.evicted);
            let mut b = Block::EMPTY;
            for i in (start_seq - self.evicted)..len {
                b.add(self.points.value(i as usize));
            }
            b
        };
        let (big, small) = (summary(BLOCK), summary(SMALL));
        if let Some(last) = self.blocks.back_mut() {
            *last = big;
        }
        if let Some(last) = self.small.back_mut() {
            *last = small;
        }
    }

    /// Drops points older than `cutoff_ms` (keeps one point before it as a counter baseline).
    pub fn evict_before(&mut self, cutoff_ms: i64) {
        while self.points.len() > 1 && self.points.time(1) < cutoff_ms {
            self.pop_oldest();
        }
    }

    /// Drops the oldest point.
    fn pop_oldest(&mut self) {
        if self.points.is_empty() {
            return;
        }
        self.points.pop_front();
        self.evicted += 1;
        while self.drops.front().is_some_and(|d| *d <= self.evicted) {
            self.drops.pop_front();
        }
        drop_blocks(
            &mut self.blocks,
            &mut self.first_block,
            self.evicted / BLOCK,
        );
        drop_blocks(&mut self.small, &mut self.first_small, self.evicted / SMALL);
    }

    /// Min, max and sum of points `lo..hi`: whole blocks from their summaries, the small blocks
    /// before and after them from theirs, the points at the two ends one by one. (A block whose
    /// first points were evicted is never read: `lo` is at or after the oldest point kept.)
    fn fold(&self, lo: usize, hi: usize) -> Block {
        let mut acc = Block::EMPTY;
        let (s_lo, s_hi) = (self.evicted + lo as u64, self.evicted + hi as u64);
        let points = |acc: &mut Block, from: u64, to: u64| {
            let range = (from - self.evicted) as usize..(to - self.evicted) as usize;
            for v in self.points.values(range.start, range.end) {
                acc.add(v);
            }
        };
        let merge = |acc: &mut Block, blocks: &VecDeque<Block>, first: u64, from: u64, to: u64| {
            for b in blocks.range((from - first) as usize..(to - first) as usize) {
                acc.min = acc.min.min(b.min);
                acc.max = acc.max.max(b.max);
                acc.sum += b.sum;
            }
        };
        // small blocks a..b (numbers) lie wholly inside the range
        let (a, b) = (s_lo.div_ceil(SMALL), s_hi / SMALL);
        if a >= b || a < self.first_small {
            points(&mut acc, s_lo, s_hi);
            return acc;
        }
        points(&mut acc, s_lo, a * SMALL);
        let per = BLOCK / SMALL;
        let (big_a, big_b) = ((a * SMALL).div_ceil(BLOCK), b * SMALL / BLOCK);
        if big_a < big_b && big_a >= self.first_block {
            merge(&mut acc, &self.small, self.first_small, a, big_a * per);
            merge(&mut acc, &self.blocks, self.first_block, big_a, big_b);
            merge(&mut acc, &self.small, self.first_small, big_b * per, b);
        } else {
            merge(&mut acc, &self.small, self.first_small, a, b);
        }
        points(&mut acc, b * SMALL, s_hi);
        acc
    }

    /// Number of stored points.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// Newest point.
    pub fn newest(&self) -> Option<(i64, f64)> {
        self.points.back()
    }

    /// The points with `start_ms < t <= end_ms`, oldest first.
    pub fn points_in(&self, start_ms: i64, end_ms: i64) -> impl Iterator<Item = (i64, f64)> + '_ {
        let (lo, hi) = self.range(start_ms, end_ms);
        self.points.iter(lo, hi)
    }

    /// Index range of points with `start < t <= end`. Windows usually end at the newest point and
    /// cover its recent part, so `hi` is checked at the end first and `lo` is found by galloping
    /// back from `hi` (O(log of the window's length), not of the retention's).
    fn range(&self, start_ms: i64, end_ms: i64) -> (usize, usize) {
        let n = self.points.len();
        let hi = if self.points.back_time().is_some_and(|t| t <= end_ms) {
            n
        } else {
            self.points.partition_point(|t| t <= end_ms)
        };
        // Invariant: points[right..hi] are all after `start_ms`; the answer is in [left, right].
        let (mut left, mut right, mut step) = (0, hi, 1);
        while step <= right {
            let i = right - step;
            if self.points.time(i) <= start_ms {
                left = i + 1;
                break;
            }
            right = i;
            step *= 2;
        }
        while left < right {
            let mid = left + (right - left) / 2;
            if self.points.time(mid) <= start_ms {
                left = mid + 1;
            } else {
                right = mid;
            }
        }
        (left, hi.max(left))
    }

    /// Computes `agg` over `(now - duration, now]`. `interval_ms` is the sampling interval used for
    /// the sparseness test (0 = unknown: every window is too sparse).
    pub fn aggregate(
        &self,
        agg: Agg,
        now_ms: i64,
        duration_ms: i64,
        arg: f64,
        interval_ms: i64,
    ) -> Option<f64> {
        let (lo, hi) = self.range(now_ms - duration_ms, now_ms);
        let n = hi - lo;
        if agg == Agg::Count {
            return Some(n as f64);
        }
        let from_baseline = matches!(agg, Agg::Delta | Agg::Increase)
            && n >= 2
            && self.baseline == Some(self.evicted + lo as u64);
        if !from_baseline {
            if interval_ms <= 0 {
                // Interval unknown (fewer than two samples so far): too early to judge any window.
                return None;
            }
            // ceil(0.5 * duration / interval), at least 1
            let expected = duration_ms as f64 / interval_ms as f64;
            let needed = ((expected * 0.5).ceil() as usize).max(1);
            let needs_two = matches!(agg, Agg::Delta | Agg::Increase | Agg::Rate | Agg::Slope);
            if n < needed || n == 0 || (needs_two && n < 2) {
                return None;
            }
        }
        let it = || self.points.values(lo, hi);
        let nf = n as f64;
        // A range known to hold one value (a counter without errors, a limit, a total: most of
        // what the stock rules read each tick) needs no scan; the others compute as below.
        if let Some(v) = self.points.same_value(lo, hi) {
            let share = |yes: bool| if yes { 1.0 } else { 0.0 };
            match agg {
                Agg::Mean | Agg::Min | Agg::Max | Agg::Percentile => return Some(v),
                Agg::Stddev => return Some(0.0),
                Agg::FracAbove => return Some(share(v > arg)),
                Agg::FracBelow => return Some(share(v < arg)),
                Agg::FracBits => return Some(share((v as u64) & (arg as u64) != 0)),
                // (at least two points, checked above; one value: no drop, no rise)
                Agg::Delta | Agg::Increase => return Some(0.0),
                _ => {}
            }
        }
        let value = match agg {
            Agg::Count => nf,
            Agg::Last => self.points.value(hi - 1),
            Agg::Mean => self.fold(lo, hi).sum / nf,
            Agg::Min => self.fold(lo, hi).min,
            Agg::Max => self.fold(lo, hi).max,
            Agg::Stddev => {
                let mean = it().sum::<f64>() / nf;
                (it().map(|v| (v - mean) * (v - mean)).sum::<f64>() / nf).sqrt()
            }
            Agg::Percentile => {
                let mut vals: Vec<f64> = it().collect();
                let p = arg.clamp(0.0, 100.0) / 100.0;
                let k = (p * (nf - 1.0)).round() as usize;
                let (_, v, _) = vals.select_nth_unstable_by(k.min(n - 1), f64::total_cmp);
                *v
            }
            Agg::Delta => self.points.value(hi - 1) - self.points.value(lo),
            Agg::Increase | Agg::Rate => {
                // A drop at sequence d lies between points d-1 and d; only drops with
                // s_lo < d < s_hi matter.
                let (s_lo, s_hi) = (self.evicted + lo as u64, self.evicted + hi as u64);
                let first_drop = self.drops.partition_point(|d| *d <= s_lo);
                let inc = if self.drops.get(first_drop).is_none_or(|d| *d >= s_hi) {
                    self.points.value(hi - 1) - self.points.value(lo)
                } else {
                    let mut inc = 0.0;
                    let mut prev = self.points.value(lo);
                    for v in it().skip(1) {
                        inc += if v >= prev { v - prev } else { v };
                        prev = v;
                    }
                    inc
                };
                if agg == Agg::Rate {
                    let span_s = (self.points.time(hi - 1) - self.points.time(lo)) as f64 / 1000.0;
                    if span_s <= 0.0 {
                        return None;
                    }
                    inc / span_s
                } else {
                    inc
                }
            }
            Agg::Slope => {
                let t0 = self.points.time(lo);
                let ts = || {
                    self.points
                        .iter(lo, hi)
                        .map(move |p| ((p.0 - t0) as f64 / 1000.0, p.1))
                };
                let mean_t = ts().map(|p| p.0).sum::<f64>() / nf;
                let mean_v = ts().map(|p| p.1).sum::<f64>() / nf;
                let (mut sxy, mut sxx) = (0.0, 0.0);
                for (t, v) in ts() {
                    sxy += (t - mean_t) * (v - mean_v);
                    sxx += (t - mean_t) * (t - mean_t);
                }
                if sxx <= 0.0 {
                    return None;
                }
                sxy / sxx
            }
            Agg::FracAbove => it().filter(|v| *v > arg).count() as f64 / nf,
            Agg::FracBelow => it().filter(|v| *v < arg).count() as f64 / nf,
            Agg::FracBits => {
                let mask = arg as u64;
                it().filter(|v| (*v as u64) & mask != 0).count() as f64 / nf
            }
        };
        Some(value)
    }
}

/// Runs of consecutive samples below a threshold in a window (`idle_runs`).
#[derive(Debug, Clone, PartialEq)]
pub struct RunStats {
    /// Number of runs that start inside the window.
    pub runs: usize,
    /// Fraction of samples below the threshold.
    pub share: f64,
    /// Median seconds between consecutive run starts (`None` with fewer than 2 runs).
    pub period_s: Option<f64>,
    /// Coefficient of variation of the gaps between run starts (`None` with fewer than 3 runs).
    pub period_cv: Option<f64>,
    /// Median run length, seconds (a run's length is first-below to first-not-below).
    pub median_len_s: f64,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_unstable_by(f64::total_cmp);
    v[v.len() / 2]
}

impl Window {
    /// Idle-run statistics over `(now - duration, now]` for samples `< threshold`; `None` when
    /// the window is too sparse (same rule as [`Window::aggregate`]).
    pub fn runs_below(
        &self,
        now_ms: i64,
        duration_ms: i64,
        threshold: f64,
        interval_ms: i64,
    ) -> Option<RunStats> {
        // Reuse the sparseness test.
        self.aggregate(Agg::Mean, now_ms, duration_ms, 0.0, interval_ms)?;
        let (lo, hi) = self.range(now_ms - duration_ms, now_ms);
        let mut starts = Vec::new();
        let mut lens = Vec::new();
        let mut below = 0usize;
        let mut run_start: Option<i64> = None;
        let mut prev_below = lo > 0 && self.points.value(lo - 1) < threshold;
        for (t, v) in self.points.iter(lo, hi) {
            let b = v < threshold;
            if b {
                below += 1;
            }
            if b && !prev_below {
                run_start = Some(t);
                starts.push(t);
            } else if !b && prev_below {
                if let Some(s) = run_start.take() {
                    lens.push((t - s) as f64 / 1000.0);
                }
            }
            prev_below = b;
        }
        if let Some(s) = run_start {
            lens.push((self.points.time(hi - 1) - s) as f64 / 1000.0);
        }
        let mut gaps: Vec<f64> = starts
            .windows(2)
            .map(|w| (w[1] - w[0]) as f64 / 1000.0)
            .collect();
        let period_cv = (gaps.len() >= 2).then(|| {
            let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
            let var = gaps.iter().map(|g| (g - mean) * (g - mean)).sum::<f64>() / gaps.len() as f64;
            if mean > 0.0 {
                var.sqrt() / mean
            } else {
                0.0
            }
        });
        let period_s = (!gaps.is_empty()).then(|| median(&mut gaps));
        Some(RunStats {
            runs: starts.len(),
            share: below as f64 / (hi - lo) as f64,
            period_s,
            period_cv,
            median_len_s: if lens.is_empty() {
                0.0
            } else {
                median(&mut lens)
            },
        })
    }

    /// Maxima of `n` consecutive sub-windows covering `(now - duration, now]`, oldest first;
    /// `None` if any sub-window is too sparse.
    pub fn maxima(
        &self,
        now_ms: i64,
        duration_ms: i64,
        n: usize,
        interval_ms: i64,
    ) -> Option<Vec<f64>> {
        let n_i = i64::try_from(n).ok()?.max(1);
        let sub = duration_ms / n_i;
        (0..n_i)
            .rev()
            .map(|k| self.aggregate(Agg::Max, now_ms - k * sub, sub, 0.0, interval_ms))
            .collect()
    }
}

/// Cache key: metric, function, duration, argument bits.
type CacheKey = (u8, u8, i64, u64);

/// Slots of an [`AggCache`] (a power of two), and how many a lookup tries.
const CACHE_SLOTS: usize = 512;
const CACHE_PROBES: usize = 8;

/// Aggregates computed at one evaluation time: a small open-addressed table (a tick asks each
/// GPU for a few dozen) whose slots carry the time and the history's [stamp](GpuHistory) they
/// were filled at, so a new time or a new sample empties them without a write. One table per
/// thread serves every history the thread reads: a stamp names one state of one history. (A
/// search through a list of every aggregate asked cost a tenth of a replay once every rule's
/// inputs were checked at every tick; a table behind a lock in each history, its lock.)
#[derive(Debug)]
struct AggCache {
    slots: Vec<((i64, u64), CacheKey, Option<f64>)>,
}

impl Default for AggCache {
    fn default() -> Self {
        AggCache {
            slots: vec![((i64::MIN, 0), (0, 0, 0, 0), None); CACHE_SLOTS],
        }
    }
}

impl AggCache {
    /// The slots where `key` of the history state `stamp` may be, in probe order.
    fn probes(stamp: u64, key: CacheKey) -> impl Iterator<Item = usize> {
        let (m, a, d, x) = key;
        let h = (u64::from(m) | u64::from(a) << 8)
            ^ (d as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ x.rotate_left(29)
            ^ stamp.wrapping_mul(0xA24B_AED4_963E_E407);
        let start = (h.wrapping_mul(0xD6E8_FEB8_6659_FD93) >> 55) as usize;
        (0..CACHE_PROBES).map(move |i| (start + i) % CACHE_SLOTS)
    }

    /// The value of `key` at `now_ms` for the history state `stamp`, if cached; else the slot
    /// to keep it in, if one is free.
    fn find(&self, now_ms: i64, stamp: u64, key: CacheKey) -> Result<Option<f64>, Option<usize>> {
        let now = (now_ms, stamp);
        for i in Self::probes(stamp, key) {
            let (at, k, v) = self.slots[i];
            if at != now {
                return Err(Some(i));
            }
            if k == key {
                return Ok(v);
            }
        }
        Err(None)
    }

    /// The value of `key` at `now_ms` for the history state `stamp`, computed by `f` unless
    /// cached.
    #[cfg(test)]
    fn get_or(
        &mut self,
        now_ms: i64,
        stamp: u64,
        key: CacheKey,
        f: impl FnOnce() -> Option<f64>,
    ) -> Option<f64> {
        match self.find(now_ms, stamp, key) {
            Ok(v) => v,
            Err(free) => {
                let v = f();
                if let Some(i) = free {
                    self.slots[i] = ((now_ms, stamp), key, v);
                }
                v
            }
        }
    }
}

thread_local! {
    /// This thread's [`AggCache`].
    static AGGS: RefCell<AggCache> = RefCell::new(AggCache::default());
}

/// The source of history stamps: each is used once.
static STAMPS: AtomicU64 = AtomicU64::new(1);

fn new_stamp() -> u64 {
    STAMPS.fetch_add(1, Ordering::Relaxed)
}

/// The median gap between the newest 16 of `times` (in order); `None` with fewer than two.
/// (At most 15 gaps, sorted on the stack: asked at every tick.)
pub fn median_gap(times: &VecDeque<i64>) -> Option<i64> {
    let mut gaps = [0i64; 15];
    let mut n = 0;
    let newest = times.len().saturating_sub(gaps.len() + 1);
    for (a, b) in times.iter().skip(newest).zip(times.iter().skip(newest + 1)) {
        gaps[n] = b - a;
        n += 1;
    }
    let gaps = &mut gaps[..n];
    gaps.sort_unstable();
    gaps.get(n / 2).copied()
}

/// Everything gpuwatch remembers about one GPU.
#[derive(Debug)]
pub struct GpuHistory {
    /// Identity from the newest sample.
    pub id: DeviceId,
    /// State from the newest sample.
    pub state: DeviceState,
    /// Time of the newest sample, UTC ms (0 before the first).
    pub last_time_ms: i64,
    /// One window per metric, indexed by `Metric as usize`.
    pub series: Vec<Window>,
    /// XID events, oldest first.
    pub xids: VecDeque<XidNote>,
    /// The newest process list for this GPU.
    pub processes: Vec<ProcSample>,
    /// Its MIG devices as of the newest snapshot (empty without MIG).
    pub mig: Vec<MigSample>,
    /// The `pod`, `namespace` and `container` it is allocated to as of the newest snapshot
    /// (Kubernetes: [`crate::model::pod_labels`]).
    pub pods: Option<[String; 3]>,
    /// Its NVLinks as last read, with each link's counter rise since the reading before
    /// (`None` without NVLink: a replayed log has none). Kept while snapshots carry no current
    /// reading (`nvlink_stale`), so the next reading's rises follow this one.
    pub nvlink: Option<std::sync::Arc<crate::model::nvlink::NvlinkView>>,
    /// The newest snapshot had no current reading of the links (the reading stale, the GPU
    /// lost or stalled): rules do not see `nvlink`.
    pub nvlink_stale: bool,
    /// Recent sample times, for the interval estimate.
    recent_times: VecDeque<i64>,
    /// Estimated sampling interval, ms (0 = unknown).
    pub interval_ms: i64,
    /// Per metric (a bit each, by index in the metric table): whether its window has a point
    /// (a window keeps its newest point for good). Asked at most evaluations: the windows of
    /// the metrics a GPU lacks are not touched.
    with_data: [u64; METRIC_COUNT.div_ceil(64)],
    /// Names this state of the windows for the aggregate cache: new at every change (a sample,
    /// an eviction) and for a new history; a clone keeps it while it reads the same.
    stamp: u64,
    /// The newest sample's time at the last eviction (see [`GpuHistory::evict_due`]).
    evicted_at_ms: i64,
    /// Per metric, the longest duration a rule asked of its window (ms): the window keeps at
    /// least that (see [`GpuHistory::evict_before`]), however the rule wrote it.
    asked_ms: Vec<AtomicI64>,
}

impl Clone for GpuHistory {
    fn clone(&self) -> Self {
        GpuHistory {
            id: self.id.clone(),
            state: self.state,
            last_time_ms: self.last_time_ms,
            series: self.series.clone(),
            xids: self.xids.clone(),
            processes: self.processes.clone(),
            mig: self.mig.clone(),
            pods: self.pods.clone(),
            nvlink: self.nvlink.clone(),
            nvlink_stale: self.nvlink_stale,
            recent_times: self.recent_times.clone(),
            interval_ms: self.interval_ms,
            with_data: self.with_data,
            stamp: self.stamp,
            evicted_at_ms: self.evicted_at_ms,
            asked_ms: self
                .asked_ms
                .iter()
                .map(|a| AtomicI64::new(a.load(Ordering::Relaxed)))
                .collect(),
        }
    }
}

impl GpuHistory {
    /// An empty history for a device.
    pub fn new(id: DeviceId) -> Self {
        GpuHistory {
            id,
            state: DeviceState::default(),
            last_time_ms: 0,
            series: vec![Window::default(); METRIC_COUNT],
            xids: VecDeque::new(),
            processes: Vec::new(),
            mig: Vec::new(),
            pods: None,
            nvlink: None,
            nvlink_stale: false,
            recent_times: VecDeque::new(),
            interval_ms: 0,
            with_data: [0; METRIC_COUNT.div_ceil(64)],
            stamp: new_stamp(),
            evicted_at_ms: 0,
            asked_ms: (0..METRIC_COUNT).map(|_| AtomicI64::new(0)).collect(),
        }
    }

    /// Adds one sample.
    pub fn push(&mut self, sample: &GpuSample) {
        self.push_only(sample, 0..METRIC_COUNT);
    }

    /// Adds one sample, its values only for the metrics `only` lists (by index in the metric
    /// table): the engine keeps no window of a metric no rule file names, which no rule can read.
    pub fn push_only(&mut self, sample: &GpuSample, only: impl IntoIterator<Item = usize>) {
        // (what was computed at any time before this sample is not what the windows say now)
        self.stamp = new_stamp();
        self.id.clone_from(&sample.id);
        self.state = sample.state;
        if sample.time_ms <= self.last_time_ms && self.last_time_ms != 0 {
            return;
        }
        self.last_time_ms = sample.time_ms;
        for i in only {
            if let Some(v) = sample.values.at(i).filter(|v| v.is_finite()) {
                self.series[i].push(sample.time_ms, v);
                self.with_data[i / 64] |= 1 << (i % 64);
            }
        }
        self.recent_times.push_back(sample.time_ms);
        if self.recent_times.len() > 16 {
            self.recent_times.pop_front();
        }
        if let Some(gap) = median_gap(&self.recent_times) {
            self.interval_ms = gap;
        }
    }

    /// Records an XID event.
    pub fn push_xid(&mut self, note: XidNote) {
        let pos = self.xids.partition_point(|e| e.time_ms <= note.time_ms);
        self.xids.insert(pos, note);
    }

    /// Drops XID events older than `cutoff_ms`, and each metric's points older than
    /// `retention_ms(metric)` before `now_ms` — or than the longest duration a rule asked of that
    /// window plus [`RETENTION_MARGIN_MS`], if longer (a duration the rule files do not spell out, such as a
    /// number of seconds, is kept from its first use on). Every window keeps its newest point.
    pub fn evict_before(
        &mut self,
        cutoff_ms: i64,
        now_ms: i64,
        retention_ms: impl Fn(Metric) -> i64,
    ) {
        self.stamp = new_stamp();
        for (i, (w, m)) in self.series.iter_mut().zip(Metric::all()).enumerate() {
            let asked = self
                .asked_ms
                .get(i)
                .map_or(0, |a| a.load(Ordering::Relaxed));
            let keep = retention_ms(m).max(asked.saturating_add(RETENTION_MARGIN_MS));
            w.evict_before(now_ms.saturating_sub(keep));
        }
        while self.xids.front().is_some_and(|e| e.time_ms < cutoff_ms) {
            self.xids.pop_front();
        }
    }

    /// Whether old points are due to leave at `now_ms`: once per minute of the samples' own
    /// time (a window then holds up to a minute beyond its retention, which no aggregate reads).
    /// Touching every metric's window of every GPU at every tick cost a tenth of a replay; the
    /// cadence follows the samples' times, so a replay evicts exactly as the daemon did.
    pub fn evict_due(&mut self, now_ms: i64) -> bool {
        const EVERY_MS: i64 = 60_000;
        if now_ms.div_euclid(EVERY_MS) == self.evicted_at_ms.div_euclid(EVERY_MS) {
            return false;
        }
        self.evicted_at_ms = now_ms;
        true
    }

    /// Notes that a rule asked `metric`'s window for `duration_ms` (see `evict_before`).
    pub fn note_asked(&self, metric: Metric, duration_ms: i64) {
        if let Some(a) = self.asked_ms.get(metric as usize) {
            // (read first: asked at every evaluation, it is almost never longer)
            if a.load(Ordering::Relaxed) < duration_ms {
                a.fetch_max(duration_ms, Ordering::Relaxed);
            }
        }
    }

    /// The window of `metric`.
    pub fn window(&self, metric: Metric) -> &Window {
        &self.series[metric as usize]
    }

    /// Pushes a counter's value saved before a restart as the first point of `metric`'s window
    /// (see [`Window::push_baseline`]; ignored unless the window is empty).
    pub fn push_baseline(&mut self, metric: Metric, time_ms: i64, value: f64) {
        let i = metric as usize;
        if self.series[i].is_empty() {
            self.stamp = new_stamp();
            self.series[i].push_baseline(time_ms, value);
            self.with_data[i / 64] |= 1 << (i % 64);
        }
    }

    /// Whether `metric`'s window has a point (`series.supported`).
    pub fn has_data(&self, metric: Metric) -> bool {
        let i = metric as usize;
        self.with_data[i / 64] & (1 << (i % 64)) != 0
    }

    /// Cached aggregate of `metric` at `now_ms` (see [`Window::aggregate`]).
    pub fn aggregate(
        &self,
        metric: Metric,
        agg: Agg,
        now_ms: i64,
        duration_ms: i64,
        arg: f64,
    ) -> Option<f64> {
        let compute = || {
            self.series[metric as usize].aggregate(agg, now_ms, duration_ms, arg, self.interval_ms)
        };
        // A window of one value (a counter without errors, a limit, a total: most of what the
        // stock rules read each tick) answers without a scan — but a slope — sooner than the
        // table could.
        if agg != Agg::Slope && self.series[metric as usize].points.all_same() {
            return compute();
        }
        let key = (metric as u8, agg as u8, duration_ms, arg.to_bits());
        // (the table is not held while `compute` runs)
        let found = AGGS.with(|c| c.try_borrow().map(|c| c.find(now_ms, self.stamp, key)));
        match found {
            Ok(Ok(v)) => v,
            Ok(Err(Some(slot))) => {
                let v = compute();
                AGGS.with(|c| {
                    if let Ok(mut c) = c.try_borrow_mut() {
                        c.slots[slot] = ((now_ms, self.stamp), key, v);
                    }
                });
                v
            }
            Ok(Err(None)) | Err(_) => compute(),
        }
    }

    /// Distinct XID codes with `now - duration < t <= now`, in order of first occurrence.
    pub fn xids_in(&self, now_ms: i64, duration_ms: i64) -> Vec<u64> {
        let mut out = Vec::new();
        for x in self.xid_notes_in(now_ms, duration_ms) {
            if !out.contains(&x.code) {
                out.push(x.code);
            }
        }
        out
    }

    /// The XID events with `now - duration < t <= now`, oldest first.
    pub fn xid_notes_in(
        &self,
        now_ms: i64,
        duration_ms: i64,
    ) -> impl Iterator<Item = &XidNote> + '_ {
        let lo = self
            .xids
            .partition_point(|e| e.time_ms <= now_ms - duration_ms);
        let hi = self.xids.partition_point(|e| e.time_ms <= now_ms);
        self.xids.range(lo..hi.max(lo))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn win(points: &[(i64, f64)]) -> Window {
        let mut w = Window::default();
        for (t, v) in points {
            w.push(*t, *v);
        }
        w
    }

    fn series(n: i64, f: impl Fn(i64) -> f64) -> Window {
        win(&(0..n).map(|i| (i * 1000, f(i))).collect::<Vec<_>>())
    }

    #[test]
    fn basic_aggregates() {
        let w = series(10, |i| i as f64); // t=0..9 s, v=0..9
        let now = 9000;
        let a = |agg, d, arg| w.aggregate(agg, now, d, arg, 1000);
        assert_eq!(a(Agg::Last, 10_000, 0.0), Some(9.0));
        assert_eq!(a(Agg::Mean, 10_000, 0.0), Some(4.5));
        assert_eq!(a(Agg::Mean, 5_000, 0.0), Some(7.0)); // 5..9
        assert_eq!(a(Agg::Min, 5_000, 0.0), Some(5.0));
        assert_eq!(a(Agg::Max, 5_000, 0.0), Some(9.0));
        assert_eq!(a(Agg::Count, 5_000, 0.0), Some(5.0));
        assert_eq!(a(Agg::Percentile, 10_000, 50.0), Some(5.0));
        assert_eq!(a(Agg::Percentile, 10_000, 100.0), Some(9.0));
        assert_eq!(a(Agg::Delta, 10_000, 0.0), Some(9.0));
        assert_eq!(a(Agg::Increase, 10_000, 0.0), Some(9.0));
        assert_eq!(a(Agg::Rate, 10_000, 0.0), Some(1.0));
        let slope = a(Agg::Slope, 10_000, 0.0).unwrap();
        assert!((slope - 1.0).abs() < 1e-9, "{slope}");
        assert_eq!(a(Agg::FracAbove, 10_000, 6.5), Some(0.3));
        assert_eq!(a(Agg::FracBelow, 10_000, 2.0), Some(0.2));
        let sd = a(Agg::Stddev, 10_000, 0.0).unwrap();
        assert!((sd - 8.25f64.sqrt()).abs() < 1e-9);
    }

    #[test]
    fn a_range_of_one_value_aggregates_as_a_scan() {
        // varying, then 0.1 for the newest 40 points: ranges inside the run take the short way
        let w = series(100, |i| if i < 60 { i as f64 } else { 0.1 });
        let now = 99_000;
        for d in (1..=100).map(|k| k * 1000) {
            let vals: Vec<f64> = w.points_in(now - d, now).map(|p| p.1).collect();
            let n = vals.len() as f64;
            let mean = vals.iter().sum::<f64>() / n;
            let share = |f: &dyn Fn(f64) -> bool| vals.iter().filter(|v| f(**v)).count() as f64 / n;
            let scan = [
                (Agg::Mean, 0.0, mean),
                (
                    Agg::Min,
                    0.0,
                    vals.iter().copied().fold(f64::INFINITY, f64::min),
                ),
                (
                    Agg::Max,
                    0.0,
                    vals.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                ),
                (
                    Agg::Stddev,
                    0.0,
                    (vals.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n).sqrt(),
                ),
                (Agg::FracAbove, 0.05, share(&|v| v > 0.05)),
                (Agg::FracBelow, 0.05, share(&|v| v < 0.05)),
                (Agg::FracBits, 1.0, share(&|v| (v as u64) & 1 != 0)),
            ];
            for (agg, arg, want) in scan {
                let got = w.aggregate(agg, now, d, arg, 1000).unwrap();
                assert!(
                    (got - want).abs() <= 1e-12 * want.abs().max(1.0),
                    "{agg:?} {d}: {got} vs {want}"
                );
            }
            if vals.len() >= 2 {
                let delta = vals[vals.len() - 1] - vals[0];
                let increase: f64 = vals
                    .windows(2)
                    .map(|p| if p[1] >= p[0] { p[1] - p[0] } else { p[1] })
                    .sum();
                for (agg, want) in [(Agg::Delta, delta), (Agg::Increase, increase)] {
                    let got = w.aggregate(agg, now, d, 0.0, 1000).unwrap();
                    assert!((got - want).abs() <= 1e-9, "{agg:?} {d}: {got} vs {want}");
                }
            }
            let mut sorted = vals.clone();
            sorted.sort_by(f64::total_cmp);
            for p in [0.0, 50.0, 100.0] {
                let k = ((p / 100.0) * (n - 1.0)).round() as usize;
                assert_eq!(
                    w.aggregate(Agg::Percentile, now, d, p, 1000),
                    Some(sorted[k])
                );
            }
        }
        // inside the run: exactly the value, not a sum divided back
        assert_eq!(w.aggregate(Agg::Mean, now, 30_000, 0.0, 1000), Some(0.1));
        assert_eq!(w.aggregate(Agg::Stddev, now, 30_000, 0.0, 1000), Some(0.0));
    }

    #[test]
    fn the_median_gap_is_of_the_newest_sixteen_times() {
        let at = |t: &[i64]| median_gap(&t.iter().copied().collect());
        assert_eq!(at(&[]), None);
        assert_eq!(at(&[5]), None);
        assert_eq!(at(&[0, 1000]), Some(1000));
        // gaps 1000, 500, 2000
        assert_eq!(at(&[0, 1000, 1500, 3500]), Some(1000));
        // 20 times: the first four gaps (10 s) are older than the newest 16 times
        let mut t: Vec<i64> = (0..5).map(|i| i * 10_000).collect();
        t.extend((1..=15).map(|i| 40_000 + i * 1000));
        assert_eq!(at(&t), Some(1000));
    }

    #[test]
    fn the_aggregate_cache_answers_what_it_computed_at_that_time() {
        let mut c = AggCache::default();
        let mut computed = 0;
        // more keys than slots: each answers its own value, computed once while cached
        for round in 0..2 {
            for k in 0..1000u64 {
                let key = ((k % 7) as u8, (k % 3) as u8, (k * 1000) as i64, k);
                let v = c.get_or(5, 1, key, || {
                    computed += 1;
                    Some(k as f64)
                });
                assert_eq!(v, Some(k as f64), "round {round}");
            }
        }
        assert!(computed < 2000, "{computed}: nothing cached");
        assert!(computed >= 1000);
        // another time: computed again
        let key = (1, 1, 1000, 1);
        assert_eq!(c.get_or(6, 1, key, || Some(-1.0)), Some(-1.0));
        assert_eq!(c.get_or(6, 1, key, || Some(-2.0)), Some(-1.0));
        assert_eq!(c.get_or(7, 1, key, || None), None);
        // a new sample at the same time (another history state): computed again
        assert_eq!(c.get_or(7, 2, key, || Some(3.0)), Some(3.0));
        assert_eq!(c.get_or(7, 1, key, || Some(4.0)), None);
    }

    #[test]
    fn counter_reset_is_not_negative_increase() {
        let w = win(&[(0, 5.0), (1000, 7.0), (2000, 1.0), (3000, 4.0)]);
        assert_eq!(
            w.aggregate(Agg::Increase, 3000, 4_000, 0.0, 1000),
            Some(6.0)
        );
        assert_eq!(w.aggregate(Agg::Delta, 3000, 4_000, 0.0, 1000), Some(-1.0));
        assert_eq!(
            w.aggregate(Agg::Delta, 3000, 4_000, 0.0, 0),
            None,
            "interval unknown"
        );
    }

    #[test]
    fn empty_and_sparse_windows_are_no_data() {
        let w = Window::default();
        assert_eq!(w.aggregate(Agg::Mean, 0, 60_000, 0.0, 1000), None);
        assert_eq!(w.aggregate(Agg::Count, 0, 60_000, 0.0, 1000), Some(0.0));
        // 20 samples in a 60 s window at 1 s: fewer than 30 needed.
        let w = series(20, |_| 1.0);
        assert_eq!(w.aggregate(Agg::Mean, 19_000, 60_000, 0.0, 1000), None);
        assert_eq!(w.aggregate(Agg::Mean, 19_000, 40_000, 0.0, 1000), Some(1.0));
        // one sample: no slope or rate
        let w = series(1, |_| 1.0);
        assert_eq!(w.aggregate(Agg::Slope, 0, 1000, 0.0, 1000), None);
        assert_eq!(w.aggregate(Agg::Rate, 0, 1000, 0.0, 1000), None);
        assert_eq!(w.aggregate(Agg::Last, 0, 1000, 0.0, 1000), Some(1.0));
    }

    #[test]
    fn gaps_are_kept() {
        // 0..29 s present, 30..89 s missing, 90..119 present.
        let mut pts: Vec<(i64, f64)> = (0..30).map(|i| (i * 1000, 50.0)).collect();
        pts.extend((90..120).map(|i| (i * 1000, 50.0)));
        let w = win(&pts);
        assert_eq!(
            w.aggregate(Agg::Count, 119_000, 120_000, 0.0, 1000),
            Some(60.0)
        );
        assert_eq!(
            w.aggregate(Agg::Mean, 119_000, 120_000, 0.0, 1000),
            Some(50.0)
        );
        assert_eq!(w.aggregate(Agg::Mean, 89_000, 40_000, 0.0, 1000), None);
    }

    #[test]
    fn idle_runs_and_maxima() {
        // 60 s period: 45 s busy, 15 s idle, over 10 minutes
        let w = series(600, |i| if i % 60 >= 45 { 0.0 } else { 100.0 });
        let r = w.runs_below(599_000, 600_000, 10.0, 1000).unwrap();
        assert_eq!(r.runs, 10);
        assert!((r.share - 0.25).abs() < 1e-9);
        assert_eq!(r.period_s, Some(60.0));
        assert_eq!(r.period_cv, Some(0.0));
        assert_eq!(r.median_len_s, 15.0);
        let w = series(600, |i| i as f64);
        assert_eq!(
            w.maxima(599_000, 600_000, 3, 1000),
            Some(vec![199.0, 399.0, 599.0])
        );
        assert_eq!(w.maxima(599_000, 1_200_000, 2, 1000), None);
    }

    #[test]
    fn every_range_folds_as_a_scan() {
        let mut w = Window::default();
        for k in 0..300i64 {
            w.push(k * 1000, ((k * 7919) % 101) as f64);
        }
        w.push(299_000, 3.0); // a replaced last point
        w.evict_before(37_500); // evicted up to an odd sequence number
        let n = w.points.len();
        for lo in 0..n {
            for hi in lo..=n {
                let vals: Vec<f64> = w.points.values(lo, hi).collect();
                let b = w.fold(lo, hi);
                assert_eq!(b.min, vals.iter().copied().fold(f64::INFINITY, f64::min));
                assert_eq!(
                    b.max,
                    vals.iter().copied().fold(f64::NEG_INFINITY, f64::max)
                );
                assert_eq!(b.sum, vals.iter().sum::<f64>(), "{lo}..{hi}");
            }
        }
    }

    #[test]
    fn block_summaries_match_scans() {
        let mut w = Window::default();
        let mut rng = 1u64;
        let mut t = 0;
        for round in 0..5 {
            for _ in 0..700 {
                rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                t += 1000;
                w.push(t, (rng >> 40) as f64);
            }
            w.push(t, 5.0); // same-time replacement rebuilds the last block
            w.evict_before(t - 1_000_000 + round * 37_000);
            for (dur, lo_off) in [(1_000_000, 0), (300_000, 0), (65_000, 3000), (64_000, 0)] {
                let now = t - lo_off;
                let (lo, hi) = w.range(now - dur, now);
                let vals: Vec<f64> = w.points.values(lo, hi).collect();
                let b = w.fold(lo, hi);
                assert_eq!(b.min, vals.iter().copied().fold(f64::INFINITY, f64::min));
                assert_eq!(
                    b.max,
                    vals.iter().copied().fold(f64::NEG_INFINITY, f64::max)
                );
                assert!((b.sum - vals.iter().sum::<f64>()).abs() < 1e-6 * b.sum.abs().max(1.0));
            }
        }
    }

    #[test]
    fn restored_baseline_makes_increase_exact_while_sparse() {
        let mut w = Window::default();
        w.push_baseline(9_000, 3.0);
        w.push(10_000, 5.0);
        // Interval unknown and a 2-min window with two points: exact from the baseline.
        assert_eq!(
            w.aggregate(Agg::Increase, 10_000, 120_000, 0.0, 0),
            Some(2.0)
        );
        assert_eq!(
            w.aggregate(Agg::Delta, 10_000, 120_000, 0.0, 1000),
            Some(2.0)
        );
        // Other aggregates keep the sparseness test.
        assert_eq!(w.aggregate(Agg::Rate, 10_000, 120_000, 0.0, 1000), None);
        assert_eq!(w.aggregate(Agg::Max, 10_000, 120_000, 0.0, 1000), None);
        // A range that does not start at the baseline is judged as usual.
        w.push(11_000, 6.0);
        w.push(12_000, 6.0);
        assert_eq!(
            w.aggregate(Agg::Increase, 12_000, 120_000, 0.0, 0),
            Some(3.0)
        );
        assert_eq!(w.aggregate(Agg::Increase, 20_000, 10_000, 0.0, 1000), None);
        // Only into an empty window.
        let mut w = win(&[(0, 1.0)]);
        w.push_baseline(-1, 0.0);
        assert_eq!(w.len(), 1);
    }

    #[test]
    fn increase_fast_path_matches_scan() {
        let mut w = Window::default();
        let mut v = 0.0;
        let mut checked = 0;
        for i in 0..3000_i64 {
            v = if i % 700 == 699 {
                3.0
            } else {
                v + (i % 3) as f64
            };
            w.push(i * 1000, v);
            if i % 500 == 0 {
                w.evict_before(i * 1000 - 1_200_000);
            }
            if i % 97 == 0 && i > 200 {
                for dur in [10_000, 120_000, 900_000] {
                    let (lo, hi) = w.range(i * 1000 - dur, i * 1000);
                    let vals: Vec<f64> = w.points.values(lo, hi).collect();
                    let want: f64 = vals
                        .windows(2)
                        .map(|p| if p[1] >= p[0] { p[1] - p[0] } else { p[1] })
                        .sum();
                    if let Some(got) = w.aggregate(Agg::Increase, i * 1000, dur, 0.0, 1000) {
                        assert_eq!(got, want, "{i} {dur}");
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 60, "{checked}");
    }

    #[test]
    fn stored_points_are_the_points_pushed() {
        // Long runs of one value (stored as one value) broken now and then, replaced last points,
        // evictions: what the window gives back is what a plain list of pairs holds.
        let mut w = Window::default();
        let mut plain: Vec<(i64, f64)> = Vec::new();
        let mut rng = 7u64;
        let mut t = 0;
        let mut v = 0.0;
        for i in 0..20_000 {
            rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let r = rng >> 33;
            if r % 97 == 0 {
                v = (r % 5) as f64;
            }
            if r % 13 == 0 && !plain.is_empty() {
                // a second value at the newest point's time replaces it
                w.push(t, v + 1.0);
                plain.last_mut().unwrap().1 = v + 1.0;
            } else {
                t += 1000 + (r % 3) as i64;
                w.push(t, v);
                plain.push((t, v));
            }
            if i % 1500 == 0 {
                let cutoff = t - 600_000;
                w.evict_before(cutoff);
                while plain.len() > 1 && plain[1].0 < cutoff {
                    plain.remove(0);
                }
            }
            if i % 250 == 0 {
                assert_eq!(w.points_in(i64::MIN, i64::MAX).collect::<Vec<_>>(), plain);
                let (lo, hi) = (plain.len() / 3, plain.len());
                let b = w.fold(lo, hi);
                let vals = &plain[lo..hi];
                assert_eq!(
                    b.max,
                    vals.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max)
                );
                assert_eq!(
                    b.min,
                    vals.iter().map(|p| p.1).fold(f64::INFINITY, f64::min)
                );
            }
        }
        // a window of one value all along holds 4 bytes a point
        let mut flat = Window::default();
        for k in 0..3600 {
            flat.push(k * 1000, 3.0);
        }
        assert!(
            flat.points.heap_bytes() <= 4096 * 4,
            "{}",
            flat.points.heap_bytes()
        );
    }

    #[test]
    fn a_point_49_days_after_the_others_starts_over() {
        let day = 86_400_000i64;
        let mut w = win(&[(0, 5.0), (1000, 7.0), (2000, 1.0)]);
        w.push(60 * day, 0.5);
        w.push(60 * day + 1000, 2.0);
        assert_eq!(w.len(), 2);
        let now = 60 * day + 1000;
        // no baseline and no reset from the old points: the increase of the new ones alone
        assert_eq!(w.aggregate(Agg::Increase, now, 2000, 0.0, 1000), Some(1.5));
        assert_eq!(w.aggregate(Agg::Min, now, 2000, 0.0, 1000), Some(0.5));
        assert_eq!(w.fold(0, 2).sum, 2.5);
        // extreme times saturate instead of overflowing
        let mut w = win(&[(i64::MIN, 1.0)]);
        w.push(0, 2.0);
        assert_eq!(
            w.points_in(i64::MIN, i64::MAX).collect::<Vec<_>>(),
            [(0, 2.0)]
        );
    }

    #[test]
    fn eviction_keeps_a_baseline() {
        let mut w = series(100, |i| i as f64);
        w.evict_before(50_000);
        assert_eq!(w.len(), 51);
        assert_eq!(w.points.front_time(), Some(49_000));
    }

    #[test]
    fn range_finds_the_same_points_as_a_scan() {
        // Irregular times, evictions, and windows anywhere (also past both ends).
        let mut w = Window::default();
        let mut t = 0;
        for i in 0..500i64 {
            t += 1 + (i * 7919) % 5;
            w.push(t, 0.0);
        }
        w.evict_before(200);
        let times: Vec<i64> = w.points.iter(0, w.len()).map(|p| p.0).collect();
        for start in (150..t + 10).step_by(7) {
            for len in [0, 1, 3, 50, 400, 5000] {
                let end = start + len;
                let lo = times.iter().filter(|x| **x <= start).count();
                let hi = times.iter().filter(|x| **x <= end).count().max(lo);
                assert_eq!(w.range(start, end), (lo, hi), "({start}, {end}]");
            }
        }
    }

    #[test]
    fn a_window_keeps_the_longest_duration_a_rule_asked_of_it() {
        use crate::model::MetricValues;
        let push = |h: &mut GpuHistory, s: i64| {
            let mut values = MetricValues::default();
            values.set(Metric::Temp, Some(50.0));
            values.set(Metric::Util, Some(10.0));
            h.push(&GpuSample {
                time_ms: s * 1000,
                id: DeviceId::default(),
                state: DeviceState::Ok,
                values,
            });
            h.evict_before(0, s * 1000, |_| 60_000);
        };
        let mut h = GpuHistory::new(DeviceId::default());
        for s in 0..600 {
            push(&mut h, s);
        }
        // the retention given (60 s) and the point just before it
        assert_eq!(h.window(Metric::Temp).len(), 62);
        // a rule asks for 5 min (say as a number of seconds): from then on the window keeps 6
        // (a clone, as `Arc::make_mut` makes, keeps what was asked)
        h.note_asked(Metric::Temp, 300_000);
        let mut h = h.clone();
        for s in 600..1200 {
            push(&mut h, s);
        }
        assert_eq!(h.window(Metric::Temp).len(), 362);
        assert_eq!(h.window(Metric::Util).len(), 62, "only the window asked");
    }

    #[test]
    fn history_interval_xids_and_cache() {
        use crate::model::MetricValues;
        let mut h = GpuHistory::new(DeviceId::default());
        for i in 0..10 {
            let mut values = MetricValues::default();
            values.set(Metric::Util, Some(f64::from(i)));
            h.push(&GpuSample {
                time_ms: i64::from(i) * 2000,
                id: DeviceId::default(),
                state: DeviceState::Ok,
                values,
            });
        }
        assert_eq!(h.interval_ms, 2000);
        h.push_xid(XidNote::new(5000, 13));
        h.push_xid(XidNote::new(7000, 79));
        h.push_xid(XidNote::new(8000, 13));
        assert_eq!(h.xids_in(18_000, 20_000), vec![13, 79]);
        assert_eq!(h.xids_in(18_000, 5_000), Vec::<u64>::new());
        let m = h.aggregate(Metric::Util, Agg::Mean, 18_000, 20_000, 0.0);
        assert_eq!(m, Some(4.5));
        assert_eq!(h.aggregate(Metric::Util, Agg::Mean, 18_000, 20_000, 0.0), m);
        assert_eq!(
            h.aggregate(Metric::Temp, Agg::Mean, 18_000, 20_000, 0.0),
            None
        );
    }
}
