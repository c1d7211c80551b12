//! `gpuwatch report`: what a run looked like, from any log `import` reads — per-GPU numbers
//! (`report::stats`), the diagnosis (time each stock problem-pattern rule was firing, with the
//! likely cause and the fix), the alert timeline from replaying the rules, and charts
//! (`report::series`), rendered as text, JSON or one self-contained HTML page
//! (`report::html`); two runs or a run and a saved baseline side by side (`report::compare`).
//!
//! The diagnosis ([`diagnose`]) judges the run on its own data — over the whole log and its
//! phases (idle head and tail, each job, each GPU's steady phase), with shares of observed time
//! — so it does not depend on a stock rule's hold having elapsed; the alert timeline from
//! replaying the rules is its own section.

pub mod batch;
pub mod compare;
pub mod diagnose;
pub mod html;
pub mod series;
pub mod stats;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::engine::Engine;
use crate::import::Imported;
use crate::model::{AlertEvent, AlertStatus, Snapshot};
pub use stats::{GpuCharts, GpuSummary};

/// `[report]` in the config file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ReportSection {
    /// Electricity price per kWh, for the energy cost line.
    pub price_per_kwh: Option<f64>,
    /// Currency shown with the cost (`"EUR"`, `"$"`).
    pub currency: String,
    /// Grid carbon intensity, grams of CO₂ per kWh.
    pub grams_co2_per_kwh: Option<f64>,
}

impl ReportSection {
    /// Checks the values serde cannot.
    pub fn validate(&self) -> Vec<crate::values::Problem> {
        let mut out = Vec::new();
        for (key, v) in [
            ("report.price_per_kwh", self.price_per_kwh),
            ("report.grams_co2_per_kwh", self.grams_co2_per_kwh),
        ] {
            if v.is_some_and(|v| !(v.is_finite() && v >= 0.0)) {
                out.push(crate::values::Problem::at(
                    key,
                    "must be a number of at least 0",
                ));
            }
        }
        out
    }
}

/// An alert from replaying the rules: when it fired and resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlertSpan {
    pub alert: String,
    pub gpu: Option<u32>,
    pub severity: String,
    pub start_ms: i64,
    pub end_ms: i64,
    /// Still firing at the end of the log.
    pub open: bool,
    pub summary: String,
}

pub use diagnose::{Finding, Phase, Verdict, Window};

/// Training progress over the run (when the log carried it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgressSummary {
    pub first: String,
    pub last: String,
    /// Steps done (epoch × steps per epoch + step, when both are known).
    pub steps: Option<u64>,
    pub energy_wh_per_step: Option<f64>,
}

/// Every number of a run (what `--json` prints and a baseline keeps).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub sources: Vec<String>,
    pub first_ms: i64,
    pub last_ms: i64,
    pub ticks: u64,
    pub gpus: Vec<GpuSummary>,
    pub energy_kwh: Option<f64>,
    pub cost: Option<f64>,
    pub currency: String,
    pub co2_kg: Option<f64>,
    /// The diagnosis: problem patterns per GPU, ranked within each GPU.
    pub findings: Vec<Finding>,
    /// Patterns that held too briefly to be problems.
    #[serde(default)]
    pub brief: Vec<Finding>,
    /// Idle head and tail, jobs, idle pauses.
    #[serde(default)]
    pub phases: Vec<Phase>,
    /// One line per GPU.
    #[serde(default)]
    pub verdicts: Vec<Verdict>,
    pub alerts: Vec<AlertSpan>,
    pub progress: Option<ProgressSummary>,
    pub warnings: Vec<String>,
    /// The MIG devices seen on GPUs with MIG on, by GPU then GPU instance.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<MigSummary>,
}

