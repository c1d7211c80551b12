//! A firing alert's chart as a small PNG (what every mail client shows, attached inline and
//! referenced as `cid:`), drawn by hand: the metric's line over the rule's window with the area
//! under it, on a light grid, with its axes labelled — the values at the top, middle and bottom
//! grid lines on the left, the unit between them, the time before the last sample under the plot
//! (`-10 min`, `-5 min`, `now`) — in a small pixel font of the few characters labels use.
//! The caption in the HTML says what it is and gives min, max and the last value.

use crate::model::AlertChart;

/// Image size, pixels.
pub const WIDTH: usize = 480;
/// Image height, pixels.
pub const HEIGHT: usize = TOP + PLOT_H + BOTTOM;

/// The plot's place in the image: labels left of it and under it, room above for the top
/// label's upper half.
const LEFT: usize = LABEL_CHARS * ADVANCE + 4;
const TOP: usize = GLYPH_H;
const BOTTOM: usize = GLYPH_H / 2 + 4 + GLYPH_H + 2;
const PLOT_W: usize = WIDTH - LEFT - 4;
const PLOT_H: usize = 120;

const BG: [u8; 3] = [255, 255, 255];
const GRID: [u8; 3] = [232, 232, 236];
const AREA: [u8; 3] = [214, 226, 250];
const LINE: [u8; 3] = [47, 111, 222];
const TEXT: [u8; 3] = [90, 90, 100];

/// Glyphs 5 × 7, drawn at [`SCALE`]; each row's 5 low bits, leftmost pixel first.
const GLYPHS: &[(char, [u8; 7])] = &[
    ('0', [0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E]),
    ('1', [0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E]),
    ('2', [0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F]),
    ('3', [0x1E, 0x01, 0x01, 0x0E, 0x01, 0x01, 0x1E]),
    ('4', [0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02]),
    ('5', [0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E]),
    ('6', [0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E]),
    ('7', [0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08]),
    ('8', [0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E]),
    ('9', [0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C]),
    ('.', [0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C]),
    ('-', [0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00]),
    ('%', [0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03]),
    ('/', [0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00]),
    ('°', [0x0C, 0x12, 0x12, 0x0C, 0x00, 0x00, 0x00]),
    ('B', [0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E]),
    ('C', [0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E]),
    ('G', [0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F]),
    ('M', [0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11]),
    ('W', [0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A]),
    ('P', [0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10]),
    ('T', [0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04]),
    ('k', [0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12]),
    ('e', [0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E]),
    ('h', [0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11]),
    ('i', [0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E]),
    ('m', [0x00, 0x00, 0x1A, 0x15, 0x15, 0x11, 0x11]),
    ('n', [0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11]),
    ('o', [0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E]),
    ('s', [0x00, 0x00, 0x0E, 0x10, 0x0E, 0x01, 0x1E]),
    ('w', [0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0A]),
    (' ', [0; 7]),
];
/// Pixels per font pixel.
const SCALE: usize = 2;
/// A glyph's height and the distance from one glyph to the next, pixels.
const GLYPH_H: usize = 7 * SCALE;
const ADVANCE: usize = 6 * SCALE;

/// Whether every character of `text` has a glyph (a label that cannot be drawn whole is left
/// out, never drawn in part).
fn drawable(text: &str) -> bool {
    text.chars().all(|c| GLYPHS.iter().any(|(g, _)| *g == c))
}

fn text_width(text: &str) -> usize {
    (text.chars().count() * ADVANCE).saturating_sub(SCALE)
}

/// Draws `text` with its top left corner at (`x`, `y`), clipped to the image.
fn draw_text(px: &mut [[u8; 3]], x: usize, y: usize, text: &str) {
    for (k, c) in text.chars().enumerate() {
        let Some((_, rows)) = GLYPHS.iter().find(|(g, _)| *g == c) else {
            continue;
        };
        for (r, bits) in rows.iter().enumerate() {
            for col in 0..5 {
                if bits & (0x10 >> col) == 0 {
                    continue;
                }
                for (dy, dx) in (0..SCALE).flat_map(|a| (0..SCALE).map(move |b| (a, b))) {
                    let (xx, yy) = (x + k * ADVANCE + col * SCALE + dx, y + r * SCALE + dy);
                    if xx < WIDTH && yy < HEIGHT {
                        px[yy * WIDTH + xx] = TEXT;
                    }
                }
            }
        }
    }
}

