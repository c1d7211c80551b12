//! The delivery decisions, as a pure state machine with the clock as an input (no I/O, no clock
//! reads): routing ([`RouteSpec`] matchers, first match wins unless `continue`), aggregation
//! groups (`group_by`, `group_wait`, `group_interval`), `repeat_interval`, resolved notices,
//! quiet hours (non-critical messages held, one digest per channel when they end; critical
//! bypasses) and the per-channel rate limit (excess collapsed into one digest when a slot frees).
//!
//! Alertmanager semantics: a new group waits `group_wait`, then sends; afterwards it is looked at
//! every `group_interval` and sends when an alert started or resolved since the last message, or
//! when `repeat_interval` passed with alerts still firing. An alert that resolves before it was
//! ever announced is dropped silently (flap suppression). [`GrouperState`] is serialisable so the
//! dispatcher persists it: the remaining repeat interval, held digests and unsent group members
//! survive a restart.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::settings::NotifySettings;
use super::{Notification, Reason};
use crate::model::{AlertEvent, AlertStatus, DeviceId, ProcSample, Severity};

/// One aggregation group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Group {
    route: usize,
    labels: BTreeMap<String, String>,
    /// Current members by fingerprint.
    alerts: BTreeMap<String, AlertEvent>,
    /// Status each member had in the last message sent.
    notified: BTreeMap<String, AlertStatus>,
    next_flush_ms: i64,
    last_sent_ms: Option<i64>,
    /// The engine sent a `repeat` event (the rule's own `repeat`): re-send at the next tick.
    #[serde(default)]
    repeat_requested: bool,
}

/// Everything the grouper remembers (persisted by the dispatcher).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GrouperState {
    groups: BTreeMap<String, Group>,
    quiet_held: BTreeMap<String, Vec<Notification>>,
    rate_held: BTreeMap<String, Vec<Notification>>,
    sent_log: BTreeMap<String, VecDeque<i64>>,
    /// Firing alerts (fingerprint → labels), for inhibition.
    #[serde(default)]
    active: BTreeMap<String, BTreeMap<String, String>>,
}

impl GrouperState {
    /// Takes the messages held by quiet hours and by the rate limit (a short-lived dispatcher
    /// hands them over when it ends).
    pub fn take_held(&mut self) -> (Vec<Notification>, Vec<Notification>) {
        let quiet = std::mem::take(&mut self.quiet_held).into_values().flatten();
        let rate = std::mem::take(&mut self.rate_held).into_values().flatten();
        (quiet.collect(), rate.collect())
    }

    /// True when nothing is pending (no groups, nothing held).
    pub fn is_idle(&self) -> bool {
        self.groups.is_empty()
            && self.quiet_held.is_empty()
            && self.rate_held.is_empty()
            && self.active.is_empty()
    }
}

/// The latest GPU identities and process list, attached to the messages a grouper makes:
/// written by the daemon's loop when they change, read by the grouper when it makes messages (a
/// new process list, every few seconds, wakes no thread).
#[derive(Debug, Default)]
pub struct MessageContext {
    devices: Vec<DeviceId>,
    processes: Vec<ProcSample>,
}

/// A [`MessageContext`] shared between the thread that writes it and the grouper.
pub type SharedContext = Arc<std::sync::Mutex<MessageContext>>;

impl MessageContext {
    /// The GPUs seen in the latest snapshot (none: kept as they were) and the process list, when
    /// it was refreshed.
    pub fn update(&mut self, devices: Vec<DeviceId>, processes: Option<Vec<ProcSample>>) {
        if !devices.is_empty() {
            self.devices = devices;
        }
        if let Some(p) = processes {
            self.processes = p;
        }
    }
}

/// The routing / grouping / gating state machine.
#[derive(Debug, Clone)]
pub struct Grouper {
    settings: Arc<NotifySettings>,
    state: GrouperState,
    /// What messages name besides the alerts (see [`Grouper::context`]).
    context: SharedContext,
    /// Where the daemon's silences are read.
    silences: crate::silence::Feed,
    /// The silences read for the tick in progress (none between ticks: a live set is not held,
    /// so the daemon's next change need not copy it).
    in_force: Option<Arc<Vec<crate::silence::Silence>>>,
}

impl Grouper {
    /// A grouper continuing from `state`.
    pub fn new(settings: Arc<NotifySettings>, state: GrouperState) -> Grouper {
        Grouper {
            settings,
            state,
            context: SharedContext::default(),
            silences: crate::silence::Feed::default(),
            in_force: None,
        }
    }

    /// Sets where the silences are read: a tick that makes messages reads the set in force then
    /// (as Alertmanager checks silences at notification time). A silenced firing alert stays in
    /// its group but is left out of messages (no announcement, no repeats) while a silence
    /// matches it, like an inhibited one; it is announced if it still fires when the silence
    /// ends. Resolutions are not silenced.
    pub fn set_silences(&mut self, silences: crate::silence::Feed) {
        self.silences = silences;
    }

