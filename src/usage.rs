//! Who used the GPUs: accounting from the samples the daemon already takes, and the digest
//! built from it (`[digest] schedule`, `gpuwatch digest --since 7d`).
//!
//! Each tick's time on a GPU is attributed to the (user, container) pairs with a process on it
//! (split evenly between them): GPU-hours, energy (the GPU's power × time, split the same way),
//! and "idle but allocated" hours — time the GPU sat at ≤ [`IDLE_UTIL`] % utilization while the
//! pair held at least [`IDLE_MIN_BYTES`] of its memory. Job ends (`gpuwatch run` writes one line
//! per job) and firing alerts are counted per hour too. On a GPU with MIG on each MIG device
//! counts for itself: its share of the GPU's compute slices (a `1g.10gb` is 1/7 of an A100 or
//! H100; an equal share when the profile is unknown) of the tick's time and of the GPU's energy
//! goes to the owners of the processes on it, and "idle but allocated" weighs the memory they
//! hold on that device (a MIG GPU reports no utilization, so it counts only where utilization is
//! known). Kept per UTC day in
//! `state_dir/usage/YYYY-MM-DD.json` (hourly buckets, a few KB a day), at most [`KEEP_DAYS`]
//! days. Pure aggregation apart from [`Ledger::load`] / [`Ledger::save`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::{AlertEvent, AlertStatus, DeviceState, Metric, ProcSample, Snapshot};

/// Utilization at or below this is idle.
pub const IDLE_UTIL: f64 = 1.0;
/// Memory held for "idle but allocated" to count.
pub const IDLE_MIN_BYTES: u64 = 256 * 1024 * 1024;
/// Days of accounting kept.
pub const KEEP_DAYS: i64 = 35;
/// A tick longer than this (a gap) counts as this long.
const MAX_TICK_S: f64 = 60.0;

/// Who: a user, and the container (or Slurm job) when the process runs in one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Owner {
    pub user: String,
    #[serde(default)]
    pub container: Option<String>,
}

impl Owner {
    fn of(p: &ProcSample) -> Owner {
        Owner {
            user: p
                .user
                .clone()
                .or_else(|| p.uid.map(|u| format!("uid {u}")))
                .unwrap_or_else(|| "?".into()),
            container: p.container.as_deref().map(container_label),
        }
    }
}

/// Attributes `span` seconds of one device (a GPU, or a MIG device: its share of the tick) and
/// `power × span` of energy to the owners of `procs`, split evenly; an owner holding at least
/// [`IDLE_MIN_BYTES`] of the device's memory on an idle GPU also gets `dt` idle-allocated
/// seconds.
fn attribute(hour: &mut Hour, procs: &[&ProcSample], span: f64, dt: f64, power: f64, idle: bool) {
    let mut owners: Vec<(Owner, u64)> = Vec::new();
    for p in procs {
        let o = Owner::of(p);
        let mem = p.used_mem_bytes.unwrap_or(0);
        match owners.iter_mut().find(|(k, _)| *k == o) {
            Some((_, m)) => *m += mem,
            None => owners.push((o, mem)),
        }
    }
    if owners.is_empty() {
        return;
    }
    #[expect(clippy::cast_precision_loss, reason = "a handful of owners")]
    let share = span / owners.len() as f64;
    for (o, mem) in owners {
        let u = hour.owner(&o);
        u.gpu_s += share;
        u.energy_j += power * share;
        if idle && mem >= IDLE_MIN_BYTES {
            u.idle_alloc_s += dt;
        }
    }
}

/// How a container shows in the digest: Docker's short id (12 digits) for a container id,
/// other forms (`slurm job 77`) as they are.
pub fn container_label(c: &str) -> String {
    if c.len() == 64 && c.bytes().all(|b| b.is_ascii_hexdigit()) {
        c[..12].to_string()
    } else {
        c.to_string()
    }
}

/// What one owner used in one hour.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Use {
    pub gpu_s: f64,
    pub energy_j: f64,
    pub idle_alloc_s: f64,
    #[serde(default)]
    pub jobs_finished: u32,
    #[serde(default)]
    pub jobs_crashed: u32,
}

