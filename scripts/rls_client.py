#!/usr/bin/env python3
"""Sends one ShouldRateLimit request and prints the answer: an independent client built
on the PyPI packages xds-protos and grpcio (not on shardgate's code).

    rls_client.py [--addr 127.0.0.1:8081] [--hits N] DOMAIN 'k=v,k=v[@hits]' ...

Each descriptor argument is a comma-separated list of key=value entries, optionally
followed by @N for a per-descriptor hits_addend (0 checks without consuming)."""
import argparse
import sys

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc


def descriptor(text):
    entries, _, hits = text.partition("@")
    d = ratelimit_pb2.RateLimitDescriptor()
    for pair in entries.split(","):
        key, _, value = pair.partition("=")
        d.entries.add(key=key, value=value)
    if hits:
        d.hits_addend.value = int(hits)
    return d


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--addr", default="127.0.0.1:8081")
    p.add_argument("--hits", type=int, default=0, help="request-level hits_addend")
    p.add_argument("domain")
    p.add_argument("descriptors", nargs="+")
    a = p.parse_args()
    stub = rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(a.addr))
    req = rls_pb2.RateLimitRequest(
        domain=a.domain,
        descriptors=[descriptor(t) for t in a.descriptors],
        hits_addend=a.hits,
    )
    try:
        resp = stub.ShouldRateLimit(req, timeout=5)
    except grpc.RpcError as e:
        print(f"{e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    code = rls_pb2.RateLimitResponse.Code.Name
    print(f"overall: {code(resp.overall_code)}")
    for text, s in zip(a.descriptors, resp.statuses):
        limit = s.current_limit
        rule = (
            f"{limit.requests_per_unit}/{rls_pb2.RateLimitResponse.RateLimit.Unit.Name(limit.unit).lower()}"
            + (f" ({limit.name})" if limit.name else "")
            if s.HasField("current_limit")
            else "no limit"
        )
        reset = s.duration_until_reset.seconds + s.duration_until_reset.nanos / 1e9
        print(f"  {text}: {code(s.code)} {rule} remaining={s.limit_remaining} reset={reset:.3f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
