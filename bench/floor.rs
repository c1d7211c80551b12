//! The floor: what the NVML calls of gpuwatch's sampler cost by themselves. A bare loop on one
//! thread that makes the calls the sampler makes, at the sampler's cadences, and does nothing
//! with the answers — no threads, no snapshot, no CSV, no rules. gpuwatch's own cost is measured
//! against it (`bench/sampler.sh`): the difference is what gpuwatch adds.
//!
//!     cargo build --release --example floor
//!     target/release/examples/floor --nvml-lib target/release/libnvml_sim.so \
//!         --interval 100ms --duration 60s            (NVML_SIM_SCENARIO=healthy)
//!
//! Which calls: built from the same metric table the sampler reads (`gpuwatch::model::METRICS`)
//! and its counter cadences (`gpuwatch::sampler::COUNTERS`), with the same rules — one
//! field-values call for the table's fields (a field the GPU does not answer is dropped and its
//! row's fallback call made instead), one call per NVML function however many rows it answers, a
//! query the GPU does not support asked no more; per tick: the fast rows, a GPM sample and one
//! metrics call on GPUs with GPM (at its cadence), the XID event set polled (at most once a
//! second); per process interval: the
//! process lists, the MIG mode, the slow rows, the NVLinks (state and four error counters per
//! link, one field-values call for speeds and throughput); the energy / replay and PCIe byte
//! counters at their own multiples of it. With `NVML_SIM_CALL_COUNTS` set, nvml-sim counts each
//! function's calls so `bench/sampler.sh` can show that gpuwatch and the floor made the same.
//! It covers GPUs as `healthy` has them (with or without GPM and NVLink); MIG devices (their
//! listing and per-instance GPM) are not among its calls, so on a MIG scenario it makes fewer.
//!
//! Prints one JSON line: ticks, CPU seconds after start-up (getrusage), CPU per tick and per
//! device-sample, peak RSS (VmHWM) and the RSS right after `nvmlInit` and the device handles
//! (the library's own floor).

use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, RetirementCause, TemperatureSensor,
    TemperatureThreshold,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::{Device, GpmSample, Nvml};
use nvml_wrapper_sys::bindings::{nvmlGpmMetricsGet_t, NVML_GPM_METRICS_GET_VERSION};

use gpuwatch::model::{Metric, NvmlCall, Source, METRICS};
use gpuwatch::sampler::{gpm_sample_alloc, gpm_sample_get};

/// One NVML function's worth of rows (a call answering several rows is made once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Utilization,
    Memory,
    Temperature,
    TempThreshold,
    Power,
    PowerLimit,
    Energy,
    SmClock,
    MemClock,
    Throttle,
    Pstate,
    Fan,
    EccCorrected,
    EccUncorrected,
    RetiredSbe,
    RetiredDbe,
    RetiredPending,
    PcieRx,
    PcieTx,
    PcieReplay,
    Encoder,
    Decoder,
}

fn call_of(c: NvmlCall) -> Call {
    use NvmlCall as C;
    match c {
        C::UtilizationGpu | C::UtilizationMemory => Call::Utilization,
        C::MemoryUsed | C::MemoryFree | C::MemoryTotal | C::MemoryReserved => Call::Memory,
        C::TemperatureGpu => Call::Temperature,
        C::TemperatureSlowdown => Call::TempThreshold,
        C::PowerUsage => Call::Power,
        C::EnforcedPowerLimit => Call::PowerLimit,
        C::TotalEnergyConsumption => Call::Energy,
        C::ClockSm => Call::SmClock,
        C::ClockMem => Call::MemClock,
        C::ClockEventReasons => Call::Throttle,
        C::PerformanceState => Call::Pstate,
        C::FanSpeed => Call::Fan,
        C::EccCorrectedVolatile => Call::EccCorrected,
        C::EccUncorrectedVolatile => Call::EccUncorrected,
        C::RetiredPagesSbe => Call::RetiredSbe,
        C::RetiredPagesDbe => Call::RetiredDbe,
        C::RetiredPagesPending => Call::RetiredPending,
        C::PcieRx => Call::PcieRx,
        C::PcieTx => Call::PcieTx,
        C::PcieReplayCounter => Call::PcieReplay,
        C::EncoderUtilization => Call::Encoder,
        C::DecoderUtilization => Call::Decoder,
    }
}

