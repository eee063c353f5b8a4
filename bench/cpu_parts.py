#!/usr/bin/env python3
"""Where a server's CPU goes per request: reads `perf script` output (call stacks with
inlined frames) and attributes each sample to one part of the request's work.

    perf script -i perf.data -F period,ip,sym | bench/cpu_parts.py --requests N [--cpu-s S]

Each sample is walked from the leaf towards the root; the first frame that belongs to a
part names the sample's part, so a `memcpy` or `malloc` called by the decoder counts as
decode, and a kernel `writev` under h2 counts as transport. Frames of no part (libc, the
kernel, closures of the runtime) are passed over; a sample none of whose frames belongs to
a part is `other`. With `--requests` (the requests answered while perf recorded) and
`--cpu-s` (the server's CPU seconds over the same window), each part is also given in µs of
CPU per request. bench/profile runs the whole measurement.
"""
import argparse
import json
import re
import sys

# (part, pattern matched against one frame's symbol), tried in order on each frame. The
# shardgate parts come first: a frame of ours is more specific than tonic's around it.
PARTS = [
    ("decode", r"service::wire::|service::framing::|RateLimitRequest as prost|prost::encoding::(?!encode)"),
    ("validation", r"service::request::"),
    ("matching", r"service::treatment::|config::matcher::|config::entity::|Config>::match_descriptor|Domain>::match_descriptor"),
    ("planning", r"engine::plan::"),
    ("store", r"shardgate::store::"),
    ("engine", r"shardgate::engine::"),
    ("metrics", r"service::metrics::|prometheus_client::"),
    ("response", r"service::status::|service::answer::"),
    ("encode", r"service::unary::|service::reply::|RateLimitResponse as prost|tonic::codec::encode"),
    ("decision", r"service::decision::|service::deadline::|service::rls::|service::grpc::Port"),
    ("tracing", r"^tracing::|tracing_core::|tracing_subscriber::"),
    ("grpc (tonic)", r"^<?tonic::|tonic::"),
    ("transport (h2, hyper)", r"\bh2::|hyper::|hyper_util::|tokio::net::|mio::"),
    ("runtime (tokio)", r"tokio::"),
]
COMPILED = [(name, re.compile(p)) for name, p in PARTS]
ORDER = [name for name, _ in PARTS] + ["other"]


def samples(lines):
    """Yields (period, [symbols leaf first]) per sample of `perf script -F period,ip,sym`."""
    period, frames = None, []
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            if period is not None:
                yield period, frames
            period, frames = None, []
        elif not line.startswith(("\t", " ")) or period is None and line.strip().isdigit():
            period, frames = int(line.split()[-1]), []
        else:
            parts = line.strip().split(None, 1)
            frames.append(parts[1] if len(parts) > 1 else "")
    if period is not None:
        yield period, frames


def part_of(frames):
    for sym in frames:
        for name, pattern in COMPILED:
            if pattern.search(sym):
                return name
    return "other"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=float, help="requests answered while perf recorded")
    ap.add_argument("--cpu-s", type=float, help="server CPU seconds while perf recorded")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a = ap.parse_args()
    totals = {name: 0 for name in ORDER}
    for period, frames in samples(sys.stdin):
        totals[part_of(frames)] += period
    all_ = sum(totals.values()) or 1
    per_req = a.cpu_s * 1e6 / a.requests if a.requests and a.cpu_s else None
    rows = []
    for name in ORDER:
        share = totals[name] / all_
        rows.append({"part": name, "share": share, "us_per_request": per_req * share if per_req else None})
    if a.json:
        json.dump({"rows": rows, "us_per_request": per_req}, sys.stdout, indent=1)
        print()
        return
    print("| part | share of server CPU | µs per request |")
    print("|---|--:|--:|")
    for r in rows:
        us = f"{r['us_per_request']:.2f}" if r["us_per_request"] is not None else "–"
        print(f"| {r['part']} | {100 * r['share']:.1f} % | {us} |")
    if per_req:
        print(f"| **all** | 100 % | **{per_req:.2f}** |")


if __name__ == "__main__":
    main()
