//! The append-only kill audit log: one JSON object per line, every decision (warnings, signals,
//! dry-run "would" steps, refusals with their reason, cancellations, exits).
//!
//! Each record is written with a single `write` on an `O_APPEND` descriptor and then `fsync`ed,
//! so concurrent writers never interleave and a crash loses at most the record being written.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What was decided or done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditDecision {
    /// Warning notification sent; the grace period starts.
    Warn,
    /// SIGTERM sent.
    Term,
    /// SIGKILL sent.
    Kill,
    /// Dry run: the warning that would have been sent.
    WouldWarn,
    /// Dry run: the SIGTERM that would have been sent.
    WouldTerm,
    /// Dry run: the SIGKILL that would have been sent.
    WouldKill,
    /// The policy refused (see `reason`); nothing was done.
    Refused,
    /// The ladder stopped because the alert resolved or the process left the GPU.
    Cancelled,
    /// The process ended (after a signal, or on its own during the grace period).
    Exited,
    /// Signalling failed (see `reason`).
    Error,
    /// A hang forensics bundle was collected (`target`: its directory; `reason`: what it holds).
    Forensics,
}

impl AuditDecision {
    /// Snake-case name, as written to the log.
    pub fn as_str(self) -> &'static str {
        match self {
            AuditDecision::Forensics => "forensics",
            AuditDecision::Warn => "warn",
            AuditDecision::Term => "term",
            AuditDecision::Kill => "kill",
            AuditDecision::WouldWarn => "would_warn",
            AuditDecision::WouldTerm => "would_term",
            AuditDecision::WouldKill => "would_kill",
            AuditDecision::Refused => "refused",
            AuditDecision::Cancelled => "cancelled",
            AuditDecision::Exited => "exited",
            AuditDecision::Error => "error",
        }
    }
}

/// One line of the audit log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// RFC 3339 UTC time.
    pub time: String,
    /// Same, UTC ms.
    pub time_ms: i64,
    /// Host name.
    pub host: String,
    /// The decision.
    pub decision: AuditDecision,
    /// Whether the policy was in dry-run mode.
    pub dry_run: bool,
    /// PID as NVML reported it (host PID namespace).
    pub host_pid: u32,
    /// PID in gpuwatch's namespace, when mapped.
    pub pid: Option<u32>,
    /// What was (or would be) signalled: `group 1234` or `pid 1234`.
    pub target: Option<String>,
    /// Owner uid.
    pub uid: Option<u32>,
    /// Owner name.
    pub user: Option<String>,
    /// Command line.
    pub command: Option<String>,
    /// GPU index the process was on.
    pub gpu: Option<u32>,
    /// Alert (rule) that asked for the kill.
    pub alert: String,
    /// That alert's fingerprint.
    pub fingerprint: String,
    /// Why: the refusal reason, the rule's summary, or the error.
    pub reason: String,
    /// Which `[actions.kill]` the decision was made under: 1 at start, +1 at every reload.
    #[serde(default)]
    pub policy_version: u64,
    /// The MIG device the process runs on (`MIG 1g.10gb 0/7/0`), on a GPU with MIG on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<String>,
}

impl AuditRecord {
    /// The record as the notification event the dispatcher sends: alert name `kill_action`,
    /// labels `decision`, `pid`, `user`, `gpu`, `source_alert`; annotations summary/description.
    pub fn to_alert_event(&self) -> crate::model::AlertEvent {
        use crate::model::{AlertEvent, Severity};
        let mut labels = std::collections::BTreeMap::new();
        labels.insert("alertname".to_string(), "kill_action".to_string());
        labels.insert("decision".to_string(), self.decision.as_str().to_string());
        labels.insert("pid".to_string(), self.host_pid.to_string());
        labels.insert("hostname".to_string(), self.host.clone());
        labels.insert("source_alert".to_string(), self.alert.clone());
        if let Some(u) = &self.user {
            labels.insert("user".to_string(), u.clone());
        }
        if let Some(g) = self.gpu {
            labels.insert("gpu".to_string(), g.to_string());
        }
        if let Some(m) = &self.mig {
            labels.insert("mig".to_string(), m.clone());
        }
        let severity = match self.decision {
            AuditDecision::Term | AuditDecision::Kill | AuditDecision::Error => Severity::Critical,
            AuditDecision::Warn | AuditDecision::WouldKill | AuditDecision::WouldTerm => {
                Severity::Warning
            }
            _ => Severity::Info,
        };
        labels.insert("severity".to_string(), severity.as_str().to_string());
        let mut annotations = std::collections::BTreeMap::new();
        let summary = match &self.mig {
            Some(m) => format!("{} on {m}", self.summary()),
            None => self.summary(),
        };
        annotations.insert("summary".to_string(), summary);
        annotations.insert("description".to_string(), self.reason.clone());
        let fingerprint = crate::action::fingerprint(&[
            "kill_action",
            &self.fingerprint,
            &self.host_pid.to_string(),
            self.decision.as_str(),
        ]);
        AlertEvent::action_notice(
            fingerprint,
            "kill_action",
            severity,
            labels,
            annotations,
            self.time_ms,
            self.gpu,
        )
    }

