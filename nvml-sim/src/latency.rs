//! Per-function call latency, like a real driver: defaults per NVML symbol, a scenario
//! `[latency]` table and `NVML_SIM_LATENCY` overrides, resolved once per symbol and cached.
//!
//! Patterns are exact symbol names, `prefix*` or `*`; the most specific match wins (exact, then
//! the longest prefix, then `*`).

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::Duration;

/// What one call of a symbol costs: wall time, and how much of it the driver spends on the CPU
/// of the calling thread (a real driver's ioctl that polls in the kernel burns CPU for as long as
/// it takes; one that waits for the GPU sleeps).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cost {
    pub wall: Duration,
    /// At most `wall`.
    pub cpu: Duration,
}

impl Cost {
    const fn sleeps(wall: Duration) -> Cost {
        Cost {
            wall,
            cpu: Duration::ZERO,
        }
    }

    const fn spins(cpu: Duration) -> Cost {
        Cost { wall: cpu, cpu }
    }

    pub fn is_zero(&self) -> bool {
        self.wall.is_zero() && self.cpu.is_zero()
    }
}

pub(crate) const fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

/// Default cost of one symbol: measured on an NVIDIA H200 with driver 580.159.04 (persistence
/// mode on) by `bench/real-gpu.sh`, medians of 30–50 calls, where that GPU answers; public figures
/// where it does not (see the README's *Real-driver behaviour* for each source).
pub fn default_cost(name: &str) -> Cost {
    const INIT: &[&str] = &["nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags"];
    const PROCESS_PREFIXES: &[&str] = &[
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses",
        "nvmlDeviceGetMPSComputeRunningProcesses",
    ];
    if INIT.contains(&name) {
        // 8.6–10.7 ms, 8.3 ms of it CPU (without persistence mode: hundreds of ms)
        Cost {
            wall: Duration::from_millis(10),
            cpu: Duration::from_millis(8),
        }
    } else if name == "nvmlDeviceGetPcieThroughput" {
        // a 20 ms sampling window: 20.7 ms, 0.64 ms of it CPU
        Cost {
            wall: Duration::from_millis(20),
            cpu: us(600),
        }
    } else if name == "nvmlDeviceGetProcessUtilization"
        || PROCESS_PREFIXES.iter().any(|p| name.starts_with(p))
    {
        // "a few ms on busy GPUs" (nvitop#65); the idle H200 answered in 5 µs
        Cost::sleeps(Duration::from_millis(3))
    } else if name == "nvmlDeviceGetTotalEnergyConsumption" {
        Cost::spins(Duration::from_millis(3))
    } else if name.starts_with("nvmlDeviceGetApplicationsClock")
        || name.starts_with("nvmlDeviceGetDefaultApplicationsClock")
    {
        Cost::spins(us(800))
    } else if name == "nvmlDeviceGetPcieReplayCounter" {
        Cost::spins(us(170))
    } else if name == "nvmlDeviceGetEccMode" {
        Cost::spins(us(130))
    } else if name == "nvmlGpmSampleGet" || name == "nvmlGpmMigSampleGet" {
        // ESTIMATE, not measured (no Hopper GPU at hand yet; `bench/real-gpu.sh` step 4
        // measures it): a GPM snapshot is a driver RPC that copies the GPU's activity counters
        // out; the RPC-backed getters measured on the H200 (PCIe counters, replay counter, ECC
        // mode) cost 130–170 µs, all of it CPU — a sample with its counter copy, 200 µs.
        Cost::spins(us(200))
    } else if name == "nvmlGpmMetricsGet" {
        // ESTIMATE: host arithmetic over two sample buffers, no driver round trip.
        Cost::spins(us(20))
    } else if name == "nvmlDeviceGetFieldValues" {
        // plus each field's own cost (`ffi::device::field_cost`)
        Cost::sleeps(us(1))
    } else if name.starts_with("nvmlDeviceGetMemoryInfo") || name == "nvmlDeviceGetPersistenceMode"
    {
        Cost::sleeps(us(4))
    } else if name.starts_with("nvmlEventSetWait") || name == "nvmlErrorString" {
        Cost::default()
    } else {
        // Getters the driver answers from cached values (utilization, power, clocks,
        // temperature, reasons, pstate, ECC counters, video engines) and identity calls: 0.2–0.8
        // µs each on the H200.
        Cost::sleeps(us(1))
    }
}

