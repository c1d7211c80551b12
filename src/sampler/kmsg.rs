//! The NVIDIA driver's kernel-log lines about XIDs and lost GPUs, as the kernel log carries them:
//! `/dev/kmsg` records (`PRIORITY,SEQ,MICROSECONDS,FLAGS;MESSAGE`), `dmesg` lines
//! (`[12345.678901] MESSAGE`, `[Mon May 25 12:34:56 2026] MESSAGE`) and syslog / journal lines
//! (`Oct 02 10:41:07 host kernel: MESSAGE`).
//!
//! Message shapes across driver generations:
//!
//! ```text
//! NVRM: Xid (PCI:0000:1a:00): 79, GPU has fallen off the bus.
//! NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.
//! NVRM: Xid (PCI:0000:03:00): 31, pid='1234', name='python3', 'Illegal memory access'
//! NVRM: Xid (PCI:0000:b9:00): 74, pid=<unknown>, name=<unknown>, NVLink: fatal error …
//! NVRM: Xid (PCI:0000:10:00.0): 79, …
//! NVRM: GPU at PCI:0000:18:00.0 has fallen off the bus.
//! ```
//!
//! The parser is total: any line either is one of these or is not (`None`); nothing panics.
//! `pid=0` and `<unknown>` mean "no process". NVSwitch `SXid` lines are not GPU XIDs.
//!
//! [`KmsgReader`] follows the kernel log on a thread of its own (see `xids` for how its events
//! are merged with NVML's).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

/// A GPU's PCI address as the kernel log and NVML name it, normalised: domain, bus, device
/// (the function is always 0 for a GPU and is not compared).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PciAddr {
    /// PCI domain.
    pub domain: u32,
    /// Bus number.
    pub bus: u32,
    /// Device number.
    pub device: u32,
}

impl PciAddr {
    /// Parses `0000:18:00`, `0000:18:00.0` or NVML's `00000000:18:00.0` (hex fields).
    pub fn parse(s: &str) -> Option<PciAddr> {
        let s = s.trim();
        let s = s.split_once('.').map_or(s, |(a, _)| a);
        let mut parts = s.split(':');
        let (d, b, v) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || [d, b, v].iter().any(|p| p.is_empty() || p.len() > 8) {
            return None;
        }
        Some(PciAddr {
            domain: u32::from_str_radix(d, 16).ok()?,
            bus: u32::from_str_radix(b, 16).ok()?,
            device: u32::from_str_radix(v, 16).ok()?,
        })
    }

    /// The address as NVML spells a GPU's `pci.busId`: `00000000:18:00.0` (8-digit domain,
    /// upper-case hex, function 0). Comparable with [`crate::model::DeviceId::pci_bus_id`] after
    /// [`PciAddr::normalise`].
    pub fn nvml_bus_id(self) -> String {
        format!("{:08X}:{:02X}:{:02X}.0", self.domain, self.bus, self.device)
    }

    /// Any spelling of a bus id (kernel log, sysfs, NVML, either case) in NVML's form; `None`
    /// when it is not a PCI address.
    pub fn normalise(s: &str) -> Option<String> {
        PciAddr::parse(s).map(PciAddr::nvml_bus_id)
    }
}

/// What one kernel-log line says about a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelEvent {
    /// `NVRM: Xid (PCI:…): CODE, …`.
    Xid {
        /// The GPU.
        pci: PciAddr,
        /// The XID code.
        code: u64,
        /// The process that triggered it, when the driver names one.
        pid: Option<u32>,
        /// That process's name, when the driver names it.
        name: Option<String>,
        /// The rest of the message (the driver's description), control characters escaped.
        detail: String,
    },
    /// `NVRM: GPU at PCI:… has fallen off the bus.` (a loss reported without an XID).
    FallenOff {
        /// The GPU.
        pci: PciAddr,
    },
}

