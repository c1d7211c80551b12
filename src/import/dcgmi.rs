//! `dcgmi dmon -e FIELD,…` output (DCGM's monitor; the profiling fields are what GPM reads
//! without DCGM):
//!
//! ```text
//! #Entity   GPUTL  GRACT  SMACT  SMOCC  TENSO  DRAMA  PCITX      PCIRX      POWER
//! ID
//! GPU 0     100    0.993  0.107  0.021  0.012  0.031  81234567   154321098  231.450
//! GPU 1     N/A    0.991  0.104  0.020  0.011  0.030  80123456   153210987  229.870
//! ```
//!
//! The header names each column by DCGM's short tag; `ID` on the next line belongs to it. A
//! row is `GPU <index>` and one cell per tag; `N/A` is absent. Rows of MIG instances
//! (`GPU-I 21`, `GPU-CI …`) and of other entities are skipped. The rows carry no time: round *k*
//! (a round ends when a GPU index repeats) is at `--t0` + *k* × `--every` (dmon's `-d`, 1 s by
//! default), as for `nvidia-smi dmon`. The header comes again now and then.
//!
//! Columns read (DCGM field id): the profiling activities, ratios 0–1 stored as percentages —
//! `GRACT` (1001) graphics engine active, `SMACT` (1002) SM active, `SMOCC` (1003) SM
//! occupancy, `TENSO` (1004) tensor active, `DRAMA` (1005) DRAM active, `FP64A` / `FP32A` /
//! `FP16A` (1006–1008); `PCITX` / `PCIRX` / `NVLTX` / `NVLRX` (1009–1012) bytes per second;
//! and `GPUTL` (203) utilization, `MCUTL` (204) memory utilization, `POWER` (155) W, `TMPTR`
//! (150) °C, `SMCLK` / `MMCLK` (100, 101) MHz, `FBUSD` / `FBFRE` (252, 251) MiB. Other columns
//! are ignored.

use super::{Ctx, Item, Key, LineError, Reading};
use crate::model::Metric;

/// Whether `line` is a `dcgmi dmon` header.
pub fn recognises(line: &str) -> bool {
    line.trim_start()
        .strip_prefix("#Entity")
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(char::is_whitespace))
}

#[derive(Debug, Clone, Copy)]
enum Col {
    Metric(Metric, f64),
    Ignore,
}

/// The column a DCGM tag names, and the factor from DCGM's unit to gpuwatch's.
fn column(tag: &str) -> Col {
    const RATIO: f64 = 100.0;
    const MIB: f64 = 1_048_576.0;
    let (m, scale) = match tag.to_ascii_uppercase().as_str() {
        "GRACT" => (Metric::GrEngineActive, RATIO),
        "SMACT" => (Metric::SmActive, RATIO),
        "SMOCC" => (Metric::SmOccupancy, RATIO),
        "TENSO" => (Metric::TensorActive, RATIO),
        "DRAMA" => (Metric::DramActive, RATIO),
        "FP64A" => (Metric::Fp64Active, RATIO),
        "FP32A" => (Metric::Fp32Active, RATIO),
        "FP16A" => (Metric::Fp16Active, RATIO),
        "PCITX" => (Metric::PcieTxBytes, 1.0),
        "PCIRX" => (Metric::PcieRxBytes, 1.0),
        "NVLTX" => (Metric::NvlinkTxBytes, 1.0),
        "NVLRX" => (Metric::NvlinkRxBytes, 1.0),
        "GPUTL" => (Metric::Util, 1.0),
        "MCUTL" => (Metric::MemUtil, 1.0),
        "POWER" => (Metric::Power, 1.0),
        "TMPTR" => (Metric::Temp, 1.0),
        "SMCLK" => (Metric::SmClock, 1.0),
        "MMCLK" => (Metric::MemClock, 1.0),
        "FBUSD" => (Metric::MemUsed, MIB),
        "FBFRE" => (Metric::MemFree, MIB),
        _ => return Col::Ignore,
    };
    Col::Metric(m, scale)
}

/// Reads `dcgmi dmon` rows (see the module docs).
#[derive(Default)]
pub struct DcgmiParser {
    columns: Vec<Col>,
    /// GPUs of the round in progress.
    round: Vec<u32>,
    rounds: i64,
}

impl super::Parse for DcgmiParser {
    fn line(&mut self, line: &str, ctx: &Ctx, out: &mut Vec<Item>) -> Result<(), LineError> {
        let l = line.trim();
        if let Some(head) = l.strip_prefix("#Entity") {
            self.columns = head.split_whitespace().map(column).collect();
            return Ok(());
        }
        if l.starts_with('#') || l == "ID" {
            return Ok(());
        }
        let mut cells = l.split_whitespace();
        match cells.next() {
            Some("GPU") => {}
            // MIG instances (`GPU-I`, `GPU-CI`), switches, links, CPUs
            Some(_) => return Err(LineError::Skip("a row of another entity than a GPU".into())),
            None => return Ok(()),
        }
        if self.columns.is_empty() {
            return Err(LineError::Skip("a row before the dcgmi dmon header".into()));
        }
        let index = cells.next().unwrap_or("");
        let index: u32 = index
            .parse()
            .map_err(|_| format!("bad GPU index {}", crate::trace::quoted(index)))?;
        let cells: Vec<&str> = cells.collect();
        if cells.len() != self.columns.len() {
            return Err(LineError::Skip(format!(
                "{} cells where the header has {}",
                cells.len(),
                self.columns.len()
            )));
        }
        let mut r = Reading::new(0, Key::Index, 0);
        r.sample.id.index = index;
        for (i, (c, v)) in self.columns.iter().zip(&cells).enumerate() {
            if let Col::Metric(m, scale) = c {
                let value = super::csv::smi_value(v, crate::model::SmiUnit::Same)
                    .map(|x| x.map(|x| x * scale));
                r.sample
                    .values
                    .set(*m, super::csv::checked(*m, value, v, i + 3, ctx));
            }
        }
        if self.round.contains(&index) {
            self.round.clear();
            self.rounds += 1;
        }
        self.round.push(index);
        let t0 = ctx.t0_ms.ok_or_else(|| {
            LineError::Fatal(
                "dcgmi dmon output has no timestamps: pass --t0 TIME (and --every for dmon -d)"
                    .into(),
            )
        })?;
        let time = t0 + self.rounds * ctx.every_ms;
        r.time_ms = time;
        r.sample.time_ms = time;
        out.push(Item::Reading(r));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_and_columns() {
        assert!(recognises("#Entity   GRACT        SMACT"));
        assert!(recognises("  #Entity"));
        assert!(!recognises("#EntityX"));
        assert!(!recognises("# gpu    pwr  gtemp"));
        assert!(matches!(
            column("smact"),
            Col::Metric(Metric::SmActive, s) if s == 100.0
        ));
        assert!(matches!(
            column("NVLRX"),
            Col::Metric(Metric::NvlinkRxBytes, s) if s == 1.0
        ));
        assert!(matches!(column("XIDER"), Col::Ignore));
    }
}
