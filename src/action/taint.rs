//! `[actions.taint]`: on Kubernetes, a node whose GPU broke takes no new pods. A rule declares
//! it (`action: "taint"`), like `drain`, and only its critical firing alerts count. Through the
//! API server, with the pod's service account, gpuwatch
//!
//! 1. reads the Node (`GET /api/v1/nodes/NODE`): a `nvidia.com/gpu-unhealthy` taint someone
//!    else set (another value than `gpuwatch`) is left alone, and the node with it;
//! 2. adds the taint `nvidia.com/gpu-unhealthy=gpuwatch:NoSchedule` with a JSON patch of
//!    `/spec/taints` guarded by a `test` of the `resourceVersion` it read, so a change made
//!    meanwhile (another controller's taint) is never written over: the patch fails and is
//!    tried again;
//! 3. sets the node condition `GPUHealthy=False` (reason `GPUFault`, the alert as message) with a
//!    strategic merge patch of `/status` (conditions merge by `type`). A condition a failed call
//!    left unset is set at the next try.
//!
//! Once every condition has cleared for `resume_after` (and no GPU is lost, awaiting a reset or
//! a remap), it removes that taint, only its own (key and value), the same guarded way, and
//! sets `GPUHealthy=True` (reason `GPUsHealthy`). The state machine, the audit
//! (`taint-audit.jsonl`), the notices (`node_taint`) and the retries are the drain's
//! ([`super::drain::NodeManager`]).
//!
//! RBAC: `get` and `patch` on `nodes`, `patch` on `nodes/status` (contrib/helm/gpuwatch). A
//! ClusterRole cannot name "the node this pod runs on"; an admission policy can (docs).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use super::drain::{Drained, NodeHand, NodeManager, Resumed, Words};
use crate::values::DurationSetting;

/// The taint's key (the NoSchedule taint NVIDIA's tools use for an unhealthy GPU node).
pub const TAINT_KEY: &str = "nvidia.com/gpu-unhealthy";
/// The taint's value: marks the taint as gpuwatch's own.
pub const TAINT_VALUE: &str = "gpuwatch";
/// The node condition's type.
pub const CONDITION_TYPE: &str = "GPUHealthy";
/// The service account's files in a pod.
const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// `[actions.taint]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TaintSection {
    /// Taint at all (default false).
    pub enabled: bool,
    /// Say what would be done, and do nothing (default true).
    pub dry_run: bool,
    /// This node's name in Kubernetes; "" = `$NODE_NAME` (the DaemonSet sets it from
    /// `spec.nodeName`), else the host name.
    pub node: String,
    /// The API server; "" = `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`.
    pub api_server: String,
    /// The bearer token (read at every call: projected tokens rotate).
    pub token_file: PathBuf,
    /// The CA bundle the API server's certificate is checked against (only these roots).
    pub ca_file: PathBuf,
    /// Remove the taint when the conditions have cleared (only gpuwatch's own).
    pub resume: bool,
    /// How long every condition must have been clear before the taint goes.
    pub resume_after: DurationSetting,
    /// The longest one call to the API server may take.
    pub timeout: DurationSetting,
}

impl Default for TaintSection {
    fn default() -> Self {
        TaintSection {
            enabled: false,
            dry_run: true,
            node: String::new(),
            api_server: String::new(),
            token_file: PathBuf::from(format!("{SERVICE_ACCOUNT}/token")),
            ca_file: PathBuf::from(format!("{SERVICE_ACCOUNT}/ca.crt")),
            resume: true,
            resume_after: DurationSetting::from_ms(600_000),
            timeout: DurationSetting::from_ms(10_000),
        }
    }
}

