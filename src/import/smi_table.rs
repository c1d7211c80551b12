//! The plain `nvidia-smi` table, as `nvidia-smi -l N > log`, `watch nvidia-smi` saved to a file,
//! or a `while true; do date; nvidia-smi; sleep N; done` loop write it:
//!
//! ```text
//! Wed May  1 10:00:00 2024
//! +---------------------------------------------------------------------------------------+
//! | NVIDIA-SMI 535.104.05             Driver Version: 535.104.05   CUDA Version: 12.2     |
//! |-----------------------------------------+----------------------+----------------------+
//! | GPU  Name                 Persistence-M | Bus-Id        Disp.A | Volatile Uncorr. ECC |
//! | Fan  Temp   Perf          Pwr:Usage/Cap |         Memory-Usage | GPU-Util  Compute M. |
//! |=========================================+======================+======================|
//! |   0  NVIDIA A100-SXM4-80GB          On  | 00000000:07:00.0 Off |                    0 |
//! | N/A   34C    P0              61W / 400W |  30123MiB / 81920MiB |     45%      Default |
//! ...
//! | Processes:                                                                            |
//! |  GPU   GI   CI        PID   Type   Process name                            GPU Memory |
//! |    0   N/A  N/A     12345      C   python                                    30110MiB |
//! ```
//!
//! One table is one tick. Its time is the line before it: the table's own timestamp line, or a
//! `date` line, decorated or not (`==== Sun May  4 04:27:32 AM EDT 2025 ====`; its zone is
//! honoured), the first of the two when both are there (their wall clocks a few seconds apart
//! at most). Per
//! GPU: index, name, bus id, fan, temperature, performance state, power draw and cap, memory
//! used and total, utilization; the process table (pid, type, name, memory) when present, an
//! empty list for `No running processes found`. The layouts of drivers from the 400s to the
//! 500s differ in spacing and in the GI/CI columns; cells are read by their position between
//! the `|` bars and by token shape, not by character column.

use super::{Ctx, Item, Key, LineError, Reading};
use crate::model::{Metric, ProcKind, ProcSample};

/// Whether `line` is typical of a table log.
pub fn recognises(line: &str) -> bool {
    let l = line.trim();
    l.starts_with("| NVIDIA-SMI ") || (l.starts_with("+-") && l.ends_with("-+"))
}

/// Reads tables (see the module docs).
#[derive(Default)]
pub struct TableParser {
    time_ms: Option<i64>,
    /// The wall clock the time line showed (as if UTC), to tell the table's own line from a
    /// new time.
    wall_ms: Option<i64>,
    gpus: Vec<Reading>,
    procs: Option<Vec<ProcSample>>,
    in_processes: bool,
}

impl TableParser {
    fn emit(&mut self, out: &mut Vec<Item>) {
        if self.gpus.is_empty() {
            return;
        }
        let procs = self.procs.take();
        for mut r in self.gpus.drain(..) {
            if let Some(all) = &procs {
                r.procs = Some(
                    all.iter()
                        .filter(|p| p.gpu_index == r.sample.id.index)
                        .cloned()
                        .collect(),
                );
            }
            out.push(Item::Reading(r));
        }
        out.push(Item::EndTick);
        self.time_ms = None;
        self.in_processes = false;
    }

    fn gpu_line(&mut self, cells: &[&str], ctx: &Ctx) -> Result<bool, LineError> {
        let first: Vec<&str> = cells[0].split_whitespace().collect();
        let bus = cells.get(1).and_then(|c| c.split_whitespace().next());
        let (Some(index), Some(bus)) = (first.first().and_then(|t| t.parse::<u32>().ok()), bus)
        else {
            return Ok(false);
        };
        if first.len() < 2 || !bus.contains(':') || !bus.contains('.') {
            return Ok(false);
        }
        let time = self.time_ms.ok_or_else(|| {
            LineError::Fatal(
                "a table without a timestamp line before it: pass --t0 for the first".into(),
            )
        })?;
        let _ = ctx;
        let mut r = Reading::new(time, Key::Index, index);
        let name_end = if matches!(first.last(), Some(&("On" | "Off"))) {
            first.len() - 1
        } else {
            first.len()
        };
        r.sample.id.name = first[1..name_end].join(" ");
        r.sample.id.pci_bus_id = bus.to_string();
        self.gpus.push(r);
        Ok(true)
    }