/// One MIG device over a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MigSummary {
    /// Its GPU's index.
    pub gpu: u32,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub uuid: String,
    pub profile: Option<String>,
    /// The most memory used on it, bytes.
    pub mem_peak_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
    /// Distinct processes seen on it.
    pub processes: usize,
    /// Ticks it was seen in.
    pub ticks: u64,
    /// The processes seen on it, `PID command` (the PID alone when the command is unknown), in
    /// the order they were first seen; at most [`MIG_PROCESSES_LISTED`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub process_list: Vec<String>,
    /// The mean SM, tensor and DRAM activity of its GPU instance, percent, over the ticks that
    /// carried them (GPM per GPU instance: Hopper and later; absent elsewhere, never 0).
    #[serde(default)]
    pub sm_active_mean: Option<f64>,
    #[serde(default)]
    pub tensor_active_mean: Option<f64>,
    #[serde(default)]
    pub dram_active_mean: Option<f64>,
}

/// The GPU-instance GPM metrics a MIG summary averages, and the field each mean goes to.
const MIG_MEANS: [crate::model::Metric; 3] = [
    crate::model::Metric::SmActive,
    crate::model::Metric::TensorActive,
    crate::model::Metric::DramActive,
];

/// Sum and count of each of [`MIG_MEANS`] over the ticks that carried it.
type MigSums = [(f64, u64); MIG_MEANS.len()];

/// Processes a MIG device's summary lists by PID and command (all are counted).
pub const MIG_PROCESSES_LISTED: usize = 100;

/// The distinct processes seen on one MIG device: the first [`MIG_PROCESSES_LISTED`] with their
/// commands (when known), the rest only counted.
#[derive(Debug, Default)]
struct MigPids {
    /// Every PID seen (bounded by the PIDs a host has).
    seen: std::collections::HashSet<u32>,
    /// The first ones seen, with their commands.
    listed: Vec<(u32, Option<String>)>,
}

/// The MIG devices of a run so far, by (GPU, GPU instance, compute instance, UUID): each with the
/// distinct PIDs seen on it.
type MigAcc = BTreeMap<(u32, u32, u32, String), (MigSummary, MigPids, MigSums)>;

/// Folds one snapshot's MIG devices into the run's.
fn observe_mig(acc: &mut MigAcc, s: &Snapshot) {
    for m in &s.mig {
        let key = (
            m.gpu_index,
            m.gpu_instance_id,
            m.compute_instance_id,
            m.uuid.clone(),
        );
        let (sum, pids, sums) = acc.entry(key).or_insert_with(|| {
            (
                MigSummary {
                    gpu: m.gpu_index,
                    gpu_instance_id: m.gpu_instance_id,
                    compute_instance_id: m.compute_instance_id,
                    uuid: m.uuid.clone(),
                    profile: m.profile.clone(),
                    mem_peak_bytes: None,
                    mem_total_bytes: None,
                    processes: 0,
                    ticks: 0,
                    process_list: Vec::new(),
                    sm_active_mean: None,
                    tensor_active_mean: None,
                    dram_active_mean: None,
                },
                MigPids::default(),
                MigSums::default(),
            )
        });
        sum.ticks += 1;
        for (metric, (total, n)) in MIG_MEANS.iter().zip(sums.iter_mut()) {
            if let Some(v) = m.gpm.get(*metric) {
                *total += v;
                *n += 1;
            }
        }
        if let Some(u) = m.mem_used_bytes {
            sum.mem_peak_bytes = Some(sum.mem_peak_bytes.map_or(u, |p| p.max(u)));
        }
        if m.mem_total_bytes.is_some() {
            sum.mem_total_bytes = m.mem_total_bytes;
        }
        let command = |pid: u32| {
            s.processes
                .iter()
                .flatten()
                .find(|q| q.gpu_index == m.gpu_index && q.pid == pid)
                .and_then(|q| q.command.clone())
        };
        for &p in &m.pids {
            if pids.seen.insert(p) {
                if pids.listed.len() < MIG_PROCESSES_LISTED {
                    pids.listed.push((p, command(p)));
                }
            } else if let Some((_, known @ None)) =
                pids.listed.iter_mut().find(|(pid, _)| *pid == p)
            {
                // a listed process whose command was not known when first seen
                *known = command(p);
            }
        }
        sum.processes = pids.seen.len();
    }
}

