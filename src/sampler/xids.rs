//! XIDs from two sources, merged: NVML events (`events`) and the driver's kernel-log lines
//! (`kmsg`). The kernel line names the process that raised the XID (`pid=…, name=…`) and
//! carries the driver's description; NVML's event is what every driver delivers. The same XID
//! on the same GPU from both becomes one event (source `both`) with the kernel line's details;
//! a kernel line alone (event registration unsupported, a `fallen off the bus` line without an
//! XID, read as XID 79) is an event too; an NVML event alone waits up to [`TWIN_WAIT`] for its
//! kernel line when the kernel log is being read.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::kmsg::{KernelEvent, KmsgReader, PciAddr};
use crate::model::{DeviceId, XidEvent, XidSource};

/// How long an NVML XID waits for its kernel line (the driver writes both at once; this covers
/// the reader thread being a little behind).
pub(crate) const TWIN_WAIT: Duration = Duration::from_millis(100);
/// Two reports of the same XID on the same GPU this close are one event.
const SAME_MS: i64 = 10_000;

/// Merges the two sources; remembers what it announced for [`SAME_MS`].
pub(crate) struct XidMerger {
    kmsg: Option<KmsgReader>,
    /// `(time, gpu, code, from the kernel)` of recent events.
    recent: VecDeque<(i64, u32, u64, bool)>,
    /// Kernel lines about devices NVML does not list, already logged.
    unknown_logged: Vec<PciAddr>,
}

impl XidMerger {
    pub(crate) fn new(kmsg: Option<KmsgReader>) -> XidMerger {
        XidMerger {
            kmsg,
            recent: VecDeque::new(),
            unknown_logged: Vec::new(),
        }
    }

    /// The XIDs of one tick at `time_ms`: NVML's events merged with the kernel lines read
    /// (waiting for a twin at most until `until`, the tick's deadline).
    pub(crate) fn merge<'d>(
        &mut self,
        time_ms: i64,
        nvml: Vec<XidEvent>,
        devices: impl Iterator<Item = &'d DeviceId> + Clone,
        until: Instant,
    ) -> Vec<XidEvent> {
        // (an entry "after" this tick is from before a step back of the wall clock)
        self.recent
            .retain(|r| r.0 <= time_ms && time_ms - r.0 <= SAME_MS);
        let mut kernel: Vec<XidEvent> = match &self.kmsg {
            Some(k) => k
                .drain()
                .into_iter()
                .filter_map(|(_, e)| self.map(time_ms, e, devices.clone()))
                .collect(),
            None => Vec::new(),
        };
        let mut out: Vec<XidEvent> = Vec::with_capacity(nvml.len() + kernel.len());
        let deadline = (Instant::now() + TWIN_WAIT).min(until);
        for mut ev in nvml {
            // Already announced from the kernel log: nothing new.
            if self.seen(&ev, true) {
                continue;
            }
            let mut twin = take_twin(&mut kernel, &ev);
            while twin.is_none() && self.kmsg.is_some() && Instant::now() < deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                match self.kmsg.as_ref().and_then(|k| k.wait(left)) {
                    Some((_, e)) => {
                        if let Some(k) = self.map(time_ms, e, devices.clone()) {
                            kernel.push(k);
                        }
                        twin = take_twin(&mut kernel, &ev);
                    }
                    None => break,
                }
            }
            if let Some(k) = twin {
                ev.pid = k.pid;
                ev.process = k.process;
                ev.detail = k.detail;
                ev.source = XidSource::Both;
            }
            self.recent
                .push_back((time_ms, ev.gpu_index, ev.xid, false));
            out.push(ev);
        }
        for k in kernel {
            // Already announced from NVML (its line came late), or repeated: nothing new.
            if self.seen(&k, false) || out.iter().any(|e| same(e, &k)) {
                continue;
            }
            self.recent.push_back((time_ms, k.gpu_index, k.xid, true));
            out.push(k);
        }
        out
    }

    /// Whether an event like `ev` was announced recently from the other source (`kernel`: from
    /// the kernel log) — or, for a kernel line, from either.
    fn seen(&self, ev: &XidEvent, kernel: bool) -> bool {
        self.recent
            .iter()
            .any(|r| r.1 == ev.gpu_index && r.2 == ev.xid && (r.3 || !kernel))
    }

    /// A kernel event as an XID event on the NVML device at its PCI address.
    fn map<'d>(
        &mut self,
        time_ms: i64,
        e: KernelEvent,
        mut devices: impl Iterator<Item = &'d DeviceId>,
    ) -> Option<XidEvent> {
        let (pci, code, pid, process, detail) = match e {
            KernelEvent::Xid {
                pci,
                code,
                pid,
                name,
                detail,
            } => (pci, code, pid, name, (!detail.is_empty()).then_some(detail)),
            KernelEvent::FallenOff { pci } => (
                pci,
                79,
                None,
                None,
                Some("GPU has fallen off the bus".to_string()),
            ),
        };
        let Some(dev) = devices.find(|d| PciAddr::parse(&d.pci_bus_id) == Some(pci)) else {
            if !self.unknown_logged.contains(&pci) {
                self.unknown_logged.push(pci);
                tracing::warn!(
                    "kernel log: XID {code} on PCI {:04x}:{:02x}:{:02x}, a device NVML does not list",
                    pci.domain,
                    pci.bus,
                    pci.device
                );
            }
            return None;
        };
        Some(XidEvent {
            pid,
            process,
            detail,
            source: XidSource::Kernel,
            ..XidEvent::new(time_ms, dev.index, dev.uuid.clone(), code)
        })
    }
}

