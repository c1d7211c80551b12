//! A firing alert's chart as a small PNG (what every mail client shows, attached inline and
//! referenced as `cid:`), drawn by hand: the metric's line over the rule's window with the area
//! under it, on a light grid. No text in the image: the caption in the HTML says what it is and
//! gives min, max and the last value.

use crate::model::AlertChart;

/// Image size, pixels.
pub const WIDTH: usize = 480;
/// Image height, pixels.
pub const HEIGHT: usize = 120;

const BG: [u8; 3] = [255, 255, 255];
const GRID: [u8; 3] = [232, 232, 236];
const AREA: [u8; 3] = [214, 226, 250];
const LINE: [u8; 3] = [47, 111, 222];

/// The caption: `temp over the last 10 min: min 61, max 88, now 88 °C`, naming the span the
/// points cover (`over the last 5 min (the rule looks at 10 min)` while sampling has not filled
/// the rule's window).
pub fn caption(c: &AlertChart) -> String {
    let values = c.points.iter().map(|p| p.1);
    let min = values.clone().fold(f64::INFINITY, f64::min);
    let max = values.fold(f64::NEG_INFINITY, f64::max);
    let last = c.points.last().map_or(0.0, |p| p.1);
    let (scale, unit) = match c.unit.as_str() {
        "bytes" => (1.0 / 1_073_741_824.0, "GiB"),
        "bytes_per_second" => (1.0 / 1_048_576.0, "MiB/s"),
        "celsius" => (1.0, "°C"),
        "percent" => (1.0, "%"),
        "watts" => (1.0, "W"),
        u => (1.0, u),
    };
    let minutes = |ms: i64| {
        if ms < 120_000 {
            format!("{} s", (ms + 500) / 1000)
        } else {
            format!("{} min", (ms + 30_000) / 60_000)
        }
    };
    // (a point stands for the interval up to it: n points of 1 s cover n seconds)
    let covered = match (c.points.first(), c.points.last()) {
        (Some(a), Some(b)) if c.points.len() > 1 => {
            let n = c.points.len() as i64;
            (b.0 - a.0) * n / (n - 1)
        }
        _ => 0,
    };
    let span = if covered + 60_000 < c.window_ms {
        format!(
            "{} (the rule looks at {})",
            minutes(covered),
            minutes(c.window_ms)
        )
    } else {
        minutes(c.window_ms)
    };
    let f = |v: f64| {
        let v = v * scale;
        if v.abs() >= 100.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.1}")
        }
    };
    format!(
        "{} over the last {span}: min {}, max {}, now {} {unit}",
        c.metric,
        f(min),
        f(max),
        f(last)
    )
}

