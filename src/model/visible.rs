//! How CUDA and the NVIDIA container runtime number GPUs: `CUDA_VISIBLE_DEVICES` as the CUDA
//! driver reads it and `NVIDIA_VISIBLE_DEVICES` as the container runtime does, against the NVML
//! device list (`gpuwatch devices` shows both).

use super::{DeviceId, MigSample};

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
    /// `cuda:k` is `devices[visible[k]]` (positions in the NVML device list); for a MIG device,
    /// its GPU.
    pub visible: Vec<usize>,
    /// `cuda:k` is the MIG device `mig[k]` (a position in the MIG device list), when the entry
    /// named one; same length as `visible`.
    pub mig: Vec<Option<usize>>,
    /// Entries CUDA skips without ending the list: a MIG device after the first (a CUDA process
    /// runs on one MIG device).
    pub ignored: Vec<StoppedAt>,
    /// The entry that ended the list early, if any (it and all later entries are ignored).
    pub stopped_at: Option<StoppedAt>,
    /// A device named twice: CUDA then exposes no device at all.
    pub duplicate: Option<String>,
}

/// Interprets `CUDA_VISIBLE_DEVICES` the way the CUDA driver does, without MIG devices (see
/// [`cuda_visible_mig`]).
pub fn cuda_visible(spec: &str, devices: &[DeviceId]) -> CudaVisible {
    cuda_visible_mig(spec, devices, &[])
}

/// Finds the MIG device an entry names: `MIG-<UUID>` (or a unique prefix of it) or the legacy
/// `MIG-GPU-<GPU UUID>/<GI>/<CI>`.
fn find_mig(entry: &str, devices: &[DeviceId], mig: &[MigSample]) -> Result<usize, String> {
    if let Some(rest) = entry.strip_prefix("MIG-").filter(|r| r.starts_with("GPU-")) {
        let mut parts = rest.split('/');
        let gpu = parts.next().unwrap_or("");
        let (Some(Ok(gi)), Some(Ok(ci)), None) = (
            parts.next().map(str::parse::<u32>),
            parts.next().map(str::parse::<u32>),
            parts.next(),
        ) else {
            return Err("not a MIG-GPU-<GPU UUID>/<GI>/<CI> id".into());
        };
        if !devices.iter().any(|d| d.uuid == gpu) {
            return Err("no GPU has this UUID".into());
        }
        return mig
            .iter()
            .position(|m| {
                m.gpu_uuid == gpu && m.gpu_instance_id == gi && m.compute_instance_id == ci
            })
            .ok_or_else(|| {
                format!(
                    "the GPU has no MIG device with GPU instance {gi} and compute instance {ci}"
                )
            });
    }
    let matches: Vec<usize> = mig
        .iter()
        .enumerate()
        .filter(|(_, m)| m.uuid.starts_with(entry))
        .map(|(i, _)| i)
        .collect();
    match matches.as_slice() {
        [one] => Ok(*one),
        [] => Err("no MIG device has this UUID".into()),
        _ => Err("UUID prefix matches several MIG devices".into()),
    }
}