/// The MIG summaries of a run: each with the processes seen on it, `PID command`.
fn finish_mig(acc: MigAcc) -> Vec<MigSummary> {
    acc.into_values()
        .map(|(mut m, pids, sums)| {
            #[expect(clippy::cast_precision_loss, reason = "a count of ticks")]
            let means = sums.map(|(total, n)| (n > 0).then(|| total / n as f64));
            [m.sm_active_mean, m.tensor_active_mean, m.dram_active_mean] = means;
            m.process_list = pids
                .listed
                .into_iter()
                .map(|(pid, command)| match command {
                    Some(c) => format!("{pid} {c}"),
                    None => pid.to_string(),
                })
                .collect();
            m
        })
        .collect()
}

/// A run's summary and its charts.
#[derive(Debug, Clone)]
pub struct Report {
    pub summary: RunSummary,
    pub charts: BTreeMap<u32, GpuCharts>,
}

/// Global step of a progress reading: `epoch × total + step` when both are known.
fn global_step(p: &crate::import::Progress) -> Option<u64> {
    match (p.epoch, p.step, p.total) {
        (Some(e), Some(s), Some(t)) => Some(e.saturating_mul(t).saturating_add(s)),
        (_, Some(s), _) => Some(s),
        _ => None,
    }
}

/// The number of processes on each GPU as a run's ticks say it: a tick's list replaces the one
/// in force, a tick without one keeps it (a recording says "unchanged" between two changes, as
/// the sampler does), a new time-line segment starts without.
#[derive(Debug, Default)]
struct ProcsInForce {
    on: BTreeMap<u32, usize>,
    segment: Option<u32>,
}

impl ProcsInForce {
    fn observe(&mut self, t: &Imported) {
        if t.snapshot.processes.is_some() || self.segment != Some(t.segment) {
            self.on.clear();
        }
        self.segment = Some(t.segment);
        for p in t.snapshot.processes.iter().flatten() {
            *self.on.entry(p.gpu_index).or_default() += 1;
        }
    }

    fn on(&self, gpu: u32) -> usize {
        self.on.get(&gpu).copied().unwrap_or(0)
    }
}