/// The message part of a kernel-log line in any of the three forms (or the line itself).
fn message(line: &str) -> &str {
    let line = line.trim_end_matches(['\n', '\r']);
    // /dev/kmsg: "6,1234,5678901,-;MESSAGE" (a prefix of digits, commas and one flag field).
    if let Some((head, rest)) = line.split_once(';') {
        let mut fields = head.split(',');
        let numeric = fields
            .next()
            .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if numeric && head.matches(',').count() >= 2 {
            return rest;
        }
    }
    // dmesg: "[12345.678901] MESSAGE" or "[Mon May 25 12:34:56 2026] MESSAGE".
    if let Some(rest) = line.strip_prefix('[') {
        if let Some((_, msg)) = rest.split_once("] ") {
            return msg;
        }
    }
    // syslog / journal: "Oct 02 10:41:07 host kernel: MESSAGE".
    if let Some((_, msg)) = line.split_once(" kernel: ") {
        return msg;
    }
    line
}

/// A `key=value` field of an XID line: `pid=1234`, `pid='1234'`, `name=<unknown>`.
fn field<'a>(parts: &[&'a str], key: &str) -> Option<&'a str> {
    parts.iter().find_map(|p| {
        let v = p.trim().strip_prefix(key)?.strip_prefix('=')?;
        let v = v.trim().trim_matches('\'');
        (!v.is_empty() && v != "<unknown>").then_some(v)
    })
}

/// Parses one kernel-log line; `None` for anything that is not an NVIDIA GPU XID or loss.
pub fn parse_line(line: &str) -> Option<KernelEvent> {
    let msg = message(line).trim_start();
    let msg = msg.strip_prefix("NVRM:")?.trim_start();
    if let Some(rest) = msg.strip_prefix("Xid (PCI:") {
        let (addr, rest) = rest.split_once(')')?;
        let pci = PciAddr::parse(addr)?;
        let rest = rest.trim_start().strip_prefix(':')?.trim_start();
        let (code, rest) = rest.split_once(',').unwrap_or((rest, ""));
        let code = code.trim().parse::<u64>().ok()?;
        let parts: Vec<&str> = rest.split(',').collect();
        let pid = field(&parts, "pid")
            .and_then(|p| p.parse::<u32>().ok())
            .filter(|p| *p != 0);
        let name = field(&parts, "name").map(crate::values::escape_control);
        let detail: Vec<&str> = parts
            .iter()
            .map(|p| p.trim())
            .filter(|p| !p.starts_with("pid=") && !p.starts_with("name="))
            .collect();
        let detail = detail.join(", ");
        let detail = crate::values::escape_control(detail.trim().trim_matches('\''));
        return Some(KernelEvent::Xid {
            pci,
            code,
            pid,
            name,
            detail,
        });
    }
    let rest = msg.strip_prefix("GPU at PCI:")?;
    let (addr, rest) = rest.split_once(' ')?;
    rest.contains("fallen off the bus").then_some(())?;
    Some(KernelEvent::FallenOff {
        pci: PciAddr::parse(addr)?,
    })
}

/// Where the kernel log is read from: `GPUWATCH_KMSG`, else nvml-sim's stand-in
/// (`NVML_SIM_KMSG`, the file the simulated driver writes its kernel lines to), else
/// `/dev/kmsg`.
pub fn default_path() -> PathBuf {
    ["GPUWATCH_KMSG", "NVML_SIM_KMSG"]
        .iter()
        .find_map(|v| std::env::var_os(v).filter(|p| !p.is_empty()))
        .map_or_else(|| PathBuf::from("/dev/kmsg"), PathBuf::from)
}

/// A thread following the kernel log from now on and passing on the NVIDIA lines, each with
/// the time it was read (UTC ms). `/dev/kmsg` gives one record per read, from its end at start
/// (records from before gpuwatch started are not replayed, like NVML events); a regular file is
/// followed like `tail -f` from its end (from its start when it appears after gpuwatch did).
pub(crate) struct KmsgReader {
    rx: mpsc::Receiver<(i64, KernelEvent)>,
}

