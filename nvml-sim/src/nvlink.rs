//! NVLink: each GPU's links (how many, their speed and NVLink version, what is at the far end),
//! links going down or training at a lower speed at scenario times, the per-link error counters
//! (replay, recovery, CRC flit, CRC data) climbing at scenario rates, and the throughput
//! counters (fields 138–141: the `nvlink_tx_kb_s` / `nvlink_rx_kb_s` signals integrated over
//! scenario time, spread over the links that are up).
//!
//! Scenario keys (a top-level `[nvlink]` table; without it a GPU gets the links its name implies,
//! see [`default_links`]):
//!
//! ```toml
//! [nvlink]
//! links = 18             # links per GPU (0 = no NVLink: every NVLink call NOT_SUPPORTED)
//! topology = "switch"    # "switch" (HGX/DGX: every link to an NVSwitch), "mesh" (GPU-GPU
//!                        # links, DGX-1 style) or "pairs" (NVLink bridges: GPU 2i - GPU 2i+1)
//! speed_mbps = 26562     # per-link speed (MB/s) when trained at full speed
//! version = 4            # NVLink generation (1-5; the driver answers nvmlNvlinkVersion_t)
//! gpus = [0, 1]          # only these GPUs have NVLink (default: all)
//!
//! [[nvlink.event]]       # a link changes state (both ends of a GPU-GPU link)
//! at_s = 120
//! gpu = 3
//! peer = 5               # the GPU's first link to GPU 5 (mesh), or `link = 5`
//! state = "down"         # "down" or "up"
//! speed_mbps = 13281     # optional: the speed it trains at from now on (when up)
//!
//! [[nvlink.errors]]      # error counters climbing on one link (the receiving end)
//! gpu = 3
//! peer = 5               # or `link = 5`
//! from_s = 60
//! until_s = 600          # default: for ever
//! crc_flit_per_s = 20
//! crc_data_per_s = 2
//! replay_per_s = 1
//! recovery_per_s = 0.05
//! ```

use std::collections::HashMap;
use std::sync::Mutex;

use crate::scenario::{DeviceSpec, Metric};
use crate::sim::Sim;

/// `NVML_NVLINK_MAX_LINKS`.
pub const MAX_LINKS: u32 = 18;

/// What is at the far end of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remote {
    /// Another GPU of the scenario (its scenario index) and its link.
    Gpu { gpu: u32, link: u32 },
    /// An NVSwitch (its PCI bus number, domain 0).
    Switch { bus: u32 },
}

/// One link of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkSpec {
    pub remote: Remote,
    pub speed_mbps: u32,
    pub version: u32,
}

/// A link changes state at a scenario time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkEvent {
    pub at_s: f64,
    pub gpu: u32,
    pub link: u32,
    pub up: bool,
    pub speed_mbps: Option<u32>,
}

/// Error counters climbing on one link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkErrors {
    pub gpu: u32,
    pub link: u32,
    pub from_s: f64,
    pub until_s: f64,
    /// Per second: replay, recovery, CRC flit, CRC data (NVML's counter order).
    pub per_s: [f64; 4],
}

/// The scenario's NVLink: links by scenario GPU, events, error rates.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Nvlink {
    pub links: Vec<Vec<LinkSpec>>,
    pub events: Vec<LinkEvent>,
    pub errors: Vec<LinkErrors>,
}

/// How the links of a scenario's GPUs are wired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Topology {
    /// HGX / DGX: every link to an NVSwitch.
    Switch,
    /// GPU-GPU links spread over every other GPU (DGX-1 style hybrid cube mesh).
    Mesh,
    /// NVLink bridges: GPU 2i and 2i+1, every link to the other.
    Pairs,
}

/// `nvmlNvlinkVersion_t`, what `nvmlDeviceGetNvLinkVersion` answers, for an NVLink generation:
/// 1 → `1_0` (1), 2 → `2_0` (2), 3 → `3_1` (5: what A100 and GA102 boards answer,
/// open-mpi/hwloc#658, Syllo/nvtop#469), 4 → `4_0` (6), 5 → `5_0` (7).
pub fn nvml_version(generation: u32) -> u32 {
    match generation {
        1 => 1,
        2 => 2,
        3 => 5,
        4 => 6,
        5 => 7,
        _ => 0,
    }
}

/// NVSwitch bus numbers of the switch topology (four switches, as on an HGX H100 8-GPU board;
/// the numbers are this simulator's).
pub const SWITCH_BUSES: [u32; 4] = [0x05, 0x06, 0x07, 0x08];