impl TaintSection {
    /// Every problem, at its `actions.taint.*` key.
    pub fn validate(&self) -> Vec<crate::values::Problem> {
        use crate::values::Problem;
        let mut out = Vec::new();
        if !(1..=300_000).contains(&self.timeout.ms) {
            out.push(Problem::at(
                "actions.taint.timeout",
                "timeout must be between 1ms and 5m",
            ));
        }
        if self.resume_after.ms < 0 {
            out.push(Problem::at(
                "actions.taint.resume_after",
                "resume_after must not be negative",
            ));
        }
        if !self.node.is_empty() && !node_name_ok(&self.node) {
            out.push(Problem::at(
                "actions.taint.node",
                "a Kubernetes node name: lower-case letters, digits, '-' and '.', at most 253",
            ));
        }
        if !self.api_server.is_empty() && !self.api_server.starts_with("https://") {
            out.push(Problem::at(
                "actions.taint.api_server",
                "the API server is reached over https:// only (the token must not travel in the clear)",
            ));
        }
        out
    }

    /// The node's name: `node`, else `$NODE_NAME`, else `hostname`.
    pub fn node_name(&self, hostname: &str) -> String {
        if !self.node.is_empty() {
            return self.node.clone();
        }
        std::env::var("NODE_NAME")
            .ok()
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| hostname.to_ascii_lowercase())
    }

    /// The API server's base URL.
    fn server(&self) -> Result<String, String> {
        if !self.api_server.is_empty() {
            return Ok(self.api_server.trim_end_matches('/').to_string());
        }
        let host = std::env::var("KUBERNETES_SERVICE_HOST")
            .map_err(|_| "no api_server and no $KUBERNETES_SERVICE_HOST (not in a pod?)")?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
        Ok(if host.contains(':') {
            format!("https://[{host}]:{port}")
        } else {
            format!("https://{host}:{port}")
        })
    }
}

/// Kubernetes' words.
pub static KUBERNETES: Words = Words {
    scheduler: "Kubernetes",
    act: "taint",
    acting: "tainting",
    done: "tainted",
    undo: "untaint",
    undoing: "untainting",
    undone: "untainted",
    notice: "node_taint",
    audit: "taint-audit.jsonl",
};

/// Kubernetes' taint state machine.
pub type TaintManager = NodeManager<TaintSection>;

impl NodeHand for TaintSection {
    fn words() -> &'static Words {
        &KUBERNETES
    }
    fn enabled(&self) -> bool {
        self.enabled
    }
    fn dry_run(&self) -> bool {
        self.dry_run
    }
    fn resume(&self) -> bool {
        self.resume
    }
    fn resume_after_ms(&self) -> i64 {
        self.resume_after.ms
    }
    fn node(&self, hostname: &str) -> String {
        self.node_name(hostname)
    }
    fn take_out(&self, node: &str, reason: &str) -> Drained {
        taint_node(self, node, reason)
    }
    fn put_back(&self, node: &str) -> Resumed {
        untaint_node(self, node)
    }
}