    /// Replaces the settings (reload). A group follows its route to wherever the route is now
    /// (a route is the same when it matches the same alerts: severities, rules and label
    /// matchers; its channels, grouping and timings may change and apply from now on); a group
    /// whose route is gone is dropped.
    pub fn set_settings(&mut self, settings: Arc<NotifySettings>) {
        let old = std::mem::replace(&mut self.settings, settings);
        let identity = |r: &super::settings::RouteSpec| {
            let re: Vec<(&String, &str)> =
                r.labels_re.iter().map(|(k, re)| (k, re.as_str())).collect();
            format!("{:?}|{:?}|{:?}|{re:?}", r.severity, r.rules, r.labels)
        };
        let now: Vec<String> = self.settings.routes.iter().map(identity).collect();
        for (key, group) in std::mem::take(&mut self.state.groups) {
            let moved = old
                .routes
                .get(group.route)
                .and_then(|r| now.iter().position(|i| *i == identity(r)));
            let Some(j) = moved else {
                tracing::warn!(group = %key, "notification route removed: its group is dropped");
                continue;
            };
            let rest = key.split_once(':').map_or(key.as_str(), |(_, r)| r);
            let mut group = group;
            group.route = j;
            match self.state.groups.entry(format!("{j}:{rest}")) {
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(group);
                }
                std::collections::btree_map::Entry::Occupied(mut o) => {
                    let g = o.get_mut();
                    g.alerts.extend(group.alerts);
                    g.notified.extend(group.notified);
                }
            }
        }
    }

    /// The state to persist.
    pub fn state(&self) -> &GrouperState {
        &self.state
    }

    /// Latest device identities and process list, attached to messages made from now on.
    pub fn set_context(&mut self, devices: Vec<DeviceId>, processes: Option<Vec<ProcSample>>) {
        self.context
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .update(devices, processes);
    }

    /// Where the grouper reads the device identities and process list its messages name: a
    /// handle for another thread to update ([`MessageContext::update`]) without telling it.
    pub fn context(&self) -> SharedContext {
        self.context.clone()
    }

    /// Takes engine events observed at `now_ms`.
    pub fn ingest(&mut self, now_ms: i64, events: &[AlertEvent]) {
        for ev in events {
            let full = super::full_labels(ev, &self.settings.hostname);
            match ev.status {
                // A one-shot notice is no inhibition source (it never resolves).
                AlertStatus::Firing if ev.once => {}
                AlertStatus::Firing => {
                    self.state
                        .active
                        .insert(ev.fingerprint.clone(), full.clone());
                }
                AlertStatus::Resolved => {
                    self.state.active.remove(&ev.fingerprint);
                }
            }
            for (i, route) in self.settings.routes.iter().enumerate() {
                if !route.matches(&ev.name, ev.severity, &full) {
                    continue;
                }
                let (key, labels) = match &route.group_by {
                    Some(by) => {
                        let labels: BTreeMap<String, String> = by
                            .iter()
                            .map(|l| (l.clone(), full.get(l).cloned().unwrap_or_default()))
                            .collect();
                        let inner: Vec<String> =
                            labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
                        (format!("{i}:{{{}}}", inner.join(",")), labels)
                    }
                    None => (format!("{i}:{}", ev.fingerprint), full.clone()),
                };
                match ev.status {
                    AlertStatus::Firing => {
                        let group = self.state.groups.entry(key).or_insert_with(|| Group {
                            route: i,
                            labels,
                            alerts: BTreeMap::new(),
                            notified: BTreeMap::new(),
                            next_flush_ms: now_ms + route.group_wait_ms,
                            last_sent_ms: None,
                            repeat_requested: false,
                        });
                        if ev.repeat && group.notified.contains_key(&ev.fingerprint) {
                            group.repeat_requested = true;
                        }
                        group.alerts.insert(ev.fingerprint.clone(), ev.clone());
                    }
                    // Resolutions below, by fingerprint: the group that holds the alert may
                    // no longer be the one this route and grouping name (a reload).
                    AlertStatus::Resolved => {}
                }
                if !route.continue_matching {
                    break;
                }
            }
            if ev.status == AlertStatus::Resolved {
                self.resolve(ev);
            }
        }
    }

    /// Books a resolution in every group that holds the alert: announced ones keep it (the
    /// resolved notice), the others forget it (an alert that resolves before it was announced is
    /// dropped silently).
    fn resolve(&mut self, ev: &AlertEvent) {
        let fp = &ev.fingerprint;
        self.state.groups.retain(|_, group| {
            if group.notified.contains_key(fp) {
                group.alerts.insert(fp.clone(), ev.clone());
            } else if group.alerts.remove(fp).is_some() {
                return !(group.alerts.is_empty() && group.notified.is_empty());
            }
            true
        });
    }

    /// Makes every group due now, ignoring `group_wait` / `group_interval` (used before a
    /// short-lived process exits).
    pub fn flush_all(&mut self) {
        for g in self.state.groups.values_mut() {
            g.next_flush_ms = i64::MIN;
        }
    }

    /// When [`tick`](Self::tick) next has something to do.
    pub fn next_wakeup(&self, now_ms: i64) -> Option<i64> {
        let mut next = self.state.groups.values().map(|g| g.next_flush_ms).min();
        let mut consider = |t: i64| next = Some(next.map_or(t, |n: i64| n.min(t)));
        if !self.state.quiet_held.is_empty() {
            // Quiet hours end on a minute boundary.
            consider((now_ms.div_euclid(60_000) + 1) * 60_000);
        }
        if let Some((_, per)) = self.settings.rate_limit {
            for (ch, held) in &self.state.rate_held {
                if held.is_empty() {
                    continue;
                }
                let oldest = self.state.sent_log.get(ch).and_then(|l| l.front().copied());
                consider(oldest.map_or(now_ms, |t| t + per));
            }
        }
        next
    }

    /// Makes the messages due at `now_ms`.
    pub fn tick(&mut self, now_ms: i64) -> Vec<Notification> {
        let mut out = Vec::new();
        let keys: Vec<String> = self
            .state
            .groups
            .iter()
            .filter(|(_, g)| g.next_flush_ms <= now_ms)
            .map(|(k, _)| k.clone())
            .collect();
        // The silences in force now, read once for the groups due (none due: not read at all).
        self.in_force = (!keys.is_empty()).then(|| self.silences.current());
        for key in keys {
            let Some(mut group) = self.state.groups.remove(&key) else {
                continue;
            };
            let Some(route) = self.settings.routes.get(group.route).cloned() else {
                continue;
            };
            // Inhibited and silenced firing alerts are left out. One already announced keeps its
            // mark while inhibited (its resolution is announced); a silenced one loses it at the
            // next message, so it is announced again if it still fires when the silence ends.
            let inhibited: Vec<&String> = group
                .alerts
                .iter()
                .filter(|(_, a)| self.inhibited(a, now_ms))
                .map(|(fp, _)| fp)
                .collect();
            let visible: BTreeMap<String, AlertEvent> = group
                .alerts
                .iter()
                .filter(|(fp, a)| !inhibited.contains(fp) && !self.silenced(a, now_ms))
                .map(|(fp, a)| (fp.clone(), a.clone()))
                .collect();
            let changed = visible
                .iter()
                .any(|(fp, a)| group.notified.get(fp) != Some(&a.status));
            // One-shot notices are announced once, never repeated.
            let any_firing = visible
                .values()
                .any(|a| a.status == AlertStatus::Firing && !a.once);
            let repeat_due = any_firing
                && (group.repeat_requested
                    || group
                        .last_sent_ms
                        .is_some_and(|t| now_ms - t >= route.repeat_interval_ms));
            if changed || repeat_due {
                let reason = if changed {
                    Reason::Update
                } else {
                    Reason::Repeat
                };
                for ch in &route.channels {
                    if let Some(n) = self.make(
                        ch,
                        &key,
                        &group.labels,
                        &visible,
                        reason,
                        now_ms,
                        route.repeat_interval_ms,
                    ) {
                        out.push(n);
                    }
                }
                let still_inhibited: Vec<(String, AlertStatus)> = inhibited
                    .iter()
                    .filter_map(|fp| group.notified.get(*fp).map(|st| ((*fp).clone(), *st)))
                    .collect();
                group.notified = visible
                    .iter()
                    .filter(|(_, a)| a.status == AlertStatus::Firing && !a.once)
                    .map(|(fp, a)| (fp.clone(), a.status))
                    .chain(still_inhibited)
                    .collect();
                group.alerts.retain(|_, a| a.status == AlertStatus::Firing);
                group.last_sent_ms = Some(now_ms);
                group.repeat_requested = false;
            }
            // A one-shot notice leaves its group once looked at (sent, or inhibited).
            group.alerts.retain(|_, a| !a.once);
            group.next_flush_ms = now_ms + route.group_interval_ms;
            if !group.alerts.is_empty() {
                self.state.groups.insert(key, group);
            }
        }
        self.in_force = None;
        self.gate(now_ms, out)
    }

    /// Whether a silence mutes firing alert `a` at `now_ms`.
    fn silenced(&self, a: &AlertEvent, now_ms: i64) -> bool {
        if a.status != AlertStatus::Firing || self.in_force.as_ref().is_none_or(|l| l.is_empty()) {
            return false;
        }
        self.silenced_labels(&super::full_labels(a, &self.settings.hostname), now_ms)
    }

    /// Whether a silence matches an alert with these (full) labels at `now_ms`.
    fn silenced_labels(&self, labels: &BTreeMap<String, String>, now_ms: i64) -> bool {
        self.in_force
            .as_ref()
            .is_some_and(|l| l.iter().any(|s| s.silences(labels, now_ms)))
    }

    /// Whether an inhibition mutes firing alert `a` at `now_ms`. A silenced alert inhibits
    /// nothing (silencing `gpu_lost` on a GPU being reseated lets its other alerts through).
    fn inhibited(&self, a: &AlertEvent, now_ms: i64) -> bool {
        if a.status != AlertStatus::Firing || self.settings.inhibit.is_empty() {
            return false;
        }
        let labels = super::full_labels(a, &self.settings.hostname);
        self.settings.inhibit.iter().any(|rule| {
            let sources = self
                .state
                .active
                .iter()
                .filter(|(_, l)| !self.silenced_labels(l, now_ms));
            rule.mutes(&a.fingerprint, &labels, sources)
        })
    }

    #[expect(clippy::too_many_arguments, reason = "internal helper")]
    fn make(
        &self,
        channel: &str,
        key: &str,
        labels: &BTreeMap<String, String>,
        members: &BTreeMap<String, AlertEvent>,
        reason: Reason,
        now_ms: i64,
        repeat_interval_ms: i64,
    ) -> Option<Notification> {
        let spec = self.settings.channel(channel)?;
        let mut alerts: Vec<AlertEvent> = members
            .values()
            .filter(|a| spec.send_resolved || a.status == AlertStatus::Firing)
            .cloned()
            .collect();
        if alerts.is_empty() {
            return None;
        }
        sort_alerts(&mut alerts);
        let truncated = spec.cap_alerts(&mut alerts);
        Some(self.notification(
            channel,
            key.to_string(),
            labels.clone(),
            reason,
            alerts,
            truncated,
            now_ms,
            repeat_interval_ms,
            None,
        ))
    }

    #[expect(clippy::too_many_arguments, reason = "a plain constructor")]
    fn notification(
        &self,
        channel: &str,
        group_key: String,
        group_labels: BTreeMap<String, String>,
        reason: Reason,
        alerts: Vec<AlertEvent>,
        truncated_alerts: usize,
        now_ms: i64,
        repeat_interval_ms: i64,
        note: Option<String>,
    ) -> Notification {
        let gpus: Vec<u32> = alerts.iter().filter_map(|a| a.gpu).collect();
        let status = if alerts.iter().any(|a| a.status == AlertStatus::Firing) {
            AlertStatus::Firing
        } else {
            AlertStatus::Resolved
        };
        let mut n = Notification {
            id: String::new(),
            channel: channel.to_string(),
            group_key,
            group_labels,
            status,
            reason,
            alerts,
            truncated_alerts,
            created_ms: now_ms,
            repeat_interval_ms,
            hostname: self.settings.hostname.clone(),
            devices: Vec::new(),
            processes: Vec::new(),
            note,
        };
        {
            let context = self
                .context
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            n.devices = context
                .devices
                .iter()
                .filter(|d| gpus.contains(&d.index))
                .cloned()
                .collect();
            n.processes = context
                .processes
                .iter()
                .filter(|p| gpus.contains(&p.gpu_index))
                .cloned()
                .collect();
        }
        n.compute_id();
        n
    }

    /// Quiet hours and rate limit.
    fn gate(&mut self, now_ms: i64, notifications: Vec<Notification>) -> Vec<Notification> {
        let quiet = self
            .settings
            .quiet_hours
            .is_some_and(|q| q.contains(now_ms));
        let mut out = Vec::new();
        for n in notifications {
            let critical = n.alerts.iter().any(|a| a.severity == Severity::Critical);
            if quiet && !critical {
                self.state
                    .quiet_held
                    .entry(n.channel.clone())
                    .or_default()
                    .push(n);
            } else {
                self.rate_gate(now_ms, n, &mut out);
            }
        }
        if !quiet {
            let held = std::mem::take(&mut self.state.quiet_held);
            for (channel, list) in held {
                let count = list.len();
                let digest = self.digest(
                    &channel,
                    list,
                    now_ms,
                    format!(
                        "{count} message(s) held during quiet hours; latest state of each alert:"
                    ),
                );
                self.rate_gate(now_ms, digest, &mut out);
            }
        }
        if let Some((max, per)) = self.settings.rate_limit {
            let channels: Vec<String> = self.state.rate_held.keys().cloned().collect();
            for channel in channels {
                let log = self.state.sent_log.entry(channel.clone()).or_default();
                while log.front().is_some_and(|t| *t <= now_ms - per) {
                    log.pop_front();
                }
                if log.len() < max as usize {
                    let list = self.state.rate_held.remove(&channel).unwrap_or_default();
                    if list.is_empty() {
                        continue;
                    }
                    let count = list.len();
                    let digest = self.digest(
                        &channel,
                        list,
                        now_ms,
                        format!(
                            "{count} message(s) held by the rate limit ({max} per {} s); latest state of each alert:",
                            per / 1000
                        ),
                    );
                    self.state
                        .sent_log
                        .entry(channel)
                        .or_default()
                        .push_back(now_ms);
                    out.push(digest);
                }
            }
        }
        out
    }

    fn rate_gate(&mut self, now_ms: i64, n: Notification, out: &mut Vec<Notification>) {
        let Some((max, per)) = self.settings.rate_limit else {
            out.push(n);
            return;
        };
        let log = self.state.sent_log.entry(n.channel.clone()).or_default();
        while log.front().is_some_and(|t| *t <= now_ms - per) {
            log.pop_front();
        }
        // A critical alert bypasses the rate limit as it bypasses quiet hours: a storm of
        // warnings must never hold back a lost GPU. It still counts against the limit.
        let critical = n
            .alerts
            .iter()
            .any(|a| a.severity == Severity::Critical && a.status == AlertStatus::Firing);
        if critical || (log.len() < max as usize && !self.state.rate_held.contains_key(&n.channel))
        {
            log.push_back(now_ms);
            out.push(n);
        } else {
            self.state
                .rate_held
                .entry(n.channel.clone())
                .or_default()
                .push(n);
        }
    }

    fn digest(
        &self,
        channel: &str,
        held: Vec<Notification>,
        now_ms: i64,
        note: String,
    ) -> Notification {
        let mut latest: BTreeMap<String, AlertEvent> = BTreeMap::new();
        let mut devices: Vec<DeviceId> = Vec::new();
        let mut processes: Vec<ProcSample> = Vec::new();
        let mut repeat_interval_ms = 0;
        for n in held {
            repeat_interval_ms = repeat_interval_ms.max(n.repeat_interval_ms);
            for a in n.alerts {
                latest.insert(a.fingerprint.clone(), a);
            }
            for d in n.devices {
                if !devices.contains(&d) {
                    devices.push(d);
                }
            }
            // The latest sighting of each process (per GPU and pid): the held messages repeat
            // the same processes with newer memory and run times.
            for p in n.processes {
                match processes
                    .iter_mut()
                    .find(|q| q.pid == p.pid && q.gpu_index == p.gpu_index)
                {
                    Some(q) => *q = p,
                    None => processes.push(p),
                }
            }
        }
        let mut alerts: Vec<AlertEvent> = latest.into_values().collect();
        sort_alerts(&mut alerts);
        // The channel's `max_alerts` applies to a digest too (a night of held messages).
        let truncated = self
            .settings
            .channel(channel)
            .map_or(0, |spec| spec.cap_alerts(&mut alerts));
        let mut n = self.notification(
            channel,
            "digest".into(),
            BTreeMap::new(),
            Reason::Digest,
            alerts,
            truncated,
            now_ms,
            repeat_interval_ms,
            Some(note),
        );
        n.devices = devices;
        n.processes = processes;
        n.compute_id();
        n
    }
}

