//! `gpuwatch status` (one-shot table of every GPU and its processes, like gpustat plus throttle
//! reasons and ECC) and `gpuwatch devices` (identities and the `CUDA_VISIBLE_DEVICES` /
//! `NVIDIA_VISIBLE_DEVICES` mapping, with the container renumbering trap explained).

use std::fmt::Write as _;
use std::io::Write;

use serde_json::{json, Map, Value};

use super::GlobalArgs;
use crate::model::{
    clock_event_names, DeviceId, DeviceState, GpuSample, Metric, ProcSample, METRICS,
};
use crate::sampler::Sampler;

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

fn proc_json(p: &ProcSample) -> Value {
    json!({
        "pid": p.pid,
        "kind": p.kind,
        "user": p.user,
        "uid": p.uid,
        "command": p.command,
        "used_memory_bytes": p.used_mem_bytes,
        "container": p.container,
        "runtime_s": p.runtime_s.map(|r| (r * 10.0).round() / 10.0),
    })
}

/// One GPU in `status --json`: identity and state, then every metric of the table under
/// `metrics` by its table key (`null` when absent), the names of the active clock event reasons
/// (decoded from the `clock_event_reasons` metric), XIDs and processes. Metric values appear
/// nowhere else, under no other name.
fn gpu_json(g: &GpuSample, procs: &[&ProcSample], xids: &[u64]) -> Value {
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
        "xids": xids,
        "processes": procs.iter().map(|p| proc_json(p)).collect::<Vec<_>>(),
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
    let s = &crate::values::escape_control(s);
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// Renders the status table.
fn status_table(
    host: &str,
    time: &str,
    driver: Option<&str>,
    gpus: &[GpuSample],
    procs: &[ProcSample],
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
        "{:>3}  {:<name_w$}  {:>5}  {:>4}  {:>4}  {:>17}  {:>11}  {:<20}  {:>9}  STATE",
        "GPU", "NAME", "TEMP", "UTIL", "MEM%", "MEMORY MiB", "POWER W", "THROTTLE", "ECC C/U"
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
        let state = match g.state {
            DeviceState::Ok => "ok",
            DeviceState::Lost => "LOST",
        };
        let _ = writeln!(
            out,
            "{:>3}  {:<name_w$}  {:>5}  {:>4}  {:>4}  {:>17}  {:>11}  {:<20}  {:>9}  {state}",
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
            int(g.get(Metric::MemUtil), "%"),
            mem,
            power,
            throttle,
            ecc,
        );
        for p in procs.iter().filter(|p| p.gpu_index == g.id.index) {
            let mut line = format!(
                "       └ pid {:<8} {:<10} {:>7} MiB",
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
            let _ = writeln!(out, "{line}");
        }
    }
    out
}

/// Runs `status`.
pub fn status(global: &GlobalArgs, args: &StatusArgs) -> anyhow::Result<i32> {
    let mut cfg = global.sampler_config();
    cfg.xid_events = false;
    let mut sampler = Sampler::open(&cfg)?;
    let snap = sampler.sample();
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
                let xids: Vec<u64> = snap
                    .xids
                    .iter()
                    .filter(|x| x.gpu_index == g.id.index)
                    .map(|x| x.xid)
                    .collect();
                gpu_json(g, &mine, &xids)
            })
            .collect();
        let doc = json!({
            "hostname": host,
            "time": time,
            "time_ms": snap.time_ms,
            "driver_version": sampler.driver_version(),
            "nvml_library": sampler.library(),
            "gpus": gpus,
        });
        serde_json::to_writer_pretty(&mut stdout, &doc)?;
        writeln!(stdout)?;
    } else {
        let table = status_table(&host, &time, sampler.driver_version(), &snap.gpus, &procs);
        stdout.write_all(table.as_bytes())?;
    }
    stdout.flush()?;
    Ok(0)
}

/// Why a `CUDA_VISIBLE_DEVICES` entry ended the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoppedAt {
    /// The entry as written.
    pub entry: String,
    /// Why CUDA does not accept it.
    pub reason: String,
}

