//! The watch behind `gpuwatch run` / `attach` when rules apply: a sampler thread feeding
//! snapshots, the rules engine (configured rules plus job rules), kill/exec actions, and the alert
//! output through [`AlertSink`]s: stderr lines ([`StderrSink`]) and the configured notification
//! channels ([`DispatchSink`], the notification dispatcher with its outbox).
//!
//! Data flow per tick: snapshots → [`Pipeline::observe`] (GPU, host and process rules, then
//! actions) → job sample → [`Pipeline::evaluate_job`] → sinks. At the end the final job sample is
//! evaluated once more; the `job_finished` / `job_crashed` alerts it produces carry the whole
//! report as their `description`.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::{Pipeline, SamplerThread};
use crate::job::{GpuJobStats, GpuUsage, JobObserver, JobReport, JobSample};
use crate::model::{AlertEvent, AlertStatus};

/// Most alerts kept in the report.
const MAX_REPORT_ALERTS: usize = 200;

/// Where alert events go (stderr, the dispatcher, …).
pub trait AlertSink {
    /// One event to announce.
    fn send(&mut self, event: &AlertEvent);
    /// Called once at the end: deliver what is queued.
    fn finish(&mut self) {}
    /// Whether the end-of-job alerts (`job_finished`, `job_crashed`) go to this sink too
    /// (stderr says no: the printed report already says it).
    fn wants_end_notice(&self) -> bool {
        true
    }
}

/// Prints alerts as `gpuwatch: [firing] name (severity): summary` lines on stderr.
#[derive(Debug, Default)]
pub struct StderrSink;

impl AlertSink for StderrSink {
    fn send(&mut self, ev: &AlertEvent) {
        let status = match ev.state_word() {
            "STILL" => "still firing",
            "FIRING" => "firing",
            "RESOLVED" => "resolved",
            _ => "ended",
        };
        let summary = ev.told_summary();
        crate::say!(
            "gpuwatch: [{status}] {} ({}): {summary}",
            ev.name,
            ev.severity.as_str()
        );
        if let Some(stacks) = ev.annotations.get("stacks") {
            for l in stacks.lines() {
                crate::say!("gpuwatch:   stuck: {}", crate::values::escape_control(l));
            }
        }
        if let Some(dir) = ev.annotations.get("forensics") {
            crate::say!("gpuwatch:   forensics bundle: {dir}");
        }
    }

    fn wants_end_notice(&self) -> bool {
        false
    }
}

/// Sends alerts through the notification dispatcher (routes, channels, outbox, retries).
///
/// For a job, messages must leave before gpuwatch exits: every route's `group_wait` and
/// `group_interval` are set to zero, the dispatcher keeps its outbox in its own directory
/// (`state_dir/jobs/PID`, so a daemon on the same host is not disturbed), and
/// [`AlertSink::finish`] waits until the outbox is empty (at most `flush_timeout`). What could
/// not be delivered by then, and what quiet hours or the rate limit held, is moved into the
/// daemon's outbox (`state_dir/outbox`, a held message due when the quiet hours end), which a
/// running daemon looks at every 10 s and a starting one reads.
pub struct DispatchSink {
    dispatcher: Option<crate::notify::dispatcher::Dispatcher>,
    dir: std::path::PathBuf,
    state_dir: std::path::PathBuf,
    flush_timeout: Duration,
    last_send: Option<Instant>,
    quiet_hours: Option<crate::notify::settings::QuietHours>,
}

