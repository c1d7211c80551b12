//! The driver's kernel log (`NVML_SIM_KMSG=PATH`): a background thread appends NVRM lines in
//! `/dev/kmsg` record form (`PRIORITY,SEQ,MICROSECONDS,-;MESSAGE`) when scenario events become due.
//!
//! XID lines come in the shapes seen across driver generations (`KmsgStyle`); a `lost` event
//! writes the "fallen off the bus" line; a `kmsg` event writes its text.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::scenario::{EventKind, KmsgStyle, Xid};
use crate::sim::Sim;

/// Seconds of fake uptime at scenario start (MICROSECONDS = this + real elapsed).
pub const FAKE_BOOT_S: u64 = 1000;
/// First sequence number.
const FIRST_SEQ: u64 = 1500;

/// Default text of common XIDs (after the code and the process fields).
pub fn default_text(code: u64) -> &'static str {
    match code {
        13 => "Graphics Engine Exception",
        31 => "MMU Fault: illegal memory access",
        43 => "Reset Channel Verif Error",
        45 => "Preemptive Cleanup, due to previous errors",
        48 => "An uncorrectable double bit error (DBE) has been detected on GPU",
        63 => "Row remapping event: ECC page retirement or row remapping recording event",
        64 => "Row remapping failure",
        74 => "NVLink: fatal error detected on link 0",
        79 => "GPU has fallen off the bus.",
        92 => "High single-bit ECC error rate",
        94 => "Contained ECC error",
        95 => "Uncontained ECC error",
        119 => "GSP RPC timeout",
        120 => "GSP error",
        154 => "GPU recovery action changed",
        _ => "Xid error",
    }
}

/// An XID's kernel-log message (`NVRM: Xid (PCI:0000:18:00): 79, …`); `pci` is `DDDD:BB:DD`.
/// `None` for `KmsgStyle::Off`.
pub fn xid_message(
    style: KmsgStyle,
    pci: &str,
    code: u64,
    pid: u32,
    name: &str,
    text: &str,
) -> Option<String> {
    let rest = match style {
        KmsgStyle::Off => return None,
        KmsgStyle::PidName | KmsgStyle::Function => {
            format!("{code}, pid={pid}, name={name}, {text}")
        }
        KmsgStyle::Pid => format!("{code}, pid={pid}, {text}"),
        KmsgStyle::Quoted => format!("{code}, pid='{pid}', name='{name}', '{text}'"),
        KmsgStyle::Unknown => format!("{code}, pid=<unknown>, name=<unknown>, {text}"),
        KmsgStyle::None => format!("{code}, {text}"),
    };
    let bus = if style == KmsgStyle::Function {
        format!("{pci}.0")
    } else {
        pci.to_string()
    };
    Some(format!("NVRM: Xid (PCI:{bus}): {rest}"))
}

/// One `/dev/kmsg` record line (with the newline).
pub fn record(priority: u8, seq: u64, micros: u64, message: &str) -> String {
    format!("{priority},{seq},{micros},-;{message}\n")
}

/// (scenario time, priority, message) of every kernel-log line at or after the start.
pub fn lines(sim: &Sim) -> Vec<(f64, u8, String)> {
    let start = sim.start_s();
    let mut out = Vec::new();
    for ev in sim.scenario.events.iter().filter(|e| e.at_s >= start) {
        let gpu = ev.gpu as usize;
        let dev = sim.device(gpu);
        match &ev.kind {
            EventKind::Xid(x) => {
                if let Some(m) = xid_line(sim, gpu, x) {
                    out.push((ev.at_s, 4, m));
                }
            }
            EventKind::Lost => out.push((
                ev.at_s,
                3,
                format!(
                    "NVRM: GPU at PCI:{} has fallen off the bus.",
                    dev.sysfs_name()
                ),
            )),
            EventKind::Kmsg(text) => out.push((ev.at_s, 4, text.clone())),
            _ => {}
        }
    }
    out
}

fn xid_line(sim: &Sim, gpu: usize, x: &Xid) -> Option<String> {
    let pid = match x.pid {
        Some(p) => sim.resolve_pid(p),
        None => sim
            .scenario
            .processes
            .iter()
            .find(|p| p.gpu as usize == gpu)
            .map(|p| sim.resolve_pid(p.pid))
            .unwrap_or(0),
    };
    let name = x.process_name.clone().unwrap_or_else(|| {
        // the kernel prints the task's comm: the program's file name, at most 15 bytes
        if let Some(n) = sim.process_name(pid) {
            let program = n.split_whitespace().next().unwrap_or(n);
            let base = program.rsplit('/').next().unwrap_or(program);
            // (TASK_COMM_LEN: 15 bytes and the NUL)
            let mut end = base.len().min(15);
            while !base.is_char_boundary(end) {
                end -= 1;
            }
            return base[..end].to_string();
        }
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()
            .map(|c| c.trim_end().to_string())
            .filter(|c| pid != 0 && !c.is_empty())
            .unwrap_or_else(|| "python3".into())
    });
    let text = x.text.as_deref().unwrap_or(default_text(x.code));
    xid_message(
        x.kmsg,
        &sim.device(gpu).kmsg_pci(),
        x.code,
        pid,
        &name,
        text,
    )
}

