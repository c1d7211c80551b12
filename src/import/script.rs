//! The logs of the monitoring scripts tutorials teach (`tr -d ' '` applied to nvidia-smi's
//! `--format=csv,noheader,nounits` output, a bracketed `date` in front):
//!
//! * rows: `[2024-05-01 10:00:00] 0,NVIDIAA100-SXM4-80GB,45,30123,81920`: `index,name,
//!   utilization.gpu,memory.used,memory.total`; the script echoes a multi-line variable, so the
//!   rows of the other GPUs follow without the time prefix and belong to the same instant;
//! * bars: `[2024-05-01 10:00:00] GPU0: 45,30123,81920 | GPU1: 97,60001,81920 | `: per GPU
//!   `utilization.gpu,memory.used,memory.total`;
//! * progress: `[2024-05-01 10:00:00.250] Progress:3 120/500 | GPU:0,45,30123,81920,65,250.31`:
//!   the training progress (epoch 3, step 120 of 500), then `index,utilization.gpu,memory.used,
//!   memory.total,temperature.gpu,power.draw`; one line per GPU (or several `GPU:` parts).

use super::{Ctx, Item, Key, LineError, Progress, Reading};
use crate::model::{Metric, SmiUnit};

/// `[time] rest` → (time text, rest).
fn bracketed(line: &str) -> Option<(&str, &str)> {
    let rest = line.trim_start().strip_prefix('[')?;
    let (time, rest) = rest.split_once(']')?;
    Some((time, rest.trim()))
}

/// Whether `line` is a rows-script line.
pub fn recognises_rows(line: &str) -> bool {
    bracketed(line).is_some_and(|(t, rest)| {
        super::stamp::parse(t).is_some()
            && rest.split(',').count() == 5
            && rest
                .split(',')
                .next()
                .is_some_and(|i| i.parse::<u32>().is_ok())
    })
}

/// Whether `line` is a bars-script line.
pub fn recognises_bars(line: &str) -> bool {
    bracketed(line).is_some_and(|(_, rest)| {
        rest.strip_prefix("GPU")
            .and_then(|r| r.split_once(':'))
            .is_some_and(|(n, _)| n.parse::<u32>().is_ok())
    })
}

/// Whether `line` is a progress-script line.
pub fn recognises_progress(line: &str) -> bool {
    bracketed(line).is_some_and(|(_, rest)| rest.split('|').any(|p| p.trim().starts_with("GPU:")))
}

/// Fills `r` from `cells` read as `metrics` (nvidia-smi `nounits` values).
fn fill(r: &mut Reading, cells: &[&str], metrics: &[(Metric, SmiUnit)], ctx: &Ctx) {
    for ((m, unit), v) in metrics.iter().zip(cells) {
        let value = super::csv::smi_value(v, *unit);
        // The column is not tracked through the script shapes' nested separators.
        r.sample
            .values
            .set(*m, super::csv::checked(*m, value, v, 1, ctx));
    }
}

fn index(cell: &str) -> Result<u32, LineError> {
    cell.trim()
        .parse()
        .map_err(|_| LineError::Skip(format!("bad GPU index {}", crate::trace::quoted(cell))))
}

const ROWS: [(Metric, SmiUnit); 3] = [
    (Metric::Util, SmiUnit::Same),
    (Metric::MemUsed, SmiUnit::MiB),
    (Metric::MemTotal, SmiUnit::MiB),
];

/// Reads rows-script logs.
#[derive(Default)]
pub struct RowsParser {
    time_ms: Option<i64>,
}

impl super::Parse for RowsParser {
    fn line(&mut self, line: &str, ctx: &Ctx, out: &mut Vec<Item>) -> Result<(), LineError> {
        let rest = match bracketed(line) {
            Some((t, rest)) => {
                self.time_ms = Some(ctx.time(t)?);
                rest
            }
            None => line.trim(),
        };
        let time = self
            .time_ms
            .ok_or_else(|| LineError::Skip("a row before any timestamp".into()))?;
        let cells: Vec<&str> = rest.split(',').collect();
        if cells.len() != 5 {
            return Err(LineError::Skip(format!(
                "{} cells where index,name,utilization.gpu,memory.used,memory.total are 5",
                cells.len()
            )));
        }
        let mut r = Reading::new(time, Key::Index, index(cells[0])?);
        r.sample.id.name = cells[1].trim().to_string();
        fill(&mut r, &cells[2..], &ROWS, ctx);
        out.push(Item::Reading(r));
        Ok(())
    }
}

/// Reads bars-script logs.
pub struct BarsParser;

impl super::Parse for BarsParser {
    fn line(&mut self, line: &str, ctx: &Ctx, out: &mut Vec<Item>) -> Result<(), LineError> {
        let (t, rest) =
            bracketed(line).ok_or_else(|| LineError::Skip("no [time] at the start".into()))?;
        let time = ctx.time(t)?;
        let mut any = false;
        for part in rest.split('|').map(str::trim).filter(|p| !p.is_empty()) {
            let (gpu, values) = part
                .strip_prefix("GPU")
                .and_then(|p| p.split_once(':'))
                .ok_or_else(|| {
                    format!("not `GPUn: util,mem,total`: {}", crate::trace::quoted(part))
                })?;
            let cells: Vec<&str> = values.split(',').collect();
            if cells.len() != 3 {
                return Err(LineError::Skip(format!(
                    "GPU{gpu}: {} cells where utilization.gpu,memory.used,memory.total are 3",
                    cells.len()
                )));
            }
            let mut r = Reading::new(time, Key::Index, index(gpu)?);
            fill(&mut r, &cells, &ROWS, ctx);
            out.push(Item::Reading(r));
            any = true;
        }
        if !any {
            return Err(LineError::Skip("no GPU readings".into()));
        }
        out.push(Item::EndTick);
        Ok(())
    }
}

const PROGRESS_ROW: [(Metric, SmiUnit); 5] = [
    (Metric::Util, SmiUnit::Same),
    (Metric::MemUsed, SmiUnit::MiB),
    (Metric::MemTotal, SmiUnit::MiB),
    (Metric::Temp, SmiUnit::Same),
    (Metric::Power, SmiUnit::Same),
];

/// Reads progress-script logs.
pub struct ProgressParser;

impl super::Parse for ProgressParser {
    fn line(&mut self, line: &str, ctx: &Ctx, out: &mut Vec<Item>) -> Result<(), LineError> {
        let (t, rest) =
            bracketed(line).ok_or_else(|| LineError::Skip("no [time] at the start".into()))?;
        let time = ctx.time(t)?;
        let mut progress = Vec::new();
        let mut readings = Vec::new();
        for part in rest.split('|').map(str::trim).filter(|p| !p.is_empty()) {
            let Some(values) = part.strip_prefix("GPU:") else {
                progress.push(part);
                continue;
            };
            let cells: Vec<&str> = values.split(',').collect();
            if cells.len() != 6 {
                return Err(LineError::Skip(format!(
                    "GPU: {} cells where index,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw are 6",
                    cells.len()
                )));
            }
            let mut r = Reading::new(time, Key::Index, index(cells[0])?);
            fill(&mut r, &cells[1..], &PROGRESS_ROW, ctx);
            readings.push(r);
        }
        if readings.is_empty() {
            return Err(LineError::Skip("no `GPU:` part".into()));
        }
        let progress = (!progress.is_empty()).then(|| Progress::parse(&progress.join(" | ")));
        for mut r in readings {
            r.progress.clone_from(&progress);
            out.push(Item::Reading(r));
        }
        Ok(())
    }

    fn has_progress(&self) -> bool {
        true
    }
}
