//! NVIDIA GPUs on the PCI bus, as the kernel lists them in sysfs: the devices under
//! `<root>/bus/pci/devices/*` whose `vendor` is `0x10de` and whose `class` is a display
//! controller of the VGA (`0x0300xx`) or 3D (`0x0302xx`) kind. The GPUs' HDMI/DP audio functions
//! (`0x0403xx`), NVSwitches and bridges (`0x0680xx`, `0x0604xx`) and other vendors' devices are
//! not GPUs and are left out.
//!
//! This is what a GPU that NVML no longer enumerates (a board that failed to initialise, a
//! driver that gave up on it) still leaves behind: the kernel sees the device on the bus. The
//! root is `/sys`, or `$NVML_SIM_SYSFS` when that variable is set: the simulated machine's
//! `/sys`, which nvml-sim fills at `nvmlInit` (so read it after the sampler opened). Under
//! `--sim` without `NVML_SIM_SYSFS` there is no bus to read ([`root`] gives `None`): the
//! simulated GPUs are not this machine's.
//!
//! Bus ids come back in NVML's spelling (`00000000:18:00.0`, see
//! [`PciAddr::nvml_bus_id`](super::kmsg::PciAddr::nvml_bus_id)); sysfs names directories
//! `0000:18:00.0`. Unreadable entries are skipped: this never fails, it finds fewer GPUs.

use std::path::{Path, PathBuf};

use super::kmsg::PciAddr;

/// The environment variable naming the simulated machine's `/sys`.
pub const SIM_SYSFS_ENV: &str = "NVML_SIM_SYSFS";

/// PCI vendor id of NVIDIA.
pub const NVIDIA_VENDOR: u32 = 0x10de;

/// One NVIDIA GPU on the PCI bus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusGpu {
    /// NVML-style bus id, `00000000:18:00.0`.
    pub pci_bus_id: String,
    /// PCI device id (`0x2330` for an H100 SXM), when readable.
    pub device_id: Option<u32>,
    /// PCI class code (`0x030200`).
    pub class: u32,
    /// `current_link_speed` as the kernel wrote it (`32.0 GT/s PCIe`), when readable.
    pub current_link_speed: Option<String>,
    /// `max_link_speed`, when readable.
    pub max_link_speed: Option<String>,
    /// `current_link_width`, when readable.
    pub current_link_width: Option<u32>,
    /// `max_link_width`, when readable.
    pub max_link_width: Option<u32>,
}

/// The sysfs root to scan: `$NVML_SIM_SYSFS` when set (and not empty); else `/sys`, except for
/// a simulated library (`sim`), whose GPUs are not on this machine's bus (`None`).
pub fn root(sim: bool) -> Option<PathBuf> {
    match std::env::var_os(SIM_SYSFS_ENV) {
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ if sim => None,
        _ => Some(PathBuf::from("/sys")),
    }
}

/// A hex number as sysfs writes it (`0x10de\n`).
fn read_hex(path: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(path).ok()?;
    let t = text.trim();
    let t = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    u32::from_str_radix(t, 16).ok()
}

fn read_trimmed(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let t = text.trim();
    (!t.is_empty()).then(|| t.to_string())
}

/// Whether a PCI class code is a GPU: display controller (base class 0x03), VGA (subclass 0x00)
/// or 3D controller (subclass 0x02).
pub fn is_gpu_class(class: u32) -> bool {
    matches!(class >> 8, 0x0300 | 0x0302)
}

/// Whether the NVIDIA driver is meant to serve the GPU at sysfs `path` (bus id `addr`): not when
/// it is bound to another driver (`vfio-pci` for passthrough, `nouveau`), nor when it is bound to
/// `nvidia` but the driver's GPU list in procfs (`proc_gpus`, when it exists) leaves it out — a
/// container runtime shows a container only the GPUs it was given there, while sysfs shows the
/// host's. An unbound GPU (the driver's probe failed) is one.
fn served_by_nvidia(path: &Path, addr: &PciAddr, proc_gpus: Option<&[String]>) -> bool {
    let driver = std::fs::read_link(path.join("driver"))
        .ok()
        .and_then(|l| l.file_name().map(|n| n.to_string_lossy().into_owned()));
    match driver.as_deref() {
        None => true,
        Some("nvidia") => proc_gpus.is_none_or(|listed| listed.contains(&addr.nvml_bus_id())),
        Some(_) => false,
    }
}

/// The bus ids (NVML's spelling) the driver lists under `dir` (`/proc/driver/nvidia/gpus`), when
/// that directory can be read.
fn driver_gpus(dir: &Path) -> Option<Vec<String>> {
    let listed = std::fs::read_dir(dir).ok()?;
    Some(
        listed
            .flatten()
            .filter_map(|e| PciAddr::parse(e.file_name().to_str()?).map(|a| a.nvml_bus_id()))
            .collect(),
    )
}

