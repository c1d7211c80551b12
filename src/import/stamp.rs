//! Timestamps as logs write them: nvidia-smi's `2024/05/01 10:00:00.123`, ISO 8601 / RFC 3339
//! (`T` or space, optional fraction and offset), `date`'s and nvidia-smi's table header
//! (`Wed May  1 10:00:00 [UTC] 2024`), dmon's `-o DT` pair (`20240501 10:00:00`), epoch seconds
//! or milliseconds, and seconds elapsed since a start given with `--t0`; `date`'s other forms
//! (`Sun May  4 04:27:32 AM EDT 2025`, `Sun 04 May 2025 04:27:32 AM EDT`, `date -R`), 12-hour
//! clocks (`AM`/`PM`) and `%Y-%m-%d %H:%M:%S %Z`. A zone in the text is honoured: `Z`, a numeric
//! offset (`+0800`, `+08:00`, `-04`) or a name of [`ZONES`]. A time without one is *naive*:
//! [`parse_local`] says so, and the importer reads it in `--tz` (UTC when not given, with one
//! warning). `CST` is US Central (as `date` writes it in Chicago); with `--tz` an ambiguous
//! name (`CST`, `IST`) is read as the `--tz` offset instead (`--tz +08:00` for China).

/// A timestamp cell, before the number case is resolved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stamp {
    /// A calendar time, UTC ms.
    At(i64),
    /// A bare number: epoch seconds/milliseconds or elapsed seconds (see [`Stamp::resolve`]).
    Number(f64),
}

/// Bare numbers at or above this are epoch seconds (1973-03-03); below, seconds since `--t0`.
pub const EPOCH_SECONDS_FROM: f64 = 1e8;
/// Bare numbers at or above this are epoch milliseconds.
const EPOCH_MILLIS_FROM: f64 = 1e11;
/// ... microseconds (`date +%s%6N`; 1e14 µs is 1973) ...
const EPOCH_MICROS_FROM: f64 = 1e14;
/// ... and nanoseconds (`date +%s%N`).
const EPOCH_NANOS_FROM: f64 = 1e17;
/// What [`Stamp::resolve`] says of a time outside [`EARLIEST_MS`]..=[`LATEST_MS`] (a bad cell:
/// the line is skipped and counted).
pub const TOO_LATE: &str = "a timestamp outside the years 1970–2199";
/// Before the epoch is no time a GPU log was written at: a corrupt cell (year 0000).
const EARLIEST_MS: f64 = 0.0;
/// After 2199 neither: a corrupt cell, not a date (`9999/12/31 23:59:60` rolls into the year
/// 10000; a 20-digit number read as nanoseconds lands in the year 5138).
const LATEST_MS: f64 = 7_258_118_399_999.0;

