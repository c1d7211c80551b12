//! Rule unit-test files for `gpuwatch test` (promtool's `test rules`, for GPUs).
//!
//! A test file is TOML (full reference in docs/rules.md):
//!
//! ```toml
//! rules = ["../gpu_hot.rhai"]   # rule files/dirs relative to this file (default [".."])
//! interval = "10s"              # sample interval (default "1s")
//! eval_interval = "10s"         # default: every sample
//! [params]                      # like [rules.params] in config.toml
//! gpu_hot.threshold = 90
//!
//! [[case]]
//! name = "hot for 5 minutes fires"
//! duration = "15m"              # default: the longest series
//! [[case.gpu]]                  # one table per GPU; `index` defaults to its position
//! temp = "60x6 90x30 60x54"     # any metric key of the metric table
//! util = "0+10x10 100x80"       # ramps: a+bxN; `_` = missing sample, `_x5` five of them
//! mem_total = "80GiBx90"        # KiB/MiB/GiB/TiB suffixes give bytes
//! lost = "0x80 1x10"            # 1 = GPU lost at that tick
//! stalled = "0x80 1x10"         # 1 = an NVML call on the GPU hangs at that tick (values given
//! stalled_call = "nvmlDeviceGetPowerUsage"  # at such ticks are kept; default: field values)
//! xids = [{ at = "4m", code = 79 }, { at = "6m", code = 31, pid = 4242, process = "python3" }]
//! processes = [{ pid = 4242, used = "20GiB", from = "0s", to = "10m" }]
//! nvlink = [                    # the GPU's NVLinks, one table per link (`gpu.nvlinks`)
//!   { link = 0, up = "1x30 0x30", remote = "switch", bus = "00000000:05:00.0" },
//!   { link = 1, peer = 5, remote = "gpu", speed = 26562, version = 4, crc_flit = "0+10x60" },
//! ]                             # up: series of 1/0 (default up); remote: gpu | switch |
//!                               # ibm_npu | unknown (default: not known); crc_flit, crc_data,
//!                               # replay, recovery: counter series
//! [[case.missing]]              # an expected GPU NVML does not enumerate (host.missing_gpus)
//! pci_bus_id = "00000000:3A:00.0"   # optional, like uuid and name
//! why = "on_bus"                # on_bus | seen_before | expected_count (default on_bus)
//! from = "0s"                   # optional: in the snapshots from this offset (default 0)
//! to = "5m"                     # optional: until this offset (default: to the end)
//! [[case.expect]]
//! alert = "gpu_hot"
//! gpu = 0                       # omit for host alerts
//! state = "firing"              # firing | resolved | repeat
//! at = "3m"                     # offset from the start, e.g. "1h2m3s"
//! severity = "warning"          # optional: checked when given
//! summary_contains = "GPU 0"    # optional: checked when given
//! ```
//!
//! `VxN` is N samples of V (promtool's `axn` is n+1; we count samples). A tick at which no GPU
//! has any value is a missed tick: no snapshot, only `advance`. Each case runs a fresh engine
//! over its series; the expected list must equal the actual firing/resolved events (repeats
//! only when the case lists one), in time order.

use crate::model::AlertEvent;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::engine::{Engine, EngineOptions};
use crate::model::nvlink::{NvlinkLink, NvlinkStatus, RemoteType};
use crate::model::{
    AlertStatus, DeviceId, DeviceState, GpuSample, Metric, MetricValues, MissingGpu, MissingWhy,
    NvmlFunction, ProcSample, Snapshot, XidEvent, XidSource,
};
use crate::rules::{RuleSet, RulesConfig};