impl KmsgReader {
    /// Opens `path` and starts following it. `Err` says why it cannot be read (e.g. a kernel
    /// with `dmesg_restrict` and no privilege); a regular file that does not exist yet is
    /// waited for.
    pub(crate) fn start(path: &Path) -> Result<KmsgReader, String> {
        let (tx, rx) = mpsc::channel();
        let first = match File::open(path) {
            Ok(mut f) => {
                // Follow from now on.
                f.seek(SeekFrom::End(0))
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                Some(f)
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound && path != Path::new("/dev/kmsg") =>
            {
                None
            }
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let path = path.to_path_buf();
        std::thread::Builder::new()
            .name("gpuwatch-kmsg".into())
            .stack_size(256 * 1024)
            .spawn(move || follow(&path, first, &tx))
            .map_err(|e| format!("cannot start the kernel-log thread: {e}"))?;
        Ok(KmsgReader { rx })
    }

    /// The lines read since the last call.
    pub(crate) fn drain(&self) -> Vec<(i64, KernelEvent)> {
        self.rx.try_iter().collect()
    }

    /// Waits up to `timeout` for one more line.
    pub(crate) fn wait(&self, timeout: Duration) -> Option<(i64, KernelEvent)> {
        self.rx.recv_timeout(timeout).ok()
    }
}

/// The reader thread: records from a character device, lines from a regular file.
fn follow(path: &Path, mut file: Option<File>, tx: &mpsc::Sender<(i64, KernelEvent)>) {
    let mut buf = vec![0u8; 8192];
    let mut pending: Vec<u8> = Vec::new();
    let mut warned = false;
    loop {
        let Some(f) = file.as_mut() else {
            std::thread::sleep(Duration::from_millis(200));
            file = File::open(path).ok();
            continue;
        };
        match f.read(&mut buf) {
            Ok(0) => {
                // End of a regular file: wait for more (a file truncated or replaced is
                // re-opened from its start).
                std::thread::sleep(Duration::from_millis(100));
                let pos = f.stream_position().unwrap_or(0);
                let len = std::fs::metadata(path).map_or(pos, |m| m.len());
                if len < pos {
                    file = File::open(path).ok();
                    pending.clear();
                }
            }
            Ok(n) => {
                pending.extend_from_slice(&buf[..n]);
                while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=end).collect();
                    let line = String::from_utf8_lossy(&line);
                    if let Some(ev) = parse_line(&line) {
                        if tx.send((crate::sys::now_ms(), ev)).is_err() {
                            return;
                        }
                    }
                }
                if pending.len() > 64 * 1024 {
                    pending.clear();
                }
            }
            // /dev/kmsg: records were overwritten before we read them; go on.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                if !warned {
                    warned = true;
                    tracing::warn!("reading the kernel log {} failed: {e}", path.display());
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pci(bus: u32) -> PciAddr {
        PciAddr {
            domain: 0,
            bus,
            device: 0,
        }
    }

    #[test]
    fn every_driver_shape() {
        let cases = [
            (
                "NVRM: Xid (PCI:0000:1a:00): 79, GPU has fallen off the bus.",
                KernelEvent::Xid {
                    pci: pci(0x1a),
                    code: 79,
                    pid: None,
                    name: None,
                    detail: "GPU has fallen off the bus.".into(),
                },
            ),
            (
                "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.",
                KernelEvent::Xid {
                    pci: pci(0x18),
                    code: 79,
                    pid: Some(1234),
                    name: None,
                    detail: "GPU has fallen off the bus.".into(),
                },
            ),
            (
                "NVRM: Xid (PCI:0000:3d:00): 79, pid=0, GPU has fallen off the bus.",
                KernelEvent::Xid {
                    pci: pci(0x3d),
                    code: 79,
                    pid: None,
                    name: None,
                    detail: "GPU has fallen off the bus.".into(),
                },
            ),
            (
                "NVRM: Xid (PCI:0000:03:00): 31, pid='1234', name='python3', 'Illegal memory access'",
                KernelEvent::Xid {
                    pci: pci(3),
                    code: 31,
                    pid: Some(1234),
                    name: Some("python3".into()),
                    detail: "Illegal memory access".into(),
                },
            ),
            (
                "NVRM: Xid (PCI:0000:b9:00): 74, pid=<unknown>, name=<unknown>, NVLink: fatal error detected on link 6(0x10000, 0x0)",
                KernelEvent::Xid {
                    pci: pci(0xb9),
                    code: 74,
                    pid: None,
                    name: None,
                    detail: "NVLink: fatal error detected on link 6(0x10000, 0x0)".into(),
                },
            ),
            (
                "NVRM: Xid (PCI:0000:10:00.0): 79, GPU has fallen off the bus.",
                KernelEvent::Xid {
                    pci: pci(0x10),
                    code: 79,
                    pid: None,
                    name: None,
                    detail: "GPU has fallen off the bus.".into(),
                },
            ),
            (
                "NVRM: GPU at PCI:0000:18:00.0 has fallen off the bus.",
                KernelEvent::FallenOff { pci: pci(0x18) },
            ),
        ];
        for (msg, want) in cases {
            for line in [
                msg.to_string(),
                format!("4,1082,123456789,-;{msg}"),
                format!("[12345.678901] {msg}"),
                format!("[Mon May 25 12:34:56 2026] {msg}"),
                format!("Oct 02 10:41:07 gpu-node-3 kernel: {msg}\n"),
            ] {
                assert_eq!(parse_line(&line), Some(want.clone()), "{line}");
            }
        }
    }

    #[test]
    fn other_lines_are_not_events() {
        for line in [
            "NVRM: A GPU crash dump has been created.",
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 44",
            "NVRM: Xid (PCI:0000:18:00): seventy-nine, bad",
            "NVRM: Xid (PCI:zz:18:00): 79, x",
            "[12345.678901] usb 1-1: new high-speed USB device",
            "",
            ";;;,,,",
            "NVRM: GPU at PCI:0000:18:00.0 is fine.",
        ] {
            assert_eq!(parse_line(line), None, "{line}");
        }
    }

    #[test]
    fn names_are_escaped_and_addresses_match_nvml() {
        let Some(KernelEvent::Xid { name, .. }) =
            parse_line("NVRM: Xid (PCI:0000:03:00): 31, pid=7, name='evil\u{1b}[31m', 'x'")
        else {
            panic!("not parsed");
        };
        assert_eq!(name.as_deref(), Some("evil\\u{1b}[31m"));
        assert_eq!(PciAddr::parse("00000000:18:00.0"), Some(pci(0x18)));
        assert_eq!(PciAddr::parse("0000:18:00"), Some(pci(0x18)));
        assert_eq!(PciAddr::parse("18:00"), None);
    }

    #[test]
    fn every_spelling_normalises_to_nvmls() {
        for s in [
            "0000:3a:00.0",
            "0000:3A:00",
            "00000000:3a:00.0",
            " 00000000:3A:00.0\n",
        ] {
            assert_eq!(
                PciAddr::normalise(s).as_deref(),
                Some("00000000:3A:00.0"),
                "{s}"
            );
        }
        assert_eq!(
            PciAddr::normalise("10000:db:1f.0").as_deref(),
            Some("00010000:DB:1F.0")
        );
        assert_eq!(PciAddr::normalise("not-a-bus"), None);
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let alphabet: Vec<char> =
            "NVRM: Xid (PCI:0000:1a:00.0): 79, pid='=<>,;[]kernel GPU at é\u{0}"
                .chars()
                .collect();
        for _ in 0..5000 {
            let len = (x % 80) as usize;
            let line: String = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    alphabet[(x % alphabet.len() as u64) as usize]
                })
                .collect();
            let _ = parse_line(&line);
            let _ = parse_line(&format!("NVRM: Xid (PCI:0000:18:00): {line}"));
        }
    }
}
