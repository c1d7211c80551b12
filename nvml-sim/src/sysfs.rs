//! A fake sysfs tree (`NVML_SIM_SYSFS=DIR`): `DIR/bus/pci/devices/<dddd:bb:dd.f>/` with
//! `vendor`, `device`, `class`, `subsystem_vendor`, `subsystem_device`, link speed and width files
//! for every scenario GPU (hidden ones included), plus two distractors: an Intel NIC and the
//! NVIDIA audio function `.1` of the first GPU.
//!
//! A new device directory is filled in a temporary directory and renamed into place; files of an
//! existing one are each written to a temporary name and renamed, so a reader never sees half a
//! file.

use std::io;
use std::path::Path;

use crate::scenario::DeviceSpec;
use crate::sim::Sim;

/// `current_link_speed` / `max_link_speed` text of a PCIe generation.
pub fn link_speed(generation: u32) -> &'static str {
    match generation {
        1 => "2.5 GT/s PCIe",
        2 => "5.0 GT/s PCIe",
        3 => "8.0 GT/s PCIe",
        4 => "16.0 GT/s PCIe",
        5 => "32.0 GT/s PCIe",
        6 => "64.0 GT/s PCIe",
        _ => "Unknown",
    }
}

/// (file name, contents) of a GPU's sysfs directory.
pub fn gpu_files(d: &DeviceSpec) -> Vec<(&'static str, String)> {
    vec![
        ("vendor", format!("0x{:04x}\n", d.pci_device_id & 0xffff)),
        ("device", format!("0x{:04x}\n", d.pci_device_id >> 16)),
        ("class", format!("0x{:06x}\n", d.pci_class)),
        (
            "subsystem_vendor",
            format!("0x{:04x}\n", d.pci_subsystem_id & 0xffff),
        ),
        (
            "subsystem_device",
            format!("0x{:04x}\n", d.pci_subsystem_id >> 16),
        ),
        (
            "current_link_speed",
            format!("{}\n", link_speed(d.pcie_link_gen)),
        ),
        ("max_link_speed", format!("{}\n", link_speed(d.pcie_gen))),
        ("current_link_width", format!("{}\n", d.pcie_link_width)),
        ("max_link_width", format!("{}\n", d.pcie_width)),
    ]
}

fn other_files(
    vendor: u32,
    device: u32,
    class: u32,
    generation: u32,
    width: u32,
) -> Vec<(&'static str, String)> {
    vec![
        ("vendor", format!("0x{vendor:04x}\n")),
        ("device", format!("0x{device:04x}\n")),
        ("class", format!("0x{class:06x}\n")),
        (
            "current_link_speed",
            format!("{}\n", link_speed(generation)),
        ),
        ("max_link_speed", format!("{}\n", link_speed(generation))),
        ("current_link_width", format!("{width}\n")),
        ("max_link_width", format!("{width}\n")),
    ]
}

/// Writes (or rewrites) the tree under `dir`.
pub fn write(sim: &Sim, dir: &Path) -> io::Result<()> {
    let devices = dir.join("bus").join("pci").join("devices");
    std::fs::create_dir_all(&devices)?;
    let tmp_root = dir.join(format!(".nvml-sim-tmp-{}", std::process::id()));
    let mut entries: Vec<(String, Vec<(&'static str, String)>)> = sim
        .scenario
        .devices
        .iter()
        .map(|d| (d.sysfs_name(), gpu_files(d)))
        .collect();
    entries.push((
        "0000:00:1f.6".into(),
        other_files(0x8086, 0x15b8, 0x020000, 3, 1),
    ));
    if let Some(first) = sim.scenario.devices.first() {
        let name = first.sysfs_name();
        let audio = format!("{}.1", name.trim_end_matches(".0"));
        entries.push((
            audio,
            other_files(
                0x10de,
                0x22a3,
                0x040300,
                first.pcie_link_gen,
                first.pcie_link_width,
            ),
        ));
    }
    for (name, files) in &entries {
        write_device(&devices, &tmp_root, name, files)?;
    }
    let _ = std::fs::remove_dir_all(&tmp_root);
    Ok(())
}

fn write_device(
    devices: &Path,
    tmp_root: &Path,
    name: &str,
    files: &[(&'static str, String)],
) -> io::Result<()> {
    let target = devices.join(name);
    if !target.exists() {
        let tmp = tmp_root.join(name);
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp)?;
        for (file, text) in files {
            std::fs::write(tmp.join(file), text)?;
        }
        if std::fs::rename(&tmp, &target).is_ok() {
            return Ok(());
        }
        // another process created it meanwhile: rewrite its files in place
        std::fs::create_dir_all(&target)?;
    }
    for (file, text) in files {
        let tmp = target.join(format!(".{file}.tmp-{}", std::process::id()));
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, target.join(file))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_has_every_gpu_and_the_distractors() {
        let s = crate::scenario::parse(
            "[devices]\ncount = 3\n[[device]]\nindex = 1\nhidden = true\npcie_link_gen = 4\n\
             pcie_link_width = 8\n[[device]]\nindex = 2\npci_class = 0x030000\n",
            "s.toml",
            None,
        )
        .unwrap();
        let sim = Sim::new(s, 1.0, 0.0, None);
        let dir = std::env::temp_dir().join(format!("nvml-sim-sysfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        write(&sim, &dir).unwrap();
        // rewriting an existing tree works too
        write(&sim, &dir).unwrap();
        let dev = dir.join("bus/pci/devices");
        let read = |d: &str, f: &str| std::fs::read_to_string(dev.join(d).join(f)).unwrap();
        assert_eq!(read("0000:18:00.0", "vendor"), "0x10de\n");
        assert_eq!(read("0000:18:00.0", "device"), "0x2330\n");
        assert_eq!(read("0000:18:00.0", "class"), "0x030200\n");
        assert_eq!(read("0000:18:00.0", "max_link_speed"), "32.0 GT/s PCIe\n");
        assert_eq!(
            read("0000:2a:00.0", "current_link_speed"),
            "16.0 GT/s PCIe\n"
        );
        assert_eq!(read("0000:2a:00.0", "current_link_width"), "8\n");
        assert_eq!(read("0000:2a:00.0", "max_link_width"), "16\n");
        assert_eq!(read("0000:3a:00.0", "class"), "0x030000\n");
        assert_eq!(read("0000:00:1f.6", "vendor"), "0x8086\n");
        assert_eq!(read("0000:00:1f.6", "class"), "0x020000\n");
        assert_eq!(read("0000:18:00.1", "vendor"), "0x10de\n");
        assert_eq!(read("0000:18:00.1", "class"), "0x040300\n");
        let mut names: Vec<String> = std::fs::read_dir(&dev)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "0000:00:1f.6",
                "0000:18:00.0",
                "0000:18:00.1",
                "0000:2a:00.0",
                "0000:3a:00.0"
            ]
        );
        let leftovers = std::fs::read_dir(dev.join("0000:18:00.0"))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with('.')
            })
            .count();
        assert_eq!(leftovers, 0);
        assert!(!dir
            .join(format!(".nvml-sim-tmp-{}", std::process::id()))
            .exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
