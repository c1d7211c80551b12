//! Notifications: from the alert engine's [`AlertEvent`]s to messages that reach people.
//!
//! Layers, each in its own file:
//! * [`settings`] — `[notify]`, `[[channel]]`, `[[route]]` config and secrets ([`secret`]).
//! * [`grouping`] — the pure, clock-injected routing/grouping/repeat/quiet-hours/rate-limit
//!   decision logic: events in, [`Notification`]s out. No I/O.
//! * [`channel`] — the channel registry ([`CHANNELS`]): one file per channel type that parses
//!   its own `[[channel]]` table, renders its request(s) (pure, golden-tested) and judges the
//!   response. Shared message text is in [`render`].
//! * [`transport`] — the thin HTTP (reqwest) and SMTP (lettre) layer that carries rendered
//!   requests with timeouts.
//! * [`outbox`] — the durable on-disk queue: every notification is written before it is sent.
//! * [`dispatcher`] — the worker that ties them together on its own thread (tokio current-thread
//!   runtime): retries with backoff, `notifier_failing`, heartbeat.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{AlertEvent, AlertStatus, DeviceId, ProcSample, Severity};

pub mod channel;
pub mod chart;
pub mod dispatcher;
#[cfg(test)]
mod golden;
pub mod grouping;
pub mod outbox;
pub mod render;
pub mod secret;
pub mod settings;
pub mod transport;

// The channel registry: one line per channel type, `module::Type` (the module is one file under
// `notify/`, the type implements `channel::ChannelType`). Adding a channel is that file and one
// line here; see `channel` for the checklist.
channel::registry! {
    webhook::Webhook,
    slack::Slack,
    discord::Discord,
    teams::Teams,
    telegram::Telegram,
    feishu::Feishu,
    dingtalk::Dingtalk,
    wecom::Wecom,
    alertmanager::Alertmanager,
    email::Email,
    ntfy::Ntfy,
    pushover::Pushover,
    gotify::Gotify,
    matrix::Matrix,
    sms::Sms,
}

/// Why a notification was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// A group's first message, or an update (alerts started or resolved).
    Update,
    /// An unchanged firing group re-sent after `repeat_interval`.
    Repeat,
    /// Messages held during quiet hours or by the rate limit, collapsed into one.
    Digest,
    /// A channel keeps failing (sent through the other channels).
    NotifierFailing,
    /// `gpuwatch notify-test`.
    Test,
}

impl Reason {
    /// The reason's name as JSON and the logs spell it (`update`, `repeat`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Update => "update",
            Reason::Repeat => "repeat",
            Reason::Digest => "digest",
            Reason::NotifierFailing => "notifier_failing",
            Reason::Test => "test",
        }
    }
}

/// One message for one channel: a group of alerts and the context to explain them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Notification {
    /// Stable id (hex): the same message keeps it across retries and restarts, so receivers can
    /// dedupe (HTTP header `Idempotency-Key`, email `Message-ID`).
    pub id: String,
    /// Target channel name (the Alertmanager `receiver`).
    pub channel: String,
    /// Identifies the aggregation group (`{route}:{labels}`).
    pub group_key: String,
    /// The `group_by` label values of the group.
    pub group_labels: BTreeMap<String, String>,
    /// `firing` when any alert in it is firing.
    pub status: AlertStatus,
    /// Why it was made.
    pub reason: Reason,
    /// The alerts (firing first, then resolved).
    pub alerts: Vec<AlertEvent>,
    /// Alerts left out because of the channel's `max_alerts`.
    pub truncated_alerts: usize,
    /// When it was made, UTC ms.
    pub created_ms: i64,
    /// The route's repeat interval (the Alertmanager channel derives `endsAt` from it).
    pub repeat_interval_ms: i64,
    /// The host the alerts are about.
    pub hostname: String,
    /// The GPUs the alerts name (index, UUID, model name), when known.
    #[serde(default)]
    pub devices: Vec<DeviceId>,
    /// Processes running on those GPUs when the message was made.
    #[serde(default)]
    pub processes: Vec<ProcSample>,
    /// Extra text (digest explanation, test message).
    #[serde(default)]
    pub note: Option<String>,
}

