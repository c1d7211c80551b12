#!/usr/bin/env python3
"""A stand-in for the kubelet's PodResources gRPC endpoint, for gpuwatch's tests.

Serves `v1.PodResourcesLister` (List, Get, GetAllocatableResources) on a Unix socket, the way
the kubelet does on /var/lib/kubelet/pod-resources/kubelet.sock. The Python stubs are generated
at start-up from the vendored tests/fixtures/podresources/api.proto with grpc_tools.protoc into
a temporary directory, so no generated code is kept in the repository.

    python3 tests/support/podresources_server.py \
        --socket /tmp/podres.sock \
        --allocation tests/fixtures/podresources/allocation.json \
        [--allocatable tests/fixtures/podresources/allocatable.json] [--unknown-fields]

Needs the pip packages `grpcio` and `grpcio-tools` (which brings `protobuf`).

--allocation is a JSON list of pods in the proto's own field names (a PodResources message
each), or an object {"pod_resources": [...]} (a ListPodResourcesResponse, as
podresources_client.py prints it):

    [{"name": "...", "namespace": "...",
      "containers": [{"name": "...",
                      "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": ["GPU-..."],
                                   "topology": {"nodes": [{"ID": 0}]}}],
                      "cpu_ids": [2, 3], "memory": [{"memory_type": "memory", "size": 1073741824,
                                                      "topology": {"nodes": [{"ID": 0}]}}]}]}]

Unknown keys are an error (a typo would otherwise silently test nothing). The file is read again
on every request, so a test can rewrite it (write a temporary file and rename it over the old
one, so that no request sees half a file) to change what the "kubelet" reports. A file that cannot
be read or parsed answers the request with gRPC status INTERNAL, and the server keeps running;
at start-up it is an error instead (exit status 1, before `ready`).

--allocatable is a JSON AllocatableResourcesResponse ({"devices": [...], "cpu_ids": [...],
"memory": [...]}), also re-read on every request. Without it, GetAllocatableResources answers
what the allocation holds: each allocated device as its own entry, the union of the cpu_ids,
and no memory.

Get answers like the kubelet: the pod with that name and namespace, or, if there is none,
gRPC status UNKNOWN with "pod NAME in namespace NAMESPACE not found" (the kubelet returns a
plain Go error, which grpc-go sends as UNKNOWN).

--unknown-fields appends fields the v1 schema does not define to every message of the List and
Get responses (see unknown_fields_for()), so a client's skipping of unknown fields can be tested
over the wire.

Prints exactly one line, `ready`, on stdout (flushed) once the socket accepts connections;
everything else goes to stderr. SIGTERM or SIGINT stops it cleanly (exit status 0) and removes
the socket file. A Unix socket path is limited to 107 bytes.

On the wire (grpcio's C core; checked with a raw HTTP/2 client): a request without the header
`te: trailers` is answered with RST_STREAM and no headers; a success is HEADERS (`:status 200`,
`content-type: application/grpc`), one DATA message (1 byte compressed flag 0, 4 bytes
big-endian length, the protobuf bytes), then trailers `grpc-status: 0`; an error (Get of a
missing pod, unknown method) is "Trailers-Only": a single HEADERS frame with END_STREAM that
carries `:status 200`, `grpc-status` and `grpc-message`, and no DATA.
"""

import argparse
import json
import os
import signal
import stat
import sys
import tempfile
import threading
from concurrent import futures

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PROTO = os.path.normpath(os.path.join(HERE, "..", "fixtures", "podresources", "api.proto"))


def log(*args):
    print("podresources_server:", *args, file=sys.stderr, flush=True)


def is_repeated(field):
    """protobuf 7 has FieldDescriptor.is_repeated and no longer .label; older ones the reverse."""
    rep = getattr(field, "is_repeated", None)
    if rep is not None:
        return rep() if callable(rep) else rep
    return field.label == field.LABEL_REPEATED


