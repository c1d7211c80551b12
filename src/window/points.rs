//! The points of one window, stored small: times as 4-byte offsets from a base (49 days of
//! milliseconds), and the values either one by one or — while every point holds the same value,
//! as a counter without errors, a limit or a setting does for hours — as that one value.
//!
//! On 8 GPUs sampled every second, most of the series the stock rules read are such constants
//! (ECC and remap counters, NVLink error counters, limits, totals): a point of theirs costs 4 bytes
//! instead of 16. The values read back are the values pushed, bit for bit, so every aggregate is
//! what it was with plain `(time, value)` pairs.

use std::collections::VecDeque;

/// The longest span of time the points of one window may cover, ms (49.7 days).
pub(super) const SPAN_MS: i64 = u32::MAX as i64;

/// The values of a window's points.
#[derive(Debug, Clone)]
enum Values {
    /// Every point has this value (bit for bit).
    Same(f64),
    /// One value per point.
    Each(VecDeque<f64>),
}

/// Timestamped values, oldest first (see the module docs).
#[derive(Debug, Clone)]
pub(super) struct Points {
    /// The time the offsets count from, ms.
    base: i64,
    /// Each point's time minus `base`, ms.
    times: VecDeque<u32>,
    values: Values,
    /// How many of the newest points have the newest point's value (with `Each`).
    run: usize,
}

impl Default for Points {
    fn default() -> Self {
        Points {
            base: 0,
            times: VecDeque::new(),
            values: Values::Same(0.0),
            run: 0,
        }
    }
}

/// The values of a range of points.
pub(super) enum ValuesIter<'a> {
    Same(f64, usize),
    Each(std::collections::vec_deque::Iter<'a, f64>),
}

impl Iterator for ValuesIter<'_> {
    type Item = f64;

    fn next(&mut self) -> Option<f64> {
        match self {
            ValuesIter::Same(v, n) => {
                if *n == 0 {
                    return None;
                }
                *n -= 1;
                Some(*v)
            }
            ValuesIter::Each(it) => it.next().copied(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            ValuesIter::Same(_, n) => (*n, Some(*n)),
            ValuesIter::Each(it) => it.size_hint(),
        }
    }

    // (sums, counts and copies run through `fold`: the deque's own, on its two slices)
    fn fold<B, F: FnMut(B, f64) -> B>(self, init: B, mut f: F) -> B {
        match self {
            ValuesIter::Same(v, n) => (0..n).fold(init, |acc, _| f(acc, v)),
            ValuesIter::Each(it) => it.fold(init, |acc, v| f(acc, *v)),
        }
    }
}

impl Points {
    pub(super) fn len(&self) -> usize {
        self.times.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.times.is_empty()
    }

    /// The time of point `i`, ms.
    pub(super) fn time(&self, i: usize) -> i64 {
        self.base + i64::from(self.times[i])
    }

    /// The value of point `i`.
    pub(super) fn value(&self, i: usize) -> f64 {
        match &self.values {
            Values::Same(v) => {
                assert!(i < self.times.len(), "point {i} of {}", self.times.len());
                *v
            }
            Values::Each(vals) => vals[i],
        }
    }

    /// Point `i`.
    pub(super) fn get(&self, i: usize) -> (i64, f64) {
        (self.time(i), self.value(i))
    }

    /// The newest point.
    pub(super) fn back(&self) -> Option<(i64, f64)> {
        self.len().checked_sub(1).map(|i| self.get(i))
    }

    /// The newest point's time.
    pub(super) fn back_time(&self) -> Option<i64> {
        self.len().checked_sub(1).map(|i| self.time(i))
    }