/// What a CUDA program started with a given `CUDA_VISIBLE_DEVICES` sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaVisible {
    /// `cuda:k` is `devices[visible[k]]` (positions in the NVML device list).
    pub visible: Vec<usize>,
    /// The entry that ended the list early, if any (it and all later entries are ignored).
    pub stopped_at: Option<StoppedAt>,
    /// A device named twice: CUDA then exposes no device at all.
    pub duplicate: Option<String>,
}

/// Interprets `CUDA_VISIBLE_DEVICES` the way the CUDA driver does: comma-separated entries, each
/// an index (leading digits count, as with `strtoul`: `1gpu` is 1), a `GPU-` UUID or a unique
/// UUID prefix; the first invalid entry (unparsable, out of range, unknown or ambiguous UUID,
/// MIG ids, which gpuwatch does not resolve) ends the list; naming one device twice makes the
/// whole list empty. NVML order is assumed to be CUDA's order (true with
/// `CUDA_DEVICE_ORDER=PCI_BUS_ID`, or identical GPUs).
pub fn cuda_visible(spec: &str, devices: &[DeviceId]) -> CudaVisible {
    let mut out = CudaVisible {
        visible: Vec::new(),
        stopped_at: None,
        duplicate: None,
    };
    if spec.trim().is_empty() {
        return out;
    }
    for raw in spec.split(',') {
        let entry = raw.trim();
        let stop = |reason: &str| StoppedAt {
            entry: entry.to_string(),
            reason: reason.to_string(),
        };
        let found = if entry.starts_with("GPU-") {
            let matches: Vec<usize> = devices
                .iter()
                .enumerate()
                .filter(|(_, d)| d.uuid.starts_with(entry))
                .map(|(i, _)| i)
                .collect();
            match matches.as_slice() {
                [one] => Ok(*one),
                [] => Err(stop("no GPU has this UUID")),
                _ => Err(stop("UUID prefix matches several GPUs")),
            }
        } else if entry.starts_with("MIG-") {
            Err(stop("MIG instance ids are not resolved by gpuwatch"))
        } else {
            let digits: String = entry
                .strip_prefix('+')
                .unwrap_or(entry)
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            match digits.parse::<usize>() {
                Err(_) => Err(stop("not an index or GPU UUID")),
                Ok(i) if i >= devices.len() => Err(stop(&format!(
                    "no GPU with index {i} ({} visible to NVML)",
                    devices.len()
                ))),
                Ok(i) => Ok(i),
            }
        };
        match found {
            Ok(i) if out.visible.contains(&i) => {
                out.visible.clear();
                out.duplicate = Some(entry.to_string());
                return out;
            }
            Ok(i) => out.visible.push(i),
            Err(s) => {
                out.stopped_at = Some(s);
                break;
            }
        }
    }
    out
}

/// What `NVIDIA_VISIBLE_DEVICES` (read by the NVIDIA container runtime when a container is
/// created) asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvidiaVisible {
    /// `all`: every host GPU.
    All,
    /// `none`: driver libraries, no GPU.
    None,
    /// `void` or empty: no GPU support at all.
    Void,
    /// Host indices or UUIDs; each resolved to a position in this NVML device list when found
    /// (index entries are matched against minor numbers, which keep the host's numbering).
    List(Vec<(String, Option<usize>)>),
}

