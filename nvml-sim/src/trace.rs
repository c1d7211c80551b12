//! CSV traces: one column of a CSV file replayed as a signal.
//!
//! The time of each row comes from a time column (seconds as a number, or a timestamp such as
//! `2026-12-02T15:00:00.123Z` or nvidia-smi's `2026/12/02 15:00:00.123`, taken relative to the
//! first row) or, without one, from the row number × `interval_s`. Cells may carry units as
//! nvidia-smi writes them (`" 95 %"`, `"612.34 W"`): the leading number is used. Rows whose value
//! cell is empty or not a number are skipped. Between rows the last value is held.

/// A parsed trace: (time in seconds from the first row, value), sorted by time.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    points: Vec<(f64, f64)>,
    /// Time of the last row plus one interval: the loop length.
    length_s: f64,
}

/// Which rows and columns of a CSV to read.
#[derive(Debug, Clone, Default)]
pub struct TraceSpec {
    /// Value column: a header name (trimmed, case-insensitive) or a 0-based index.
    pub column: String,
    /// Time column (header name or index); `None` → row number × `interval_s`.
    pub time_column: Option<String>,
    /// Seconds between rows when there is no time column.
    pub interval_s: f64,
    /// Only rows whose `match_column` cell equals `match_value` (e.g. the GPU index).
    pub match_column: Option<String>,
    /// See `match_column`.
    pub match_value: Option<String>,
}

impl Trace {
    /// Parses CSV text according to `spec`.
    pub fn parse(text: &str, spec: &TraceSpec) -> Result<Trace, String> {
        let mut lines = text.lines().filter(|l| !l.trim().is_empty());
        let header = split_csv_line(lines.next().ok_or("the CSV file is empty")?);
        let find = |name: &str| -> Result<usize, String> {
            let wanted = name.trim().to_ascii_lowercase();
            if let Some(i) = header
                .iter()
                .position(|h| h.trim().to_ascii_lowercase() == wanted)
            {
                return Ok(i);
            }
            if let Ok(i) = wanted.parse::<usize>() {
                if i < header.len() {
                    return Ok(i);
                }
            }
            Err(format!(
                "no column `{name}` in the CSV header (columns: {})",
                header
                    .iter()
                    .map(|h| h.trim())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        };
        let value_col = find(&spec.column)?;
        let time_col = spec.time_column.as_deref().map(find).transpose()?;
        let match_col = spec.match_column.as_deref().map(find).transpose()?;
        let interval_s = if spec.interval_s > 0.0 {
            spec.interval_s
        } else {
            1.0
        };
        let mut points = Vec::new();
        let mut first_time: Option<f64> = None;
        let mut row_number = 0usize;
        for line in lines {
            let cells = split_csv_line(line);
            if let (Some(col), Some(want)) = (match_col, spec.match_value.as_deref()) {
                if cells.get(col).map(|c| c.trim()) != Some(want.trim()) {
                    continue;
                }
            }
            let t = match time_col {
                Some(col) => {
                    let cell = cells.get(col).map(String::as_str).unwrap_or("");
                    let abs = parse_time(cell)
                        .ok_or_else(|| format!("cannot read time `{}`", cell.trim()))?;
                    abs - *first_time.get_or_insert(abs)
                }
                None => row_number as f64 * interval_s,
            };
            row_number += 1;
            if let Some(v) = cells.get(value_col).and_then(|c| leading_number(c)) {
                points.push((t, v));
            }
        }
        if points.is_empty() {
            return Err(format!("column `{}` has no numeric values", spec.column));
        }
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let last = points.last().map(|p| p.0).unwrap_or(0.0);
        let step = if points.len() > 1 {
            last / (points.len() - 1) as f64
        } else {
            interval_s
        };
        Ok(Trace {
            points,
            length_s: last + step.max(1e-3),
        })
    }

    /// The value at scenario time `t_s` (held between rows; the last value after the end unless
    /// `looped`).
    pub fn value_at(&self, t_s: f64, looped: bool) -> f64 {
        let t = if looped {
            t_s.rem_euclid(self.length_s)
        } else {
            t_s
        };
        let idx = self.points.partition_point(|p| p.0 <= t).saturating_sub(1);
        self.points.get(idx).map(|p| p.1).unwrap_or(0.0)
    }
}

/// Splits one CSV line RFC-4180 style (quotes, doubled quotes inside quotes).
pub fn split_csv_line(line: &str) -> Vec<String> {
    let mut cells = Vec::new();
    let mut cur = String::new();
    let mut in_quotes = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, in_quotes) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            ('"', true) => in_quotes = false,
            ('"', false) if cur.trim().is_empty() => {
                cur.clear();
                in_quotes = true;
            }
            (',', false) => cells.push(std::mem::take(&mut cur)),
            (c, _) => cur.push(c),
        }
    }
    cells.push(cur);
    cells
}