impl Use {
    fn add(&mut self, o: &Use) {
        self.gpu_s += o.gpu_s;
        self.energy_j += o.energy_j;
        self.idle_alloc_s += o.idle_alloc_s;
        self.jobs_finished += o.jobs_finished;
        self.jobs_crashed += o.jobs_crashed;
    }
}

/// One hour: use per owner, firing alerts per name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Hour {
    pub owners: Vec<(Owner, Use)>,
    pub alerts: BTreeMap<String, u32>,
}

impl Hour {
    fn owner(&mut self, o: &Owner) -> &mut Use {
        let i = match self.owners.iter().position(|(k, _)| k == o) {
            Some(i) => i,
            None => {
                self.owners.push((o.clone(), Use::default()));
                self.owners.len() - 1
            }
        };
        &mut self.owners[i].1
    }
}

/// Hourly buckets (keyed by the hour's start, UTC ms) and what the next tick needs.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    pub hours: BTreeMap<i64, Hour>,
    last_ms: Option<i64>,
    processes: Vec<ProcSample>,
    /// Files [`Ledger::load`] could not read, with why (a digest says so, not "no processes").
    pub skipped: Vec<String>,
}

fn hour_of(ms: i64) -> i64 {
    ms.div_euclid(3_600_000) * 3_600_000
}

fn day_name(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map_or_else(|| "unknown".into(), |t| t.format("%Y-%m-%d").to_string())
}

impl Ledger {
    /// Accounts one snapshot (the time since the previous one, at most a minute).
    pub fn observe(&mut self, snap: &Snapshot) {
        if let Some(p) = &snap.processes {
            self.processes.clone_from(p);
        }
        let Some(last) = self.last_ms.replace(snap.time_ms) else {
            return;
        };
        #[expect(clippy::cast_precision_loss, reason = "milliseconds of one tick")]
        let dt = ((snap.time_ms - last) as f64 / 1000.0).clamp(0.0, MAX_TICK_S);
        if dt == 0.0 {
            return;
        }
        let hour = self.hours.entry(hour_of(snap.time_ms)).or_default();
        for g in snap.gpus.iter().filter(|g| g.state == DeviceState::Ok) {
            let on: Vec<&ProcSample> = self
                .processes
                .iter()
                .filter(|p| p.gpu_index == g.id.index)
                .collect();
            let power = g.get(Metric::Power).unwrap_or(0.0);
            let idle = g.get(Metric::Util).is_some_and(|u| u <= IDLE_UTIL);
            let mig: Vec<_> = snap.mig_of(g.id.index).collect();
            if mig.is_empty() {
                attribute(hour, &on, dt, dt, power, idle);
                continue;
            }
            // MIG: each device's share of the GPU, for the owners of its processes
            let known: u32 = mig.iter().filter_map(|m| m.compute_slices()).sum();
            for m in &mig {
                #[expect(clippy::cast_precision_loss, reason = "a handful of MIG devices")]
                let weight = match (m.compute_slices(), known) {
                    (Some(s), k) if k > 0 => f64::from(s) / f64::from(k.max(7)),
                    _ => 1.0 / mig.len() as f64,
                };
                let procs: Vec<&ProcSample> = on
                    .iter()
                    .copied()
                    .filter(|p| m.pids.contains(&p.pid))
                    .collect();
                attribute(hour, &procs, dt * weight, dt, power, idle);
            }
        }
    }

    /// Counts a firing alert.
    pub fn alert(&mut self, ev: &AlertEvent) {
        if ev.status == AlertStatus::Firing && !ev.repeat {
            *self
                .hours
                .entry(hour_of(ev.at_ms))
                .or_default()
                .alerts
                .entry(ev.name.clone())
                .or_default() += 1;
        }
    }

    /// Counts a job's end.
    pub fn job_end(&mut self, at_ms: i64, owner: &Owner, crashed: bool) {
        let u = self.hours.entry(hour_of(at_ms)).or_default().owner(owner);
        if crashed {
            u.jobs_crashed += 1;
        } else {
            u.jobs_finished += 1;
        }
    }

