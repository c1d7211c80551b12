//! `alertmanager` channel: pushes the alerts to an Alertmanager's `POST /api/v2/alerts` as
//! postable alerts. While firing, `endsAt` lies `4 × repeat_interval` ahead (Alertmanager's
//! client convention, so a silent gpuwatch lets the alert expire); resolved alerts carry their
//! real end time.

use serde_json::{json, Value};

use super::{full_labels, rfc3339_ms, Notification};
use super::channel::{
    base_url, check_url, Channel, ChannelType, HttpRequest, RenderEnv, Request, Section, SectionError,
    UrlSection,
};
use super::secret::Secret;

/// The request body: an array of postable alerts.
pub fn render(n: &Notification) -> Value {
    let alerts: Vec<Value> = n
        .alerts
        .iter()
        .map(|a| {
            let ends = a.ends_at_ms.unwrap_or_else(|| {
                n.created_ms
                    .saturating_add(n.repeat_interval_ms.max(60_000).saturating_mul(4))
            });
            json!({
                "labels": full_labels(a, &n.hostname),
                "annotations": a.annotations,
                "startsAt": rfc3339_ms(a.starts_at_ms),
                "endsAt": rfc3339_ms(ends),
                "generatorURL": "",
            })
        })
        .collect();
    Value::Array(alerts)
}

/// The `alertmanager` channel: POST postable alerts to `{url}/api/v2/alerts`.
#[derive(Debug)]
pub struct Alertmanager {
    url: Secret,
}

impl ChannelType for Alertmanager {
    const TYPE: &'static str = "alertmanager";

    fn parse(section: &mut Section<'_>) -> Result<Self, SectionError> {
        let c: UrlSection = section.deserialize()?;
        let base = c.required(section)?;
        let url = Secret::new(format!("{}/api/v2/alerts", base_url(&base)));
        check_url(url.expose())?;
        Ok(Alertmanager { url })
    }
}

impl Channel for Alertmanager {
    fn secrets(&self) -> Vec<&Secret> {
        vec![&self.url]
    }

    fn render(&self, n: &Notification, _env: &RenderEnv) -> Result<Vec<Request>, String> {
        Ok(vec![Request::Http(HttpRequest::post_json(
            self.url.clone(),
            &n.id,
            &render(n),
        ))])
    }
}

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::*;
    use crate::model::AlertStatus;

    #[test]
    fn golden_postable_alerts() {
        let n = notification(vec![
            alert(1, AlertStatus::Firing),
            alert(2, AlertStatus::Resolved),
        ]);
        let got = render(&n);
        assert_eq!(got[0]["labels"]["alertname"], "XidCritical");
        assert_eq!(got[0]["labels"]["gpu"], "1");
        assert_eq!(got[0]["startsAt"], "2026-12-02T15:20:00.000Z");
        // created 15:20:00.500 + 4 × 4 h
        assert_eq!(got[0]["endsAt"], "2026-12-03T07:20:00.500Z");
        assert_eq!(got[1]["endsAt"], "2026-12-02T15:30:00.000Z");
        assert_eq!(
            got[1]["annotations"]["summary"],
            "GPU 2 reported XID 79 (fallen off the bus)"
        );
    }
}
