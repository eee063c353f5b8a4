#!/usr/bin/env python3
"""Two shardgate binaries and the no-op ceiling, paired: each round runs all three on the
memory store under the same h2load load (2 connections x 32 streams, 2 s warm-up, 8 s
measured), the order reversed every other round, and reports each one's req/s and server
CPU µs per request, each round's ratios and the medians of the per-round ratios. For
judging a change to the request path on a noisy machine: run the binary before the change
and after it in one alternating run.

    bench/pair.py OLD_SHARDGATE NEW_SHARDGATE FRAME [ROUNDS] [--other NAME=COMMAND ...]

FRAME is one gRPC frame as bench/frames.py writes them (e.g. OUT/hot.bin); the ceiling is
$CARGO_TARGET_DIR (or target)/release/examples/noop_rls, built by bench/run. `--other`
adds another rate-limit server to every round (another implementation, with rules
equivalent to bench/config.yaml's): COMMAND is its command line, split on spaces, with
{port} for the gRPC port it must listen on and {http_port} for a second free port. Only
127.0.0.1 is contacted; each run is bounded by h2load's duration.
"""
import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import time

from bench import CLK_TCK as TICK_HZ, GRPC_PATH as PATH, NOOP, ROOT, free_port

ap = argparse.ArgumentParser(usage=__doc__)
ap.add_argument("old")
ap.add_argument("new")
ap.add_argument("frame")
ap.add_argument("rounds", nargs="?", type=int, default=6)
ap.add_argument("--other", action="append", default=[], metavar="NAME=COMMAND")
ARGS = ap.parse_args()
BINS = {"old": ARGS.old, "new": ARGS.new, "noop": NOOP}
OTHERS = dict(o.split("=", 1) for o in ARGS.other)
BINS.update(OTHERS)
FRAME = ARGS.frame
ROUNDS = ARGS.rounds


def cpu_ticks(pid):
    """utime + stime of every thread of `pid`."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def h2load(port, seconds):
    """Requests answered in `seconds` of load."""
    out = subprocess.run(
        ["h2load", "-t1", "-c2", "-m32", "-D", str(seconds), "-d", FRAME,
         "-H", "content-type: application/grpc", "-H", "te: trailers", f"http://127.0.0.1:{port}{PATH}"],
        capture_output=True, text=True, timeout=seconds + 30,
    ).stdout
    m = re.search(r"(\d+) succeeded", out)
    if not m:
        sys.exit(f"cannot read h2load's output:\n{out}")
    return int(m.group(1))


def measure(name):
    """(req/s, CPU µs per request) of one server, started for this run only."""
    port = free_port()
    if name in OTHERS:
        argv = OTHERS[name].format(port=port, http_port=free_port()).split()
    elif name == "noop":
        argv = [BINS[name], f"127.0.0.1:{port}"]
    else:
        argv = [BINS[name], "serve", "--store", "memory", "--config",
                os.path.join(ROOT, "bench/config.yaml"),
                "--grpc-addr", f"127.0.0.1:{port}", "--http-addr", "127.0.0.1:0"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                time.sleep(0.1)
        h2load(port, 2)
        t0, w0 = cpu_ticks(proc.pid), time.monotonic()
        answered = h2load(port, 8)
        t1, w1 = cpu_ticks(proc.pid), time.monotonic()
    finally:
        proc.kill()
        proc.wait()
    return answered / (w1 - w0), (t1 - t0) / TICK_HZ * 1e6 / answered


def main():
    runs = {k: [] for k in BINS}
    for r in range(ROUNDS):
        order = ["old", "new", "noop", *OTHERS]
        if r % 2:
            order.reverse()
        row = {k: measure(k) for k in order}
        for k in BINS:
            runs[k].append(row[k])
        cells = "  ".join(f"{k} {row[k][0]:,.0f} req/s {row[k][1]:.1f} µs" for k in BINS)
        print(f"round {r + 1}: {cells}  new/old CPU {row['new'][1] / row['old'][1]:.3f}", flush=True)
    med = statistics.median
    for k in BINS:
        print(f"median {k}: {med(x[0] for x in runs[k]):,.0f} req/s, {med(x[1] for x in runs[k]):.2f} µs CPU/req")
    pairs = [("new", "old"), ("new", "noop"), ("old", "noop")]
    pairs += [(p, q) for o in OTHERS for p, q in [("new", o), (o, "noop")]]
    for a, b in pairs:
        req = med(x[0] / y[0] for x, y in zip(runs[a], runs[b]))
        cpu = med(x[1] / y[1] for x, y in zip(runs[a], runs[b]))
        print(f"median of the per-round ratios {a}/{b}: req/s {req:.3f}, CPU per request {cpu:.3f}")


if __name__ == "__main__":
    main()