/// A DNS subdomain name, as Kubernetes names nodes.
fn node_name_ok(n: &str) -> bool {
    n.len() <= 253
        && n.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

/// The API server, for one operation.
struct Api {
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
    base: String,
    token: String,
    timeout: Duration,
}

impl Api {
    fn new(section: &TaintSection) -> Result<Api, String> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let base = section.server()?;
        let ca = std::fs::read(&section.ca_file)
            .map_err(|e| format!("ca_file {}: {e}", section.ca_file.display()))?;
        let roots = reqwest::Certificate::from_pem_bundle(&ca)
            .map_err(|e| format!("ca_file {}: {e}", section.ca_file.display()))?;
        if roots.is_empty() {
            return Err(format!(
                "ca_file {} holds no certificate",
                section.ca_file.display()
            ));
        }
        let token = std::fs::read_to_string(&section.token_file)
            .map_err(|e| format!("token_file {}: {e}", section.token_file.display()))?
            .trim()
            .to_string();
        if token.is_empty() {
            return Err(format!(
                "token_file {} is empty",
                section.token_file.display()
            ));
        }
        let timeout = Duration::from_millis(section.timeout.ms.max(1).unsigned_abs());
        let client = reqwest::Client::builder()
            .user_agent(concat!("gpuwatch/", env!("CARGO_PKG_VERSION")))
            .tls_certs_only(roots)
            .redirect(reqwest::redirect::Policy::none())
            // (the API server is reached directly: a pod's HTTPS_PROXY is for the outside)
            .no_proxy()
            .timeout(timeout)
            .build()
            .map_err(|e| format!("HTTP client: {}", chain(&e)))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("runtime: {e}"))?;
        Ok(Api {
            rt,
            client,
            base,
            token,
            timeout,
        })
    }

    /// One call: the answer's JSON, or why it failed (the API's own `Status` message).
    fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        patch: Option<(&str, Value)>,
    ) -> Result<Value, String> {
        let url = format!("{}{path}", self.base);
        let mut req = self
            .client
            .request(method.clone(), &url)
            .bearer_auth(&self.token)
            .header("Accept", "application/json");
        if let Some((content_type, body)) = patch {
            req = req
                .header("Content-Type", content_type)
                .body(body.to_string());
        }
        let what = format!("{method} {path}");
        self.rt.block_on(async {
            let sent = tokio::time::timeout(self.timeout, async {
                let resp = req
                    .send()
                    .await
                    .map_err(|e| format!("{what}: {}", chain(&e)))?;
                let status = resp.status();
                let bytes = read_bounded(resp)
                    .await
                    .map_err(|e| format!("{what}: {e}"))?;
                let body: Option<Value> = serde_json::from_slice(&bytes).ok();
                if status.is_success() {
                    return body.ok_or_else(|| format!("{what}: an answer that is not JSON"));
                }
                let body = body.unwrap_or(Value::Null);
                // kube-apiserver puts the reason of a failed patch in details.causes
                let mut message = body["message"].as_str().unwrap_or("").to_string();
                for cause in body["details"]["causes"].as_array().into_iter().flatten() {
                    if let Some(m) = cause["message"].as_str().filter(|m| !message.contains(m)) {
                        message.push_str("; ");
                        message.push_str(m);
                    }
                }
                let conflict =
                    status.as_u16() == 409 || (status.as_u16() == 422 && message.contains("test"));
                Err(format!(
                    "{}{what}: HTTP {status}: {message}",
                    if conflict { CONFLICT } else { "" }
                ))
            })
            .await;
            sent.unwrap_or_else(|_| Err(format!("{what}: no answer within the timeout")))
        })
    }

    fn node(&self, node: &str) -> Result<Value, String> {
        self.call(reqwest::Method::GET, &format!("/api/v1/nodes/{node}"), None)
    }

    /// Sets the condition (a strategic merge patch of the status: conditions merge by type).
    fn condition(&self, node: &str, healthy: bool, message: &str) -> Result<(), String> {
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let cond = json!({
            "type": CONDITION_TYPE,
            "status": if healthy { "True" } else { "False" },
            "reason": if healthy { "GPUsHealthy" } else { "GPUFault" },
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        });
        self.call(
            reqwest::Method::PATCH,
            &format!("/api/v1/nodes/{node}/status"),
            Some((
                "application/strategic-merge-patch+json",
                json!({"status": {"conditions": [cond]}}),
            )),
        )
        .map(|_| ())
    }

    /// Writes `taints` in place of the node's, only if it is still the version read.
    fn taints(&self, node: &str, version: &Value, taints: Vec<Value>) -> Result<(), String> {
        self.call(
            reqwest::Method::PATCH,
            &format!("/api/v1/nodes/{node}"),
            Some((
                "application/json-patch+json",
                json!([
                    {"op": "test", "path": "/metadata/resourceVersion", "value": version},
                    {"op": "add", "path": "/spec/taints", "value": taints},
                ]),
            )),
        )
        .map(|_| ())
    }
}

