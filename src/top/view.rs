//! Drawing `gpuwatch top` from a [`TopState`]: a pure function of the state, the terminal size
//! and the [`Look`] (ASCII or Unicode, colour or not). Lines are laid out here as text (so the
//! view is the same over ssh, in 80×24, with `NO_COLOR` and in a plain terminal) and handed to
//! ratatui, which diffs them onto the screen.

use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::state::{sparkline, AlertSource, Chart, TopState};
use crate::model::{DeviceState, Metric};

/// The smallest terminal the view draws in.
pub const MIN_WIDTH: u16 = 60;
pub const MIN_HEIGHT: u16 = 16;

/// How the view draws: ASCII only (a terminal without UTF-8) and colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Look {
    pub ascii: bool,
    pub color: bool,
}

impl Look {
    fn style(self, s: Style) -> Style {
        if self.color {
            s
        } else {
            Style::default()
        }
    }

    fn rule(self, width: usize, title: &str) -> String {
        let (h, t) = if self.ascii {
            ('-', "-- ")
        } else {
            ('─', "── ")
        };
        let mut s = format!("{t}{title} ");
        let used = s.chars().count();
        s.extend(std::iter::repeat_n(h, width.saturating_sub(used)));
        s
    }
}

/// Draws the whole view into `frame`.
pub fn draw(frame: &mut Frame<'_>, st: &TopState, look: Look) {
    let area = frame.area();
    let mut lines = render(st, look, area.width, area.height);
    if look.ascii {
        for line in &mut lines {
            for span in &mut line.spans {
                if !span.content.is_ascii() {
                    span.content = asciify(&span.content).into();
                }
            }
        }
    }
    frame.render_widget(Paragraph::new(lines), area);
}

/// `text` in ASCII for a terminal without UTF-8: dashes, ellipses and degrees spelled out,
/// anything else a `?` (one cell each, so columns stay aligned).
pub fn asciify(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            c if c.is_ascii() => c,
            '—' | '–' | '─' => '-',
            '…' => '~',
            '°' => ' ',
            '×' => 'x',
            '≤' => '<',
            '≥' => '>',
            _ => '?',
        })
        .collect()
}

/// The screen as lines for a `width` × `height` terminal.
pub fn render(st: &TopState, look: Look, width: u16, height: u16) -> Vec<Line<'static>> {
    let w = usize::from(width);
    if width < MIN_WIDTH || height < MIN_HEIGHT {
        return vec![
            Line::from(cut(&format!("terminal too small: {width}×{height}"), w)),
            Line::from(cut(
                &format!("gpuwatch top needs {MIN_WIDTH}×{MIN_HEIGHT}; enlarge it, or q to quit"),
                w,
            )),
        ];
    }
    let h = usize::from(height);
    let mut out = vec![header(st, look, w)];
    if st.help {
        out.extend(help(look, w));
        return out;
    }
    if let Some(chart) = st.chart {
        out.extend(chart_view(st, chart, look, w, h - 2));
    } else {
        out.extend(gpu_table(st, look, w));
        let left = h.saturating_sub(out.len() + 1);
        let jobs = job_lines(st, look, w);
        let alerts_room = (left.saturating_sub(jobs.len())).div_ceil(2).max(2);
        out.extend(alert_lines(st, look, w, alerts_room));
        out.extend(jobs);
        let procs_room = h.saturating_sub(out.len() + 1);
        out.extend(process_lines(st, look, w, procs_room));
    }
    while out.len() + 1 < h {
        out.push(Line::from(""));
    }
    out.truncate(h - 1);
    out.push(footer(st, look, w));
    out
}

fn cut(s: &str, width: usize) -> String {
    crate::values::truncate_chars(s, width)
}

/// Pads or cuts `s` to exactly `width` characters.
fn fit(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n >= width {
        s.chars().take(width).collect()
    } else {
        format!("{s}{}", " ".repeat(width - n))
    }
}

fn header(st: &TopState, look: Look, w: usize) -> Line<'static> {
    let time = st.time_ms.map_or_else(
        || "waiting for the first sample".to_string(),
        crate::daemon::console::clock,
    );
    let source = match &st.source {
        AlertSource::Daemon => "alerts: daemon",
        AlertSource::Local(_) => "alerts: local rules",
    };
    let paused = if st.paused { "  [PAUSED]" } else { "" };
    let text = format!(
        "gpuwatch top  {}  {time}  {} GPUs  sort: {}  {source}{paused}",
        st.host,
        st.gpus.len(),
        st.sort.name()
    );
    Line::from(Span::styled(
        cut(&text, w),
        look.style(Style::default().add_modifier(Modifier::BOLD)),
    ))
}

