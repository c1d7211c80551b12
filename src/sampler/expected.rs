//! The GPUs this machine should have, and which of them NVML does not enumerate.
//!
//! The expected set is the union of
//! * the NVIDIA GPUs on the PCI bus ([`super::sysfs`]),
//! * the GPUs (by UUID, with bus id and name) seen at an earlier start, kept in
//!   `state_dir/gpus.json` ([`HISTORY_FILE`]; under `--sim` a file per scenario,
//!   `gpus.sim-HASH.json`, so simulated boards never become a real machine's expected GPUs),
//! * and a count, `[daemon] expected_gpus`.
//!
//! A GPU on the bus or seen before that NVML does not list is missing ([`MissingGpu`]); so is
//! each GPU short of the count. A missing GPU stays in the history, so it stays expected across
//! restarts until someone says otherwise: delete `gpus.json` (forget every GPU; the next start
//! records the present ones) or its entry for that UUID. A board replaced in the same slot (the
//! bus id now answers with another UUID) is forgotten by itself.
//!
//! When NVML lists a GPU whose identity could not be read at start (a wedged call), identities
//! cannot be compared: only the count is checked then, and the history is left as it is.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::kmsg::PciAddr;
use super::sysfs::BusGpu;
use crate::model::{DeviceId, MissingGpu, MissingWhy};

/// The history file in the state directory.
pub const HISTORY_FILE: &str = "gpus.json";

/// One GPU seen at a start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeenGpu {
    /// `GPU-…` UUID.
    pub uuid: String,
    /// NVML-style bus id.
    #[serde(default)]
    pub pci_bus_id: String,
    /// Marketing name.
    #[serde(default)]
    pub name: String,
    /// When it was first recorded, UTC ms.
    #[serde(default)]
    pub first_seen_ms: i64,
    /// When it was last enumerated, UTC ms.
    #[serde(default)]
    pub last_seen_ms: i64,
}

/// The contents of `gpus.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeenGpus {
    /// Format version (1).
    #[serde(default)]
    pub version: u32,
    /// Every GPU seen, present or not.
    #[serde(default)]
    pub gpus: Vec<SeenGpu>,
}

/// Where the history lives: `state_dir/gpus.json`, or a per-scenario file for `--sim`.
pub fn history_path(state_dir: &Path, sim_scenario: Option<&str>) -> PathBuf {
    match sim_scenario {
        None => state_dir.join(HISTORY_FILE),
        Some(s) => {
            let hash = crate::sys::fnv1a64_hex(s.bytes());
            state_dir.join(format!("gpus.sim-{}.json", &hash[..8]))
        }
    }
}

/// Reads the history; a missing file is an empty history, a damaged one an error (the caller
/// logs it and goes on with an empty one).
pub fn load(path: &Path) -> Result<SeenGpus, String> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            format!(
                "{} is damaged ({e}); GPUs seen before are not checked",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(SeenGpus::default()),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// Writes the history atomically and durably (creating the state directory, mode 0700).
pub fn save(path: &Path, history: &SeenGpus) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        crate::sys::create_private_dir(dir)?;
    }
    let mut text = serde_json::to_vec_pretty(history).map_err(std::io::Error::other)?;
    text.push(b'\n');
    crate::sys::write_atomic(path, &text)
}

fn normalised(bus_id: &str) -> String {
    PciAddr::normalise(bus_id).unwrap_or_else(|| bus_id.trim().to_ascii_uppercase())
}

/// Whether every enumerated device's identity is known (UUID and bus id read at start): a
/// device whose bus id could not be read would leave its own slot looking empty.
fn identified(devices: &[DeviceId]) -> bool {
    devices
        .iter()
        .all(|d| !d.uuid.is_empty() && !d.pci_bus_id.trim().is_empty())
}

/// The expected GPUs NVML does not enumerate: bus GPUs first (named from the history when it
/// knows them), then GPUs seen before, then the count shortfall.
pub fn missing(
    devices: &[DeviceId],
    bus: &[BusGpu],
    seen: &[SeenGpu],
    expected_count: Option<u32>,
) -> Vec<MissingGpu> {
    let mut out = Vec::new();
    if identified(devices) {
        let present_bus: BTreeSet<String> =
            devices.iter().map(|d| normalised(&d.pci_bus_id)).collect();
        let present_uuid: BTreeSet<&str> = devices.iter().map(|d| d.uuid.as_str()).collect();
        for b in bus.iter().filter(|b| !present_bus.contains(&b.pci_bus_id)) {
            let known = seen
                .iter()
                .find(|s| normalised(&s.pci_bus_id) == b.pci_bus_id);
            out.push(MissingGpu {
                pci_bus_id: b.pci_bus_id.clone(),
                uuid: known.map(|s| s.uuid.clone()).unwrap_or_default(),
                name: known.map(|s| s.name.clone()).unwrap_or_default(),
                why: Some(MissingWhy::OnBus),
            });
        }
        for s in seen {
            let bus_id = normalised(&s.pci_bus_id);
            let listed = out
                .iter()
                .any(|m| m.uuid == s.uuid || m.pci_bus_id == bus_id);
            // Gone by UUID, and its slot not taken by another enumerated board.
            if present_uuid.contains(s.uuid.as_str()) || listed || present_bus.contains(&bus_id) {
                continue;
            }
            out.push(MissingGpu {
                pci_bus_id: bus_id,
                uuid: s.uuid.clone(),
                name: s.name.clone(),
                why: Some(MissingWhy::SeenBefore),
            });
        }
    }
    let want = usize::try_from(expected_count.unwrap_or(0)).unwrap_or(0);
    let accounted = devices.len() + out.len();
    for _ in accounted..want {
        out.push(MissingGpu {
            why: Some(MissingWhy::ExpectedCount),
            ..MissingGpu::default()
        });
    }
    out
}