    /// One line for humans, e.g. `SIGTERM sent to group 4242 (alice: python train.py) for
    /// gpu_memory_quota`.
    pub fn summary(&self) -> String {
        let who = format!(
            "pid {} ({}: {})",
            self.host_pid,
            self.user.as_deref().unwrap_or("?"),
            self.command.as_deref().unwrap_or("?")
        );
        let target = self.target.clone().unwrap_or_else(|| who.clone());
        match self.decision {
            AuditDecision::Warn => format!("warning: {who} will be stopped ({})", self.alert),
            AuditDecision::Term => format!("SIGTERM sent to {target}, {who} ({})", self.alert),
            AuditDecision::Kill => format!("SIGKILL sent to {target}, {who} ({})", self.alert),
            AuditDecision::WouldWarn => format!("dry run: would warn about {who} ({})", self.alert),
            AuditDecision::WouldTerm => {
                format!(
                    "dry run: would send SIGTERM to {target}, {who} ({})",
                    self.alert
                )
            }
            AuditDecision::WouldKill => {
                format!(
                    "dry run: would send SIGKILL to {target}, {who} ({})",
                    self.alert
                )
            }
            AuditDecision::Forensics => {
                format!("hang forensics of {who} in {target} ({})", self.alert)
            }
            AuditDecision::Refused => format!("refused to kill {who}: {}", self.reason),
            AuditDecision::Cancelled => format!("kill of {who} cancelled: {}", self.reason),
            AuditDecision::Exited => format!("{who} ended: {}", self.reason),
            AuditDecision::Error => format!("kill of {who} failed: {}", self.reason),
        }
    }
}

/// An open audit log.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    file: File,
}

impl AuditLog {
    /// Opens (creating with mode 0600, and creating parent directories) `path` for appending.
    pub fn open(path: &Path) -> std::io::Result<AuditLog> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            crate::sys::create_private_dir(dir)?;
        }
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path)?;
        Ok(AuditLog {
            path: path.to_path_buf(),
            file,
        })
    }

    /// A log writing to an open `file` (tests: a file whose writes fail).
    #[cfg(test)]
    pub(crate) fn from_file(path: &Path, file: std::fs::File) -> AuditLog {
        AuditLog {
            path: path.to_path_buf(),
            file,
        }
    }

    /// The log's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one record (a single write, then fsync): an [`AuditRecord`], or a drain's
    /// [`super::drain::DrainRecord`] in its own log.
    pub fn append(&mut self, record: &impl Serialize) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(record).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.file.write_all(&line)?;
        self.file.sync_data()
    }

    /// Reads every record of a log (for tests and `gpuwatch` tooling).
    pub fn read_all(path: &Path) -> std::io::Result<Vec<AuditRecord>> {
        let text = std::fs::read_to_string(path)?;
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).map_err(std::io::Error::other))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn record(decision: AuditDecision) -> AuditRecord {
        AuditRecord {
            time: "2026-12-02T15:00:00.000Z".into(),
            time_ms: 0,
            host: "h".into(),
            decision,
            dry_run: true,
            host_pid: 42,
            pid: Some(42),
            target: Some("group 42".into()),
            uid: Some(1000),
            user: Some("alice".into()),
            command: Some("python train.py".into()),
            gpu: Some(0),
            alert: "gpu_memory_quota".into(),
            fingerprint: "abc".into(),
            reason: "over quota".into(),
            policy_version: 1,
            mig: None,
        }
    }

    #[test]
    fn appends_json_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/audit.jsonl");
        let mut log = AuditLog::open(&path).unwrap();
        log.append(&record(AuditDecision::WouldTerm)).unwrap();
        drop(log);
        let mut log = AuditLog::open(&path).unwrap();
        log.append(&record(AuditDecision::Refused)).unwrap();
        let all = AuditLog::read_all(&path).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].decision, AuditDecision::WouldTerm);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text
            .lines()
            .nth(1)
            .unwrap()
            .contains(r#""decision":"refused""#));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn notification_event() {
        let ev = record(AuditDecision::WouldTerm).to_alert_event();
        assert_eq!(ev.name, "kill_action");
        assert_eq!(ev.labels["decision"], "would_term");
        assert!(ev.annotations["summary"].starts_with("dry run: would send SIGTERM to group 42"));
    }
}