fn footer(st: &TopState, look: Look, w: usize) -> Line<'static> {
    let keys = if st.chart.is_some() {
        "u m t p c metric  ↑↓ GPU  Enter/Esc back  space pause  q quit"
    } else {
        "s sort  ↑↓ select  Enter chart  space pause  ? help  q quit"
    };
    let keys = if look.ascii {
        keys.replace("↑↓", "j/k")
    } else {
        keys.to_string()
    };
    Line::from(Span::styled(
        cut(&keys, w),
        look.style(Style::default().add_modifier(Modifier::REVERSED)),
    ))
}

fn help(look: Look, w: usize) -> Vec<Line<'static>> {
    let text = [
        "s            sort the GPUs by index, utilization, memory, temperature, power",
        "up/down j/k  select a GPU",
        "Enter        full-width chart of the selected GPU (u m t p c pick the metric)",
        "space        pause (the view stops taking samples)",
        "Esc          back; q or Ctrl-C quits",
        "",
        "Sparklines show the last 5 minutes, each cell the highest value of its slice;",
        "a blank cell is a gap (no sample, or the GPU was lost).",
        "Alerts come from the running daemon (its control socket) when there is one,",
        "else the stock rules are evaluated here.",
    ];
    let mut out = vec![Line::from(look.rule(w, "help"))];
    out.extend(text.iter().map(|t| Line::from(cut(t, w))));
    out
}

