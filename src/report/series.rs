//! A metric's history for a chart, in bounded memory whatever the log's length: min and max per
//! time bucket; when a new sample falls past the last bucket the buckets are merged in pairs and
//! their width doubles. A bucket without samples is a gap, drawn as one.

use serde::{Deserialize, Serialize};

/// At most this many buckets (a chart is ~800 pixels wide; two buckets or more per column).
pub const MAX_BUCKETS: usize = 4096;

/// Min and max of one bucket; `None` when it has no sample.
pub type Bucket = Option<(f64, f64)>;

/// Bucketed min/max of one metric (see the module docs).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Series {
    /// Time of the first bucket's start, UTC ms.
    pub start_ms: i64,
    /// Width of a bucket, ms.
    pub width_ms: i64,
    /// The buckets, oldest first.
    pub buckets: Vec<Bucket>,
}

impl Series {
    /// Adds one sample.
    pub fn push(&mut self, t_ms: i64, v: f64) {
        if self.buckets.is_empty() && self.width_ms == 0 {
            self.start_ms = t_ms;
            self.width_ms = 1000;
        }
        if t_ms < self.start_ms {
            return;
        }
        let mut i = usize::try_from((t_ms - self.start_ms) / self.width_ms).unwrap_or(usize::MAX);
        while i >= MAX_BUCKETS {
            self.halve();
            i = usize::try_from((t_ms - self.start_ms) / self.width_ms).unwrap_or(usize::MAX);
        }
        if i >= self.buckets.len() {
            self.buckets.resize(i + 1, None);
        }
        let b = &mut self.buckets[i];
        *b = Some(match *b {
            Some((lo, hi)) => (lo.min(v), hi.max(v)),
            None => (v, v),
        });
    }

    fn halve(&mut self) {
        let merged = self
            .buckets
            .chunks(2)
            .map(|p| {
                p.iter()
                    .flatten()
                    .copied()
                    .reduce(|a, b| (a.0.min(b.0), a.1.max(b.1)))
            })
            .collect();
        self.buckets = merged;
        self.width_ms *= 2;
    }

    /// The end of the last bucket, UTC ms.
    pub fn end_ms(&self) -> i64 {
        self.start_ms + self.width_ms * i64::try_from(self.buckets.len()).unwrap_or(0)
    }

    /// Min and max per column for `columns` equal columns over `[from_ms, to_ms)`; `None` for a
    /// column no sample falls in.
    pub fn columns(&self, from_ms: i64, to_ms: i64, columns: usize) -> Vec<Bucket> {
        let mut out: Vec<Bucket> = vec![None; columns];
        let span = (to_ms - from_ms).max(1) as f64;
        for (i, b) in self.buckets.iter().enumerate() {
            let Some((lo, hi)) = *b else { continue };
            let t = self.start_ms + self.width_ms * i as i64 + self.width_ms / 2;
            let c = ((t - from_ms) as f64 / span * columns as f64).floor();
            if c < 0.0 || c >= columns as f64 {
                continue;
            }
            let slot = &mut out[c as usize];
            *slot = Some(match *slot {
                Some((a, z)) => (a.min(lo), z.max(hi)),
                None => (lo, hi),
            });
        }
        out
    }

    /// The largest value seen.
    pub fn max(&self) -> Option<f64> {
        self.buckets.iter().flatten().map(|b| b.1).reduce(f64::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_gaps_kept() {
        let mut s = Series::default();
        // 24 h at 1 s, with a 10-minute hole in the middle.
        for t in 0..86_400i64 {
            if (43_200..43_800).contains(&t) {
                continue;
            }
            s.push(t * 1000, (t % 100) as f64);
        }
        assert!(s.buckets.len() <= MAX_BUCKETS);
        let cols = s.columns(0, 86_400_000, 800);
        let empty = cols.iter().filter(|c| c.is_none()).count();
        assert!(
            (4..=6).contains(&empty),
            "the hole is a gap of ~5 columns: {empty}"
        );
        assert!(
            matches!(cols[0], Some((lo, hi)) if lo == 0.0 && hi >= 90.0),
            "{:?}",
            cols[0]
        );
        assert_eq!(s.max(), Some(99.0));
    }
}