    /// Reads the days in `dir` (`YYYY-MM-DD.json`) from `since_ms` on, and with `jobs` the job
    /// ends `run` wrote (`jobs.jsonl`; for a digest only: a ledger that is saved again must not
    /// hold them, or they would count twice).
    pub fn load(dir: &Path, since_ms: i64, jobs: bool) -> Ledger {
        let mut l = Ledger::default();
        let first_day = day_name(since_ms);
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(day) = name.strip_suffix(".json") else {
                    continue;
                };
                if day < first_day.as_str() {
                    continue;
                }
                let hours: BTreeMap<i64, Hour> = match std::fs::read(e.path())
                    .map_err(|e| e.to_string())
                    .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
                {
                    Ok(h) => h,
                    Err(why) => {
                        l.skipped.push(format!(
                            "{}: not readable usage data ({why}); its hours are left out",
                            e.path().display()
                        ));
                        continue;
                    }
                };
                for (h, v) in hours {
                    if h + 3_600_000 > since_ms {
                        l.hours.insert(h, v);
                    }
                }
            }
        }
        if !jobs {
            return l;
        }
        if let Ok(text) = std::fs::read_to_string(dir.join("jobs.jsonl")) {
            for line in text.lines() {
                let Ok(j) = serde_json::from_str::<JobEnd>(line) else {
                    continue;
                };
                if j.at_ms >= since_ms {
                    l.job_end(j.at_ms, &j.owner, j.crashed);
                }
            }
        }
        l
    }

    /// Writes each day of the ledger to `dir` (atomically) and removes days older than
    /// [`KEEP_DAYS`] before `now_ms`.
    pub fn save(&self, dir: &Path, now_ms: i64) -> std::io::Result<()> {
        crate::sys::create_private_dir(dir)?;
        let mut days: BTreeMap<String, BTreeMap<i64, &Hour>> = BTreeMap::new();
        for (h, v) in &self.hours {
            days.entry(day_name(*h)).or_default().insert(*h, v);
        }
        for (day, hours) in days {
            // Merge with what is on disk for that day (an earlier run of the daemon).
            let path = dir.join(format!("{day}.json"));
            let mut merged: BTreeMap<i64, Hour> = match std::fs::read(&path) {
                Ok(b) => match serde_json::from_slice(&b) {
                    Ok(m) => m,
                    Err(_) => {
                        // A damaged day is kept aside, not written over: what it held may
                        // still be recovered by hand.
                        let _ = std::fs::rename(&path, path.with_extension("json.damaged"));
                        BTreeMap::new()
                    }
                },
                Err(_) => BTreeMap::new(),
            };
            for (h, v) in hours {
                merged.insert(h, v.clone());
            }
            let bytes = serde_json::to_vec(&merged).map_err(std::io::Error::other)?;
            crate::sys::write_atomic(&path, &bytes)?;
        }
        let oldest = day_name(now_ms - KEEP_DAYS * 86_400_000);
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name
                    .strip_suffix(".json")
                    .is_some_and(|d| d < oldest.as_str())
                {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        prune_job_ends(dir, now_ms - KEEP_DAYS * 86_400_000);
        Ok(())
    }

    /// Keeps only the hours from `since_ms` on (the daemon's memory stays bounded).
    pub fn forget_before(&mut self, since_ms: i64) {
        self.hours.retain(|h, _| *h + 3_600_000 > since_ms);
    }

    /// The digest from `since_ms` to `until_ms`.
    pub fn digest(&self, since_ms: i64, until_ms: i64, top_alerts: usize) -> Digest {
        let mut owners: BTreeMap<Owner, Use> = BTreeMap::new();
        let mut alerts: BTreeMap<String, u32> = BTreeMap::new();
        for (h, hour) in &self.hours {
            if *h + 3_600_000 <= since_ms || *h >= until_ms {
                continue;
            }
            for (o, u) in &hour.owners {
                owners.entry(o.clone()).or_default().add(u);
            }
            for (a, n) in &hour.alerts {
                *alerts.entry(a.clone()).or_default() += n;
            }
        }
        let mut rows: Vec<(Owner, Use)> = owners.into_iter().collect();
        rows.sort_by(|a, b| b.1.gpu_s.total_cmp(&a.1.gpu_s).then(a.0.cmp(&b.0)));
        let mut top: Vec<(String, u32)> = alerts.into_iter().collect();
        top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        top.truncate(top_alerts);
        Digest {
            since_ms,
            until_ms,
            skipped: self.skipped.clone(),
            rows,
            top_alerts: top,
        }
    }
}

