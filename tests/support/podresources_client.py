#!/usr/bin/env python3
"""Calls the PodResources API on a Unix socket and prints the answer as JSON (proto field names).

The output is accepted as --allocation / --allocatable by podresources_server.py.

    python3 tests/support/podresources_client.py --socket /tmp/podres.sock            # List
    python3 tests/support/podresources_client.py --socket S --get NAMESPACE NAME      # Get
    python3 tests/support/podresources_client.py --socket S --allocatable             # GetAllocatableResources

Works against the test server (podresources_server.py) and a real kubelet
(/var/lib/kubelet/pod-resources/kubelet.sock, as root). Needs grpcio and grpcio-tools.
"""

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from podresources_server import DEFAULT_PROTO, generate_stubs, is_repeated  # noqa: E402


def to_dict(msg):
    """Every field under its proto name, defaults included (NUMA node 0 shows as "ID": 0, where
    proto3 JSON would print {}), 64-bit integers as JSON numbers, unset sub-messages left out."""
    out = {}
    for f in msg.DESCRIPTOR.fields:
        value = getattr(msg, f.name)
        if is_repeated(f):
            out[f.name] = [to_dict(v) if f.message_type else v for v in value]
        elif f.message_type is not None or getattr(f, "has_presence", False):
            if msg.HasField(f.name):
                out[f.name] = to_dict(value) if f.message_type else value
        else:
            out[f.name] = value
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--proto", default=DEFAULT_PROTO)
    ap.add_argument("--get", nargs=2, metavar=("NAMESPACE", "NAME"))
    ap.add_argument("--allocatable", action="store_true")
    ap.add_argument("--timeout", type=float, default=10.0)
    args = ap.parse_args()

    import grpc

    with tempfile.TemporaryDirectory(prefix="podres-stubs-") as stub_dir:
        pb2, pb2_grpc = generate_stubs(args.proto, stub_dir)
        with grpc.insecure_channel("unix:" + args.socket) as channel:
            stub = pb2_grpc.PodResourcesListerStub(channel)
            try:
                if args.get:
                    req = pb2.GetPodResourcesRequest(pod_namespace=args.get[0], pod_name=args.get[1])
                    resp = stub.Get(req, timeout=args.timeout)
                elif args.allocatable:
                    resp = stub.GetAllocatableResources(pb2.AllocatableResourcesRequest(), timeout=args.timeout)
                else:
                    resp = stub.List(pb2.ListPodResourcesRequest(), timeout=args.timeout)
            except grpc.RpcError as e:
                print("error: %s: %s" % (e.code().name, e.details()), file=sys.stderr)
                return 1
        print(json.dumps(to_dict(resp), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