/// Throttle (clock event) reasons worth showing, short.
fn throttle_text(mask: Option<f64>) -> String {
    let Some(m) = mask else {
        return String::new();
    };
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a bitmask read as f64"
    )]
    let m = m as u64;
    crate::model::clock_event_names(m)
        .into_iter()
        .filter_map(|n| match n {
            "sw_power_cap" => Some("power cap"),
            "hw_slowdown" => Some("HW slowdown"),
            "sw_thermal" => Some("SW thermal"),
            "hw_thermal" => Some("HW thermal"),
            "hw_power_brake" => Some("power brake"),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn gib(bytes: f64) -> f64 {
    bytes / (1024.0 * 1024.0 * 1024.0)
}

fn gpu_table(st: &TopState, look: Look, w: usize) -> Vec<Line<'static>> {
    // Fixed columns take 52 characters; the two sparklines share the rest (at least 6 each),
    // what is left after them goes to the throttle reasons. SM% is GPM's SM active (Hopper and
    // later; `-` elsewhere): utilization 100 % with SM% low is a GPU busy with tiny kernels.
    let spark = ((w.saturating_sub(52 + 12)) / 2).clamp(6, 30);
    let mut out = vec![Line::from(fit(
        &format!(
            "GPU util  SM% {:<spark$} memory      {:<spark$} temp  power      SM MHz throttle",
            "last 5 min", "last 5 min"
        ),
        w,
    ))];
    for (row, &i) in st.order().iter().enumerate() {
        let g = &st.gpus[i];
        let selected = row == st.selected;
        let mark = if selected { '>' } else { ' ' };
        let v = &g.values;
        let text = match g.state {
            DeviceState::Ok => {
                let util = v
                    .get(Metric::Util)
                    .map_or_else(|| "  - ".to_string(), |u| format!("{u:>3.0}%"));
                let sm = v
                    .get(Metric::SmActive)
                    .map_or_else(|| "  - ".to_string(), |u| format!("{u:>3.0}%"));
                let mem = fit(
                    &match (v.get(Metric::MemUsed), v.get(Metric::MemTotal)) {
                        (Some(u), Some(t)) => format!("{:>5.1}/{:.0}G", gib(u), gib(t)),
                        (Some(u), None) => format!("{:>5.1}G", gib(u)),
                        _ => "    -".to_string(),
                    },
                    11,
                );
                let temp = v
                    .get(Metric::Temp)
                    .map_or_else(|| "  - ".to_string(), |t| format!("{t:>2.0}°C"));
                let temp = if look.ascii { temp.replace('°', " ") } else { temp };
                let power = fit(
                    &match (v.get(Metric::Power), v.get(Metric::PowerLimit)) {
                        (Some(p), Some(l)) => format!("{p:>4.0}/{l:.0}W"),
                        (Some(p), None) => format!("{p:>4.0}W"),
                        _ => "   -".to_string(),
                    },
                    10,
                );
                let clock = v
                    .get(Metric::SmClock)
                    .map_or_else(|| "   -".to_string(), |c| format!("{c:>4.0}"));
                format!(
                    "{mark}{:<2} {util} {sm} {} {mem} {} {temp} {power} {clock}   {}",
                    g.id.index,
                    sparkline(g.series(Chart::Util), spark, 0.0, 100.0, look.ascii),
                    sparkline(g.series(Chart::Mem), spark, 0.0, 100.0, look.ascii),
                    throttle_text(v.get(Metric::ClockEventReasons)),
                )
            }
            DeviceState::Lost => format!(
                "{mark}{:<2} LOST: fallen off the bus or in reset; no values (reboot or reset the GPU)",
                g.id.index
            ),
            DeviceState::Stalled(f) => format!(
                "{mark}{:<2} STALLED: {} does not return (driver wedged?); values absent",
                g.id.index,
                f.symbol()
            ),
        };
        let style = match g.state {
            DeviceState::Ok if selected => Style::default().add_modifier(Modifier::BOLD),
            DeviceState::Ok => Style::default(),
            _ => Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
        };
        out.push(Line::from(Span::styled(fit(&text, w), look.style(style))));
        if g.state == DeviceState::Ok {
            if let Some(line) = mig_line(st, g.id.index) {
                out.push(Line::from(fit(&line, w)));
            }
        }
    }
    if st.gpus.is_empty() {
        out.push(Line::from("  (no sample yet)"));
    }
    out
}

fn alert_lines(st: &TopState, look: Look, w: usize, room: usize) -> Vec<Line<'static>> {
    let firing = st.alerts.iter().filter(|a| a.state == "firing").count();
    let pending = st.alerts.len() - firing;
    let source = match &st.source {
        AlertSource::Daemon => "from the daemon".to_string(),
        AlertSource::Local(None) => "stock rules evaluated here: no daemon".to_string(),
        AlertSource::Local(Some(why)) => format!("evaluated here: {why}"),
    };
    let mut out = vec![Line::from(look.rule(
        w,
        &format!("alerts: {firing} firing, {pending} pending ({source})"),
    ))];
    let mut list: Vec<_> = st.alerts.iter().collect();
    let rank = |s: &str| match s {
        "critical" => 0,
        "warning" => 1,
        _ => 2,
    };
    list.sort_by(|a, b| {
        (a.state != "firing", rank(&a.severity), a.gpu, &a.name).cmp(&(
            b.state != "firing",
            rank(&b.severity),
            b.gpu,
            &b.name,
        ))
    });
    let room = room.saturating_sub(1);
    for (k, a) in list.iter().enumerate() {
        if k + 1 == room && list.len() > room {
            out.push(Line::from(format!("  … and {} more", list.len() - k)));
            break;
        }
        let place = a
            .gpu
            .map_or_else(|| "host".to_string(), |g| format!("GPU {g}"));
        let silenced = if a.silenced { " [silenced]" } else { "" };
        let text = format!(
            "{:<7} {:<8} {place:<6} {} — {}{silenced}",
            a.state.to_uppercase(),
            a.severity,
            a.name,
            crate::values::escape_control(&a.summary)
        );
        let style = match (a.state.as_str(), a.severity.as_str()) {
            ("firing", "critical") => Style::default().fg(Color::Red),
            ("firing", "warning") => Style::default().fg(Color::Yellow),
            ("firing", _) => Style::default().fg(Color::Cyan),
            _ => Style::default().add_modifier(Modifier::DIM),
        };
        out.push(Line::from(Span::styled(cut(&text, w), look.style(style))));
    }
    if list.is_empty() {
        out.push(Line::from("  nothing pending or firing"));
    }
    out
}