/// A job's end as `gpuwatch run` records it (`state_dir/usage/jobs.jsonl`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobEnd {
    pub at_ms: i64,
    pub owner: Owner,
    pub crashed: bool,
    pub command: String,
}

/// Appends a job's end to `dir/jobs.jsonl`.
pub fn record_job_end(dir: &Path, end: &JobEnd) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    crate::sys::create_private_dir(dir)?;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(dir.join("jobs.jsonl"))?;
    let mut line = serde_json::to_vec(end).map_err(std::io::Error::other)?;
    line.push(b'\n');
    f.write_all(&line)
}

/// Drops the job ends before `cutoff_ms` from `dir/jobs.jsonl` once its oldest is a day past it
/// (so the file is rewritten about once a day, not at every save).
fn prune_job_ends(dir: &Path, cutoff_ms: i64) {
    let path = dir.join("jobs.jsonl");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return;
    };
    let at = |line: &str| serde_json::from_str::<JobEnd>(line).ok().map(|j| j.at_ms);
    let oldest = text.lines().find_map(at);
    if oldest.is_none_or(|t| t >= cutoff_ms - 86_400_000) {
        return;
    }
    let kept: String = text
        .lines()
        .filter(|l| at(l).is_some_and(|t| t >= cutoff_ms))
        .map(|l| format!("{l}\n"))
        .collect();
    if let Err(e) = crate::sys::write_atomic(&path, kept.as_bytes()) {
        tracing::warn!("cannot prune {}: {e}", path.display());
    }
}

/// The Slurm jobs whose processes were seen on the GPUs (their cgroups' `job_N`): on which GPUs
/// and when. `gpuwatch slurm epilog` reads it to find a job's GPUs when Slurm did not allocate
/// them as GRES (no `SLURM_JOB_GPUS`) and when its span started. Kept in
/// `state_dir/slurm-jobs.json`, [`JobsSeen::KEEP_MS`] after a job was last seen.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobsSeen {
    pub jobs: BTreeMap<String, JobSeen>,
}

/// One job in [`JobsSeen`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobSeen {
    /// GPU indices its processes used.
    pub gpus: std::collections::BTreeSet<u32>,
    /// When a process of it was first and last seen on a GPU (UTC ms).
    pub first_ms: i64,
    pub last_ms: i64,
}

impl JobsSeen {
    /// How long a job is kept after it was last seen.
    pub const KEEP_MS: i64 = 7 * 86_400_000;

    /// The file in a state directory.
    pub fn path(state_dir: &Path) -> PathBuf {
        state_dir.join("slurm-jobs.json")
    }

    /// What `state_dir` holds (empty when nothing or something unreadable is there).
    pub fn load(state_dir: &Path) -> JobsSeen {
        std::fs::read(Self::path(state_dir))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Takes a snapshot's process list (when it has one); true when a job or one of its GPUs
    /// is new (worth saving at once: the job may be short).
    pub fn observe(&mut self, snap: &Snapshot) -> bool {
        let Some(procs) = &snap.processes else {
            return false;
        };
        let mut new = false;
        for p in procs {
            let Some(job) = p.slurm_job() else { continue };
            let seen = self.jobs.entry(job.to_string()).or_insert_with(|| {
                new = true;
                JobSeen {
                    first_ms: snap.time_ms,
                    ..JobSeen::default()
                }
            });
            new |= seen.gpus.insert(p.gpu_index);
            seen.last_ms = seen.last_ms.max(snap.time_ms);
        }
        new
    }

    /// Writes it (atomically, 0600) to `state_dir`, without the jobs last seen before
    /// [`JobsSeen::KEEP_MS`] ago.
    pub fn save(&mut self, state_dir: &Path, now_ms: i64) -> std::io::Result<()> {
        self.jobs.retain(|_, j| j.last_ms >= now_ms - Self::KEEP_MS);
        let bytes = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        crate::sys::write_atomic(&Self::path(state_dir), &bytes)
    }
}

/// The usage directory of a state directory.
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("usage")
}

/// Who used the GPUs over a period.
#[derive(Debug, Clone, PartialEq)]
pub struct Digest {
    pub since_ms: i64,
    pub until_ms: i64,
    /// Files left out because they could not be read.
    pub skipped: Vec<String>,
    /// Per owner, most GPU-hours first.
    pub rows: Vec<(Owner, Use)>,
    /// The alerts that fired most, with their counts.
    pub top_alerts: Vec<(String, u32)>,
}

