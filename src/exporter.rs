//! `/metrics`: the last snapshot and the alert state in Prometheus's text format (0.0.4) or
//! OpenMetrics, under dcgm-exporter's metric names and labels so its dashboards work unchanged,
//! plus gpuwatch's own families. Rendering is a pure function of [`ExportState`]; the daemon
//! keeps that state current and serves it (`daemon::http`), so a scrape never calls NVML.
//!
//! Units follow dcgm-exporter: framebuffer memory in MiB, energy in mJ, the profiling activities
//! (`DCGM_FI_PROF_*`: SM active, tensor active, DRAM active, … from GPM) as ratios 0–1, the
//! rest as gpuwatch keeps them (%, °C, W, MHz, bytes/s, counts, bitmask). The names come from
//! the metric table (`model::METRICS`, column `dcgm`).

use std::fmt::Write as _;

use crate::model::{GpuSample, Metric, MetricDesc, MetricKind, MigSample, Snapshot, METRICS};

/// One alert instance as `gpuwatch_alerts` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertRow {
    pub alertname: String,
    pub severity: String,
    pub gpu: Option<u32>,
    /// `pending` or `firing`.
    pub state: &'static str,
}

/// What a scrape shows.
#[derive(Debug, Clone, Default)]
pub struct ExportState {
    pub hostname: String,
    /// The newest snapshot (none before the first sample: not ready).
    pub snapshot: Option<Snapshot>,
    pub alerts: Vec<AlertRow>,
    /// Last XID per GPU index (dcgm-exporter's `DCGM_FI_DEV_XID_ERRORS` is the last XID).
    pub last_xid: std::collections::BTreeMap<u32, u64>,
    /// Bumped at every update: scrapes of one generation share one rendering.
    pub generation: u64,
    /// Wall time of the newest sample (all GPUs), seconds.
    pub sample_seconds: Option<f64>,
    /// Sampling ticks taken and skipped (late) since the start.
    pub ticks: (u64, u64),
    /// GPU-scope rule evaluations that ran their script, and those answered from the previous
    /// result (inputs unchanged).
    pub evaluations: (u64, u64),
    /// Silences in force.
    pub silences_active: usize,
    /// Seconds spent evaluating rules since the start.
    pub eval_seconds: f64,
    /// Notifications waiting in the outbox, and per channel (sent, failed) since the start.
    pub delivery: Option<(usize, ChannelCounts)>,
    /// Per NVML function: (failed calls, timed-out calls) since the start.
    pub nvml_failures: Vec<(crate::model::NvmlFunction, u64, u64)>,
    /// The jobs watched (`gpuwatch run`).
    pub jobs: Vec<JobRow>,
    /// No snapshot came for several intervals (the sampling loop is stuck): the per-GPU and
    /// process families are left out — absent, never the last values shown as current — and
    /// `/-/ready` answers 503; `gpuwatch_last_sample_timestamp_seconds` says since when.
    pub stale: bool,
}

/// A watched job's progress as `/metrics` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRow {
    pub name: String,
    pub pid: u32,
    /// The last step the job reported, if any.
    pub step: Option<f64>,
    /// Seconds since its last progress report (or its start).
    pub progress_age_s: f64,
}

impl ExportState {
    /// Takes a new snapshot: the last XID per GPU is kept, and the last process list when this
    /// snapshot has none (processes are read on a slower cadence than the tick). Also refreshes
    /// the NVML call failure counts.
    pub fn take_snapshot(&mut self, snap: &Snapshot) {
        for x in &snap.xids {
            self.last_xid.insert(x.gpu_index, x.xid);
        }
        let processes = match (&snap.processes, self.snapshot.take()) {
            (Some(p), _) => Some(p.clone()),
            (None, Some(old)) => old.processes,
            (None, None) => None,
        };
        let mut copy = snap.clone();
        copy.processes = processes;
        self.snapshot = Some(copy);
        self.nvml_failures = crate::sampler::call_failures().counts();
    }
}

/// The alerts pending or firing in `engine` now, as `gpuwatch_alerts` rows.
pub fn alert_rows(engine: &crate::engine::Engine) -> Vec<AlertRow> {
    engine
        .alerts()
        .map(|a| AlertRow {
            alertname: a.alertname().to_string(),
            severity: a.severity.as_str().to_string(),
            gpu: a.gpu,
            state: a.phase.as_str(),
        })
        .collect()
}

/// Per channel: (sends that succeeded, sends that failed).
pub type ChannelCounts = std::collections::BTreeMap<String, (u64, u64)>;

