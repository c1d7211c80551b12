//! MIG (Multi-Instance GPU): the GPU-instance profiles a MIG-capable GPU offers and the layout a
//! scenario splits a GPU into — per MIG device its profile, placement, GPU and compute instance
//! ids and `MIG-…` UUID — numbered the way the driver numbers them.
//!
//! Profiles are those `nvidia-smi mig -lgip` lists in NVIDIA's MIG user guide for the A100 80GB,
//! the A100 40GB and the H100 80GB (memory, SM, copy-engine and decoder counts); a profile name
//! of another GPU (`Ng.Mgb`) is derived from the name and the GPU's memory.

use crate::scenario::Metric;
use crate::signal::{mix, Signal};

/// Memory slices of a MIG-capable GPU (placements are counted in them).
pub const MEMORY_SLICES: u32 = 8;
/// Compute slices of a MIG-capable GPU.
pub const COMPUTE_SLICES: u32 = 7;
/// Most MIG devices on one GPU (`nvmlDeviceGetMaxMigDeviceCount`).
pub const MAX_MIG_DEVICES: usize = 7;

/// One GPU-instance profile (`nvmlGpuInstanceProfileInfo_t`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// `1g.10gb`.
    pub name: String,
    /// `NVML_GPU_INSTANCE_PROFILE_*`: the argument of `nvmlDeviceGetGpuInstanceProfileInfo`.
    pub nvml_profile: u32,
    /// The driver's profile id (`nvidia-smi mig -lgip`'s ID, `nvmlGpuInstanceInfo_t.profileId`).
    pub id: u32,
    /// Compute slices (`sliceCount`).
    pub compute_slices: u32,
    /// Memory slices: the placement size.
    pub memory_slices: u32,
    /// How many instances of it fit on the GPU (`instanceCount`).
    pub instances: u32,
    /// Memory of one instance, MiB (`memorySizeMB`).
    pub memory_mib: u64,
    pub multiprocessors: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub jpegs: u32,
    pub ofas: u32,
}

/// (name, memory MiB, SMs, copy engines, decoders, JPEG, OFA) by GPU family, as
/// `nvidia-smi mig -lgip` lists them (NVIDIA MIG user guide).
type Row = (&'static str, u64, u32, u32, u32, u32, u32);

const A100_80GB: &[Row] = &[
    ("1g.10gb", 9728, 14, 1, 0, 0, 0),
    ("1g.20gb", 19968, 14, 1, 1, 0, 0),
    ("2g.20gb", 19968, 28, 2, 1, 0, 0),
    ("3g.40gb", 40192, 42, 3, 2, 0, 0),
    ("4g.40gb", 40192, 56, 4, 2, 0, 0),
    ("7g.80gb", 80640, 98, 7, 5, 1, 1),
];

const A100_40GB: &[Row] = &[
    ("1g.5gb", 4864, 14, 1, 0, 0, 0),
    ("1g.10gb", 9984, 14, 1, 1, 0, 0),
    ("2g.10gb", 9984, 28, 2, 1, 0, 0),
    ("3g.20gb", 20096, 42, 3, 2, 0, 0),
    ("4g.20gb", 20096, 56, 4, 2, 0, 0),
    ("7g.40gb", 40448, 98, 7, 5, 1, 1),
];

const H100_80GB: &[Row] = &[
    ("1g.10gb", 9984, 16, 1, 1, 1, 0),
    ("1g.20gb", 20096, 26, 1, 1, 1, 0),
    ("2g.20gb", 20096, 32, 2, 2, 2, 0),
    ("3g.40gb", 40448, 60, 3, 3, 3, 0),
    ("4g.40gb", 40448, 64, 4, 4, 4, 0),
    ("7g.80gb", 81152, 132, 8, 7, 7, 1),
];

/// The profile table of a GPU model, when it is one of the known ones.
fn family(gpu_name: &str, total_mib: f64) -> Option<&'static [Row]> {
    let upper = gpu_name.to_ascii_uppercase();
    if upper.contains("A100") || upper.contains("A800") {
        Some(if total_mib > 60.0 * 1024.0 {
            A100_80GB
        } else {
            A100_40GB
        })
    } else if upper.contains("H100") || upper.contains("H800") {
        Some(H100_80GB)
    } else {
        None
    }
}