/// What starts the error of a write that lost a race (the Node changed since it was read).
const CONFLICT: &str = "the Node changed between read and write: ";

/// How often a write that lost a race is tried again at once (read, then write).
const CONFLICT_TRIES: usize = 3;

/// An error with its sources (reqwest's own text names only the URL), without the URL.
fn chain(e: &reqwest::Error) -> String {
    let mut out = e.to_string();
    if let Some(url) = e.url() {
        out = out
            .replace(&format!(" ({url})"), "")
            .replace(url.as_str(), "");
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// The answer's body, at most 16 MiB.
async fn read_bounded(mut resp: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| chain(&e))? {
        out.extend_from_slice(&chunk);
        if out.len() > 16 << 20 {
            return Err("an answer over 16 MiB".into());
        }
    }
    Ok(out)
}

/// The Node's `resourceVersion`, which a guarded write tests.
fn version_of(node: &Value) -> Result<Value, String> {
    node["metadata"]["resourceVersion"]
        .as_str()
        .filter(|v| !v.is_empty())
        .map(Value::from)
        .ok_or_else(|| "the Node has no resourceVersion".to_string())
}

/// The node's taints; gpuwatch's own (key and value); another taint of gpuwatch's key.
fn taints_of(node: &Value) -> (Vec<Value>, bool, Option<Value>) {
    let taints = node["spec"]["taints"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let own = |t: &Value| t["key"] == TAINT_KEY && t["value"] == TAINT_VALUE;
    let mine = taints.iter().any(own);
    let other = taints
        .iter()
        .find(|t| t["key"] == TAINT_KEY && !own(t))
        .cloned();
    (taints, mine, other)
}

/// `op`, tried again at once (up to [`CONFLICT_TRIES`]) while it loses a race.
fn with_retries<T>(mut op: impl FnMut() -> Result<T, String>) -> Result<T, String> {
    let mut tries = 0;
    loop {
        match op() {
            Err(e) if e.starts_with(CONFLICT) && tries + 1 < CONFLICT_TRIES => tries += 1,
            other => return other,
        }
    }
}

/// The node's `GPUHealthy` condition: its status and message.
fn condition_of(node: &Value) -> (Option<String>, String) {
    let c = node["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == CONDITION_TYPE));
    (
        c.and_then(|c| c["status"].as_str()).map(str::to_string),
        c.and_then(|c| c["message"].as_str())
            .unwrap_or("")
            .to_string(),
    )
}

/// Takes the node out: the taint, then the condition (see the module docs).
pub fn taint_node(section: &TaintSection, node: &str, reason: &str) -> Drained {
    let run = || -> Result<Drained, String> {
        if !node_name_ok(node) {
            return Err(format!("{node:?} is not a Kubernetes node name"));
        }
        let api = Api::new(section)?;
        with_retries(|| {
            let n = api.node(node)?;
            let (mut taints, mine, other) = taints_of(&n);
            if let Some(t) = other {
                return Ok(Drained::LeftAlone(format!(
                    "it carries a {TAINT_KEY} taint gpuwatch did not set (value {}, effect {})",
                    t["value"], t["effect"]
                )));
            }
            if mine {
                // (a condition a failed call left unset is set now)
                if condition_of(&n).0.as_deref() != Some("False") {
                    api.condition(node, false, reason)?;
                }
                return Ok(Drained::Already);
            }
            // the taint first, on the version read: any write to the node, its status included,
            // makes a new version
            let version = version_of(&n)?;
            let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            taints.push(json!({
                "key": TAINT_KEY,
                "value": TAINT_VALUE,
                "effect": "NoSchedule",
                "timeAdded": now,
            }));
            api.taints(node, &version, taints)?;
            // (the taint is in place: a condition that fails now is set at the next try)
            if let Err(e) = api.condition(node, false, reason) {
                tracing::warn!("{node}: the GPUHealthy condition: {e}");
            }
            Ok(Drained::Now)
        })
    };
    run().unwrap_or_else(Drained::Failed)
}

/// Puts the node back: removes gpuwatch's own taint (never another's) and sets the condition
/// healthy; a `GPUHealthy=False` of gpuwatch's left without its taint (a failed call, the taint
/// removed by hand) is set healthy too.
pub fn untaint_node(section: &TaintSection, node: &str) -> Resumed {
    let run = || -> Result<Resumed, String> {
        if !node_name_ok(node) {
            return Err(format!("{node:?} is not a Kubernetes node name"));
        }
        let api = Api::new(section)?;
        with_retries(|| {
            let n = api.node(node)?;
            let (taints, mine, _) = taints_of(&n);
            let (status, was) = condition_of(&n);
            let ours_unhealthy = status.as_deref() == Some("False")
                && condition_reason(&n).as_deref() == Some("GPUFault");
            if !mine {
                if ours_unhealthy {
                    api.condition(node, true, "no GPU fault holds now")?;
                    return Ok(Resumed::Now(was));
                }
                return Ok(Resumed::NotDrained);
            }
            let version = version_of(&n)?;
            let kept: Vec<Value> = taints
                .into_iter()
                .filter(|t| !(t["key"] == TAINT_KEY && t["value"] == TAINT_VALUE))
                .collect();
            api.taints(node, &version, kept)?;
            api.condition(
                node,
                true,
                "every condition that asked for the taint has cleared",
            )?;
            Ok(Resumed::Now(was))
        })
    };
    run().unwrap_or_else(Resumed::Failed)
}

/// The `GPUHealthy` condition's reason.
fn condition_reason(node: &Value) -> Option<String> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == CONDITION_TYPE)?["reason"]
        .as_str()
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_and_servers() {
        assert!(node_name_ok("gpu-node-1.cluster.local"));
        for bad in ["", "GPU", "a_b", "-a", "a-", "a..b", "a b"] {
            assert!(!node_name_ok(bad), "{bad:?}");
        }
        let s = TaintSection {
            api_server: "http://10.0.0.1".into(),
            node: "Bad_Name".into(),
            ..TaintSection::default()
        };
        let keys: Vec<String> = s.validate().into_iter().map(|p| p.key).collect();
        assert_eq!(keys, vec!["actions.taint.node", "actions.taint.api_server"]);
        let s = TaintSection {
            api_server: "https://10.0.0.1:6443/".into(),
            ..TaintSection::default()
        };
        assert_eq!(s.server().unwrap(), "https://10.0.0.1:6443");
    }

    #[test]
    fn own_taints_are_told_from_others_of_the_same_key() {
        let node = json!({"metadata": {"resourceVersion": "7"}, "spec": {"taints": [
            {"key": TAINT_KEY, "value": "admin", "effect": "NoExecute"},
            {"key": TAINT_KEY, "value": TAINT_VALUE, "effect": "NoSchedule"},
            {"key": "dedicated", "value": "ml", "effect": "NoSchedule"},
        ]}});
        let (taints, mine, other) = taints_of(&node);
        assert_eq!(taints.len(), 3);
        assert!(mine);
        assert_eq!(other.unwrap()["value"], "admin");
        assert_eq!(version_of(&node).unwrap(), json!("7"));
        // no version: no guarded write (a test of null could pass on an absent member)
        assert!(version_of(&json!({"metadata": {}})).is_err());
        let bare = json!({"metadata": {"resourceVersion": "1"}, "spec": {}});
        assert_eq!(taints_of(&bare), (Vec::new(), false, None));
        let mut tries = 0;
        let r: Result<(), String> = with_retries(|| {
            tries += 1;
            Err(format!("{CONFLICT}PATCH /api/v1/nodes/n: HTTP 422"))
        });
        assert!(r.is_err());
        assert_eq!(tries, CONFLICT_TRIES);
    }
}
