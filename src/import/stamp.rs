//! Timestamps as logs write them: nvidia-smi's `2024/05/01 10:00:00.123`, ISO 8601 / RFC 3339
//! (`T` or space, optional fraction and offset), `date`'s and nvidia-smi's table header
//! (`Wed May  1 10:00:00 [UTC] 2024`), dmon's `-o DT` pair (`20240501 10:00:00`), epoch seconds
//! or milliseconds, and seconds elapsed since a start given with `--t0`. Times without an offset
//! are read as UTC (a log does not say its time zone; pass ISO times with offsets to be exact).

/// A timestamp cell, before the number case is resolved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stamp {
    /// A calendar time, UTC ms.
    At(i64),
    /// A bare number: epoch seconds/milliseconds or elapsed seconds (see [`Stamp::resolve`]).
    Number(f64),
}

/// Bare numbers at or above this are epoch seconds (1973-03-03); below, seconds since `--t0`.
const EPOCH_SECONDS_FROM: f64 = 1e8;
/// Bare numbers at or above this are epoch milliseconds.
const EPOCH_MILLIS_FROM: f64 = 1e11;
/// ... microseconds (`date +%s%6N`; 1e14 µs is 1973) ...
const EPOCH_MICROS_FROM: f64 = 1e14;
/// ... and nanoseconds (`date +%s%N`).
const EPOCH_NANOS_FROM: f64 = 1e17;
/// What [`Stamp::resolve`] says of a number past [`LATEST_MS`] (a bad cell: the line is skipped).
pub const TOO_LATE: &str = "a timestamp after the year 9999";
/// Later than this (year 9999) is no time: a corrupt cell, not a date.
const LATEST_MS: f64 = 253_402_300_799_999.0;

impl Stamp {
    /// UTC ms: calendar times as they are, bare numbers as epoch seconds or milliseconds when
    /// large enough, else as seconds after `t0_ms`. `Err` when a bare elapsed time has no `t0`.
    pub fn resolve(self, t0_ms: Option<i64>) -> Result<i64, &'static str> {
        let epoch_ms = |ms: f64| {
            if ms > LATEST_MS {
                Err(TOO_LATE)
            } else {
                Ok(ms.round() as i64)
            }
        };
        match self {
            Stamp::At(ms) => Ok(ms),
            Stamp::Number(n) if n >= EPOCH_NANOS_FROM => epoch_ms(n / 1e6),
            Stamp::Number(n) if n >= EPOCH_MICROS_FROM => epoch_ms(n / 1e3),
            Stamp::Number(n) if n >= EPOCH_MILLIS_FROM => epoch_ms(n),
            Stamp::Number(n) if n >= EPOCH_SECONDS_FROM => epoch_ms(n * 1000.0),
            Stamp::Number(n) => match t0_ms {
                Some(t0) => Ok(t0 + (n * 1000.0).round() as i64),
                None => Err("the timestamps are seconds since the start: pass --t0 TIME"),
            },
        }
    }
}

