//! Two runs side by side (`report BEFORE AFTER`), and the baseline library (`--save-baseline
//! NAME` keeps a run's summary as JSON in `state_dir/baselines/`, `--baseline NAME` compares a
//! new run against it and flags what got worse).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};

use super::{gib, human_duration, RunSummary};

/// One compared quantity.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub what: &'static str,
    pub before: String,
    pub after: String,
    /// The two values as numbers (seconds, percent, bytes, °C, W, kWh, Wh, counts), for JSON.
    pub before_value: Option<f64>,
    pub after_value: Option<f64>,
    /// `+33 %`, `+1.2 GiB`, `-0.5 GiB`.
    pub change: String,
    /// It moved more than 5 % in the bad direction.
    pub worse: bool,
}

/// Which way is better.
#[derive(Clone, Copy, PartialEq)]
enum Better {
    Higher,
    Lower,
    Neither,
}

fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let (n, s) = v.fold((0u32, 0.0), |(n, s), x| (n + 1, s + x));
    (n > 0).then(|| s / f64::from(n))
}

fn max(v: impl Iterator<Item = f64>) -> Option<f64> {
    v.reduce(f64::max)
}

/// A compared quantity: name, value, how to show it, which way is better.
type Quantity = (&'static str, Option<f64>, fn(f64) -> String, Better);

/// The quantities compared.
fn quantities(r: &RunSummary) -> Vec<Quantity> {
    let span: f64 = r
        .gpus
        .iter()
        .map(|g| (g.last_ms - g.first_ms) as f64 / 1000.0)
        .sum::<f64>()
        .max(1.0);
    let pct: fn(f64) -> String = |v| format!("{v:.0} %");
    vec![
        (
            "duration",
            Some((r.last_ms - r.first_ms) as f64 / 1000.0),
            human_duration,
            Better::Neither,
        ),
        (
            "utilization mean",
            mean(r.gpus.iter().filter_map(|g| g.util.map(|u| u.mean))),
            pct,
            Better::Higher,
        ),
        (
            "time under 50 % utilization",
            Some(r.gpus.iter().map(|g| g.util_below_50_s).sum::<f64>() * 100.0 / span),
            pct,
            Better::Lower,
        ),
        (
            "memory peak",
            max(r.gpus.iter().filter_map(|g| g.mem_peak_bytes)),
            gib,
            Better::Neither,
        ),
        (
            "temperature max",
            max(r.gpus.iter().filter_map(|g| g.temp_max_c)),
            |v| format!("{v:.0} °C"),
            Better::Lower,
        ),
        (
            "power mean",
            mean(r.gpus.iter().filter_map(|g| g.power_mean_w)),
            |v| format!("{v:.0} W"),
            Better::Neither,
        ),
        (
            "energy",
            r.energy_kwh,
            |v| format!("{v:.2} kWh"),
            Better::Neither,
        ),
        (
            "energy per step",
            r.progress.as_ref().and_then(|p| p.energy_wh_per_step),
            |v| format!("{v:.3} Wh"),
            Better::Lower,
        ),
        (
            // (GPU-time: summed over the GPUs and the patterns; `text` says so)
            "GPU-time in problem patterns",
            Some(r.findings.iter().map(|f| f.seconds).sum()),
            human_duration,
            Better::Lower,
        ),
        (
            "alerts",
            Some(r.alerts.len() as f64),
            |v| format!("{v:.0}"),
            Better::Lower,
        ),
        (
            "gaps",
            Some(r.gpus.iter().map(|g| g.gaps as f64).sum()),
            |v| format!("{v:.0}"),
            Better::Lower,
        ),
    ]
}

/// `before` against `after`, quantity by quantity (those neither run has are left out).
pub fn compare(before: &RunSummary, after: &RunSummary) -> Vec<Row> {
    let a = quantities(before);
    let b = quantities(after);
    let mut rows = Vec::new();
    for ((what, x, show, better), (_, y, _, _)) in a.into_iter().zip(b) {
        if x.is_none() && y.is_none() {
            continue;
        }
        let dash = || "-".to_string();
        let change = match (x, y) {
            (Some(x), Some(y)) if what == "memory peak" => {
                format!("{:+.1} GiB", (y - x) / 1_073_741_824.0)
            }
            (Some(x), Some(y)) if x.abs() > 1e-9 => format!("{:+.0} %", (y - x) / x.abs() * 100.0),
            (Some(x), Some(y)) if (y - x).abs() <= 1e-9 => "=".into(),
            _ => dash(),
        };
        let worse = match (x, y, better) {
            (Some(x), Some(y), Better::Higher) => y < x - 0.05 * x.abs().max(1.0),
            (Some(x), Some(y), Better::Lower) => y > x + 0.05 * x.abs().max(1.0),
            _ => false,
        };
        rows.push(Row {
            what,
            before: x.map_or_else(dash, show),
            after: y.map_or_else(dash, show),
            before_value: x,
            after_value: y,
            change,
            worse,
        });
    }
    rows
}

/// The comparison as text: one line per quantity, `WORSE` where it got worse.
pub fn text(rows: &[Row], before: &str, after: &str) -> String {
    use std::fmt::Write as _;
    let mut out = format!("compared: {before} → {after}\n");
    for r in rows {
        let _ = writeln!(
            out,
            "  {:<28} {:>12} → {:<12} {:>10}{}",
            r.what,
            r.before,
            r.after,
            r.change,
            if r.worse { "  WORSE" } else { "" }
        );
    }
    if rows
        .iter()
        .any(|r| r.what == "GPU-time in problem patterns")
    {
        out.push_str(
            "  (GPU-time in problem patterns: each pattern's time on each GPU, added up — \
             8 GPUs in one pattern for 20 min make 2 h 40 min)\n",
        );
    }
    out
}

/// Where baselines live.
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("baselines")
}

fn checked_name(name: &str) -> anyhow::Result<&str> {
    if name.is_empty()
        || name.len() > 100
        || name.starts_with('.')
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        bail!("baseline name `{name}`: use letters, digits, `.`, `_` and `-` (not first `.`)");
    }
    Ok(name)
}

/// Keeps `summary` as baseline `name` (replacing one of that name).
pub fn save(state_dir: &Path, name: &str, summary: &RunSummary) -> anyhow::Result<PathBuf> {
    let name = checked_name(name)?;
    let d = dir(state_dir);
    crate::sys::create_private_subdir(&d)
        .with_context(|| format!("cannot create {}", d.display()))?;
    let path = d.join(format!("{name}.json"));
    let json = serde_json::to_vec_pretty(summary)?;
    crate::sys::write_atomic(&path, &json)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// Baseline `name`.
pub fn load(state_dir: &Path, name: &str) -> anyhow::Result<RunSummary> {
    let name = checked_name(name)?;
    let path = dir(state_dir).join(format!("{name}.json"));
    let text = std::fs::read(&path).with_context(|| {
        let known: Vec<String> = std::fs::read_dir(dir(state_dir))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_suffix(".json"))
                    .map(str::to_string)
            })
            .collect();
        format!(
            "no baseline `{name}` ({}; saved ones: {})",
            path.display(),
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        )
    })?;
    serde_json::from_slice(&text).with_context(|| format!("{}: not a baseline", path.display()))
}