/// Makes the call; only whether it answered matters.
fn make(d: &Device<'static>, c: Call) -> Result<(), NvmlError> {
    match c {
        Call::Utilization => d.utilization_rates().map(drop),
        Call::Memory => d.memory_info().map(drop),
        Call::Temperature => d.temperature(TemperatureSensor::Gpu).map(drop),
        Call::TempThreshold => d
            .temperature_threshold(TemperatureThreshold::Slowdown)
            .map(drop),
        Call::Power => d.power_usage().map(drop),
        Call::PowerLimit => d.enforced_power_limit().map(drop),
        Call::Energy => d.total_energy_consumption().map(drop),
        Call::SmClock => d.clock_info(Clock::SM).map(drop),
        Call::MemClock => d.clock_info(Clock::Memory).map(drop),
        Call::Throttle => d.current_throttle_reasons().map(drop),
        Call::Pstate => d.performance_state().map(drop),
        Call::Fan => d.fan_speed(0).map(drop),
        Call::EccCorrected => d
            .total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
            .map(drop),
        Call::EccUncorrected => d
            .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            .map(drop),
        Call::RetiredSbe => d
            .retired_pages(RetirementCause::MultipleSingleBitEccErrors)
            .map(drop),
        Call::RetiredDbe => d
            .retired_pages(RetirementCause::DoubleBitEccError)
            .map(drop),
        Call::RetiredPending => d.are_pages_pending_retired().map(drop),
        Call::PcieRx => d.pcie_throughput(PcieUtilCounter::Receive).map(drop),
        Call::PcieTx => d.pcie_throughput(PcieUtilCounter::Send).map(drop),
        Call::PcieReplay => d.pcie_replay_counter().map(drop),
        Call::Encoder => d.encoder_utilization().map(drop),
        Call::Decoder => d.decoder_utilization().map(drop),
    }
}

fn bit(m: Metric) -> u64 {
    1 << (m as u8)
}

/// An answer that means "not on this GPU": the query is asked no more (as the sampler does).
fn gone(r: &Result<(), NvmlError>) -> bool {
    matches!(
        r,
        Err(NvmlError::NotSupported
            | NvmlError::FunctionNotFound
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::NoPermission
            | NvmlError::InvalidArg)
    )
}

/// What is read of one class of rows: fields (in one call) and dedicated calls.
#[derive(Default)]
struct Plan {
    fields: Vec<(FieldId, Metric)>,
    calls: Vec<(Call, Vec<Metric>)>,
    /// The field ids asked with each skip set (per counter-class combination), made once.
    ids: Vec<(u64, Vec<FieldId>)>,
}

impl Plan {
    fn add_call(&mut self, c: Call, m: Metric) {
        match self.calls.iter_mut().find(|(x, _)| *x == c) {
            Some((_, ms)) => ms.push(m),
            None => self.calls.push((c, vec![m])),
        }
    }

    /// Reads the plan, leaving out the rows in `skip` (a per-metric mask); drops what the GPU
    /// does not answer.
    fn read(&mut self, d: &Device<'static>, skip: u64) {
        let pos = match self.ids.iter().position(|(k, _)| *k == skip) {
            Some(p) => p,
            None => {
                let ids = self
                    .fields
                    .iter()
                    .filter(|(_, m)| skip & bit(*m) == 0)
                    .map(|(f, _)| f.clone())
                    .collect();
                self.ids.push((skip, ids));
                self.ids.len() - 1
            }
        };
        if !self.ids[pos].1.is_empty() {
            let _ = d.field_values_for(&self.ids[pos].1);
        }
        self.calls.retain(|(c, ms)| {
            if ms.iter().all(|m| skip & bit(*m) != 0) {
                return true;
            }
            !gone(&make(d, *c))
        });
    }
}