/// Default wall latency of one symbol (see [`default_cost`]).
pub fn default_latency(name: &str) -> Duration {
    default_cost(name).wall
}

/// Parses a duration: `"40us"`, `"3ms"`, `"0.2s"`, `"500ns"`, or a bare number of milliseconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == 'e' || c == 'E'))
        .unwrap_or(t.len());
    // "1e" would eat the unit's first letter in the split above; units never start with e
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("cannot read duration `{text}` (e.g. \"40us\", \"3ms\", \"0.2s\")"))?;
    let factor_ms = match unit.trim() {
        "" | "ms" => 1.0,
        "us" | "µs" => 1e-3,
        "ns" => 1e-6,
        "s" => 1e3,
        other => {
            return Err(format!(
                "duration `{text}`: unknown unit `{other}` (ns, us, ms, s; a bare number is ms)"
            ))
        }
    };
    millis(value * factor_ms).ok_or_else(|| format!("duration `{text}` must be >= 0"))
}

/// A duration of `ms` milliseconds, if finite and >= 0.
pub fn millis(ms: f64) -> Option<Duration> {
    (ms.is_finite() && ms >= 0.0).then(|| Duration::from_secs_f64(ms / 1000.0))
}

/// Whether a pattern (exact, `prefix*` or `*`) is a valid key.
pub fn valid_pattern(p: &str) -> bool {
    p == "*" || (p.starts_with("nvml") && !p[..p.len() - 1].contains('*'))
}

/// How specific a pattern's match of `name` is: exact > longer prefix > `*`; `None` = no match.
pub fn specificity(pattern: &str, name: &str) -> Option<usize> {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix).then_some(prefix.len()),
        None => (pattern == name).then_some(usize::MAX),
    }
}

/// Latency rules: scenario table, env overrides, the off switch; with a per-symbol cache.
#[derive(Debug, Default)]
pub struct Latency {
    /// `NVML_SIM_LATENCY=0`: every latency is zero.
    pub off: bool,
    /// `NVML_SIM_LATENCY=name=dur,...` (wins over the scenario and defaults).
    pub env: Vec<(String, Duration)>,
    /// The scenario's `[latency]` table.
    pub scenario: Vec<(String, Duration)>,
    cache: RwLock<HashMap<usize, Cost>>,
}

impl Latency {
    /// Rules from a scenario table and an optional `NVML_SIM_LATENCY` value.
    pub fn new(scenario: Vec<(String, Duration)>, env: Option<&str>) -> Result<Latency, String> {
        let mut l = Latency {
            scenario,
            ..Latency::default()
        };
        if let Some(v) = env {
            let t = v.trim();
            if t == "0" || t.eq_ignore_ascii_case("off") {
                l.off = true;
            } else {
                l.env = parse_env(t).map_err(|m| format!("NVML_SIM_LATENCY={v}: {m}"))?;
            }
        }
        Ok(l)
    }

    /// Resolves the cost of `name` (uncached): an override (environment, then scenario) is wall
    /// time slept; a default may spin part of it ([`default_cost`]).
    pub fn resolve(&self, name: &str) -> Cost {
        if self.off {
            return Cost::default();
        }
        best(&self.env, name)
            .or_else(|| best(&self.scenario, name))
            .map(Cost::sleeps)
            .unwrap_or_else(|| default_cost(name))
    }

    /// Whether the fields of `nvmlDeviceGetFieldValues` add their own cost (`ffi::device`): with
    /// the defaults, not when latency is off or the call's latency is overridden.
    pub fn field_costs(&self) -> bool {
        const NAME: &str = "nvmlDeviceGetFieldValues";
        !self.off && best(&self.env, NAME).is_none() && best(&self.scenario, NAME).is_none()
    }

    /// The cost of an export, resolved once per symbol (keyed by the name's address).
    pub fn of(&self, name: &'static str) -> Cost {
        let key = name.as_ptr() as usize;
        if let Some(d) = self
            .cache
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return *d;
        }
        let d = self.resolve(name);
        self.cache
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, d);
        d
    }
}

