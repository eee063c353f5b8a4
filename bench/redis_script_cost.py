#!/usr/bin/env python3
"""What one debit costs inside Redis's Lua: the Redis store's debit function
(`src/store/redis/lua/lib.lua`, as `debit.lua` and `debits.lua` call it) run N times in one
`EVAL`, timed by Redis's own clock, so neither the network nor the client is counted.

For judging a change to the scripts: run it on the working tree and on an older revision,
alternating, and compare the best of each.

    python3 bench/redis_script_cost.py [--rev REV] [--debits 40000] [--rounds 5]

Starts its own Redis (scripts/redis-local, a free loopback port), makes 1,000 items of one
limit and `wcu` (as the fast path finds them), debits them in turn on the fast path and
prints the best round's µs per debit. Every debit must be applied (else it stops and says
what the script answered). Bounded: --debits at most 1,000,000, --rounds at most 20.
"""
import argparse
import subprocess
import sys

from redis_peer import ROOT, free_port, redis_cli

LIB = "src/store/redis/lua/lib.lua"
ITEMS = 1000
BIG = "1000000000000"

# The items' fields, as the store writes them (codec.rs): a limit `rl` and the write
# budget, both far from empty so that every debit is applied.
FIELDS = ["rf", "1800000000000", "sc", "1", "ttl", "99999999999"]
for limit in ["rl", "wcu"]:
    FIELDS += [f"b:{limit}:tk", BIG, f"b:{limit}:cp", BIG, f"b:{limit}:ra", "1000",
               f"b:{limit}:rp", "1000", f"b:{limit}:tc", "0"]

# A fast-path debit of one token of `rl` (codec.rs, `debit_args`): now, shard count, no
# seed and no ttl, then the limit's eight.
DEBIT = ["1800000000", "1", "", "", "rl", "1000", "1000", "-1000", "9223372036854774807",
         BIG, "1000", "1000"]

DRIVER = """
local n = tonumber(KEYS[1])
local t0 = redis.call('TIME')
for i = 1, n do
  local done, answer = pcall(debit, 'item' .. (i % %ITEMS% + 1), ARGV, 0, #ARGV)
  if not done or answer[1] ~= 1 then return {'not applied', tostring(answer[1] or answer)} end
end
local t1 = redis.call('TIME')
return (t1[1] - t0[1]) * 1000000 + (t1[2] - t0[2])
""".replace("%ITEMS%", str(ITEMS))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", help="take lib.lua from this git revision (default: the working tree)")
    ap.add_argument("--debits", type=int, default=40_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if not 0 < args.debits <= 1_000_000 or not 0 < args.rounds <= 20:
        sys.exit("--debits must be 1..1000000 and --rounds 1..20")
    if args.rev:
        lib = subprocess.run(["git", "-C", str(ROOT), "show", f"{args.rev}:{LIB}"],
                             capture_output=True, text=True, check=True).stdout
    else:
        lib = (ROOT / LIB).read_text()
    port = free_port()
    redis = subprocess.Popen([str(ROOT / "scripts" / "redis-local"), "single", str(port)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        if redis.stdout.readline().strip() != b"ready":
            sys.exit("redis-local did not start")

        def cli(*a):
            return redis_cli(port, *a).strip()

        setup = f"for i = 1, {ITEMS} do redis.call('HSET', 'item' .. i, unpack(ARGV)) end"
        cli("EVAL", setup, "0", *FIELDS)
        best = None
        for _ in range(args.rounds):
            out = cli("EVAL", lib + DRIVER, "1", str(args.debits), *DEBIT)
            if not out.isdigit():
                sys.exit(f"a debit was not applied: {out[:200]}")
            best = int(out) if best is None else min(best, int(out))
        print(f"{best / args.debits:.2f} µs per debit inside the script "
              f"(best of {args.rounds} rounds of {args.debits}; lib.lua of {args.rev or 'the working tree'})")
    finally:
        redis.terminate()
        redis.wait(timeout=30)


if __name__ == "__main__":
    main()
