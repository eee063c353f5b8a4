#!/usr/bin/env python3
"""One connection against eight: does one busy HTTP/2 connection use every core?

    .venv/bin/python bench/spread.py [SHARDGATE ...] [--rounds 5] [--seconds 8] [--scenarios hot]
                                     [--tonic-noop]

For each binary (default: $CARGO_TARGET_DIR or target, /release/shardgate) and each
scenario — `costly` (16 descriptors, each matched by a `value_regex` rule, memory store)
and `hot` (one hot key) — every round runs h2load over 1 connection × 64 streams and over
8 connections × 8 streams (64 in flight either way), in alternating order, on one server
started for the round (2 s warm-up, then `--seconds` measured). It prints each run's req/s
and the server's CPU per request, each round's ratio one/eight and their median, and for
the one-connection runs the CPU each of the server's threads spent (from
/proc/PID/task/*/stat), the share of it spent in the kernel (system calls: reads and
writes) and the cores the server used in all (CPU s / s): a connection's
task moves between workers, so CPU on both workers alone does not show that they ran at
once; more than one core used by one connection does.

`--tonic-noop` adds bench/tools' no-op RLS (target/release/examples/noop_rls, built by
`bench/run`): tonic's server, which runs each call in a task of its own and so spreads
one connection's calls over the workers, answering without deciding. Its one/eight on the
hot key is what that model reaches on this machine with no decision to spread: a reference
for shardgate's, not a ceiling.

h2load runs with one thread beside the server, so on a 2-core machine it takes part of a
core: read ratios, not absolute rates. Only 127.0.0.1 is contacted; every run is bounded
by h2load's duration.
"""
import argparse
import collections
import os
import re
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

from envoy.service.ratelimit.v3 import rls_pb2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
PATH = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
TICK_HZ = os.sysconf("SC_CLK_TCK")
NOOP = os.path.join(TARGET, "release", "examples", "noop_rls")
DESCRIPTORS = 16

CONFIG = "domain: spread\ndescriptors:\n" + "".join(
    f"  - key: k{i}\n    value_regex: 'v{i}-[0-9a-f]{{8}}-(alpha|beta|gamma)'\n"
    f"    rate_limit: {{unit: minute, requests_per_unit: 4000000000}}\n"
    for i in range(DESCRIPTORS)
) + "  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 4000000000}\n"

SHAPES = {"one": (1, 64), "eight": (8, 8)}


def frame(descriptors):
    req = rls_pb2.RateLimitRequest(domain="spread")
    for key, value in descriptors:
        req.descriptors.add().entries.add(key=key, value=value)
    body = req.SerializeToString()
    return struct.pack(">BI", 0, len(body)) + body


SCENARIOS = {
    "costly": frame([(f"k{i}", f"v{i}-0badcafe-gamma") for i in range(DESCRIPTORS)]),
    "hot": frame([("tenant", "hot")]),
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def threads(pid):
    """{thread id: (name, CPU ticks, of which in the kernel)} of every thread of `pid`."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            fields = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[tid] = (name, int(fields[11]) + int(fields[12]), int(fields[12]))
    return out


def h2load(port, body_file, shape, seconds):
    conns, streams = SHAPES[shape]
    out = subprocess.run(
        ["h2load", "-t1", f"-c{conns}", f"-m{streams}", "-D", str(seconds), "-d", body_file,
         "-H", "content-type: application/grpc", "-H", "te: trailers",
         f"http://127.0.0.1:{port}{PATH}"],
        capture_output=True, text=True, timeout=seconds + 30,
    ).stdout
    m = re.search(r"(\d+) succeeded", out)
    if not m:
        sys.exit(f"cannot read h2load's output:\n{out}")
    return int(m.group(1))


Run = collections.namedtuple("Run", "rate cpu_per_request per_thread cores kernel_share")
Run.__doc__ = ("One shape on a fresh server: req/s, CPU µs per request, {thread name: CPU s}, "
               "cores used (CPU s / s), and the share of the CPU spent in the kernel.")


def run(binary, config, body_file, shape, seconds):
    """One shape of `binary` on a fresh server, as a `Run`."""
    port = free_port()
    if binary == NOOP:
        command = [binary, f"127.0.0.1:{port}"]
    else:
        command = [binary, "serve", "--store", "memory", "--config", config,
                   "--grpc-addr", f"127.0.0.1:{port}", "--http-addr", "127.0.0.1:0"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                time.sleep(0.1)
        h2load(port, body_file, shape, 2)  # warm-up
        before = threads(proc.pid)
        n = h2load(port, body_file, shape, seconds)
        after = threads(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    per_thread = collections.Counter()
    kernel = 0
    for tid, (name, ticks, system) in after.items():
        was = before.get(tid, (name, 0, 0))
        per_thread[f"{name}/{tid}"] += (ticks - was[1]) / TICK_HZ
        kernel += (system - was[2]) / TICK_HZ
    cpu = sum(per_thread.values())
    return Run(n / seconds, cpu * 1e6 / max(n, 1), per_thread, cpu / seconds,
               kernel / max(cpu, 1e-9))


def main():
    ap = argparse.ArgumentParser(usage=__doc__)
    ap.add_argument("binaries", nargs="*", default=[os.path.join(TARGET, "release", "shardgate")])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS),
                    help="comma-separated, of: " + ", ".join(SCENARIOS))
    ap.add_argument("--tonic-noop", action="store_true",
                    help="also run the no-op tonic RLS (a call per task), for reference")
    args = ap.parse_args()
    if args.tonic_noop:
        if not os.path.exists(NOOP):
            sys.exit(f"{NOOP} is missing: cargo build --release --example noop_rls")
        args.binaries.append(NOOP)
    unknown = set(args.scenarios.split(",")) - set(SCENARIOS)
    if unknown:
        sys.exit(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    work = tempfile.mkdtemp(prefix="spread-")
    config = os.path.join(work, "spread.yaml")
    with open(config, "w") as f:
        f.write(CONFIG)
    bodies = {}
    for name in args.scenarios.split(","):
        body = SCENARIOS[name]
        bodies[name] = os.path.join(work, f"{name}.bin")
        with open(bodies[name], "wb") as f:
            f.write(body)
    print(f"{os.cpu_count()} cores; {args.rounds} rounds of {args.seconds} s; 64 streams in flight")
    for binary in args.binaries:
        for scenario, body_file in bodies.items():
            ratios = []
            print(f"\n## {binary} — {scenario}")
            print("| round | 1×64 req/s | 8×8 req/s | one/eight | µs CPU/req 1×64 | 8×8 "
                  "| cores used 1×64 | 8×8 | kernel share 1×64 | 1×64 busiest threads (CPU s) |")
            print("|---|---|---|---|---|---|---|---|---|---|")
            for r in range(args.rounds):
                order = ["one", "eight"] if r % 2 == 0 else ["eight", "one"]
                got = {shape: run(binary, config, body_file, shape, args.seconds) for shape in order}
                one, eight = got["one"], got["eight"]
                ratio = one.rate / eight.rate
                ratios.append(ratio)
                busiest = ", ".join(f"{name} {s:.2f}" for name, s in one.per_thread.most_common(3))
                print(f"| {r + 1} | {one.rate:,.0f} | {eight.rate:,.0f} | {ratio:.2f} "
                      f"| {one.cpu_per_request:.1f} | {eight.cpu_per_request:.1f} "
                      f"| {one.cores:.2f} | {eight.cores:.2f} | {one.kernel_share:.0%} "
                      f"| {busiest} |", flush=True)
            print(f"\nmedian one/eight: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