/// The chart as PNG bytes; `None` with fewer than two points.
pub fn png(c: &AlertChart) -> Option<Vec<u8>> {
    if c.points.len() < 2 {
        return None;
    }
    let mut px = vec![BG; WIDTH * HEIGHT];
    for y in (0..HEIGHT).step_by(HEIGHT / 4) {
        for x in 0..WIDTH {
            px[y * WIDTH + x] = GRID;
        }
    }
    let (t0, t1) = (
        c.points[0].0,
        c.points[c.points.len() - 1].0.max(c.points[0].0 + 1),
    );
    let lo = c.points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let hi = c
        .points
        .iter()
        .map(|p| p.1)
        .fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = if hi - lo < 1e-9 {
        (lo - 1.0, hi + 1.0)
    } else {
        let pad = (hi - lo) * 0.1;
        (
            (lo - pad).max(if lo >= 0.0 { 0.0 } else { f64::MIN }),
            hi + pad,
        )
    };
    let to_xy = |(t, v): (i64, f64)| {
        let x = (t - t0) as f64 / (t1 - t0) as f64 * (WIDTH - 1) as f64;
        let y = (hi - v) / (hi - lo) * (HEIGHT - 1) as f64;
        (x, y)
    };
    // Area under the line, column by column (linear between points), then the line itself.
    let pts: Vec<(f64, f64)> = c.points.iter().map(|p| to_xy(*p)).collect();
    for w in pts.windows(2) {
        let ((x0, y0), (x1, y1)) = (w[0], w[1]);
        let (a, b) = (x0.round() as usize, (x1.round() as usize).min(WIDTH - 1));
        for x in a..=b {
            let f = if b > a {
                (x - a) as f64 / (b - a) as f64
            } else {
                0.0
            };
            let y = (y0 + (y1 - y0) * f).round().clamp(0.0, (HEIGHT - 1) as f64) as usize;
            for yy in y..HEIGHT {
                px[yy * WIDTH + x] = AREA;
            }
        }
    }
    for w in pts.windows(2) {
        let ((x0, y0), (x1, y1)) = (w[0], w[1]);
        let steps = ((x1 - x0).abs().max((y1 - y0).abs()) * 2.0).ceil().max(1.0) as usize;
        for i in 0..=steps {
            let f = i as f64 / steps as f64;
            let (x, y) = (x0 + (x1 - x0) * f, y0 + (y1 - y0) * f);
            for (dx, dy) in [(0.0, 0.0), (0.0, 1.0), (1.0, 0.0)] {
                let (xx, yy) = ((x + dx).round() as isize, (y + dy).round() as isize);
                if (0..WIDTH as isize).contains(&xx) && (0..HEIGHT as isize).contains(&yy) {
                    px[yy as usize * WIDTH + xx as usize] = LINE;
                }
            }
        }
    }
    Some(encode(&px))
}

/// An 8-bit RGB PNG of `px` (WIDTH × HEIGHT), filter 0 on every row, zlib through flate2.
fn encode(px: &[[u8; 3]]) -> Vec<u8> {
    use std::io::Write as _;
    let mut raw = Vec::with_capacity(HEIGHT * (WIDTH * 3 + 1));
    for row in px.chunks(WIDTH) {
        raw.push(0);
        for p in row {
            raw.extend_from_slice(p);
        }
    }
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    let _ = z.write_all(&raw);
    let idat = z.finish().unwrap_or_default();
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::with_capacity(13);
    ihdr.extend_from_slice(&(WIDTH as u32).to_be_bytes());
    ihdr.extend_from_slice(&(HEIGHT as u32).to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    for (kind, data) in [
        (b"IHDR", &ihdr[..]),
        (b"IDAT", &idat[..]),
        (b"IEND", &[][..]),
    ] {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut crc = flate2::Crc::new();
        crc.update(kind);
        crc.update(data);
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        out.extend_from_slice(&crc.sum().to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Metric;

    #[test]
    fn png_is_well_formed_and_drawn() {
        let pts: Vec<(i64, f64)> = (0..600)
            .map(|i| (i * 1000, 60.0 + (i as f64) / 20.0))
            .collect();
        let c = AlertChart::new(Metric::Temp, 600_000, &pts);
        assert!(c.points.len() <= AlertChart::MAX_POINTS);
        let png = png(&c).expect("a chart");
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
        assert!(png.len() > 200 && png.len() < 20_000, "{} bytes", png.len());
        // IHDR's CRC is the standard one.
        let crc = u32::from_be_bytes(png[29..33].try_into().expect("4 bytes"));
        let mut check = flate2::Crc::new();
        check.update(&png[12..29]);
        assert_eq!(crc, check.sum());
        assert!(
            caption(&c).starts_with("temp over the last 10 min: min 60."),
            "{}",
            caption(&c)
        );
        assert!(caption(&c).ends_with(" °C"), "{}", caption(&c));
        // Five minutes of data in a 10-minute window: the caption says so.
        let c = AlertChart::new(Metric::Temp, 600_000, &pts[..300]);
        assert!(
            caption(&c).starts_with("temp over the last 5 min (the rule looks at 10 min): "),
            "{}",
            caption(&c)
        );
    }
}