fn job_lines(st: &TopState, look: Look, w: usize) -> Vec<Line<'static>> {
    if st.jobs.is_empty() {
        return Vec::new();
    }
    let mut out = vec![Line::from(look.rule(w, "jobs (gpuwatch run)"))];
    for j in &st.jobs {
        let age = j
            .progress_age_s
            .map_or_else(String::new, |a| format!(", last step {a:.0} s ago"));
        let eta = j.eta_s.map_or_else(String::new, |e| {
            format!(
                ", ends in ~{}",
                crate::values::format_duration_ms((e * 1000.0) as i64)
            )
        });
        out.push(Line::from(cut(
            &format!("  pid {}  {}{age}{eta}  {}", j.pid, j.progress, j.command),
            w,
        )));
    }
    out
}

/// A GPU with MIG on: one line under its row naming its MIG devices, each as `GI:profile`, the
/// memory used on it and, where GPM reads its GPU instance (Hopper and later), its SM activity
/// (`   MIG  7:1g.10gb 5.3G  8:1g.10gb 4.1G …`, `   MIG  1:3g.40gb 29.3G sm 80%  …`).
fn mig_line(st: &TopState, gpu: u32) -> Option<String> {
    let devices: Vec<&crate::model::MigSample> =
        st.mig.iter().filter(|m| m.gpu_index == gpu).collect();
    if devices.is_empty() {
        return None;
    }
    let mut line = String::from("   MIG");
    for m in devices {
        #[expect(clippy::cast_precision_loss, reason = "GiB for display")]
        let used = m
            .mem_used_bytes
            .map_or_else(|| "-".to_string(), |b| format!("{:.1}G", gib(b as f64)));
        line.push_str(&format!(
            "  {}:{} {used}",
            m.gpu_instance_id,
            m.profile.as_deref().unwrap_or("?")
        ));
        if let Some(sm) = m.gpm.get(crate::model::Metric::SmActive) {
            line.push_str(&format!(" sm {sm:.0}%"));
        }
    }
    Some(line)
}

fn process_lines(st: &TopState, look: Look, w: usize, room: usize) -> Vec<Line<'static>> {
    let mut out = vec![Line::from(look.rule(w, "processes"))];
    if room < 2 {
        return out.into_iter().take(room).collect();
    }
    out.push(Line::from(fit(
        "    PID USER       GPU    MEM CONTAINER      COMMAND",
        w,
    )));
    let mut procs: Vec<_> = st.processes.iter().collect();
    procs.sort_by(|a, b| {
        (a.gpu_index, std::cmp::Reverse(a.used_mem_bytes))
            .cmp(&(b.gpu_index, std::cmp::Reverse(b.used_mem_bytes)))
    });
    let room = room.saturating_sub(2);
    for (k, p) in procs.iter().enumerate() {
        if k + 1 == room && procs.len() > room {
            out.push(Line::from(format!("  … and {} more", procs.len() - k)));
            break;
        }
        let mem = p.used_mem_bytes.map_or_else(
            || "     -".to_string(),
            |b| format!("{:>5.1}G", gib(b as f64)),
        );
        let command = crate::values::escape_control(p.command.as_deref().unwrap_or("?"));
        // on a MIG device: GPU/GPU instance
        let gpu = st
            .mig
            .iter()
            .find(|m| m.gpu_index == p.gpu_index && m.pids.contains(&p.pid))
            .map_or_else(
                || p.gpu_index.to_string(),
                |m| format!("{}/{}", p.gpu_index, m.gpu_instance_id),
            );
        out.push(Line::from(cut(
            &format!(
                "{:>7} {:<10} {gpu:>3} {mem} {:<14} {command}",
                p.pid,
                cut(p.user.as_deref().unwrap_or("?"), 10),
                cut(p.container.as_deref().unwrap_or("-"), 14),
            ),
            w,
        )));
    }
    if procs.is_empty() {
        out.push(Line::from("  no processes on the GPUs"));
    }
    out
}