/// Builds a report from `ticks`, replaying them through the engines `fresh` makes (one per
/// time-line segment). `sources` names the logs.
pub fn build(
    sources: Vec<String>,
    ticks: impl Iterator<Item = anyhow::Result<Imported>>,
    fresh: impl FnMut() -> anyhow::Result<Engine>,
    section: &ReportSection,
) -> anyhow::Result<Report> {
    let mut accs: BTreeMap<u32, stats::GpuAcc> = BTreeMap::new();
    let mut traces: BTreeMap<u32, diagnose::Trace> = BTreeMap::new();
    let mut procs_on = ProcsInForce::default();
    let mut open: BTreeMap<(String, Option<u32>), AlertSpan> = BTreeMap::new();
    let mut spans = Vec::new();
    let mut progress: (
        Option<crate::import::Progress>,
        Option<crate::import::Progress>,
    ) = (None, None);
    let mut n_ticks = 0u64;
    let mut first_ms = None;
    let mut last_ms = 0;
    let mut mig = BTreeMap::new();
    let on_tick = |t: &Imported| {
        let s = &t.snapshot;
        n_ticks += 1;
        observe_mig(&mut mig, s);
        first_ms.get_or_insert(s.time_ms);
        last_ms = last_ms.max(s.time_ms);
        procs_on.observe(t);
        for p in s.processes.iter().flatten() {
            if let Some(t) = traces.get_mut(&p.gpu_index) {
                t.pid(p.pid);
            }
        }
        for g in &s.gpus {
            accs.entry(g.id.index)
                .or_insert_with(|| stats::GpuAcc::new(g.id.index))
                .push(s.time_ms, g);
            traces
                .entry(g.id.index)
                .or_insert_with(|| diagnose::Trace::new(g.id.index))
                .push(s.time_ms, g, procs_on.on(g.id.index));
        }
        for x in &s.xids {
            if let Some(a) = accs.get_mut(&x.gpu_index) {
                a.xid(s.time_ms, x.xid);
            }
        }
        for p in s.processes.iter().flatten() {
            if let Some(a) = accs.get_mut(&p.gpu_index) {
                a.process(p.pid, p.command.as_deref());
            }
        }
        if let Some(p) = &t.progress {
            if progress.0.is_none() {
                progress.0 = Some(p.clone());
            }
            progress.1 = Some(p.clone());
        }
    };
    let on_event = |ev: &AlertEvent| {
        if ev.repeat {
            return;
        }
        let key = (ev.name.clone(), ev.gpu);
        match ev.status {
            AlertStatus::Firing => {
                open.entry(key).or_insert_with(|| AlertSpan {
                    alert: ev.name.clone(),
                    gpu: ev.gpu,
                    severity: ev.severity.as_str().to_string(),
                    start_ms: ev.at_ms,
                    end_ms: ev.at_ms,
                    open: true,
                    summary: ev.annotations.get("summary").cloned().unwrap_or_default(),
                });
            }
            AlertStatus::Resolved => {
                if let Some(mut s) = open.remove(&key) {
                    s.end_ms = ev.at_ms;
                    s.open = false;
                    spans.push(s);
                }
            }
        }
    };
    crate::engine::replay_segments(ticks, fresh, on_tick, on_event, drop)?;
    for (_, mut s) in open {
        s.end_ms = last_ms.max(s.start_ms);
        spans.push(s);
    }
    spans.sort_by(|a, b| (a.start_ms, &a.alert, a.gpu).cmp(&(b.start_ms, &b.alert, b.gpu)));

    let mut gpus = Vec::new();
    let mut charts = BTreeMap::new();
    for (i, acc) in accs {
        let (summary, chart) = acc.finish();
        gpus.push(summary);
        charts.insert(i, chart);
    }
    let energy: Option<f64> = gpus
        .iter()
        .filter_map(|g| g.energy_kwh)
        .fold(None, |a, e| Some(a.unwrap_or(0.0) + e));
    let progress = match progress {
        (Some(a), Some(b)) => {
            let steps = global_step(&b)
                .zip(global_step(&a))
                .map(|(z, a)| z.saturating_sub(a));
            Some(ProgressSummary {
                first: a.text,
                last: b.text,
                steps,
                energy_wh_per_step: steps
                    .filter(|s| *s > 0)
                    .zip(energy)
                    .map(|(s, e)| e * 1000.0 / s as f64),
            })
        }
        _ => None,
    };
    let traces: Vec<diagnose::Trace> = traces.into_values().collect();
    let diagnosis = diagnose::diagnose(&traces, progress.as_ref().and_then(|p| p.steps));
    for g in &mut gpus {
        // The trend after warm-up (a ramp that then stays flat is no trend).
        g.mem_trend_mib_per_h = diagnosis.mem_trend.get(&g.index).copied();
    }
    Ok(Report {
        summary: RunSummary {
            sources,
            first_ms: first_ms.unwrap_or(0),
            last_ms,
            ticks: n_ticks,
            gpus,
            energy_kwh: energy,
            cost: energy.zip(section.price_per_kwh).map(|(e, p)| e * p),
            currency: section.currency.clone(),
            co2_kg: energy
                .zip(section.grams_co2_per_kwh)
                .map(|(e, g)| e * g / 1000.0),
            findings: diagnosis.findings,
            brief: diagnosis.brief,
            phases: diagnosis.phases,
            verdicts: diagnosis.verdicts,
            alerts: spans,
            progress,
            warnings: Vec::new(),
            mig: finish_mig(mig),
        },
        charts,
    })
}

