#!/usr/bin/env python3
"""Sends a sample of a scenario's pre-encoded frames with an independent gRPC client
(PyPI grpcio, generic unary call carrying the frame's protobuf bytes unchanged) and
decodes each answer with xds-protos: prints, as JSON, how many calls ended with which
gRPC status and how many answers had which overall_code.

    .venv/bin/python bench/sample.py ADDR FRAMES_FILE [--count 200]

h2load counts HTTP 2xx only; a gRPC error is HTTP 200 with grpc-status in the trailers.
grpcio reads the trailers: a call that returns normally had grpc-status 0 (OK).
For a file of many frames (distinct.bin) the sample is spread evenly over the file.
"""
import argparse
import collections
import json
import struct
import sys

import grpc
from envoy.service.ratelimit.v3 import rls_pb2

METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"


def frames(path):
    data = open(path, "rb").read()
    at, out = 0, []
    while at < len(data):
        flag, length = struct.unpack_from(">BI", data, at)
        if flag != 0:
            raise ValueError(f"{path}: compressed frame at byte {at}")
        out.append(data[at + 5 : at + 5 + length])
        at += 5 + length
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("addr")
    p.add_argument("frames")
    p.add_argument("--count", type=int, default=200)
    a = p.parse_args()
    bodies = frames(a.frames)
    step = max(1, len(bodies) // max(a.count, 1))
    picked = [bodies[(i * step) % len(bodies)] for i in range(a.count)]
    call = grpc.insecure_channel(a.addr).unary_unary(
        METHOD, request_serializer=None, response_deserializer=None
    )
    grpc_status = collections.Counter()
    overall = collections.Counter()
    statuses = collections.Counter()
    for body in picked:
        try:
            raw = call(body, timeout=5)
        except grpc.RpcError as e:
            grpc_status[e.code().name] += 1
            continue
        grpc_status["OK"] += 1
        resp = rls_pb2.RateLimitResponse.FromString(raw)
        overall[rls_pb2.RateLimitResponse.Code.Name(resp.overall_code)] += 1
        statuses[len(resp.statuses)] += 1
    print(
        json.dumps(
            {
                "sent": len(picked),
                "grpc_status": dict(grpc_status),
                "overall_code": dict(overall),
                "statuses_per_answer": {str(k): v for k, v in statuses.items()},
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