impl SeenGpus {
    /// Records the enumerated GPUs at `now_ms` (new ones added, present ones refreshed); GPUs
    /// not enumerated stay, except one whose slot another enumerated board now holds (replaced).
    /// Nothing changes when an enumerated GPU's identity is unknown.
    pub fn record(&mut self, devices: &[DeviceId], now_ms: i64) {
        if !identified(devices) {
            return;
        }
        self.version = 1;
        let present_uuid: BTreeSet<&str> = devices.iter().map(|d| d.uuid.as_str()).collect();
        let present_bus: BTreeSet<String> =
            devices.iter().map(|d| normalised(&d.pci_bus_id)).collect();
        self.gpus.retain(|s| {
            present_uuid.contains(s.uuid.as_str())
                || !present_bus.contains(&normalised(&s.pci_bus_id))
        });
        for d in devices {
            match self.gpus.iter_mut().find(|s| s.uuid == d.uuid) {
                Some(s) => {
                    s.pci_bus_id = normalised(&d.pci_bus_id);
                    s.name.clone_from(&d.name);
                    s.last_seen_ms = now_ms;
                }
                None => self.gpus.push(SeenGpu {
                    uuid: d.uuid.clone(),
                    pci_bus_id: normalised(&d.pci_bus_id),
                    name: d.name.clone(),
                    first_seen_ms: now_ms,
                    last_seen_ms: now_ms,
                }),
            }
        }
        self.gpus
            .sort_by(|a, b| a.pci_bus_id.cmp(&b.pci_bus_id).then(a.uuid.cmp(&b.uuid)));
    }
}

/// What the start-up check reads and whether it records.
#[derive(Debug, Clone, Default)]
pub struct ExpectedOptions {
    /// The state directory holding the history; `None` = no history (e.g. `status`).
    pub state_dir: Option<PathBuf>,
    /// `[daemon] expected_gpus`.
    pub expected_gpus: Option<u32>,
    /// Record the enumerated GPUs into the history (daemon, `run`, `attach`).
    pub record: bool,
}