/// `[exporter]` in the config file.
#[derive(Debug, Clone, Default, serde::Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ExporterSection {
    /// `host:port` to serve `/metrics` on; off when unset. Loopback unless you say otherwise
    /// (`"0.0.0.0:9400"` for a Prometheus on another machine).
    pub listen: Option<String>,
}

impl ExporterSection {
    /// The listen address, checked.
    pub fn addr(&self) -> Option<Result<std::net::SocketAddr, String>> {
        self.listen.as_ref().map(|l| {
            l.parse()
                .map_err(|_| format!("`{l}` is not an address:port (try \"127.0.0.1:9400\")"))
        })
    }

    /// Checks the values serde cannot.
    pub fn validate(&self) -> Vec<crate::values::Problem> {
        match self.addr() {
            Some(Err(e)) => vec![crate::values::Problem::at("exporter.listen", e)],
            _ => Vec::new(),
        }
    }
}

/// The content type for a scrape that accepts `accept`.
pub fn content_type(openmetrics: bool) -> &'static str {
    if openmetrics {
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    } else {
        "text/plain; version=0.0.4; charset=utf-8"
    }
}

/// Whether an `Accept` header asks for OpenMetrics.
pub fn wants_openmetrics(accept: &str) -> bool {
    accept.contains("application/openmetrics-text")
}

/// A label value, escaped (`\`, `"`, newline).
fn label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A sample value: integers without a fraction, the rest in Rust's shortest form.
fn value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {}", help.replace('\n', " "));
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// How a value reaches dcgm-exporter's unit: multiplied by the first number, divided by the
/// second (a percentage divided by 100 gives 0.57, where multiplying by 0.01 gives
/// 0.5700000000000001).
#[derive(Debug, Clone, Copy)]
struct Scale(f64, f64);

impl Scale {
    fn of(self, v: f64) -> f64 {
        v * self.0 / self.1
    }
}

/// The metric table's rows that have a dcgm-exporter name: (row, name, conversion to its unit,
/// unit).
fn dcgm_rows() -> impl Iterator<Item = (&'static MetricDesc, &'static str, Scale, &'static str)> {
    METRICS.iter().filter_map(|d| {
        let name = d.dcgm?;
        // the metric table's conversion (the scrape importer inverts the same one)
        let (unit, mul, div) = d.dcgm_unit()?;
        Some((d, name, Scale(mul, div), unit))
    })
}

/// A family's type: OpenMetrics counters are typed `unknown` so the dcgm-exporter names (no
/// `_total`) stay as they are.
fn kind(d: &MetricDesc, openmetrics: bool) -> &'static str {
    match (d.kind, openmetrics) {
        (MetricKind::Counter, false) => "counter",
        (MetricKind::Counter, true) => "unknown",
        _ => "gauge",
    }
}

/// dcgm-exporter's labels of a GPU (`gpu`, `UUID`, `device`, `modelName`, `pci_bus_id`,
/// `Hostname`, `hostname`, `hpc_job` while Slurm jobs have processes on it, `pod`, `namespace`
/// and `container` while Kubernetes allocates it to a pod); `host` already
/// escaped.
fn dcgm_labels(
    g: &GpuSample,
    host: &str,
    jobs: Option<&str>,
    pods: Option<&[String; 3]>,
) -> String {
    let mut l = format!(
        "gpu=\"{}\",UUID=\"{}\",device=\"nvidia{}\",modelName=\"{}\",pci_bus_id=\"{}\",Hostname=\"{host}\",hostname=\"{host}\"",
        g.id.index,
        label(&g.id.uuid),
        g.id.minor.unwrap_or(g.id.index),
        label(&g.id.name),
        label(&g.id.pci_bus_id),
    );
    if let Some(j) = jobs {
        l.push_str(&format!(",hpc_job=\"{}\"", label(j)));
    }
    if let Some([pod, namespace, container]) = pods {
        l.push_str(&format!(
            ",pod=\"{}\",namespace=\"{}\",container=\"{}\"",
            label(pod),
            label(namespace),
            label(container)
        ));
    }
    l
}

/// dcgm-exporter's labels of a MIG device: its GPU's, with `GPU_I_PROFILE` and `GPU_I_ID`
/// after `modelName` (as dcgm-exporter puts them).
fn mig_labels(g: &GpuSample, m: &MigSample, host: &str) -> String {
    format!(
        "gpu=\"{}\",UUID=\"{}\",device=\"nvidia{}\",modelName=\"{}\",GPU_I_PROFILE=\"{}\",GPU_I_ID=\"{}\",pci_bus_id=\"{}\",Hostname=\"{host}\",hostname=\"{host}\"",
        g.id.index,
        label(&g.id.uuid),
        g.id.minor.unwrap_or(g.id.index),
        label(&g.id.name),
        label(m.profile.as_deref().unwrap_or("")),
        m.gpu_instance_id,
        label(&g.id.pci_bus_id),
    )
}

