"""A flood of distinct client addresses against one `shardgate serve --store memory`, for
the memory store's bound (bench/README.md, "Memory store bound"): every 200,000 new
addresses it prints the server's resident memory and what /metrics says the store holds
and evicted.

    .venv/bin/python bench/memory_flood.py [--keys 3000000] [--binary target/release/shardgate]
                                           [-- serve arguments, e.g. --memory-max-bytes 64MiB]

The rule is the issue's: one bucket per `remote_address` on a `day` rule (100 a day), the
address a full IPv6 one; each call carries 64 new addresses, 32 calls in flight (the
flood of tests/python/test_memory_bound.py). Only 127.0.0.1 is contacted; the run is
bounded by --keys.
"""
import argparse
import pathlib
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))

from conftest import Server, free_port  # noqa: E402
from test_memory_bound import RULES, flood, memory_store, rss_bytes  # noqa: E402

STEP = 200_000
MAX_KEYS = 20_000_000


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=3_000_000)
    parser.add_argument("--binary", default=str(REPO / "target" / "release" / "shardgate"))
    parser.add_argument("serve_args", nargs="*")
    args = parser.parse_args()
    keys = min(args.keys, MAX_KEYS)
    work = pathlib.Path(tempfile.mkdtemp(prefix="memory-flood-"))
    config = work / "edge.yaml"
    config.write_text(RULES)
    port, http_port = free_port(), free_port()
    with open(work / "shardgate.log", "wb") as log:
        proc = subprocess.Popen(
            [args.binary, "serve", "--config", str(config), "--grpc-addr", f"127.0.0.1:{port}",
             "--http-addr", f"127.0.0.1:{http_port}", *args.serve_args],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    server = Server(proc, port, work / "shardgate.log", http_port=http_port)
    try:
        if not server.wait_ready():
            sys.exit(f"shardgate exited:\n{server.log()}")
        print(f"started: RSS {rss_bytes(server) / 2**20:.0f} MiB", flush=True)
        started = time.monotonic()
        for first in range(0, keys, STEP):
            flood(server, first, min(STEP, keys - first))
            m = memory_store(server)
            print(f"{first + STEP:>9} keys  RSS {rss_bytes(server) / 2**20:4.0f} MiB  "
                  f"items {m['items']:8.0f}  charged {m['bytes'] / 2**20:5.1f} MiB "
                  f"(bound {m['max_bytes'] / 2**20:.0f})  evicted active {m['active']:.0f} "
                  f"full {m['full']:.0f}  {time.monotonic() - started:4.0f} s", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