impl Digest {
    /// The digest as a text table.
    pub fn render_text(&self, host: &str) -> String {
        let mut out = format!(
            "GPU usage on {host}, {} to {} (UTC)\n\n",
            crate::trace::format_time_ms(self.since_ms),
            crate::trace::format_time_ms(self.until_ms)
        );
        out.push_str(&format!(
            "{:<16} {:<14} {:>9} {:>9} {:>12} {:>5} {:>7}\n",
            "user", "container", "GPU-h", "kWh", "idle-alloc h", "jobs", "crashed"
        ));
        let mut total = Use::default();
        for (o, u) in &self.rows {
            total.add(u);
            out.push_str(&format!(
                "{:<16} {:<14} {:>9.2} {:>9.2} {:>12.2} {:>5} {:>7}\n",
                crate::values::truncate_chars(&o.user, 16),
                crate::values::truncate_chars(o.container.as_deref().unwrap_or("-"), 14),
                u.gpu_s / 3600.0,
                u.energy_j / 3.6e6,
                u.idle_alloc_s / 3600.0,
                u.jobs_finished + u.jobs_crashed,
                u.jobs_crashed
            ));
        }
        for s in &self.skipped {
            out.push_str(&format!("skipped: {}\n", crate::values::escape_control(s)));
        }
        if self.rows.is_empty() && !self.skipped.is_empty() {
            out.push_str("(no GPU processes in the files that could be read)\n");
        } else if self.rows.is_empty() {
            out.push_str("(no GPU processes in this period)\n");
        } else {
            out.push_str(&format!(
                "{:<31} {:>9.2} {:>9.2} {:>12.2} {:>5} {:>7}\n",
                "total",
                total.gpu_s / 3600.0,
                total.energy_j / 3.6e6,
                total.idle_alloc_s / 3600.0,
                total.jobs_finished + total.jobs_crashed,
                total.jobs_crashed
            ));
        }
        if !self.top_alerts.is_empty() {
            out.push_str("\nAlerts that fired most:\n");
            for (a, n) in &self.top_alerts {
                out.push_str(&format!("  {a:<24} {n}\n"));
            }
        }
        out
    }

    /// The digest as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "since_ms": self.since_ms,
            "until_ms": self.until_ms,
            "owners": self.rows.iter().map(|(o, u)| serde_json::json!({
                "user": o.user,
                "container": o.container,
                "gpu_hours": u.gpu_s / 3600.0,
                "energy_kwh": u.energy_j / 3.6e6,
                "idle_allocated_hours": u.idle_alloc_s / 3600.0,
                "jobs_finished": u.jobs_finished,
                "jobs_crashed": u.jobs_crashed,
            })).collect::<Vec<_>>(),
            "top_alerts": self.top_alerts.iter().map(|(a, n)| serde_json::json!({"alert": a, "count": n})).collect::<Vec<_>>(),
            "skipped": self.skipped,
        })
    }
}

/// `[digest]` in the config file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DigestSection {
    /// `"daily"`, `"daily 18:30"`, `"weekly"` (Monday 09:00), `"weekly fri 17:00"`; unset: no
    /// digest is sent (`gpuwatch digest` still prints one).
    pub schedule: Option<String>,
    /// How many alert names the digest lists.
    pub top_alerts: Option<usize>,
}

/// When digests are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// `None`: every day; else the weekday (0 = Monday).
    pub weekday: Option<u32>,
    pub hour: u32,
    pub minute: u32,
}

impl Schedule {
    /// Parses a schedule (see [`DigestSection::schedule`]).
    pub fn parse(text: &str) -> Result<Schedule, String> {
        let bad = || {
            format!(
                "{text:?}: expected \"daily\", \"daily 18:30\", \"weekly\" or \"weekly fri 17:00\""
            )
        };
        let mut words = text.split_whitespace();
        let (weekday, default_time) = match words.next() {
            Some("daily") => (None, (9, 0)),
            Some("weekly") => (Some(0), (9, 0)),
            _ => return Err(bad()),
        };
        let mut weekday = weekday;
        let mut time = default_time;
        for w in words {
            const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
            if let Some(d) = DAYS
                .iter()
                .position(|d| w.to_ascii_lowercase().starts_with(d))
            {
                if weekday.is_none() {
                    return Err(bad());
                }
                weekday = Some(u32::try_from(d).unwrap_or(0));
            } else if let Some((h, m)) = w.split_once(':') {
                let h: u32 = h.parse().map_err(|_| bad())?;
                let m: u32 = m.parse().map_err(|_| bad())?;
                if h > 23 || m > 59 {
                    return Err(bad());
                }
                time = (h, m);
            } else {
                return Err(bad());
            }
        }
        Ok(Schedule {
            weekday,
            hour: time.0,
            minute: time.1,
        })
    }