/// A GPU instance's value of a metric dcgm-exporter reports per GPU instance: its framebuffer
/// (used, free, total) and its profiling metrics (`DCGM_FI_PROF_*`, from GPM: the rows a GPU
/// instance has, `Metric::per_gpu_instance`; utilization and the rest are per GPU, or absent on
/// MIG GPUs), as its MIG device `m` carries them.
fn mig_value(m: &MigSample, metric: Metric) -> Option<f64> {
    #[expect(
        clippy::cast_precision_loss,
        reason = "bytes fit f64 exactly below 2^53"
    )]
    let f = |b: u64| b as f64;
    match metric {
        Metric::MemUsed => m.mem_used_bytes.map(f),
        Metric::MemTotal => m.mem_total_bytes.map(f),
        Metric::MemFree => Some(f(m.mem_total_bytes?.saturating_sub(m.mem_used_bytes?))),
        _ if metric.per_gpu_instance() => m.gpm.get(metric),
        _ => None,
    }
}

/// The GPU instances among MIG devices `mig` (each with its GPU's position in the snapshot):
/// the first MIG device of each (GPU, GPU instance). dcgm-exporter's labels name the GPU
/// instance only (`GPU_I_PROFILE`, `GPU_I_ID`), and the compute instances of one GPU instance
/// share its memory and its GPM, so each series is written once per GPU instance, with what
/// its first compute instance reports — never twice with the same labels.
fn gpu_instances<'a>(mig: &[(usize, &'a MigSample)]) -> Vec<(usize, &'a MigSample)> {
    let mut seen = std::collections::HashSet::with_capacity(mig.len());
    mig.iter()
        .filter(|(_, m)| seen.insert((m.gpu_index, m.gpu_instance_id)))
        .copied()
        .collect()
}

