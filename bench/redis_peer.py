#!/usr/bin/env python3
"""shardgate on Redis beside limitador on the same Redis (`bench/run redis`).

One Redis (Debian's redis-server, scripts/redis-local, nothing persisted) serves in turn:
shardgate (`--store redis`, default flags: leases on), limitador's `redis` storage (a
script per check) and its `redis_cached` storage (counters in process, flushed every
second), the last two through bench/peers/limitador_rls (limitador's own library behind a
minimal ShouldRateLimit front). Each is loaded by bench/tools/rls_load over HTTP/2 with
pre-encoded requests (bench/frames.py), in four scenarios:

- hot: one descriptor, one counter/bucket, far under its limit;
- distinct: 100,000 distinct descriptors rotated, one counter/bucket each;
- zipf: the same 100,000 descriptors drawn with the Zipf law of exponent 1.1 (`rls_load
  --zipf 1.1`, seeded: every server gets the same sequence), the realistic mix: a few
  hot keys and a long tail touched once; beside its scripts per decision, the floor
  rls_load counts from the very requests sent (one write per key in each second it is
  touched: what no design could go below) and the scripts over it (`× floor`);
- limited: one descriptor limited at 2000/s (shardgate: burst 2000; limitador: 2000 per
  1 s window), offered more than that: what each admits is counted against the bound
  2000 + 2000 × t (a token bucket's; a fixed window may admit up to twice the limit at a
  window edge, the cached storage more).

Per case: decisions/s, p99 latency, Redis commands per decision (`INFO commandstats`,
every command Redis ran during the case), CPU per decision of the server and of Redis
(`/proc/PID/stat`), and after `distinct` the bytes Redis holds per bucket/counter
(`used_memory` after the case less before, over the keys made). Rounds alternate the
servers (A B C, A B C, ...), Redis is flushed before each case, and the table shows
medians over the rounds.

    .venv/bin/python bench/redis_peer.py [--rounds 3] [--duration 10] [--concurrency 64]

Writes bench/results/<date>-redis.md (the table) and <date>-redis.jsonl (the run's
arguments, then every case, one JSON object a line; not a bench.py result, so no charts). Bounded: every case ends after --duration
(at most 60 s) and every process is stopped at the end.
"""
import argparse
import datetime
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
TARGET = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
SHARDGATE = TARGET / "release" / "shardgate"
RLS_LOAD = TARGET / "release" / "examples" / "rls_load"
PEER = ROOT / "bench" / "peers" / "limitador_rls" / "target" / "release" / "limitador_rls"
TICKS = os.sysconf("SC_CLK_TCK")
LIMITED_RATE = 2000

SCENARIOS = ["hot", "distinct", "zipf", "limited"]
ZIPF_EXPONENT = "1.1"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_s(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def redis_cli(port, *args):
    return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True,
                          text=True, timeout=30, check=True).stdout


def scripts_run(port):
    """EVALSHA and EVAL calls: each one round trip, whoever sent it."""
    total = 0
    for line in redis_cli(port, "INFO", "commandstats").splitlines():
        if line.startswith(("cmdstat_evalsha:", "cmdstat_eval:")):
            total += int(line.split("calls=")[1].split(",")[0])
    return total


def commands_run(port):
    total = 0
    for line in redis_cli(port, "INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_"):
            total += int(line.split("calls=")[1].split(",")[0])
    return total


def used_memory(port):
    for line in redis_cli(port, "INFO", "memory").splitlines():
        if line.startswith("used_memory:"):
            return int(line.split(":")[1])
    raise RuntimeError("no used_memory")


def wait_port(port, proc, what):
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not listen on {port}")
            time.sleep(0.05)