    /// `| N/A   34C    P0    61W / 400W |  30123MiB / 81920MiB |     45%      Default |`
    fn values_line(&mut self, cells: &[&str], ctx: &Ctx) -> bool {
        let toks: Vec<&str> = cells[0].split_whitespace().collect();
        // `N/A   34C    P0` (fan, temperature, performance state); the temperature can be N/A.
        let Some(temp_at) = toks
            .iter()
            .position(|t| t.ends_with('C') && t[..t.len() - 1].parse::<f64>().is_ok())
            .or_else(|| (toks.get(1) == Some(&"N/A")).then_some(1))
        else {
            return false;
        };
        let Some(perf_at) = toks
            .iter()
            .position(|t| t.len() >= 2 && t.starts_with('P') && t[1..].parse::<u32>().is_ok())
        else {
            return false;
        };
        let Some(r) = self.gpus.last_mut() else {
            return false;
        };
        let num = |t: &str, unit: &str| -> Option<f64> {
            t.strip_suffix(unit)
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|v| v.is_finite())
        };
        let mut set = |m: Metric, v: Option<f64>| {
            let v = v.filter(|x| {
                let ok = m.desc().plausible(*x);
                if !ok {
                    ctx.malformed_cell(1, || format!("{} value {x} out of range", m.key()));
                }
                ok
            });
            if v.is_some() {
                r.sample.values.set(m, v);
            }
        };
        if temp_at > 0 {
            set(Metric::Fan, num(toks[0], "%"));
        }
        set(Metric::Temp, num(toks[temp_at], "C"));
        set(Metric::Pstate, toks[perf_at][1..].parse::<f64>().ok());
        let power: Vec<&str> = toks[perf_at + 1..]
            .iter()
            .copied()
            .filter(|t| *t != "/")
            .collect();
        set(Metric::Power, power.first().and_then(|t| num(t, "W")));
        set(Metric::PowerLimit, power.get(1).and_then(|t| num(t, "W")));
        if let Some(mem) = cells.get(1) {
            let m: Vec<&str> = mem.split_whitespace().filter(|t| *t != "/").collect();
            let mib = |t: Option<&&str>| t.and_then(|t| num(t, "MiB")).map(|v| v * 1_048_576.0);
            set(Metric::MemUsed, mib(m.first()));
            set(Metric::MemTotal, mib(m.get(1)));
        }
        if let Some(util) = cells.get(2) {
            set(
                Metric::Util,
                util.split_whitespace().next().and_then(|t| num(t, "%")),
            );
        }
        true
    }

    /// `|    0   N/A  N/A     12345      C   python     30110MiB |` (GI/CI columns since 450).
    fn process_line(&mut self, cell: &str) -> bool {
        let toks: Vec<&str> = cell.split_whitespace().collect();
        let Some(gpu) = toks.first().and_then(|t| t.parse::<u32>().ok()) else {
            return false;
        };
        let Some(type_at) = toks
            .iter()
            .position(|t| matches!(*t, "C" | "G" | "C+G" | "M" | "M+C"))
        else {
            return false;
        };
        let Some(pid) = type_at
            .checked_sub(1)
            .and_then(|i| toks[i].parse::<u32>().ok())
        else {
            return false;
        };
        let mem = toks
            .last()
            .and_then(|t| t.strip_suffix("MiB"))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|v| v * 1_048_576);
        let name_end = if mem.is_some() || toks.last() == Some(&"N/A") {
            toks.len() - 1
        } else {
            toks.len()
        };
        let mut p = ProcSample::compute(pid, gpu, String::new(), mem);
        if toks[type_at] == "G" {
            p.kind = ProcKind::Graphics;
        }
        let name = toks.get(type_at + 1..name_end).map(|n| n.join(" "));
        p.command = name.filter(|n| !n.is_empty());
        self.procs.get_or_insert_with(Vec::new).push(p);
        true
    }
}

impl super::Parse for TableParser {
    fn line(&mut self, line: &str, ctx: &Ctx, out: &mut Vec<Item>) -> Result<(), LineError> {
        let l = line.trim();
        if l.starts_with('+') || l.starts_with("|=") {
            return Ok(());
        }
        if let Some(inner) = l.strip_prefix('|') {
            let cells: Vec<&str> = inner.trim_end_matches('|').split('|').collect();
            let text = cells[0].trim();
            if text.starts_with("NVIDIA-SMI") {
                self.emit(out);
                return Ok(());
            }
            if text.starts_with("Processes:") {
                self.in_processes = true;
                self.procs.get_or_insert_with(Vec::new);
                return Ok(());
            }
            if self.in_processes {
                if !self.process_line(cells[0]) && !text.is_empty() {
                    // Column headings and `No running processes found`.
                }
                return Ok(());
            }
            if cells.len() >= 2 && (self.gpu_line(&cells, ctx)? || self.values_line(&cells, ctx)) {
                return Ok(());
            }
            // Headings, MIG and other rows that carry nothing read here.
            return Ok(());
        }
        match super::stamp::separator(l) {
            Some((stamp, zone)) => {
                self.emit(out);
                let wall = match stamp {
                    super::stamp::Stamp::At(ms) => ms,
                    super::stamp::Stamp::Number(_) => ctx.resolve(stamp, zone, l)?,
                };
                match self.wall_ms {
                    // `date` (perhaps with its zone) then the table's own line (the same wall
                    // clock, no zone): the first one.
                    Some(prev) if self.time_ms.is_some() && (wall - prev).abs() <= 5_000 => {}
                    _ => {
                        self.time_ms = Some(ctx.resolve(stamp, zone, l)?);
                        self.wall_ms = Some(wall);
                    }
                }
                Ok(())
            }
            None => Err(LineError::Skip(format!(
                "not part of an nvidia-smi table: {}",
                crate::trace::quoted(l)
            ))),
        }
    }

    fn finish(&mut self, _ctx: &Ctx, out: &mut Vec<Item>) {
        self.emit(out);
    }
}