impl Notification {
    /// Computes the stable id from the message's identity.
    pub fn compute_id(&mut self) {
        use std::fmt::Write as _;
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(self.channel.as_bytes());
        ctx.update(b"\0");
        ctx.update(self.group_key.as_bytes());
        ctx.update(b"\0");
        ctx.update(&self.created_ms.to_le_bytes());
        for a in &self.alerts {
            ctx.update(a.fingerprint.as_bytes());
            ctx.update(if a.status == AlertStatus::Firing {
                b"F"
            } else {
                b"R"
            });
            ctx.update(&a.at_ms.to_le_bytes());
        }
        let digest = ctx.finish();
        let mut id = String::with_capacity(32);
        for b in &digest.as_ref()[..16] {
            let _ = write!(id, "{b:02x}");
        }
        self.id = id;
    }

    /// Highest severity among the alerts (firing ones first; `info` when empty).
    pub fn severity(&self) -> Severity {
        let firing = self
            .alerts
            .iter()
            .filter(|a| a.status == AlertStatus::Firing)
            .map(|a| a.severity)
            .max();
        firing
            .or_else(|| self.alerts.iter().map(|a| a.severity).max())
            .unwrap_or(Severity::Info)
    }

    /// Number of firing alerts.
    pub fn firing_count(&self) -> usize {
        self.alerts
            .iter()
            .filter(|a| a.status == AlertStatus::Firing)
            .count()
    }

    /// Labels shared by every alert, with the same value.
    pub fn common_labels(&self) -> BTreeMap<String, String> {
        common(self.alerts.iter().map(|a| &a.labels))
    }

    /// Annotations shared by every alert, with the same value.
    pub fn common_annotations(&self) -> BTreeMap<String, String> {
        common(self.alerts.iter().map(|a| &a.annotations))
    }

    /// What gpuwatch knows about GPU `index`.
    pub fn device(&self, index: u32) -> Option<&DeviceId> {
        self.devices.iter().find(|d| d.index == index)
    }
}

fn common<'a>(
    mut maps: impl Iterator<Item = &'a BTreeMap<String, String>>,
) -> BTreeMap<String, String> {
    let Some(first) = maps.next() else {
        return BTreeMap::new();
    };
    let mut out = first.clone();
    for m in maps {
        out.retain(|k, v| m.get(k) == Some(v));
    }
    out
}

/// The labels an alert is sent with: its own, completed with `alertname`, `severity`,
/// `hostname` and `gpu` when the engine left them out.
pub fn full_labels(a: &AlertEvent, hostname: &str) -> BTreeMap<String, String> {
    complete_labels(&a.labels, &a.name, a.severity, a.gpu, hostname)
}

/// `labels` with `alertname`, `severity`, `hostname` and `gpu` added where missing: the labels
/// an alert carries outside gpuwatch (and what silences match), for an event or an instance.
pub fn complete_labels(
    labels: &BTreeMap<String, String>,
    name: &str,
    severity: Severity,
    gpu: Option<u32>,
    hostname: &str,
) -> BTreeMap<String, String> {
    let mut labels = labels.clone();
    labels
        .entry("alertname".into())
        .or_insert_with(|| name.to_string());
    labels
        .entry("severity".into())
        .or_insert_with(|| severity.as_str().into());
    if !hostname.is_empty() {
        labels
            .entry("hostname".into())
            .or_insert_with(|| hostname.into());
    }
    if let Some(gpu) = gpu {
        labels
            .entry("gpu".into())
            .or_insert_with(|| gpu.to_string());
    }
    labels
}

/// RFC 3339 UTC with milliseconds (`2026-12-02T15:00:00.123Z`).
pub fn rfc3339_ms(ms: i64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms).map_or_else(
        || "1970-01-01T00:00:00.000Z".into(),
        |t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    )
}

pub use crate::sys::now_ms;

#[cfg(test)]
pub(crate) mod testdata {
    //! Shared fixtures for renderer golden tests.
    use super::*;
    use crate::model::ProcKind;

