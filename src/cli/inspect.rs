//! `gpuwatch status` (one-shot table of every GPU and its processes, like gpustat plus throttle
//! reasons and ECC) and `gpuwatch devices` (identities and the `CUDA_VISIBLE_DEVICES` /
//! `NVIDIA_VISIBLE_DEVICES` mapping, with the container renumbering trap explained).

use std::fmt::Write as _;
use std::io::Write;

use serde_json::{json, Map, Value};

use super::GlobalArgs;
use crate::model::visible::{cuda_visible_mig, nvidia_visible, CudaVisible, NvidiaVisible};
use crate::model::{
    clock_event_names, DeviceId, DeviceState, GpuSample, Metric, MigSample, MissingGpu, ProcSample,
    METRICS,
};
use crate::sampler::expected::ExpectedOptions;
use crate::sampler::{GpmStatus, Sampler};

/// Arguments of `status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Print machine-readable JSON (stable keys) instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `devices`.
#[derive(Debug, clap::Args)]
pub struct DevicesArgs {
    /// Print machine-readable JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

use crate::sys::hostname;

/// A number as JSON: integers without a fraction, `null` when absent.
fn num(v: Option<f64>) -> Value {
    match v {
        Some(x) if x.is_finite() && x.fract() == 0.0 && x.abs() < 9.0e15 => json!(x as i64),
        Some(x) if x.is_finite() => json!(x),
        _ => Value::Null,
    }
}

fn proc_json(p: &ProcSample, mig: &[&MigSample]) -> Value {
    json!({
        "pid": p.pid,
        "mig_uuid": mig.iter().find(|m| m.pids.contains(&p.pid)).map(|m| &m.uuid),
        "kind": p.kind,
        "user": p.user,
        "uid": p.uid,
        "command": p.command,
        "used_memory_bytes": p.used_mem_bytes,
        "container": p.container,
        "runtime_s": p.runtime_s.map(|r| (r * 10.0).round() / 10.0),
    })
}

/// Where GPM stands on a GPU: `{"state": "active" | "unsupported" | "failing" | "off" |
/// "unknown", "detail": why it is unsupported or the failing call's error}` (`detail` only
/// with those two).
fn gpm_json(gpm: &GpmStatus) -> Value {
    let mut o = Map::new();
    o.insert("state".into(), json!(gpm.state()));
    if let Some(d) = gpm.detail() {
        o.insert("detail".into(), json!(d));
    }
    Value::Object(o)
}

/// One MIG device in `status --json`.
fn mig_json(m: &MigSample) -> Value {
    json!({
        "index": m.index,
        "uuid": m.uuid,
        "gpu_instance_id": m.gpu_instance_id,
        "compute_instance_id": m.compute_instance_id,
        "profile": m.profile,
        "placement": m.placement,
        "memory_used_bytes": m.mem_used_bytes,
        "memory_total_bytes": m.mem_total_bytes,
        "processes": m.pids,
        // its GPU instance's GPM metrics by table key, `null` when absent (see docs/mig.md)
        "metrics": METRICS
            .iter()
            .filter(|d| d.source.is_gpm())
            .map(|d| (d.key.to_string(), num(m.gpm.get(d.id))))
            .collect::<Map<String, Value>>(),
    })
}

/// One GPU in `status --json`: identity and state, then every metric of the table under
/// `metrics` by its table key (`null` when absent), the names of the active clock event reasons
/// (decoded from the `clock_event_reasons` metric), where GPM stands (`gpm`: why the GPM
/// metrics are absent), XIDs, processes (`mig_uuid`: the MIG device each runs on) and, with MIG
/// on, its MIG devices (`mig`; empty otherwise; each with its GPU instance's GPM values under
/// `metrics`, by the same table keys). The GPU's metric values appear nowhere else, under no
/// other name.
fn gpu_json(
    g: &GpuSample,
    gpm: &GpmStatus,
    procs: &[&ProcSample],
    xids: &[u64],
    mig: &[&MigSample],
) -> Value {
    let mut metrics = Map::new();
    for d in METRICS {
        metrics.insert(d.key.to_string(), num(g.get(d.id)));
    }
    let reasons = g
        .get(Metric::ClockEventReasons)
        .map(|m| clock_event_names(m as u64));
    json!({
        "index": g.id.index,
        "minor": g.id.minor,
        "uuid": g.id.uuid,
        "pci_bus_id": g.id.pci_bus_id,
        "name": g.id.name,
        "state": g.state,
        "metrics": metrics,
        "clock_event_reason_names": reasons,
        "gpm": gpm_json(gpm),
        "xids": xids,
        "processes": procs.iter().map(|p| proc_json(p, mig)).collect::<Vec<_>>(),
        "mig": mig.iter().map(|m| mig_json(m)).collect::<Vec<_>>(),
    })
}

fn mib(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |b| format!("{:.0}", b / 1_048_576.0))
}