class Server:
    """One RLS on the shared Redis."""

    def __init__(self, name, redis_port, tmp):
        self.name, self.redis_port, self.tmp = name, redis_port, tmp
        self.port = free_port()
        self.http_port = None
        url = f"redis://127.0.0.1:{redis_port}"
        if name == "shardgate":
            self.http_port = free_port()
            cmd = [str(SHARDGATE), "serve", "--config", str(ROOT / "bench" / "config.yaml"),
                   "--store", "redis", "--redis-url", url,
                   "--grpc-addr", f"127.0.0.1:{self.port}",
                   "--http-addr", f"127.0.0.1:{self.http_port}"]
        else:
            storage = name.removeprefix("limitador-")
            cmd = [str(PEER), "--addr", f"127.0.0.1:{self.port}", "--redis", url,
                   "--storage", storage, "--limit", "tenant:4000000000:60",
                   "--limit", f"tenant=limited:{LIMITED_RATE}:1",
                   "--limit", "client:60000:60"]
        self.log = open(tmp / f"{name}.log", "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "RUST_LOG": "warn"})
        wait_port(self.port, self.proc, name)
        time.sleep(0.5)

    def store_calls(self):
        """shardgate's store calls so far (its /metrics), each one round trip to Redis
        (a script, or a read); None for limitador."""
        if self.http_port is None:
            return None
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics",
                                    timeout=10) as r:
            text = r.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("shardgate_store_calls_total{"))

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def run_case(server, scenario, frames, redis_pid, args):
    redis_cli(server.redis_port, "FLUSHALL")
    redis_cli(server.redis_port, "CONFIG", "RESETSTAT")
    memory_before = used_memory(server.redis_port)
    cpu0 = (cpu_s(server.proc.pid), cpu_s(redis_pid))
    calls0 = server.store_calls()
    started = time.monotonic()
    frame_file = "distinct.bin" if scenario == "zipf" else f"{scenario}.bin"
    order = ["--zipf", ZIPF_EXPONENT, "--seed", "1"] if scenario == "zipf" else []
    load = subprocess.run(
        [str(RLS_LOAD), "--addr", f"127.0.0.1:{server.port}", "--frames",
         str(frames / frame_file), "--concurrency", str(args.concurrency),
         "--connections", "2", "--duration", str(args.duration), *order],
        capture_output=True, text=True, timeout=args.duration + 60, check=True)
    elapsed = time.monotonic() - started
    out = json.loads(load.stdout)
    # A cached storage flushes within a second: count what reached Redis.
    time.sleep(1.5)
    cpu1 = (cpu_s(server.proc.pid), cpu_s(redis_pid))
    answers = max(out["answers"], 1)
    case = {
        "server": server.name, "scenario": scenario,
        "req_per_s": out["req_per_s"], "p99_us": out["latency_us"]["p99"],
        "answers": out["answers"], "errors": out["stream_errors"],
        "ok": out["overall_code"].get("OK", 0),
        "over_limit": out["overall_code"].get("OVER_LIMIT", 0),
        "redis_cmds_per_decision": commands_run(server.redis_port) / answers,
        "scripts_per_decision": scripts_run(server.redis_port) / answers,
        "server_cpu_us_per_decision": (cpu1[0] - cpu0[0]) * 1e6 / answers,
        "redis_cpu_us_per_decision": (cpu1[1] - cpu0[1]) * 1e6 / answers,
        "window_s": out["window_s"], "elapsed_s": elapsed,
    }
    if calls0 is not None:
        case["store_calls_per_decision"] = (server.store_calls() - calls0) / answers
    if scenario == "distinct":
        keys = int(redis_cli(server.redis_port, "DBSIZE").strip())
        case["keys"] = keys
        case["bytes_per_key"] = (used_memory(server.redis_port) - memory_before) / max(keys, 1)
    if scenario == "zipf":
        case["floor_per_decision"] = out["floor"]["writes"] / answers
        case["scripts_over_floor"] = case["scripts_per_decision"] / max(
            case["floor_per_decision"], 1e-9)
    if scenario == "limited":
        case["bound"] = LIMITED_RATE + LIMITED_RATE * out["window_s"]
    return case