/// The selected GPU's `chart` across the width: one column per slice of the history (its
/// highest value), drawn in eighths of a row (ASCII: whole rows of `#`).
fn chart_view(st: &TopState, chart: Chart, look: Look, w: usize, h: usize) -> Vec<Line<'static>> {
    let Some(g) = st.selected_gpu().map(|i| &st.gpus[i]) else {
        return vec![Line::from("no GPU selected")];
    };
    let series = g.series(chart);
    let values: Vec<f64> = series.iter().flatten().copied().collect();
    let (lo, hi) = match chart {
        Chart::Util | Chart::Mem => (0.0, 100.0),
        _ => {
            let min = values.iter().copied().fold(f64::INFINITY, f64::min);
            let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if values.is_empty() {
                (0.0, 1.0)
            } else {
                let pad = ((max - min) * 0.1).max(1.0);
                ((min - pad).max(0.0), max + pad)
            }
        }
    };
    let now = values
        .last()
        .map_or_else(|| "-".into(), |v| format!("{v:.0}"));
    let mut out = vec![Line::from(look.rule(
        w,
        &format!(
            "GPU {} — {} — now {now}, last {} samples",
            g.id.index,
            chart.title(),
            series.len()
        ),
    ))];
    let axis = 7;
    let cols = w.saturating_sub(axis);
    let rows = h.saturating_sub(2).max(3);
    // One value per column: the highest of its slice (None: a gap).
    let n = series.len();
    let per = n.div_ceil(cols).max(1);
    let used = n.div_ceil(per);
    let mut col_vals: Vec<Option<f64>> = vec![None; cols.saturating_sub(used)];
    let mut start = 0;
    for c in 0..used {
        let take = if c == 0 { n - (used - 1) * per } else { per };
        col_vals.push(
            series
                .iter()
                .skip(start)
                .take(take)
                .filter_map(|v| *v)
                .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v)))),
        );
        start += take;
    }
    const EIGHTHS: [char; 8] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇'];
    let span = (hi - lo).max(f64::EPSILON);
    for r in 0..rows {
        // Row r from the top covers [level_lo, level_lo + 1) in row units.
        let level = (rows - 1 - r) as f64;
        let label = if r == 0 {
            format!("{hi:>6.0} ")
        } else if r + 1 == rows {
            format!("{lo:>6.0} ")
        } else {
            " ".repeat(axis)
        };
        let mut line = label;
        for v in &col_vals {
            let ch = match v {
                None => ' ',
                Some(v) => {
                    let height = ((v - lo) / span).clamp(0.0, 1.0) * rows as f64;
                    if height >= level + 1.0 {
                        if look.ascii {
                            '#'
                        } else {
                            '█'
                        }
                    } else if height > level {
                        #[expect(
                            clippy::cast_possible_truncation,
                            clippy::cast_sign_loss,
                            reason = "0..8"
                        )]
                        let e = ((height - level) * 8.0).floor().clamp(0.0, 7.0) as usize;
                        if look.ascii {
                            if e >= 4 {
                                '#'
                            } else if e > 0 {
                                '.'
                            } else {
                                ' '
                            }
                        } else {
                            EIGHTHS[e]
                        }
                    } else {
                        ' '
                    }
                }
            };
            line.push(ch);
        }
        out.push(Line::from(Span::styled(
            line,
            look.style(Style::default().fg(Color::Green)),
        )));
    }
    out.push(Line::from(cut(
        &format!(
            "{}oldest{}newest",
            " ".repeat(axis),
            " ".repeat(cols.saturating_sub(12))
        ),
        w,
    )));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DeviceId, GpuSample, MetricValues, Snapshot};
    use crate::top::state::{AlertView, Key};

    fn state(n: u32, lost: Option<u32>) -> TopState {
        let mut st = TopState::new("node1".into(), 1000, AlertSource::Local(None));
        for t in 0..100 {
            let gpus = (0..n)
                .map(|i| {
                    let mut values = MetricValues::default();
                    values.set(Metric::Util, Some(f64::from(t % 100)));
                    // GPM's SM active on GPU 0 only (the others: no GPM)
                    values.set(Metric::SmActive, (i == 0).then_some(12.0));
                    values.set(Metric::MemUsed, Some(40e9));
                    values.set(Metric::MemTotal, Some(80e9));
                    values.set(Metric::Temp, Some(65.0));
                    values.set(Metric::Power, Some(600.0));
                    values.set(Metric::PowerLimit, Some(700.0));
                    values.set(Metric::SmClock, Some(1980.0));
                    values.set(Metric::ClockEventReasons, Some(f64::from(0x20_u32)));
                    GpuSample {
                        time_ms: i64::from(t) * 1000,
                        id: DeviceId {
                            index: i,
                            ..DeviceId::default()
                        },
                        state: if Some(i) == lost {
                            DeviceState::Lost
                        } else {
                            DeviceState::Ok
                        },
                        values,
                    }
                })
                .collect();
            st.observe(&Snapshot {
                time_ms: i64::from(t) * 1000,
                gpus,
                processes: None,
                xids: Vec::new(),
                missing: Vec::new(),
                mig: Vec::new(),
                nvlink: Vec::new(),
                pods: Vec::new(),
            });
        }
        st.alerts.push(AlertView {
            name: "gpu_lost".into(),
            severity: "critical".into(),
            gpu: Some(5),
            state: "firing".into(),
            summary: "GPU 5 is lost".into(),
            silenced: false,
        });
        st
    }

    fn text(lines: &[Line<'_>]) -> String {
        lines
            .iter()
            .map(|l| {
                l.spans
                    .iter()
                    .map(|s| s.content.as_ref())
                    .collect::<String>()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn eight_gpus_fit_80x24_in_ascii() {
        let st = state(8, Some(5));
        let look = Look {
            ascii: true,
            color: false,
        };
        let lines = render(&st, look, 80, 24);
        assert_eq!(lines.len(), 24);
        let t = text(&lines);
        for l in t.lines() {
            assert!(l.chars().count() <= 80, "{l}");
            assert!(asciify(l).is_ascii(), "{l}");
            assert_eq!(asciify(l).chars().count(), l.chars().count(), "{l}");
        }
        assert!(t.contains(" 7 "), "{t}");
        assert!(t.contains("GPU util  SM% "), "{t}");
        assert!(
            t.contains(" 99%  12% "),
            "SM active beside utilization: {t}"
        );
        assert!(t.contains(" 99%   -  "), "absent without GPM: {t}");
        assert!(t.contains("LOST"), "{t}");
        assert!(t.contains("FIRING  critical GPU 5  gpu_lost"), "{t}");
        assert!(t.contains("SW thermal"), "{t}");
    }

    /// A GPU with MIG on: a line under its row names its MIG devices and their memory; its
    /// processes show `GPU/GI`.
    #[test]
    fn mig_devices_are_listed_under_their_gpu() {
        let mut st = state(2, None);
        st.mig = (0..7u32)
            .map(|k| crate::model::MigSample {
                mem_used_bytes: Some(u64::from(k + 1) << 30),
                mem_total_bytes: Some(9728 << 20),
                pids: vec![100 + k],
                ..crate::model::MigSample::one_g(1, k)
            })
            .collect();
        st.processes = vec![crate::model::ProcSample::compute(
            102,
            1,
            "GPU-1",
            Some(3 << 30),
        )];
        let look = Look {
            ascii: true,
            color: false,
        };
        let t = text(&render(&st, look, 160, 30));
        let lines: Vec<&str> = t.lines().collect();
        let row = lines
            .iter()
            .position(|l| l.starts_with("  1 ") || l.starts_with("> 1 ") || l.starts_with(" 1 "))
            .unwrap_or_else(|| panic!("{t}"));
        assert!(
            lines[row + 1].starts_with("   MIG  7:1g.10gb 1.0G  8:1g.10gb 2.0G"),
            "{t}"
        );
        assert!(lines[row + 1].contains("13:1g.10gb 7.0G"), "{t}");
        assert!(
            !lines[row + 1].contains("sm"),
            "no GPM, no SM activity: {t}"
        );
        // GPU instances read through GPM show their SM activity
        st.mig[1]
            .gpm
            .set(crate::model::Metric::SmActive, Some(79.6));
        let t = text(&render(&st, look, 160, 30));
        assert!(
            t.contains("   MIG  7:1g.10gb 1.0G  8:1g.10gb 2.0G sm 80%  9:1g.10gb 3.0G"),
            "{t}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains("    102 ") && l.contains(" 1/9 ")),
            "{t}"
        );
    }

    #[test]
    fn too_small_says_so_and_the_chart_fills_the_width() {
        let mut st = state(2, None);
        let look = Look {
            ascii: false,
            color: true,
        };
        let small = text(&render(&st, look, 40, 10));
        assert!(small.contains("terminal too small: 40×10"), "{small}");
        st.key(Key::Enter);
        let t = text(&render(&st, look, 100, 30));
        assert!(t.contains("GPU 0 — utilization (%)"), "{t}");
        assert!(t.contains('█'), "{t}");
    }
}