impl std::fmt::Debug for DispatchSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatchSink")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl DispatchSink {
    /// Starts a dispatcher for `settings` under `state_dir/jobs/PID`; `None` when no channel
    /// is configured.
    pub fn start(
        mut settings: crate::notify::settings::NotifySettings,
        state_dir: &std::path::Path,
        flush_timeout: Duration,
    ) -> anyhow::Result<Option<DispatchSink>> {
        if settings.channels.is_empty() {
            return Ok(None);
        }
        for r in &mut settings.routes {
            r.group_wait_ms = 0;
            r.group_interval_ms = 1;
        }
        let dir = state_dir.join("jobs").join(std::process::id().to_string());
        let quiet_hours = settings.quiet_hours;
        let dispatcher = crate::notify::dispatcher::Dispatcher::start(settings, &dir)?;
        Ok(Some(DispatchSink {
            dispatcher: Some(dispatcher),
            dir,
            state_dir: state_dir.to_path_buf(),
            flush_timeout,
            last_send: None,
            quiet_hours,
        }))
    }

    /// Puts the messages quiet hours and the rate limit held into the outbox (they would be lost
    /// with the job's directory): a quiet-hours one due when the quiet hours end.
    fn queue_held(&self) {
        use crate::notify::dispatcher::STATE_FILE;
        let path = self.dir.join(STATE_FILE);
        let Some(mut state) = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<crate::notify::grouping::GrouperState>(&b).ok())
        else {
            return;
        };
        let (quiet, rate) = state.take_held();
        if quiet.is_empty() && rate.is_empty() {
            return;
        }
        let now = crate::sys::now_ms();
        let quiet_end = self.quiet_hours.map_or(now, |q| q.end_after(now));
        let Ok(outbox) = crate::notify::outbox::Outbox::open(&self.dir) else {
            return;
        };
        let held = quiet.into_iter().map(|n| (n, quiet_end));
        for (notification, at) in held.chain(rate.into_iter().map(|n| (n, now))) {
            let entry = crate::notify::outbox::OutboxEntry {
                notification,
                attempts: 0,
                next_attempt_ms: at,
                last_error: None,
            };
            if let Err(e) = outbox.put(&entry) {
                tracing::error!("cannot keep a held notification: {e}");
            }
        }
    }

    /// Notifications in the outbox not yet delivered.
    fn pending(&self) -> Vec<std::path::PathBuf> {
        std::fs::read_dir(self.dir.join("outbox"))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.path())
                    .filter(|p| {
                        p.extension().is_some_and(|x| x == "json")
                            && !p
                                .file_name()
                                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl AlertSink for DispatchSink {
    fn send(&mut self, event: &AlertEvent) {
        if let Some(d) = &self.dispatcher {
            d.send(crate::notify::dispatcher::Input::Events(
                vec![event.clone()],
            ));
            self.last_send = Some(Instant::now());
        }
    }

    fn finish(&mut self) {
        let Some(dispatcher) = self.dispatcher.take() else {
            return;
        };
        // Let the dispatcher take in the last events, then wait for the outbox to drain.
        if let Some(t) = self.last_send {
            let settle = Duration::from_millis(300);
            std::thread::sleep(settle.saturating_sub(t.elapsed()));
        }
        let deadline = Instant::now() + self.flush_timeout;
        while !self.pending().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        dispatcher.stop();
        self.queue_held();
        let left = self.pending();
        if left.is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
            return;
        }
        // Hand what is left to the daemon's outbox.
        let target = self.state_dir.join("outbox");
        let mut moved = 0;
        if crate::sys::create_private_dir(&target).is_ok() {
            for p in &left {
                if let Some(name) = p.file_name() {
                    if std::fs::rename(p, target.join(name)).is_ok() {
                        moved += 1;
                    }
                }
            }
        }
        crate::say!(
            "gpuwatch: {} notification(s) not delivered yet; {moved} queued in {} for the daemon",
            left.len(),
            target.display()
        );
        if moved == left.len() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The rules-and-actions observer of a job.
pub struct Watch {
    pipeline: Pipeline,
    snapshots: Option<SamplerThread>,
    usage: GpuUsage,
    sinks: Vec<Box<dyn AlertSink>>,
    alerts: Vec<AlertEvent>,
    job_pid: Option<u32>,
    /// The run's GPU recording (for the end-of-run report), when one is kept.
    recording: Option<(std::path::PathBuf, crate::record::RotatingFile)>,
    rows: crate::record::CsvRows,
    row_buf: String,
    /// What `/metrics` serves, when `[exporter] listen` is set: the last snapshot, the alerts,
    /// the job's progress.
    export: Option<std::sync::Arc<std::sync::Mutex<crate::exporter::ExportState>>>,
    /// The newest snapshot not yet handed to the exporter.
    last_snapshot: Option<crate::model::Snapshot>,
    /// Where the job's status file goes (`state_dir/jobs/PID.json`, for `gpuwatch top`), and
    /// when it was last written.
    status_dir: Option<std::path::PathBuf>,
    status_written: Option<Instant>,
    /// This process's start time (clock ticks since boot), for the status file.
    start_ticks: Option<u64>,
    /// Hang forensics: the settings and `state_dir/forensics`, when on.
    forensics: Option<(
        crate::action::forensics::ForensicsSection,
        std::path::PathBuf,
    )>,
    /// When the last bundle of the job was started (one per `min_interval`).
    forensics_last: Option<Instant>,
    /// Alerts held until their bundle is collected (or its time is up).
    forensics_pending: Vec<PendingForensics>,
    /// The newest snapshot (the GPU part of a bundle).
    newest: Option<crate::model::Snapshot>,
}

/// A firing alert waiting for its forensics bundle.
struct PendingForensics {
    event: AlertEvent,
    rx: std::sync::mpsc::Receiver<crate::action::forensics::Bundle>,
    until: Instant,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("rules", &self.pipeline.engine().rule_count())
            .field("sampling", &self.snapshots.is_some())
            .finish_non_exhaustive()
    }
}

impl Watch {
    /// A watch over `pipeline`, fed by `snapshots` when a sampler runs.
    pub fn new(pipeline: Pipeline, snapshots: Option<SamplerThread>) -> Watch {
        Watch {
            pipeline,
            snapshots,
            usage: GpuUsage::default(),
            sinks: Vec::new(),
            alerts: Vec::new(),
            job_pid: None,
            recording: None,
            rows: crate::record::CsvRows::new(),
            row_buf: String::new(),
            export: None,
            last_snapshot: None,
            status_dir: None,
            status_written: None,
            start_ticks: None,
            forensics: None,
            forensics_last: None,
            forensics_pending: Vec::new(),
            newest: None,
        }
    }

    /// Records every snapshot to `path` (gpuwatch CSV) for the end-of-run report, starting over
    /// (the previous part kept as `PATH.1`) past `max_bytes`; its directory is made (or narrowed
    /// to) 0700 and its files 0600, as it lives in the state directory. A recording that cannot
    /// be written is dropped with a warning; it never stops the watch.
    pub fn record_to(&mut self, path: &std::path::Path, max_bytes: u64) {
        if self.snapshots.is_none() {
            return;
        }
        // The run's recording lives in the state directory: 0700 directory, 0600 files.
        let opened = path
            .parent()
            .map_or(Ok(()), crate::sys::create_private_subdir)
            .and_then(|()| crate::record::RotatingFile::open_private(path, Some(max_bytes), 1));
        match opened {
            Ok(f) => self.recording = Some((path.to_path_buf(), f)),
            Err(e) => tracing::warn!("cannot record the run to {}: {e}", path.display()),
        }
    }

    /// The run's recording, if one was kept.
    pub fn recording(&self) -> Option<&std::path::Path> {
        self.recording.as_ref().map(|(p, _)| p.as_path())
    }

    /// Keeps `state` (served as `/metrics` by the caller) current at every job tick.
    pub fn export_to(
        &mut self,
        state: std::sync::Arc<std::sync::Mutex<crate::exporter::ExportState>>,
    ) {
        self.export = Some(state);
    }

    /// Leaves the job's progress in `dir/PID.json` every few seconds while it runs (removed at
    /// the end), where `gpuwatch top` shows it; first removes the files left there by jobs
    /// that no longer run (a `run` ended by SIGKILL cannot remove its own; see
    /// [`super::status`]).
    pub fn status_to(&mut self, dir: std::path::PathBuf) {
        super::status::sweep(&dir);
        self.start_ticks = crate::sys::live_start_ticks(std::process::id());
        self.status_dir = Some(dir);
    }

    fn write_status(&mut self, sample: &JobSample, end: bool) {
        let Some(dir) = &self.status_dir else { return };
        let path = super::status::JobStatus::path(dir, sample.pid);
        if end {
            let _ = std::fs::remove_file(&path);
            return;
        }
        if self
            .status_written
            .is_some_and(|t| t.elapsed() < Duration::from_secs(2))
        {
            return;
        }
        self.status_written = Some(Instant::now());
        let status = super::status::JobStatus {
            pid: sample.pid,
            start_ticks: sample.start_ticks,
            watcher_pid: Some(std::process::id()),
            watcher_start_ticks: self.start_ticks,
            command: sample.command.clone(),
            progress: sample.progress.describe(),
            progress_age_s: sample.progress_age_s(),
            eta_s: sample.eta_s(),
        };
        let written = serde_json::to_vec(&status)
            .map_err(std::io::Error::other)
            .and_then(|json| {
                crate::sys::create_private_dir(dir)?;
                crate::sys::write_atomic(&path, &json)
            });
        if let Err(e) = written {
            tracing::debug!("job status {}: {e}", path.display());
            self.status_dir = None;
        }
    }

    /// Collects a hang forensics bundle under `root` (`state_dir/forensics`) when one of
    /// `section`'s alerts fires for the job.
    pub fn forensics_to(
        &mut self,
        section: crate::action::forensics::ForensicsSection,
        root: std::path::PathBuf,
    ) {
        if section.enabled {
            self.forensics = Some((section, root));
        }
    }

    /// The job's GPUs: those whose process list holds one of `pids` (none known: every GPU).
    fn job_gpus(&self, pids: &HashSet<u32>) -> Option<HashSet<u32>> {
        let procs = self.newest.as_ref()?.processes.as_ref()?;
        let gpus: HashSet<u32> = procs
            .iter()
            .filter(|p| pids.contains(&p.pid))
            .map(|p| p.gpu_index)
            .collect();
        (!gpus.is_empty()).then_some(gpus)
    }

    /// The newest snapshot as text for a bundle.
    fn gpus_text(&self) -> String {
        use crate::model::Metric;
        let Some(snap) = &self.newest else {
            return "no GPU sample\n".to_string();
        };
        let mut out = format!(
            "snapshot at {}\n",
            crate::trace::format_time_ms(snap.time_ms)
        );
        let v = |x: Option<f64>, unit: &str| {
            x.map_or_else(|| "-".to_string(), |x| format!("{x:.0} {unit}"))
        };
        for g in &snap.gpus {
            let state = match g.state {
                crate::model::DeviceState::Ok => "ok".to_string(),
                crate::model::DeviceState::Lost => "LOST".to_string(),
                crate::model::DeviceState::Stalled(f) => format!("STALLED in {}", f.symbol()),
            };
            out.push_str(&format!(
                "GPU {} ({}): {state}, util {} power {} SM clock {} memory used {}\n",
                g.id.index,
                g.id.uuid,
                v(g.get(Metric::Util), "%"),
                v(g.get(Metric::Power), "W"),
                v(g.get(Metric::SmClock), "MHz"),
                v(g.get(Metric::MemUsed).map(|b| b / 1048576.0), "MiB"),
            ));
        }
        for x in &snap.xids {
            out.push_str(&format!("XID {} on GPU {}\n", x.xid, x.gpu_index));
        }
        out
    }

    /// Starts a bundle for each firing event that asks for one (and the job is not rate
    /// limited); those events are held until it is collected. Returns the others.
    fn start_forensics(&mut self, sample: &JobSample, events: Vec<AlertEvent>) -> Vec<AlertEvent> {
        let Some((section, root)) = self.forensics.clone() else {
            return events;
        };
        let pids: HashSet<u32> = sample.pids.iter().copied().chain([sample.pid]).collect();
        let job_gpus = self.job_gpus(&pids);
        let mut out = Vec::new();
        for ev in events {
            let on_job = ev
                .gpu
                .is_none_or(|g| job_gpus.as_ref().is_none_or(|s| s.contains(&g)));
            let due = self
                .forensics_last
                .is_none_or(|t| t.elapsed() >= section.min_interval.as_std());
            if ev.status != AlertStatus::Firing
                || ev.repeat
                || !section.wants(&ev.name)
                || !on_job
                || !due
            {
                out.push(ev);
                continue;
            }
            self.forensics_last = Some(Instant::now());
            let req = crate::action::forensics::Request {
                job_pid: sample.pid,
                pids: sample.pids.clone(),
                command: sample.command.clone(),
                alert: ev.name.clone(),
                tail: sample.tail.clone(),
                gpus: self.gpus_text(),
                root: root.clone(),
                time_ms: sample.time_ms,
            };
            let audit = self.pipeline.actions().audit_path().to_path_buf();
            let fingerprint = ev.fingerprint.clone();
            let settings = section.clone();
            let (tx, rx) = std::sync::mpsc::channel();
            let spawned = std::thread::Builder::new()
                .name("gpuwatch-forensics".into())
                .spawn(move || {
                    let bundle = crate::action::forensics::collect(&settings, &req);
                    record_forensics(&audit, &req, &fingerprint, &bundle);
                    let _ = tx.send(bundle);
                });
            if spawned.is_err() {
                out.push(ev);
                continue;
            }
            self.forensics_pending.push(PendingForensics {
                event: ev,
                rx,
                until: Instant::now() + section.timeout.as_std() + Duration::from_secs(2),
            });
        }
        out
    }

    /// The held events whose bundle is in (or whose time is up), annotated; with `wait`, waits
    /// for all of them.
    fn finish_forensics(&mut self, wait: bool) -> Vec<AlertEvent> {
        let mut out = Vec::new();
        let mut keep = Vec::new();
        for p in std::mem::take(&mut self.forensics_pending) {
            let got = if wait {
                p.rx.recv_timeout(p.until.saturating_duration_since(Instant::now()))
                    .ok()
            } else {
                p.rx.try_recv().ok()
            };
            let mut ev = p.event;
            match got {
                Some(bundle) => {
                    let dir = bundle.dir.display().to_string();
                    let stacks = bundle.summary();
                    let a = &mut ev.annotations;
                    a.insert("forensics".into(), dir.clone());
                    if !stacks.is_empty() {
                        a.insert("stacks".into(), stacks.clone());
                    }
                    let mut d = String::new();
                    if !stacks.is_empty() {
                        d.push_str(&format!(
                            "Where each process was stuck (py-spy, innermost frame first):\n{stacks}\n"
                        ));
                    }
                    for n in &bundle.notes {
                        d.push_str(&format!("Note: {n}\n"));
                    }
                    d.push_str(&format!("Forensics bundle: {dir}"));
                    a.insert("description".into(), d);
                    out.push(ev);
                }
                None if Instant::now() >= p.until => out.push(ev),
                None => keep.push(PendingForensics {
                    event: ev,
                    rx: p.rx,
                    until: p.until,
                }),
            }
        }
        self.forensics_pending = keep;
        out
    }

    /// Hands the exporter the newest snapshot, the alerts and the job's progress.
    fn export(&mut self, sample: &JobSample) {
        let Some(shared) = &self.export else { return };
        let alerts = crate::exporter::alert_rows(self.pipeline.engine());
        let (ran, reused) = {
            let (reused, ran) = self.pipeline.engine().reuse_stats();
            (ran, reused)
        };
        let eval_seconds = self.pipeline.engine().eval_time().as_secs_f64();
        let ticks = self.snapshots.as_ref().map(SamplerThread::last_tick);
        let Ok(mut s) = shared.lock() else { return };
        if let Some(snap) = self.last_snapshot.take() {
            s.take_snapshot(&snap);
        }
        s.alerts = alerts;
        s.evaluations = (ran, reused);
        s.eval_seconds = eval_seconds;
        if let Some((taken, missed, micros)) = ticks {
            s.ticks = (taken, missed);
            s.sample_seconds = micros.map(|m| f64::from(m) / 1e6);
        }
        #[expect(clippy::cast_precision_loss, reason = "a step count")]
        let step = sample.progress.step.map(|x| x as f64);
        let since = sample
            .progress
            .last_progress_ms
            .unwrap_or(sample.started_at_ms);
        #[expect(clippy::cast_precision_loss, reason = "milliseconds of a job's life")]
        let age = (sample.time_ms - since).max(0) as f64 / 1000.0;
        s.jobs = vec![crate::exporter::JobRow {
            name: crate::values::truncate_chars(&sample.command, 200),
            pid: sample.pid,
            step,
            progress_age_s: age,
        }];
        s.generation += 1;
    }

    /// Adds a sink for alert events.
    pub fn add_sink(&mut self, sink: Box<dyn AlertSink>) {
        self.sinks.push(sink);
    }

    fn emit(&mut self, events: Vec<AlertEvent>, end: bool) {
        for ev in events {
            let is_end = end && matches!(ev.name.as_str(), "job_finished" | "job_crashed");
            for sink in &mut self.sinks {
                if !is_end || sink.wants_end_notice() {
                    sink.send(&ev);
                }
            }
            if self.alerts.len() < MAX_REPORT_ALERTS {
                self.alerts.push(ev);
            }
        }
    }

    /// Ingests the snapshots that arrived; returns their events (with the actions').
    fn ingest(&mut self, pids: &HashSet<u32>, now_ms: i64) -> Vec<AlertEvent> {
        let mut events = Vec::new();
        let mut got = false;
        if let Some(sampler) = &self.snapshots {
            while let Ok(snap) = sampler.receiver().try_recv() {
                got = true;
                if let Some((path, file)) = &mut self.recording {
                    self.row_buf.clear();
                    self.rows.render(&snap, &mut self.row_buf);
                    if let Err(e) = file.write_tick(&self.row_buf) {
                        tracing::warn!("recording to {} stopped: {e}", path.display());
                        self.recording = None;
                    }
                }
                self.usage.observe(&snap, pids);
                events.extend(self.pipeline.observe(&snap));
                if self.forensics.is_some() {
                    // Processes come on a slower cadence: keep the last list.
                    let processes = match (&snap.processes, self.newest.take()) {
                        (Some(_), _) | (None, None) => None,
                        (None, Some(old)) => old.processes,
                    };
                    let mut copy = snap.clone();
                    if copy.processes.is_none() {
                        copy.processes = processes;
                    }
                    self.newest = Some(copy);
                }
                if self.export.is_some() {
                    self.last_snapshot = Some(snap);
                }
            }
        }
        // Without a sampler there is nothing to be stale: host rules such as collector_stale
        // only run when snapshots are expected.
        if !got && self.snapshots.is_some() {
            events.extend(self.pipeline.advance(now_ms));
        }
        events
    }

    fn step(&mut self, sample: &JobSample, end: bool) -> Vec<AlertEvent> {
        self.job_pid = Some(sample.pid);
        let now = sample.time_ms;
        let pids: HashSet<u32> = sample.pids.iter().copied().chain([sample.pid]).collect();
        let mut events = self.ingest(&pids, now);
        // Every alert raised while a job runs says where the job was.
        let progress = sample.progress.describe();
        for ev in &mut events {
            if ev.status == AlertStatus::Firing {
                ev.annotations
                    .entry("progress".into())
                    .or_insert_with(|| progress.clone());
                ev.annotations
                    .entry("job".into())
                    .or_insert_with(|| sample.command.clone());
            }
        }
        events.extend(self.pipeline.evaluate_job(sample));
        let mut events = self.start_forensics(sample, events);
        events.extend(self.finish_forensics(end));
        self.export(sample);
        self.write_status(sample, end);
        if end {
            return events;
        }
        self.emit(events, false);
        Vec::new()
    }
}

impl JobObserver for Watch {
    fn tick(&mut self, sample: &JobSample) {
        self.step(sample, false);
    }

    fn finish(&mut self, sample: &JobSample, report: &mut JobReport) {
        let mut events = self.step(sample, true);
        for ev in &mut events {
            if matches!(ev.name.as_str(), "job_finished" | "job_crashed") {
                let a = &mut ev.annotations;
                a.insert("description".into(), report.render_text());
                a.insert("exit".into(), report.exit.describe());
                a.insert("exit_code".into(), report.exit_code.to_string());
                a.insert(
                    "crash_class".into(),
                    serde_json::to_value(report.crash_class)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default(),
                );
                // The job's own output: escaped like every annotation (`alert`), and
                // `render_text` above escapes it too.
                a.insert(
                    "crash_detail".into(),
                    crate::values::escape_control(&report.crash_detail),
                );
                a.insert(
                    "duration".into(),
                    crate::values::format_duration_ms(report.duration_ms()),
                );
            }
        }
        self.emit(events, true);
        self.pipeline.finish();
        for sink in &mut self.sinks {
            sink.finish();
        }
        report.alerts = self.alerts.clone();
    }

    fn killed_by_gpuwatch(&self) -> Option<String> {
        self.job_pid
            .and_then(|pid| self.pipeline.actions().killed_by_gpuwatch(pid))
    }

    fn gpu_stats(&self) -> Option<Vec<GpuJobStats>> {
        self.snapshots.as_ref().map(|_| self.usage.stats())
    }
}

/// Records a collected bundle in the audit log (beside the kill decisions).
fn record_forensics(
    audit: &std::path::Path,
    req: &crate::action::forensics::Request,
    fingerprint: &str,
    bundle: &crate::action::forensics::Bundle,
) {
    let uid = crate::sys::read_uid(req.job_pid);
    let record = crate::action::AuditRecord {
        time: chrono::DateTime::from_timestamp_millis(req.time_ms)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
            .unwrap_or_default(),
        time_ms: req.time_ms,
        host: crate::sys::hostname(),
        decision: crate::action::AuditDecision::Forensics,
        dry_run: false,
        host_pid: req.job_pid,
        pid: Some(req.job_pid),
        target: Some(bundle.dir.display().to_string()),
        uid,
        user: uid.and_then(crate::sys::user_name),
        command: Some(req.command.clone()),
        gpu: None,
        alert: req.alert.clone(),
        fingerprint: fingerprint.to_string(),
        reason: format!(
            "stacks of {} process(es){}",
            bundle.top_frames.len(),
            if bundle.notes.is_empty() {
                String::new()
            } else {
                format!("; {}", bundle.notes.join("; "))
            }
        ),
        policy_version: 0,
        mig: None,
    };
    let written = crate::action::AuditLog::open(audit).and_then(|mut log| log.append(&record));
    if let Err(e) = written {
        tracing::warn!("audit log {}: {e}", audit.display());
    }
}