/// `1h 02m`, `4m 10s`, `12s`.
pub fn human_duration(seconds: f64) -> String {
    let s = seconds.round() as i64;
    if s >= 3600 {
        format!("{}h {:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m {:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// `3.2 GiB`.
pub fn gib(bytes: f64) -> String {
    format!("{:.1} GiB", bytes / 1_073_741_824.0)
}

/// The short text summary (what `report` prints without `--json`, and `run` at its end).
pub fn text(r: &RunSummary) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let span = (r.last_ms - r.first_ms) as f64 / 1000.0;
    let _ = writeln!(
        out,
        "{} to {} ({}), {} GPU(s), {} ticks",
        crate::trace::format_time_ms(r.first_ms),
        crate::trace::format_time_ms(r.last_ms),
        human_duration(span),
        r.gpus.len(),
        r.ticks
    );
    for g in &r.gpus {
        let util = g.util.map_or_else(
            || "utilization -".to_string(),
            |u| {
                format!(
                    "utilization mean {:.0} % (p50 {:.0}, p95 {:.0})",
                    u.mean, u.p50, u.p95
                )
            },
        );
        let mem = match (g.mem_peak_bytes, g.mem_total_bytes) {
            (Some(p), Some(t)) => format!("memory peak {} of {}", gib(p), gib(t)),
            (Some(p), None) => format!("memory peak {}", gib(p)),
            _ => "memory -".into(),
        };
        let temp = g
            .temp_max_c
            .map_or_else(|| "temp -".to_string(), |t| format!("max {t:.0} °C"));
        let power = g
            .power_mean_w
            .map_or_else(String::new, |p| format!(", power mean {p:.0} W"));
        // GPM (Hopper and later): what the SMs, the tensor pipes and DRAM did while busy
        let gpm = [
            ("SM active", g.sm_active_mean),
            ("tensor active", g.tensor_active_mean),
            ("DRAM active", g.dram_active_mean),
        ]
        .iter()
        .filter_map(|(name, v)| v.map(|v| format!("{name} {v:.0} %")))
        .collect::<Vec<_>>();
        let util = if gpm.is_empty() {
            util
        } else {
            format!("{util}, {}", gpm.join(", "))
        };
        let gaps = if g.gaps > 0 {
            format!(", {} gap(s) {}", g.gaps, human_duration(g.gap_s))
        } else {
            String::new()
        };
        let _ = writeln!(out, "  GPU {}: {util}; {mem}; {temp}{power}{gaps}", g.index);
        for m in r.mig.iter().filter(|m| m.gpu == g.index) {
            #[expect(clippy::cast_precision_loss, reason = "bytes, for display")]
            let mem = match (m.mem_peak_bytes, m.mem_total_bytes) {
                (Some(p), Some(t)) => format!("memory peak {} of {}", gib(p as f64), gib(t as f64)),
                (Some(p), None) => format!("memory peak {}", gib(p as f64)),
                _ => "memory -".into(),
            };
            // its GPU instance's activity (GPM), where it was read
            let activity: Vec<String> = [
                ("SM active", m.sm_active_mean),
                ("tensor", m.tensor_active_mean),
                ("DRAM", m.dram_active_mean),
            ]
            .iter()
            .filter_map(|(name, v)| v.map(|v| format!("{name} {v:.0} %")))
            .collect();
            let activity = if activity.is_empty() {
                String::new()
            } else {
                format!("; {}", activity.join(", "))
            };
            let _ = writeln!(
                out,
                "    MIG {} {}/{}/{}: {mem}; {} process{}{activity}",
                m.profile.as_deref().unwrap_or("?"),
                m.gpu,
                m.gpu_instance_id,
                m.compute_instance_id,
                m.processes,
                if m.processes == 1 { "" } else { "es" }
            );
        }
    }
    if let Some(e) = r.energy_kwh {
        let cost = r
            .cost
            .map_or_else(String::new, |c| format!(", {c:.2} {}", r.currency));
        let co2 = r
            .co2_kg
            .map_or_else(String::new, |c| format!(", {c:.2} kg CO₂"));
        let _ = writeln!(out, "  energy {e:.2} kWh{cost}{co2}");
    }
    out.push_str(&diagnosis_text(r));
    if !r.alerts.is_empty() {
        let _ = writeln!(
            out,
            "alerts from replaying the rules: {} (see the alert timeline)",
            r.alerts.len()
        );
    }
    out
}

/// GPU indices as people write them: `1–3, 5`.
pub fn gpu_list(idx: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && idx[j + 1] == idx[j] + 1 {
            j += 1;
        }
        parts.push(if j > i + 1 {
            format!("{}–{}", idx[i], idx[j])
        } else if j == i + 1 {
            format!("{}, {}", idx[i], idx[j])
        } else {
            idx[i].to_string()
        });
        i = j + 1;
    }
    parts.join(", ")
}

/// `10:00:05–10:02:05` (dates where the windows cross days), at most three windows.
fn windows_text(w: &[Window]) -> String {
    let t = |ms: i64| crate::trace::format_time_ms(ms);
    let mut out: Vec<String> = w
        .iter()
        .take(3)
        .map(|w| format!("{} – {}", t(w.start_ms), t(w.end_ms)))
        .collect();
    if w.len() > 3 {
        out.push(format!("and {} more", w.len() - 3));
    }
    out.join(", ")
}

/// The diagnosis as text: findings per GPU (ranked), unused GPUs in one line, brief episodes,
/// phases, and a verdict per GPU.
pub fn diagnosis_text(r: &RunSummary) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let unused_findings: Vec<&Finding> = r
        .findings
        .iter()
        .filter(|f| f.pattern == "unused_gpu")
        .collect();
    let unused: Vec<u32> = unused_findings.iter().map(|f| f.gpu).collect();
    let problems: Vec<&Finding> = r
        .findings
        .iter()
        .filter(|f| f.pattern != "unused_gpu")
        .collect();
    if problems.is_empty() && unused.is_empty() {
        let _ = writeln!(out, "diagnosis: no problem pattern found");
    } else {
        let _ = writeln!(out, "diagnosis:");
        for f in &problems {
            let _ = writeln!(
                out,
                "  GPU {} #{} {} ({}, {} = {:.0} % of observed time): {}; when: {}",
                f.gpu,
                f.rank,
                f.title.to_lowercase(),
                f.severity,
                human_duration(f.seconds),
                f.share_of_observed * 100.0,
                f.evidence,
                windows_text(&f.windows)
            );
            let _ = writeln!(out, "      likely cause: {}", f.cause);
            let _ = writeln!(out, "      fix: {}", f.fix);
        }
        if let Some(first) = unused_findings.first() {
            let (what, verb) = if unused.len() == 1 {
                ("GPU", "was")
            } else {
                ("GPUs", "were")
            };
            let _ = writeln!(
                out,
                "  {what} {} {verb} not used by this run (info): no work and no memory held while other GPUs worked — {}",
                gpu_list(&unused),
                first.fix
            );
        }
    }
    if !r.brief.is_empty() {
        let _ = writeln!(
            out,
            "brief episodes (not problems: under {:.0} % of the observed time and under {} min):",
            diagnose::MIN_SHARE * 100.0,
            diagnose::MIN_LONG_MS / 60_000
        );
        for f in &r.brief {
            let _ = writeln!(
                out,
                "  GPU {}: {} for {} ({:.1} %): {}",
                f.gpu,
                f.title.to_lowercase(),
                human_duration(f.seconds),
                f.share_of_observed * 100.0,
                f.evidence
            );
        }
    }
    if !r.phases.is_empty() {
        let p: Vec<String> = r.phases.iter().map(Phase::describe).collect();
        let _ = writeln!(out, "phases: {}", p.join(", "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{MigSample, ProcSample};

    #[test]
    fn a_tick_without_a_process_list_keeps_the_one_in_force() {
        let tick = |segment: u32, procs: Option<Vec<(u32, u32)>>| Imported {
            snapshot: Snapshot {
                processes: procs.map(|l| {
                    l.into_iter()
                        .map(|(pid, gpu)| ProcSample::compute(pid, gpu, "", None))
                        .collect()
                }),
                ..Snapshot::default()
            },
            progress: None,
            segment,
        };
        let mut p = ProcsInForce::default();
        p.observe(&tick(0, Some(vec![(10, 0), (11, 0), (20, 1)])));
        assert_eq!((p.on(0), p.on(1)), (2, 1));
        p.observe(&tick(0, None));
        assert_eq!((p.on(0), p.on(1)), (2, 1), "unchanged");
        p.observe(&tick(0, Some(vec![(20, 1)])));
        assert_eq!((p.on(0), p.on(1)), (0, 1));
        p.observe(&tick(1, None));
        assert_eq!((p.on(0), p.on(1)), (0, 0), "a new time line knows no list");
    }

    #[test]
    fn mig_devices_keep_their_peak_and_the_processes_seen_on_them() {
        let mut acc = MigAcc::new();
        let slice = |used: u64, pids: Vec<u32>| MigSample {
            mem_used_bytes: Some(used << 20),
            mem_total_bytes: Some(9728 << 20),
            pids,
            ..MigSample::one_g(0, 0)
        };
        let mut named = ProcSample::compute(1220, 0, "GPU-0", Some(4000 << 20));
        named.command = Some("python train.py".into());
        let ticks = [
            // the command is not known at first sight, then it is
            Snapshot {
                mig: vec![slice(4000, vec![1220])],
                processes: Some(vec![ProcSample::compute(1220, 0, "GPU-0", None)]),
                ..Snapshot::default()
            },
            Snapshot {
                mig: vec![slice(5000, vec![1220, 1300])],
                processes: Some(vec![named]),
                ..Snapshot::default()
            },
            Snapshot {
                mig: vec![slice(100, vec![])],
                ..Snapshot::default()
            },
        ];
        for s in &ticks {
            observe_mig(&mut acc, s);
        }
        let out = finish_mig(acc);
        assert_eq!(out.len(), 1);
        let m = &out[0];
        assert_eq!((m.gpu, m.gpu_instance_id, m.ticks), (0, 7, 3));
        assert_eq!(m.mem_peak_bytes, Some(5000 << 20));
        assert_eq!(m.mem_total_bytes, Some(9728 << 20));
        assert_eq!(m.processes, 2);
        assert_eq!(m.process_list, ["1220 python train.py", "1300"]);
        assert_eq!(m.sm_active_mean, None, "no GPM: absent, not 0");
    }

    /// A MIG device that saw many processes (short jobs one after another): all counted, the
    /// first MIG_PROCESSES_LISTED listed, in the order seen.
    #[test]
    fn mig_devices_count_every_process_and_list_the_first() {
        let mut acc = MigAcc::new();
        for t in 0..250u32 {
            let m = MigSample {
                pids: vec![1000 + 2 * t, 1001 + 2 * t, 1000],
                ..MigSample::one_g(0, 0)
            };
            observe_mig(
                &mut acc,
                &Snapshot {
                    mig: vec![m],
                    ..Snapshot::default()
                },
            );
        }
        let out = finish_mig(acc);
        assert_eq!(out[0].processes, 500);
        assert_eq!(out[0].process_list.len(), MIG_PROCESSES_LISTED);
        assert_eq!(out[0].process_list[..3], ["1000", "1001", "1002"]);
        assert_eq!(out[0].process_list.last().map(String::as_str), Some("1099"));
    }

    /// A GPU instance's mean SM, tensor and DRAM activity over the ticks that carried them.
    #[test]
    fn mig_devices_average_their_gpu_instance_activity() {
        let mut acc = MigAcc::new();
        for sm in [Some(80.0), None, Some(60.0)] {
            let mut m = MigSample::one_g(1, 0);
            m.gpm.set(crate::model::Metric::SmActive, sm);
            m.gpm.set(crate::model::Metric::DramActive, Some(10.0));
            observe_mig(
                &mut acc,
                &Snapshot {
                    mig: vec![m],
                    ..Snapshot::default()
                },
            );
        }
        let out = finish_mig(acc);
        assert_eq!(out[0].sm_active_mean, Some(70.0));
        assert_eq!(out[0].dram_active_mean, Some(10.0));
        assert_eq!(out[0].tensor_active_mean, None);
    }
}
