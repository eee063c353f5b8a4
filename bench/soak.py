#!/usr/bin/env python3
"""Soak: one `shardgate serve` (memory store, release build) under a bounded load that
rotates over ~1M distinct descriptors, with the server's RSS and open file descriptors
recorded once per second. Memory must level off: buckets of a per-second rule expire a few
seconds after their last use and the sweeper evicts them (docs/architecture.md, "Expiry").

    .venv/bin/python bench/soak.py [--seconds 600] [--keys 1000000] [--concurrency 16]

Needs target/release/shardgate and target/release/examples/rls_load (under $CARGO_TARGET_DIR
when set; bench/tools/rls_load.rs, built as a cargo example: `cargo build --release --bin
shardgate --example rls_load`); bench/run builds both.
Writes bench/results/<date>-soak.csv (t, rss_kib, fds, requests so far) and prints the
curve as one line per minute, plus min/max and the first and last minute's RSS.
"""
import argparse
import datetime
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(ROOT, os.environ.get("CARGO_TARGET_DIR") or "target")  # as cargo
SHARDGATE = os.path.join(TARGET, "release/shardgate")
RLS_LOAD = os.path.join(TARGET, "release/examples/rls_load")
FRAMES = os.path.join(ROOT, "bench/frames.py")

# Buckets of a per-second rule: full again 1 s after their last debit, so their items
# carry a ttl of 7 s (the engine's multiplier) and are evicted within ~10 s after it.
CONFIG = """\
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 10}
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        m = re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M)
    return int(m.group(1)) if m else 0


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def metric(http_port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=int, default=600, help="load duration (at most 600)")
    p.add_argument("--keys", type=int, default=1_000_000, help="distinct descriptors rotated")
    p.add_argument("--concurrency", type=int, default=16)
    a = p.parse_args()
    seconds = min(a.seconds, 600)
    for binary in (SHARDGATE, RLS_LOAD):
        if not os.access(binary, os.X_OK):
            sys.exit(f"{binary} missing: cargo build --release --bin shardgate --example rls_load")

    work = tempfile.mkdtemp(prefix="shardgate-soak-")
    subprocess.run([sys.executable, FRAMES, work, "--distinct", str(a.keys)], check=True,
                   stdout=subprocess.DEVNULL)
    config = os.path.join(work, "soak.yaml")
    with open(config, "w") as f:
        f.write(CONFIG)
    grpc_port, http_port = free_port(), free_port()
    while http_port == grpc_port:
        http_port = free_port()
    log = open(os.path.join(work, "shardgate.log"), "w")
    server = subprocess.Popen(
        [SHARDGATE, "serve", "--config", config, "--grpc-addr", f"127.0.0.1:{grpc_port}",
         "--http-addr", f"127.0.0.1:{http_port}"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", grpc_port), 0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    sys.exit("shardgate did not start: see " + log.name)
                time.sleep(0.1)

        samples = []
        stop = threading.Event()

        def sample():
            t0 = time.monotonic()
            while not stop.is_set():
                try:
                    requests = metric(http_port, "shardgate_request_duration_seconds_count")
                    samples.append((round(time.monotonic() - t0, 1), rss_kib(server.pid),
                                    fds(server.pid), int(requests)))
                except (OSError, ValueError):
                    pass
                stop.wait(1.0)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        load = subprocess.run(
            [RLS_LOAD, "--addr", f"127.0.0.1:{grpc_port}",
             "--frames", os.path.join(work, "distinct.bin"),
             "--concurrency", str(a.concurrency), "--connections", "2",
             "--duration", str(seconds), "--max-requests", "50000000"],
            capture_output=True, text=True, timeout=seconds + 60)
        time.sleep(15)  # the last buckets expire and are swept: the curve's tail
        stop.set()
        sampler.join()
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()

    if load.returncode != 0:
        sys.exit(f"rls_load failed: {load.stderr[-2000:]}")
    os.makedirs(os.path.join(ROOT, "bench/results"), exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d")
    out = os.path.join(ROOT, "bench/results", f"{stamp}-soak.csv")
    with open(out, "w") as f:
        f.write("t_s,rss_kib,fds,requests\n")
        for row in samples:
            f.write(",".join(map(str, row)) + "\n")
    print(f"load: {load.stdout.strip()}")
    print(f"{len(samples)} samples in {out}")
    print(f"{'t (s)':>6} {'RSS MiB':>8} {'FDs':>4} {'requests':>10}")
    for t, rss, fd, req in samples:
        if int(t) % 60 == 0 or (t, rss, fd, req) == samples[-1]:
            print(f"{t:6.0f} {rss / 1024:8.1f} {fd:4d} {req:10d}")
    rss_all = [s[1] for s in samples]
    first_min = [s[1] for s in samples if 60 <= s[0] < 120]
    last_min = [s[1] for s in samples if seconds - 60 <= s[0] < seconds]
    print(f"RSS MiB: min {min(rss_all) / 1024:.1f}, max {max(rss_all) / 1024:.1f}; "
          f"minute 2 mean {sum(first_min) / max(len(first_min), 1) / 1024:.1f}, "
          f"last minute mean {sum(last_min) / max(len(last_min), 1) / 1024:.1f}")
    print(f"FDs: min {min(s[2] for s in samples)}, max {max(s[2] for s in samples)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