/// The most specific rule matching `name`.
fn best(rules: &[(String, Duration)], name: &str) -> Option<Duration> {
    rules
        .iter()
        .filter_map(|(p, d)| specificity(p, name).map(|s| (s, *d)))
        .max_by_key(|(s, _)| *s)
        .map(|(_, d)| d)
}

/// Parses `name=dur,name=dur` (names: exact, `prefix*` or `*`).
pub fn parse_env(text: &str) -> Result<Vec<(String, Duration)>, String> {
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, value) = item
            .split_once('=')
            .ok_or_else(|| format!("`{item}`: expected NAME=DURATION"))?;
        let name = name.trim();
        if !valid_pattern(name) {
            return Err(format!(
                "`{name}` is not an NVML symbol name, `prefix*` or `*`"
            ));
        }
        out.push((name.to_string(), parse_duration(value)?));
    }
    Ok(out)
}

/// Latencies shorter than this are not slept one by one: a thread's short latencies add up and
/// are slept together once they reach it (see [`spend`]).
pub const COALESCE: Duration = Duration::from_millis(1);

thread_local! {
    /// Latency this thread owes (positive) or has overslept (negative), ns.
    static DEBT_NS: std::cell::Cell<i64> = const { std::cell::Cell::new(0) };
}

/// Spends `latency` of real wall time in the calling thread, as a driver's call would. A latency
/// of [`COALESCE`] or more is slept at once. Shorter ones (the tens of µs of cheap getters) are
/// owed and slept together when the thread's debt reaches [`COALESCE`]: sleeping 20 µs costs a
/// timer and two context switches — tens of µs of kernel CPU on a VM, and a 50–60 µs overshoot
/// from the timer slack — which would charge both the simulated driver's clients with CPU a real
/// driver's ioctl does not cost, and make every cheap call 3–4× too slow. Over any run the wall
/// time spent equals the sum of the latencies (an oversleep is credited to the next calls); a
/// single cheap call may return at once or take about a millisecond.
pub fn spend(latency: Duration) {
    let ns = i64::try_from(latency.as_nanos()).unwrap_or(i64::MAX);
    if latency >= COALESCE {
        sleep_ns(ns);
        return;
    }
    let debt = DEBT_NS.with(|d| {
        let v = d.get().saturating_add(ns);
        d.set(v);
        v
    });
    let threshold = i64::try_from(COALESCE.as_nanos()).unwrap_or(i64::MAX);
    if debt >= threshold {
        let slept = sleep_ns(debt);
        DEBT_NS.with(|d| d.set(d.get().saturating_sub(slept)));
    }
}

/// Spends a call's cost: its CPU part busy in this thread (as the driver's polling ioctl would
/// be), the rest of its wall time as [`spend`] does.
pub fn spend_cost(cost: Cost) {
    spin(cost.cpu);
    spend(cost.wall.saturating_sub(cost.cpu));
}