def generate_stubs(proto_path, out_dir):
    """Runs protoc (from grpc_tools) on proto_path; returns (pb2, pb2_grpc) modules."""
    import importlib

    from grpc_tools import protoc

    try:
        from importlib.resources import files as _files  # Python 3.9+

        well_known = str(_files("grpc_tools").joinpath("_proto"))
    except ImportError:  # Python 3.8
        import pkg_resources

        well_known = pkg_resources.resource_filename("grpc_tools", "_proto")
    proto_dir, proto_file = os.path.split(os.path.abspath(proto_path))
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            "-I" + proto_dir,
            "-I" + well_known,
            "--python_out=" + out_dir,
            "--grpc_python_out=" + out_dir,
            proto_file,
        ]
    )
    if rc != 0:
        raise SystemExit("protoc failed on %s (exit %d)" % (proto_path, rc))
    module = os.path.splitext(proto_file)[0]
    sys.path.insert(0, out_dir)
    pb2 = importlib.import_module(module + "_pb2")
    pb2_grpc = importlib.import_module(module + "_pb2_grpc")
    return pb2, pb2_grpc


# --- unknown fields -------------------------------------------------------------------------


def _varint(n):
    n &= (1 << 64) - 1  # negative int64 -> 10-byte two's complement, as protobuf does
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _tag(field, wire_type):
    return _varint((field << 3) | wire_type)


def _len_delimited(field, payload):
    return _tag(field, 2) + _varint(len(payload)) + payload


def unknown_fields_for(full_name):
    """Bytes of fields that message `full_name` does not define in the v1 schema of
    kubelet v0.36.3. PodResources gets fields 4 and 5, which kubelet master added after 1.36
    (pod-level cpu_ids, packed, and pod-level memory); the rest are of every wire type a
    proto3 message can carry (varint, fixed64, length-delimited, fixed32), with tags of one to
    five bytes."""
    if full_name == "v1.ListPodResourcesResponse" or full_name == "v1.GetPodResourcesResponse":
        return _len_delimited(2, b"future-top-level") + _tag(100, 0) + _varint(1)
    if full_name == "v1.PodResources":
        packed = b"".join(_varint(c) for c in (4, 5, 68, 69))
        memory = _len_delimited(1, b"memory") + _tag(2, 0) + _varint(1 << 30)
        return _len_delimited(4, packed) + _len_delimited(5, memory)
    if full_name == "v1.ContainerResources":
        return (
            _tag(6, 0) + _varint(1)
            + _tag(15, 1) + (0x0123456789ABCDEF).to_bytes(8, "little")
            + _tag(16, 5) + (0xDEADBEEF).to_bytes(4, "little")
        )
    if full_name == "v1.ContainerDevices":
        return _len_delimited(4, b"health=Healthy")
    if full_name == "v1.TopologyInfo":
        return _tag(2, 0) + _varint(7)
    if full_name == "v1.NUMANode":
        return _tag(2, 0) + _varint(-1)  # ten-byte varint
    if full_name == "v1.ContainerMemory":
        return _tag(4, 5) + (42).to_bytes(4, "little")
    # The rest (DynamicResource, ClaimResource, CDIDevice): the largest field number there is,
    # whose tag takes five bytes.
    return _tag(536870911, 0) + _varint(3)


def add_unknown_fields(msg):
    """Adds unknown_fields_for() to msg and to every message inside it (depth first)."""
    for field, value in msg.ListFields():
        if field.message_type is None:
            continue
        if is_repeated(field):
            for sub in value:
                add_unknown_fields(sub)
        else:
            add_unknown_fields(value)
    # Parsing bytes with fields the schema lacks keeps them as unknown fields, and serializing
    # writes them back out (after the known ones).
    msg.MergeFromString(unknown_fields_for(msg.DESCRIPTOR.full_name))


# --- the service ----------------------------------------------------------------------------


def load_pods(pb2, path):
    from google.protobuf import json_format

    with open(path, "r", encoding="utf-8") as f:
        data = json.load(f)
    resp = pb2.ListPodResourcesResponse()
    if isinstance(data, list):
        data = {"pod_resources": data}
    json_format.ParseDict(data, resp)
    return resp