/// Every NVIDIA GPU under `root/bus/pci/devices` that the NVIDIA driver is meant to serve (see
/// `served_by_nvidia`; the driver's GPU list is `root/../proc/driver/nvidia/gpus`), sorted by bus
/// id. A missing or unreadable tree gives an empty list.
pub fn nvidia_gpus(root: &Path) -> Vec<BusGpu> {
    let proc_gpus = driver_gpus(
        &root
            .parent()
            .unwrap_or(root)
            .join("proc/driver/nvidia/gpus"),
    );
    let dir = root.join("bus/pci/devices");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<BusGpu> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let addr = PciAddr::parse(name.to_str()?)?;
            let path = e.path();
            if read_hex(&path.join("vendor"))? != NVIDIA_VENDOR {
                return None;
            }
            let class = read_hex(&path.join("class"))?;
            if !is_gpu_class(class) || !served_by_nvidia(&path, &addr, proc_gpus.as_deref()) {
                return None;
            }
            Some(BusGpu {
                pci_bus_id: addr.nvml_bus_id(),
                device_id: read_hex(&path.join("device")),
                class,
                current_link_speed: read_trimmed(&path.join("current_link_speed")),
                max_link_speed: read_trimmed(&path.join("max_link_speed")),
                current_link_width: read_trimmed(&path.join("current_link_width"))
                    .and_then(|w| w.parse().ok()),
                max_link_width: read_trimmed(&path.join("max_link_width"))
                    .and_then(|w| w.parse().ok()),
            })
        })
        .collect();
    out.sort_by(|a, b| a.pci_bus_id.cmp(&b.pci_bus_id));
    out.dedup_by(|a, b| a.pci_bus_id == b.pci_bus_id);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(root: &Path, name: &str, vendor: &str, class: &str) {
        let d = root.join("bus/pci/devices").join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("vendor"), format!("{vendor}\n")).unwrap();
        std::fs::write(d.join("class"), format!("{class}\n")).unwrap();
        std::fs::write(d.join("device"), "0x2330\n").unwrap();
    }

    #[test]
    fn lists_nvidia_display_and_3d_controllers_only() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        device(root, "0000:3a:00.0", "0x10de", "0x030200"); // 3D controller (H100)
        device(root, "0000:18:00.0", "0x10de", "0x030000"); // VGA (workstation GPU)
        device(root, "0000:18:00.1", "0x10de", "0x040300"); // its HDMI audio
        device(root, "0000:05:00.0", "0x10de", "0x068000"); // NVSwitch
        device(root, "0000:04:00.0", "0x10de", "0x060400"); // PCIe bridge
        device(root, "0000:00:1f.6", "0x8086", "0x020000"); // Intel NIC
        device(root, "0000:65:00.0", "0x1002", "0x030000"); // AMD GPU
        let d = root.join("bus/pci/devices/0000:3a:00.0");
        std::fs::write(d.join("current_link_speed"), "16.0 GT/s PCIe\n").unwrap();
        std::fs::write(d.join("max_link_speed"), "32.0 GT/s PCIe\n").unwrap();
        std::fs::write(d.join("current_link_width"), "8\n").unwrap();
        std::fs::write(d.join("max_link_width"), "16\n").unwrap();
        // Junk a real tree can hold: a file, a bad name, an unreadable vendor.
        std::fs::write(root.join("bus/pci/devices/README"), "x").unwrap();
        std::fs::create_dir_all(root.join("bus/pci/devices/0000:99:00.0")).unwrap();

        let gpus = nvidia_gpus(root);
        let ids: Vec<&str> = gpus.iter().map(|g| g.pci_bus_id.as_str()).collect();
        assert_eq!(ids, ["00000000:18:00.0", "00000000:3A:00.0"]);
        let h100 = &gpus[1];
        assert_eq!(h100.class, 0x030200);
        assert_eq!(h100.device_id, Some(0x2330));
        assert_eq!(h100.current_link_speed.as_deref(), Some("16.0 GT/s PCIe"));
        assert_eq!(h100.max_link_width, Some(16));
        assert_eq!(h100.current_link_width, Some(8));
        assert_eq!(gpus[0].max_link_speed, None);
    }

    /// A GPU bound to another driver is not the NVIDIA driver's; one bound to it that the
    /// driver's procfs list leaves out was not given to this container; an unbound one is
    /// expected (the driver's probe failed).
    #[test]
    fn gpus_the_driver_does_not_serve_are_left_out() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("sys");
        let bind = |name: &str, driver: &str| {
            device(&root, name, "0x10de", "0x030200");
            let link = root.join("bus/pci/devices").join(name).join("driver");
            std::os::unix::fs::symlink(format!("../../../bus/pci/drivers/{driver}"), link).unwrap();
        };
        bind("0000:3a:00.0", "nvidia"); // given to the container
        bind("0000:3b:00.0", "nvidia"); // the host's, not given
        bind("0000:3c:00.0", "vfio-pci"); // passed through to a VM
        device(&root, "0000:3d:00.0", "0x10de", "0x030200"); // unbound
        let ids = |root: &Path| -> Vec<String> {
            nvidia_gpus(root)
                .into_iter()
                .map(|g| g.pci_bus_id)
                .collect()
        };
        // No procfs list (not readable here): every GPU bound to nvidia counts.
        assert_eq!(
            ids(&root),
            ["00000000:3A:00.0", "00000000:3B:00.0", "00000000:3D:00.0"]
        );
        std::fs::create_dir_all(tmp.path().join("proc/driver/nvidia/gpus/0000:3a:00.0")).unwrap();
        assert_eq!(ids(&root), ["00000000:3A:00.0", "00000000:3D:00.0"]);
    }

    #[test]
    fn a_missing_tree_is_no_gpus() {
        assert!(nvidia_gpus(Path::new("/nonexistent/sysfs")).is_empty());
    }

    #[test]
    fn gpu_classes() {
        assert!(is_gpu_class(0x030000));
        assert!(is_gpu_class(0x030200));
        assert!(!is_gpu_class(0x030100)); // XGA
        assert!(!is_gpu_class(0x040300));
        assert!(!is_gpu_class(0x068000));
    }
}