struct Gpu {
    dev: Device<'static>,
    fast: Plan,
    slow: Plan,
    gpm: Option<(Vec<GpmSample<'static>>, Box<nvmlGpmMetricsGet_t>)>,
    mig_mode: bool,
    links: Vec<u32>,
    link_fields: Vec<FieldId>,
    /// Per link: the error counters it answers (NOT_SUPPORTED or no symbol: asked no more).
    counters_supported: Vec<[bool; 4]>,
    /// The listed processes seen so far: one `/proc` look each, and for one `/proc` does not
    /// show, one `nvmlSystemGetProcessName` (as the sampler names it).
    seen: Vec<u32>,
}

const LINK_COUNTERS: [ErrorCounter; 4] = [
    ErrorCounter::DlCrcFlit,
    ErrorCounter::DlCrcData,
    ErrorCounter::DlReplay,
    ErrorCounter::DlRecovery,
];

impl Gpu {
    /// Finds what this GPU answers, as the sampler's first reads do.
    fn new(nvml: &'static Nvml, dev: Device<'static>, gpm: bool) -> Gpu {
        let _ = dev.uuid();
        let _ = dev.name();
        let _ = dev.pci_info();
        let _ = dev.minor_number();
        // the table's fields, asked once: those not answered fall back to their calls
        let all: Vec<(FieldId, Metric, bool, Option<NvmlCall>)> = METRICS
            .iter()
            .filter_map(|d| match d.source {
                Source::Field(f) => Some((FieldId(f.field.id), d.id, f.slow, f.fallback)),
                _ => None,
            })
            .collect();
        let ids: Vec<FieldId> = all.iter().map(|a| a.0.clone()).collect();
        let answered: Vec<bool> = match dev.field_values_for(&ids) {
            Ok(s) => s
                .into_iter()
                .map(|s| s.is_ok_and(|s| s.value.is_ok()))
                .collect(),
            Err(_) => vec![false; ids.len()],
        };
        let (mut fast, mut slow) = (Plan::default(), Plan::default());
        for ((id, m, is_slow, fallback), ok) in all.into_iter().zip(answered) {
            if ok {
                if is_slow { &mut slow } else { &mut fast }
                    .fields
                    .push((id, m));
            } else if let Some(c) = fallback {
                if c.is_slow() { &mut slow } else { &mut fast }.add_call(call_of(c), m);
            }
        }
        for d in METRICS {
            if let Source::Nvml(c) = d.source {
                if c.is_slow() { &mut slow } else { &mut fast }.add_call(call_of(c), d.id);
            }
        }
        let gpm = (gpm && dev.gpm_support().unwrap_or(false))
            .then(|| {
                let a = gpm_sample_alloc(nvml).ok()?;
                let b = gpm_sample_alloc(nvml).ok()?;
                // SAFETY: a plain C struct of integers, doubles and pointers; zero is valid.
                let mut req: Box<nvmlGpmMetricsGet_t> = Box::new(unsafe { std::mem::zeroed() });
                let mut n = 0;
                for d in METRICS {
                    if let Source::Gpm(g) = d.source {
                        for id in g.ids() {
                            if let Some(slot) = req.metrics.get_mut(n) {
                                slot.metricId = id;
                                n += 1;
                            }
                        }
                    }
                }
                req.numMetrics = u32::try_from(n).unwrap_or(0);
                Some((vec![a, b], req))
            })
            .flatten();
        let mig_mode = dev.mig_mode().is_ok();
        let mut links = Vec::new();
        for l in 0..18 {
            let link = dev.link_wrapper_for(l);
            match link.is_active() {
                Ok(_) => {
                    let _ = link.version();
                    let _ = link.remote_pci_info();
                    if let Ok(sym) = nvml.lib().nvmlDeviceGetNvLinkRemoteDeviceType.as_ref() {
                        let mut kind = 0;
                        // SAFETY: this library's device handle and a live out value.
                        let _ = unsafe { sym(dev.handle(), l, &mut kind) };
                    }
                    links.push(l);
                }
                Err(NvmlError::InvalidArg) => break,
                Err(_) if l == 0 => break,
                Err(_) => {}
            }
        }
        let mut link_fields: Vec<FieldId> = links
            .iter()
            .filter_map(|&l| match l {
                0..=5 => Some(84 + l),
                6..=11 => Some(132 + l - 6),
                _ => None,
            })
            .map(FieldId)
            .collect();
        if !links.is_empty() {
            link_fields.extend([90, 138, 139].map(FieldId));
        }
        Gpu {
            dev,
            fast,
            slow,
            gpm,
            mig_mode,
            links,
            link_fields,
            counters_supported: vec![[true; 4]; 18],
            seen: Vec::new(),
        }
    }