impl Stamp {
    /// UTC ms: calendar times as they are, bare numbers as epoch seconds or milliseconds when
    /// large enough, else as seconds after `t0_ms`. `Err` when a bare elapsed time has no `t0`.
    pub fn resolve(self, t0_ms: Option<i64>) -> Result<i64, &'static str> {
        let epoch_ms = |ms: f64| {
            if (EARLIEST_MS..=LATEST_MS).contains(&ms) {
                Ok(ms.round() as i64)
            } else {
                Err(TOO_LATE)
            }
        };
        match self {
            #[expect(clippy::cast_precision_loss, reason = "a range check")]
            Stamp::At(ms) => epoch_ms(ms as f64),
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

/// What a timestamp's text said of its time zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zone {
    /// Nothing: wall-clock time of an unknown zone (read in `--tz`, else UTC).
    Naive,
    /// A numeric offset, `Z` or an unambiguous name: seconds east of UTC.
    Offset(i32),
    /// A name that means several zones (`CST`, `IST`): seconds east of UTC of the reading
    /// documented in [`ZONES`], unless `--tz` says otherwise.
    Ambiguous(i32),
}

impl Zone {
    /// The offset to read a wall-clock time with, seconds east of UTC: `tz` (`--tz`) for naive
    /// times and ambiguous names, else the zone's own.
    pub fn offset(self, tz: Option<i32>) -> i32 {
        match self {
            Zone::Naive => tz.unwrap_or(0),
            Zone::Offset(o) => o,
            Zone::Ambiguous(o) => tz.unwrap_or(o),
        }
    }
}

/// Zone names read in timestamps and by `--tz`, with their offset east of UTC in minutes and
/// whether the name is ambiguous (then `--tz` wins over the reading given here).
pub const ZONES: &[(&str, i32, bool)] = &[
    ("UTC", 0, false),
    ("GMT", 0, false),
    ("Z", 0, false),
    ("WET", 0, false),
    ("WEST", 60, false),
    ("BST", 60, false),
    ("CET", 60, false),
    ("CEST", 120, false),
    ("MET", 60, false),
    ("MEST", 120, false),
    ("EET", 120, false),
    ("EEST", 180, false),
    ("MSK", 180, false),
    ("IST", 330, true),
    ("SGT", 480, false),
    ("HKT", 480, false),
    ("AWST", 480, false),
    ("JST", 540, false),
    ("KST", 540, false),
    ("AEST", 600, false),
    ("AEDT", 660, false),
    ("NZST", 720, false),
    ("NZDT", 780, false),
    ("HST", -600, false),
    ("AKST", -540, false),
    ("AKDT", -480, false),
    ("PST", -480, false),
    ("PDT", -420, false),
    ("MST", -420, false),
    ("MDT", -360, false),
    ("CST", -360, true),
    ("CDT", -300, false),
    ("EST", -300, false),
    ("EDT", -240, false),
];

/// A zone name of [`ZONES`] (any case).
pub fn zone_name(word: &str) -> Option<Zone> {
    ZONES
        .iter()
        .find(|(n, _, _)| n.eq_ignore_ascii_case(word))
        .map(|&(_, minutes, ambiguous)| {
            if ambiguous {
                Zone::Ambiguous(minutes * 60)
            } else {
                Zone::Offset(minutes * 60)
            }
        })
}

/// `+0800`, `+08:00`, `+08`, `-0430` (also after `UTC`/`GMT`): seconds east of UTC.
pub fn numeric_offset(word: &str) -> Option<i32> {
    let w = word
        .strip_prefix("UTC")
        .or_else(|| word.strip_prefix("GMT"))
        .unwrap_or(word);
    let (sign, rest) = match w.as_bytes().first()? {
        b'+' => (1, &w[1..]),
        b'-' => (-1, &w[1..]),
        _ => return None,
    };
    let two = |t: &str| -> Option<i32> {
        if t.len() == 2 && t.bytes().all(|b| b.is_ascii_digit()) {
            t.parse().ok()
        } else {
            None
        }
    };
    let (h, m) = match rest.len() {
        2 => (two(rest)?, 0),
        4 => (two(rest.get(..2)?)?, two(rest.get(2..)?)?),
        5 if rest.as_bytes()[2] == b':' => (two(rest.get(..2)?)?, two(rest.get(3..)?)?),
        _ => return None,
    };
    (h <= 14 && m < 60).then_some(sign * (h * 3600 + m * 60))
}

/// A zone as `--tz` takes it: a fixed offset (`+08:00`, `-0500`, `UTC+8` is not one) or a name
/// of [`ZONES`]; seconds east of UTC.
pub fn parse_tz(s: &str) -> Option<i32> {
    let s = s.trim();
    numeric_offset(s).or_else(|| zone_name(s).map(|z| z.offset(None)))
}

/// Parses one timestamp cell (a naive time read as UTC).
pub fn parse(s: &str) -> Option<Stamp> {
    parse_local(s).map(|(stamp, zone)| utc(stamp, zone, None))
}

/// A parsed stamp in UTC, naive times and ambiguous names read in `tz` (seconds east of UTC).
pub fn utc(stamp: Stamp, zone: Zone, tz: Option<i32>) -> Stamp {
    match stamp {
        Stamp::At(ms) => Stamp::At(ms - i64::from(zone.offset(tz)) * 1000),
        n => n,
    }
}

/// Parses one timestamp cell: a calendar time as the wall clock it shows (ms as if UTC) and
/// its zone, or a bare number (zone [`Zone::Offset`] 0: epoch numbers are UTC).
pub fn parse_local(s: &str) -> Option<(Stamp, Zone)> {
    let s = s.trim();
    if let Some((ms, zone)) = numeric_date(s.as_bytes()) {
        return Some((Stamp::At(ms), zone));
    }
    if s.bytes().next().is_some_and(|b| b.is_ascii_digit()) {
        if let Ok(n) = s.parse::<f64>() {
            return n.is_finite().then_some((Stamp::Number(n), Zone::Offset(0)));
        }
    }
    words_time(s).map(|(ms, zone)| (Stamp::At(ms), zone))
}

/// Characters that decorate a time line written between samples (`==== date ====`,
/// `--- date ---`, `[date]`, `# date`).
const DECORATION: &[char] = &[
    '=', '-', '#', '*', '[', ']', '<', '>', '|', '~', '+', ' ', '\t',
];

/// A line that is a time and nothing else, decorations around it aside (the `echo "==== $(date)
/// ===="` of a sampling loop, a `date` line): the wall-clock time and zone. A bare number is
/// one only when it is an epoch time (`date +%s`), never an elapsed count.
pub fn separator(line: &str) -> Option<(Stamp, Zone)> {
    let t = line.trim().trim_matches(DECORATION).trim();
    if t.is_empty() {
        return None;
    }
    match parse_local(t)? {
        (Stamp::Number(n), z) if n >= EPOCH_SECONDS_FROM => Some((Stamp::Number(n), z)),
        (Stamp::Number(_), _) => None,
        at => Some(at),
    }
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

/// `YYYY?MM?DD[ T]HH:MM:SS[.f+][Z|±HH[:]MM]` and `YYYYMMDD HH:MM:SS` (dmon), optionally followed
/// by ` AM`/` PM` and a zone (` EDT`, ` +0800`), by hand: these are the timestamps of every row
/// of a large log, and chrono's format parser is several times slower. The wall-clock ms (as if
/// UTC) and the zone.
fn numeric_date(b: &[u8]) -> Option<(i64, Zone)> {
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
    let (h, zone) = match b.get(i) {
        None => (h, Zone::Naive),
        Some(b'Z' | b'z') if i + 1 == b.len() => (h, Zone::Offset(0)),
        Some(b'+' | b'-') => (
            h,
            Zone::Offset(numeric_offset(std::str::from_utf8(&b[i..]).ok()?)?),
        ),
        Some(b' ') => {
            let (h12, zone) = clock_tail(std::str::from_utf8(&b[i..]).ok()?, h)?;
            (h12, zone)
        }
        _ => return None,
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec;
    Some((secs * 1000 + ms, zone))
}

/// What may follow a clock: ` AM`/` PM`, then a zone name or numeric offset (each optional,
/// nothing else): the hour on the 24-hour clock and the zone.
fn clock_tail(tail: &str, h: i64) -> Option<(i64, Zone)> {
    let mut h = h;
    let mut zone = Zone::Naive;
    let mut words = tail.split_whitespace().peekable();
    if let Some(pm) = words.peek().and_then(|w| meridiem(w)) {
        h = twelve_hour(h, pm)?;
        words.next();
    }
    if let Some(w) = words.next() {
        zone = zone_word(w)?;
    }
    words.next().is_none().then_some((h, zone))
}

/// `AM` → false, `PM` → true.
fn meridiem(w: &str) -> Option<bool> {
    if w.eq_ignore_ascii_case("am") || w.eq_ignore_ascii_case("a.m.") {
        Some(false)
    } else if w.eq_ignore_ascii_case("pm") || w.eq_ignore_ascii_case("p.m.") {
        Some(true)
    } else {
        None
    }
}

/// 12 AM is 0, 12 PM is 12; an hour past 12 is no 12-hour clock.
fn twelve_hour(h: i64, pm: bool) -> Option<i64> {
    match (h, pm) {
        (1..=11, false) => Some(h),
        (12, false) => Some(0),
        (1..=11, true) => Some(h + 12),
        (12, true) => Some(12),
        _ => None,
    }
}

/// A zone word: a name of [`ZONES`] or a numeric offset (`+0800`, `UTC+08:00`).
fn zone_word(w: &str) -> Option<Zone> {
    zone_name(w).or_else(|| numeric_offset(w).map(Zone::Offset))
}

/// `Wed May  1 10:00:00 2024` (ctime, nvidia-smi's table header) as UTC: [`words_time`] with a
/// naive time read as UTC.
pub fn ctime(s: &str) -> Option<i64> {
    words_time(s).map(|(ms, zone)| ms - i64::from(zone.offset(None)) * 1000)
}

/// `date`'s and ctime's forms, word by word: an optional weekday, the month's name and the day
/// in either order, the year before or after the clock, `HH:MM:SS[.f]`, optional `AM`/`PM`, an
/// optional zone (`Wed May  1 10:00:00 2024`, `Sun May  4 04:27:32 AM EDT 2025`,
/// `Sun 04 May 2025 04:27:32 AM EDT`, `Sun, 04 May 2025 04:27:32 -0400`). Any other word makes
/// it no time. The wall-clock ms (as if UTC) and the zone.
pub fn words_time(s: &str) -> Option<(i64, Zone)> {
    const MONTHS: [&str; 12] = [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
    let named = |w: &str, names: &[&str]| -> Option<usize> {
        let key = w.get(..3)?.to_ascii_lowercase();
        let full_alpha = w.len() <= 9 && w.bytes().all(|b| b.is_ascii_alphabetic() || b == b'.');
        names.iter().position(|m| *m == key).filter(|_| full_alpha)
    };
    let (mut month, mut day, mut year, mut clock, mut pm, mut zone) =
        (None, None, None, None, None, Zone::Naive);
    let mut seen_weekday = false;
    for w in s.split_whitespace() {
        let w = w.trim_end_matches(',');
        if w.is_empty() {
            continue;
        }
        if let Some(m) = named(w, &MONTHS).filter(|_| month.is_none()) {
            month = Some(m);
        } else if named(w, &DAYS).is_some() && !seen_weekday && month.is_none() && day.is_none() {
            seen_weekday = true;
        } else if w.contains(':') && clock.is_none() && w.as_bytes()[0].is_ascii_digit() {
            clock = Some(hms(w)?);
        } else if let Some(p) = meridiem(w).filter(|_| clock.is_some() && pm.is_none()) {
            pm = Some(p);
        } else if w.bytes().all(|b| b.is_ascii_digit()) {
            let n: i64 = w.parse().ok()?;
            if w.len() == 4 && year.is_none() {
                year = Some(n);
            } else if w.len() <= 2 && day.is_none() {
                day = Some(n);
            } else {
                return None;
            }
        } else if let (Some(z), Zone::Naive) = (zone_word(w), zone) {
            zone = z;
        } else {
            return None;
        }
    }
    let (mo, d, year, (h, mi, sec, ms)) = (month?, day?, year?, clock?);
    let h = match pm {
        Some(p) => twelve_hour(h, p)?,
        None => h,
    };
    let mo = i64::try_from(mo).ok()? + 1;
    if !(1970..=9999).contains(&year)
        || d < 1
        || d > days_in_month(year, mo)
        || h > 23
        || mi > 59
        || sec > 60
    {
        return None;
    }
    let secs = days_from_civil(year, mo, d) * 86_400 + h * 3600 + mi * 60 + sec;
    Some((secs * 1000 + ms, zone))
}

/// `HH:MM:SS[.fff]` → (h, m, s, ms).
fn hms(w: &str) -> Option<(i64, i64, i64, i64)> {
    let (clock, frac) = w.split_once(['.', ',']).unwrap_or((w, ""));
    let mut p = clock.split(':').map(|p| p.parse::<i64>().ok());
    let (h, mi, sec) = (p.next()??, p.next()??, p.next()??);
    if p.next().is_some() || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let ms = frac
        .bytes()
        .take(3)
        .zip([100, 10, 1])
        .map(|(b, scale)| i64::from(b - b'0') * scale)
        .sum();
    Some((h, mi, sec, ms))
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
        assert_eq!(at("May 1 12:00:00 CEST 2024"), base);
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
        // Out of range: a leap second rolling into the year 10000, a 20-digit number (year 5138
        // as nanoseconds), the year 0000.
        for bad in [
            "9999/12/31 23:59:60",
            "99999999999999999999",
            "0000/01/01 00:00:00",
            "2250-01-01T00:00:00Z",
        ] {
            assert!(
                parse(bad).is_none_or(|s| s.resolve(None) == Err(TOO_LATE)),
                "{bad}"
            );
        }
        assert!(parse("2199/12/31 23:59:59").unwrap().resolve(None).is_ok());
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
            Some((951_782_400_000, Zone::Naive)),
            "leap day"
        );
    }

    /// `date`'s default forms, 12-hour clocks and zones (names and offsets) are honoured.
    #[test]
    fn date_forms_and_zones() {
        let base = 1_746_347_252_000; // 2025-05-04T08:27:32Z
        assert_eq!(at("Sun May  4 04:27:32 AM EDT 2025"), base);
        assert_eq!(at("Sun May  4 04:27:32 EDT 2025"), base);
        assert_eq!(at("Sun 04 May 2025 04:27:32 AM EDT"), base);
        assert_eq!(at("Sun, 04 May 2025 04:27:32 -0400"), base);
        assert_eq!(at("Sun May  4 16:27:32 CST 2025"), base + 14 * 3_600_000);
        assert_eq!(at("Sun May  4 04:27:32 PM +08:00 2025"), base);
        assert_eq!(at("2025-05-04 04:27:32 EDT"), base);
        assert_eq!(at("2025-05-04 04:27:32 AM EDT"), base);
        assert_eq!(at("2025-05-04 12:27:32 PM UTC+04:00"), base);
        assert_eq!(at("2025-05-04 17:27:32 JST"), base);
        assert_eq!(at("2025-05-04 12:27:32 AM"), base - 8 * 3_600_000);
        // Naive and ambiguous times say so; `--tz` reads them.
        let (stamp, zone) = parse_local("Sun May  4 04:27:32 AM 2025").unwrap();
        assert_eq!(zone, Zone::Naive);
        assert_eq!(utc(stamp, zone, Some(-4 * 3600)), Stamp::At(base));
        let (stamp, zone) = parse_local("Sun May  4 16:27:32 CST 2025").unwrap();
        assert_eq!(utc(stamp, zone, Some(8 * 3600)), Stamp::At(base));
        let (stamp, zone) = parse_local("Sun May  4 04:27:32 EDT 2025").unwrap();
        assert_eq!(
            utc(stamp, zone, Some(8 * 3600)),
            Stamp::At(base),
            "a zone name wins"
        );
        for bad in [
            "Sun May  4 13:27:32 PM EDT 2025",
            "Sun May  4 04:27:32 XYZ 2025",
            "Sun May  4 04:27:32 EDT EDT 2025",
            "May the 4th 04:27:32 2025",
            "2025-05-04 04:27:32 PM PM",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
        assert_eq!(parse_tz("+08:00"), Some(8 * 3600));
        assert_eq!(parse_tz("-0530"), Some(-(5 * 3600 + 30 * 60)));
        assert_eq!(parse_tz("cst"), Some(-6 * 3600));
        assert_eq!(parse_tz("Mars/Olympus"), None);
    }

    /// Time lines between samples, decorated or not; elapsed counts are never one.
    #[test]
    fn separators() {
        let base = 1_746_347_252_000;
        let sep = |l: &str| separator(l).map(|(s, z)| utc(s, z, None));
        assert_eq!(
            sep("==== Sun May  4 04:27:32 AM EDT 2025 ===="),
            Some(Stamp::At(base))
        );
        assert_eq!(sep("--- 2025-05-04T08:27:32Z ---"), Some(Stamp::At(base)));
        assert_eq!(sep("[2025-05-04 08:27:32]"), Some(Stamp::At(base)));
        assert_eq!(sep("1746347252"), Some(Stamp::Number(1_746_347_252.0)));
        assert_eq!(sep("3.477"), None);
        assert_eq!(sep("===="), None);
        assert_eq!(sep("2025-05-04 08:27:32, 0, 45"), None);
    }
}
