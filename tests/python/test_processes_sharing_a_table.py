"""Concurrency across processes (issue 6, item 2): three `shardgate serve --store dynamodb`
processes share one DynamoDB table and one hot bucket while its shard count doubles (a
low `--partition-write-budget` makes a few dozen writes per second a hot partition)
and while every server's config is reloaded again and again.

Checked after a bounded run:
- no debit lost: the consumed counter `tc` summed over every shard of the bucket (read
  with `shardgate inspect`) equals the hits the servers admitted;
- the limit holds: admitted ≤ capacity + rate × elapsed + the doubling transient (a new
  shard starts full with its share, so each doubling may lend up to half the capacity
  once: capacity/2 per doubling);
- the bucket doubled at least once, never to a count whose share is less than one request,
  and every server reloaded its config several times.

Needs DynamoDB Local: SHARDGATE_TEST_DYNAMODB_ENDPOINT (scripts/test starts one). Without
it the test fails: a skipped DynamoDB test would prove nothing.
"""
import json
import os
import subprocess
import threading
import time
import uuid

import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2

from conftest import binary

ENDPOINT = os.environ.get("SHARDGATE_TEST_DYNAMODB_ENDPOINT")
TABLE = "shardgate_process_tests"
# Far below what 18 clients offer even against a cold DynamoDB Local on a busy machine
# (≈130 decisions/s), so that the bound is tested: at 120/s the clients sometimes never
# ran the bucket dry.
CAPACITY = 30
RATE = 30  # tokens per second
# Writes per second one shard absorbs: the admitted 30/s, and the bursts of each fresh
# shard's share, double the bucket (to 8–16 shards in the runs seen).
WRITE_BUDGET = 10
CLIENTS_PER_SERVER = 6
RUN_S = 6.0

CONFIG = """\
domain: conc
descriptors:
  - key: user
    rate_limit: {{unit: second, requests_per_unit: {rate}, burst: {capacity}}}
  - key: other
    rate_limit: {{unit: minute, requests_per_unit: {other}}}
"""


def request():
    return rls_pb2.RateLimitRequest(
        domain="conc",
        descriptors=[ratelimit_pb2.RateLimitDescriptor(
            entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="user", value="hot")])])


# DynamoDB Local accepts any credentials; the SDK needs some.
AWS_ENV = {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"}


def cli(*args):
    done = subprocess.run([binary(), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **AWS_ENV})
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def test_processes_share_one_bucket_during_doubling_and_reloads(shardgate, tmp_path):
    if not ENDPOINT:
        pytest.fail("SHARDGATE_TEST_DYNAMODB_ENDPOINT is not set (scripts/test starts "
                    "DynamoDB Local and sets it)")
    namespace = f"procs-{uuid.uuid4().hex[:8]}"
    store = ["--table", TABLE, "--dynamodb-endpoint", ENDPOINT, "--region", "us-east-1"]
    cli("table", "create", *store)
    env = AWS_ENV
    configs, servers = [], []
    for i in range(3):
        path = tmp_path / f"procs{i}.yaml"
        path.write_text(CONFIG.format(rate=RATE, capacity=CAPACITY, other=1))
        configs.append(path)
        servers.append(shardgate(
            config=path, store="dynamodb", env=env,
            args=[*store, "--namespace", namespace, "--store-timeout", "2s",
                  "--partition-write-budget", str(WRITE_BUDGET)]))

    admitted = [0] * (3 * CLIENTS_PER_SERVER)
    refused = [0] * (3 * CLIENTS_PER_SERVER)
    errors = []
    stop = threading.Event()

    def client(slot, server):
        req = request()
        for _ in range(100_000):  # bounded; the run ends by time long before
            if stop.is_set():
                return
            try:
                r = server.should_rate_limit(req)
            except Exception as e:  # noqa: BLE001 - any RPC failure fails the test
                errors.append(repr(e))
                return
            if r.overall_code == rls_pb2.RateLimitResponse.OK:
                admitted[slot] += 1
            else:
                refused[slot] += 1

    def reloader():
        # Rewrite every server's file with another rule changed (the hot rule's parameters
        # stay, so its bound stays): each write is a new config to load.
        n = 0
        while not stop.is_set() and n < 200:
            n += 1
            for path in configs:
                path.write_text(CONFIG.format(rate=RATE, capacity=CAPACITY, other=n + 1))
            stop.wait(0.25)

    threads = [threading.Thread(target=client, args=(i * CLIENTS_PER_SERVER + j, s))
               for i, s in enumerate(servers) for j in range(CLIENTS_PER_SERVER)]
    threads.append(threading.Thread(target=reloader))
    started = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(RUN_S)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    elapsed = time.monotonic() - started
    assert not errors, errors[:5]

    shards = json.loads(cli("inspect", *store, "--namespace", namespace,
                            "--entity", "user=hot", "--resource", "conc"))
    existing = [s for s in shards["shards"] if s["exists"]]
    total_tc = sum(s["limits"]["rl"]["tc"] for s in existing)
    count = max(s["shard_count"] for s in existing)
    hits = sum(admitted)

    assert total_tc == hits * 1000, (
        f"Σtc over {len(existing)} shards = {total_tc} millitokens, admitted {hits} hits")
    doublings = max(count.bit_length() - 1, 0)
    bound = CAPACITY + RATE * elapsed + doublings * CAPACITY / 2
    assert hits <= bound, (hits, bound, count)
    assert count >= 2, f"no doubling: {hits} admitted, {sum(refused)} refused in {elapsed:.1f} s"
    # No doubling past the point where a shard's share is less than one request (30 over
    # 32 shards): it would refuse every request on every shard from then on.
    assert CAPACITY // count >= 1, (count, hits)
    assert sum(refused) > 0, (
        f"the clients must offer more than the limit for the bound to mean anything: "
        f"{hits} admitted, none refused in {elapsed:.1f} s")
    for s in servers:
        loads = s.metrics().value("shardgate_config_load_success_total")
        assert loads >= 4, ("reloads seen by a server", loads)
        assert s.proc.poll() is None
    print(f"admitted {hits}, refused {sum(refused)} in {elapsed:.1f} s over {count} shards; "
          f"bound {bound:.0f}")