fn int(v: Option<f64>, unit: &str) -> String {
    v.map_or_else(|| "n/a".into(), |x| format!("{x:.0}{unit}"))
}

fn runtime(s: f64) -> String {
    let s = s as u64;
    if s >= 86_400 {
        format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600)
    } else if s >= 3600 {
        format!("{}h{:02}m", s / 3600, s % 3600 / 60)
    } else {
        format!("{}m{:02}s", s / 60, s % 60)
    }
}

/// `s` for a terminal: control characters escaped (a command line cannot move the cursor,
/// clear the screen or start a forged line), cut to `max` characters.
fn truncate(s: &str, max: usize) -> String {
    crate::values::truncate_chars(&crate::values::escape_control(s), max)
}

/// One process line of the status table, `indent` spaces in.
fn proc_line(p: &ProcSample, indent: usize) -> String {
    let mut line = format!(
        "{:indent$}└ pid {:<8} {:<10} {:>7} MiB",
        "",
        p.pid,
        truncate(p.user.as_deref().unwrap_or("?"), 10),
        p.used_mem_bytes
            .map_or_else(|| "?".into(), |b| format!("{}", b / 1_048_576)),
    );
    if let Some(r) = p.runtime_s {
        let _ = write!(line, "  {:>7}", runtime(r));
    }
    if let Some(c) = &p.container {
        let _ = write!(line, "  [ctr {}]", truncate(c, 12));
    }
    let _ = write!(
        line,
        "  {}",
        truncate(
            p.command.as_deref().unwrap_or("(not visible from here)"),
            100
        )
    );
    line
}

/// One MIG device line of the status table: profile, `GPU/GI/CI`, memory used / total,
/// placement (memory slices) when known, UUID.
fn mig_line(m: &MigSample) -> String {
    let mib = |b: Option<u64>| b.map_or_else(|| "n/a".into(), |b| format!("{}", b / 1_048_576));
    let mut line = format!(
        "       MIG {:<8} {:<8} {:>17} MiB",
        truncate(m.profile.as_deref().unwrap_or("?"), 8),
        m.address(),
        format!("{} / {}", mib(m.mem_used_bytes), mib(m.mem_total_bytes)),
    );
    if let Some(sm) = m.gpm.get(Metric::SmActive) {
        let _ = write!(line, "  SM {sm:>3.0} %");
    }
    if let Some(p) = m.placement {
        let _ = write!(line, "  slices {}+{}", p.start, p.size);
    }
    let _ = write!(line, "  {}", truncate(&m.uuid, 60));
    if m.pids.is_empty() {
        line.push_str("  (no process)");
    }
    line
}