    pub fn alert(gpu: u32, status: AlertStatus) -> AlertEvent {
        let mut labels = BTreeMap::new();
        labels.insert("alertname".into(), "XidCritical".into());
        labels.insert("severity".into(), "critical".into());
        labels.insert("gpu".into(), gpu.to_string());
        labels.insert(
            "uuid".into(),
            format!("GPU-0000000{gpu}-aaaa-bbbb-cccc-dddddddddddd"),
        );
        labels.insert("hostname".into(), "node7".into());
        let mut annotations = BTreeMap::new();
        annotations.insert(
            "summary".into(),
            format!("GPU {gpu} reported XID 79 (fallen off the bus)"),
        );
        annotations.insert("values".into(), "xid=79".into());
        annotations.insert(
            "next_steps".into(),
            "Drain the node and reboot it; reseat or RMA the GPU if it recurs.".into(),
        );
        AlertEvent {
            fingerprint: format!("fp{gpu:02}"),
            name: "XidCritical".into(),
            severity: Severity::Critical,
            status,
            labels,
            annotations,
            starts_at_ms: 1_796_224_800_000,
            ends_at_ms: (status == AlertStatus::Resolved).then_some(1_796_225_400_000),
            at_ms: 1_796_224_800_000,
            repeat: false,
            gpu: Some(gpu),
            actions: Vec::new(),
            target_pid: None,
            target_start: None,
            target_local: false,
            chart: None,
            once: false,
            ended: None,
        }
    }

    /// A job's output with escape sequences (a colourised log, an OSC 52 clipboard write)
    /// in its end notice: every body shows them escaped; the Details keep their lines.
    pub fn hostile_alert() -> AlertEvent {
        let mut a = alert(1, AlertStatus::Firing);
        a.annotations.insert(
            "summary".into(),
            "job failed: \u{1b}[31mboom\u{1b}[0m [click](https://evil.example/)".into(),
        );
        a.annotations.insert(
            "description".into(),
            "last 2 lines:\n    | \u{1b}]52;c;cm0gLXJmIH4=\u{7}\n    | \u{1b}[2J\u{9b}0m[here](https://evil.example/)"
                .into(),
        );
        a
    }

    pub fn notification(alerts: Vec<AlertEvent>) -> Notification {
        let status = if alerts.iter().any(|a| a.status == AlertStatus::Firing) {
            AlertStatus::Firing
        } else {
            AlertStatus::Resolved
        };
        let mut group_labels = BTreeMap::new();
        group_labels.insert("alertname".into(), "XidCritical".into());
        Notification {
            id: "0123456789abcdef0123456789abcdef".into(),
            channel: "ops".into(),
            group_key: "0:{alertname=\"XidCritical\"}".into(),
            group_labels,
            status,
            reason: Reason::Update,
            alerts,
            truncated_alerts: 0,
            created_ms: 1_796_224_800_500,
            repeat_interval_ms: 4 * 3_600_000,
            hostname: "node7".into(),
            devices: vec![DeviceId {
                index: 1,
                minor: Some(1),
                uuid: "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd".into(),
                pci_bus_id: "00000000:08:00.0".into(),
                name: "NVIDIA H100 80GB HBM3".into(),
            }],
            processes: vec![ProcSample {
                pid: 4242,
                gpu_index: 1,
                gpu_uuid: "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd".into(),
                used_mem_bytes: Some(40 << 30),
                kind: ProcKind::Compute,
                uid: Some(1000),
                user: Some("alice".into()),
                command: Some("python train.py --lr 3e-4".into()),
                container: None,
                runtime_s: Some(7260.0),
                start_ticks: None,
            }],
            note: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testdata::*;
    use super::*;

    #[test]
    fn ids_are_stable_and_distinct() {
        let mut a = notification(vec![alert(1, AlertStatus::Firing)]);
        let mut b = a.clone();
        a.compute_id();
        b.compute_id();
        assert_eq!(a.id, b.id);
        assert_eq!(a.id.len(), 32);
        b.alerts[0].status = AlertStatus::Resolved;
        b.compute_id();
        assert_ne!(a.id, b.id);
    }

    #[test]
    fn common_labels_keep_shared_values() {
        let n = notification(vec![
            alert(1, AlertStatus::Firing),
            alert(2, AlertStatus::Firing),
        ]);
        let c = n.common_labels();
        assert_eq!(c.get("alertname").map(String::as_str), Some("XidCritical"));
        assert!(!c.contains_key("gpu"));
    }
}