    /// The period a digest covers, ms.
    pub fn period_ms(self) -> i64 {
        if self.weekday.is_some() {
            7 * 86_400_000
        } else {
            86_400_000
        }
    }

    /// The first time after `after_ms` the schedule names (local time), UTC ms.
    pub fn next_after(self, after_ms: i64) -> i64 {
        use chrono::{Datelike as _, TimeZone as _};
        let Some(now) = chrono::Local.timestamp_millis_opt(after_ms).earliest() else {
            return after_ms + self.period_ms();
        };
        for d in 0..=8 {
            let date = now.date_naive() + chrono::Duration::days(d);
            if self
                .weekday
                .is_some_and(|w| date.weekday().num_days_from_monday() != w)
            {
                continue;
            }
            let Some(t) = date.and_hms_opt(self.hour, self.minute, 0) else {
                continue;
            };
            if let Some(at) = chrono::Local.from_local_datetime(&t).earliest() {
                if at.timestamp_millis() > after_ms {
                    return at.timestamp_millis();
                }
            }
        }
        after_ms + self.period_ms()
    }
}

impl DigestSection {
    /// Checks the schedule.
    pub fn validate(&self) -> Vec<crate::values::Problem> {
        match self.schedule.as_deref().map(Schedule::parse) {
            Some(Err(e)) => vec![crate::values::Problem::at("digest.schedule", e)],
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DeviceId, GpuSample, MetricValues, MigSample, ProcKind};

    fn proc_(pid: u32, gpu: u32, user: &str, container: Option<&str>, gib: u64) -> ProcSample {
        ProcSample {
            pid,
            gpu_index: gpu,
            gpu_uuid: String::new(),
            used_mem_bytes: Some(gib << 30),
            kind: ProcKind::Compute,
            uid: None,
            user: Some(user.into()),
            command: Some("python train.py".into()),
            container: container.map(str::to_string),
            runtime_s: None,
            start_ticks: None,
        }
    }

    fn gpu(index: u32, t: i64, util: f64, power: f64) -> GpuSample {
        let mut values = MetricValues::default();
        values.set(Metric::Util, Some(util));
        values.set(Metric::Power, Some(power));
        GpuSample {
            time_ms: t,
            id: DeviceId {
                index,
                ..DeviceId::default()
            },
            state: DeviceState::Ok,
            values,
        }
    }

    /// An A100 split 7 × 1g.10gb at 350 W: alice on two MIG devices, bob on one, four idle.
    /// Each device is a seventh of the GPU: alice gets 2/7 of the hour and of the energy, bob
    /// 1/7, and nobody the idle devices' time.
    #[test]
    fn mig_devices_count_for_their_share_of_the_gpu() {
        let mut l = Ledger::default();
        let procs = vec![
            proc_(10, 0, "alice", None, 5),
            proc_(11, 0, "alice", None, 6),
            proc_(20, 0, "bob", None, 4),
        ];
        let mig: Vec<MigSample> = (0..7u32)
            .map(|k| MigSample {
                pids: match k {
                    0 => vec![10],
                    1 => vec![11],
                    2 => vec![20],
                    _ => vec![],
                },
                ..MigSample::one_g(0, k)
            })
            .collect();
        for (k, t) in (0..=60).map(|i| (i, i * 60_000)) {
            let mut g = gpu(0, t, 0.0, 350.0);
            // a GPU with MIG on has no utilization
            g.values.set(Metric::Util, None);
            l.observe(&Snapshot {
                time_ms: t,
                gpus: vec![g],
                processes: (k == 0).then(|| procs.clone()),
                mig: mig.clone(),
                ..Snapshot::default()
            });
        }
        let d = l.digest(0, 7_200_000, 5);
        let row = |u: &str| {
            d.rows
                .iter()
                .find(|(o, _)| o.user == u)
                .map(|(_, u)| u.clone())
                .unwrap()
        };
        let (alice, bob) = (row("alice"), row("bob"));
        assert!((alice.gpu_s - 3600.0 * 2.0 / 7.0).abs() < 1e-6, "{alice:?}");
        assert!((bob.gpu_s - 3600.0 / 7.0).abs() < 1e-6, "{bob:?}");
        assert!((alice.energy_j - 350.0 * 3600.0 * 2.0 / 7.0).abs() < 1e-3);
        assert_eq!(
            alice.idle_alloc_s, 0.0,
            "no utilization on MIG: no idle verdict"
        );
        assert_eq!(d.rows.len(), 2);
    }

    /// A recorded week, one sample a minute: alice trains on GPU 0 in a Docker container all
    /// week at 300 W; bob holds 20 GiB on GPU 1 at 0 % for the first two days, then leaves; GPU 2
    /// is shared by alice (host) and carol half the week.
    #[test]
    fn a_week_is_attributed_to_users_and_containers() {
        const T0: i64 = 1_764_547_200_000; // Monday 2025-12-01 00:00 UTC
        let alice_c = "a".repeat(64);
        let mut l = Ledger::default();
        let minutes = 7 * 24 * 60;
        for m in 0..=minutes {
            let t = T0 + m * 60_000;
            let mut procs = vec![proc_(10, 0, "alice", Some(&alice_c), 40)];
            if m < 2 * 24 * 60 {
                procs.push(proc_(20, 1, "bob", None, 20));
            }
            if m < minutes / 2 {
                procs.push(proc_(30, 2, "alice", None, 10));
                procs.push(proc_(40, 2, "carol", Some("slurm job 77"), 10));
            }
            l.observe(&Snapshot {
                time_ms: t,
                gpus: vec![
                    gpu(0, t, 95.0, 300.0),
                    gpu(1, t, 0.0, 60.0),
                    gpu(2, t, 80.0, 200.0),
                ],
                processes: Some(procs),
                xids: Vec::new(),
                missing: Vec::new(),
                mig: Vec::new(),
                nvlink: Vec::new(),
                pods: Vec::new(),
            });
        }
        l.job_end(
            T0 + 3_600_000,
            &Owner {
                user: "carol".into(),
                container: Some("slurm job 77".into()),
            },
            true,
        );
        let d = l.digest(T0, T0 + 7 * 86_400_000, 5);
        let get = |user: &str, c: Option<&str>| {
            d.rows
                .iter()
                .find(|(o, _)| o.user == user && o.container.as_deref() == c)
                .map(|(_, u)| u.clone())
                .unwrap_or_else(|| panic!("{user} {c:?}: {:?}", d.rows))
        };
        let alice = get("alice", Some("aaaaaaaaaaaa"));
        assert!((alice.gpu_s / 3600.0 - 168.0).abs() < 0.1, "{alice:?}");
        assert!((alice.energy_j / 3.6e6 - 50.4).abs() < 0.1, "{alice:?}");
        assert!(alice.idle_alloc_s < 1.0);
        let bob = get("bob", None);
        assert!((bob.gpu_s / 3600.0 - 48.0).abs() < 0.1, "{bob:?}");
        assert!((bob.idle_alloc_s / 3600.0 - 48.0).abs() < 0.1, "{bob:?}");
        // Shared GPU: half each for 84 h.
        let carol = get("carol", Some("slurm job 77"));
        assert!((carol.gpu_s / 3600.0 - 42.0).abs() < 0.1, "{carol:?}");
        assert_eq!(carol.jobs_crashed, 1);
        assert!((get("alice", None).gpu_s / 3600.0 - 42.0).abs() < 0.1);
        // Most GPU-hours first; the text names everyone.
        assert_eq!(d.rows[0].0.user, "alice");
        let text = d.render_text("node1");
        assert!(text.contains("bob") && text.contains("47.98"), "{text}");
        // Saved and loaded back: the same digest.
        let dir = tempfile::tempdir().unwrap();
        l.save(dir.path(), T0 + 7 * 86_400_000).unwrap();
        let back = Ledger::load(dir.path(), T0, true);
        assert_eq!(back.digest(T0, T0 + 7 * 86_400_000, 5), d);
    }

    /// Job ends older than the kept days leave `jobs.jsonl` (it grew for ever).
    /// A damaged day file is named in the digest (not "no GPU processes"), and a save keeps it
    /// aside instead of writing over it.
    #[test]
    fn a_damaged_day_is_named_and_kept() {
        const T0: i64 = 1_764_547_200_000; // Monday 2025-12-01 00:00 UTC
        let dir = tempfile::tempdir().unwrap();
        let day = dir.path().join(format!("{}.json", day_name(T0)));
        std::fs::write(&day, "{ not json").unwrap();
        let l = Ledger::load(dir.path(), T0 - 86_400_000, true);
        assert_eq!(l.skipped.len(), 1, "{:?}", l.skipped);
        assert!(l.skipped[0].contains(&day.display().to_string()));
        let d = l.digest(T0 - 86_400_000, T0 + 3_600_000, 5);
        let text = d.render_text("h");
        assert!(text.contains("skipped: "), "{text}");
        assert!(
            !text.contains("(no GPU processes in this period)"),
            "{text}"
        );
        assert_eq!(d.to_json()["skipped"].as_array().unwrap().len(), 1);
        let mut fresh = Ledger::default();
        fresh.hours.insert(hour_of(T0), Hour::default());
        fresh.save(dir.path(), T0).unwrap();
        assert_eq!(
            std::fs::read_to_string(day.with_extension("json.damaged")).unwrap(),
            "{ not json"
        );
    }

    #[test]
    fn old_job_ends_are_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let day = 86_400_000;
        let now = 100 * day;
        for at in [now - 60 * day, now - 50 * day, now - day] {
            let end = JobEnd {
                at_ms: at,
                owner: Owner {
                    user: "alice".into(),
                    container: None,
                },
                crashed: false,
                command: "python train.py".into(),
            };
            record_job_end(dir.path(), &end).unwrap();
        }
        Ledger::default().save(dir.path(), now).unwrap();
        let text = std::fs::read_to_string(dir.path().join("jobs.jsonl")).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
    }