/// The scale and unit a chart shows values in.
fn display_unit(unit: &str) -> (f64, &str) {
    match unit {
        "bytes" => (1.0 / 1_073_741_824.0, "GiB"),
        "bytes_per_second" => (1.0 / 1_048_576.0, "MiB/s"),
        "celsius" => (1.0, "°C"),
        "percent" => (1.0, "%"),
        "watts" => (1.0, "W"),
        u => (1.0, u),
    }
}

/// A value as labels and the caption give it (already scaled).
fn number(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// The longest value label that fits left of the plot.
const LABEL_CHARS: usize = 6;

/// A value label for the axis: as [`number`] gives it while it fits left of the plot, else
/// with the decimal prefix that leaves 1 to 999 (`85.5M` for 85,520,809), else in powers of
/// ten (`1e300`).
fn axis_number(v: f64) -> String {
    let fits = |t: &String| t.chars().count() <= LABEL_CHARS;
    let plain = number(v);
    if fits(&plain) || !v.is_finite() {
        return plain;
    }
    let mut scaled = v;
    for prefix in ["k", "M", "G", "T", "P"] {
        scaled /= 1000.0;
        let text = format!("{}{prefix}", number(scaled));
        if scaled.abs() < 999.5 && fits(&text) {
            return text;
        }
    }
    let one = format!("{v:.1e}");
    if fits(&one) {
        one
    } else {
        format!("{v:.0e}")
    }
}

/// A span of time in words: `45 s` under two minutes, else `10 min`.
fn span_words(ms: i64) -> String {
    if ms < 120_000 {
        format!("{} s", (ms + 500) / 1000)
    } else {
        format!("{} min", (ms + 30_000) / 60_000)
    }
}

/// The caption: `temp over the last 10 min: min 61, max 88, now 88 °C`, naming the span the
/// points cover (`over the last 5 min (the rule looks at 10 min)` while sampling has not filled
/// the rule's window).
pub fn caption(c: &AlertChart) -> String {
    let values = c.points.iter().map(|p| p.1);
    let min = values.clone().fold(f64::INFINITY, f64::min);
    let max = values.fold(f64::NEG_INFINITY, f64::max);
    let last = c.points.last().map_or(0.0, |p| p.1);
    let (scale, unit) = display_unit(&c.unit);
    let minutes = span_words;
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
    let f = |v: f64| number(v * scale);
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
    // five grid lines: the top, bottom and middle ones labelled
    let grid_y = |k: usize| TOP + k * (PLOT_H - 1) / 4;
    for k in 0..5 {
        let y = grid_y(k);
        for x in LEFT..LEFT + PLOT_W {
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
        // a flat line: one display unit (1 GiB, 1 °C, …) either side, not below 0 when it is not
        let pad = 1.0 / display_unit(&c.unit).0;
        (
            (lo - pad).max(if lo >= 0.0 { 0.0 } else { f64::MIN }),
            hi + pad,
        )
    } else {
        let pad = (hi - lo) * 0.1;
        (
            (lo - pad).max(if lo >= 0.0 { 0.0 } else { f64::MIN }),
            hi + pad,
        )
    };
    let to_xy = |(t, v): (i64, f64)| {
        let x = LEFT as f64 + (t - t0) as f64 / (t1 - t0) as f64 * (PLOT_W - 1) as f64;
        let y = TOP as f64 + (hi - v) / (hi - lo) * (PLOT_H - 1) as f64;
        (x, y)
    };
    let (x_max, y_max) = ((LEFT + PLOT_W - 1) as f64, (TOP + PLOT_H - 1) as f64);
    // Area under the line, column by column (linear between points), then the line itself.
    let pts: Vec<(f64, f64)> = c.points.iter().map(|p| to_xy(*p)).collect();
    for w in pts.windows(2) {
        let ((x0, y0), (x1, y1)) = (w[0], w[1]);
        let (a, b) = (x0.round() as usize, (x1.round().min(x_max)) as usize);
        for x in a..=b {
            let f = if b > a {
                (x - a) as f64 / (b - a) as f64
            } else {
                0.0
            };
            let y = (y0 + (y1 - y0) * f).round().clamp(TOP as f64, y_max) as usize;
            for yy in y..TOP + PLOT_H {
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
                let (xx, yy) = ((x + dx).round(), (y + dy).round());
                if (LEFT as f64..=x_max).contains(&xx) && (TOP as f64..=y_max).contains(&yy) {
                    px[yy as usize * WIDTH + xx as usize] = LINE;
                }
            }
        }
    }
    for (k, label) in axis_labels(c, lo, hi) {
        draw_text(&mut px, label.0, label.1, &k);
    }
    Some(encode(&px))
}

/// The axis labels and their top left corners: the values at the top, middle and bottom grid
/// lines right-aligned left of the plot, the unit between the top and middle ones, and under the
/// plot the time before the last point at its start, middle and end (`-10 min`, `-5 min`,
/// `now`).
fn axis_labels(c: &AlertChart, lo: f64, hi: f64) -> Vec<(String, (usize, usize))> {
    let (scale, unit) = display_unit(&c.unit);
    let mut out = Vec::new();
    let grid_y = |k: usize| TOP + k * (PLOT_H - 1) / 4;
    for (k, v) in [(0, hi), (2, (hi + lo) / 2.0), (4, lo)] {
        let text = axis_number(v * scale);
        let x = (LEFT - 4).saturating_sub(text_width(&text));
        out.push((text, (x, grid_y(k) - GLYPH_H / 2)));
    }
    // the unit beside the unlabelled grid line between the top and middle ones
    if drawable(unit) {
        let x = (LEFT - 4).saturating_sub(text_width(unit));
        out.push((unit.to_string(), (x, grid_y(1) - GLYPH_H / 2)));
    }
    // (clear of the bottom value's label, which is centred on the bottom grid line)
    let under = TOP + PLOT_H + GLYPH_H / 2 + 4;
    let (t0, t1) = (c.points[0].0, c.points[c.points.len() - 1].0);
    let span = (t1 - t0).max(0);
    let right = LEFT + PLOT_W;
    let mut starts = vec![
        (format!("-{}", span_words(span)), LEFT),
        (format!("-{}", span_words(span / 2)), LEFT + PLOT_W / 2),
        ("now".to_string(), right),
    ];
    if span < 2_000 {
        // (a span of a second or two reads `-1 s`, `-0 s`: only the end is labelled)
        starts.drain(..2);
    }
    for (text, at) in starts {
        let w = text_width(&text);
        // the first starts at the plot's left edge, the middle one is centred, the last ends
        // at the right edge
        let x = if at == LEFT {
            at
        } else if at == right {
            at.saturating_sub(w)
        } else {
            at.saturating_sub(w / 2)
        };
        out.push((text, (x, under)));
    }
    out.retain(|(t, _)| drawable(t));
    out
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

    /// The image's pixels, from the PNG's IDAT (filter 0 rows, as `encode` writes them).
    fn pixels(png: &[u8]) -> Vec<[u8; 3]> {
        use std::io::Read as _;
        let at = png.windows(4).position(|w| w == b"IDAT").expect("IDAT");
        let len = u32::from_be_bytes(png[at - 4..at].try_into().expect("4 bytes")) as usize;
        let mut raw = Vec::new();
        flate2::read::ZlibDecoder::new(&png[at + 4..at + 4 + len])
            .read_to_end(&mut raw)
            .expect("zlib");
        assert_eq!(raw.len(), HEIGHT * (WIDTH * 3 + 1));
        raw.chunks(WIDTH * 3 + 1)
            .flat_map(|row| row[1..].chunks(3).map(|p| [p[0], p[1], p[2]]))
            .collect()
    }

    /// Issue 30 §5: the chart's axes are labelled — values at the top, middle and bottom grid
    /// lines, the unit, and the time before the last point — and every label is drawn in the
    /// image where it belongs (text pixels left of the plot at each labelled grid line, under
    /// it at its start, middle and end).
    #[test]
    fn the_axes_are_labelled() {
        let pts: Vec<(i64, f64)> = (0..600)
            .map(|i| (i * 1000, 60.0 + (i as f64) / 20.0))
            .collect();
        let c = AlertChart::new(Metric::Temp, 600_000, &pts);
        let labels: Vec<String> = axis_labels(&c, 50.0, 100.0)
            .into_iter()
            .map(|l| l.0)
            .collect();
        assert_eq!(
            labels,
            ["100", "75.0", "50.0", "°C", "-10 min", "-5 min", "now"]
        );
        let px = pixels(&png(&c).expect("a chart"));
        let text_in = |x: std::ops::Range<usize>, y: std::ops::Range<usize>| {
            y.clone()
                .flat_map(|yy| x.clone().map(move |xx| (xx, yy)))
                .filter(|(xx, yy)| px[yy * WIDTH + xx] == TEXT)
                .count()
        };
        let grid_y = |k: usize| TOP + k * (PLOT_H - 1) / 4;
        for k in [0, 2, 4] {
            let y = grid_y(k);
            assert!(
                text_in(0..LEFT, y - GLYPH_H / 2..y + GLYPH_H / 2) > 10,
                "grid line {k}"
            );
        }
        let y = grid_y(1);
        assert!(
            text_in(0..LEFT, y - GLYPH_H / 2..y + GLYPH_H / 2) > 10,
            "the unit"
        );
        let y = grid_y(3);
        assert_eq!(
            text_in(0..LEFT, y - 2..y + 2),
            0,
            "grid line 3 has no label"
        );
        let under = TOP + PLOT_H + GLYPH_H / 2 + 4..HEIGHT;
        let third = PLOT_W / 3;
        for x in [
            LEFT..LEFT + third,
            LEFT + third..LEFT + 2 * third,
            LEFT + 2 * third..WIDTH,
        ] {
            assert!(text_in(x.clone(), under.clone()) > 10, "{x:?}");
        }
        // nothing drawn as text inside the plot
        assert_eq!(text_in(LEFT..LEFT + PLOT_W, TOP..TOP + PLOT_H), 0);
        // a unit the font cannot draw is left out (the caption names it), never drawn in part
        let mut c = c;
        c.unit = "errors".into();
        assert!(!axis_labels(&c, 0.0, 4.0).iter().any(|l| l.0.contains('e')));
        assert!(GLYPHS.iter().all(|(ch, _)| drawable(&ch.to_string())));
        // a value too wide for the margin is shortened, never drawn over the plot
        assert_eq!(axis_number(85_520_809.0), "85.5M");
        assert_eq!(axis_number(-1_234_567.0), "-1.2M");
        assert_eq!(axis_number(123_456.0), "123456");
        assert_eq!(axis_number(99.95), "100.0");
        assert_eq!(axis_number(1e300), "1e300");
        // a flat line is padded by a display unit, not a byte; a short span labels only `now`
        let flat: Vec<(i64, f64)> = (0..3).map(|i| (i * 500, 20.0 * 1_073_741_824.0)).collect();
        let c = AlertChart::new(Metric::MemUsed, 600_000, &flat);
        assert!(png(&c).is_some());
        let labels: Vec<String> = axis_labels(&c, 19.0 * 1_073_741_824.0, 21.0 * 1_073_741_824.0)
            .into_iter()
            .map(|l| l.0)
            .collect();
        assert_eq!(labels, ["21.0", "20.0", "19.0", "GiB", "now"]);
        for v in [1e300, -1e15, 123_456_789.0, -0.000_1, 5e-300] {
            let t = axis_number(v);
            assert!(drawable(&t) && text_width(&t) <= LEFT - 4, "{v}: {t}");
        }
    }

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