/// Renders the status table: a line per GPU and its processes; with MIG on, a line per MIG
/// device and the processes on it.
fn status_table(
    host: &str,
    time: &str,
    driver: Option<&str>,
    gpus: &[GpuSample],
    procs: &[ProcSample],
    mig: &[MigSample],
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{host}  {time}  driver {}  {} GPU{}",
        driver.unwrap_or("n/a"),
        gpus.len(),
        if gpus.len() == 1 { "" } else { "s" }
    );
    let name_w = gpus
        .iter()
        .map(|g| g.id.name.len())
        .max()
        .unwrap_or(4)
        .clamp(4, 32);
    let _ = writeln!(
        out,
        "{:>3}  {:<name_w$}  {:>5}  {:>4}  {:>4}  {:>4}  {:>17}  {:>11}  {:<20}  {:>9}  STATE",
        "GPU",
        "NAME",
        "TEMP",
        "UTIL",
        "SM%",
        "MEM%",
        "MEMORY MiB",
        "POWER W",
        "THROTTLE",
        "ECC C/U"
    );
    for g in gpus {
        let throttle = match g.get(Metric::ClockEventReasons) {
            None => "n/a".to_string(),
            Some(m) => {
                let names = clock_event_names(m as u64);
                if names.is_empty() {
                    "-".into()
                } else {
                    names.join(",")
                }
            }
        };
        let mem = format!(
            "{} / {}",
            mib(g.get(Metric::MemUsed)),
            mib(g.get(Metric::MemTotal))
        );
        let power = format!(
            "{} / {}",
            int(g.get(Metric::Power), ""),
            int(g.get(Metric::PowerLimit), "")
        );
        let ecc = format!(
            "{} / {}",
            int(g.get(Metric::EccCorrected), ""),
            int(g.get(Metric::EccUncorrected), "")
        );
        let mut state = match g.state {
            DeviceState::Ok => "ok".to_string(),
            DeviceState::Lost => "LOST".to_string(),
            DeviceState::Stalled(f) => format!("STALLED in {}", f.symbol()),
        };
        if let Some(action) = g.get(Metric::RecoveryAction).and_then(recovery_action_name) {
            state.push_str(", NVIDIA recovery action: ");
            state.push_str(action);
        }
        let _ = writeln!(
            out,
            "{:>3}  {:<name_w$}  {:>5}  {:>4}  {:>4}  {:>4}  {:>17}  {:>11}  {:<20}  {:>9}  {state}",
            g.id.index,
            truncate(
                if g.id.name.is_empty() {
                    "?"
                } else {
                    &g.id.name
                },
                name_w
            ),
            int(g.get(Metric::Temp), "C"),
            int(g.get(Metric::Util), "%"),
            int(g.get(Metric::SmActive), "%"),
            int(g.get(Metric::MemUtil), "%"),
            mem,
            power,
            throttle,
            ecc,
        );
        let on_gpu: Vec<&ProcSample> = procs.iter().filter(|p| p.gpu_index == g.id.index).collect();
        let devices: Vec<&MigSample> = mig.iter().filter(|m| m.gpu_index == g.id.index).collect();
        for p in on_gpu
            .iter()
            .filter(|p| !devices.iter().any(|m| m.pids.contains(&p.pid)))
        {
            let _ = writeln!(out, "{}", proc_line(p, 7));
        }
        for m in devices {
            let _ = writeln!(out, "{}", mig_line(m));
            for p in on_gpu.iter().filter(|p| m.pids.contains(&p.pid)) {
                let _ = writeln!(out, "{}", proc_line(p, 11));
            }
        }
    }
    out
}

/// How long `status` waits for its second snapshot on GPUs with GPM: the span its GPM metrics
/// average over.
const STATUS_GPM_WINDOW: std::time::Duration = std::time::Duration::from_millis(100);

/// The GPM rows of `later` (a second snapshot) put into `gpus` (the first), GPU by GPU.
fn take_gpm_rows(gpus: &mut [GpuSample], later: &[GpuSample]) {
    for g in gpus {
        if let Some(l) = later.iter().find(|l| l.id.index == g.id.index) {
            for d in METRICS.iter().filter(|d| d.source.is_gpm()) {
                g.values.set(d.id, l.get(d.id));
            }
        }
    }
}

/// The GPU instances' GPM metrics of `later` (a second snapshot) put into `mig` (the first's
/// MIG devices), MIG device by MIG device.
fn take_mig_gpm(mig: &mut [MigSample], later: &[MigSample]) {
    for m in mig {
        if let Some(l) = later.iter().find(|l| l.uuid == m.uuid) {
            m.gpm = l.gpm.clone();
        }
    }
}

/// One `MISSING` line per expected GPU that NVML does not enumerate.
fn missing_lines(out: &mut String, missing: &[MissingGpu]) {
    for m in missing {
        let _ = writeln!(out, "MISSING  {}", truncate(&m.describe(), 200));
    }
}