/// The values of metric `d` of GPU instances `gis` ([`gpu_instances`]), as the page and the
/// backfill carry them.
fn mig_values<'a>(
    gis: &[(usize, &'a MigSample)],
    d: &MetricDesc,
) -> Vec<(usize, &'a MigSample, f64)> {
    gis.iter()
        .filter_map(|(i, m)| mig_value(m, d.id).map(|v| (*i, *m, v)))
        .collect()
}

/// The OpenMetrics headers of the backfill families, in the order [`backfill`] numbers them.
pub fn backfill_headers() -> Vec<String> {
    dcgm_rows()
        .map(|(d, name, _, unit)| {
            let mut h = String::new();
            family(
                &mut h,
                name,
                kind(d, true),
                &format!("{} ({unit}).", d.help),
            );
            h
        })
        .collect()
}

/// Which series of a family a backfill sample belongs to: its GPU's index and, for a GPU
/// instance's sample, its GPU instance id (the labels name no compute instance: see
/// [`gpu_instances`]). Ordered GPU first, then its GPU instances.
pub type BackfillSeries = (u32, Option<u32>);

/// A recorded snapshot as timestamped OpenMetrics samples (for `promtool tsdb
/// create-blocks-from openmetrics`): `emit(family position, series, line)`, the GPUs' samples
/// and, as on the live page, their GPU instances' (with `GPU_I_PROFILE` and `GPU_I_ID`, once per
/// GPU instance). Samples of one family and series come in time order when snapshots do: a
/// series has one sample per snapshot.
pub fn backfill(
    snap: &Snapshot,
    hostname: &str,
    mut emit: impl FnMut(usize, BackfillSeries, &str),
) {
    let host = label(hostname);
    let ts = snap.time_ms as f64 / 1000.0;
    let mut line = String::with_capacity(256);
    for (i, g) in snap.gpus.iter().enumerate() {
        // (no hpc_job: a series is one label set for the whole log)
        let ids = dcgm_labels(g, &host, None, None);
        // its GPU instances, when it answers (as `render` takes them)
        let gis: Vec<(usize, &MigSample)> = if g.state == crate::model::DeviceState::Ok {
            let mig: Vec<(usize, &MigSample)> = snap.mig_of(g.id.index).map(|m| (i, m)).collect();
            gpu_instances(&mig)
        } else {
            Vec::new()
        };
        for (f, (d, name, scale, _)) in dcgm_rows().enumerate() {
            if let Some(v) = g.get(d.id) {
                line.clear();
                let _ = write!(line, "{name}{{{ids}}} {} {ts:.3}", value(scale.of(v)));
                emit(f, (g.id.index, None), &line);
            }
            for (_, m, v) in mig_values(&gis, d) {
                line.clear();
                let labels = mig_labels(g, m, &host);
                let _ = write!(line, "{name}{{{labels}}} {} {ts:.3}", value(scale.of(v)));
                emit(f, (g.id.index, Some(m.gpu_instance_id)), &line);
            }
        }
    }
}

/// One of gpuwatch's own counter families with a `result` label: `NAME_total` samples under
/// family `NAME` (OpenMetrics) or `NAME_total` (text 0.0.4).
fn counter(
    out: &mut String,
    openmetrics: bool,
    name: &str,
    help: &str,
    (key, results): (&str, &[(&str, u64)]),
    host: &str,
) {
    let fam = if openmetrics {
        name.to_string()
    } else {
        format!("{name}_total")
    };
    family(out, &fam, "counter", help);
    for (result, n) in results {
        let _ = writeln!(
            out,
            "{name}_total{{{key}=\"{result}\",hostname=\"{host}\"}} {n}"
        );
    }
}

/// The page for `state` (OpenMetrics when `openmetrics`: counters typed `unknown` so that the
/// dcgm-exporter names stay as they are, and the closing `# EOF`).
pub fn render(state: &ExportState, openmetrics: bool) -> String {
    let mut out = String::with_capacity(16 * 1024);
    let host = label(&state.hostname);
    if let Some(snap) = state.snapshot.as_ref().filter(|_| !state.stale) {
        let procs = snap.processes.as_deref().unwrap_or_default();
        let ids: Vec<String> = snap
            .gpus
            .iter()
            .map(|g| {
                let on_gpu = procs.iter().filter(|p| p.gpu_index == g.id.index);
                let pods = crate::model::pod_labels(&snap.pods, g.id.index);
                dcgm_labels(
                    g,
                    &host,
                    crate::model::hpc_jobs(on_gpu).as_deref(),
                    pods.as_ref(),
                )
            })
            .collect();
        // gpuwatch's own families use snake_case labels (promtool's style); the DCGM ones keep
        // dcgm-exporter's (`UUID`, `modelName`, `Hostname`) for its dashboards.
        let own: Vec<String> = snap
            .gpus
            .iter()
            .map(|g| {
                format!(
                    "gpu=\"{}\",uuid=\"{}\",pci_bus_id=\"{}\",hostname=\"{host}\"",
                    g.id.index,
                    label(&g.id.uuid),
                    label(&g.id.pci_bus_id),
                )
            })
            .collect();
        // A GPU's MIG devices (those of a GPU in this snapshot that answers).
        let mig: Vec<(usize, &MigSample)> = snap
            .mig
            .iter()
            .filter_map(|m| {
                let i = snap.gpus.iter().position(|g| {
                    g.id.index == m.gpu_index && g.state == crate::model::DeviceState::Ok
                })?;
                Some((i, m))
            })
            .collect();
        let gis = gpu_instances(&mig);
        for (d, name, scale, unit) in dcgm_rows() {
            let present: Vec<(usize, f64)> = snap
                .gpus
                .iter()
                .enumerate()
                .filter_map(|(i, g)| g.get(d.id).map(|v| (i, v)))
                .collect();
            let per_mig = mig_values(&gis, d);
            if present.is_empty() && per_mig.is_empty() {
                continue;
            }
            family(
                &mut out,
                name,
                kind(d, openmetrics),
                &format!("{} ({unit}).", d.help),
            );
            for (i, v) in present {
                let _ = writeln!(out, "{name}{{{}}} {}", ids[i], value(scale.of(v)));
            }
            for (i, m, v) in per_mig {
                let labels = mig_labels(&snap.gpus[i], m, &host);
                let _ = writeln!(out, "{name}{{{labels}}} {}", value(scale.of(v)));
            }
        }
        if !state.last_xid.is_empty() {
            family(
                &mut out,
                "DCGM_FI_DEV_XID_ERRORS",
                "gauge",
                "Value of the last XID error seen on the GPU.",
            );
            for (i, g) in snap.gpus.iter().enumerate() {
                if let Some(x) = state.last_xid.get(&g.id.index) {
                    let _ = writeln!(out, "DCGM_FI_DEV_XID_ERRORS{{{}}} {x}", ids[i]);
                }
            }
        }
        family(
            &mut out,
            "gpuwatch_gpu_lost",
            "gauge",
            "1 when the GPU is lost or stalled (no values), else 0.",
        );
        for (i, g) in snap.gpus.iter().enumerate() {
            let lost = u8::from(g.state != crate::model::DeviceState::Ok);
            let _ = writeln!(out, "gpuwatch_gpu_lost{{{}}} {lost}", own[i]);
        }
        if !mig.is_empty() {
            family(
                &mut out,
                "gpuwatch_mig_device_info",
                "gauge",
                "A MIG device of a GPU with MIG on (1), with its profile, GPU and compute instance ids and UUID.",
            );
            for (i, m) in &mig {
                let _ = writeln!(
                    out,
                    "gpuwatch_mig_device_info{{{},mig_uuid=\"{}\",gpu_i_profile=\"{}\",gpu_i_id=\"{}\",gpu_ci_id=\"{}\"}} 1",
                    own[*i],
                    label(&m.uuid),
                    label(m.profile.as_deref().unwrap_or("")),
                    m.gpu_instance_id,
                    m.compute_instance_id,
                );
            }
            family(
                &mut out,
                "gpuwatch_mig_device_processes",
                "gauge",
                "Processes running on a MIG device.",
            );
            for (i, m) in &mig {
                let _ = writeln!(
                    out,
                    "gpuwatch_mig_device_processes{{{},gpu_i_id=\"{}\",gpu_ci_id=\"{}\"}} {}",
                    own[*i],
                    m.gpu_instance_id,
                    m.compute_instance_id,
                    m.pids.len(),
                );
            }
        }
        if let Some(procs) = snap.processes.as_ref().filter(|p| !p.is_empty()) {
            family(
                &mut out,
                "gpuwatch_gpu_process_memory_bytes",
                "gauge",
                "GPU memory used by a process.",
            );
            for p in procs {
                let Some(bytes) = p.used_mem_bytes else {
                    continue;
                };
                // on a MIG device: which (`gpu_i_id`, as dcgm-exporter's GPU_I_ID)
                let on_mig = snap
                    .mig_of_process(p.gpu_index, p.pid)
                    .map_or_else(String::new, |m| {
                        format!(",gpu_i_id=\"{}\"", m.gpu_instance_id)
                    });
                let _ = writeln!(
                    out,
                    "gpuwatch_gpu_process_memory_bytes{{gpu=\"{}\",pid=\"{}\",user=\"{}\",command=\"{}\"{on_mig},hostname=\"{host}\"}} {bytes}",
                    p.gpu_index,
                    p.pid,
                    label(p.user.as_deref().unwrap_or("")),
                    label(&crate::values::truncate_chars(p.command.as_deref().unwrap_or(""), 200)),
                );
            }
        }
    }
    if let Some(snap) = &state.snapshot {
        family(
            &mut out,
            "gpuwatch_last_sample_timestamp_seconds",
            "gauge",
            "Time of the newest sample (UTC, seconds since the epoch).",
        );
        let _ = writeln!(
            out,
            "gpuwatch_last_sample_timestamp_seconds{{hostname=\"{host}\"}} {}",
            value(snap.time_ms as f64 / 1000.0)
        );
    }
    family(
        &mut out,
        "gpuwatch_alerts",
        "gauge",
        "Alerts pending or firing now (1 per instance), like Prometheus's ALERTS.",
    );
    for a in &state.alerts {
        let _ = writeln!(
            out,
            "gpuwatch_alerts{{alertname=\"{}\",severity=\"{}\",gpu=\"{}\",state=\"{}\",hostname=\"{host}\"}} 1",
            label(&a.alertname),
            label(&a.severity),
            a.gpu.map_or_else(String::new, |g| g.to_string()),
            a.state
        );
    }
    if let Some(sec) = state.sample_seconds {
        family(
            &mut out,
            "gpuwatch_sample_duration_seconds",
            "gauge",
            "Wall time of the newest sample of all GPUs.",
        );
        let _ = writeln!(
            out,
            "gpuwatch_sample_duration_seconds{{hostname=\"{host}\"}} {}",
            value(sec)
        );
    }
    counter(
        &mut out,
        openmetrics,
        "gpuwatch_ticks",
        "Sampling ticks since the start, taken or skipped because the previous one ran late.",
        (
            "result",
            &[("taken", state.ticks.0), ("skipped", state.ticks.1)],
        ),
        &host,
    );
    counter(
        &mut out,
        openmetrics,
        "gpuwatch_rule_evaluations",
        "GPU-scope rule evaluations since the start: ran their script, or reused the previous result (inputs unchanged).",
        ("result", &[("ran", state.evaluations.0), ("reused", state.evaluations.1)]),
        &host,
    );
    let eval = if openmetrics {
        "gpuwatch_rule_evaluation_seconds"
    } else {
        "gpuwatch_rule_evaluation_seconds_total"
    };
    family(
        &mut out,
        eval,
        "counter",
        "Wall time spent evaluating rules since the start.",
    );
    let _ = writeln!(
        out,
        "gpuwatch_rule_evaluation_seconds_total{{hostname=\"{host}\"}} {}",
        value(state.eval_seconds)
    );
    if let Some((queued, channels)) = &state.delivery {
        family(
            &mut out,
            "gpuwatch_notifications_queued",
            "gauge",
            "Notifications waiting in the outbox to be sent or retried.",
        );
        let _ = writeln!(
            out,
            "gpuwatch_notifications_queued{{hostname=\"{host}\"}} {queued}"
        );
        if !channels.is_empty() {
            let fam = if openmetrics {
                "gpuwatch_notifications"
            } else {
                "gpuwatch_notifications_total"
            };
            family(
                &mut out,
                fam,
                "counter",
                "Notification sends since the start, by channel and result.",
            );
            for (channel, (sent, failed)) in channels {
                for (result, n) in [("sent", sent), ("failed", failed)] {
                    let _ = writeln!(
                        out,
                        "gpuwatch_notifications_total{{channel=\"{}\",result=\"{result}\",hostname=\"{host}\"}} {n}",
                        label(channel)
                    );
                }
            }
        }
    }
    if !state.nvml_failures.is_empty() {
        let errors: Vec<(&str, u64)> = state
            .nvml_failures
            .iter()
            .map(|(f, e, _)| (f.symbol(), *e))
            .collect();
        let timeouts: Vec<(&str, u64)> = state
            .nvml_failures
            .iter()
            .map(|(f, _, t)| (f.symbol(), *t))
            .collect();
        counter(
            &mut out,
            openmetrics,
            "gpuwatch_nvml_call_errors",
            "NVML calls that returned an error (not counting answers of not supported) since the start, by function.",
            ("function", &errors),
            &host,
        );
        counter(
            &mut out,
            openmetrics,
            "gpuwatch_nvml_call_timeouts",
            "NVML calls that had not returned within the call timeout (GPU reported stalled) since the start, by function.",
            ("function", &timeouts),
            &host,
        );
    }
    if !state.jobs.is_empty() {
        family(
            &mut out,
            "gpuwatch_job_step",
            "gauge",
            "The watched job's last reported step (gpuwatch run).",
        );
        for j in &state.jobs {
            if let Some(step) = j.step {
                let _ = writeln!(
                    out,
                    "gpuwatch_job_step{{job=\"{}\",pid=\"{}\",hostname=\"{host}\"}} {}",
                    label(&j.name),
                    j.pid,
                    value(step)
                );
            }
        }
        family(
            &mut out,
            "gpuwatch_job_progress_age_seconds",
            "gauge",
            "Seconds since the watched job last reported progress (since it started, before any).",
        );
        for j in &state.jobs {
            let _ = writeln!(
                out,
                "gpuwatch_job_progress_age_seconds{{job=\"{}\",pid=\"{}\",hostname=\"{host}\"}} {}",
                label(&j.name),
                j.pid,
                value(j.progress_age_s)
            );
        }
    }
    family(
        &mut out,
        "gpuwatch_silences_active",
        "gauge",
        "Silences in force (gpuwatch silence).",
    );
    let _ = writeln!(
        out,
        "gpuwatch_silences_active{{hostname=\"{host}\"}} {}",
        state.silences_active
    );
    family(
        &mut out,
        "gpuwatch_build_info",
        "gauge",
        "gpuwatch's version (value 1).",
    );
    let _ = writeln!(
        out,
        "gpuwatch_build_info{{version=\"{}\",hostname=\"{host}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    if openmetrics {
        out.push_str("# EOF\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DeviceId, DeviceState, GpuSample, Metric, MetricValues};

    #[test]
    fn dcgm_names_units_and_labels() {
        let mut values = MetricValues::default();
        values.set(Metric::Util, Some(87.0));
        values.set(Metric::MemUsed, Some(2.0 * 1_073_741_824.0));
        values.set(Metric::Energy, Some(12.5));
        values.set(Metric::SmActive, Some(12.5));
        values.set(Metric::NvlinkTxBytes, Some(3e9));
        let state = ExportState {
            hostname: "node\"1".into(),
            snapshot: Some(Snapshot {
                time_ms: 1_700_000_000_000,
                gpus: vec![GpuSample {
                    time_ms: 1_700_000_000_000,
                    id: DeviceId {
                        index: 0,
                        minor: Some(3),
                        uuid: "GPU-1".into(),
                        pci_bus_id: "00000000:07:00.0".into(),
                        name: "NVIDIA H100".into(),
                    },
                    state: DeviceState::Ok,
                    values,
                }],
                ..Snapshot::default()
            }),
            alerts: vec![AlertRow {
                alertname: "gpu_lost".into(),
                severity: "critical".into(),
                gpu: Some(0),
                state: "firing",
            }],
            ..ExportState::default()
        };
        let text = render(&state, false);
        assert!(text.contains("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-1\",device=\"nvidia3\",modelName=\"NVIDIA H100\",pci_bus_id=\"00000000:07:00.0\",Hostname=\"node\\\"1\",hostname=\"node\\\"1\"} 87\n"), "{text}");
        assert!(
            text.contains("DCGM_FI_DEV_FB_USED{") && text.contains("} 2048\n"),
            "{text}"
        );
        assert!(text.contains("} 12500\n"), "energy in mJ: {text}");
        // GPM activities are DCGM's ratios 0–1, bandwidths bytes per second; absent GPM rows
        // (tensor active here) have no family
        assert!(
            text.contains("# HELP DCGM_FI_PROF_SM_ACTIVE ")
                && text.contains("DCGM_FI_PROF_SM_ACTIVE{gpu=\"0\",")
                && text.contains("} 0.125\n"),
            "{text}"
        );
        assert!(
            text.contains("DCGM_FI_PROF_NVLINK_TX_BYTES{gpu=\"0\",")
                && text.contains("} 3000000000\n"),
            "{text}"
        );
        assert!(!text.contains("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"), "{text}");
        assert!(text.contains("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter"));
        assert!(text.contains("gpuwatch_alerts{alertname=\"gpu_lost\",severity=\"critical\",gpu=\"0\",state=\"firing\""));
        assert!(!text.contains("# EOF"));
        let om = render(&state, true);
        assert!(om.ends_with("# EOF\n"));
        assert!(om.contains("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION unknown"));
        // Not ready: only gpuwatch's own families.
        let empty = render(&ExportState::default(), false);
        assert!(!empty.contains("DCGM_"), "{empty}");
        // Stale (no snapshot for several intervals): no GPU values, the last sample's time and
        // the alerts stay.
        let stale = render(
            &ExportState {
                stale: true,
                ..state
            },
            false,
        );
        assert!(!stale.contains("DCGM_FI_DEV_GPU_UTIL"), "{stale}");
        assert!(!stale.contains("gpuwatch_gpu_lost{"), "{stale}");
        assert!(
            stale.contains("gpuwatch_last_sample_timestamp_seconds{"),
            "{stale}"
        );
        assert!(
            stale.contains("gpuwatch_alerts{alertname=\"gpu_lost\""),
            "{stale}"
        );
    }

    /// A GPU instance's GPM metrics are DCGM's profiling series with its GPU's labels and
    /// `GPU_I_PROFILE` / `GPU_I_ID`, once per GPU instance; a GPU instance without them (an
    /// A100's) has none (absent, never 0), and neither has a GPU that gave none itself.
    #[test]
    fn gpu_instances_carry_their_profiling_series() {
        let gpu = |index: u32, name: &str| GpuSample {
            time_ms: 0,
            id: DeviceId {
                index,
                uuid: format!("GPU-{index}"),
                name: name.into(),
                ..DeviceId::default()
            },
            state: DeviceState::Ok,
            values: MetricValues::default(),
        };
        let mut busy = crate::model::MigGpm::default();
        busy.set(Metric::SmActive, Some(81.0));
        busy.set(Metric::DramActive, Some(30.0));
        let h100 = |k: u32, gi: u32, profile: &str, gpm: &crate::model::MigGpm| MigSample {
            gpu_instance_id: gi,
            profile: Some(profile.into()),
            gpm: gpm.clone(),
            ..MigSample::one_g(1, k)
        };
        let snap = Snapshot {
            gpus: vec![
                gpu(0, "NVIDIA A100-SXM4-80GB"),
                gpu(1, "NVIDIA H100 80GB HBM3"),
            ],
            mig: vec![
                MigSample::one_g(0, 0),
                h100(0, 1, "3g.40gb", &busy),
                // a second compute instance of the same GPU instance: no second series
                MigSample {
                    compute_instance_id: 1,
                    ..h100(1, 1, "3g.40gb", &busy)
                },
                h100(2, 13, "1g.10gb", &crate::model::MigGpm::default()),
            ],
            ..Snapshot::default()
        };
        let text = render(
            &ExportState {
                hostname: "h".into(),
                snapshot: Some(snap),
                ..ExportState::default()
            },
            false,
        );
        let sm: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("DCGM_FI_PROF_SM_ACTIVE{"))
            .collect();
        assert_eq!(
            sm,
            ["DCGM_FI_PROF_SM_ACTIVE{gpu=\"1\",UUID=\"GPU-1\",device=\"nvidia1\",modelName=\"NVIDIA H100 80GB HBM3\",GPU_I_PROFILE=\"3g.40gb\",GPU_I_ID=\"1\",pci_bus_id=\"\",Hostname=\"h\",hostname=\"h\"} 0.81"],
            "{text}"
        );
        assert_eq!(text.matches("# HELP DCGM_FI_PROF_SM_ACTIVE ").count(), 1);
        assert!(
            text.contains("GPU_I_ID=\"1\",pci_bus_id=\"\",Hostname=\"h\",hostname=\"h\"} 0.3\n")
        );
        assert!(!text.contains("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"), "{text}");
    }

    /// `export --openmetrics` carries a GPU instance's series as the live page does: the same
    /// lines, with the snapshot's time; each series under its own key. A GPU instance with two
    /// compute instances is one series per family (its first compute instance's memory): the
    /// labels name the GPU instance only, and two samples of one series at one time would be a
    /// duplicate on the page and out of order in the backfill.
    #[test]
    fn a_backfill_carries_the_mig_series_of_the_live_page() {
        let mut values = MetricValues::default();
        values.set(Metric::MemUsed, Some(8.0 * 1_073_741_824.0));
        let gpu = GpuSample {
            time_ms: 1_700_000_000_000,
            id: DeviceId {
                index: 1,
                uuid: "GPU-1".into(),
                name: "NVIDIA H100 80GB HBM3".into(),
                ..DeviceId::default()
            },
            state: DeviceState::Ok,
            values,
        };
        let mut gpm = crate::model::MigGpm::default();
        gpm.set(Metric::SmActive, Some(81.0));
        let slice = |k: u32, gi: u32, ci: u32| MigSample {
            gpu_instance_id: gi,
            compute_instance_id: ci,
            profile: Some("3g.40gb".into()),
            mem_used_bytes: Some(u64::from(k + 1) << 30),
            mem_total_bytes: Some(40_192 << 20),
            gpm: gpm.clone(),
            ..MigSample::one_g(1, k)
        };
        let snap = Snapshot {
            time_ms: 1_700_000_000_000,
            gpus: vec![gpu],
            mig: vec![slice(0, 1, 0), slice(1, 1, 1), slice(2, 2, 0)],
            ..Snapshot::default()
        };
        let page = render(
            &ExportState {
                hostname: "h".into(),
                snapshot: Some(snap.clone()),
                ..ExportState::default()
            },
            true,
        );
        // every series once on the page (its labelset: the line without its value)
        let mut series = std::collections::HashSet::new();
        for l in page.lines().filter(|l| !l.starts_with('#')) {
            let (s, _) = l.rsplit_once(' ').expect("a sample");
            assert!(series.insert(s), "{s} twice:\n{page}");
        }
        let used: Vec<&str> = page
            .lines()
            .filter(|l| l.starts_with("DCGM_FI_DEV_FB_USED{") && l.contains("GPU_I_ID="))
            .collect();
        assert_eq!(used.len(), 2, "one per GPU instance: {used:?}");
        assert!(
            used[0].contains("GPU_I_ID=\"1\"") && used[0].ends_with("} 1024"),
            "its first compute instance's: {used:?}"
        );
        assert!(
            used[1].contains("GPU_I_ID=\"2\"") && used[1].ends_with("} 3072"),
            "{used:?}"
        );
        // its processes and identity stay per MIG device (gpuwatch's own, with gpu_ci_id)
        assert_eq!(page.matches("gpuwatch_mig_device_info{").count(), 3);
        let live: Vec<String> = page
            .lines()
            .filter(|l| l.starts_with("DCGM_") && l.contains("GPU_I_ID="))
            .map(|l| format!("{l} 1700000000.000"))
            .collect();
        let mut lines = Vec::new();
        let mut keys = Vec::new();
        backfill(&snap, "h", |f, series, line| {
            if line.contains("GPU_I_ID=") {
                lines.push((f, line.to_string()));
                keys.push((f, series));
            }
        });
        // the page puts each family's MIG lines together, in family order as the backfill
        lines.sort_by_key(|(f, _)| *f);
        let backfilled: Vec<String> = lines.into_iter().map(|(_, l)| l).collect();
        assert!(live.len() >= 6, "{page}");
        assert_eq!(backfilled, live);
        // one sample per family and series in a snapshot: each spool stays in time order
        let distinct: std::collections::BTreeSet<_> = keys.iter().copied().collect();
        assert_eq!(distinct.len(), keys.len(), "{keys:?}");
        let gis: std::collections::BTreeSet<_> = keys.iter().map(|(_, k)| *k).collect();
        assert_eq!(
            gis.into_iter().collect::<Vec<_>>(),
            [(1, Some(1)), (1, Some(2))]
        );
    }
}