/// Starts the writer thread (once per process).
pub fn start(sim: Arc<Sim>, path: PathBuf) {
    static STARTED: AtomicBool = AtomicBool::new(false);
    if STARTED.swap(true, Ordering::SeqCst) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("nvml-sim-kmsg".into())
        .spawn(move || run(&sim, &path));
    if let Err(e) = spawned {
        eprintln!("nvml-sim: cannot start the kernel-log writer: {e}");
    }
}

fn run(sim: &Sim, path: &std::path::Path) {
    for (seq, (at_s, priority, message)) in (FIRST_SEQ..).zip(lines(sim)) {
        let due = sim.real_s_of(at_s);
        if !due.is_finite() {
            return;
        }
        let now = sim.real_elapsed().as_secs_f64();
        if due > now {
            std::thread::sleep(Duration::from_secs_f64(due - now));
        }
        let micros = FAKE_BOOT_S * 1_000_000 + sim.real_elapsed().as_micros() as u64;
        let line = record(priority, seq, micros, &message);
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            eprintln!("nvml-sim: cannot append to {}: {e}", path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PCI: &str = "0000:18:00";

    fn m(style: KmsgStyle, code: u64) -> String {
        xid_message(style, PCI, code, 1234, "python3", default_text(code)).unwrap()
    }

    #[test]
    fn every_shape() {
        assert_eq!(
            m(KmsgStyle::PidName, 79),
            "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
        );
        assert_eq!(
            m(KmsgStyle::Pid, 79),
            "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus."
        );
        assert_eq!(
            m(KmsgStyle::Quoted, 31),
            "NVRM: Xid (PCI:0000:18:00): 31, pid='1234', name='python3', \
             'MMU Fault: illegal memory access'"
        );
        assert_eq!(
            m(KmsgStyle::Unknown, 74),
            "NVRM: Xid (PCI:0000:18:00): 74, pid=<unknown>, name=<unknown>, \
             NVLink: fatal error detected on link 0"
        );
        assert_eq!(
            m(KmsgStyle::None, 79),
            "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus."
        );
        assert_eq!(
            m(KmsgStyle::Function, 13),
            "NVRM: Xid (PCI:0000:18:00.0): 13, pid=1234, name=python3, Graphics Engine Exception"
        );
        assert_eq!(xid_message(KmsgStyle::Off, PCI, 79, 1, "x", "y"), None);
        assert_eq!(default_text(9999), "Xid error");
        assert_eq!(
            record(4, 7, 1_000_000_123, "NVRM: hi"),
            "4,7,1000000123,-;NVRM: hi\n"
        );
    }

    #[test]
    fn lines_skip_past_events_and_use_scenario_defaults() {
        let s = crate::scenario::parse(
            r#"
[devices]
count = 2
[[device]]
index = 1
pci_bus_id = "0000:5D:00.0"
[[process]]
gpu = 1
pid = 4242
[[event]]
at_s = 5
gpu = 1
kind = "xid"
code = 79
[[event]]
at_s = 5
gpu = 1
kind = "lost"
[[event]]
at_s = 1
gpu = 0
kind = "kmsg"
text = "NVRM: early"
[[event]]
at_s = 6
gpu = 0
kind = "xid"
code = 13
kmsg = "off"
[[event]]
at_s = 7
gpu = 0
kind = "xid"
code = 31
kmsg = "quoted"
pid = 7
process_name = "trainer"
text = "boom"
nvml = false
"#,
            "k.toml",
            None,
        )
        .unwrap();
        let sim = Sim::new(s, 1.0, 2.0, None);
        let l = lines(&sim);
        assert_eq!(l.len(), 3, "{l:?}");
        assert_eq!(
            l[0].2,
            "NVRM: Xid (PCI:0000:5d:00): 79, pid=4242, name=python3, GPU has fallen off the bus."
        );
        assert_eq!(
            l[1],
            (
                5.0,
                3,
                "NVRM: GPU at PCI:0000:5d:00.0 has fallen off the bus.".into()
            )
        );
        assert_eq!(
            l[2].2,
            "NVRM: Xid (PCI:0000:18:00): 31, pid='7', name='trainer', 'boom'"
        );
    }
}
