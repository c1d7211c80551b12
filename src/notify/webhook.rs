//! Generic webhook: the Alertmanager webhook body, format version 4, so any existing Alertmanager
//! receiver works unchanged. Firing alerts carry `endsAt = 0001-01-01T00:00:00Z` as Alertmanager
//! sends them; every alert's labels include `alertname`, `severity`, `gpu`, `uuid`, `hostname`.

use serde_json::{json, Map, Value};

use super::{full_labels, rfc3339_ms, Notification, Reason};
use super::channel::{HookBody, JsonHook};
use crate::model::{AlertEvent, AlertStatus};

/// `endsAt` of a firing alert in Alertmanager's webhook format.
pub const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

fn status_str(s: AlertStatus) -> &'static str {
    match s {
        AlertStatus::Firing => "firing",
        AlertStatus::Resolved => "resolved",
    }
}

fn map(m: &std::collections::BTreeMap<String, String>) -> Value {
    Value::Object(
        m.iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect::<Map<_, _>>(),
    )
}

/// One alert in Alertmanager's webhook shape.
pub fn alert_json(n: &Notification, a: &AlertEvent) -> Value {
    json!({
        "status": status_str(a.status),
        "labels": map(&full_labels(a, &n.hostname)),
        "annotations": map(&a.annotations),
        "startsAt": rfc3339_ms(a.starts_at_ms),
        "endsAt": a.ends_at_ms.map_or_else(|| ZERO_TIME.to_string(), rfc3339_ms),
        "generatorURL": "",
        "fingerprint": a.fingerprint,
    })
}

/// The webhook body.
pub fn render(n: &Notification) -> Value {
    let labelled: Vec<_> = n
        .alerts
        .iter()
        .map(|a| full_labels(a, &n.hostname))
        .collect();
    let mut common = labelled.first().cloned().unwrap_or_default();
    for l in &labelled[1.min(labelled.len())..] {
        common.retain(|k, v| l.get(k) == Some(v));
    }
    let reason = match n.reason {
        Reason::Update | Reason::Digest => "alert_group_changed",
        Reason::Repeat => "repeat_interval",
        Reason::NotifierFailing => "notifier_failing",
        Reason::Test => "test",
    };
    json!({
        "version": "4",
        "groupKey": n.group_key,
        "truncatedAlerts": n.truncated_alerts,
        "status": status_str(n.status),
        "receiver": n.channel,
        "groupLabels": map(&n.group_labels),
        "commonLabels": map(&common),
        "commonAnnotations": map(&n.common_annotations()),
        "externalURL": "",
        "notification_reason": reason,
        "alerts": n.alerts.iter().map(|a| alert_json(n, a)).collect::<Vec<_>>(),
    })
}

/// The `webhook` channel: POST the Alertmanager webhook v4 body to `url`.
pub type Webhook = JsonHook<WebhookBody>;

/// The `webhook` body.
#[derive(Debug)]
pub struct WebhookBody;

impl HookBody for WebhookBody {
    const TYPE: &'static str = "webhook";

    fn body(n: &Notification) -> Value {
        render(n)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::*;

    #[test]
    fn golden_alertmanager_v4() {
        let n = notification(vec![
            alert(1, AlertStatus::Firing),
            alert(2, AlertStatus::Resolved),
        ]);
        let got = render(&n);
        let expected = json!({
          "version": "4",
          "groupKey": "0:{alertname=\"XidCritical\"}",
          "truncatedAlerts": 0,
          "status": "firing",
          "receiver": "ops",
          "groupLabels": {"alertname": "XidCritical"},
          "commonLabels": {"alertname": "XidCritical", "hostname": "node7", "severity": "critical"},
          "commonAnnotations": {
            "next_steps": "Drain the node and reboot it; reseat or RMA the GPU if it recurs.",
            "values": "xid=79"
          },
          "externalURL": "",
          "notification_reason": "alert_group_changed",
          "alerts": [
            {
              "status": "firing",
              "labels": {"alertname": "XidCritical", "gpu": "1", "hostname": "node7",
                         "severity": "critical", "uuid": "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd"},
              "annotations": {
                "next_steps": "Drain the node and reboot it; reseat or RMA the GPU if it recurs.",
                "summary": "GPU 1 reported XID 79 (fallen off the bus)",
                "values": "xid=79"
              },
              "startsAt": "2026-12-02T15:20:00.000Z",
              "endsAt": "0001-01-01T00:00:00Z",
              "generatorURL": "",
              "fingerprint": "fp01"
            },
            {
              "status": "resolved",
              "labels": {"alertname": "XidCritical", "gpu": "2", "hostname": "node7",
                         "severity": "critical", "uuid": "GPU-00000002-aaaa-bbbb-cccc-dddddddddddd"},
              "annotations": {
                "next_steps": "Drain the node and reboot it; reseat or RMA the GPU if it recurs.",
                "summary": "GPU 2 reported XID 79 (fallen off the bus)",
                "values": "xid=79"
              },
              "startsAt": "2026-12-02T15:20:00.000Z",
              "endsAt": "2026-12-02T15:30:00.000Z",
              "generatorURL": "",
              "fingerprint": "fp02"
            }
          ]
        });
        assert_eq!(
            got,
            expected,
            "{}",
            serde_json::to_string_pretty(&got).unwrap()
        );
    }

    #[test]
    fn labels_are_completed_when_the_engine_left_them_out() {
        let mut a = alert(3, AlertStatus::Firing);
        a.labels.clear();
        let n = notification(vec![a]);
        let got = render(&n);
        let labels = &got["alerts"][0]["labels"];
        assert_eq!(labels["alertname"], "XidCritical");
        assert_eq!(labels["severity"], "critical");
        assert_eq!(labels["gpu"], "3");
        assert_eq!(labels["hostname"], "node7");
    }
}
