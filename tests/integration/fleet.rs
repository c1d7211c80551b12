//! Issue 14 §2 (part): the fleet path with the real engines, on loopback. Three `gpuwatch
//! daemon`s (different scenarios and host names) with the exporter on and a real Prometheus
//! (Debian's `prometheus`, installed by `.ci/run`) scraping them: PromQL over Prometheus's HTTP
//! API sees 24 GPUs with the right utilization, and `gpuwatch_alerts` shows the faulty node's
//! firing alert. Three daemons pushing to a real Alertmanager (`prometheus-alertmanager`): the
//! same alert from three nodes is one notification at Alertmanager's webhook receiver, a silence
//! made through Alertmanager's API keeps one node's alert out, and resolved notices arrive.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::common;
use super::notify::servers::{free_port, wait_until};

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Percent-encodes a query-string value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An instant query's result vector, `None` while Prometheus cannot answer.
fn query(port: u16, q: &str) -> Option<Vec<serde_json::Value>> {
    let (status, _, body) =
        super::exporter::get(port, &format!("/api/v1/query?query={}", encode(q)), "*/*")?;
    if status != 200 {
        return None;
    }
    // The body may be chunked; take the JSON object out of it.
    let start = body.find('{')?;
    let end = body.rfind('}')?;
    let v: serde_json::Value = serde_json::from_str(&body[start..=end]).ok()?;
    v["data"]["result"].as_array().cloned()
}