/// Whether a GPU model supports MIG by default (the datacenter Ampere, Hopper and Blackwell
/// boards).
pub fn capable_by_name(gpu_name: &str) -> bool {
    let upper = gpu_name.to_ascii_uppercase();
    [
        "A100", "A800", "A30", "H100", "H200", "H800", "H20", "GH200", "B100", "B200", "B300",
        "GB200", "GB300",
    ]
    .iter()
    .any(|m| upper.split([' ', '-', '_']).any(|t| t == *m))
}

/// `(NVML_GPU_INSTANCE_PROFILE_*, driver profile id)` of a profile with these slices.
fn ids_of(compute: u32, memory: u32) -> Option<(u32, u32)> {
    Some(match (compute, memory) {
        (1, 1) => (0, 19),
        (1, 2) => (9, 15),
        (2, 2) => (1, 14),
        (3, 4) => (2, 9),
        (4, 4) => (3, 5),
        (7, 8) => (4, 0),
        _ => return None,
    })
}

/// Reads `Ng.Mgb` into (compute slices, memory GB).
fn parse_name(name: &str) -> Option<(u32, f64)> {
    let (c, m) = name.split_once("g.")?;
    let m = m.strip_suffix("gb")?;
    Some((c.parse().ok()?, m.parse().ok()?))
}

/// The profile `name` on a GPU named `gpu_name` with `total_mib` of memory.
pub fn profile(gpu_name: &str, total_mib: f64, name: &str) -> Result<Profile, String> {
    let known = family(gpu_name, total_mib);
    if let Some(rows) = known {
        if !rows.iter().any(|r| r.0 == name) {
            return Err(format!(
                "MIG profile `{name}` does not exist on a {gpu_name} (known: {})",
                rows.iter().map(|r| r.0).collect::<Vec<_>>().join(", ")
            ));
        }
    }
    let (compute, gb) = parse_name(name).ok_or_else(|| {
        format!("MIG profile `{name}`: expected a name such as \"1g.10gb\" or \"3g.40gb\"")
    })?;
    let total_gb = (total_mib / 1024.0).round().max(1.0);
    let memory = (gb * f64::from(MEMORY_SLICES) / total_gb).round() as u32;
    let (nvml_profile, id) = ids_of(compute, memory).ok_or_else(|| {
        format!(
            "MIG profile `{name}`: {compute} compute slices with {memory} of {MEMORY_SLICES} \
             memory slices is not a GPU-instance profile"
        )
    })?;
    let row = known.and_then(|rows| rows.iter().find(|r| r.0 == name));
    Ok(Profile {
        name: name.to_string(),
        nvml_profile,
        id,
        compute_slices: compute,
        memory_slices: memory,
        instances: match compute {
            1 if memory == 1 => 7,
            1 => 4,
            2 => 3,
            3 => 2,
            _ => 1,
        },
        memory_mib: row.map_or((gb * 1024.0 * 0.97).round() as u64, |r| r.1),
        multiprocessors: row.map_or(compute * 16, |r| r.2),
        copy_engines: row.map_or(compute, |r| r.3),
        decoders: row.map_or(0, |r| r.4),
        jpegs: row.map_or(0, |r| r.5),
        ofas: row.map_or(0, |r| r.6),
    })
}

/// Every profile a GPU offers, in `NVML_GPU_INSTANCE_PROFILE_*` order.
pub fn profiles(gpu_name: &str, total_mib: f64) -> Vec<Profile> {
    let names: Vec<String> = match family(gpu_name, total_mib) {
        Some(rows) => rows.iter().map(|r| r.0.to_string()).collect(),
        None => {
            let gb = (total_mib / 1024.0).round().max(8.0) as u64 / 8;
            [(1, 1), (1, 2), (2, 2), (3, 4), (4, 4), (7, 8)]
                .iter()
                .map(|(c, m)| format!("{c}g.{}gb", gb * m))
                .collect()
        }
    };
    let mut out: Vec<Profile> = names
        .iter()
        .filter_map(|n| profile(gpu_name, total_mib, n).ok())
        .collect();
    out.sort_by_key(|p| p.nvml_profile);
    out
}