/// Start of virtual time in tests: 2026-01-01T00:00:00Z.
pub const TEST_EPOCH_MS: i64 = 1_767_225_600_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TestFile {
    #[serde(default)]
    rules: Vec<PathBuf>,
    interval: Option<String>,
    eval_interval: Option<String>,
    #[serde(default)]
    params: BTreeMap<String, toml::Table>,
    #[serde(default)]
    case: Vec<Case>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    duration: Option<String>,
    #[serde(default)]
    gpu: Vec<toml::Table>,
    #[serde(default)]
    expect: Vec<Expect>,
    #[serde(default)]
    missing: Vec<MissingIn>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MissingIn {
    #[serde(default)]
    pci_bus_id: String,
    #[serde(default)]
    uuid: String,
    #[serde(default)]
    name: String,
    why: Option<MissingWhy>,
    from: Option<String>,
    to: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    alert: String,
    gpu: Option<u32>,
    state: String,
    at: String,
    severity: Option<String>,
    summary_contains: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct XidIn {
    at: String,
    code: u64,
    /// The process the kernel log names.
    pid: Option<u32>,
    process: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NvlinkIn {
    link: u32,
    up: Option<String>,
    remote: Option<RemoteType>,
    bus: Option<String>,
    peer: Option<u32>,
    speed: Option<u32>,
    version: Option<u32>,
    crc_flit: Option<String>,
    crc_data: Option<String>,
    replay: Option<String>,
    recovery: Option<String>,
}

/// One NVLink of a test GPU: the link as read at every tick, and its series.
struct LinkInput {
    link: NvlinkLink,
    up: Vec<Option<f64>>,
    /// CRC flit, CRC data, replay, recovery.
    counters: [Vec<Option<f64>>; 4],
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProcIn {
    pid: u32,
    used: Option<String>,
    from: Option<String>,
    to: Option<String>,
    user: Option<String>,
    command: Option<String>,
}

/// Result of one case.
#[derive(Debug, Clone)]
pub struct CaseReport {
    /// Case name.
    pub name: String,
    /// Passed?
    pub passed: bool,
    /// Diff or error text when failed.
    pub detail: String,
}

/// Parses a compound offset such as `"1h2m3s"`, `"90s"`, `"5m"` or `"30"` (seconds), in ms.
pub fn parse_offset_ms(s: &str) -> Result<i64, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let unit_end = rest[num_end..]
            .find(|c: char| c.is_ascii_digit())
            .map_or(rest.len(), |i| num_end + i);
        total += crate::values::parse_duration_ms(&rest[..unit_end])?;
        rest = &rest[unit_end..];
    }
    Ok(total)
}

/// Formats an offset as `1h2m3s` (`0s` for zero).
pub fn format_offset(ms: i64) -> String {
    let mut out = String::new();
    let (h, m, s, rem) = (
        ms / 3_600_000,
        (ms / 60_000) % 60,
        (ms / 1000) % 60,
        ms % 1000,
    );
    if h > 0 {
        let _ = write!(out, "{h}h");
    }
    if m > 0 {
        let _ = write!(out, "{m}m");
    }
    if s > 0 || out.is_empty() {
        let _ = write!(out, "{s}s");
    }
    if rem > 0 {
        let _ = write!(out, "{rem}ms");
    }
    out
}

/// A number with an optional byte-unit suffix (`80GiB`, `1.5MiB`) or `%`/`W`/`C` decoration.
fn parse_value(s: &str) -> Result<f64, String> {
    let s = s.trim();
    for (suffix, scale) in [
        ("KiB", 1024.0),
        ("MiB", 1_048_576.0),
        ("GiB", 1_073_741_824.0),
        ("TiB", 1_099_511_627_776.0),
    ] {
        if let Some(n) = s.strip_suffix(suffix) {
            return n
                .parse::<f64>()
                .map(|v| v * scale)
                .map_err(|_| format!("bad value {s:?}"));
        }
    }
    let n = s.trim_end_matches(['%', 'W', 'C']);
    n.parse::<f64>().map_err(|_| format!("bad value {s:?}"))
}

/// Expands the compact series notation into one entry per sample (`None` = missing).
pub fn parse_series(text: &str) -> Result<Vec<Option<f64>>, String> {
    let mut out = Vec::new();
    for tok in text.split_whitespace() {
        let (body, count) = match tok.rsplit_once('x') {
            Some((b, n)) if !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()) => (
                b,
                Some(
                    n.parse::<usize>()
                        .map_err(|_| format!("bad count in {tok:?}"))?,
                ),
            ),
            _ => (tok, None),
        };
        if body == "_" {
            out.extend(std::iter::repeat_n(None, count.unwrap_or(1)));
            continue;
        }
        // a+b / a-b ramp (the sign must not be the leading one or follow an exponent)
        let ramp = body
            .char_indices()
            .skip(1)
            .find(|(i, c)| {
                (*c == '+' || *c == '-') && !matches!(body.as_bytes()[i - 1], b'e' | b'E')
            })
            .map(|(i, _)| i);
        match (ramp, count) {
            (Some(i), Some(n)) => {
                let a = parse_value(&body[..i])?;
                let step = parse_value(&body[i + 1..])?;
                let step = if body.as_bytes()[i] == b'-' {
                    -step
                } else {
                    step
                };
                #[expect(clippy::cast_precision_loss, reason = "small counts")]
                out.extend((0..n).map(|k| Some(a + step * k as f64)));
            }
            (Some(_), None) => return Err(format!("ramp {tok:?} needs a count, e.g. 0+10x5")),
            (None, n) => {
                let v = parse_value(body).map_err(|e| format!("{e} in {tok:?}"))?;
                out.extend(std::iter::repeat_n(Some(v), n.unwrap_or(1)));
            }
        }
    }
    Ok(out)
}

/// Position of `needle` in `text` as `line:column`, for messages.
fn locate(text: &str, needle: &str) -> String {
    text.find(needle).map_or_else(
        || "1:1".to_string(),
        |off| {
            let (l, c) = crate::values::line_col(text, off);
            format!("{l}:{c}")
        },
    )
}

struct GpuInput {
    index: u32,
    uuid: String,
    name: String,
    series: Vec<(Metric, Vec<Option<f64>>)>,
    lost: Vec<Option<f64>>,
    stalled: Vec<Option<f64>>,
    stalled_call: NvmlFunction,
    xids: Vec<(i64, XidEvent)>,
    procs: Vec<(i64, i64, ProcSample)>,
    nvlink: Vec<LinkInput>,
}

fn gpu_input(table: &toml::Table, pos: usize, text: &str, file: &str) -> Result<GpuInput, String> {
    let mut g = GpuInput {
        index: u32::try_from(pos).unwrap_or(0),
        uuid: String::new(),
        name: "Test GPU".into(),
        series: Vec::new(),
        lost: Vec::new(),
        stalled: Vec::new(),
        stalled_call: NvmlFunction::FieldValues,
        xids: Vec::new(),
        procs: Vec::new(),
        nvlink: Vec::new(),
    };
    for (k, v) in table {
        let s_err = |e: String| {
            let needle = format!("{k} =");
            format!("{file}:{}: {k}: {e}", locate(text, &needle))
        };
        match k.as_str() {
            "index" => {
                g.index = v
                    .as_integer()
                    .and_then(|i| u32::try_from(i).ok())
                    .ok_or_else(|| s_err("must be a GPU index".into()))?;
            }
            "uuid" => g.uuid = v.as_str().unwrap_or_default().to_string(),
            "name" => g.name = v.as_str().unwrap_or_default().to_string(),
            "lost" => {
                g.lost = parse_series(v.as_str().ok_or_else(|| s_err("must be a string".into()))?)
                    .map_err(s_err)?;
            }
            "stalled" => {
                g.stalled =
                    parse_series(v.as_str().ok_or_else(|| s_err("must be a string".into()))?)
                        .map_err(s_err)?;
            }
            "stalled_call" => {
                g.stalled_call = v
                    .as_str()
                    .and_then(NvmlFunction::from_symbol)
                    .ok_or_else(|| s_err("must name an NVML function the sampler calls".into()))?;
            }
            "xids" => {
                let list: Vec<XidIn> = v.clone().try_into().map_err(|e| s_err(format!("{e}")))?;
                for x in list {
                    let at = parse_offset_ms(&x.at).map_err(&s_err)?;
                    let source = if x.pid.is_some() {
                        XidSource::Both
                    } else {
                        XidSource::Nvml
                    };
                    g.xids.push((
                        at,
                        XidEvent {
                            xid: x.code,
                            pid: x.pid,
                            process: x.process,
                            source,
                            ..XidEvent::default()
                        },
                    ));
                }
            }
            "processes" => {
                let list: Vec<ProcIn> = v.clone().try_into().map_err(|e| s_err(format!("{e}")))?;
                for p in list {
                    let from = p
                        .from
                        .as_deref()
                        .map_or(Ok(0), parse_offset_ms)
                        .map_err(&s_err)?;
                    let to =
                        p.to.as_deref()
                            .map_or(Ok(i64::MAX), parse_offset_ms)
                            .map_err(&s_err)?;
                    #[expect(
                        clippy::cast_possible_truncation,
                        clippy::cast_sign_loss,
                        reason = "bytes"
                    )]
                    let used = p
                        .used
                        .as_deref()
                        .map(parse_value)
                        .transpose()
                        .map_err(&s_err)?
                        .map(|b| b as u64);
                    g.procs.push((
                        from,
                        to,
                        ProcSample {
                            user: p.user,
                            command: p.command,
                            ..ProcSample::compute(p.pid, 0, String::new(), used)
                        },
                    ));
                }
            }
            "nvlink" => {
                let list: Vec<NvlinkIn> =
                    v.clone().try_into().map_err(|e| s_err(format!("{e}")))?;
                for l in list {
                    let series = |s: &Option<String>| {
                        s.as_deref()
                            .map_or(Ok(Vec::new()), parse_series)
                            .map_err(&s_err)
                    };
                    g.nvlink.push(LinkInput {
                        link: NvlinkLink {
                            link: l.link,
                            up: true,
                            speed_mbps: l.speed,
                            version: l.version,
                            remote_bus_id: l.bus,
                            remote_type: l.remote,
                            peer_gpu: l.peer,
                            crc_flit_errors: None,
                            crc_data_errors: None,
                            replay_errors: None,
                            recovery_errors: None,
                        },
                        up: series(&l.up)?,
                        counters: [
                            series(&l.crc_flit)?,
                            series(&l.crc_data)?,
                            series(&l.replay)?,
                            series(&l.recovery)?,
                        ],
                    });
                }
            }
            key => {
                let m = Metric::from_key(key).ok_or_else(|| {
                    s_err("unknown key (expected a metric key, index, uuid, name, lost, stalled, stalled_call, xids, processes or nvlink)".into())
                })?;
                let text = v
                    .as_str()
                    .ok_or_else(|| s_err("must be a series string".into()))?;
                g.series.push((m, parse_series(text).map_err(s_err)?));
            }
        }
    }
    if g.uuid.is_empty() {
        g.uuid = format!("GPU-test-{}", g.index);
    }
    Ok(g)
}