/// Parses `NVIDIA_VISIBLE_DEVICES` against the devices visible here.
pub fn nvidia_visible(spec: &str, devices: &[DeviceId]) -> NvidiaVisible {
    match spec.trim() {
        "all" => NvidiaVisible::All,
        "none" => NvidiaVisible::None,
        "void" | "" => NvidiaVisible::Void,
        list => NvidiaVisible::List(
            list.split(',')
                .map(|e| {
                    let e = e.trim();
                    let pos = if e.starts_with("GPU-") {
                        devices.iter().position(|d| d.uuid.starts_with(e))
                    } else {
                        e.parse::<u32>()
                            .ok()
                            .and_then(|n| devices.iter().position(|d| d.minor == Some(n)))
                    };
                    (e.to_string(), pos)
                })
                .collect(),
        ),
    }
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
    let sampler = Sampler::open(&cfg)?;
    let devs = sampler.devices();
    let cuda_env = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let nvidia_env = std::env::var("NVIDIA_VISIBLE_DEVICES").ok();
    let order = std::env::var("CUDA_DEVICE_ORDER").ok();
    let cuda = cuda_env.as_deref().map(|s| cuda_visible(s, &devs));
    let nvidia = nvidia_env.as_deref().map(|s| nvidia_visible(s, &devs));
    let renumbered = devs.iter().any(|d| d.minor.is_some_and(|m| m != d.index));
    let mixed_models = devs.windows(2).any(|w| w[0].name != w[1].name);
    let order_warning = (mixed_models && order.as_deref() != Some("PCI_BUS_ID")).then_some(
        "GPUs of different models and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA numbers the fastest GPU first, \
         so cuda:N may not be NVML index N; set CUDA_DEVICE_ORDER=PCI_BUS_ID",
    );
    let mut stdout = std::io::stdout().lock();
    if args.json {
        let dev_json = |d: &DeviceId| {
            json!({"index": d.index, "minor": d.minor, "device_path": d.minor.map(|m| format!("/dev/nvidia{m}")),
                   "uuid": d.uuid, "pci_bus_id": d.pci_bus_id, "name": d.name})
        };
        let cuda_json = cuda.as_ref().zip(cuda_env.as_ref()).map(|(c, v)| {
            json!({
                "value": v,
                "visible": c.visible.iter().enumerate().map(|(k, &i)| {
                    json!({"cuda": k, "index": devs[i].index, "minor": devs[i].minor, "uuid": devs[i].uuid, "name": devs[i].name})
                }).collect::<Vec<_>>(),
                "stopped_at": c.stopped_at.as_ref().map(|s| json!({"entry": s.entry, "reason": s.reason})),
                "duplicate": c.duplicate,
            })
        });
        let nvidia_json = nvidia.as_ref().zip(nvidia_env.as_ref()).map(|(n, v)| {
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
        let doc = json!({
            "devices": devs.iter().map(dev_json).collect::<Vec<_>>(),
            "cuda_visible_devices": cuda_json,
            "nvidia_visible_devices": nvidia_json,
            "cuda_device_order": order,
            "renumbered": renumbered,
            "warnings": order_warning.into_iter().collect::<Vec<_>>(),
        });
        serde_json::to_writer_pretty(&mut stdout, &doc)?;
        writeln!(stdout)?;
        return Ok(0);
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<5}  {:<13}  {:<40}  {:<16}  NAME",
        "INDEX", "MINOR", "UUID", "PCI BUS ID"
    );
    for d in &devs {
        let _ = writeln!(
            out,
            "{:<5}  {:<13}  {:<40}  {:<16}  {}",
            d.index,
            minor_path(d),
            d.uuid,
            d.pci_bus_id,
            d.name
        );
    }
    out.push('\n');
    match (&cuda, &cuda_env) {
        (Some(c), Some(v)) => {
            let _ = writeln!(
                out,
                "CUDA_VISIBLE_DEVICES={v:?}: a CUDA framework started from this environment sees {} GPU{}:",
                c.visible.len(),
                if c.visible.len() == 1 { "" } else { "s" }
            );
            for (k, &i) in c.visible.iter().enumerate() {
                let d = &devs[i];
                let _ = writeln!(
                    out,
                    "  cuda:{k} = NVML index {}  {}  {}  {}",
                    d.index,
                    minor_path(d),
                    d.uuid,
                    d.name
                );
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
        _ => {
            let _ = writeln!(
                out,
                "CUDA_VISIBLE_DEVICES is not set: cuda:N is NVML index N (all {} GPUs).",
                devs.len()
            );
        }
    }
    if let (Some(n), Some(v)) = (&nvidia, &nvidia_env) {
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
                            let d = &devs[*p];
                            let _ = writeln!(
                                out,
                                "  host GPU {e} = NVML index {} here  {}  {}",
                                d.index,
                                minor_path(d),
                                d.uuid
                            );
                        }
                        None => {
                            let _ = writeln!(out, "  host GPU {e}: not visible here");
                        }
                    }
                }
            }
        }
    }
    if renumbered {
        let _ = writeln!(
            out,
            "\nNVML indices differ from the /dev/nvidiaN minor numbers: this looks like a container, so index N here is not host GPU N."
        );
    }
    if let Some(w) = order_warning {
        let _ = writeln!(out, "\nWarning: {w}.");
    }
    if cuda_env.is_some() || nvidia_env.is_some() || renumbered {
        let _ = writeln!(out, "\n{TRAP}");
    }
    stdout.write_all(out.as_bytes())?;
    stdout.flush()?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devs(n: u32) -> Vec<DeviceId> {
        (0..n)
            .map(|i| DeviceId {
                index: i,
                minor: Some(i + 2),
                uuid: format!("GPU-{i}{i}aa{i}-0000-1111-2222-33334444555{i}"),
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + i),
                name: "NVIDIA H100 80GB HBM3".into(),
            })
            .collect()
    }

    #[test]
    fn cuda_indices_uuids_and_prefixes() {
        let d = devs(4);
        assert_eq!(cuda_visible("2,0", &d).visible, vec![2, 0]);
        assert_eq!(cuda_visible(" 1 , 3", &d).visible, vec![1, 3]);
        assert_eq!(
            cuda_visible("1gpu,2", &d).visible,
            vec![1, 2],
            "strtoul-like"
        );
        assert_eq!(cuda_visible("GPU-33aa3,GPU-11", &d).visible, vec![3, 1]);
        assert_eq!(cuda_visible(&d[2].uuid, &d).visible, vec![2]);
        assert!(cuda_visible("", &d).visible.is_empty());
    }

    #[test]
    fn invalid_entries_end_the_list() {
        let d = devs(4);
        let c = cuda_visible("1,7,2", &d);
        assert_eq!(c.visible, vec![1]);
        assert_eq!(c.stopped_at.as_ref().map(|s| s.entry.as_str()), Some("7"));
        let c = cuda_visible("0,-1,2", &d);
        assert_eq!(c.visible, vec![0]);
        let c = cuda_visible("GPU-,1", &d);
        assert!(c.visible.is_empty());
        assert!(c.stopped_at.unwrap().reason.contains("several"));
        let c = cuda_visible("3,GPU-ffff", &d);
        assert_eq!(c.visible, vec![3]);
        let c = cuda_visible("abc", &d);
        assert!(c.visible.is_empty() && c.stopped_at.is_some());
        let c = cuda_visible("MIG-GPU-1/0/0", &d);
        assert!(c.stopped_at.is_some());
    }

    #[test]
    fn duplicates_hide_everything() {
        let d = devs(4);
        let c = cuda_visible("0,1,0", &d);
        assert!(c.visible.is_empty());
        assert_eq!(c.duplicate.as_deref(), Some("0"));
        assert!(cuda_visible(&format!("1,{}", d[1].uuid), &d)
            .visible
            .is_empty());
    }

    #[test]
    fn nvidia_visible_modes() {
        let d = devs(2);
        assert_eq!(nvidia_visible("all", &d), NvidiaVisible::All);
        assert_eq!(nvidia_visible("none", &d), NvidiaVisible::None);
        assert_eq!(nvidia_visible("void", &d), NvidiaVisible::Void);
        assert_eq!(nvidia_visible("", &d), NvidiaVisible::Void);
        // Host index 3 is minor 3 = NVML index 1 here; host 0 is not in this container.
        assert_eq!(
            nvidia_visible("3,0,GPU-00aa0", &d),
            NvidiaVisible::List(vec![
                ("3".into(), Some(1)),
                ("0".into(), None),
                ("GPU-00aa0".into(), Some(0))
            ])
        );
    }

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
        let j = gpu_json(&g, &[], &[94]);
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
            "xids",
            "processes",
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
        let t = status_table("h", "t", Some("550.54.15"), &[g], &[]);
        assert!(t.contains("97%"), "{t}");
        assert!(t.contains("sw_power_cap,hw_thermal"), "{t}");
        assert!(t.contains("n/a / n/a"), "{t}");
        assert!(!t.contains(" 0C"), "{t}");
    }
}