/// Links a GPU has by its name: H100 SXM (HBM3), H200 and B200 boards 18 (NVLink 4 at 26,562 MB/s, NVLink 5
/// at 53,125 MB/s), A100 SXM 12 (NVLink 3 at 25,000 MB/s); PCIe boards, NVL bridges and every
/// other GPU none. `(links, version, speed MB/s)`.
pub fn default_links(name: &str) -> (u32, u32, u32) {
    let n = name.to_ascii_uppercase();
    if n.contains("PCIE") || n.contains("NVL") {
        return (0, 0, 0);
    }
    if n.contains("B200") {
        (18, 5, 53_125)
    } else if n.contains("H100") && (n.contains("HBM3") || n.contains("SXM")) || n.contains("H200")
    {
        (18, 4, 26_562)
    } else if n.contains("A100") && n.contains("SXM") {
        (12, 3, 25_000)
    } else {
        (0, 0, 0)
    }
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNvlink {
    links: Option<u32>,
    topology: Option<String>,
    speed_mbps: Option<u32>,
    version: Option<u32>,
    gpus: Option<Vec<u32>>,
    #[serde(default)]
    event: Vec<RawEvent>,
    #[serde(default)]
    errors: Vec<RawErrors>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEvent {
    at_s: f64,
    gpu: u32,
    link: Option<u32>,
    peer: Option<u32>,
    state: String,
    speed_mbps: Option<u32>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawErrors {
    gpu: u32,
    link: Option<u32>,
    peer: Option<u32>,
    from_s: Option<f64>,
    until_s: Option<f64>,
    crc_flit_per_s: Option<f64>,
    crc_data_per_s: Option<f64>,
    replay_per_s: Option<f64>,
    recovery_per_s: Option<f64>,
}

/// Resolves the `[nvlink]` table (absent: the defaults by name) against the devices; an error
/// is a message naming the key.
pub fn resolve(raw: Option<toml::Value>, devices: &[DeviceSpec]) -> Result<Nvlink, String> {
    let raw: RawNvlink = match raw {
        Some(v) => v
            .try_into()
            .map_err(|e: toml::de::Error| format!("`nvlink`: {}", e.message().trim()))?,
        None => RawNvlink::default(),
    };
    let n = devices.len() as u32;
    let topology = match raw.topology.as_deref() {
        None | Some("switch") => Topology::Switch,
        Some("mesh") => Topology::Mesh,
        Some("pairs") => Topology::Pairs,
        Some(other) => {
            return Err(format!(
                "`nvlink.topology`: \"{other}\" (expected \"switch\", \"mesh\" or \"pairs\")"
            ))
        }
    };
    if topology == Topology::Mesh && !n.is_power_of_two() {
        return Err(format!(
            "`nvlink.topology = \"mesh\"` needs 2, 4, 8, … GPUs (the scenario has {n})"
        ));
    }
    if topology == Topology::Pairs && n % 2 != 0 {
        return Err(format!(
            "`nvlink.topology = \"pairs\"` needs an even number of GPUs (the scenario has {n})"
        ));
    }
    if raw.version.is_some_and(|v| !(1..=5).contains(&v)) {
        return Err("`nvlink.version`: an NVLink generation, 1 to 5".into());
    }
    if raw.links.is_some_and(|l| l > MAX_LINKS) {
        return Err(format!("`nvlink.links`: at most {MAX_LINKS}"));
    }
    if let Some(g) = raw.gpus.iter().flatten().find(|g| **g >= n) {
        return Err(format!("`nvlink.gpus`: no GPU {g}"));
    }
    let mut links = Vec::with_capacity(devices.len());
    for (g, d) in devices.iter().enumerate() {
        let g = g as u32;
        let (l, v, s) = default_links(&d.name);
        let count = if raw.gpus.as_ref().is_some_and(|gs| !gs.contains(&g)) {
            0
        } else {
            raw.links.unwrap_or(l)
        };
        let version = raw.version.unwrap_or(if v == 0 { 4 } else { v });
        let speed = raw.speed_mbps.unwrap_or(if s == 0 { 26_562 } else { s });
        let mut mine = Vec::new();
        for k in 0..count {
            let remote = if topology == Topology::Mesh && n > 1 {
                // link k goes to GPU g XOR d, d = 1 … n-1 in turn: symmetric (the peer's link k
                // comes back), and every pair gets about the same number of links
                let peer = g ^ (1 + k % (n - 1));
                Remote::Gpu { gpu: peer, link: k }
            } else if topology == Topology::Pairs {
                // NVLink bridges (A100 / H100 PCIe): every link to the other GPU of the pair
                Remote::Gpu {
                    gpu: g ^ 1,
                    link: k,
                }
            } else {
                // HGX: links split over the four NVSwitches (5, 4, 4, 5 of 18)
                let sw = match k * 4 / count.max(1) {
                    i @ 0..=3 => i as usize,
                    _ => 3,
                };
                Remote::Switch {
                    bus: SWITCH_BUSES[sw],
                }
            };
            mine.push(LinkSpec {
                remote,
                speed_mbps: speed,
                version,
            });
        }
        links.push(mine);
    }
    let pick =
        |gpu: u32, link: Option<u32>, peer: Option<u32>, what: &str| -> Result<u32, String> {
            let Some(mine) = links.get(gpu as usize) else {
                return Err(format!("`nvlink.{what}`: no GPU {gpu}"));
            };
            match (link, peer) {
                (Some(l), None) if (l as usize) < mine.len() => Ok(l),
                (Some(l), None) => Err(format!("`nvlink.{what}`: GPU {gpu} has no link {l}")),
                (None, Some(p)) => mine
                    .iter()
                    .position(|s| matches!(s.remote, Remote::Gpu { gpu, .. } if gpu == p))
                    .map(|l| l as u32)
                    .ok_or_else(|| format!("`nvlink.{what}`: GPU {gpu} has no link to GPU {p}")),
                _ => Err(format!("`nvlink.{what}`: give one of `link` and `peer`")),
            }
        };
    let mut events = Vec::new();
    for e in &raw.event {
        let link = pick(e.gpu, e.link, e.peer, "event")?;
        let up = match e.state.as_str() {
            "up" => true,
            "down" => false,
            s => {
                return Err(format!(
                    "`nvlink.event.state`: \"{s}\" (expected \"up\" or \"down\")"
                ))
            }
        };
        let ev = LinkEvent {
            at_s: e.at_s,
            gpu: e.gpu,
            link,
            up,
            speed_mbps: e.speed_mbps,
        };
        events.push(ev);
        // a GPU-GPU link is one cable: the far end changes with it
        if let Remote::Gpu { gpu, link } = links[e.gpu as usize][link as usize].remote {
            events.push(LinkEvent { gpu, link, ..ev });
        }
    }
    events.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    let mut errors = Vec::new();
    for e in &raw.errors {
        let link = pick(e.gpu, e.link, e.peer, "errors")?;
        let per_s = [
            e.replay_per_s.unwrap_or(0.0),
            e.recovery_per_s.unwrap_or(0.0),
            e.crc_flit_per_s.unwrap_or(0.0),
            e.crc_data_per_s.unwrap_or(0.0),
        ];
        if per_s.iter().any(|r| !r.is_finite() || *r < 0.0) {
            return Err("`nvlink.errors`: rates are numbers ≥ 0".into());
        }
        errors.push(LinkErrors {
            gpu: e.gpu,
            link,
            from_s: e.from_s.unwrap_or(0.0),
            until_s: e.until_s.unwrap_or(f64::INFINITY),
            per_s,
        });
    }
    Ok(Nvlink {
        links,
        events,
        errors,
    })
}

impl Nvlink {
    /// The links of scenario GPU `gpu` (empty: no NVLink).
    pub fn links_of(&self, gpu: usize) -> &[LinkSpec] {
        self.links.get(gpu).map_or(&[], Vec::as_slice)
    }

    /// Whether link `link` of `gpu` is up at `t_s`, and its speed (MB/s).
    pub fn state(&self, gpu: usize, link: u32, t_s: f64) -> (bool, u32) {
        let Some(spec) = self.links_of(gpu).get(link as usize) else {
            return (false, 0);
        };
        let (mut up, mut speed) = (true, spec.speed_mbps);
        for e in self
            .events
            .iter()
            .filter(|e| e.gpu as usize == gpu && e.link == link && e.at_s <= t_s)
        {
            up = e.up;
            if let Some(s) = e.speed_mbps {
                speed = s;
            }
        }
        (up, if up { speed } else { 0 })
    }

    /// Error counter `counter` (0 replay, 1 recovery, 2 CRC flit, 3 CRC data, 4 ECC data) of a
    /// link at `t_s`.
    pub fn errors(&self, gpu: usize, link: u32, counter: usize, t_s: f64) -> u64 {
        self.errors
            .iter()
            .filter(|e| e.gpu as usize == gpu && e.link == link)
            .map(|e| {
                let rate = e.per_s.get(counter).copied().unwrap_or(0.0);
                let span = (t_s.min(e.until_s) - e.from_s).max(0.0);
                (rate * span).floor() as u64
            })
            .sum()
    }

    /// The speed `gpu`'s links that are up share at `t_s` (`NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON`):
    /// the speed most of them run at (the faster on a tie), so one link trained lower does not
    /// lower it; 0 while none is up.
    pub fn common_speed(&self, gpu: usize, t_s: f64) -> u32 {
        let mut counts: Vec<(u32, u32)> = Vec::new();
        for l in 0..self.links_of(gpu).len() as u32 {
            let (up, speed) = self.state(gpu, l, t_s);
            if !up {
                continue;
            }
            match counts.iter_mut().find(|(s, _)| *s == speed) {
                Some(c) => c.1 += 1,
                None => counts.push((speed, 1)),
            }
        }
        counts
            .into_iter()
            .max_by_key(|(s, n)| (*n, *s))
            .map_or(0, |(s, _)| s)
    }

    /// How many of `gpu`'s links are up at `t_s`.
    pub fn links_up(&self, gpu: usize, t_s: f64) -> u32 {
        (0..self.links_of(gpu).len() as u32)
            .filter(|&l| self.state(gpu, l, t_s).0)
            .count() as u32
    }
}

/// Per (simulation, GPU): whole seconds integrated so far and the KiB sent and received.
type Integrals = HashMap<(usize, usize), (u64, f64, f64)>;

static THROUGHPUT: Mutex<Option<Integrals>> = Mutex::new(None);

/// The GPU's NVLink data counter (KiB since scenario time 0, all links): the `nvlink_tx_kb_s` /
/// `nvlink_rx_kb_s` signal integrated on a 1 s grid (0 while no link is up).
pub fn throughput_kib(sim: &Sim, gpu: usize, t_s: f64, tx: bool) -> u64 {
    let key = (std::ptr::from_ref(sim) as usize, gpu);
    let t = t_s.max(0.0);
    let whole = t.floor() as u64;
    let rate = |mid: f64, m: Metric| {
        if sim.scenario.nvlink.links_up(gpu, mid) == 0 {
            0.0
        } else {
            sim.metric(gpu, m, mid).max(0.0)
        }
    };
    let mut guard = THROUGHPUT.lock().unwrap_or_else(|p| p.into_inner());
    let map = guard.get_or_insert_with(HashMap::new);
    let entry = map.entry(key).or_insert((0, 0.0, 0.0));
    if whole < entry.0 {
        *entry = (0, 0.0, 0.0);
    }
    while entry.0 < whole {
        let mid = entry.0 as f64 + 0.5;
        entry.1 += rate(mid, Metric::NvlinkTxKbS);
        entry.2 += rate(mid, Metric::NvlinkRxKbS);
        entry.0 += 1;
    }
    let frac = t - whole as f64;
    let mid = whole as f64 + frac / 2.0;
    let total = if tx {
        entry.1 + frac * rate(mid, Metric::NvlinkTxKbS)
    } else {
        entry.2 + frac * rate(mid, Metric::NvlinkRxKbS)
    };
    total.max(0.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devices(n: usize, name: &str) -> Vec<DeviceSpec> {
        let text = format!("[devices]\ncount = {n}\nname = \"{name}\"\n");
        crate::scenario::parse(&text, "t", None).unwrap().devices
    }

    #[test]
    fn h100_sxm_has_18_links_to_nvswitches_and_pcie_boards_none() {
        let nv = resolve(None, &devices(8, "NVIDIA H100 80GB HBM3")).unwrap();
        assert_eq!(nv.links_of(0).len(), 18);
        assert!(nv
            .links_of(3)
            .iter()
            .all(|l| matches!(l.remote, Remote::Switch { .. })));
        let switches: Vec<u32> = nv
            .links_of(0)
            .iter()
            .map(|l| match l.remote {
                Remote::Switch { bus } => bus,
                Remote::Gpu { .. } => 0,
            })
            .collect();
        assert_eq!(switches.iter().filter(|b| **b == 0x05).count(), 5);
        let pcie = resolve(None, &devices(2, "NVIDIA H100 PCIe")).unwrap();
        assert!(pcie.links_of(0).is_empty());
        assert!(resolve(None, &devices(1, "NVIDIA A10"))
            .unwrap()
            .links_of(0)
            .is_empty());
    }

    #[test]
    fn a_mesh_link_goes_down_at_both_ends_and_errors_climb() {
        let raw: toml::Value = toml::from_str(
            r#"topology = "mesh"
[[event]]
at_s = 100
gpu = 3
peer = 5
state = "down"
[[errors]]
gpu = 3
peer = 5
from_s = 50
crc_flit_per_s = 10
"#,
        )
        .unwrap();
        let nv = resolve(Some(raw), &devices(8, "NVIDIA H100 80GB HBM3")).unwrap();
        let link = nv
            .links_of(3)
            .iter()
            .position(|l| l.remote == Remote::Gpu { gpu: 5, link: 5 })
            .unwrap() as u32;
        assert_eq!(link, 5);
        assert_eq!(nv.links_of(5)[5].remote, Remote::Gpu { gpu: 3, link: 5 });
        assert_eq!(nv.state(3, 5, 99.0), (true, 26_562));
        assert_eq!(nv.state(3, 5, 100.0), (false, 0));
        assert_eq!(nv.state(5, 5, 100.0), (false, 0), "the far end too");
        assert!(nv.state(3, 4, 100.0).0);
        assert_eq!(nv.links_up(3, 200.0), 17);
        assert_eq!(nv.errors(3, 5, 2, 60.0), 100);
        assert_eq!(nv.errors(3, 5, 0, 60.0), 0);
        assert_eq!(nv.errors(5, 5, 2, 60.0), 0);
    }

    #[test]
    fn bridged_pairs_link_each_gpu_to_its_partner_only() {
        let raw: toml::Value =
            toml::from_str("links = 12\ntopology = \"pairs\"\nversion = 3").unwrap();
        let nv = resolve(Some(raw), &devices(4, "NVIDIA A100 80GB PCIe")).unwrap();
        assert_eq!(nv.links_of(2).len(), 12);
        assert!(nv.links_of(2).iter().enumerate().all(|(k, l)| l.remote
            == Remote::Gpu {
                gpu: 3,
                link: k as u32
            }));
        assert!(nv
            .links_of(1)
            .iter()
            .all(|l| matches!(l.remote, Remote::Gpu { gpu: 0, .. })));
        let raw: toml::Value = toml::from_str("topology = \"pairs\"").unwrap();
        let e = resolve(Some(raw), &devices(3, "NVIDIA H100 80GB HBM3")).unwrap_err();
        assert!(e.contains("even number"), "{e}");
    }

    /// One link trained lower shows in its own speed, not in the speed the links share: every
    /// NVLink 4 link of an H100 runs the same speed, and links 12–17 (no per-link speed field)
    /// are read through the common one.
    #[test]
    fn the_common_speed_is_what_most_links_run_at() {
        let raw: toml::Value = toml::from_str(
            "[[event]]\nat_s = 10\ngpu = 0\nlink = 3\nstate = \"up\"\nspeed_mbps = 13281\n\
             [[event]]\nat_s = 10\ngpu = 0\nlink = 4\nstate = \"down\"",
        )
        .unwrap();
        let nv = resolve(Some(raw), &devices(8, "NVIDIA H100 80GB HBM3")).unwrap();
        assert_eq!(nv.common_speed(0, 5.0), 26_562);
        assert_eq!(nv.state(0, 3, 20.0), (true, 13_281));
        assert_eq!(
            nv.common_speed(0, 20.0),
            26_562,
            "one slow link does not lower it"
        );
        assert_eq!(nv.common_speed(1, 20.0), 26_562);
        assert!((0..18).all(|l| nv.state(1, l, 20.0) == (true, 26_562)));
    }

    #[test]
    fn the_driver_answers_the_nvlink_version_enum() {
        assert_eq!(nvml_version(4), 6, "H100: NVML_NVLINK_VERSION_4_0");
        assert_eq!(nvml_version(5), 7);
        assert_eq!(nvml_version(3), 5, "A100 answers 5 (3_1)");
        let nv = resolve(None, &devices(1, "NVIDIA H100 80GB HBM3")).unwrap();
        assert_eq!(nv.links_of(0)[0].version, 4);
        let raw: toml::Value = toml::from_str("version = 6").unwrap();
        assert!(resolve(Some(raw), &devices(1, "NVIDIA H100 80GB HBM3")).is_err());
    }

    #[test]
    fn bad_keys_are_named() {
        let raw: toml::Value = toml::from_str("topology = \"ring\"").unwrap();
        let e = resolve(Some(raw), &devices(8, "NVIDIA H100 80GB HBM3")).unwrap_err();
        assert!(e.contains("nvlink.topology"), "{e}");
        let raw: toml::Value =
            toml::from_str("[[event]]\nat_s = 1\ngpu = 0\npeer = 1\nstate = \"down\"").unwrap();
        let e = resolve(Some(raw), &devices(8, "NVIDIA H100 80GB HBM3")).unwrap_err();
        assert!(e.contains("no link to GPU 1"), "{e}");
    }
}
