//! A GPU's energy between reads of the driver's energy counter.
//!
//! `nvmlDeviceGetTotalEnergyConsumption` costs a real driver 3 ms of CPU per call (H200, driver
//! 580): read on eight GPUs every minute it would be most of what gpuwatch spends. So the counter
//! is read rarely (`slot::COUNTERS`: every 720 process intervals, an hour by default) and, in
//! between, the energy shown at each tick is the counter's last reading plus the power readings
//! the tick already has, integrated (trapezoids between ticks). Each new reading of the counter
//! corrects the estimate, so the error never accumulates beyond one counter interval; the value
//! shown never goes down (an estimate ahead of the counter is held until the counter catches
//! up), except when the counter itself restarted (driver reload), which a counter reset is.
//!
//! Over a simulated day of a training run's power (phases, noise, idle gaps) sampled at 1 s the
//! shown energy stays within 1 % of the counter (`tests::a_day_of_ticks_stays_within_one_percent`).

/// A counter reading this much below the value shown is a counter that restarted, not an
/// estimate that ran ahead.
const RESET_FRACTION: f64 = 0.9;

/// Shortest span between two power readings that is left out as a gap: one longer than this
/// and than three times the span between the two readings before is the GPU not answering, not
/// the tick interval (its energy reaches the value shown at the next counter reading).
pub(super) const MIN_GAP_MS: i64 = 60_000;

/// One GPU's energy estimate.
#[derive(Debug, Clone, Default)]
pub(super) struct EnergyMeter {
    /// The counter's last reading (J) and when it was read (UTC ms).
    anchor: Option<(f64, i64)>,
    /// Energy integrated since the anchor, J.
    since: f64,
    /// The last power reading integrated (W) and its time (UTC ms).
    last: Option<(f64, i64)>,
    /// The span between the last two power readings, ms (the tick interval, as seen).
    spacing_ms: Option<i64>,
    /// The last value shown, J (never lower than the one before, but for a counter reset).
    shown: Option<f64>,
    /// Relative error of the estimate at the last correction: (estimate − counter) / energy
    /// since the correction before (logged at debug level; tests).
    pub last_error: Option<f64>,
}

impl EnergyMeter {
    /// The longest span between power readings integrated now.
    fn max_gap_ms(&self) -> i64 {
        self.spacing_ms
            .map_or(MIN_GAP_MS, |s| MIN_GAP_MS.max(s.saturating_mul(3)))
    }

    /// A reading of the counter, `joules` at `at_ms`. The same reading given again is ignored.
    pub(super) fn anchor(&mut self, joules: f64, at_ms: i64) {
        if !joules.is_finite() || joules < 0.0 {
            return;
        }
        if let Some((j0, t0)) = self.anchor {
            if t0 == at_ms {
                return;
            }
            let estimate = self.estimate_at(at_ms);
            let spent = joules - j0;
            if let Some(e) = estimate.filter(|_| spent > 0.0) {
                self.last_error = Some((e - joules) / spent);
            }
        }
        if self.shown.is_some_and(|s| joules < s * RESET_FRACTION) {
            // the driver's counter started again: so does the value shown
            self.shown = None;
        }
        self.anchor = Some((joules, at_ms));
        // what the readings after the counter's time add (a power reading may be newer)
        self.since = match self.last {
            Some((w, t)) if t > at_ms && t - at_ms <= self.max_gap_ms() => {
                w * (t - at_ms) as f64 / 1e3
            }
            _ => 0.0,
        };
    }

    /// The estimate at `at_ms` from the anchor and the readings up to it (extrapolating the last
    /// power reading when `at_ms` is later).
    fn estimate_at(&self, at_ms: i64) -> Option<f64> {
        let (j, _) = self.anchor?;
        let mut e = j + self.since;
        if let Some((w, t)) = self.last {
            let dt = at_ms - t;
            if dt > 0 && dt <= self.max_gap_ms() {
                e += w * dt as f64 / 1e3;
            }
        }
        Some(e)
    }