    /// The values of points `lo..hi`.
    pub(super) fn values(&self, lo: usize, hi: usize) -> ValuesIter<'_> {
        match &self.values {
            Values::Same(v) => {
                assert!(lo <= hi && hi <= self.times.len(), "{lo}..{hi}");
                ValuesIter::Same(*v, hi - lo)
            }
            Values::Each(vals) => ValuesIter::Each(vals.range(lo..hi)),
        }
    }

    /// Whether every point holds one value (or there is none): any aggregate but a slope is
    /// then found without a scan.
    pub(super) fn all_same(&self) -> bool {
        matches!(self.values, Values::Same(_))
    }

    /// The value every point of `lo..hi` holds (bit for bit), when the range is not empty and
    /// that is known without reading it: all the points hold one value, or the range lies within
    /// the newest run of equal values.
    pub(super) fn same_value(&self, lo: usize, hi: usize) -> Option<f64> {
        let n = self.times.len();
        if lo >= hi || hi > n {
            return None;
        }
        match &self.values {
            Values::Same(v) => Some(*v),
            Values::Each(vals) => (hi == n && n - self.run.min(n) <= lo).then(|| vals[n - 1]),
        }
    }

    /// Points `lo..hi`.
    pub(super) fn iter(&self, lo: usize, hi: usize) -> impl Iterator<Item = (i64, f64)> + '_ {
        let base = self.base;
        self.times
            .range(lo..hi)
            .map(move |t| base + i64::from(*t))
            .zip(self.values(lo, hi))
    }

    /// The number of points whose time satisfies `pred` (which holds for a prefix of them).
    pub(super) fn partition_point(&self, pred: impl Fn(i64) -> bool) -> usize {
        self.times
            .partition_point(|t| pred(self.base + i64::from(*t)))
    }

    /// The oldest point's time.
    pub(super) fn front_time(&self) -> Option<i64> {
        (!self.is_empty()).then(|| self.time(0))
    }

    /// Appends a point at or after the newest one's time, at most [`SPAN_MS`] after the oldest
    /// (the caller drops older points first).
    pub(super) fn push_back(&mut self, time_ms: i64, value: f64) {
        if self.times.is_empty() {
            self.base = time_ms;
        } else if time_ms.saturating_sub(self.base) > SPAN_MS {
            self.rebase();
        }
        let offset = u32::try_from(time_ms.saturating_sub(self.base));
        debug_assert!(
            offset.is_ok(),
            "{time_ms} is over {SPAN_MS} ms after the oldest point"
        );
        let offset = offset.unwrap_or(u32::MAX);
        let same = self
            .back()
            .is_some_and(|(_, v)| v.to_bits() == value.to_bits());
        match &mut self.values {
            Values::Same(v) if self.times.is_empty() => *v = value,
            Values::Same(_) if same => {}
            Values::Same(v) => {
                let mut vals = VecDeque::with_capacity(self.times.len() + 1);
                vals.resize(self.times.len(), *v);
                vals.push_back(value);
                self.values = Values::Each(vals);
            }
            Values::Each(vals) => vals.push_back(value),
        }
        self.times.push_back(offset);
        self.run = if same { self.run + 1 } else { 1 };
    }

    /// Counts offsets from the oldest point's time.
    fn rebase(&mut self) {
        let Some(&shift) = self.times.front() else {
            return;
        };
        let base = self.base + i64::from(shift);
        for t in &mut self.times {
            *t -= shift;
        }
        self.base = base;
    }

    /// Replaces the newest point's value.
    pub(super) fn set_last_value(&mut self, value: f64) {
        let Some(last) = self.len().checked_sub(1) else {
            return;
        };
        match &mut self.values {
            Values::Same(v) if v.to_bits() == value.to_bits() => return,
            Values::Same(v) if last == 0 => *v = value,
            Values::Same(v) => {
                let mut vals = VecDeque::with_capacity(self.times.len());
                vals.resize(self.times.len(), *v);
                vals[last] = value;
                self.values = Values::Each(vals);
            }
            Values::Each(vals) if vals[last].to_bits() == value.to_bits() => return,
            Values::Each(vals) => vals[last] = value,
        }
        let bits = value.to_bits();
        self.run = 1
            + (0..last)
                .rev()
                .take_while(|&i| self.value(i).to_bits() == bits)
                .count();
        self.collapse();
    }

    /// Drops the oldest point.
    pub(super) fn pop_front(&mut self) {
        if self.times.pop_front().is_none() {
            return;
        }
        if let Values::Each(vals) = &mut self.values {
            vals.pop_front();
        }
        self.run = self.run.min(self.times.len());
        self.collapse();
    }

    /// Keeps one value for all points once they all have it again.
    fn collapse(&mut self) {
        if let Values::Each(vals) = &self.values {
            if self.run == vals.len() {
                self.values = Values::Same(vals.back().copied().unwrap_or(0.0));
            }
        }
    }

    /// Bytes of heap these points hold (for tests and estimates).
    #[cfg(test)]
    pub(super) fn heap_bytes(&self) -> usize {
        self.times.capacity() * 4
            + match &self.values {
                Values::Same(_) => 0,
                Values::Each(vals) => vals.capacity() * 8,
            }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The points as plain pairs.
    fn pairs(p: &Points) -> Vec<(i64, f64)> {
        p.iter(0, p.len()).collect()
    }

    #[test]
    fn same_values_take_no_value_storage_until_one_differs() {
        let mut p = Points::default();
        let mut want = Vec::new();
        for k in 0..1000i64 {
            p.push_back(k * 1000, 7.0);
            want.push((k * 1000, 7.0));
        }
        assert!(matches!(p.values, Values::Same(_)));
        assert!(p.heap_bytes() <= 1024 * 4, "{}", p.heap_bytes());
        p.push_back(1_000_000, 8.0);
        want.push((1_000_000, 8.0));
        assert!(matches!(p.values, Values::Each(_)));
        assert_eq!(pairs(&p), want);
        assert_eq!(p.values(998, 1001).collect::<Vec<_>>(), [7.0, 7.0, 8.0]);
        // once the different points are gone, one value again
        for k in 1001..1300i64 {
            p.push_back(k * 1000, 8.0);
            want.push((k * 1000, 8.0));
        }
        for _ in 0..1000 {
            p.pop_front();
            want.remove(0);
        }
        assert!(matches!(p.values, Values::Same(v) if v == 8.0));
        assert_eq!(pairs(&p), want);
        // -0.0 is not 0.0 here: the bits come back as they went in
        p.push_back(1_300_000, -0.0);
        assert!(matches!(p.values, Values::Each(_)));
        assert_eq!(
            p.back().map(|(_, v)| v.to_bits()),
            Some((-0.0f64).to_bits())
        );
    }

    #[test]
    fn a_range_of_one_value_is_known_without_reading_it() {
        let mut p = Points::default();
        for (t, v) in [(0, 1.0), (1, 2.0), (2, 2.0), (3, 2.0)] {
            p.push_back(t, v);
        }
        assert_eq!(p.same_value(1, 4), Some(2.0));
        assert_eq!(p.same_value(2, 4), Some(2.0));
        assert_eq!(p.same_value(0, 4), None, "1.0 then 2.0");
        assert_eq!(
            p.same_value(1, 3),
            None,
            "not known without reading: not the newest run"
        );
        assert_eq!(p.same_value(4, 4), None, "empty");
        p.pop_front();
        assert_eq!(p.same_value(0, 3), Some(2.0), "all the same again");
        assert_eq!(p.same_value(0, 2), Some(2.0));
        p.set_last_value(-0.0);
        assert_eq!(
            p.same_value(2, 3).map(f64::to_bits),
            Some((-0.0f64).to_bits())
        );
        assert_eq!(p.same_value(1, 3), None);
        // every range agrees with reading it
        for lo in 0..=3 {
            for hi in lo..=3 {
                if let Some(v) = p.same_value(lo, hi) {
                    assert!(p.values(lo, hi).all(|x| x.to_bits() == v.to_bits()));
                }
            }
        }
    }

    #[test]
    fn replacing_the_last_value_keeps_the_others() {
        let mut p = Points::default();
        for k in 0..5 {
            p.push_back(k, 1.0);
        }
        p.set_last_value(2.0);
        assert_eq!(
            pairs(&p),
            [(0, 1.0), (1, 1.0), (2, 1.0), (3, 1.0), (4, 2.0)]
        );
        p.set_last_value(1.0);
        assert!(matches!(p.values, Values::Same(v) if v == 1.0));
        assert_eq!(pairs(&p).len(), 5);
    }

    #[test]
    fn offsets_are_counted_again_from_the_oldest_point() {
        let day = 86_400_000i64;
        let mut p = Points::default();
        p.push_back(-5, 1.0);
        p.push_back(40 * day, 2.0);
        // 60 days after the first point: the caller drops it, offsets count from the next
        p.pop_front();
        p.push_back(60 * day, 3.0);
        assert_eq!(pairs(&p), [(40 * day, 2.0), (60 * day, 3.0)]);
        assert_eq!(p.front_time(), Some(40 * day));
        assert_eq!(p.partition_point(|t| t <= 50 * day), 1);
    }
}
