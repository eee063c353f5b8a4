#!/usr/bin/env python3
"""Writes the request bodies of the load benchmarks: gRPC-framed ShouldRateLimit requests
(1-byte compressed flag 0, 4-byte big-endian length, then the protobuf), built with the
generated Envoy stubs of the PyPI package xds-protos (not with shardgate's code).

    .venv/bin/python bench/frames.py OUT_DIR [--distinct 100000]

For each scenario OUT_DIR/<scenario>.bin holds one frame — what `h2load -d` sends as
the body of every request — except distinct.bin, which holds --distinct frames one after
the other (one per client value), for bench/tools/rls_load.rs to rotate over. h2load has no
per-request body option (one `-d FILE` for every request; only URIs vary per request, and
the descriptors are in the body), so that scenario cannot be driven by h2load.
OUT_DIR/scenarios.json describes every file.
"""
import argparse
import json
import os
import struct
import sys

from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2

DOMAIN = "bench"

# scenario -> (description, list of descriptors; a descriptor is a list of (key, value))
SCENARIOS = {
    "hot": ("one hot descriptor: tenant=hot (one bucket)", [[("tenant", "hot")]]),
    "cascade": (
        "a cascade pair: tenant=acme,api_key=k1 (the key's bucket and its tenant's)",
        [[("tenant", "acme"), ("api_key", "k1")]],
    ),
    "three": (
        "three descriptors per request: tenant=t3 | path=/api/v1/items | remote_address=10.0.0.1",
        [[("tenant", "t3")], [("path", "/api/v1/items")], [("remote_address", "10.0.0.1")]],
    ),
    "over": (
        "one hot descriptor over its limit: tenant=over (1/hour): refusals",
        [[("tenant", "over")]],
    ),
    "limited": (
        "one hot descriptor limited below the load: tenant=limited (2000/s, burst 2000)",
        [[("tenant", "limited")]],
    ),
}


def request(descriptors):
    req = rls_pb2.RateLimitRequest(domain=DOMAIN)
    for entries in descriptors:
        d = req.descriptors.add()
        for key, value in entries:
            d.entries.add(key=key, value=value)
    return req


def frame(message):
    body = message.SerializeToString()
    return struct.pack(">BI", 0, len(body)) + body


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--distinct", type=int, default=100_000, help="client values of distinct.bin")
    a = p.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    manifest = {}
    for name, (description, descriptors) in SCENARIOS.items():
        path = os.path.join(a.out_dir, f"{name}.bin")
        data = frame(request(descriptors))
        with open(path, "wb") as f:
            f.write(data)
        manifest[name] = {
            "file": path,
            "frames": 1,
            "descriptors_per_request": len(descriptors),
            "bytes_per_frame": len(data),
            "description": description,
        }
    path = os.path.join(a.out_dir, "distinct.bin")
    total = 0
    with open(path, "wb") as f:
        for i in range(a.distinct):
            data = frame(request([[("client", f"c{i:06d}")]]))
            total += len(data)
            f.write(data)
    manifest["distinct"] = {
        "file": path,
        "frames": a.distinct,
        "descriptors_per_request": 1,
        "bytes_per_frame": total / max(a.distinct, 1),
        "description": f"{a.distinct} distinct descriptors: client=c000000 … (one bucket each), rotated",
    }
    with open(os.path.join(a.out_dir, "scenarios.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    print(json.dumps({k: v["file"] for k, v in manifest.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