/// Runs `status`.
pub fn status(global: &GlobalArgs, args: &StatusArgs) -> anyhow::Result<i32> {
    let mut cfg = global.sampler_config();
    cfg.xid_events = false;
    // one snapshot: PCIe throughput from its 20 ms window, the counters have no second reading
    cfg.rates_now = true;
    // processes named by pod where the kubelet's socket is where it is by default
    cfg.pod_resources = Some(crate::sys::podresources::DEFAULT_SOCKET.into());
    let mut sampler = Sampler::open(&cfg)?;
    // The bus only: `status` keeps no history (the daemon's `gpu_missing` also knows the GPUs
    // seen before and `expected_gpus`).
    sampler.check_expected(&ExpectedOptions::default());
    let mut snap = sampler.sample();
    let mig_gpm = sampler.mig_gpm_active();
    if sampler.gpm_active() || mig_gpm {
        // A GPM metric needs two samples some time apart (the first was taken when the sampler
        // opened, moments ago): a second snapshot a little later gives them — for the GPU
        // instances, read on the slow path, with a second slow read.
        std::thread::sleep(STATUS_GPM_WINDOW);
        if mig_gpm {
            sampler.read_slow_next();
        }
        let later = sampler.sample();
        take_gpm_rows(&mut snap.gpus, &later.gpus);
        take_mig_gpm(&mut snap.mig, &later.mig);
    }
    let gpm = sampler.gpm();
    // per-link NVLink details (GPUs with NVLink only; read on the slow path with the processes,
    // in the snapshot while current)
    let nvlink = std::mem::take(&mut snap.nvlink);
    let procs = snap.processes.clone().unwrap_or_default();
    let time = crate::record::format_timestamp(snap.time_ms);
    let host = hostname();
    let mut stdout = std::io::stdout().lock();
    if args.json {
        let gpus: Vec<Value> = snap
            .gpus
            .iter()
            .map(|g| {
                let mine: Vec<&ProcSample> =
                    procs.iter().filter(|p| p.gpu_index == g.id.index).collect();
                let mig: Vec<&MigSample> = snap.mig_of(g.id.index).collect();
                let xids: Vec<u64> = snap
                    .xids
                    .iter()
                    .filter(|x| x.gpu_index == g.id.index)
                    .map(|x| x.xid)
                    .collect();
                let none = GpmStatus::Unknown;
                let st = gpm.get(g.id.index as usize).unwrap_or(&none);
                let mut v = gpu_json(g, st, &mine, &xids, &mig);
                if let Some(n) = nvlink.iter().find(|n| n.gpu == g.id.index) {
                    v["nvlink"] = json!(n.links);
                }
                v
            })
            .collect();
        let doc = json!({
            "hostname": host,
            "time": time,
            "time_ms": snap.time_ms,
            "driver_version": sampler.driver_version(),
            "nvml_library": sampler.library(),
            "gpus": gpus,
            "missing": snap.missing,
        });
        serde_json::to_writer_pretty(&mut stdout, &doc)?;
        writeln!(stdout)?;
    } else {
        let mut table = status_table(
            &host,
            &time,
            sampler.driver_version(),
            &snap.gpus,
            &procs,
            &snap.mig,
        );
        missing_lines(&mut table, &snap.missing);
        stdout.write_all(table.as_bytes())?;
    }
    stdout.flush()?;
    Ok(0)
}

/// Text from the driver or the environment with its control characters escaped (a GPU's name
/// or a MIG device's UUID must not drive the terminal).
fn esc(s: &str) -> String {
    crate::values::escape_control(s)
}

fn minor_path(d: &DeviceId) -> String {
    d.minor
        .map_or_else(|| "n/a".into(), |m| format!("/dev/nvidia{m}"))
}

const TRAP: &str = "Note: inside a container NVML indices (and cuda:N) are renumbered from 0 over the GPUs the container \
was given, while /dev/nvidiaN (the minor number) and the UUID keep the host's identity. Name GPUs by UUID \
when you compare with the host's nvidia-smi, alerts or a colleague's screen.";

/// Runs `devices`.
pub fn devices(global: &GlobalArgs, args: &DevicesArgs) -> anyhow::Result<i32> {
    let mut cfg = global.sampler_config();
    cfg.xid_events = false;
    let mut sampler = Sampler::open(&cfg)?;
    // one snapshot for the MIG devices (read with the processes)
    let mig = sampler.sample().mig;
    let view = DeviceView::new(sampler.devices(), mig);
    let mut stdout = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut stdout, &view.json())?;
        writeln!(stdout)?;
    } else {
        stdout.write_all(view.text().as_bytes())?;
    }
    stdout.flush()?;
    Ok(0)
}

/// The GPUs as NVML numbers them and as CUDA and the container runtime will see them, from this
/// process's environment.
struct DeviceView {
    devs: Vec<DeviceId>,
    mig: Vec<MigSample>,
    cuda_env: Option<String>,
    nvidia_env: Option<String>,
    order: Option<String>,
    cuda: Option<CudaVisible>,
    nvidia: Option<NvidiaVisible>,
    renumbered: bool,
    order_warning: Option<&'static str>,
}

