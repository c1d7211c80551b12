//! `nvidia-smi dmon` output:
//!
//! ```text
//! # gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa   mclk   pclk
//! # Idx      W      C      C      %      %      %      %      %      %    MHz    MHz
//!     0     61     34      -     45     12      0      0      -      -   1593   1410
//! ```
//!
//! With `-o DT` two more columns lead (`#Date Time gpu …` / `20240501 10:00:00 0 …`), else the
//! rows carry no time: round *k* (a round ends when a GPU index repeats) is at `--t0` + *k* ×
//! the sampling delay (`--every`, dmon's `-d`, 1 s by default). The header comes again every
//! few screens. Columns: `sm` → utilization, `mem` → memory utilization, `pwr`, `gtemp`,
//! `mtemp`, `enc`, `dec`, `mclk`, `pclk` (read as the SM clock), `fb` (MB used, `-s m`); `-`
//! is absent; other columns are ignored.

use super::{Ctx, Item, Key, LineError, Reading};
use crate::model::Metric;

/// Whether `line` is a dmon header.
pub fn recognises(line: &str) -> bool {
    let mut words = line
        .trim_start_matches('#')
        .split_whitespace()
        .map(str::to_ascii_lowercase);
    line.trim_start().starts_with('#')
        && match words.next().as_deref() {
            Some("gpu") => true,
            Some("date") => words.nth(1).as_deref() == Some("gpu"),
            _ => false,
        }
}

#[derive(Debug, Clone, Copy)]
enum Col {
    Date,
    Time,
    Gpu,
    Metric(Metric, f64),
    Ignore,
}

/// Reads dmon rows (see the module docs).
#[derive(Default)]
pub struct DmonParser {
    columns: Vec<Col>,
    /// GPUs of the round in progress (logs without `-o DT`).
    round: Vec<u32>,
    rounds: i64,
}

impl super::Parse for DmonParser {
    fn line(&mut self, line: &str, ctx: &Ctx, out: &mut Vec<Item>) -> Result<(), LineError> {
        let l = line.trim();
        if let Some(head) = l.strip_prefix('#') {
            if recognises(l) {
                self.columns = head
                    .split_whitespace()
                    .map(|w| match w.to_ascii_lowercase().as_str() {
                        "date" => Col::Date,
                        "time" => Col::Time,
                        "gpu" => Col::Gpu,
                        "pwr" => Col::Metric(Metric::Power, 1.0),
                        "gtemp" => Col::Metric(Metric::Temp, 1.0),
                        "mtemp" => Col::Metric(Metric::MemTemp, 1.0),
                        "sm" => Col::Metric(Metric::Util, 1.0),
                        "mem" => Col::Metric(Metric::MemUtil, 1.0),
                        "enc" => Col::Metric(Metric::EncUtil, 1.0),
                        "dec" => Col::Metric(Metric::DecUtil, 1.0),
                        "mclk" => Col::Metric(Metric::MemClock, 1.0),
                        "pclk" => Col::Metric(Metric::SmClock, 1.0),
                        "fb" => Col::Metric(Metric::MemUsed, 1_048_576.0),
                        _ => Col::Ignore,
                    })
                    .collect();
            }
            // The units line and other comments.
            return Ok(());
        }
        if self.columns.is_empty() {
            return Err(LineError::Skip("a row before the dmon header".into()));
        }
        let cells: Vec<&str> = l.split_whitespace().collect();
        if cells.len() != self.columns.len() {
            return Err(LineError::Skip(format!(
                "{} cells where the header has {}",
                cells.len(),
                self.columns.len()
            )));
        }
        let mut date = None;
        let mut clock = None;
        let mut r = Reading::new(0, Key::Index, 0);
        let mut has_gpu = false;
        for (i, (c, v)) in self.columns.iter().zip(&cells).enumerate() {
            match c {
                Col::Date => date = Some(*v),
                Col::Time => clock = Some(*v),
                Col::Gpu => {
                    r.sample.id.index = v
                        .parse()
                        .map_err(|_| format!("bad GPU index {}", crate::trace::quoted(v)))?;
                    has_gpu = true;
                }
                Col::Metric(m, scale) => {
                    let value = super::csv::smi_value(v, crate::model::SmiUnit::Same)
                        .map(|x| x.map(|x| x * scale));
                    r.sample
                        .values
                        .set(*m, super::csv::checked(*m, value, v, i + 1, ctx));
                }
                Col::Ignore => {}
            }
        }
        if !has_gpu {
            return Err(LineError::Skip("a row without a gpu column".into()));
        }
        let time = match (date, clock) {
            (Some(d), Some(t)) => ctx.time(&format!("{d} {t}"))?,
            _ => {
                if self.round.contains(&r.sample.id.index) {
                    self.round.clear();
                    self.rounds += 1;
                }
                self.round.push(r.sample.id.index);
                let t0 = ctx.t0_ms.ok_or_else(|| {
                    LineError::Fatal(
                        "dmon output without -o DT has no timestamps: pass --t0 TIME (and --every for dmon -d)"
                            .into(),
                    )
                })?;
                t0 + self.rounds * ctx.every_ms
            }
        };
        r.time_ms = time;
        r.sample.time_ms = time;
        out.push(Item::Reading(r));
        Ok(())
    }
}
