#!/usr/bin/env python3
"""A stand-in for the Kubernetes API server holding ONE Node object, for gpuwatch's `taint` tests.

Serves HTTPS on 127.0.0.1, the way kube-apiserver answers a node's own client:

    python3 tests/support/kube_api_server.py --port 0 --cert server.crt --key server.key \
        --token token.txt --node node.json --log requests.jsonl [--k8s-version 1.33]

Needs Python 3.11 (stdlib) and the pip package `kubernetes-validate` (its strict OpenAPI schemas).

--port 0 picks a free port. --cert/--key are PEM files (a self-signed certificate will do; give it
subjectAltName IP:127.0.0.1, and, for rustls, `basicConstraints=critical,CA:FALSE`: webpki refuses
a CA certificate as the server's own). --token holds the expected bearer token; it is read again
on every request (surrounding white space stripped), so a test can rotate it. --node is the JSON of
the initial Node; the current object is kept in memory and, after every change, written back to
the same file (a temporary file renamed over it, so a reader never sees half of it). --log gets
one JSON line per request, written before the response is sent:

    {"time": "...Z", "method": "PATCH", "path": "/api/v1/nodes/gpu-node-1",
     "query": {"fieldManager": "gpuwatch"}, "content_type": "application/json-patch+json",
     "user_agent": "...", "body": <parsed JSON or null>, "status": 200, "why": null, "changed": true, "resourceVersion": "48214"}

`why` says why a request was refused (null on success); `changed` is false for a GET, a refusal, a
dry run and a patch that leaves the object as it was; `body_text` (at most 4096 characters) is
added when a body is not JSON; `resourceVersion` is the object's after the request.

Prints exactly one line, `ready PORT`, on stdout (flushed) once it accepts connections; anything
else goes to stderr (start-up errors, TLS handshake failures, internal errors: a few lines).
SIGTERM or SIGINT stops it (exit status 0). A bad argument, an unreadable file or an initial node
that does not validate exits with status 1 before `ready`.

The API (NODE is the node's metadata.name; every response body is JSON, `application/json`):

  every request needs `Authorization: Bearer TOKEN`  else 401 Status, reason Unauthorized
  GET   /api/v1/nodes/NODE (and .../NODE/status)     200, the Node
  PATCH /api/v1/nodes/NODE         application/json-patch+json            200, the new Node
  PATCH /api/v1/nodes/NODE/status  application/strategic-merge-patch+json 200, the new Node
  another path                                      404 Status NotFound
  another method on those paths                     405 Status MethodNotAllowed
  PATCH with another (or no) Content-Type           415 Status UnsupportedMediaType
  a body that is not JSON, or a JSON patch that is not an array   400 Status BadRequest
  a patch this stand-in refuses, that fails, or whose result does not validate   422 Status Invalid

The JSON patch (RFC 6902) may use `test`, `add`, `remove` and `replace` (JSON pointers with ~0 ~1,
array indices, `-` to append with add), and may only touch /spec/taints and below, plus `test` of
/metadata/resourceVersion. The ops apply in order to a copy; one that fails (a `test` that does not
match: a stale resourceVersion) refuses the whole patch. The strategic merge patch must be exactly
{"status": {"conditions": [...]}}: each condition is merged by `type` into the one there (its
fields replace those given, a null deletes one) or appended (kube-apiserver's patchMergeKey for
NodeStatus.conditions); `$patch` and `$setElementOrder` directives are refused.

The result is validated whole: kubernetes_validate.validate(node, K8S_VERSION, strict=True), and by
hand what the schema does not say: a condition has a `type`, a `status` of True, False or Unknown,
and RFC 3339 times (lastTransitionTime, lastHeartbeatTime) where present, and no type twice; a taint
has a qualified-name `key`, a label-value `value`, an `effect` of NoSchedule, PreferNoSchedule or
NoExecute, an RFC 3339 `timeAdded` where present, and no key and effect twice. Refused, the object is
unchanged. Accepted, metadata.resourceVersion goes up by one and the file is rewritten, unless
the patch changed nothing: kube-apiserver then writes nothing and keeps the resourceVersion, and
so does this. `?dryRun=All` validates and answers without storing.

The 422 for a failed JSON patch op starts like kube-apiserver's ("the server rejected our request
due to an error in our request", reason Invalid), which says no more; here the reason follows
after a colon and is also details.causes[0].message. A result that does not validate is answered
as kube-apiserver does: `Node "NODE" is invalid: FIELD: ...`, with details.causes[] {field,
reason, message}.
"""