    /// The tick's reads; `gpm`: the number of the GPM sample due at this tick, if one is.
    fn tick(&mut self, nvml: &'static Nvml, gpm: Option<u64>) {
        self.fast.read(&self.dev, 0);
        if let (Some((samples, req)), Some(n)) = (self.gpm.as_mut(), gpm) {
            let cur = (n % 2) as usize;
            if gpm_sample_get(nvml, &self.dev, &samples[cur]).is_ok() && n > 0 {
                if let Ok(sym) = nvml.lib().nvmlGpmMetricsGet.as_ref() {
                    req.version = NVML_GPM_METRICS_GET_VERSION;
                    // SAFETY: both samples belong to this library and outlive the call.
                    unsafe {
                        req.sample1 = samples[1 - cur].handle();
                        req.sample2 = samples[cur].handle();
                        sym(&mut **req);
                    }
                }
            }
        }
    }

    fn slow(&mut self, skip: u64) {
        let mut pids: Vec<u32> = Vec::new();
        for list in [
            self.dev.running_compute_processes(),
            self.dev.running_graphics_processes(),
        ]
        .into_iter()
        .flatten()
        {
            pids.extend(list.iter().map(|p| p.pid));
        }
        self.seen.retain(|p| pids.contains(p));
        for pid in pids {
            if !self.seen.contains(&pid) {
                self.seen.push(pid);
                if std::fs::symlink_metadata(format!("/proc/{pid}")).is_err() {
                    let _ = self.dev.nvml().sys_process_name(pid, 256);
                }
            }
        }
        if self.mig_mode {
            let _ = self.dev.mig_mode();
        }
        self.slow.read(&self.dev, skip);
        for &l in &self.links {
            let link = self.dev.link_wrapper_for(l);
            let _ = link.is_active();
            let supported = &mut self.counters_supported[l as usize];
            for (i, c) in LINK_COUNTERS.iter().enumerate() {
                if supported[i]
                    && matches!(
                        link.error_counter(*c),
                        Err(NvmlError::NotSupported
                            | NvmlError::FunctionNotFound
                            | NvmlError::FailedToLoadSymbol(_))
                    )
                {
                    supported[i] = false;
                }
            }
        }
        if !self.link_fields.is_empty() {
            let _ = self.dev.field_values_for(&self.link_fields);
        }
    }
}

fn cpu_s() -> f64 {
    // SAFETY: getrusage writes the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn status_kib(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn duration(text: &str) -> Duration {
    let t = text.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .parse()
        .unwrap_or_else(|_| panic!("cannot read duration {text:?}"));
    Duration::from_secs_f64(v * scale)
}

fn main() {
    let mut lib = None;
    let mut interval = Duration::from_secs(1);
    let mut process_interval = gpuwatch::sampler::DEFAULT_PROCESS_INTERVAL;
    let mut run_for = Duration::from_secs(60);
    let mut warm = Duration::ZERO;
    let mut gpm = true;
    // as `record --gpm-interval` / `[daemon] gpm_interval`; zero: every tick
    let mut gpm_every = Duration::ZERO;
    // metrics not read (the daemon's `SamplerConfig::unread`: the optional reads no rule names
    // while /metrics is off), e.g. `--unread pcie_rx,pcie_tx,pcie_replay`
    let mut unread = 0u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--nvml-lib" => lib = Some(val()),
            "--interval" => interval = duration(&val()),
            "--process-interval" => process_interval = duration(&val()),
            "--duration" => run_for = duration(&val()),
            "--warm" => warm = duration(&val()),
            "--no-gpm" => gpm = false,
            "--gpm-interval" => gpm_every = duration(&val()),
            "--unread" => {
                for key in val().split(',').filter(|k| !k.is_empty()) {
                    let m = gpuwatch::model::Metric::from_key(key)
                        .unwrap_or_else(|| panic!("--unread: no metric {key:?}"));
                    assert!(
                        gpuwatch::sampler::OPTIONAL_READS.contains(&m),
                        "--unread {key}: only {:?} are left out by the daemon",
                        gpuwatch::sampler::OPTIONAL_READS
                    );
                    unread |= bit(m);
                }
            }
            _ => panic!("unknown argument {a}"),
        }
    }
    let nvml = match lib {
        Some(l) => Nvml::builder().lib_path(l.as_ref()).init(),
        None => Nvml::init(),
    };
    let nvml: &'static Nvml = Box::leak(Box::new(nvml.expect("nvmlInit")));
    let count = nvml.device_count().expect("device count");
    let devices: Vec<Device<'static>> = (0..count)
        .filter_map(|i| nvml.device_by_index(i).ok())
        .collect();
    let init_rss = status_kib("VmRSS:");
    let mut gpus: Vec<Gpu> = devices
        .into_iter()
        .map(|d| Gpu::new(nvml, d, gpm))
        .collect();
    // the XID events, polled once a tick
    let mut events = nvml.create_event_set().ok();
    for g in &gpus {
        let Some(set) = events.take() else { break };
        events = match g.dev.supported_event_types() {
            Ok(_) => g
                .dev
                .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                .ok(),
            Err(_) => Some(set),
        };
    }
    let process_ms = i64::try_from(process_interval.as_millis())
        .unwrap_or(i64::MAX)
        .max(1);
    // per counter class: its metrics as a mask, its cadence, when it was last read
    let mut counters: Vec<(u64, i64, Option<Instant>)> = gpuwatch::sampler::COUNTERS
        .iter()
        .map(|(ms, n)| {
            let mask = ms.iter().fold(0, |m, x| m | bit(*x));
            (
                mask,
                gpuwatch::sampler::counter_every_ms(*n, process_ms),
                None,
            )
        })
        .collect();
    let start = Instant::now();
    let mut cpu0 = None;
    let (mut n, mut measured) = (0u64, 0u64);
    let mut last_round: Option<Instant> = None;
    let (mut last_gpm, mut gpm_n): (Option<Instant>, u64) = (None, 0);
    let mut last_xid: Option<Instant> = None;
    while start.elapsed() < run_for {
        let due = start + interval * u32::try_from(n).unwrap_or(u32::MAX);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        if cpu0.is_none() && start.elapsed() >= warm {
            cpu0 = Some(cpu_s());
        }
        // a sample due within half a tick (at most 50 ms) of the cadence is taken, as in the
        // sampler
        let now = Instant::now();
        let slack = (interval / 2).min(Duration::from_millis(50));
        let gpm_due = last_gpm.is_none_or(|t: Instant| {
            now.duration_since(t) >= gpm_every.saturating_sub(slack).max(slack)
        });
        if gpm_due {
            last_gpm = Some(now);
            gpm_n += 1;
        }
        for g in &mut gpus {
            g.tick(nvml, gpm_due.then_some(gpm_n - 1));
        }
        // the XID events, at most once a second (as the sampler's XID thread)
        if let Some(set) = events.as_ref() {
            if last_xid.is_none_or(|t: Instant| {
                t.elapsed() + Duration::from_millis(50) >= gpuwatch::sampler::XID_DRAIN_EVERY
            }) {
                last_xid = Some(Instant::now());
                let _ = set.wait(0);
            }
        }
        let now = Instant::now();
        if last_round.is_none_or(|t| now.duration_since(t) >= process_interval) {
            last_round = Some(now);
            let mut skip = unread;
            for (mask, every_ms, at) in &mut counters {
                // a little early is due, as in the sampler
                let every =
                    Duration::from_millis(u64::try_from(*every_ms - process_ms / 2).unwrap_or(0));
                if at.is_none_or(|t| now.duration_since(t) >= every) {
                    *at = Some(now);
                } else {
                    skip |= *mask;
                }
            }
            for g in &mut gpus {
                g.slow(skip);
            }
        }
        if cpu0.is_some() {
            measured += 1;
        }
        n += 1;
    }
    let cpu = cpu_s() - cpu0.unwrap_or(0.0);
    let gpus_n = gpus.len().max(1) as f64;
    let per_tick = cpu / measured.max(1) as f64;
    println!(
        "{{\"ticks\": {n}, \"measured_ticks\": {measured}, \"gpus\": {}, \"cpu_s\": {cpu:.6}, \"cpu_per_tick_us\": {:.2}, \"cpu_per_device_sample_us\": {:.2}, \"peak_rss_kib\": {}, \"init_rss_kib\": {init_rss}}}",
        gpus.len(),
        per_tick * 1e6,
        per_tick * 1e6 / gpus_n,
        status_kib("VmHWM:"),
    );
}