/// Runs every case of one test file.
pub fn run_file(path: &Path) -> Result<Vec<CaseReport>, String> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| format!("{file}: cannot read: {e}"))?;
    let tf: TestFile = toml::from_str(&text).map_err(|e| {
        let (l, c) = e
            .span()
            .map_or((1, 1), |s| crate::values::line_col(&text, s.start));
        format!("{file}:{l}:{c}: {}", e.message())
    })?;
    let base = path.parent().unwrap_or(Path::new("."));
    let rule_paths: Vec<PathBuf> = if tf.rules.is_empty() {
        vec![base.join("..")]
    } else {
        tf.rules.iter().map(|p| base.join(p)).collect()
    };
    let cfg = RulesConfig {
        params: tf.params.clone(),
        ..RulesConfig::default()
    };
    let rules = RuleSet::load(&rule_paths, &cfg).map_err(|errs| {
        errs.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    })?;
    let interval = crate::values::parse_duration_ms(tf.interval.as_deref().unwrap_or("1s"))
        .map_err(|e| format!("{file}: interval: {e}"))?;
    if interval <= 0 {
        return Err(format!("{file}: interval must be positive"));
    }
    let eval_interval = match &tf.eval_interval {
        Some(s) => crate::values::parse_duration_ms(s)
            .map_err(|e| format!("{file}: eval_interval: {e}"))?,
        None => 0,
    };
    let mut reports = Vec::new();
    for case in &tf.case {
        reports.push(
            match run_case(case, &rules, interval, eval_interval, &text, &file) {
                Ok(r) => r,
                Err(e) => CaseReport {
                    name: case.name.clone(),
                    passed: false,
                    detail: e,
                },
            },
        );
    }
    Ok(reports)
}

