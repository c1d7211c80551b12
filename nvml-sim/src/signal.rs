//! Signals: a metric's value as a pure function of scenario time (seconds).
//!
//! Every signal is evaluated on demand from the elapsed scenario time, so a call costs
//! nanoseconds and needs no background thread. Noise is deterministic: it is derived from a
//! seed (scenario seed, GPU index, metric name) and the time bucket, never from a RNG state.

use std::sync::Arc;

use crate::trace::Trace;

/// One signal, with optional additive noise and clamping.
#[derive(Debug, Clone)]
pub struct Signal {
    /// The shape of the signal.
    pub shape: Shape,
    /// Amplitude of deterministic noise added on top (0 = none).
    pub noise: f64,
    /// Period of the added noise in seconds (how often it changes).
    pub noise_period_s: f64,
    /// Lower clamp.
    pub min: Option<f64>,
    /// Upper clamp.
    pub max: Option<f64>,
    /// Extra seed mixed into the noise of this signal.
    pub seed: u64,
}

/// The shape of a signal.
#[derive(Debug, Clone)]
pub enum Shape {
    /// A constant value.
    Constant(f64),
    /// `from` until `start_s`, then changes by `per_s` each second, stopping at `to` if set.
    Ramp {
        from: f64,
        to: Option<f64>,
        start_s: f64,
        per_s: f64,
    },
    /// `high` for the first `duty` fraction of every period, `low` for the rest.
    Square {
        period_s: f64,
        duty: f64,
        high: f64,
        low: f64,
        phase_s: f64,
    },
    /// A sine wave around `mean`.
    Sine {
        mean: f64,
        amplitude: f64,
        period_s: f64,
        phase_s: f64,
    },
    /// Smooth deterministic noise: `mean ± amplitude`, changing every `period_s`.
    Noise {
        mean: f64,
        amplitude: f64,
        period_s: f64,
    },
    /// Piecewise: from each point's time on, the value follows that point's signal.
    /// Points are sorted by time; before the first point the first signal applies.
    Steps(Vec<(f64, Signal)>),
    /// Replay of a CSV trace column.
    Trace {
        trace: Arc<Trace>,
        looped: bool,
        scale: f64,
        offset: f64,
    },
}

impl Signal {
    /// A constant signal with no noise.
    pub fn constant(value: f64) -> Signal {
        Signal::from_shape(Shape::Constant(value))
    }

    /// A signal with the given shape and no noise or clamping.
    pub fn from_shape(shape: Shape) -> Signal {
        Signal {
            shape,
            noise: 0.0,
            noise_period_s: 1.0,
            min: None,
            max: None,
            seed: 0,
        }
    }

    /// The value at scenario time `t_s`; `seed` makes the noise differ per GPU and metric.
    pub fn eval(&self, t_s: f64, seed: u64) -> f64 {
        let seed = mix(seed, self.seed);
        let mut value = match &self.shape {
            Shape::Constant(v) => *v,
            Shape::Ramp {
                from,
                to,
                start_s,
                per_s,
            } => {
                if t_s <= *start_s {
                    *from
                } else {
                    let v = from + per_s * (t_s - start_s);
                    match to {
                        Some(to) if *per_s >= 0.0 => v.min(*to),
                        Some(to) => v.max(*to),
                        None => v,
                    }
                }
            }
            Shape::Square {
                period_s,
                duty,
                high,
                low,
                phase_s,
            } => {
                let phase = (t_s + phase_s).rem_euclid(*period_s) / period_s;
                if phase < *duty {
                    *high
                } else {
                    *low
                }
            }
            Shape::Sine {
                mean,
                amplitude,
                period_s,
                phase_s,
            } => mean + amplitude * (std::f64::consts::TAU * (t_s + phase_s) / period_s).sin(),
            Shape::Noise {
                mean,
                amplitude,
                period_s,
            } => mean + amplitude * smooth_noise(seed, t_s, *period_s),
            Shape::Steps(points) => {
                // Last point whose time is <= t (points are sorted); the first one before that.
                let idx = points
                    .partition_point(|(at, _)| *at <= t_s)
                    .saturating_sub(1);
                match points.get(idx) {
                    Some((_, signal)) => signal.eval(t_s, mix(seed, idx as u64 + 1)),
                    None => 0.0,
                }
            }
            Shape::Trace {
                trace,
                looped,
                scale,
                offset,
            } => trace.value_at(t_s, *looped) * scale + offset,
        };
        if self.noise != 0.0 {
            value += self.noise * smooth_noise(mix(seed, 0x6e6f697365), t_s, self.noise_period_s);
        }
        if let Some(min) = self.min {
            value = value.max(min);
        }
        if let Some(max) = self.max {
            value = value.min(max);
        }
        value
    }
}

/// SplitMix64 finaliser: a fast, well-mixed 64-bit hash.
pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Combines two seeds.
pub fn mix(a: u64, b: u64) -> u64 {
    splitmix(a ^ splitmix(b))
}