import argparse
import copy
import datetime
import hmac
import json
import os
import re
import signal
import socket
import ssl
import sys
import tempfile
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

MAX_BODY = 3 * 1024 * 1024  # kube-apiserver's limit on a request body
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
ONLY_TAINTS = "this stand-in allows only /spec/taints"
REJECTED = "the server rejected our request due to an error in our request"
CONDITION_STATUSES = ("True", "False", "Unknown")
TAINT_EFFECTS = ("NoExecute", "NoSchedule", "PreferNoSchedule")  # as kube-apiserver lists them
RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d{1,9})?(Z|[+-](\d{2}):(\d{2}))\Z")
# k8s.io/apimachinery/pkg/util/validation: IsQualifiedName and IsValidLabelValue.
QNAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")


def log(*args):
    print("kube_api_server:", *args, file=sys.stderr, flush=True)


def now_rfc3339():
    return (
        datetime.datetime.now(datetime.timezone.utc)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


class Refusal(Exception):
    """A request answered with a Kubernetes Status: code, reason, message, optional causes."""

    def __init__(self, code, reason, message, why=None, causes=None, details=None, headers=None):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.why = why or message
        self.causes = causes
        self.details = details or {}
        self.headers = headers or {}

    def status(self):
        details = dict(self.details)
        if self.causes:
            details["causes"] = self.causes
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if details:
            body["details"] = details
        return body


def invalid_patch(why):
    """A patch this stand-in refuses or cannot apply: 422 as kube-apiserver's, plus the reason."""
    return Refusal(422, "Invalid", f"{REJECTED}: {why}", why=why, causes=[{"message": why}])


def bad_request(why):
    return Refusal(400, "BadRequest", why)


# ---------------------------------------------------------------------------------------------
# JSON values, pointers and patches


def json_equal(a, b):
    """RFC 6902 `test` equality: same JSON type and value (Python's == has True == 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def parse_pointer(pointer):
    """RFC 6901: the reference tokens of a JSON pointer."""
    if not isinstance(pointer, str):
        raise invalid_patch(f"path {json.dumps(pointer)} is not a string")
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise invalid_patch(f"JSON pointer {json.dumps(pointer)} does not start with /")
    tokens = pointer[1:].split("/")
    for t in tokens:
        if re.search(r"~(?![01])", t):
            raise invalid_patch(f"JSON pointer {json.dumps(pointer)}: ~ not followed by 0 or 1")
    return [t.replace("~1", "/").replace("~0", "~") for t in tokens]


def array_index(token, length, pointer, allow_end):
    """An array index token: 0 or no leading zero, within the array (or one past, for add)."""
    if token == "-" and allow_end:
        return length
    if not re.fullmatch(r"0|[1-9][0-9]*", token):
        raise invalid_patch(f"{pointer}: {json.dumps(token)} is not an array index")
    i = int(token)
    if i > length or (i == length and not allow_end):
        raise invalid_patch(f"{pointer}: index {i} is out of range (the array has {length} items)")
    return i


def resolve_parent(doc, tokens, pointer):
    """The container that holds the last token of `tokens`."""
    cur = doc
    for n, t in enumerate(tokens[:-1]):
        at = "/" + "/".join(tokens[: n + 1])
        if isinstance(cur, dict):
            if t not in cur:
                raise invalid_patch(f"{pointer}: {at} does not exist")
            cur = cur[t]
        elif isinstance(cur, list):
            cur = cur[array_index(t, len(cur), pointer, allow_end=False)]
        else:
            raise invalid_patch(f"{pointer}: {at} is inside a {type(cur).__name__}, not an object or array")
    if not isinstance(cur, (dict, list)):
        raise invalid_patch(f"{pointer}: the parent is not an object or array")
    return cur


def get_value(doc, tokens, pointer):
    if not tokens:
        return doc
    parent, last = resolve_parent(doc, tokens, pointer), tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise invalid_patch(f"{pointer} does not exist")
        return parent[last]
    return parent[array_index(last, len(parent), pointer, allow_end=False)]


def allowed_path(op, tokens):
    if tokens == ["metadata", "resourceVersion"]:
        return op == "test"
    return tokens[:2] == ["spec", "taints"]


def describe_op(n, op):
    return f"op {n}: {op.get('op')} {op.get('path')}" if isinstance(op, dict) else f"op {n}"


def apply_json_patch(doc, ops):
    """RFC 6902 (test, add, remove, replace) on a copy of doc; returns the copy."""
    for n, op in enumerate(ops):
        if not isinstance(op, dict):
            raise invalid_patch(f"op {n} is not an object")
        kind = op.get("op")
        if kind not in ("test", "add", "remove", "replace"):
            if kind in ("move", "copy"):
                raise invalid_patch(
                    f"{describe_op(n, op)}: this stand-in implements only test, add, remove and replace"
                )
            raise invalid_patch(f"op {n}: unknown op {json.dumps(kind)}")
        if "path" not in op:
            raise invalid_patch(f"op {n} ({kind}) has no path")
        tokens = parse_pointer(op["path"])
        if not allowed_path(kind, tokens):
            raise invalid_patch(f"{ONLY_TAINTS} ({describe_op(n, op)})")
        if kind != "remove" and "value" not in op:
            raise invalid_patch(f"{describe_op(n, op)} has no value")
    doc = copy.deepcopy(doc)
    for n, op in enumerate(ops):
        kind, pointer = op["op"], op["path"]
        tokens = parse_pointer(pointer)
        where = describe_op(n, op)
        try:
            if kind == "test":
                have = get_value(doc, tokens, pointer)
                if not json_equal(have, op["value"]):
                    raise invalid_patch(
                        f"{where}: test failed: the value is {json.dumps(have)}, not {json.dumps(op['value'])}"
                    )
                continue
            parent, last = resolve_parent(doc, tokens, pointer), tokens[-1]
            value = copy.deepcopy(op.get("value"))
            if isinstance(parent, dict):
                if kind != "add" and last not in parent:
                    raise invalid_patch(f"{pointer} does not exist")
                if kind == "remove":
                    del parent[last]
                else:
                    parent[last] = value
            else:
                i = array_index(last, len(parent), pointer, allow_end=(kind == "add"))
                if kind == "add":
                    parent.insert(i, value)
                elif kind == "remove":
                    del parent[i]
                else:
                    parent[i] = value
        except Refusal as r:
            if r.why.startswith("op "):
                raise
            why = r.why[len(pointer) :].lstrip(": ") if r.why.startswith(pointer) else r.why
            raise invalid_patch(f"{where}: {why}") from None
    return doc


def apply_condition_patch(doc, body):
    """Strategic merge of {"status": {"conditions": [...]}} (merge key `type`) into a copy of doc."""
    shape = 'this stand-in accepts only {"status": {"conditions": [...]}} on nodes/NODE/status'
    if not (isinstance(body, dict) and list(body) == ["status"]):
        raise invalid_patch(
            f"{shape}; the patch has {json.dumps(sorted(body)) if isinstance(body, dict) else 'no object'}"
        )
    status = body["status"]
    if not (
        isinstance(status, dict)
        and list(status) == ["conditions"]
        and isinstance(status["conditions"], list)
    ):
        got = json.dumps(sorted(status)) if isinstance(status, dict) else json.dumps(status)
        raise invalid_patch(f"{shape}; status has {got}")
    seen = set()
    for n, c in enumerate(status["conditions"]):
        if not isinstance(c, dict):
            raise invalid_patch(f"status.conditions[{n}] is not an object")
        directives = [k for k in c if k.startswith("$")]
        if directives:
            raise invalid_patch(
                f"status.conditions[{n}]: this stand-in takes no patch directives ({', '.join(directives)})"
            )
        t = c.get("type")
        if not isinstance(t, str) or not t:
            raise invalid_patch(f"status.conditions[{n}] does not contain declared merge key: type")
        if t in seen:
            raise invalid_patch(f"status.conditions[{n}]: type {json.dumps(t)} is in the patch twice")
        seen.add(t)
    doc = copy.deepcopy(doc)
    node_status = doc.setdefault("status", {})
    if node_status is None:
        node_status = doc["status"] = {}
    conditions = node_status.get("conditions")
    if conditions is None:
        conditions = node_status["conditions"] = []
    for c in status["conditions"]:
        mine = next((x for x in conditions if isinstance(x, dict) and x.get("type") == c["type"]), None)
        if mine is None:
            conditions.append({k: copy.deepcopy(v) for k, v in c.items() if v is not None})
            continue
        for k, v in c.items():
            if v is None:
                mine.pop(k, None)
            else:
                mine[k] = copy.deepcopy(v)
    return doc


# ---------------------------------------------------------------------------------------------
# Validation


def check_time(value, field, causes):
    m = RFC3339.match(value) if isinstance(value, str) else None
    ok = m is not None
    if ok:
        y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
        try:
            datetime.datetime(y, mo, d, h, mi, s)
        except ValueError:
            ok = False
        if m.group(9) is not None and (int(m.group(9)) > 23 or int(m.group(10)) > 59):
            ok = False
    if not ok:
        causes.append(
            cause(
                field,
                "FieldValueInvalid",
                f"Invalid value: {json.dumps(value)}: not an RFC 3339 time (like 2006-01-02T15:04:05Z)",
            )
        )


def cause(field, reason, message):
    return {"reason": reason, "message": f"{field}: {message}", "field": field}


def qualified_name_errors(value):
    """IsQualifiedName: [prefix/]name, a DNS subdomain prefix (253) and a 63-character name."""
    errs = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        elif len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix):
            errs.append("prefix part must be a lowercase RFC 1123 subdomain")
    else:
        return [
            "a qualified name must consist of alphanumeric characters, '-', '_' or '.', with an optional DNS subdomain prefix and '/'"
        ]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 characters")
    elif not QNAME_PART.match(name):
        errs.append(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )
    return errs


def check_node(node, version, kv):
    """kube-apiserver-like causes (empty when the node is valid)."""
    causes = []
    try:
        kv.validate(node, version, strict=True)
    except kv.ValidationError as e:
        field = path_text(e.absolute_path) or "(the object)"
        causes.append(
            cause(
                field,
                "FieldValueInvalid",
                f"Invalid value: schema of Kubernetes {e.version} (strict): {e.message}",
            )
        )
    if not isinstance(node, dict):
        return causes
    status = node.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    if isinstance(conditions, list):
        types = set()
        for i, c in enumerate(conditions):
            at = f"status.conditions[{i}]"
            if not isinstance(c, dict):
                continue  # the schema said so
            t = c.get("type")
            if not isinstance(t, str) or not t:
                causes.append(cause(f"{at}.type", "FieldValueRequired", "Required value"))
            elif t in types:
                causes.append(
                    cause(f"{at}.type", "FieldValueDuplicate", f"Duplicate value: {json.dumps(t)}")
                )
            else:
                types.add(t)
            s = c.get("status")
            if s not in CONDITION_STATUSES:
                causes.append(
                    cause(
                        f"{at}.status",
                        "FieldValueNotSupported",
                        f"Unsupported value: {json.dumps(s)}: supported values: "
                        + ", ".join(f'"{x}"' for x in CONDITION_STATUSES),
                    )
                )
            for k in ("lastHeartbeatTime", "lastTransitionTime"):
                if k in c:
                    check_time(c[k], f"{at}.{k}", causes)
    spec = node.get("spec")
    taints = spec.get("taints") if isinstance(spec, dict) else None
    if isinstance(taints, list):
        pairs = set()
        for i, t in enumerate(taints):
            at = f"spec.taints[{i}]"
            if not isinstance(t, dict):
                continue
            key, effect = t.get("key"), t.get("effect")
            if not isinstance(key, str) or not key:
                causes.append(cause(f"{at}.key", "FieldValueRequired", "Required value"))
            else:
                for err in qualified_name_errors(key):
                    causes.append(
                        cause(f"{at}.key", "FieldValueInvalid", f"Invalid value: {json.dumps(key)}: {err}")
                    )
            value = t.get("value")
            if isinstance(value, str) and (len(value) > 63 or not LABEL_VALUE.match(value)):
                causes.append(
                    cause(
                        f"{at}.value",
                        "FieldValueInvalid",
                        f"Invalid value: {json.dumps(value)}: a valid label value must be 63 characters or less, "
                        "empty or beginning and ending with an alphanumeric character, with '-', '_' or '.' between",
                    )
                )
            if effect in (None, ""):
                causes.append(cause(f"{at}.effect", "FieldValueRequired", "Required value"))
            elif effect not in TAINT_EFFECTS:
                causes.append(
                    cause(
                        f"{at}.effect",
                        "FieldValueNotSupported",
                        f"Unsupported value: {json.dumps(effect)}: supported values: "
                        + ", ".join(f'"{x}"' for x in TAINT_EFFECTS),
                    )
                )
            if "timeAdded" in t:
                check_time(t["timeAdded"], f"{at}.timeAdded", causes)
            pair = (json.dumps(key), json.dumps(effect))
            if pair in pairs:
                causes.append(
                    cause(
                        at,
                        "FieldValueDuplicate",
                        f"Duplicate value: {json.dumps({'key': key, 'effect': effect})}: taints must be unique by key and effect pair",
                    )
                )
            pairs.add(pair)
    return causes


def path_text(path):
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


# ---------------------------------------------------------------------------------------------
# State


class Store:
    """The one Node: in memory, written back to its file after every change."""

    def __init__(self, path, version, kv):
        self.path, self.version, self.kv = os.path.abspath(path), version, kv
        with open(self.path, encoding="utf-8") as f:
            node = json.load(f)
        if not isinstance(node, dict) or node.get("kind") != "Node" or node.get("apiVersion") != "v1":
            raise ValueError(f"{path}: not a v1 Node")
        name = (node.get("metadata") or {}).get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{path}: no metadata.name")
        rv = node["metadata"].get("resourceVersion")
        if not (isinstance(rv, str) and rv.isdigit()):
            raise ValueError(
                f"{path}: metadata.resourceVersion must be a string of digits, not {json.dumps(rv)}"
            )
        causes = check_node(node, version, kv)
        if causes:
            raise ValueError(
                f"{path}: the node does not validate: " + "; ".join(c["message"] for c in causes)
            )
        self.node, self.name, self.rv = node, name, int(rv)

    def resource_version(self):
        return self.node["metadata"]["resourceVersion"]

    def commit(self, new):
        """Validates `new` (the node after a patch); stores it unless it changed nothing.

        Returns (node, changed). Called with State.lock held."""
        causes = check_node(new, self.version, self.kv)
        if causes:
            messages = [c["message"] for c in causes]
            text = messages[0] if len(messages) == 1 else "[" + ", ".join(messages) + "]"
            raise Refusal(
                422,
                "Invalid",
                f'Node "{self.name}" is invalid: {text}',
                why=f"invalid: {'; '.join(messages)}",
                causes=causes,
                details={"name": self.name, "kind": "Node"},
            )
        if json_equal(new, self.node):
            return self.node, False
        self.rv += 1
        new["metadata"]["resourceVersion"] = str(self.rv)
        self.write(new)
        self.node = new
        return new, True

    def write(self, node):
        d = os.path.dirname(self.path)
        fd, tmp = tempfile.mkstemp(prefix=".node-", suffix=".json", dir=d)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(node, f, indent=2)
                f.write("\n")
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


# ---------------------------------------------------------------------------------------------
# HTTP


def strict_json(data):
    def no_constant(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(data.decode("utf-8"), parse_constant=no_constant)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def version_string(self):
        return "kube-apiserver-stand-in"

    timeout = 60  # an idle keep-alive connection

    def log_message(self, format, *args):  # the JSON log says it all
        pass

    def do_GET(self):
        self.serve()

    do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_GET

    def read_body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            data = b""
            while True:
                size = int(self.rfile.readline(1024).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return data
                if len(data) + size > MAX_BODY:
                    self.close_connection = True
                    raise Refusal(413, "RequestEntityTooLarge", "Request entity too large: limit is 3145728")
                data += self.rfile.read(size)
                self.rfile.readline(3)
        length = self.headers.get("Content-Length")
        if not length:
            return b""
        try:
            n = int(length)
        except ValueError:
            self.close_connection = True
            raise bad_request(f"bad Content-Length {length!r}")
        if n > MAX_BODY:
            self.close_connection = True
            raise Refusal(413, "RequestEntityTooLarge", "Request entity too large: limit is 3145728")
        return self.rfile.read(n)

    def serve(self):
        st = self.server.state
        url = urlsplit(self.path)
        query = {}
        for k, v in parse_qsl(url.query, keep_blank_values=True):
            query[k] = (
                v if k not in query else (query[k] if isinstance(query[k], list) else [query[k]]) + [v]
            )
        entry = {
            "time": now_rfc3339(),
            "method": self.command,
            "path": url.path,
            "query": query,
            "content_type": self.headers.get("Content-Type"),
            "user_agent": self.headers.get("User-Agent"),
            "body": None,
        }
        code, obj, why, changed, headers = 200, None, None, False, {}
        raw, refusal = b"", None
        try:
            raw = self.read_body()
        except Refusal as r:
            refusal = r
        if raw:
            try:
                entry["body"] = strict_json(raw)
            except ValueError:
                entry["body_text"] = raw[:4096].decode("utf-8", "replace")
        # One request at a time: the change, the file and the log line, in the order they happen.
        with st.lock:
            try:
                if refusal:
                    raise refusal
                obj, changed = self.route(st, url.path, query, raw, entry)
            except Refusal as r:
                code, obj, why, headers = r.code, r.status(), r.why, r.headers
            except Exception as e:  # a bug here: say so rather than drop the connection
                log("internal error:", "".join(traceback.format_exception(e)))
                r = Refusal(500, "InternalError", f"Internal error occurred: {e!r}")
                code, obj, why = 500, r.status(), r.why
            entry.update(status=code, why=why, changed=changed, resourceVersion=st.store.resource_version())
            st.write_log(entry)
        self.respond(code, obj, headers)

    def route(self, st, path, query, raw, entry):
        self.authenticate(st)
        base = f"/api/v1/nodes/{st.store.name}"
        if path not in (base, base + "/status"):
            m = re.fullmatch(r"/api/v1/nodes/([^/]+)(/status)?", path)
            if m:
                raise Refusal(
                    404,
                    "NotFound",
                    f'nodes "{m.group(1)}" not found',
                    why=f"no node {m.group(1)}",
                    details={"name": m.group(1), "kind": "nodes"},
                )
            raise Refusal(
                404, "NotFound", "the server could not find the requested resource", why=f"no route {path}"
            )
        if self.command == "GET":
            return st.store.node, False
        if self.command != "PATCH":
            raise Refusal(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
                why=f"{self.command} not allowed on {path}",
                headers={"Allow": "GET, PATCH"},
            )
        want = STRATEGIC if path.endswith("/status") else JSON_PATCH
        got = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if got != want:
            raise Refusal(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types include: {want}",
                why=f"Content-Type {got or '(none)'}: {path} takes only {want} in this stand-in",
            )
        dry = query.get("dryRun")
        if dry not in (None, "All"):
            raise bad_request(f"dryRun must be All, not {json.dumps(dry)}")
        if not raw:
            raise bad_request("the patch is empty")
        if entry["body"] is None:
            raise bad_request("error decoding patch: the body is not JSON")
        body = entry["body"]
        if want == JSON_PATCH:
            if not isinstance(body, list):
                raise bad_request(
                    "json: cannot unmarshal into Go value of type jsonpatch.Patch: a JSON patch is an array of operations"
                )
            new = apply_json_patch(st.store.node, body)
        else:
            new = apply_condition_patch(st.store.node, body)
        if dry == "All":
            causes = check_node(new, st.store.version, st.store.kv)
            if causes:
                st.store.commit(new)  # raises the 422
            return new, False
        return st.store.commit(new)

    def authenticate(self, st):
        try:
            with open(st.token_path, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as e:
            raise Refusal(401, "Unauthorized", "Unauthorized", why=f"token file unreadable: {e}")
        if not token:
            raise Refusal(401, "Unauthorized", "Unauthorized", why="the token file is empty")
        header = self.headers.get("Authorization")
        if header is None:
            raise Refusal(401, "Unauthorized", "Unauthorized", why="no Authorization header")
        parts = header.split(" ")
        if len(parts) < 2 or parts[0].lower() != "bearer" or not parts[1]:
            raise Refusal(401, "Unauthorized", "Unauthorized", why="Authorization is not `Bearer TOKEN`")
        if len(parts) > 2 or not hmac.compare_digest(parts[1].encode(), token.encode()):
            raise Refusal(401, "Unauthorized", "Unauthorized", why="wrong bearer token")

    def respond(self, code, obj, headers):
        data = json.dumps(obj, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


class State:
    def __init__(self, store, token_path, log_path):
        self.store, self.token_path, self.log_path = store, token_path, log_path
        self.lock = threading.Lock()  # one request at a time touches the node and the log

    def write_log(self, entry):
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry, separators=(",", ":")) + "\n")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr, state, context):
        self.state, self.context = state, context
        super().__init__(addr, Handler)

    def finish_request(self, request, client_address):
        # The TLS handshake happens here, on the connection's own thread, so a client that
        # connects and stalls (or refuses the certificate) holds up no one else.
        request.settimeout(30)
        # The headers and the body go out as two TLS records; without this, Nagle's algorithm
        # and the client's delayed ACK hold the second back for 40 ms.
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as e:
            log(f"TLS handshake with {client_address[0]}:{client_address[1]} failed: {e}")
            return
        try:
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            try:
                tls.close()
            except OSError:
                pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True, help="TCP port on 127.0.0.1 (0: a free one)")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ap.add_argument("--cert", required=True, help="PEM certificate (chain) of the server")
    ap.add_argument("--key", required=True, help="PEM private key of the server")
    ap.add_argument(
        "--token", required=True, help="file holding the expected bearer token (re-read per request)"
    )
    ap.add_argument("--node", required=True, help="JSON Node; rewritten after every change")
    ap.add_argument("--log", required=True, help="JSON lines, one per request (appended)")
    ap.add_argument("--k8s-version", default="1.33", help="Kubernetes version of the schema (default 1.33)")
    args = ap.parse_args()

    try:
        import kubernetes_validate as kv
    except ImportError as e:
        log(f"needs the pip package kubernetes-validate: {e}")
        return 1
    try:
        with open(args.token, encoding="utf-8") as f:
            f.read()
        store = Store(args.node, args.k8s_version, kv)
    except kv.utils.VersionNotSupportedError as e:
        log(e.message)
        return 1
    except (OSError, ValueError) as e:
        log(e)
        return 1
    except Exception as e:  # an older version than kubernetes_validate has: an IndexError
        have = kv.utils.all_versions()
        log(
            f"cannot validate against Kubernetes {args.k8s_version} (kubernetes-validate {kv.__version__} "
            f"has {have[0]} to {have[-1]}): {e!r}"
        )
        return 1
    try:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(args.cert, args.key)
        except (OSError, ssl.SSLError) as e:
            raise OSError(f"--cert {args.cert} --key {args.key}: {e}") from None
        context.set_alpn_protocols(["http/1.1"])
        with open(args.log, "a", encoding="utf-8"):
            pass
        server = Server((args.host, args.port), State(store, args.token, args.log), context)
    except (OSError, ssl.SSLError) as e:
        log(e)
        return 1

    def stop(*_):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    port = server.server_address[1]
    log(
        f"node {store.name} (resourceVersion {store.resource_version()}), Kubernetes {args.k8s_version} schema, "
        f"https://{args.host}:{port}"
    )
    sys.stdout.write(f"ready {port}\n")
    sys.stdout.flush()
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        with server.state.lock:  # a change being written completes first
            server.server_close()
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