/// Keeps the calling thread busy on the CPU for `d`.
pub fn spin(d: Duration) {
    if d.is_zero() {
        return;
    }
    let t = std::time::Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Sleeps about `ns`; returns the nanoseconds actually slept.
fn sleep_ns(ns: i64) -> i64 {
    let t = std::time::Instant::now();
    std::thread::sleep(Duration::from_nanos(u64::try_from(ns).unwrap_or(0)));
    i64::try_from(t.elapsed().as_nanos()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let ms = Duration::from_millis;
        assert_eq!(default_latency("nvmlInit_v2"), ms(10));
        assert_eq!(default_cost("nvmlInitWithFlags").cpu, ms(8));
        assert_eq!(default_latency("nvmlDeviceGetPcieThroughput"), ms(20));
        assert_eq!(
            default_latency("nvmlDeviceGetComputeRunningProcesses_v3"),
            ms(3)
        );
        assert_eq!(
            default_latency("nvmlDeviceGetMPSComputeRunningProcesses_v2"),
            ms(3)
        );
        assert_eq!(
            default_cost("nvmlDeviceGetTotalEnergyConsumption"),
            Cost::spins(ms(3))
        );
        assert_eq!(default_latency("nvmlDeviceGetFieldValues"), us(1));
        assert_eq!(default_latency("nvmlDeviceGetMemoryInfo_v2"), us(4));
        assert_eq!(default_latency("nvmlDeviceGetName"), us(1));
        assert_eq!(default_latency("nvmlEventSetWait_v2"), Duration::ZERO);
        assert_eq!(default_cost("nvmlGpmSampleGet"), Cost::spins(us(200)));
        assert_eq!(default_cost("nvmlGpmMetricsGet"), Cost::spins(us(20)));
        assert_eq!(default_latency("nvmlGpmSampleAlloc"), us(1));
        for name in [
            "nvmlInit_v2",
            "nvmlDeviceGetPcieThroughput",
            "nvmlDeviceGetEccMode",
        ] {
            let c = default_cost(name);
            assert!(c.cpu <= c.wall, "{name}");
        }
    }

    #[test]
    fn overrides_sleep_and_switch_field_costs_off() {
        let l = Latency::new(vec![], Some("nvmlDeviceGetTotalEnergyConsumption=2ms")).unwrap();
        assert_eq!(
            l.resolve("nvmlDeviceGetTotalEnergyConsumption"),
            Cost::sleeps(Duration::from_millis(2))
        );
        assert!(l.field_costs());
        let l = Latency::new(vec![], Some("nvmlDeviceGet*=1ms")).unwrap();
        assert!(!l.field_costs());
        let l = Latency::new(vec![], Some("0")).unwrap();
        assert!(!l.field_costs());
        assert!(l.resolve("nvmlInit_v2").is_zero());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("40us").unwrap(), Duration::from_micros(40));
        assert_eq!(parse_duration("3ms").unwrap(), Duration::from_millis(3));
        assert_eq!(parse_duration("0.2s").unwrap(), Duration::from_millis(200));
        assert_eq!(parse_duration("5").unwrap(), Duration::from_millis(5));
        assert_eq!(
            parse_duration("1.5 ms").unwrap(),
            Duration::from_micros(1500)
        );
        assert!(parse_duration("3 weeks").is_err());
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("-1ms").is_err());
    }

    #[test]
    fn most_specific_match_wins_and_env_overrides() {
        let scenario = vec![
            ("*".to_string(), Duration::from_millis(1)),
            ("nvmlDeviceGet*".to_string(), Duration::from_millis(2)),
            ("nvmlDeviceGetPcie*".to_string(), Duration::from_millis(3)),
            (
                "nvmlDeviceGetPcieThroughput".to_string(),
                Duration::from_millis(4),
            ),
        ];
        let l = Latency::new(scenario.clone(), None).unwrap();
        assert_eq!(
            l.resolve("nvmlDeviceGetPcieThroughput").wall,
            Duration::from_millis(4)
        );
        assert_eq!(
            l.resolve("nvmlDeviceGetPcieReplayCounter").wall,
            Duration::from_millis(3)
        );
        assert_eq!(
            l.resolve("nvmlDeviceGetName").wall,
            Duration::from_millis(2)
        );
        assert_eq!(l.resolve("nvmlShutdown").wall, Duration::from_millis(1));
        let l = Latency::new(
            scenario.clone(),
            Some("nvmlDeviceGetPcieThroughput=7ms, nvmlShut*=0"),
        )
        .unwrap();
        assert_eq!(
            l.resolve("nvmlDeviceGetPcieThroughput").wall,
            Duration::from_millis(7)
        );
        assert!(l.resolve("nvmlShutdown").is_zero());
        assert_eq!(l.of("nvmlDeviceGetName").wall, Duration::from_millis(2));
        assert_eq!(l.of("nvmlDeviceGetName").wall, Duration::from_millis(2));
        let l = Latency::new(scenario, Some("off")).unwrap();
        assert!(l.resolve("nvmlDeviceGetPcieThroughput").is_zero());
        assert!(l.resolve("nvmlInit_v2").is_zero());
        let none = Latency::new(Vec::new(), None).unwrap();
        assert_eq!(none.resolve("nvmlInit"), default_cost("nvmlInit"));
        let e = Latency::new(Vec::new(), Some("nvmlX=fast")).unwrap_err();
        assert!(e.starts_with("NVML_SIM_LATENCY=nvmlX=fast: "), "{e}");
        assert!(Latency::new(Vec::new(), Some("GetName=1ms")).is_err());
        assert!(Latency::new(Vec::new(), Some("nvmlDeviceGetName")).is_err());
    }
}