fn value_at(s: &[Option<f64>], k: usize) -> Option<f64> {
    s.get(k).copied().flatten()
}

fn run_case(
    case: &Case,
    rules: &RuleSet,
    interval: i64,
    eval_interval: i64,
    text: &str,
    file: &str,
) -> Result<CaseReport, String> {
    let gpus: Vec<GpuInput> = case
        .gpu
        .iter()
        .enumerate()
        .map(|(i, t)| gpu_input(t, i, text, file))
        .collect::<Result<_, _>>()?;
    let longest = gpus
        .iter()
        .flat_map(|g| {
            g.series
                .iter()
                .map(|s| s.1.len())
                .chain([g.lost.len(), g.stalled.len()])
        })
        .max()
        .unwrap_or(0);
    let ticks = match &case.duration {
        Some(d) => {
            let ms = parse_offset_ms(d).map_err(|e| format!("{file}: duration: {e}"))?;
            usize::try_from(ms / interval).unwrap_or(0) + 1
        }
        None => longest,
    };
    let opts = EngineOptions {
        hostname: "test".into(),
        eval_interval_ms: eval_interval,
        sample_interval_ms: Some(interval),
        clock_speed: 1.0,
    };
    let missing = missing_inputs(case, file)?;
    let mut engine = Engine::new(rules.clone(), opts);
    let mut events = Vec::new();
    for k in 0..ticks {
        let mut snap = snapshot_at(&gpus, k, interval);
        let off = snap.time_ms - TEST_EPOCH_MS;
        snap.missing = missing
            .iter()
            .filter(|(from, to, _)| *from <= off && off < *to)
            .map(|(_, _, m)| m.clone())
            .collect();
        let evs = if snap.gpus.is_empty() {
            engine.advance(snap.time_ms)
        } else {
            engine.observe(&snap)
        };
        events.extend(evs);
    }
    compare(case, &events, file)
}