/// Parses one timestamp cell.
pub fn parse(s: &str) -> Option<Stamp> {
    let s = s.trim();
    if let Some(ms) = numeric_date(s.as_bytes()) {
        return Some(Stamp::At(ms));
    }
    if s.bytes().next().is_some_and(|b| b.is_ascii_digit()) {
        if let Ok(n) = s.parse::<f64>() {
            return n.is_finite().then_some(Stamp::Number(n));
        }
    }
    ctime(s).map(Stamp::At)
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// `YYYY?MM?DD[ T]HH:MM:SS[.f+][Z|±HH[:]MM]` and `YYYYMMDD HH:MM:SS` (dmon), by hand: these are
/// the timestamps of every row of a large log, and chrono's format parser is several times slower.
fn numeric_date(b: &[u8]) -> Option<i64> {
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let mut v = 0i64;
        for &c in b.get(r)? {
            if !c.is_ascii_digit() {
                return None;
            }
            v = v * 10 + i64::from(c - b'0');
        }
        Some(v)
    };
    let (y, mo, d, rest) = if b.len() >= 10 && matches!(b[4], b'/' | b'-') && b[7] == b[4] {
        (num(0..4)?, num(5..7)?, num(8..10)?, 10)
    } else if b.len() >= 8 && b.get(8).is_some_and(|c| *c == b' ' || *c == b'T') {
        (num(0..4)?, num(4..6)?, num(6..8)?, 8)
    } else {
        return None;
    };
    if !(1..=12).contains(&mo) || d < 1 || d > days_in_month(y, mo) {
        return None;
    }
    // One or more spaces (dmon pads its columns) or a `T`.
    let mut i = rest;
    if b.get(i) == Some(&b'T') {
        i += 1;
    } else {
        while b.get(i) == Some(&b' ') {
            i += 1;
        }
        if i == rest {
            return None;
        }
    }
    let (h, mi, sec) = (num(i..i + 2)?, num(i + 3..i + 5)?, num(i + 6..i + 8)?);
    if b.get(i + 2) != Some(&b':') || b.get(i + 5) != Some(&b':') || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    i += 8;
    let mut ms = 0i64;
    if matches!(b.get(i), Some(b'.' | b',')) {
        i += 1;
        let mut scale = 100;
        let start = i;
        while let Some(c) = b.get(i).filter(|c| c.is_ascii_digit()) {
            ms += i64::from(c - b'0') * scale;
            scale /= 10;
            i += 1;
        }
        if i == start {
            return None;
        }
    }
    let offset_s = match b.get(i) {
        None => 0,
        Some(b'Z' | b'z') if i + 1 == b.len() => 0,
        Some(&sign @ (b'+' | b'-')) => {
            let zone = &b[i + 1..];
            let two = |z: &[u8]| -> Option<i64> {
                (z.len() == 2 && z.iter().all(u8::is_ascii_digit))
                    .then(|| i64::from(z[0] - b'0') * 10 + i64::from(z[1] - b'0'))
            };
            let (oh, om) = match zone.len() {
                2 => (two(zone)?, 0),
                4 => (two(&zone[..2])?, two(&zone[2..])?),
                5 if zone[2] == b':' => (two(&zone[..2])?, two(&zone[3..])?),
                _ => return None,
            };
            let o = oh * 3600 + om * 60;
            if sign == b'+' {
                o
            } else {
                -o
            }
        }
        _ => return None,
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec - offset_s;
    Some(secs * 1000 + ms)
}

/// `Wed May  1 10:00:00 2024` (ctime, nvidia-smi's table header) and `Wed May  1 10:00:00 UTC
/// 2024` (`date`; the zone word is ignored: times are read as UTC). The weekday is optional.
pub fn ctime(s: &str) -> Option<i64> {
    const MONTHS: [&str; 12] = [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    let words: Vec<&str> = s.split_whitespace().collect();
    let month = |w: &str| {
        let key = w.get(..3)?.to_ascii_lowercase();
        MONTHS.iter().position(|m| *m == key)
    };
    let month_at = words.iter().position(|w| month(w).is_some())?;
    if month_at > 1 {
        return None;
    }
    let mo = month(words[month_at])?;
    let d: i64 = words.get(month_at + 1)?.parse().ok()?;
    let clock = words.get(month_at + 2)?;
    let year: i64 = words.last()?.parse().ok()?;
    let extra = words.len() - (month_at + 3);
    if !(1..=2).contains(&extra) || !(1970..=9999).contains(&year) {
        return None;
    }
    let mut hms = clock.split(':').map(|p| p.parse::<i64>().ok());
    let (h, mi, sec) = (hms.next()??, hms.next()??, hms.next()??);
    let mo = i64::try_from(mo).ok()? + 1;
    if d < 1 || d > days_in_month(year, mo) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    Some((days_from_civil(year, mo, d) * 86_400 + h * 3600 + mi * 60 + sec) * 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> i64 {
        match parse(s) {
            Some(Stamp::At(ms)) => ms,
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn every_shape() {
        let base = 1_714_557_600_000; // 2024-05-01T10:00:00Z
        assert_eq!(at("2024/05/01 10:00:00.123"), base + 123);
        assert_eq!(at("2024-05-01 10:00:00"), base);
        assert_eq!(at("2024-05-01T10:00:00.5Z"), base + 500);
        assert_eq!(at("2024-05-01T12:00:00+02:00"), base);
        assert_eq!(at("2024-05-01T05:30:00-0430"), base);
        assert_eq!(at("20240501   10:00:00"), base);
        assert_eq!(at("Wed May  1 10:00:00 2024"), base);
        assert_eq!(at("Wed May  1 10:00:00 UTC 2024"), base);
        assert_eq!(at("May 1 10:00:00 CEST 2024"), base);
        assert_eq!(parse("1714557600.5").unwrap().resolve(None), Ok(base + 500));
        assert_eq!(
            parse("1714557600123").unwrap().resolve(None),
            Ok(base + 123)
        );
        assert_eq!(
            parse("12.5").unwrap().resolve(Some(base)),
            Ok(base + 12_500)
        );
        assert!(parse("12.5").unwrap().resolve(None).is_err());
        // `date +%s%6N` and `date +%s%N`; a number past the year 9999 is no time.
        assert_eq!(
            parse("1714557600123456").unwrap().resolve(None),
            Ok(base + 123)
        );
        assert_eq!(
            parse("1714557600123456789").unwrap().resolve(None),
            Ok(base + 123)
        );
        assert_eq!(parse("1e30").unwrap().resolve(None), Err(TOO_LATE));
        for bad in [
            "2024/13/01 10:00:00",
            "2024/02/30 10:00:00",
            "2024/05/01 25:00:00",
            "2024/05/01 10:00:0",
            "2024/05/01",
            "yesterday",
            "NaN",
            "2024/05/01 10:00:00 junk",
        ] {
            assert!(
                !matches!(parse(bad), Some(Stamp::At(_))) || bad.is_empty(),
                "{bad}"
            );
        }
        assert_eq!(
            numeric_date(b"2000-02-29 00:00:00"),
            Some(951_782_400_000),
            "leap day"
        );
    }
}