/// Interprets `CUDA_VISIBLE_DEVICES` the way the CUDA driver does: comma-separated entries, each
/// an index (leading digits count, as with `strtoul`: `1gpu` is 1), a `GPU-` UUID or a unique
/// UUID prefix, or a MIG device of `mig` — `MIG-<UUID>` (or a unique prefix) or the legacy
/// `MIG-GPU-<GPU UUID>/<GI>/<CI>`; the first invalid entry (unparsable, out of range, unknown or
/// ambiguous UUID) ends the list; naming one device twice makes the whole list empty. A CUDA
/// process runs on one MIG device: MIG devices after the first are skipped (`ignored`). NVML
/// order is assumed to be CUDA's order (true with `CUDA_DEVICE_ORDER=PCI_BUS_ID`, or identical
/// GPUs).
pub fn cuda_visible_mig(spec: &str, devices: &[DeviceId], mig: &[MigSample]) -> CudaVisible {
    let mut out = CudaVisible {
        visible: Vec::new(),
        mig: Vec::new(),
        ignored: Vec::new(),
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
            match find_mig(entry, devices, mig) {
                Ok(k) if out.mig.contains(&Some(k)) => {
                    out.visible.clear();
                    out.mig.clear();
                    out.duplicate = Some(entry.to_string());
                    return out;
                }
                Ok(_) if out.mig.iter().any(Option::is_some) => {
                    out.ignored.push(stop(
                        "a CUDA process runs on one MIG device: only the first MIG device listed is visible",
                    ));
                    continue;
                }
                Ok(k) => match devices.iter().position(|d| d.uuid == mig[k].gpu_uuid) {
                    Some(pos) => {
                        out.visible.push(pos);
                        out.mig.push(Some(k));
                        continue;
                    }
                    None => Err(stop("the MIG device's GPU is not visible to NVML")),
                },
                Err(reason) => Err(stop(&reason)),
            }
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
            Ok(i)
                if out
                    .visible
                    .iter()
                    .zip(&out.mig)
                    .any(|(v, m)| *v == i && m.is_none()) =>
            {
                out.visible.clear();
                out.mig.clear();
                out.duplicate = Some(entry.to_string());
                return out;
            }
            Ok(i) => {
                out.visible.push(i);
                out.mig.push(None);
            }
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `n` GPUs whose minor numbers are their indices + 2 (as in a container).
    pub(crate) fn devs(n: u32) -> Vec<DeviceId> {
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

    /// Seven 1g.10gb MIG devices on GPU 1.
    pub(crate) fn migs(d: &[DeviceId]) -> Vec<MigSample> {
        (0..7)
            .map(|k| MigSample {
                gpu_uuid: d[1].uuid.clone(),
                uuid: format!("MIG-{k}{k}bb{k}-0000-1111-2222-33334444555{k}"),
                mem_total_bytes: Some(9728 << 20),
                ..MigSample::one_g(1, k)
            })
            .collect()
    }

    #[test]
    fn mig_uuids_and_legacy_ids() {
        let d = devs(3);
        let m = migs(&d);
        let c = cuda_visible_mig(&m[2].uuid, &d, &m);
        assert_eq!((c.visible, c.mig), (vec![1], vec![Some(2)]));
        let legacy = format!("MIG-{}/9/0", d[1].uuid);
        let c = cuda_visible_mig(&format!("0,{legacy}"), &d, &m);
        assert_eq!((c.visible, c.mig), (vec![0, 1], vec![None, Some(2)]));
        assert_eq!(m[2].legacy_id(), legacy);
        // a prefix
        let c = cuda_visible_mig("MIG-44bb", &d, &m);
        assert_eq!(c.mig, vec![Some(4)]);
        // one MIG device per process: the second is skipped, the list goes on
        let c = cuda_visible_mig(&format!("{},{},2", m[0].uuid, m[1].uuid), &d, &m);
        assert_eq!((c.visible, c.mig), (vec![1, 2], vec![Some(0), None]));
        assert_eq!(c.ignored.len(), 1);
        assert!(c.stopped_at.is_none());
        // the same MIG device twice hides everything
        let c = cuda_visible_mig(&format!("{0},{0}", m[3].uuid), &d, &m);
        assert!(c.visible.is_empty() && c.duplicate.is_some());
        // unknown ones end the list
        let c = cuda_visible_mig("2,MIG-ffff,0", &d, &m);
        assert_eq!(c.visible, vec![2]);
        assert!(c.stopped_at.unwrap().reason.contains("no MIG device"));
        let c = cuda_visible_mig(&format!("MIG-{}/3/0", d[1].uuid), &d, &m);
        assert!(c.stopped_at.unwrap().reason.contains("GPU instance 3"));
        let c = cuda_visible_mig("MIG-GPU-nope/7/0", &d, &m);
        assert!(c.stopped_at.unwrap().reason.contains("no GPU"));
        // a GPU entry and one of its MIG devices are different devices
        let c = cuda_visible_mig(&format!("1,{}", m[0].uuid), &d, &m);
        assert_eq!(c.visible, vec![1, 1]);
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
}