/// A stable hash of a string (FNV-1a), for seeding per metric name.
pub fn hash_str(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Uniform value in [-1, 1] for an integer bucket.
fn bucket_noise(seed: u64, bucket: i64) -> f64 {
    let h = mix(seed, bucket as u64);
    // 53 random bits -> [0, 1) -> [-1, 1)
    (h >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
}

/// Value noise in [-1, 1]: random values at every `period_s`, smoothly interpolated.
pub fn smooth_noise(seed: u64, t_s: f64, period_s: f64) -> f64 {
    let period_s = if period_s > 0.0 { period_s } else { 1.0 };
    let x = t_s / period_s;
    let k = x.floor();
    let frac = x - k;
    let k = k as i64;
    let a = bucket_noise(seed, k);
    let b = bucket_noise(seed, k + 1);
    let s = frac * frac * (3.0 - 2.0 * frac);
    a + (b - a) * s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_and_clamp() {
        let mut s = Signal::constant(120.0);
        assert_eq!(s.eval(5.0, 1), 120.0);
        s.max = Some(100.0);
        assert_eq!(s.eval(5.0, 1), 100.0);
    }

    #[test]
    fn ramp_starts_late_and_stops_at_to() {
        let s = Signal::from_shape(Shape::Ramp {
            from: 10.0,
            to: Some(20.0),
            start_s: 5.0,
            per_s: 1.0,
        });
        assert_eq!(s.eval(0.0, 0), 10.0);
        assert_eq!(s.eval(5.0, 0), 10.0);
        assert_eq!(s.eval(8.0, 0), 13.0);
        assert_eq!(s.eval(100.0, 0), 20.0);
        let down = Signal::from_shape(Shape::Ramp {
            from: 10.0,
            to: Some(0.0),
            start_s: 0.0,
            per_s: -2.0,
        });
        assert_eq!(down.eval(2.0, 0), 6.0);
        assert_eq!(down.eval(20.0, 0), 0.0);
    }

    #[test]
    fn square_wave_duty_and_mean() {
        let s = Signal::from_shape(Shape::Square {
            period_s: 3.0,
            duty: 2.0 / 3.0,
            high: 68.0,
            low: 0.0,
            phase_s: 0.0,
        });
        assert_eq!(s.eval(0.5, 0), 68.0);
        assert_eq!(s.eval(1.9, 0), 68.0);
        assert_eq!(s.eval(2.5, 0), 0.0);
        assert_eq!(s.eval(3.1, 0), 68.0);
        let n = 3000;
        let mean: f64 = (0..n).map(|i| s.eval(i as f64 * 0.01, 0)).sum::<f64>() / n as f64;
        assert!((mean - 45.33).abs() < 0.5, "mean {mean}");
    }

    #[test]
    fn noise_is_deterministic_bounded_and_seeded() {
        let s = Signal::from_shape(Shape::Noise {
            mean: 50.0,
            amplitude: 5.0,
            period_s: 1.0,
        });
        let a: Vec<f64> = (0..200).map(|i| s.eval(i as f64 * 0.37, 7)).collect();
        let b: Vec<f64> = (0..200).map(|i| s.eval(i as f64 * 0.37, 7)).collect();
        let c: Vec<f64> = (0..200).map(|i| s.eval(i as f64 * 0.37, 8)).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().all(|v| (45.0..=55.0).contains(v)));
        let mean = a.iter().sum::<f64>() / a.len() as f64;
        assert!((mean - 50.0).abs() < 1.5, "mean {mean}");
        // it actually varies
        assert!(a.iter().any(|v| (v - 50.0).abs() > 1.0));
    }

    #[test]
    fn steps_hold_until_next_point() {
        let s = Signal::from_shape(Shape::Steps(vec![
            (0.0, Signal::constant(600.0)),
            (30.0, Signal::constant(90.0)),
        ]));
        assert_eq!(s.eval(0.0, 0), 600.0);
        assert_eq!(s.eval(29.99, 0), 600.0);
        assert_eq!(s.eval(30.0, 0), 90.0);
        assert_eq!(s.eval(1e6, 0), 90.0);
        let late = Signal::from_shape(Shape::Steps(vec![(10.0, Signal::constant(1.0))]));
        assert_eq!(late.eval(0.0, 0), 1.0);
    }

    #[test]
    fn sine_and_added_noise() {
        let mut s = Signal::from_shape(Shape::Sine {
            mean: 10.0,
            amplitude: 2.0,
            period_s: 4.0,
            phase_s: 0.0,
        });
        assert!((s.eval(1.0, 0) - 12.0).abs() < 1e-9);
        s.noise = 1.0;
        s.min = Some(0.0);
        let v = s.eval(1.0, 3);
        assert!((11.0..=13.0).contains(&v));
    }
}