/// A case's `[[case.missing]]` GPUs with the offsets they are missing in, `[from, to)`.
fn missing_inputs(case: &Case, file: &str) -> Result<Vec<(i64, i64, MissingGpu)>, String> {
    let err = |e: String| format!("{file}: case {:?}: missing: {e}", case.name);
    case.missing
        .iter()
        .map(|m| {
            let from = m
                .from
                .as_deref()
                .map_or(Ok(0), parse_offset_ms)
                .map_err(err)?;
            let to =
                m.to.as_deref()
                    .map_or(Ok(i64::MAX), parse_offset_ms)
                    .map_err(err)?;
            let gpu = MissingGpu {
                pci_bus_id: m.pci_bus_id.clone(),
                uuid: m.uuid.clone(),
                name: m.name.clone(),
                why: Some(m.why.unwrap_or(MissingWhy::OnBus)),
            };
            Ok((from, to, gpu))
        })
        .collect()
}

/// The snapshot of tick `k` (at `k × interval` after the test epoch): the GPUs with a value or
/// lost at that tick, their XIDs since the previous tick and their processes.
fn snapshot_at(gpus: &[GpuInput], k: usize, interval: i64) -> Snapshot {
    let off = i64::try_from(k).unwrap_or(i64::MAX) * interval;
    let now = TEST_EPOCH_MS + off;
    let mut snap = Snapshot {
        time_ms: now,
        ..Snapshot::default()
    };
    let mut procs = Vec::new();
    for g in gpus {
        let lost = value_at(&g.lost, k).is_some_and(|v| v != 0.0);
        let stalled = value_at(&g.stalled, k).is_some_and(|v| v != 0.0);
        let mut values = MetricValues::default();
        let mut any = false;
        for (m, s) in &g.series {
            let v = value_at(s, k);
            any |= v.is_some();
            values.set(*m, v);
        }
        if !any && !lost && !stalled {
            continue;
        }
        if lost {
            values = MetricValues::default();
        }
        for (at, x) in &g.xids {
            if *at > off - interval && *at <= off {
                snap.xids.push(XidEvent {
                    time_ms: now,
                    gpu_index: g.index,
                    gpu_uuid: g.uuid.clone(),
                    ..x.clone()
                });
            }
        }
        if !lost && !g.nvlink.is_empty() {
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "counts"
            )]
            let links = g
                .nvlink
                .iter()
                .map(|l| {
                    let [flit, data, replay, recovery] =
                        std::array::from_fn(|i| value_at(&l.counters[i], k).map(|v| v as u64));
                    let up = value_at(&l.up, k).is_none_or(|v| v != 0.0);
                    NvlinkLink {
                        up,
                        speed_mbps: l.link.speed_mbps.filter(|_| up),
                        crc_flit_errors: flit,
                        crc_data_errors: data,
                        replay_errors: replay,
                        recovery_errors: recovery,
                        ..l.link.clone()
                    }
                })
                .collect();
            snap.nvlink.push(std::sync::Arc::new(NvlinkStatus {
                gpu: g.index,
                time_ms: now,
                links,
            }));
        }
        for (from, to, p) in &g.procs {
            if *from <= off && off < *to {
                let mut p = p.clone();
                p.gpu_index = g.index;
                p.gpu_uuid.clone_from(&g.uuid);
                procs.push(p);
            }
        }
        snap.gpus.push(GpuSample {
            time_ms: now,
            id: DeviceId {
                index: g.index,
                minor: Some(g.index),
                uuid: g.uuid.clone(),
                pci_bus_id: format!("00000000:{:02X}:00.0", g.index + 1),
                name: g.name.clone(),
            },
            state: if lost {
                DeviceState::Lost
            } else if stalled {
                DeviceState::Stalled(g.stalled_call)
            } else {
                DeviceState::Ok
            },
            values,
        });
    }
    if !snap.gpus.is_empty() {
        snap.processes = Some(procs);
    }
    snap
}