/// Firing first, then by GPU, then by name and fingerprint.
fn sort_alerts(alerts: &mut [AlertEvent]) {
    alerts.sort_by(|a, b| {
        (
            a.status != AlertStatus::Firing,
            a.gpu,
            &a.name,
            &a.fingerprint,
        )
            .cmp(&(
                b.status != AlertStatus::Firing,
                b.gpu,
                &b.name,
                &b.fingerprint,
            ))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;
    use std::path::Path;

    const MIN: i64 = 60_000;

    fn grouper(extra: &str) -> Grouper {
        let text = format!(
            "[daemon]\nhostname = \"node7\"\n{extra}\n[[channel]]\nname = \"ops\"\ntype = \"webhook\"\nurl = \"http://127.0.0.1:1/\"\n[[channel]]\nname = \"mail\"\ntype = \"email\"\nsmtp = \"127.0.0.1:2525\"\ntls = \"none\"\nfrom = \"a@b.c\"\nto = [\"d@e.f\"]\n"
        );
        let config = parse(&text, Path::new("c.toml")).unwrap();
        let s = config.notify_settings().unwrap();
        Grouper::new(Arc::new(s), GrouperState::default())
    }

    fn ev(name: &str, gpu: u32, sev: Severity, status: AlertStatus, at: i64) -> AlertEvent {
        let mut labels = BTreeMap::new();
        labels.insert("alertname".to_string(), name.to_string());
        labels.insert("gpu".to_string(), gpu.to_string());
        AlertEvent {
            fingerprint: format!("{name}-{gpu}"),
            name: name.into(),
            severity: sev,
            status,
            labels,
            annotations: BTreeMap::new(),
            starts_at_ms: 0,
            ends_at_ms: (status == AlertStatus::Resolved).then_some(at),
            at_ms: at,
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

    fn summary(ns: &[Notification]) -> Vec<String> {
        ns.iter()
            .map(|n| {
                let alerts: Vec<String> = n
                    .alerts
                    .iter()
                    .map(|a| {
                        format!(
                            "{}{}",
                            a.fingerprint,
                            if a.status == AlertStatus::Firing {
                                ""
                            } else {
                                "(r)"
                            }
                        )
                    })
                    .collect();
                format!("{}:{:?}:{}", n.channel, n.reason, alerts.join(","))
            })
            .collect()
    }

    #[test]
    fn eight_gpus_one_message_per_channel() {
        let mut g = grouper("[notify]\ngroup_wait = \"30s\"\n");
        let t0 = 1_000_000;
        let events: Vec<_> = (0..8)
            .map(|i| {
                ev(
                    "XidCritical",
                    i,
                    Severity::Critical,
                    AlertStatus::Firing,
                    t0,
                )
            })
            .collect();
        g.ingest(t0, &events[..3]);
        g.ingest(t0 + 5_000, &events[3..]);
        assert!(g.tick(t0 + 29_999).is_empty());
        assert_eq!(g.next_wakeup(t0), Some(t0 + 30_000));
        let out = g.tick(t0 + 30_000);
        assert_eq!(out.len(), 2, "{:?}", summary(&out));
        assert_eq!(out[0].alerts.len(), 8);
        assert_eq!(out[0].channel, "ops");
        assert_eq!(out[1].channel, "mail");
        assert_eq!(out[0].group_labels.get("alertname").unwrap(), "XidCritical");
        // Nothing new: no message until repeat_interval.
        assert!(g.tick(t0 + 30_000 + 5 * MIN).is_empty());
        let out = g.tick(t0 + 30_000 + 4 * 60 * MIN);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].reason, Reason::Repeat);
    }

    /// The GPUs and processes a message names come from the shared context as it is when the
    /// message is made (another thread updates it without telling the grouper): only those of
    /// the message's GPUs, a refreshed process list replacing the one before, and devices kept
    /// when an update has none.
    #[test]
    fn messages_name_the_shared_context_as_it_is_when_they_are_made() {
        let mut g = grouper("[notify]\ngroup_wait = \"30s\"\n");
        let context = g.context();
        let gpu = |index: u32| DeviceId {
            index,
            uuid: format!("GPU-{index}"),
            ..DeviceId::default()
        };
        let t0 = 1_000_000;
        let writer = std::thread::spawn(move || {
            let mut c = context.lock().unwrap();
            c.update(
                vec![gpu(0), gpu(1), gpu(2)],
                Some(vec![ProcSample::compute(7, 1, "GPU-1", None)]),
            );
            c.update(
                Vec::new(),
                Some(vec![
                    ProcSample::compute(41, 1, "GPU-1", None),
                    ProcSample::compute(42, 2, "GPU-2", None),
                ]),
            );
        });
        writer.join().unwrap();
        let e = ev(
            "XidCritical",
            1,
            Severity::Critical,
            AlertStatus::Firing,
            t0,
        );
        g.ingest(t0, &[e]);
        let out = g.tick(t0 + 30_000);
        assert_eq!(out.len(), 2);
        let gpus: Vec<u32> = out[0].devices.iter().map(|d| d.index).collect();
        let pids: Vec<u32> = out[0].processes.iter().map(|p| p.pid).collect();
        assert_eq!((gpus, pids), (vec![1], vec![41]));
    }

    /// A one-shot notice (a kill's audit record, the usage digest) is sent once: never repeated,
    /// never kept in its group, never an inhibition source.
    #[test]
    fn a_one_shot_notice_is_sent_once() {
        let mut g = grouper("[notify]\ngroup_wait = \"0s\"\ngroup_interval = \"1m\"\n");
        let n = ev("kill_action", 0, Severity::Critical, AlertStatus::Firing, 0).once();
        g.ingest(0, &[n]);
        assert_eq!(
            summary(&g.tick(0)),
            vec!["ops:Update:kill_action-0", "mail:Update:kill_action-0"]
        );
        assert!(g.tick(4 * 60 * MIN).is_empty(), "no repeat");
        assert!(g.state().is_idle(), "{:?}", g.state());
    }

    /// A silence mutes a firing alert's repeats; its resolution still goes out; an alert still
    /// firing when its silence ends is announced again.
    #[test]
    fn silences_mute_firing_alerts_not_resolutions() {
        let mut g = grouper("[notify]\ngroup_wait = \"0s\"\ngroup_interval = \"1m\"\n");
        let silence = |gpu: &str, ends_ms| crate::silence::Silence {
            id: "s1".into(),
            matchers: vec![crate::silence::Matcher::parse(&format!("gpu={gpu}")).unwrap()],
            starts_ms: 0,
            ends_ms,
            comment: String::new(),
            created_by: String::new(),
            until_pid: None,
            until_start: None,
        };
        let fire = |gpu| ev("gpu_lost", gpu, Severity::Critical, AlertStatus::Firing, 0);
        g.ingest(0, &[fire(3), fire(4)]);
        assert_eq!(g.tick(0).len(), 2);
        g.set_silences(crate::silence::Feed::fixed(vec![
            silence("3", 10 * 60 * MIN),
            silence("4", 5 * 60 * MIN),
        ]));
        assert!(g.tick(4 * 60 * MIN).is_empty(), "repeats muted");
        // GPU 3 resolves while silenced: its resolution is announced.
        g.ingest(
            4 * 60 * MIN + 1,
            &[ev(
                "gpu_lost",
                3,
                Severity::Critical,
                AlertStatus::Resolved,
                1,
            )],
        );
        assert_eq!(
            summary(&g.tick(4 * 60 * MIN + MIN)),
            vec!["ops:Update:gpu_lost-3(r)", "mail:Update:gpu_lost-3(r)"]
        );
        // GPU 4's silence ends while it still fires: announced again.
        assert_eq!(
            summary(&g.tick(5 * 60 * MIN + MIN)),
            vec!["ops:Update:gpu_lost-4", "mail:Update:gpu_lost-4"]
        );
    }

    /// An announced alert that an inhibition then hides keeps its mark: its resolution is
    /// announced even when another member's change was sent meanwhile.
    #[test]
    fn an_inhibited_alert_still_gets_its_resolved_notice() {
        let mut g = grouper("[notify]\ngroup_wait = \"0s\"\ngroup_interval = \"1m\"\n");
        let xid = |gpu, status| ev("xid_error", gpu, Severity::Critical, status, 0);
        g.ingest(
            0,
            &[xid(3, AlertStatus::Firing), xid(4, AlertStatus::Firing)],
        );
        assert_eq!(g.tick(0).len(), 2);
        g.ingest(
            1,
            &[ev(
                "gpu_lost",
                3,
                Severity::Critical,
                AlertStatus::Firing,
                1,
            )],
        );
        g.ingest(2, &[xid(4, AlertStatus::Resolved)]);
        let out = summary(&g.tick(MIN));
        assert!(
            out.contains(&"ops:Update:xid_error-4(r)".to_string()),
            "{out:?}"
        );
        g.ingest(MIN + 1, &[xid(3, AlertStatus::Resolved)]);
        let out = summary(&g.tick(2 * MIN));
        assert!(
            out.contains(&"ops:Update:xid_error-3(r)".to_string()),
            "{out:?}"
        );
    }

    /// A reload that puts a route before the one an announced alert's group came from: the
    /// group follows its route, and the alert's resolution is announced through it (before, the
    /// resolution looked for a group under the new index, found none, and the old group repeated
    /// the alert for ever).
    #[test]
    fn a_group_follows_its_route_across_a_reload() {
        let routes = |first: &str| {
            format!(
                "[notify]\ngroup_wait = \"0s\"\ngroup_interval = \"1m\"\n{first}\n[[route]]\nseverity = [\"critical\"]\nchannels = [\"ops\"]\n"
            )
        };
        let mut g = grouper(&routes(""));
        g.ingest(
            0,
            &[ev(
                "gpu_lost",
                3,
                Severity::Critical,
                AlertStatus::Firing,
                0,
            )],
        );
        assert_eq!(summary(&g.tick(0)), vec!["ops:Update:gpu_lost-3"]);
        let reloaded = grouper(&routes(
            "[[route]]\nrules = [\"usage_digest\"]\nchannels = [\"mail\"]\n",
        ));
        g.set_settings(reloaded.settings.clone());
        g.ingest(
            MIN,
            &[ev(
                "gpu_lost",
                3,
                Severity::Critical,
                AlertStatus::Resolved,
                MIN,
            )],
        );
        assert_eq!(summary(&g.tick(2 * MIN)), vec!["ops:Update:gpu_lost-3(r)"]);
        assert!(g.state().is_idle(), "{:?}", g.state());
    }

    #[test]
    fn resolved_notice_at_next_group_interval() {
        let mut g = grouper("[notify]\ngroup_wait = \"0s\"\ngroup_interval = \"1m\"\n");
        let a = ev("EccErrors", 0, Severity::Warning, AlertStatus::Firing, 0);
        g.ingest(0, &[a]);
        assert_eq!(
            summary(&g.tick(0)),
            vec!["ops:Update:EccErrors-0", "mail:Update:EccErrors-0"]
        );
        let r = ev(
            "EccErrors",
            0,
            Severity::Warning,
            AlertStatus::Resolved,
            10_000,
        );
        g.ingest(10_000, &[r]);
        assert!(g.tick(10_000).is_empty());
        assert_eq!(
            summary(&g.tick(MIN)),
            vec!["ops:Update:EccErrors-0(r)", "mail:Update:EccErrors-0(r)"]
        );
        assert!(g.state().is_idle());
        assert_eq!(g.next_wakeup(MIN), None);
    }

    #[test]
    fn a_rule_repeat_event_resends_at_the_next_tick() {
        let mut g = grouper("[notify]\ngroup_wait = \"0s\"\ngroup_interval = \"1m\"\n[[route]]\nchannels = [\"ops\"]\n");
        g.ingest(0, &[ev("X", 0, Severity::Warning, AlertStatus::Firing, 0)]);
        assert_eq!(g.tick(0).len(), 1);
        let mut again = ev("X", 0, Severity::Warning, AlertStatus::Firing, 30_000);
        g.ingest(30_000, &[again.clone()]);
        assert!(g.tick(MIN).is_empty(), "a plain re-emit is no change");
        again.repeat = true;
        g.ingest(90_000, &[again]);
        assert_eq!(summary(&g.tick(2 * MIN)), vec!["ops:Repeat:X-0"]);
        assert!(g.tick(3 * MIN).is_empty());
    }

    #[test]
    fn flap_inside_group_wait_sends_nothing() {
        let mut g = grouper("[notify]\ngroup_wait = \"30s\"\n");
        g.ingest(0, &[ev("X", 0, Severity::Warning, AlertStatus::Firing, 0)]);
        g.ingest(
            10_000,
            &[ev("X", 0, Severity::Warning, AlertStatus::Resolved, 10_000)],
        );
        assert!(g.tick(30_000).is_empty());
        assert!(g.state().is_idle());
    }

    #[test]
    fn routes_match_first_and_continue() {
        let mut g = grouper(
            "[[route]]\nseverity = [\"critical\"]\nchannels = [\"mail\"]\ngroup_wait = \"0s\"\ncontinue = true\n[[route]]\nchannels = [\"ops\"]\ngroup_wait = \"0s\"\ngroup_by = [\"...\"]\n",
        );
        g.ingest(
            0,
            &[
                ev("A", 0, Severity::Critical, AlertStatus::Firing, 0),
                ev("B", 1, Severity::Warning, AlertStatus::Firing, 0),
                ev("B", 2, Severity::Warning, AlertStatus::Firing, 0),
            ],
        );
        let mut out = summary(&g.tick(0));
        out.sort();
        assert_eq!(
            out,
            vec![
                "mail:Update:A-0",
                "ops:Update:A-0",
                "ops:Update:B-1",
                "ops:Update:B-2"
            ]
        );
    }

    #[test]
    fn quiet_hours_hold_non_critical_and_send_a_digest() {
        let mut g = grouper(
            "[notify]\ngroup_wait = \"0s\"\nrate_limit = { max = 0 }\nquiet_hours = { start = \"00:00\", end = \"01:00\", timezone = \"UTC\" }\n[[route]]\nchannels = [\"ops\"]\n",
        );
        g.ingest(
            MIN,
            &[ev("Warm", 0, Severity::Warning, AlertStatus::Firing, MIN)],
        );
        assert!(g.tick(MIN).is_empty());
        g.ingest(
            2 * MIN,
            &[ev(
                "Lost",
                1,
                Severity::Critical,
                AlertStatus::Firing,
                2 * MIN,
            )],
        );
        assert_eq!(summary(&g.tick(2 * MIN)), vec!["ops:Update:Lost-1"]);
        assert_eq!(g.next_wakeup(2 * MIN), Some(3 * MIN));
        assert!(g.tick(59 * MIN).is_empty());
        let out = g.tick(60 * MIN);
        assert_eq!(summary(&out), vec!["ops:Digest:Warm-0"]);
        assert!(out[0].note.as_deref().unwrap().contains("quiet hours"));
    }

    #[test]
    fn rate_limit_collapses_a_storm() {
        let mut g = grouper(
            "[notify]\ngroup_wait = \"0s\"\nrate_limit = { max = 2, per = \"10m\" }\n[[route]]\nchannels = [\"ops\"]\ngroup_by = [\"...\"]\n",
        );
        let storm: Vec<_> = (0..6)
            .map(|i| ev("S", i, Severity::Warning, AlertStatus::Firing, 0))
            .collect();
        g.ingest(0, &storm);
        assert_eq!(
            summary(&g.tick(0)),
            vec!["ops:Update:S-0", "ops:Update:S-1"]
        );
        assert_eq!(g.next_wakeup(0), Some(5 * MIN), "group ticks come first");
        assert!(g.tick(5 * MIN).is_empty());
        let out = g.tick(10 * MIN);
        assert_eq!(summary(&out), vec!["ops:Digest:S-2,S-3,S-4,S-5"]);
    }

    /// Issue 11: a storm that fills the rate limit must not hold back a critical alert.
    #[test]
    fn critical_bypasses_the_rate_limit_and_the_storm_stays_collapsed() {
        let mut g = grouper(
            "[notify]\ngroup_wait = \"0s\"\nrate_limit = { max = 30, per = \"1h\" }\n[[route]]\nchannels = [\"ops\"]\ngroup_by = [\"...\"]\n",
        );
        let storm: Vec<_> = (0..40)
            .map(|i| ev("S", i, Severity::Warning, AlertStatus::Firing, 0))
            .collect();
        g.ingest(0, &storm);
        assert_eq!(g.tick(0).len(), 30, "the limit lets 30 through");
        g.ingest(
            1000,
            &[ev(
                "gpu_lost",
                3,
                Severity::Critical,
                AlertStatus::Firing,
                1000,
            )],
        );
        let out = g.tick(1000);
        assert_eq!(summary(&out), vec!["ops:Update:gpu_lost-3"]);
        // The ten held warnings still come as one digest when the window has room.
        let out = g.tick(3_600_000 + 1000);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].reason, Reason::Digest);
        assert_eq!(out[0].alerts.len(), 10);
    }

    #[test]
    fn a_lost_gpu_mutes_its_other_alerts() {
        let mut g = grouper("[notify]\ngroup_wait = \"0s\"\ngroup_interval = \"1m\"\n[[route]]\nchannels = [\"ops\"]\n");
        g.ingest(
            0,
            &[
                ev("xid_error", 3, Severity::Critical, AlertStatus::Firing, 0),
                ev("gpu_lost", 3, Severity::Critical, AlertStatus::Firing, 0),
                ev("xid_error", 4, Severity::Critical, AlertStatus::Firing, 0),
            ],
        );
        let mut out = summary(&g.tick(0));
        out.sort();
        assert_eq!(out, vec!["ops:Update:gpu_lost-3", "ops:Update:xid_error-4"]);
        // The muted alert resolves: nothing to say.
        g.ingest(
            MIN,
            &[ev(
                "xid_error",
                3,
                Severity::Critical,
                AlertStatus::Resolved,
                MIN,
            )],
        );
        assert!(g.tick(2 * MIN).is_empty());
    }

    #[test]
    fn state_round_trips_through_json() {
        let mut g = grouper("");
        g.ingest(0, &[ev("X", 0, Severity::Warning, AlertStatus::Firing, 0)]);
        let json = serde_json::to_string(g.state()).unwrap();
        let back: GrouperState = serde_json::from_str(&json).unwrap();
        assert_eq!(&back, g.state());
    }
}