/// The leading number of a cell such as `" 95 %"` or `"612.34 W"`.
pub fn leading_number(cell: &str) -> Option<f64> {
    let s = cell.trim();
    let end = s
        .char_indices()
        .find(|&(i, c)| {
            !(c.is_ascii_digit() || c == '.' || ((c == '-' || c == '+') && i == 0) || c == 'e')
        })
        .map(|(i, _)| i)
        .unwrap_or(s.len());
    s[..end].parse::<f64>().ok()
}

/// Seconds from a number, or from a `YYYY-MM-DD[T ]HH:MM:SS[.fff][Z]` / `YYYY/MM/DD ...` timestamp
/// (UTC; only differences matter).
pub fn parse_time(cell: &str) -> Option<f64> {
    let s = cell.trim();
    if let Ok(v) = s.parse::<f64>() {
        return Some(v);
    }
    let b = s.as_bytes();
    if b.len() < 19 {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> { s.get(r)?.parse::<i64>().ok() };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut frac = 0.0;
    if b.get(19) == Some(&b'.') {
        let digits: String = s[20..].chars().take_while(char::is_ascii_digit).collect();
        if !digits.is_empty() {
            frac = format!("0.{digits}").parse::<f64>().ok()?;
        }
    }
    Some((days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec) as f64 + frac)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(column: &str) -> TraceSpec {
        TraceSpec {
            column: column.into(),
            interval_s: 1.0,
            ..TraceSpec::default()
        }
    }

    #[test]
    fn nvidia_smi_style_cells_and_match() {
        let csv = "timestamp, index, utilization.gpu [%], power.draw [W]\n\
                   2026/12/02 15:00:00.000, 0, 95 %, 612.5 W\n\
                   2026/12/02 15:00:00.000, 1, 10 %, 80 W\n\
                   2026/12/02 15:00:02.500, 0, 0 %, 90.25 W\n";
        let mut s = spec("power.draw [W]");
        s.time_column = Some("timestamp".into());
        s.match_column = Some("index".into());
        s.match_value = Some("0".into());
        let t = Trace::parse(csv, &s).unwrap();
        assert_eq!(t.value_at(0.0, false), 612.5);
        assert_eq!(t.value_at(2.4, false), 612.5);
        assert_eq!(t.value_at(2.5, false), 90.25);
        assert_eq!(t.value_at(100.0, false), 90.25);
    }

    #[test]
    fn row_interval_and_loop() {
        let csv = "a,b\n1,10\n2,20\n3,30\n";
        let mut s = spec("b");
        s.interval_s = 2.0;
        let t = Trace::parse(csv, &s).unwrap();
        assert_eq!(t.value_at(0.0, false), 10.0);
        assert_eq!(t.value_at(4.5, false), 30.0);
        assert_eq!(t.value_at(6.5, true), 10.0);
        assert_eq!(t.value_at(8.5, true), 20.0);
    }

    #[test]
    fn rfc3339_and_quotes() {
        assert_eq!(
            parse_time("2026-12-02T15:00:01.500Z").unwrap()
                - parse_time("2026-12-02T15:00:00Z").unwrap(),
            1.5
        );
        assert_eq!(
            split_csv_line(r#"a,"b,""c""",d"#),
            vec!["a", "b,\"c\"", "d"]
        );
        assert_eq!(leading_number(" 95 %"), Some(95.0));
        assert_eq!(leading_number("[N/A]"), None);
        let err = Trace::parse("a,b\n1,2\n", &spec("zz")).unwrap_err();
        assert!(err.contains("no column `zz`"), "{err}");
    }
}
