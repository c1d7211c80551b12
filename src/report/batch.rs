//! A scheduler job's GPU summary: what `gpuwatch slurm epilog` writes when a job ends and
//! `gpuwatch job JOBID` prints later. It is the run report (`report`'s numbers, diagnosis and
//! alerts) of the job's span on its GPUs, read from the daemon's recording, with the job's
//! identity, and a compact JSON form, bounded in size, for Slurm's `AdminComment` (as Princeton's
//! jobstats keeps its summary there).

use serde::{Deserialize, Serialize};

use super::RunSummary;

/// One job's summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSummary {
    /// The scheduler's job id.
    pub job: String,
    /// Its user, when known.
    pub user: Option<String>,
    /// The node it ran on (this summary covers this node's GPUs only).
    pub node: String,
    /// Its span, UTC ms.
    pub start_ms: i64,
    pub end_ms: i64,
    /// Its GPUs (NVML indices).
    pub gpus: Vec<u32>,
    /// Where the GPUs come from: `SLURM_JOB_GPUS`, `CUDA_VISIBLE_DEVICES` or `processes seen`.
    pub gpus_from: String,
    /// The report of the span; `None` when there is none (see `missing`).
    pub run: Option<RunSummary>,
    /// Why there is no report (no recording, no sample in the span).
    pub missing: Option<String>,
}

/// The compact form's version (its first key).
pub const COMPACT_VERSION: u32 = 1;

impl JobSummary {
    /// The text a person reads (the work-directory file, `gpuwatch job`).
    pub fn text(&self) -> String {
        let mut out = format!(
            "gpuwatch: job {}{} on {}, GPU{} {} ({}), {} to {} ({})\n",
            self.job,
            self.user
                .as_deref()
                .map_or_else(String::new, |u| format!(" of {u}")),
            self.node,
            if self.gpus.len() == 1 { "" } else { "s" },
            super::gpu_list(&self.gpus),
            self.gpus_from,
            crate::trace::format_time_ms(self.start_ms),
            crate::trace::format_time_ms(self.end_ms),
            super::human_duration((self.end_ms - self.start_ms).max(0) as f64 / 1000.0),
        );
        match (&self.run, &self.missing) {
            (Some(run), _) => out.push_str(&super::text(run)),
            (None, Some(why)) => {
                out.push_str("no GPU numbers: ");
                out.push_str(why);
                out.push('\n');
            }
            (None, None) => out.push_str("no GPU numbers\n"),
        }
        out
    }

    /// The summary as one line of JSON of at most `limit` bytes: per GPU its utilization mean,
    /// memory peak and total (GiB), energy (Wh) and mean power (W), SM active where GPM was read;
    /// the verdicts and the findings' titles, dropped from the end (and counted in `"cut"`)
    /// when they do not fit.
    pub fn compact(&self, limit: usize) -> String {
        use serde_json::{json, Map, Value};
        let round = |v: f64, places: i32| {
            let f = 10f64.powi(places);
            (v * f).round() / f
        };
        let mut gpus = Map::new();
        let mut verdicts = Vec::new();
        let mut findings = Vec::new();
        if let Some(run) = &self.run {
            for g in &run.gpus {
                let mut o = Map::new();
                let mut put = |k: &str, v: Option<f64>, places: i32| {
                    if let Some(v) = v.filter(|v| v.is_finite()) {
                        o.insert(k.into(), json!(round(v, places)));
                    }
                };
                put("util", g.util.map(|u| u.mean), 1);
                put("sm_active", g.sm_active_mean, 1);
                put(
                    "mem_peak_gib",
                    g.mem_peak_bytes.map(|b| b / 1_073_741_824.0),
                    2,
                );
                put(
                    "mem_total_gib",
                    g.mem_total_bytes.map(|b| b / 1_073_741_824.0),
                    2,
                );
                put("energy_wh", g.energy_kwh.map(|k| k * 1000.0), 1);
                put("power_w", g.power_mean_w, 0);
                gpus.insert(g.index.to_string(), Value::Object(o));
            }
            verdicts = run
                .verdicts
                .iter()
                .map(|v| format!("GPU {}: {}", v.gpu, v.verdict))
                .collect();
            findings = run
                .findings
                .iter()
                .map(|f| format!("GPU {}: {}", f.gpu, f.title))
                .collect();
        }
        let mut cut = 0usize;
        loop {
            let mut v = json!({
                "gpuwatch": COMPACT_VERSION,
                "job": self.job,
                "node": self.node,
                "start": self.start_ms / 1000,
                "end": self.end_ms / 1000,
                "gpus": gpus,
            });
            if !verdicts.is_empty() {
                v["verdicts"] = json!(verdicts);
            }
            if !findings.is_empty() {
                v["findings"] = json!(findings);
            }
            if let Some(why) = &self.missing {
                v["missing"] = json!(crate::values::truncate_chars(why, 120));
            }
            if cut > 0 {
                v["cut"] = json!(cut);
            }
            let line = v.to_string();
            if line.len() <= limit {
                return line;
            }
            if findings.pop().is_some() || verdicts.pop().is_some() {
                cut += 1;
            } else if !gpus.is_empty() {
                // (only a limit below a few hundred bytes gets here)
                let last = gpus.keys().next_back().cloned().unwrap_or_default();
                gpus.remove(&last);
                cut += 1;
            } else {
                return line;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Finding;

    fn summary(findings: usize) -> JobSummary {
        let mut run: RunSummary = serde_json::from_value(serde_json::json!({
            "sources": [], "first_ms": 0, "last_ms": 3_600_000, "ticks": 3600, "gpus": [],
            "energy_kwh": null, "cost": null, "currency": "", "co2_kg": null, "findings": [],
            "alerts": [], "progress": null, "warnings": []
        }))
        .unwrap();
        for i in 0..findings {
            run.findings.push(Finding {
                gpu: 0,
                pattern: "low_utilization".into(),
                title: format!("finding number {i} with a title of some length"),
                severity: "warning".into(),
                share_of_observed: 0.5,
                seconds: 60.0,
                windows: Vec::new(),
                evidence: String::new(),
                cause: String::new(),
                fix: String::new(),
                rank: 0,
            });
        }
        JobSummary {
            job: "77".into(),
            user: Some("ann".into()),
            node: "gpu07".into(),
            start_ms: 0,
            end_ms: 3_600_000,
            gpus: vec![0],
            gpus_from: "SLURM_JOB_GPUS".into(),
            run: Some(run),
            missing: None,
        }
    }

    #[test]
    fn the_compact_form_fits_its_limit_and_says_what_it_cut() {
        let small = summary(2).compact(1000);
        let v: serde_json::Value = serde_json::from_str(&small).unwrap();
        assert_eq!(v["gpuwatch"], COMPACT_VERSION);
        assert_eq!(v["findings"].as_array().unwrap().len(), 2);
        assert!(v.get("cut").is_none());
        let big = summary(40).compact(1000);
        assert!(big.len() <= 1000, "{}", big.len());
        let v: serde_json::Value = serde_json::from_str(&big).unwrap();
        let kept = v["findings"].as_array().unwrap().len();
        assert_eq!(kept + v["cut"].as_u64().unwrap() as usize, 40);
        assert!(summary(0).text().starts_with(
            "gpuwatch: job 77 of ann on gpu07, GPU 0 (SLURM_JOB_GPUS), 1970-01-01T00:00:00.000Z to 1970-01-01T01:00:00.000Z (1h 00m)"
        ));
    }
}