def derive_allocatable(pb2, pods):
    resp = pb2.AllocatableResourcesResponse()
    seen = set()
    cpus = set()
    for pod in pods.pod_resources:
        for c in pod.containers:
            cpus.update(c.cpu_ids)
            for d in c.devices:
                for dev_id in d.device_ids:
                    if (d.resource_name, dev_id) in seen:
                        continue
                    seen.add((d.resource_name, dev_id))
                    entry = resp.devices.add(resource_name=d.resource_name, device_ids=[dev_id])
                    if d.HasField("topology"):
                        entry.topology.CopyFrom(d.topology)
    resp.cpu_ids.extend(sorted(cpus))
    return resp


def make_servicer(pb2, pb2_grpc, args):
    import grpc
    from google.protobuf import json_format

    class Lister(pb2_grpc.PodResourcesListerServicer):
        def _pods(self, context):
            try:
                return load_pods(pb2, args.allocation)
            except Exception as e:  # a broken file fails the request, not the server
                log("cannot load %s: %s" % (args.allocation, e))
                context.abort(grpc.StatusCode.INTERNAL, "cannot load allocation: %s" % e)

        def List(self, request, context):
            resp = self._pods(context)
            if args.unknown_fields:
                add_unknown_fields(resp)
            return resp

        def Get(self, request, context):
            pods = self._pods(context)
            for pod in pods.pod_resources:
                if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                    resp = pb2.GetPodResourcesResponse()
                    resp.pod_resources.CopyFrom(pod)
                    if args.unknown_fields:
                        add_unknown_fields(resp)
                    return resp
            context.abort(
                grpc.StatusCode.UNKNOWN,
                "pod %s in namespace %s not found" % (request.pod_name, request.pod_namespace),
            )

        def GetAllocatableResources(self, request, context):
            if args.allocatable:
                try:
                    with open(args.allocatable, "r", encoding="utf-8") as f:
                        data = json.load(f)
                    return json_format.ParseDict(data, pb2.AllocatableResourcesResponse())
                except Exception as e:
                    log("cannot load %s: %s" % (args.allocatable, e))
                    context.abort(grpc.StatusCode.INTERNAL, "cannot load allocatable: %s" % e)
            return derive_allocatable(pb2, self._pods(context))

    return Lister()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", required=True, help="Unix socket path to listen on")
    ap.add_argument("--allocation", required=True, help="JSON file of pods (re-read per request)")
    ap.add_argument("--allocatable", help="JSON AllocatableResourcesResponse (re-read per request)")
    ap.add_argument("--proto", default=DEFAULT_PROTO, help="api.proto to serve (default: the vendored one)")
    ap.add_argument("--unknown-fields", action="store_true", help="add unknown fields to List/Get responses")
    args = ap.parse_args()

    import grpc

    stop = threading.Event()
    # Installed before anything slow, so an early SIGTERM still ends the process cleanly.
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    with tempfile.TemporaryDirectory(prefix="podres-stubs-") as stub_dir:
        pb2, pb2_grpc = generate_stubs(args.proto, stub_dir)
        # Fail at start-up, not at the first request, on a malformed allocation.
        try:
            load_pods(pb2, args.allocation)
        except Exception as e:
            raise SystemExit("podresources_server: cannot load %s: %s" % (args.allocation, e))

        # A stale socket from a killed run is removed, as the kubelet does; anything else there
        # is left alone (and binding fails).
        if os.path.exists(args.socket) and stat.S_ISSOCK(os.stat(args.socket).st_mode):
            os.unlink(args.socket)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb2_grpc.add_PodResourcesListerServicer_to_server(make_servicer(pb2, pb2_grpc, args), server)
        if server.add_insecure_port("unix:" + args.socket) == 0:
            raise SystemExit("cannot listen on unix:%s" % args.socket)
        server.start()
        methods = [m.name for m in pb2.DESCRIPTOR.services_by_name["PodResourcesLister"].methods]
        log("serving /v1.PodResourcesLister/{%s} on unix:%s" % (",".join(methods), args.socket))
        sys.stdout.write("ready\n")
        sys.stdout.flush()

        while not stop.wait(0.2):
            pass
        server.stop(grace=1).wait()
        try:
            os.unlink(args.socket)
        except FileNotFoundError:
            pass
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