    #[test]
    fn schedules() {
        assert_eq!(
            Schedule::parse("weekly fri 17:00").unwrap(),
            Schedule {
                weekday: Some(4),
                hour: 17,
                minute: 0
            }
        );
        assert_eq!(Schedule::parse("daily").unwrap().weekday, None);
        assert!(Schedule::parse("hourly").is_err());
        assert!(Schedule::parse("daily fri").is_err());
        let s = Schedule::parse("daily 00:00").unwrap();
        let next = s.next_after(1_764_547_200_000);
        assert!(next > 1_764_547_200_000 && next <= 1_764_547_200_000 + 86_400_000);
    }

    #[test]
    fn slurm_jobs_are_seen_on_their_gpus_and_forgotten_after_a_week() {
        let dir = tempfile::tempdir().unwrap();
        let mut seen = JobsSeen::default();
        let mut snap = Snapshot {
            time_ms: 1_000,
            processes: Some(vec![
                proc_(10, 2, "ann", Some("slurm job 77"), 1),
                proc_(11, 3, "bob", Some("docker abc"), 1),
            ]),
            ..Snapshot::default()
        };
        assert!(seen.observe(&snap), "a new job is saved at once");
        snap.time_ms = 2_000;
        assert!(!seen.observe(&snap), "nothing new");
        snap.processes = Some(vec![proc_(12, 5, "ann", Some("slurm job 77"), 1)]);
        snap.time_ms = 3_000;
        assert!(seen.observe(&snap), "a new GPU of the job");
        let j = &seen.jobs["77"];
        assert_eq!(j.gpus.iter().copied().collect::<Vec<_>>(), vec![2, 5]);
        assert_eq!((j.first_ms, j.last_ms), (1_000, 3_000));
        assert_eq!(seen.jobs.len(), 1);
        seen.save(dir.path(), 3_000).unwrap();
        assert_eq!(JobsSeen::load(dir.path()), seen);
        seen.save(dir.path(), 3_000 + JobsSeen::KEEP_MS + 1)
            .unwrap();
        assert!(JobsSeen::load(dir.path()).jobs.is_empty());
    }
}