    /// A tick's power reading (`None`: the GPU gave none) at `time_ms`; returns the energy to
    /// show: `None` until the counter has been read once, when its last reading is older than
    /// `max_anchor_age_ms` (a counter that stopped answering is not corrected any more), and
    /// while no power reading came for longer than a gap.
    pub(super) fn tick(
        &mut self,
        power_w: Option<f64>,
        time_ms: i64,
        max_anchor_age_ms: i64,
    ) -> Option<f64> {
        if let Some(w) = power_w.filter(|w| w.is_finite() && *w >= 0.0) {
            match self.last {
                // a clock stepped back: start again from here
                Some((_, t)) if time_ms <= t => {
                    self.spacing_ms = None;
                    // the counter's reading is before this tick on the new time line
                    if let Some((_, at)) = self.anchor.as_mut() {
                        *at = (*at).min(time_ms);
                    }
                }
                Some((w0, t)) => {
                    let dt = time_ms - t;
                    if dt <= self.max_gap_ms() {
                        // only the part after the anchor (which already counts what came before)
                        let from = self.anchor.map_or(t, |(_, at)| at.max(t));
                        if time_ms > from {
                            self.since += (w0 + w) / 2.0 * (time_ms - from) as f64 / 1e3;
                        }
                        self.spacing_ms = Some(dt);
                    } else if self.spacing_ms.is_none() {
                        // the first two readings: a tick interval longer than a minute
                        self.spacing_ms = Some(dt);
                    }
                }
                None => {}
            }
            self.last = Some((w, time_ms));
        }
        // no power reading for long: nothing current to add (the counter's own reading is
        // shown while it is current, see `alone`)
        if self
            .last
            .is_none_or(|(_, t)| time_ms - t > self.max_gap_ms())
        {
            return None;
        }
        let (j, at) = self.anchor?;
        if time_ms - at > max_anchor_age_ms {
            return None;
        }
        let value = j + self.since;
        let shown = self.shown.map_or(value, |s| s.max(value));
        self.shown = Some(shown);
        Some(shown)
    }