/// Where an instance of `memory_slices` may start.
pub fn valid_starts(memory_slices: u32) -> &'static [u32] {
    match memory_slices {
        1 => &[0, 1, 2, 3, 4, 5, 6],
        2 => &[0, 2, 4],
        4 => &[0, 4],
        _ => &[0],
    }
}

/// The GPU instance id the driver gives an instance at this placement (A100 / H100: the 7g
/// instance is 0, the half-GPU ones 1 and 2, the quarter ones 3–5, the 1g ones 7–13).
pub fn gpu_instance_id(memory_slices: u32, start: u32) -> u32 {
    match memory_slices {
        8 => 0,
        4 => 1 + start / 4,
        2 => 3 + start / 2,
        _ => 7 + start,
    }
}

/// A `MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` UUID derived from the GPU's seed and the GPU
/// instance id.
pub fn uuid_for(device_seed: u64, gpu_instance_id: u32, compute_instance_id: u32) -> String {
    let a = mix(
        device_seed,
        0x4d49_4700 + u64::from(gpu_instance_id) * 8 + u64::from(compute_instance_id),
    );
    let b = mix(a, 0x4d49_4701);
    format!(
        "MIG-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

/// One MIG device: a GPU instance and the compute instance CUDA runs on.
#[derive(Debug, Clone)]
pub struct MigDevice {
    pub profile: Profile,
    /// Placement start, in memory slices (the size is `profile.memory_slices`).
    pub placement_start: u32,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub uuid: String,
    pub memory_total_bytes: u64,
    /// Memory used, MiB (default: what its processes use).
    pub memory_used: Option<Signal>,
    /// Its own activity signals (utilization, GPM percentages); a metric without one follows
    /// the GPU's while a process runs on it, else reads 0 (see `Sim::mig_metric`).
    pub activity: Vec<(Metric, Signal)>,
}

/// A GPU's MIG state.
#[derive(Debug, Clone, Default)]
pub struct MigConfig {
    /// `nvmlDeviceGetMigMode` answers (else NOT_SUPPORTED).
    pub capable: bool,
    /// Current MIG mode.
    pub enabled: bool,
    /// MIG mode after the next reset.
    pub pending: bool,
    /// The MIG devices, in `nvmlDeviceGetMigDeviceHandleByIndex` order.
    pub devices: Vec<MigDevice>,
}

impl MigConfig {
    /// Whether the GPU is split into MIG devices (MIG on): its utilization is not reported and
    /// its processes run on the devices.
    pub fn active(&self) -> bool {
        self.enabled
    }
}

/// What a scenario says about one MIG device.
#[derive(Debug, Clone, Default)]
pub struct MigRequest {
    pub profile: String,
    pub placement: Option<u32>,
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
    pub uuid: Option<String>,
    pub memory_total_mib: Option<f64>,
    pub memory_used: Option<Signal>,
    pub activity: Vec<(Metric, Signal)>,
}

/// Lays out the requested MIG devices on a GPU: placements (first fit in order when not given),
/// ids and UUIDs. Errors say which entry is wrong and why.
pub fn layout(
    gpu_name: &str,
    total_mib: f64,
    device_seed: u64,
    requests: Vec<MigRequest>,
) -> Result<Vec<MigDevice>, (usize, String)> {
    if requests.len() > MAX_MIG_DEVICES {
        return Err((
            MAX_MIG_DEVICES,
            format!("at most {MAX_MIG_DEVICES} MIG devices fit on a GPU"),
        ));
    }
    let mut used = [false; MEMORY_SLICES as usize];
    let mut compute = 0;
    let mut out: Vec<MigDevice> = Vec::with_capacity(requests.len());
    for (k, r) in requests.into_iter().enumerate() {
        let p = profile(gpu_name, total_mib, &r.profile).map_err(|m| (k, m))?;
        compute += p.compute_slices;
        if compute > COMPUTE_SLICES {
            return Err((
                k,
                format!(
                    "MIG devices use more than the GPU's {COMPUTE_SLICES} compute slices at `{}`",
                    p.name
                ),
            ));
        }
        let size = p.memory_slices;
        let free = |s: u32| (s..s + size).all(|i| !used.get(i as usize).copied().unwrap_or(true));
        let start = match r.placement {
            Some(s) if !valid_starts(size).contains(&s) => {
                return Err((
                    k,
                    format!(
                        "placement {s} is not a start for `{}` (valid: {:?})",
                        p.name,
                        valid_starts(size)
                    ),
                ))
            }
            Some(s) if !free(s) => {
                return Err((
                    k,
                    format!("placement {s} of `{}` overlaps another MIG device", p.name),
                ))
            }
            Some(s) => s,
            None => valid_starts(size)
                .iter()
                .copied()
                .find(|s| free(*s))
                .ok_or_else(|| (k, format!("no room left for `{}`", p.name)))?,
        };
        for i in start..start + size {
            used[i as usize] = true;
        }
        let gi = r
            .gpu_instance_id
            .unwrap_or_else(|| gpu_instance_id(size, start));
        let ci = r.compute_instance_id.unwrap_or(0);
        if out
            .iter()
            .any(|d| d.gpu_instance_id == gi && d.compute_instance_id == ci)
        {
            return Err((
                k,
                format!("two MIG devices have GPU instance {gi}, compute instance {ci}"),
            ));
        }
        let memory_mib = r.memory_total_mib.unwrap_or(p.memory_mib as f64);
        out.push(MigDevice {
            uuid: r.uuid.unwrap_or_else(|| uuid_for(device_seed, gi, ci)),
            memory_total_bytes: (memory_mib.max(0.0) * 1024.0 * 1024.0) as u64,
            profile: p,
            placement_start: start,
            gpu_instance_id: gi,
            compute_instance_id: ci,
            memory_used: r.memory_used,
            activity: r.activity,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(p: &str) -> MigRequest {
        MigRequest {
            profile: p.into(),
            ..MigRequest::default()
        }
    }

    #[test]
    fn seven_1g_on_an_a100_80gb() {
        let devs = layout("NVIDIA A100-SXM4-80GB", 81920.0, 7, vec![req("1g.10gb"); 7]).unwrap();
        let gis: Vec<u32> = devs.iter().map(|d| d.gpu_instance_id).collect();
        assert_eq!(gis, [7, 8, 9, 10, 11, 12, 13]);
        assert!(devs.iter().all(|d| d.profile.memory_mib == 9728));
        assert!(devs
            .iter()
            .all(|d| d.uuid.starts_with("MIG-") && d.uuid.len() == 40));
        let mut uuids: Vec<&str> = devs.iter().map(|d| d.uuid.as_str()).collect();
        uuids.dedup();
        assert_eq!(uuids.len(), 7);
        assert!(layout("NVIDIA A100-SXM4-80GB", 81920.0, 7, vec![req("1g.10gb"); 8]).is_err());
    }

    #[test]
    fn mixed_on_an_h100() {
        let devs = layout(
            "NVIDIA H100 80GB HBM3",
            81559.0,
            1,
            vec![req("3g.40gb"), req("2g.20gb"), req("1g.10gb")],
        )
        .unwrap();
        let at: Vec<(u32, u32, u32)> = devs
            .iter()
            .map(|d| {
                (
                    d.placement_start,
                    d.profile.memory_slices,
                    d.gpu_instance_id,
                )
            })
            .collect();
        assert_eq!(at, [(0, 4, 1), (4, 2, 5), (6, 1, 13)]);
        assert_eq!(devs[0].profile.memory_mib, 40448);
        assert_eq!(devs[0].profile.id, 9);
        assert_eq!(devs[1].profile.nvml_profile, 1);
        // too much compute
        let err = layout(
            "NVIDIA H100 80GB HBM3",
            81559.0,
            1,
            vec![req("4g.40gb"), req("4g.40gb")],
        )
        .unwrap_err();
        assert_eq!(err.0, 1);
        // a profile of another GPU
        assert!(layout("NVIDIA H100 80GB HBM3", 81559.0, 1, vec![req("1g.5gb")]).is_err());
    }

    #[test]
    fn profile_lists() {
        let names: Vec<String> = profiles("NVIDIA A100-SXM4-40GB", 40960.0)
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(
            names,
            ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb", "1g.10gb"]
        );
        assert!(capable_by_name("NVIDIA H100 80GB HBM3"));
        assert!(capable_by_name("NVIDIA A100-SXM4-80GB"));
        assert!(!capable_by_name("NVIDIA GeForce RTX 4090"));
        assert!(!capable_by_name("NVIDIA L40S"));
    }
}
