//! The report as one self-contained HTML page: inline CSS and SVG, no scripts, no network, so it
//! opens from an email attachment. Per GPU a chart group (utilization, memory, temperature,
//! power) drawn as min/max envelopes per pixel column (a gap in the log is a gap in the line),
//! with alert bands and XID marks; the summary table, the diagnosis, the alert timeline, and the
//! comparison when there is one.

use std::fmt::Write as _;

use super::compare::Row;
use super::series::Series;
use super::{gib, human_duration, AlertSpan, MigSummary, Report, RunSummary};
use crate::trace::format_time_ms;

/// Chart plot width and height in pixels (one column of the envelope per pixel).
pub const WIDTH: usize = 540;
const HEIGHT: f64 = 96.0;
const LEFT: f64 = 48.0;
const BOTTOM: f64 = 18.0;

use crate::values::html_escape as esc;

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1d1d1f;background:#fff}\
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}h3{font-size:15px;margin:16px 0 6px}\
.meta{color:#555}table{border-collapse:collapse;margin:4px 0}th,td{padding:3px 8px;border-bottom:1px solid #e3e3e3;text-align:left;vertical-align:top}\
th{background:#f5f5f7}td.n{text-align:right;font-variant-numeric:tabular-nums}.worse{color:#c4161c;font-weight:600}\
.gpu{border:1px solid #ddd;border-radius:6px;padding:8px 12px;margin:12px 0}.charts{display:flex;flex-wrap:wrap;gap:6px}\
svg.chart{background:#fcfcfd}.none{color:#777}.sev-critical{color:#c4161c}.sev-warning{color:#a86b00}\
.mig h4{font-size:14px;margin:10px 0 4px}.mig code{font-size:12px}";

/// Renders `report` (and, when given, a comparison with a run named `against`).
pub fn render(report: &Report, compare: Option<(&str, &[Row])>) -> String {
    let r = &report.summary;
    let mut h = String::with_capacity(256 * 1024);
    let title = format!(
        "gpuwatch report — {}",
        r.sources
            .iter()
            .map(|s| s.rsplit('/').next().unwrap_or(s))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = write!(
        h,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head><body>",
        esc(&title)
    );
    let _ = write!(
        h,
        "<h1>{}</h1><p class=\"meta\">{} to {} ({}), {} GPU(s), {} ticks</p>",
        esc(&title),
        format_time_ms(r.first_ms),
        format_time_ms(r.last_ms),
        human_duration((r.last_ms - r.first_ms) as f64 / 1000.0),
        r.gpus.len(),
        r.ticks
    );
    let shown = shown_gpus(r);
    diagnosis(&mut h, r, &shown);
    summary_table(&mut h, r, &shown);
    if let Some((against, rows)) = compare {
        let _ = write!(
            h,
            "<section class=\"compare\"><h2>Compared with {}</h2><table><tr><th>what</th><th>{}</th><th>this run</th><th>change</th></tr>",
            esc(against),
            esc(against)
        );
        for row in rows {
            let class = if row.worse { " class=\"worse\"" } else { "" };
            let _ = write!(
                h,
                "<tr{class}><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}{}</td></tr>",
                esc(row.what),
                esc(&row.before),
                esc(&row.after),
                esc(&row.change),
                if row.worse { " (worse)" } else { "" }
            );
        }
        h.push_str("</table></section>");
    }
    h.push_str("<h2>GPUs</h2>");
    for g in r.gpus.iter().filter(|g| shown.contains(&g.index)) {
        let Some(c) = report.charts.get(&g.index) else {
            continue;
        };
        let _ = write!(
            h,
            "<section class=\"gpu\" id=\"gpu-{0}\" data-gpu=\"{0}\"><h3>GPU {0} {1}</h3><div class=\"charts\">",
            g.index,
            esc(&g.name)
        );
        let alerts: Vec<&AlertSpan> = r
            .alerts
            .iter()
            .filter(|a| a.gpu.is_none_or(|x| x == g.index))
            .collect();
        let xids: Vec<i64> = g.xids.iter().map(|x| x.0).collect();
        let temp_top = g.temp_max_c.unwrap_or(50.0).max(g.temp_slowdown_c + 5.0);
        let power_top = c.power.max().unwrap_or(100.0) * 1.1;
        let mem_top = c.mem_total_gib.or(c.mem_used_gib.max()).unwrap_or(1.0);
        let temp_lo = c
            .temp
            .buckets
            .iter()
            .flatten()
            .map(|b| b.0)
            .fold(20.0, f64::min);
        let slowdown = if g.temp_slowdown_known {
            "slowdown"
        } else {
            "85 °C (slowdown unknown)"
        };
        let charts = [
            Chart {
                label: "utilization %",
                series: &c.util,
                range: (0.0, 100.0),
                limit: None,
                color: "#2f6fde",
            },
            Chart {
                label: "memory used GiB",
                series: &c.mem_used_gib,
                range: (0.0, mem_top),
                limit: c.mem_total_gib.map(|t| (t, "total")),
                color: "#7b3fd1",
            },
            Chart {
                label: "temperature °C",
                series: &c.temp,
                range: (temp_lo, temp_top),
                limit: Some((g.temp_slowdown_c, slowdown)),
                color: "#d1603f",
            },
            Chart {
                label: "power W",
                series: &c.power,
                range: (0.0, power_top),
                limit: None,
                color: "#1f9d63",
            },
        ];
        for spec in &charts {
            chart(
                &mut h,
                spec,
                (r.first_ms, r.last_ms),
                &alerts,
                &xids,
                (g.interval_s * 2500.0) as i64,
            );
        }
        h.push_str("</div>");
        mig_devices(&mut h, r, g.index);
        h.push_str("</section>");
    }
    alert_timeline(&mut h, r);
    h.push_str("<p class=\"meta\">Made by gpuwatch report. Bands: alerts (yellow warning, red critical); red lines: XIDs; dashed: limits.</p></body></html>");
    h
}

/// GPUs the page shows one by one (summary rows, verdicts, charts); a larger log is summarised.
pub const MAX_GPUS_SHOWN: usize = 64;
/// Findings the page lists one by one.
const MAX_FINDINGS_SHOWN: usize = 200;
/// MIG devices a GPU's table lists one by one (a GPU reconfigured again and again over a long
/// run has seen many).
const MAX_MIG_SHOWN: usize = 64;

/// The GPUs the page shows: all of them up to [`MAX_GPUS_SHOWN`]; beyond, those with findings
/// or alerts first, then the lowest indices.
fn shown_gpus(r: &RunSummary) -> std::collections::BTreeSet<u32> {
    if r.gpus.len() <= MAX_GPUS_SHOWN {
        return r.gpus.iter().map(|g| g.index).collect();
    }
    let mut shown: std::collections::BTreeSet<u32> = std::collections::BTreeSet::new();
    let flagged = r
        .findings
        .iter()
        .map(|f| f.gpu)
        .chain(r.alerts.iter().filter_map(|a| a.gpu));
    for g in flagged.chain(r.gpus.iter().map(|g| g.index)) {
        if shown.len() >= MAX_GPUS_SHOWN {
            break;
        }
        shown.insert(g);
    }
    shown
}

/// The MIG devices of GPU `gpu` over the run, when it had MIG on: per MIG device its profile,
/// `GPU/GI/CI`, UUID, memory peak / total, the processes seen on it and the ticks it was seen
/// in; the first [`MAX_MIG_SHOWN`], then how many more.
fn mig_devices(h: &mut String, r: &RunSummary, gpu: u32) {
    let devices: Vec<&MigSummary> = r.mig.iter().filter(|m| m.gpu == gpu).collect();
    if devices.is_empty() {
        return;
    }
    // `7 × 1g.10gb`, `1 × 3g.40gb, 1 × 2g.20gb`: the profiles in the order first listed
    let mut profiles: Vec<(&str, usize)> = Vec::new();
    for m in &devices {
        let p = m.profile.as_deref().unwrap_or("?");
        match profiles.iter_mut().find(|(q, _)| *q == p) {
            Some((_, n)) => *n += 1,
            None => profiles.push((p, 1)),
        }
    }
    let split = profiles
        .iter()
        .map(|(p, n)| format!("{n} × {p}"))
        .collect::<Vec<_>>()
        .join(", ");
    let _ = write!(
        h,
        "<div class=\"mig\" id=\"gpu-{gpu}-mig\" data-gpu=\"{gpu}\"><h4>MIG on: {} MIG device{} ({})</h4>\
         <table><tr><th>profile</th><th>GPU/GI/CI</th><th>UUID</th><th>memory peak / total</th><th>processes seen</th><th>ticks</th></tr>",
        devices.len(),
        if devices.len() == 1 { "" } else { "s" },
        esc(&split)
    );
    let dash = || "-".to_string();
    let more = devices.len().saturating_sub(MAX_MIG_SHOWN);
    for m in devices.into_iter().take(MAX_MIG_SHOWN) {
        #[expect(clippy::cast_precision_loss, reason = "bytes, for display")]
        let mem = match (m.mem_peak_bytes, m.mem_total_bytes) {
            (Some(p), Some(t)) if t > 0 => format!(
                "{} / {} ({:.0} %)",
                gib(p as f64),
                gib(t as f64),
                p as f64 / t as f64 * 100.0
            ),
            (Some(p), Some(t)) => format!("{} / {}", gib(p as f64), gib(t as f64)),
            (Some(p), None) => gib(p as f64),
            (None, Some(t)) => format!("- / {}", gib(t as f64)),
            (None, None) => dash(),
        };
        let listed: Vec<String> = m
            .process_list
            .iter()
            .take(8)
            .map(|p| crate::values::truncate_chars(p, 80))
            .collect();
        let procs = match m.processes {
            0 => "none".to_string(),
            n if listed.is_empty() => n.to_string(),
            n if n > listed.len() => format!("{n}: {}, …", listed.join(", ")),
            n => format!("{n}: {}", listed.join(", ")),
        };
        let _ = write!(
            h,
            "<tr class=\"mig-device\" data-gpu-instance=\"{}\"><td>{}</td><td>{}/{}/{}</td><td><code>{}</code></td><td class=\"n\">{mem}</td><td>{}</td><td class=\"n\">{}</td></tr>",
            m.gpu_instance_id,
            esc(m.profile.as_deref().unwrap_or("?")),
            m.gpu,
            m.gpu_instance_id,
            m.compute_instance_id,
            esc(&crate::values::escape_control(&m.uuid)),
            esc(&crate::values::escape_control(&procs)),
            m.ticks
        );
    }
    if more > 0 {
        let _ = write!(
            h,
            "<tr><td colspan=\"6\">… {more} more MIG device{} (see <code>--json</code>)</td></tr>",
            if more == 1 { "" } else { "s" }
        );
    }
    h.push_str("</table></div>");
}

fn summary_table(h: &mut String, r: &RunSummary, shown: &std::collections::BTreeSet<u32>) {
    h.push_str("<section class=\"summary\"><h2>Summary</h2><table><tr><th>GPU</th><th>samples</th><th>gaps</th><th>utilization mean / p50 / p95</th><th>under 50 %</th><th>memory peak / total</th><th>trend</th><th>max temp</th><th>above slowdown</th><th>power mean / max</th><th>energy</th><th>throttled</th><th>ECC / XID</th><th>processes</th></tr>");
    let dash = || "-".to_string();
    for g in r.gpus.iter().filter(|g| shown.contains(&g.index)) {
        let util = g.util.map_or_else(dash, |u| {
            format!("{:.0} / {:.0} / {:.0} %", u.mean, u.p50, u.p95)
        });
        // GPM's SM active beside utilization (Hopper and later)
        let util = match g.sm_active_mean {
            Some(sm) => format!("{util}<br>SM active {sm:.0} %"),
            None => util,
        };
        let mem = match (g.mem_peak_bytes, g.mem_total_bytes) {
            (Some(p), Some(t)) => format!("{} / {}", gib(p), gib(t)),
            (Some(p), None) => gib(p),
            _ => dash(),
        };
        let throttled: Vec<String> = g
            .throttle_s
            .iter()
            .filter(|(_, s)| **s > 0.0)
            .map(|(k, s)| format!("{k} {}", human_duration(*s)))
            .collect();
        let _ = write!(
            h,
            "<tr><td>{} {}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{util}</td><td class=\"n\">{}</td><td class=\"n\">{mem}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{} / {}</td><td>{}</td></tr>",
            g.index,
            esc(&g.name),
            g.samples,
            if g.gaps > 0 { format!("{} ({})", g.gaps, human_duration(g.gap_s)) } else { "0".into() },
            human_duration(g.util_below_50_s),
            g.mem_trend_mib_per_h.map_or_else(dash, |t| format!("{t:+.0} MiB/h")),
            g.temp_max_c.map_or_else(dash, |t| format!("{t:.0} °C")),
            human_duration(g.temp_above_slowdown_s),
            match (g.power_mean_w, g.power_max_w) {
                (Some(m), Some(x)) => format!("{m:.0} / {x:.0} W"),
                _ => dash(),
            },
            g.energy_kwh.map_or_else(dash, |e| format!("{e:.2} kWh")),
            if throttled.is_empty() { "-".into() } else { esc(&throttled.join(", ")) },
            match (g.ecc_corrected, g.ecc_uncorrected) {
                (None, None) => dash(),
                (c, u) => format!("{:.0}c {:.0}u", c.unwrap_or(0.0), u.unwrap_or(0.0)),
            },
            g.xids.len(),
            esc(&g.processes.iter().take(8).cloned().collect::<Vec<_>>().join(", ")),
        );
    }
    h.push_str("</table>");
    if shown.len() < r.gpus.len() {
        let _ = write!(
            h,
            "<p class=\"meta\">This log has {} GPUs: the page shows {} of them one by one (those with findings or alerts first, then by index); every GPU is in the text summary and in <code>gpuwatch report --json</code>.</p>",
            r.gpus.len(),
            shown.len()
        );
    }
    if let Some(e) = r.energy_kwh {
        let _ = write!(h, "<p>Energy {e:.2} kWh");
        if let Some(c) = r.cost {
            let _ = write!(h, ", cost {c:.2} {}", esc(&r.currency));
        }
        if let Some(c) = r.co2_kg {
            let _ = write!(h, ", {c:.2} kg CO₂");
        }
        if let Some(p) = r.progress.as_ref().and_then(|p| p.energy_wh_per_step) {
            let _ = write!(h, ", {p:.3} Wh per step");
        }
        h.push_str(".</p>");
    }
    if let Some(p) = &r.progress {
        let _ = write!(
            h,
            "<p>Progress: {} → {}{}</p>",
            esc(&p.first),
            esc(&p.last),
            p.steps
                .map_or_else(String::new, |s| format!(" ({s} steps)"))
        );
    }
    h.push_str("</section>");
}

fn diagnosis(h: &mut String, r: &RunSummary, shown: &std::collections::BTreeSet<u32>) {
    h.push_str("<section class=\"diagnosis\"><h2>Diagnosis</h2>");
    if !r.verdicts.is_empty() {
        h.push_str("<ul class=\"verdicts\">");
        for v in r.verdicts.iter().filter(|v| shown.contains(&v.gpu)) {
            let _ = write!(
                h,
                "<li data-gpu=\"{0}\"><b>GPU {0}</b>: {1}</li>",
                v.gpu,
                esc(&v.verdict)
            );
        }
        let hidden =
            r.verdicts.len() - r.verdicts.iter().filter(|v| shown.contains(&v.gpu)).count();
        if hidden > 0 {
            let _ = write!(
                h,
                "<li>… and {hidden} more GPUs (see the text summary or <code>--json</code>)</li>"
            );
        }
        h.push_str("</ul>");
    }
    if r.findings.is_empty() {
        h.push_str("<p class=\"none\">No problem pattern found (utilization long under 50 %, periodic drops to zero, memory growth, memory far below or near total, stragglers, unused or stopped GPUs).</p>");
    } else {
        h.push_str("<table><tr><th>GPU</th><th>#</th><th>pattern</th><th>severity</th><th>time</th><th>share of observed</th><th>evidence</th><th>when</th><th>likely cause</th><th>fix</th></tr>");
        for f in r.findings.iter().take(MAX_FINDINGS_SHOWN) {
            let when: Vec<String> = f
                .windows
                .iter()
                .take(3)
                .map(|w| {
                    format!(
                        "{} – {}",
                        format_time_ms(w.start_ms),
                        format_time_ms(w.end_ms)
                    )
                })
                .collect();
            let _ = write!(
                h,
                "<tr class=\"finding\" data-gpu=\"{}\" data-pattern=\"{}\"><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{:.0} %</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                f.gpu,
                esc(&f.pattern),
                f.gpu,
                f.rank,
                esc(&f.title),
                esc(&f.severity),
                human_duration(f.seconds),
                f.share_of_observed * 100.0,
                esc(&f.evidence),
                esc(&when.join(", ")),
                esc(&f.cause),
                esc(&f.fix)
            );
        }
        if r.findings.len() > MAX_FINDINGS_SHOWN {
            let _ = write!(
                h,
                "<tr><td colspan=\"10\">… {} more findings (see the text summary or <code>--json</code>)</td></tr>",
                r.findings.len() - MAX_FINDINGS_SHOWN
            );
        }
        h.push_str("</table>");
    }
    if !r.brief.is_empty() {
        let _ = write!(
            h,
            "<h3>Brief episodes</h3><p class=\"meta\">Patterns that held for under {:.0} % of the observed time and under {} minutes: not problems.</p><ul>",
            super::diagnose::MIN_SHARE * 100.0,
            super::diagnose::MIN_LONG_MS / 60_000
        );
        for f in r.brief.iter().take(MAX_FINDINGS_SHOWN) {
            let _ = write!(
                h,
                "<li>GPU {}: {} for {} ({:.1} %): {}</li>",
                f.gpu,
                esc(&f.title.to_lowercase()),
                human_duration(f.seconds),
                f.share_of_observed * 100.0,
                esc(&f.evidence)
            );
        }
        h.push_str("</ul>");
    }
    if !r.phases.is_empty() {
        let p: Vec<String> = r
            .phases
            .iter()
            .map(|p| format!("{} ({})", p.describe(), format_time_ms(p.start_ms)))
            .collect();
        let _ = write!(h, "<p class=\"meta\">Phases: {}</p>", esc(&p.join(", ")));
    }
    h.push_str("</section>");
}

fn alert_timeline(h: &mut String, r: &RunSummary) {
    h.push_str("<section class=\"alerts\"><h2>Alert timeline (stock rules replayed)</h2>");
    if r.alerts.is_empty() {
        h.push_str("<p class=\"none\">No alerts.</p></section>");
        return;
    }
    h.push_str("<table><tr><th>from</th><th>to</th><th>alert</th><th>GPU</th><th>severity</th><th>summary</th></tr>");
    for a in r.alerts.iter().take(500) {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"sev-{}\">{}</td><td>{}</td></tr>",
            format_time_ms(a.start_ms),
            if a.open { "(still firing)".to_string() } else { format_time_ms(a.end_ms) },
            esc(&a.alert),
            a.gpu.map_or_else(|| "host".to_string(), |g| g.to_string()),
            esc(&a.severity),
            esc(&a.severity),
            esc(&a.summary)
        );
    }
    if r.alerts.len() > 500 {
        let _ = write!(
            h,
            "<tr><td colspan=\"6\">… {} more</td></tr>",
            r.alerts.len() - 500
        );
    }
    h.push_str("</table></section>");
}

/// What one chart draws.
pub struct Chart<'a> {
    pub label: &'a str,
    pub series: &'a Series,
    /// Value range (bottom, top).
    pub range: (f64, f64),
    /// A dashed limit line and its name.
    pub limit: Option<(f64, &'a str)>,
    pub color: &'a str,
}

/// One chart: the envelope of the series over `span`, its limit line, alert bands and XID
/// marks; samples further apart than `max_gap_ms` are not joined.
pub fn chart(
    h: &mut String,
    spec: &Chart<'_>,
    span: (i64, i64),
    alerts: &[&AlertSpan],
    xids: &[i64],
    max_gap_ms: i64,
) {
    let Chart {
        label,
        series,
        range,
        limit,
        color,
    } = *spec;
    let (from, to) = (span.0, span.1.max(span.0 + 1));
    let (lo, hi) = (
        range.0,
        if range.1 > range.0 {
            range.1
        } else {
            range.0 + 1.0
        },
    );
    let w = WIDTH as f64;
    let total_w = LEFT + w + 4.0;
    let total_h = HEIGHT + BOTTOM + 14.0;
    let x = |t: i64| LEFT + (t - from) as f64 / (to - from) as f64 * w;
    let y = |v: f64| 14.0 + HEIGHT - ((v - lo) / (hi - lo)).clamp(0.0, 1.0) * HEIGHT;
    let _ = write!(
        h,
        "<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{total_w:.0}\" height=\"{total_h:.0}\" viewBox=\"0 0 {total_w:.0} {total_h:.0}\" role=\"img\" aria-label=\"{}\">",
        esc(label)
    );
    let _ = write!(
        h,
        "<text x=\"{LEFT}\" y=\"10\" font-size=\"11\" fill=\"#333\">{}</text>",
        esc(label)
    );
    let _ = write!(
        h,
        "<rect x=\"{LEFT}\" y=\"14\" width=\"{w}\" height=\"{HEIGHT}\" fill=\"none\" stroke=\"#ddd\"/>"
    );
    for a in alerts {
        let (x0, x1) = (x(a.start_ms.max(from)), x(a.end_ms.min(to)));
        let fill = if a.severity == "critical" {
            "#e5484d"
        } else {
            "#f5c542"
        };
        let _ = write!(
            h,
            "<rect x=\"{x0:.1}\" y=\"14\" width=\"{:.1}\" height=\"{HEIGHT}\" fill=\"{fill}\" fill-opacity=\"0.22\"><title>{}: {}</title></rect>",
            (x1 - x0).max(1.0),
            esc(&a.alert),
            esc(&a.summary)
        );
    }
    for t in xids {
        let xx = x(*t);
        let _ = write!(
            h,
            "<line x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"14\" y2=\"{:.0}\" stroke=\"#c4161c\" stroke-width=\"1.5\"><title>XID at {}</title></line>",
            14.0 + HEIGHT,
            format_time_ms(*t)
        );
    }
    if let Some((v, name)) = limit {
        let yy = y(v);
        let _ = write!(
            h,
            "<line x1=\"{LEFT}\" x2=\"{:.0}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"#888\" stroke-dasharray=\"4 3\"><title>{}</title></line>",
            LEFT + w,
            esc(name)
        );
    }
    // The envelope: one closed path per run of columns with data; a column without data
    // (a gap) ends the run.
    let cols = series.columns(from, to, WIDTH);
    let mut d = String::new();
    let mut run: Vec<(f64, f64, f64)> = Vec::new();
    let flush = |run: &mut Vec<(f64, f64, f64)>, d: &mut String| {
        if run.is_empty() {
            return;
        }
        let _ = write!(d, "M{:.1} {:.1}", run[0].0, run[0].2);
        for (xx, _, top) in run.iter() {
            let _ = write!(d, "L{xx:.1} {top:.1}");
        }
        let (lx, _, _) = run[run.len() - 1];
        let _ = write!(d, "L{:.1} {:.1}", lx + 1.0, run[run.len() - 1].2);
        let _ = write!(d, "L{:.1} {:.1}", lx + 1.0, run[run.len() - 1].1);
        for (xx, bottom, _) in run.iter().rev() {
            let _ = write!(d, "L{xx:.1} {bottom:.1}");
        }
        d.push('Z');
        run.clear();
    };
    // Columns are often finer than the samples: an empty column is a gap only where the
    // samples on either side are further apart than `max_gap_ms`.
    let max_gap_cols = max_gap_ms as f64 / (to - from) as f64 * w;
    let mut last = None;
    for (i, c) in cols.iter().enumerate() {
        if let Some((min, max)) = c {
            if last.is_some_and(|l: usize| (i - l) as f64 > max_gap_cols + 1.0) {
                flush(&mut run, &mut d);
            }
            let bottom = y(*min);
            let top = y(*max).min(bottom - 1.0);
            run.push((LEFT + i as f64, bottom, top));
            last = Some(i);
        }
    }
    flush(&mut run, &mut d);
    if !d.is_empty() {
        let _ = write!(
            h,
            "<path d=\"{d}\" fill=\"{color}\" fill-opacity=\"0.55\" stroke=\"{color}\" stroke-width=\"1\"/>"
        );
    } else {
        let _ = write!(
            h,
            "<text x=\"{:.0}\" y=\"{:.0}\" font-size=\"12\" fill=\"#999\">not in this log</text>",
            LEFT + w / 2.0 - 40.0,
            14.0 + HEIGHT / 2.0
        );
    }
    let fmt_axis = |v: f64| {
        if v.abs() >= 100.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.1}")
        }
    };
    let _ = write!(
        h,
        "<text x=\"{:.0}\" y=\"20\" font-size=\"10\" fill=\"#666\" text-anchor=\"end\">{}</text><text x=\"{:.0}\" y=\"{:.0}\" font-size=\"10\" fill=\"#666\" text-anchor=\"end\">{}</text>",
        LEFT - 4.0,
        fmt_axis(hi),
        LEFT - 4.0,
        14.0 + HEIGHT,
        fmt_axis(lo)
    );
    for (anchor, t, xx) in [("start", from, LEFT), ("end", to, LEFT + w)] {
        let _ = write!(
            h,
            "<text x=\"{xx:.0}\" y=\"{:.0}\" font-size=\"10\" fill=\"#666\" text-anchor=\"{anchor}\">{}</text>",
            total_h - 3.0,
            format_time_ms(t).get(..16).unwrap_or_default().replace('T', " ")
        );
    }
    h.push_str("</svg>");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run summary with no GPUs and the MIG devices `mig`.
    fn run(mig: serde_json::Value) -> RunSummary {
        serde_json::from_value(serde_json::json!({
            "sources": ["x.csv"], "first_ms": 0, "last_ms": 1000, "ticks": 3, "gpus": [],
            "energy_kwh": null, "cost": null, "currency": "", "co2_kg": null, "findings": [],
            "alerts": [], "progress": null, "warnings": [], "mig": mig
        }))
        .expect("a run summary")
    }

    #[test]
    fn a_gpu_with_mig_on_lists_its_mig_devices_with_everything_escaped() {
        let r = run(serde_json::json!([
            {"gpu": 0, "gpu_instance_id": 7, "compute_instance_id": 0,
             "uuid": "MIG-\u{1b}[31m\"}<script>alert(1)</script>", "profile": "1g.10gb",
             "mem_peak_bytes": 5_u64 << 30, "mem_total_bytes": 10_u64 << 30, "processes": 1,
             "ticks": 3, "process_list": ["1220 python <b>train</b>.py & co"]},
            {"gpu": 0, "gpu_instance_id": 8, "compute_instance_id": 0, "uuid": "MIG-b",
             "profile": "1g.10gb", "mem_peak_bytes": null, "mem_total_bytes": null,
             "processes": 0, "ticks": 2},
            {"gpu": 1, "gpu_instance_id": 1, "compute_instance_id": 0, "uuid": "MIG-c",
             "profile": null, "mem_peak_bytes": 1, "mem_total_bytes": 2, "processes": 0,
             "ticks": 3}
        ]));
        let mut h = String::new();
        mig_devices(&mut h, &r, 0);
        assert!(h.contains("MIG on: 2 MIG devices (2 × 1g.10gb)"), "{h}");
        assert_eq!(h.matches("<tr class=\"mig-device\"").count(), 2, "{h}");
        assert!(h.contains("<td>0/7/0</td>"), "{h}");
        assert!(h.contains("5.0 GiB / 10.0 GiB (50 %)"), "{h}");
        assert!(
            h.contains("MIG-\\u{1b}[31m&quot;}&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{h}"
        );
        assert!(
            h.contains("1: 1220 python &lt;b&gt;train&lt;/b&gt;.py &amp; co"),
            "{h}"
        );
        assert!(!h.contains("<script") && !h.contains("<b>"), "{h}");
        assert!(
            h.contains("<td>0/8/0</td>") && h.contains("<td>none</td>"),
            "{h}"
        );
        let mut other = String::new();
        mig_devices(&mut other, &r, 1);
        assert!(other.contains("MIG on: 1 MIG device (1 × ?)"), "{other}");
        let mut none = String::new();
        mig_devices(&mut none, &r, 2);
        assert!(none.is_empty(), "MIG off: no section");
    }

    /// A GPU reconfigured again and again over a run: its table lists the first MAX_MIG_SHOWN
    /// MIG devices and says how many more there were.
    #[test]
    fn a_gpu_s_mig_table_is_bounded() {
        let many: Vec<serde_json::Value> = (0..MAX_MIG_SHOWN + 10)
            .map(|k| {
                serde_json::json!({"gpu": 0, "gpu_instance_id": k, "compute_instance_id": 0,
                    "uuid": format!("MIG-{k}"), "profile": "1g.10gb", "mem_peak_bytes": null,
                    "mem_total_bytes": null, "processes": 0, "ticks": 1})
            })
            .collect();
        let r = run(serde_json::Value::Array(many));
        let mut h = String::new();
        mig_devices(&mut h, &r, 0);
        assert!(
            h.contains(&format!("MIG on: {} MIG devices", MAX_MIG_SHOWN + 10)),
            "{h}"
        );
        assert_eq!(h.matches("<tr class=\"mig-device\"").count(), MAX_MIG_SHOWN);
        assert!(
            h.contains("… 10 more MIG devices (see <code>--json</code>)"),
            "{h}"
        );
        assert!(
            !h.contains(&format!("<code>MIG-{MAX_MIG_SHOWN}</code>")),
            "{h}"
        );
    }
}