impl DeviceView {
    fn new(devs: Vec<DeviceId>, mig: Vec<MigSample>) -> DeviceView {
        let cuda_env = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let nvidia_env = std::env::var("NVIDIA_VISIBLE_DEVICES").ok();
        let order = std::env::var("CUDA_DEVICE_ORDER").ok();
        let cuda = cuda_env
            .as_deref()
            .map(|s| cuda_visible_mig(s, &devs, &mig));
        let nvidia = nvidia_env.as_deref().map(|s| nvidia_visible(s, &devs));
        let renumbered = devs.iter().any(|d| d.minor.is_some_and(|m| m != d.index));
        let mixed_models = devs.windows(2).any(|w| w[0].name != w[1].name);
        let order_warning = (mixed_models && order.as_deref() != Some("PCI_BUS_ID")).then_some(
            "GPUs of different models and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA numbers the fastest GPU first, \
             so cuda:N may not be NVML index N; set CUDA_DEVICE_ORDER=PCI_BUS_ID",
        );
        DeviceView {
            devs,
            mig,
            cuda_env,
            nvidia_env,
            order,
            cuda,
            nvidia,
            renumbered,
            order_warning,
        }
    }

    fn json(&self) -> serde_json::Value {
        let devs = &self.devs;
        let mig_dev_json = |m: &MigSample| {
            json!({"index": m.index, "uuid": m.uuid, "legacy_id": m.legacy_id(), "gpu_instance_id": m.gpu_instance_id,
                   "compute_instance_id": m.compute_instance_id, "profile": m.profile, "placement": m.placement,
                   "memory_total_bytes": m.mem_total_bytes})
        };
        let dev_json = |d: &DeviceId| {
            json!({"index": d.index, "minor": d.minor, "device_path": d.minor.map(|m| format!("/dev/nvidia{m}")),
                   "uuid": d.uuid, "pci_bus_id": d.pci_bus_id, "name": d.name,
                   "mig": self.mig.iter().filter(|m| m.gpu_index == d.index).map(mig_dev_json).collect::<Vec<_>>()})
        };
        let cuda_json = self.cuda.as_ref().zip(self.cuda_env.as_ref()).map(|(c, v)| {
            json!({
                "value": v,
                "visible": c.visible.iter().zip(&c.mig).enumerate().map(|(k, (&i, m))| {
                    json!({"cuda": k, "index": devs[i].index, "minor": devs[i].minor, "uuid": devs[i].uuid, "name": devs[i].name,
                           "mig": m.map(|m| mig_dev_json(&self.mig[m]))})
                }).collect::<Vec<_>>(),
                "stopped_at": c.stopped_at.as_ref().map(|s| json!({"entry": s.entry, "reason": s.reason})),
                "ignored": c.ignored.iter().map(|s| json!({"entry": s.entry, "reason": s.reason})).collect::<Vec<_>>(),
                "duplicate": c.duplicate,
            })
        });
        let nvidia_json = self.nvidia.as_ref().zip(self.nvidia_env.as_ref()).map(|(n, v)| {
            let (mode, entries) = match n {
                NvidiaVisible::All => ("all", Vec::new()),
                NvidiaVisible::None => ("none", Vec::new()),
                NvidiaVisible::Void => ("void", Vec::new()),
                NvidiaVisible::List(l) => (
                    "list",
                    l.iter()
                        .map(|(e, pos)| json!({"entry": e, "index": pos.map(|p| devs[p].index), "uuid": pos.map(|p| devs[p].uuid.clone())}))
                        .collect(),
                ),
            };
            json!({"value": v, "mode": mode, "entries": entries})
        });
        json!({
            "devices": devs.iter().map(dev_json).collect::<Vec<_>>(),
            "cuda_visible_devices": cuda_json,
            "nvidia_visible_devices": nvidia_json,
            "cuda_device_order": self.order,
            "renumbered": self.renumbered,
            "warnings": self.order_warning.into_iter().collect::<Vec<_>>(),
        })
    }

    fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<5}  {:<13}  {:<40}  {:<16}  NAME",
            "INDEX", "MINOR", "UUID", "PCI BUS ID"
        );
        for d in &self.devs {
            let mig: Vec<&MigSample> = self.mig.iter().filter(|m| m.gpu_index == d.index).collect();
            let _ = writeln!(
                out,
                "{:<5}  {:<13}  {:<40}  {:<16}  {}{}",
                d.index,
                minor_path(d),
                esc(&d.uuid),
                esc(&d.pci_bus_id),
                esc(&d.name),
                if mig.is_empty() {
                    String::new()
                } else {
                    format!(
                        "  (MIG on: {} MIG device{})",
                        mig.len(),
                        if mig.len() == 1 { "" } else { "s" }
                    )
                }
            );
            for m in mig {
                let _ = writeln!(
                    out,
                    "  {:<18}  {:<40}  {}",
                    esc(&m.describe()),
                    esc(&m.uuid),
                    esc(&m.legacy_id())
                );
            }
        }
        out.push('\n');
        self.cuda_text(&mut out);
        self.nvidia_text(&mut out);
        if self.renumbered {
            let _ = writeln!(
                out,
                "\nNVML indices differ from the /dev/nvidiaN minor numbers: this looks like a container, so index N here is not host GPU N."
            );
        }
        if let Some(w) = self.order_warning {
            let _ = writeln!(out, "\nWarning: {w}.");
        }
        if self.cuda_env.is_some() || self.nvidia_env.is_some() || self.renumbered {
            let _ = writeln!(out, "\n{TRAP}");
        }
        out
    }

    fn cuda_text(&self, out: &mut String) {
        let devs = &self.devs;
        let (Some(c), Some(v)) = (&self.cuda, &self.cuda_env) else {
            let _ = writeln!(
                out,
                "CUDA_VISIBLE_DEVICES is not set: cuda:N is NVML index N (all {} GPUs).",
                devs.len()
            );
            if !self.mig.is_empty() {
                let _ = writeln!(
                    out,
                    "A CUDA process runs on one MIG device of a GPU with MIG on: name it with \
                     CUDA_VISIBLE_DEVICES=MIG-<UUID> (MIG-GPU-<GPU UUID>/<GI>/<CI> with drivers before R470)."
                );
            }
            return;
        };
        let _ = writeln!(
            out,
            "CUDA_VISIBLE_DEVICES={v:?}: a CUDA framework started from this environment sees {} GPU{}:",
            c.visible.len(),
            if c.visible.len() == 1 { "" } else { "s" }
        );
        for (k, (&i, m)) in c.visible.iter().zip(&c.mig).enumerate() {
            let d = &devs[i];
            match m.and_then(|m| self.mig.get(m)) {
                Some(m) => {
                    let _ = writeln!(
                        out,
                        "  cuda:{k} = {} on NVML index {}  {}  {}",
                        esc(&m.describe()),
                        d.index,
                        esc(&m.uuid),
                        esc(&d.name)
                    );
                }
                None => {
                    let _ = writeln!(
                        out,
                        "  cuda:{k} = NVML index {}  {}  {}  {}",
                        d.index,
                        minor_path(d),
                        esc(&d.uuid),
                        esc(&d.name)
                    );
                }
            }
        }
        for s in &c.ignored {
            let _ = writeln!(out, "  entry {:?} is skipped: {}", s.entry, s.reason);
        }
        if let Some(s) = &c.stopped_at {
            let _ = writeln!(
                out,
                "  entry {:?} ends the list: {} (CUDA ignores it and every entry after it)",
                s.entry, s.reason
            );
        }
        if let Some(d) = &c.duplicate {
            let _ = writeln!(
                out,
                "  entry {d:?} names a GPU twice: CUDA then sees no GPU at all"
            );
        }
    }

    fn nvidia_text(&self, out: &mut String) {
        let (Some(n), Some(v)) = (&self.nvidia, &self.nvidia_env) else {
            return;
        };
        let _ = writeln!(out);
        match n {
            NvidiaVisible::All => {
                let _ = writeln!(
                    out,
                    "NVIDIA_VISIBLE_DEVICES=all: the container runtime exposes every host GPU."
                );
            }
            NvidiaVisible::None => {
                let _ = writeln!(out, "NVIDIA_VISIBLE_DEVICES=none: the container runtime mounts the driver but no GPU.");
            }
            NvidiaVisible::Void => {
                let _ = writeln!(
                    out,
                    "NVIDIA_VISIBLE_DEVICES={v:?}: the container runtime adds no GPU support."
                );
            }
            NvidiaVisible::List(entries) => {
                let _ = writeln!(
                    out,
                    "NVIDIA_VISIBLE_DEVICES={v:?} names host GPUs for the container runtime (host indices or UUIDs); \
                     it does not change what CUDA sees in this process. Inside the container they are renumbered:"
                );
                for (e, pos) in entries {
                    match pos {
                        Some(p) => {
                            let d = &self.devs[*p];
                            let _ = writeln!(
                                out,
                                "  host GPU {} = NVML index {} here  {}  {}",
                                esc(e),
                                d.index,
                                minor_path(d),
                                esc(&d.uuid)
                            );
                        }
                        None => {
                            let _ = writeln!(out, "  host GPU {}: not visible here", esc(e));
                        }
                    }
                }
            }
        }
    }
}