fn same(a: &XidEvent, b: &XidEvent) -> bool {
    a.gpu_index == b.gpu_index && a.xid == b.xid
}

/// Removes and returns the kernel event for the same GPU and code as `ev`.
fn take_twin(kernel: &mut Vec<XidEvent>, ev: &XidEvent) -> Option<XidEvent> {
    let i = kernel.iter().position(|k| same(k, ev))?;
    Some(kernel.remove(i))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    fn devs() -> Vec<DeviceId> {
        (0..2)
            .map(|i| DeviceId {
                index: i,
                uuid: format!("GPU-{i}"),
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + i * 0x12),
                ..DeviceId::default()
            })
            .collect()
    }

    fn kernel_file(lines: &[&str]) -> (tempfile::TempDir, XidMerger, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kmsg");
        std::fs::write(&path, "").unwrap();
        let reader = KmsgReader::start(&path).unwrap();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        for l in lines {
            use std::io::Write;
            writeln!(f, "{l}").unwrap();
        }
        std::thread::sleep(Duration::from_millis(400));
        (dir, XidMerger::new(Some(reader)), path)
    }

    #[test]
    fn nvml_and_kernel_reports_merge_and_kernel_only_lines_count() {
        let (_d, mut m, _) = kernel_file(&[
            "4,1500,1000000,-;NVRM: Xid (PCI:0000:18:00): 31, pid=4242, name=python3, MMU Fault",
            "3,1501,1000100,-;NVRM: GPU at PCI:0000:2a:00.0 has fallen off the bus.",
            "4,1502,1000200,-;NVRM: Xid (PCI:0000:99:00): 13, pid=1, name=x, Graphics Exception",
        ]);
        let out = m.merge(
            1000,
            vec![XidEvent::new(1000, 0, "GPU-0", 31)],
            devs().iter(),
            far(),
        );
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(out[0].xid, 31);
        assert_eq!(out[0].source, XidSource::Both);
        assert_eq!(out[0].pid, Some(4242));
        assert_eq!(out[0].process.as_deref(), Some("python3"));
        assert_eq!(out[1].gpu_index, 1);
        assert_eq!(out[1].xid, 79);
        assert_eq!(out[1].source, XidSource::Kernel);
        // The same XID from NVML a tick later is the same event: not announced twice.
        let again = m.merge(
            2000,
            vec![XidEvent::new(2000, 1, "GPU-1", 79)],
            devs().iter(),
            far(),
        );
        assert!(again.is_empty(), "{again:?}");
    }

    #[test]
    fn an_nvml_xid_without_kernel_line_is_not_held_long() {
        let (_d, mut m, _) = kernel_file(&[]);
        let t = Instant::now();
        let out = m.merge(
            1000,
            vec![XidEvent::new(1000, 0, "GPU-0", 94)],
            devs().iter(),
            far(),
        );
        assert!(t.elapsed() < Duration::from_millis(500));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].source, XidSource::Nvml);
        assert_eq!(out[0].pid, None);
        let out = XidMerger::new(None).merge(
            1000,
            vec![XidEvent::new(1, 0, "GPU-0", 94)],
            devs().iter(),
            far(),
        );
        assert_eq!(out.len(), 1);
    }
}