    /// The counter's own reading, shown when [`EnergyMeter::tick`] has nothing (no power to
    /// integrate): never below a value shown before, unless the counter restarted.
    pub(super) fn alone(&mut self, joules: f64) -> Option<f64> {
        match self.shown {
            Some(s) if joules < s && joules >= s * RESET_FRACTION => None,
            _ => {
                self.shown = Some(joules);
                Some(joules)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400_000;

    /// A day of a training run's power at 1 ms resolution, integrated exactly, against the meter
    /// fed 1 s ticks and an hourly counter reading.
    #[test]
    fn a_day_of_ticks_stays_within_one_percent() {
        // deterministic noise
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut noise = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % 10_000) as f64 / 10_000.0 - 0.5
        };
        // power over the day: phases of training (600 W), evaluation (350 W), idle (70 W),
        // checkpoints (a dip every 30 min), a noise of ±60 W that changes every 100 ms
        let mut power_ms = Vec::with_capacity(86_400_000 / 100);
        for i in 0..(86_400_000 / 100) {
            let t_s = i as f64 / 10.0;
            let phase = (t_s / 3_600.0) as u64 % 6;
            let base = match phase {
                0..=2 => 600.0,
                3 => 350.0,
                4 => 620.0,
                _ => 70.0,
            };
            let dip = if (t_s % 1_800.0) < 20.0 { -300.0 } else { 0.0 };
            power_ms.push((base + dip + 120.0 * noise()).max(50.0));
        }
        // NVML's power reading: the mean over the last second
        let reading = |ms: i64| -> f64 {
            let end = (ms / 100) as usize;
            let start = end.saturating_sub(10);
            let s = &power_ms[start..end.max(start + 1).min(power_ms.len())];
            s.iter().sum::<f64>() / s.len() as f64
        };
        let t0 = 1_700_000_000_000i64;
        let mut m = EnergyMeter::default();
        let mut worst: f64 = 0.0;
        let mut prefix = vec![0.0f64; power_ms.len() + 1];
        for (i, p) in power_ms.iter().enumerate() {
            prefix[i + 1] = prefix[i] + p * 0.1;
        }
        let exact = |ms: i64| prefix[(ms / 100) as usize];
        for s in 1..86_400i64 {
            let ms = s * 1000;
            if ms % 3_600_000 == 1000 {
                // the counter, read in the middle of the tick interval
                m.anchor(exact(ms - 400), t0 + ms - 400);
                if let Some(e) = m.last_error {
                    assert!(e.abs() < 0.01, "correction of {:.3} % at {s} s", e * 100.0);
                }
            }
            let shown = m.tick(Some(reading(ms)), t0 + ms, DAY).expect("anchored");
            let truth = exact(ms);
            if s > 3_600 {
                // against the energy of the last hour (a harder measure than of the whole day)
                let hour = truth - exact(ms - 3_600_000);
                worst = worst.max((shown - truth).abs() / hour);
            }
        }
        assert!(
            worst < 0.01,
            "worst error {:.3} % of an hour's energy",
            worst * 100.0
        );
    }

    #[test]
    fn nothing_is_shown_before_the_counter_is_read() {
        let mut m = EnergyMeter::default();
        assert_eq!(m.tick(Some(500.0), 1_000, DAY), None);
        m.anchor(1_000.0, 1_500);
        // 500 W from the anchor at 1.5 s to 2 s: 250 J
        assert_eq!(m.tick(Some(500.0), 2_000, DAY), Some(1_250.0));
        assert_eq!(m.tick(Some(500.0), 3_000, DAY), Some(1_750.0));
    }

    #[test]
    fn the_value_shown_never_goes_down_but_a_counter_reset_restarts_it() {
        let mut m = EnergyMeter::default();
        m.anchor(10_000.0, 0);
        m.tick(Some(1_000.0), 0, DAY);
        assert_eq!(m.tick(Some(1_000.0), 10_000, DAY), Some(20_000.0));
        // the counter says less than the estimate: held, not lowered
        m.anchor(19_000.0, 10_000);
        assert_eq!(m.tick(Some(1_000.0), 10_500, DAY), Some(20_000.0));
        assert_eq!(m.tick(Some(1_000.0), 12_000, DAY), Some(21_000.0));
        // a driver reload: the counter starts again near 0
        m.anchor(5.0, 12_000);
        assert_eq!(m.tick(Some(1_000.0), 13_000, DAY), Some(1_005.0));
    }

    #[test]
    fn gaps_and_clock_steps_are_not_integrated() {
        let mut m = EnergyMeter::default();
        m.anchor(0.0, 0);
        m.tick(Some(100.0), 0, DAY);
        assert_eq!(m.tick(Some(100.0), 1_000, DAY), Some(100.0));
        // two minutes without an answer at 1 s ticks: not guessed
        assert_eq!(m.tick(Some(100.0), 121_000, DAY), Some(100.0));
        assert_eq!(m.tick(None, 122_000, DAY), Some(100.0));
        assert_eq!(
            m.tick(None, 182_000, DAY),
            None,
            "no power for a minute: not current"
        );
        assert_eq!(m.tick(Some(100.0), 183_000, DAY), Some(100.0));
        assert_eq!(m.tick(Some(100.0), 184_000, DAY), Some(200.0));
        // the wall clock stepped back an hour
        assert_eq!(m.tick(Some(100.0), 184_000 - 3_600_000, DAY), Some(200.0));
        assert_eq!(m.tick(Some(100.0), 185_000 - 3_600_000, DAY), Some(300.0));
    }

    #[test]
    fn ticks_minutes_apart_are_integrated() {
        let mut m = EnergyMeter::default();
        m.anchor(0.0, 0);
        m.tick(Some(100.0), 0, DAY);
        // a 2 min interval: the first span sets the spacing, the next are integrated
        assert_eq!(m.tick(Some(100.0), 120_000, DAY), Some(0.0));
        assert_eq!(m.tick(Some(100.0), 240_000, DAY), Some(12_000.0));
        assert_eq!(m.tick(Some(100.0), 360_000, DAY), Some(24_000.0));
    }

    #[test]
    fn a_reading_newer_than_the_last_tick_is_not_counted_twice() {
        let mut m = EnergyMeter::default();
        m.anchor(0.0, 0);
        m.tick(Some(100.0), 0, DAY);
        m.tick(Some(100.0), 1_000, DAY);
        // the counter read at 2.5 s, given at the tick of 2 s (a slow read that ended late)
        m.anchor(250.0, 2_500);
        assert_eq!(m.tick(Some(100.0), 2_000, DAY), Some(250.0));
        // from 2.5 s on only
        assert_eq!(m.tick(Some(100.0), 3_000, DAY), Some(300.0));
    }

    #[test]
    fn an_old_reading_is_not_corrected_forever() {
        let mut m = EnergyMeter::default();
        m.anchor(0.0, 0);
        m.tick(Some(100.0), 0, 10_000);
        assert_eq!(m.tick(Some(100.0), 10_000, 10_000), Some(1_000.0));
        assert_eq!(m.tick(Some(100.0), 11_000, 10_000), None);
    }

    #[test]
    fn the_counter_alone_never_goes_below_the_value_shown() {
        let mut m = EnergyMeter::default();
        m.anchor(1_000.0, 0);
        m.tick(Some(100.0), 0, DAY);
        assert_eq!(m.tick(Some(100.0), 10_000, DAY), Some(2_000.0));
        // power stops: the counter's older reading is below what was shown
        assert_eq!(m.alone(1_900.0), None);
        assert_eq!(m.alone(2_100.0), Some(2_100.0));
        // a restarted counter is shown
        assert_eq!(m.alone(3.0), Some(3.0));
    }
}