/// The start-up check: reads the bus and the history, computes the missing GPUs, records the
/// present ones when asked (and then logs each missing GPU as an error). Never fails: what it cannot read it
/// says in the log and leaves out.
pub fn check(
    devices: &[DeviceId],
    opts: &ExpectedOptions,
    sim_scenario: Option<&str>,
    now_ms: i64,
) -> Vec<MissingGpu> {
    let bus = super::sysfs::root(sim_scenario.is_some())
        .map(|r| super::sysfs::nvidia_gpus(&r))
        .unwrap_or_default();
    let path = opts
        .state_dir
        .as_deref()
        .map(|d| history_path(d, sim_scenario));
    let mut history = match path.as_deref().map(load) {
        Some(Ok(h)) => h,
        Some(Err(e)) => {
            tracing::warn!("{e}");
            SeenGpus::default()
        }
        None => SeenGpus::default(),
    };
    let out = missing(devices, &bus, &history.gpus, opts.expected_gpus);
    for m in &out {
        // The daemon and `run` log it; `status` and `doctor` print it themselves.
        if opts.record {
            tracing::error!("GPU missing: {}", m.describe());
        } else {
            tracing::debug!("GPU missing: {}", m.describe());
        }
    }
    if let (true, Some(path)) = (opts.record, path) {
        let before = history.clone();
        history.record(devices, now_ms);
        if history != before {
            if let Err(e) = save(&path, &history) {
                tracing::warn!("cannot record the GPUs seen in {}: {e}", path.display());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(index: u32, bus: &str) -> DeviceId {
        DeviceId {
            index,
            minor: Some(index),
            uuid: format!("GPU-{bus}"),
            pci_bus_id: bus.to_string(),
            name: "NVIDIA H100 80GB HBM3".into(),
        }
    }

    fn bus(id: &str) -> BusGpu {
        BusGpu {
            pci_bus_id: id.to_string(),
            device_id: None,
            class: 0x030200,
            current_link_speed: None,
            max_link_speed: None,
            current_link_width: None,
            max_link_width: None,
        }
    }

    #[test]
    fn a_gpu_on_the_bus_but_not_enumerated_is_missing() {
        let devices = [dev(0, "00000000:18:00.0"), dev(1, "00000000:5D:00.0")];
        let on_bus = [
            bus("00000000:18:00.0"),
            bus("00000000:3A:00.0"),
            bus("00000000:5D:00.0"),
        ];
        let m = missing(&devices, &on_bus, &[], None);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].pci_bus_id, "00000000:3A:00.0");
        assert_eq!(m[0].why, Some(MissingWhy::OnBus));
        assert!(m[0].uuid.is_empty());
        // Lower-case NVML spelling compares equal.
        let devices = [
            dev(0, "00000000:18:00.0"),
            dev(1, "00000000:3a:00.0"),
            dev(2, "00000000:5d:00.0"),
        ];
        assert!(missing(&devices, &on_bus, &[], None).is_empty());
    }

    #[test]
    fn history_names_bus_gpus_and_finds_gone_ones() {
        let mut h = SeenGpus::default();
        let all = [
            dev(0, "00000000:18:00.0"),
            dev(1, "00000000:3A:00.0"),
            dev(2, "00000000:5D:00.0"),
        ];
        h.record(&all, 1000);
        assert_eq!(h.gpus.len(), 3);
        // 3A vanished from NVML but is on the bus; 5D vanished everywhere.
        let now = [dev(0, "00000000:18:00.0")];
        let m = missing(
            &now,
            &[bus("00000000:18:00.0"), bus("00000000:3A:00.0")],
            &h.gpus,
            None,
        );
        assert_eq!(m.len(), 2, "{m:?}");
        assert_eq!(
            (m[0].why, m[0].uuid.as_str()),
            (Some(MissingWhy::OnBus), "GPU-00000000:3A:00.0")
        );
        assert_eq!(m[1].why, Some(MissingWhy::SeenBefore));
        assert_eq!(m[1].pci_bus_id, "00000000:5D:00.0");
        assert_eq!(m[1].name, "NVIDIA H100 80GB HBM3");
        // Missing GPUs stay in the history.
        h.record(&now, 2000);
        assert_eq!(h.gpus.len(), 3);
        assert_eq!(h.gpus[0].last_seen_ms, 2000);
        assert_eq!(h.gpus[1].last_seen_ms, 1000);
    }

    #[test]
    fn a_replaced_board_is_not_missing_and_is_forgotten() {
        let mut h = SeenGpus::default();
        h.record(&[dev(0, "00000000:18:00.0")], 1);
        let mut new_board = dev(0, "00000000:18:00.0");
        new_board.uuid = "GPU-new".into();
        assert!(missing(std::slice::from_ref(&new_board), &[], &h.gpus, None).is_empty());
        h.record(&[new_board], 2);
        assert_eq!(h.gpus.len(), 1);
        assert_eq!(h.gpus[0].uuid, "GPU-new");
    }

    #[test]
    fn the_count_adds_what_identities_do_not_explain() {
        let devices = [dev(0, "00000000:18:00.0")];
        let m = missing(&devices, &[bus("00000000:3A:00.0")], &[], Some(4));
        let whys: Vec<_> = m.iter().map(|m| m.why).collect();
        assert_eq!(
            whys,
            [
                Some(MissingWhy::OnBus),
                Some(MissingWhy::ExpectedCount),
                Some(MissingWhy::ExpectedCount)
            ]
        );
        assert!(missing(&devices, &[], &[], Some(1)).is_empty());
    }

    #[test]
    fn unknown_identities_check_only_the_count() {
        let mut h = SeenGpus::default();
        h.record(&[dev(0, "00000000:18:00.0"), dev(1, "00000000:3A:00.0")], 1);
        let wedged = [
            dev(0, "00000000:18:00.0"),
            DeviceId {
                index: 1,
                ..DeviceId::default()
            },
        ];
        assert!(missing(&wedged, &[bus("00000000:3A:00.0")], &h.gpus, Some(2)).is_empty());
        let before = h.clone();
        h.record(&wedged, 2);
        assert_eq!(h, before);
    }

    #[test]
    fn history_round_trips_through_the_state_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let path = history_path(&tmp.path().join("state"), None);
        assert_eq!(load(&path).unwrap(), SeenGpus::default());
        let mut h = SeenGpus::default();
        h.record(&[dev(0, "00000000:18:00.0")], 5);
        save(&path, &h).unwrap();
        assert_eq!(load(&path).unwrap(), h);
        std::fs::write(&path, "{not json").unwrap();
        assert!(load(&path).unwrap_err().contains("damaged"));
        let sim = history_path(tmp.path(), Some("healthy"));
        assert_ne!(sim, history_path(tmp.path(), Some("overnight")));
        assert!(sim
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("gpus.sim-"));
    }
}