/// The driver's recovery action (field `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`) when one is
/// needed: `None` for "none" and unknown values.
fn recovery_action_name(v: f64) -> Option<&'static str> {
    match v {
        1.0 => Some("GPU_RESET"),
        2.0 => Some("NODE_REBOOT"),
        3.0 => Some("DRAIN_P2P"),
        4.0 => Some("DRAIN_AND_RESET"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::model::visible::tests::devs;

    #[test]
    fn status_json_names_metrics_by_table_key_only() {
        let mut values = crate::model::MetricValues::default();
        values.set(Metric::Util, Some(97.0));
        values.set(Metric::MemUsed, Some(1024.0));
        values.set(Metric::ClockEventReasons, Some(0x44 as f64));
        let g = GpuSample {
            time_ms: 0,
            id: devs(1).remove(0),
            state: DeviceState::Ok,
            values,
        };
        let j = gpu_json(
            &g,
            &GpmStatus::Unsupported("no GPM".into()),
            &[],
            &[94],
            &[],
        );
        let top: Vec<&str> = j.as_object().unwrap().keys().map(String::as_str).collect();
        let mut want = vec![
            "index",
            "minor",
            "uuid",
            "pci_bus_id",
            "name",
            "state",
            "metrics",
            "clock_event_reason_names",
            "gpm",
            "xids",
            "processes",
            "mig",
        ];
        want.sort_unstable();
        assert_eq!(top, want, "metric values only under `metrics`");
        let metrics = j["metrics"].as_object().unwrap();
        let keys: Vec<&str> = metrics.keys().map(String::as_str).collect();
        let mut table: Vec<&str> = METRICS.iter().map(|d| d.key).collect();
        table.sort_unstable();
        assert_eq!(keys, table);
        assert_eq!(j["metrics"]["util"], 97);
        assert_eq!(j["metrics"]["mem_used"], 1024);
        assert_eq!(j["metrics"]["temp"], Value::Null, "absent is null, not 0");
        assert_eq!(
            j["clock_event_reason_names"],
            json!(["sw_power_cap", "hw_thermal"])
        );
        assert_eq!(
            j["gpm"],
            json!({"state": "unsupported", "detail": "no GPM"})
        );
        assert_eq!(gpm_json(&GpmStatus::Active), json!({"state": "active"}));
        assert_eq!(
            gpm_json(&GpmStatus::Failing("In use by another client".into())),
            json!({"state": "failing", "detail": "In use by another client"})
        );
    }

    #[test]
    fn status_table_shows_absent_values_as_na() {
        let d = devs(1).remove(0);
        let mut values = crate::model::MetricValues::default();
        values.set(Metric::Util, Some(97.0));
        values.set(Metric::ClockEventReasons, Some(0x44 as f64));
        let g = GpuSample {
            time_ms: 0,
            id: d,
            state: DeviceState::Ok,
            values,
        };
        let t = status_table(
            "h",
            "t",
            Some("550.54.15"),
            std::slice::from_ref(&g),
            &[],
            &[],
        );
        assert!(t.contains("97%"), "{t}");
        assert!(t.contains(" SM% "), "{t}");
        assert!(t.contains("97%   n/a"), "SM active absent: {t}");
        let mut busy = g;
        busy.values.set(Metric::SmActive, Some(12.4));
        let t = status_table("h", "t", None, &[busy], &[], &[]);
        assert!(t.contains("97%   12%"), "{t}");
        assert!(t.contains("sw_power_cap,hw_thermal"), "{t}");
        assert!(t.contains("n/a / n/a"), "{t}");
        assert!(!t.contains(" 0C"), "{t}");
    }
}