fn daemon(dir: &Path, scenario: &str, host: &str, scale: &str, extra: &str) -> (Proc, u16) {
    let port = free_port();
    let cfg = dir.join(format!("{host}.toml"));
    std::fs::write(
        &cfg,
        format!(
            "[daemon]\ninterval = \"1s\"\nstate_dir = {state:?}\nrules = [{rules:?}]\nhostname = \"{host}\"\n\n\
             [exporter]\nlisten = \"127.0.0.1:{port}\"\n\n{extra}\n",
            state = dir.join(host).display().to_string(),
            rules = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("rules")
                .display()
                .to_string(),
        ),
    )
    .expect("config");
    let child = common::command(
        &[
            "--sim",
            scenario,
            "daemon",
            "--config",
            cfg.to_str().expect("utf-8"),
        ],
        &[("NVML_SIM_TIME_SCALE", scale)],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("gpuwatch daemon");
    (Proc(child), port)
}

#[test]
fn prometheus_scrapes_three_daemons() {
    let Some(prom) = common::installed(&["prometheus"]) else {
        return;
    };
    common::sim_lib();
    let tmp = tempfile::tempdir().expect("tempdir");
    let nodes = [
        ("healthy", "node-a", "1"),
        ("healthy", "node-b", "1"),
        // XID 79 at 30 s of scenario time: 3 s here.
        ("xid-79", "node-c", "10"),
    ];
    let daemons: Vec<(Proc, u16)> = nodes
        .iter()
        .map(|(s, h, scale)| daemon(tmp.path(), s, h, scale, ""))
        .collect();
    let targets: Vec<String> = daemons
        .iter()
        .map(|(_, p)| format!("\"127.0.0.1:{p}\""))
        .collect();
    let prom_port = free_port();
    let prom_cfg = tmp.path().join("prometheus.yml");
    let contrib = Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib");
    std::fs::write(
        &prom_cfg,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {:?}\n\
             scrape_configs:\n  - job_name: gpuwatch\n    static_configs:\n      - targets: [{}]\n",
            contrib
                .join("prometheus/gpuwatch-rules.yml")
                .display()
                .to_string(),
            targets.join(", ")
        ),
    )
    .expect("prometheus.yml");
    // The shipped rules pass promtool's checks.
    if let Ok(out) = Command::new("promtool")
        .args(["check", "rules"])
        .arg(contrib.join("prometheus/gpuwatch-rules.yml"))
        .output()
    {
        assert!(
            out.status.success(),
            "promtool check rules: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _prom = Proc(
        Command::new(prom)
            .arg(format!("--config.file={}", prom_cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                tmp.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus"),
    );
    // Every GPU of the three nodes, by its host and index.
    let gpus = wait_until(Duration::from_secs(60), "24 GPUs in Prometheus", || {
        query(prom_port, "gpuwatch_gpu_lost").filter(|r| r.len() == 24)
    });
    let hosts: std::collections::BTreeSet<String> = gpus
        .iter()
        .map(|r| r["metric"]["hostname"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(hosts.len(), 3, "{hosts:?}");
    // The healthy nodes run near 95 % (the scenario's mean), under dcgm-exporter's name.
    let util = wait_until(Duration::from_secs(30), "utilization of node-a", || {
        query(
            prom_port,
            "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL{Hostname=\"node-a\"})",
        )
        .filter(|r| !r.is_empty())
    });
    let v: f64 = util[0]["value"][1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("a number");
    assert!((88.0..=100.0).contains(&v), "node-a utilization {v}");
    let per_node = query(prom_port, "count by (Hostname) (DCGM_FI_DEV_GPU_UTIL)").expect("query");
    assert_eq!(per_node.len(), 3, "{per_node:?}");
    // The faulty node's alert, as gpuwatch_alerts.
    let firing = wait_until(Duration::from_secs(60), "gpu_lost firing on node-c", || {
        query(
            prom_port,
            "gpuwatch_alerts{alertname=\"gpu_lost\",state=\"firing\"}",
        )
        .filter(|r| !r.is_empty())
    });
    assert!(
        firing.iter().all(|r| r["metric"]["hostname"] == "node-c"),
        "{firing:?}"
    );
    // The shipped recording rules evaluate over the three nodes.
    let per_node = wait_until(Duration::from_secs(30), "gpuwatch:node_gpus:count", || {
        query(prom_port, "gpuwatch:node_gpus:count").filter(|r| r.len() == 3)
    });
    assert!(
        per_node
            .iter()
            .all(|r| r["value"][1] == "8" || r["value"][1] == "7"),
        "{per_node:?}"
    );
    wait_until(
        Duration::from_secs(30),
        "gpuwatch:alerts_firing:count",
        || {
            query(
                prom_port,
                "gpuwatch:alerts_firing:count{alertname=\"gpu_lost\"}",
            )
            .filter(|r| !r.is_empty())
        },
    );
    // Every query of the shipped Grafana dashboard runs and has data.
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(contrib.join("grafana/gpuwatch.json")).expect("dashboard"),
    )
    .expect("dashboard JSON");
    let mut exprs = vec!["DCGM_FI_DEV_GPU_UTIL".to_string()];
    assert_eq!(
        dash["templating"]["list"][1]["definition"],
        "label_values(DCGM_FI_DEV_GPU_UTIL, Hostname)"
    );
    for p in dash["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().expect("targets") {
            exprs.push(t["expr"].as_str().expect("expr").replace("$host", ".*"));
        }
    }
    assert!(exprs.len() >= 7, "{exprs:?}");
    for e in &exprs {
        let r = query(prom_port, e).unwrap_or_else(|| panic!("dashboard query fails: {e}"));
        // The job panels have data only while a `gpuwatch run` is scraped (its series are
        // checked in `exporter::run_serves_job_progress_and_nvml_timeouts`); these are daemons.
        assert!(
            !r.is_empty() || e.starts_with("gpuwatch_job_"),
            "dashboard query without data: {e}"
        );
    }
    drop(daemons);
}

/// `POST path` with a JSON body; the status.
fn post_json(port: u16, path: &str, body: &serde_json::Value) -> Option<u16> {
    use std::io::{Read as _, Write as _};
    let body = body.to_string();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    raw.split_whitespace().nth(1)?.parse().ok()
}

/// The (status, alertname, sorted hostnames) of each notification Alertmanager sent.
fn notifications(
    hook: &super::notify::servers::HttpReceiver,
) -> Vec<(String, String, Vec<String>)> {
    hook.requests()
        .iter()
        .map(|r| {
            let b = r.json();
            let mut hosts: Vec<String> = b["alerts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|a| a["status"] == b["status"])
                .map(|a| a["labels"]["hostname"].as_str().unwrap_or("").to_string())
                .collect();
            hosts.sort();
            (
                b["status"].as_str().unwrap_or("").to_string(),
                b["groupLabels"]["alertname"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                hosts,
            )
        })
        .collect()
}

#[test]
fn alertmanager_groups_three_nodes_and_honours_silences() {
    let Some(am) = common::installed(&["prometheus-alertmanager", "alertmanager"]) else {
        return;
    };
    common::sim_lib();
    let tmp = tempfile::tempdir().expect("tempdir");
    let hook = super::notify::servers::HttpReceiver::start();
    let am_port = free_port();
    let am_cfg = tmp.path().join("alertmanager.yml");
    std::fs::write(
        &am_cfg,
        format!(
            "route:\n  receiver: hook\n  group_by: [alertname]\n  group_wait: 4s\n  group_interval: 2s\n  repeat_interval: 1h\n\
             receivers:\n  - name: hook\n    webhook_configs:\n      - url: \"{}\"\n        send_resolved: true\n",
            hook.url("/am")
        ),
    )
    .expect("alertmanager.yml");
    let _am = Proc(
        Command::new(am)
            .arg(format!("--config.file={}", am_cfg.display()))
            .arg(format!(
                "--storage.path={}",
                tmp.path().join("am").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{am_port}"))
            .arg("--cluster.listen-address=")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("alertmanager"),
    );
    wait_until(Duration::from_secs(30), "alertmanager ready", || {
        super::exporter::get(am_port, "/-/ready", "*/*").filter(|r| r.0 == 200)
    });
    // Maintenance on node-a: its xid_error is silenced through Alertmanager's API.
    let now = chrono::Utc::now();
    let silence = serde_json::json!({
        "matchers": [
            {"name": "alertname", "value": "xid_error", "isRegex": false, "isEqual": true},
            {"name": "hostname", "value": "node-a", "isRegex": false, "isEqual": true},
        ],
        "startsAt": now.to_rfc3339(),
        "endsAt": (now + chrono::Duration::hours(1)).to_rfc3339(),
        "createdBy": "gpuwatch tests",
        "comment": "reseating GPU 3",
    });
    assert_eq!(post_json(am_port, "/api/v2/silences", &silence), Some(200));
    // Three nodes see an uncorrectable ECC error with XID 94 on GPU 2 (60 s of scenario time:
    // 6 s here); xid_error looks back 10 s, so it resolves soon after.
    let push = format!(
        "[rules.params]\nxid_error = {{ window = \"10s\" }}\n\n\
         [[channel]]\nname = \"am\"\ntype = \"alertmanager\"\nurl = \"http://127.0.0.1:{am_port}\"\n\n\
         [[route]]\nchannels = [\"am\"]\ngroup_wait = \"0s\"\ngroup_interval = \"1s\"\n"
    );
    let daemons: Vec<(Proc, u16)> = ["node-a", "node-b", "node-c"]
        .iter()
        .map(|h| daemon(tmp.path(), "ecc-errors", h, "10", &push))
        .collect();
    let all = vec!["node-a".to_string(), "node-b".into(), "node-c".into()];
    let want = (
        "firing".to_string(),
        "ecc_uncorrected".to_string(),
        all.clone(),
    );
    wait_until(
        Duration::from_secs(60),
        "ecc_uncorrected of three nodes, grouped",
        || notifications(&hook).contains(&want).then_some(()),
    );
    wait_until(Duration::from_secs(60), "xid_error resolved", || {
        notifications(&hook)
            .iter()
            .any(|n| n.0 == "resolved" && n.1 == "xid_error")
            .then_some(())
    });
    // Each daemon's /metrics counts its pushes to Alertmanager.
    let (_, port) = &daemons[1];
    let page = wait_until(Duration::from_secs(20), "sends counted in /metrics", || {
        super::exporter::get(*port, "/metrics", "text/plain")
            .map(|r| r.2)
            .filter(|p| {
                p.lines().any(|l| {
                    l.starts_with("gpuwatch_notifications_total{channel=\"am\",result=\"sent\"")
                        && !l.ends_with(" 0")
                })
            })
    });
    assert!(page.contains("gpuwatch_notifications_queued{"), "{page}");
    let sent = notifications(&hook);
    // One message for the alert however many nodes have it.
    let firing: Vec<_> = sent
        .iter()
        .filter(|n| n.0 == "firing" && n.1 == "ecc_uncorrected")
        .collect();
    assert_eq!(firing, vec![&want], "{sent:?}");
    // The silenced node's xid_error never reached the receiver; the others' did, and resolved.
    for n in sent.iter().filter(|n| n.1 == "xid_error") {
        assert!(
            !n.2.contains(&"node-a".to_string()),
            "silenced node-a: {sent:?}"
        );
    }
    assert!(
        sent.iter()
            .any(|n| n.0 == "firing" && n.1 == "xid_error" && n.2.contains(&"node-b".to_string())),
        "{sent:?}"
    );
    drop(daemons);
}