def median(cases, field):
    values = [c[field] for c in cases if field in c]
    return statistics.median(values) if values else None


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=int, default=10)
    p.add_argument("--concurrency", type=int, default=64)
    args = p.parse_args()
    args.duration = min(args.duration, 60)
    for binary in (SHARDGATE, RLS_LOAD, PEER):
        if not binary.exists():
            sys.exit(f"{binary} is missing: run bench/run redis")
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="shardgate-bench-redis-"))
    frames = tmp / "frames"
    subprocess.run([sys.executable, str(ROOT / "bench" / "frames.py"), str(frames)],
                   check=True, capture_output=True)
    redis_port = free_port()
    redis = subprocess.Popen([str(ROOT / "scripts" / "redis-local"), "single", str(redis_port)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert redis.stdout.readline().strip() == b"ready"
    redis_pid = int(subprocess.run(["pgrep", "-f", f"redis-server 127.0.0.1:{redis_port}"],
                                   capture_output=True, text=True).stdout.split()[0])
    servers = ["shardgate", "limitador-redis", "limitador-redis_cached"]
    cases = []
    try:
        for r in range(args.rounds):
            for name in servers:
                server = Server(name, redis_port, tmp)
                try:
                    for scenario in SCENARIOS:
                        case = run_case(server, scenario, frames, redis_pid, args)
                        case["round"] = r
                        cases.append(case)
                        print(json.dumps(case), flush=True)
                finally:
                    server.stop()
    finally:
        redis.terminate()
        redis.wait(timeout=10)
    write_results(cases, args)


def write_results(cases, args):
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    out = ROOT / "bench" / "results" / f"{stamp}-redis"
    out.with_suffix(".jsonl").write_text(
        "".join(json.dumps(line) + "\n" for line in [{"args": vars(args)}, *cases]))
    lines = [f"# shardgate vs limitador on one Redis ({stamp})", "",
             f"Medians of {args.rounds} alternating rounds, {args.duration} s per case, "
             f"{args.concurrency} streams over 2 connections (bench/redis_peer.py).", "",
             "Redis cmds/decision counts every command Redis ran, those inside scripts "
             "included; scripts/decision the EVALSHA and EVAL calls (each a round trip); "
             "store calls/decision shardgate's own count of its round trips (scripts and "
             "reads, its /metrics). For zipf, the floor: one write per key in each second "
             "it was touched, from the requests rls_load sent (what no design could go "
             "below), and the scripts per decision over it.", "",
             "| scenario | server | decisions/s | p99 ms | Redis cmds/decision | scripts/decision "
             "| store calls/decision | server CPU µs/decision "
             "| Redis CPU µs/decision | admitted (bound) | bytes/key | floor | × floor |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for scenario in SCENARIOS:
        for server in ["shardgate", "limitador-redis", "limitador-redis_cached"]:
            cs = [c for c in cases if c["server"] == server and c["scenario"] == scenario]
            if not cs:
                continue
            admitted = ""
            if scenario == "limited":
                admitted = f"{median(cs, 'ok'):.0f} ({median(cs, 'bound'):.0f})"
            per_key = median(cs, "bytes_per_key")
            calls = median(cs, "store_calls_per_decision")
            floor = median(cs, "floor_per_decision")
            over = median(cs, "scripts_over_floor")
            lines.append(
                f"| {scenario} | {server} | {median(cs, 'req_per_s'):,.0f} | "
                f"{median(cs, 'p99_us') / 1000:.2f} | {median(cs, 'redis_cmds_per_decision'):.3f} | "
                f"{median(cs, 'scripts_per_decision'):.3f} | "
                f"{'' if calls is None else f'{calls:.3f}'} | "
                f"{median(cs, 'server_cpu_us_per_decision'):.1f} | "
                f"{median(cs, 'redis_cpu_us_per_decision'):.1f} | {admitted} | "
                f"{'' if per_key is None else f'{per_key:.0f}'} | "
                f"{'' if floor is None else f'{floor:.3f}'} | "
                f"{'' if over is None else f'{over:.2f}×'} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