/// Compares the events of a case with its `expect` lines (repeats only when some are expected)
/// and checks their severities and summaries.
fn compare(case: &Case, events: &[AlertEvent], file: &str) -> Result<CaseReport, String> {
    let want_repeats = case.expect.iter().any(|e| e.state == "repeat");
    let line = |alert: &str, gpu: Option<u32>, state: &str, at_ms: i64| {
        let gpu = gpu.map_or_else(|| "host".to_string(), |g| format!("gpu {g}"));
        format!("{alert} {gpu} {state} at {}", format_offset(at_ms))
    };
    let actual: Vec<(String, String, &'static str)> = events
        .iter()
        .filter(|e| want_repeats || !e.repeat)
        .map(|e| {
            let state = match (e.status, e.repeat) {
                (AlertStatus::Firing, false) => "firing",
                (AlertStatus::Firing, true) => "repeat",
                (AlertStatus::Resolved, _) => "resolved",
            };
            (
                line(&e.name, e.gpu, state, e.at_ms - TEST_EPOCH_MS),
                e.annotations.get("summary").cloned().unwrap_or_default(),
                e.severity.as_str(),
            )
        })
        .collect();
    let mut expected = Vec::new();
    for e in &case.expect {
        if !matches!(e.state.as_str(), "firing" | "resolved" | "repeat") {
            return Err(format!(
                "{file}: case {:?}: state {:?} must be firing, resolved or repeat",
                case.name, e.state
            ));
        }
        let at =
            parse_offset_ms(&e.at).map_err(|m| format!("{file}: case {:?}: at: {m}", case.name))?;
        expected.push(line(&e.alert, e.gpu, &e.state, at));
    }
    let actual_lines: Vec<&String> = actual.iter().map(|a| &a.0).collect();
    let mut passed = expected.iter().collect::<Vec<_>>() == actual_lines;
    let mut detail = String::new();
    if passed {
        for (e, a) in case.expect.iter().zip(&actual) {
            if let Some(sev) = &e.severity {
                if sev != a.2 {
                    passed = false;
                    let _ = writeln!(detail, "{}: severity {} (expected {sev})", a.0, a.2);
                }
            }
            if let Some(want) = &e.summary_contains {
                if !a.1.contains(want.as_str()) {
                    passed = false;
                    let _ = writeln!(detail, "{}: summary {:?} lacks {want:?}", a.0, a.1);
                }
            }
        }
    } else {
        let _ = writeln!(detail, "expected (-) vs actual (+):");
        for e in &expected {
            if !actual_lines.contains(&e) {
                let _ = writeln!(detail, "  - {e}");
            } else {
                let _ = writeln!(detail, "    {e}");
            }
        }
        for (a, summary, _) in &actual {
            if !expected.contains(a) {
                let _ = writeln!(detail, "  + {a}    ({summary})");
            }
        }
    }
    Ok(CaseReport {
        name: case.name.clone(),
        passed,
        detail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_notation() {
        assert_eq!(
            parse_series("1x3 _ 0+10x3 5-1x2 _x2 1GiB").unwrap(),
            vec![
                Some(1.0),
                Some(1.0),
                Some(1.0),
                None,
                Some(0.0),
                Some(10.0),
                Some(20.0),
                Some(5.0),
                Some(4.0),
                None,
                None,
                Some(1_073_741_824.0)
            ]
        );
        assert_eq!(
            parse_series("-5 1e-3").unwrap(),
            vec![Some(-5.0), Some(0.001)]
        );
        assert!(parse_series("1+2").is_err());
        assert!(parse_series("abc").is_err());
    }

    #[test]
    fn offsets() {
        assert_eq!(parse_offset_ms("1h2m3s"), Ok(3_723_000));
        assert_eq!(parse_offset_ms("90"), Ok(90_000));
        assert_eq!(format_offset(3_723_000), "1h2m3s");
        assert_eq!(format_offset(0), "0s");
        assert_eq!(format_offset(120_000), "2m");
    }
}
