"""Concurrency across processes (issue 6, item 2): three `shardgate serve` processes share
one store — a DynamoDB table, one Redis server and a three-master Redis Cluster (issue 29) —
and one hot
bucket while its shard count doubles (a low `--partition-write-budget` makes a few dozen
writes per second a hot partition) and while every server's config is reloaded again and
again. On the Cluster, the hot bucket's calls spread over all three masters once it has
doubled (`INFO commandstats` of each).

Checked after a bounded run:
- no debit lost: the consumed counter `tc` summed over every shard of the bucket (read
  with `shardgate inspect`) equals the hits the servers admitted;
- the limit holds: admitted ≤ capacity + rate × elapsed, doublings included (a doubling
  splits a shard's balance between the shards it creates, never mints: issue 50);
- the bucket doubled at least once, never to a count whose share is less than one request,
  and every server reloaded its config several times.

Needs DynamoDB Local (SHARDGATE_TEST_DYNAMODB_ENDPOINT), a Redis server
(SHARDGATE_TEST_REDIS_URL) and a Redis Cluster (SHARDGATE_TEST_REDIS_CLUSTER): scripts/test
starts them. Without them the tests fail: a
skipped store test would prove nothing.
"""
import json
import signal
import os
import subprocess
import threading
import time
import uuid

import grpc
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2

from conftest import binary

ENDPOINT = os.environ.get("SHARDGATE_TEST_DYNAMODB_ENDPOINT")
CLUSTER = os.environ.get("SHARDGATE_TEST_REDIS_CLUSTER")
REDIS = os.environ.get("SHARDGATE_TEST_REDIS_URL")
TABLE = "shardgate_process_tests"
STORES = ["dynamodb", "redis", "redis-cluster"]


class SharedStore:
    """How the servers and `shardgate inspect` reach one of the shared stores, in a
    namespace of the test's own."""

    def __init__(self, kind, namespace):
        self.kind = kind
        self.namespace = namespace
        if kind == "dynamodb":
            if not ENDPOINT:
                pytest.fail("SHARDGATE_TEST_DYNAMODB_ENDPOINT is not set (scripts/test "
                            "starts DynamoDB Local and sets it)")
            self.store = "dynamodb"
            self.args = ["--table", TABLE, "--dynamodb-endpoint", ENDPOINT,
                         "--region", "us-east-1", "--namespace", namespace]
            cli("table", "create", "--table", TABLE, "--dynamodb-endpoint", ENDPOINT,
                "--region", "us-east-1")
        elif kind == "redis":
            if not REDIS:
                pytest.fail("SHARDGATE_TEST_REDIS_URL is not set (scripts/test starts a "
                            "Redis server and sets it)")
            self.store = "redis"
            self.args = ["--redis-url", REDIS, "--namespace", namespace]
        else:
            if not CLUSTER:
                pytest.fail("SHARDGATE_TEST_REDIS_CLUSTER is not set (scripts/test starts "
                            "a Redis Cluster and sets it)")
            self.store = "redis"
            self.args = ["--redis-url", CLUSTER, "--redis-mode", "cluster",
                         "--namespace", namespace]

    def inspect(self, entity):
        return json.loads(cli("inspect", "--store", self.store, *self.args,
                              "--entity", entity, "--resource", "conc"))

    def masters(self):
        """The Cluster's masters as (host, port)."""
        return [tuple(u.removeprefix("redis://").rsplit(":", 1)) for u in CLUSTER.split(",")]

    def master_of(self, entity, shard):
        """The (host, port) of the master holding a shard's key."""
        host, port = self.masters()[0]
        key = f"{{}}{self.namespace}/BUCKET#{entity}#conc#{shard}"
        slot = int(redis_cli(host, port, "CLUSTER", "KEYSLOT", key))
        for line in redis_cli(host, port, "CLUSTER", "NODES").splitlines():
            fields = line.split()
            if "master" not in fields[2]:
                continue
            for r in fields[8:]:
                lo, _, hi = r.partition("-")
                if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                    addr = fields[1].split("@")[0]
                    return tuple(addr.rsplit(":", 1))
        raise AssertionError(f"no master serves slot {slot}")

    def reset_call_counts(self):
        for host, port in self.masters():
            redis_cli(host, port, "CONFIG", "RESETSTAT")

    def script_calls(self):
        """`evalsha` calls each master ran since `reset_call_counts`."""
        calls = []
        for host, port in self.masters():
            stats = redis_cli(host, port, "INFO", "commandstats")
            line = next((l for l in stats.splitlines() if l.startswith("cmdstat_evalsha:")), "")
            calls.append(int(line.split("calls=")[1].split(",")[0]) if line else 0)
        return calls


def redis_cli(host, port, *args):
    done = subprocess.run(["redis-cli", "-h", host, "-p", port, *args], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout
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


def run_clients(servers, requests, run_s, max_rounds, beside=(), until=None, max_s=None):
    """CLIENTS_PER_SERVER client threads per server, each sending `requests` in turn until
    `run_s` has passed (and at most `max_rounds` rounds); each `beside(stop)` runs in a
    thread of its own meanwhile. With `until(admitted, refused)`, the run goes on past
    `run_s` until it holds, for at most `max_s` in all: a slow machine offers fewer calls
    per second, and is given the time to offer what the test needs.

    A call refused with UNAVAILABLE (its store call missed the deadline on an overloaded
    machine) is counted in `unanswered`; any other RPC failure fails the test. Returns
    (admitted, refused, unanswered, elapsed): per request index, a count per client slot
    (server i's clients are slots i * CLIENTS_PER_SERVER …)."""
    slots = len(servers) * CLIENTS_PER_SERVER
    admitted = [[0] * slots for _ in requests]
    refused = [[0] * slots for _ in requests]
    unanswered = [[0] * slots for _ in requests]
    errors = []
    stop = threading.Event()

    def client(slot, server):
        for _ in range(max_rounds):  # bounded; the run ends by time long before
            if stop.is_set():
                return
            for k, req in enumerate(requests):
                try:
                    r = server.should_rate_limit(req)
                except grpc.RpcError as e:
                    if e.code() == grpc.StatusCode.UNAVAILABLE:
                        unanswered[k][slot] += 1
                        continue
                    errors.append(repr(e))
                    return
                except Exception as e:  # noqa: BLE001 - any other failure fails the test
                    errors.append(repr(e))
                    return
                if r.overall_code == rls_pb2.RateLimitResponse.OK:
                    admitted[k][slot] += 1
                else:
                    refused[k][slot] += 1

    threads = [threading.Thread(target=client, args=(i * CLIENTS_PER_SERVER + j, s))
               for i, s in enumerate(servers) for j in range(CLIENTS_PER_SERVER)]
    threads += [threading.Thread(target=f, args=(stop,)) for f in beside]
    started = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(run_s)
    while until is not None and not until(admitted, refused) \
            and time.monotonic() - started < (max_s or run_s):
        time.sleep(0.25)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    elapsed = time.monotonic() - started
    assert not errors, errors[:5]
    return admitted, refused, unanswered, elapsed


def check_unanswered(unanswered, admitted, refused):
    """A few calls may miss their store deadline on an overloaded machine (each is that
    call's UNAVAILABLE, never an outage): at most 2 % of them, or the run shows a fault."""
    lost, answered = sum(map(sum, unanswered)), sum(map(sum, admitted)) + sum(map(sum, refused))
    assert lost <= 0.02 * (answered + lost), (
        f"{lost} calls unanswered of {answered + lost}: more than a slow store explains")
    return lost


def check_consumed(total_tc, hits, lost, what):
    """Σtc is exactly the admitted hits when every call was answered. A call whose store
    write landed after its deadline was answered UNAVAILABLE but took its token, so with
    `lost` such calls Σtc lies between hits and hits + lost."""
    assert hits * 1000 <= total_tc <= (hits + lost) * 1000, (
        f"{what}: Σtc = {total_tc} millitokens, admitted {hits} hits, {lost} unanswered")


@pytest.mark.parametrize("kind", STORES)
def test_processes_share_one_bucket_during_doubling_and_reloads(shardgate, tmp_path, kind):
    shared = SharedStore(kind, f"procs-{uuid.uuid4().hex[:8]}")
    if kind == "redis-cluster":
        # A namespace whose first shards of the hot bucket lie on three masters (which
        # masters a key's slot falls on depends on the namespace in it).
        for _ in range(500):
            if len({shared.master_of("user=hot", s) for s in range(3)}) == 3:
                break
            shared = SharedStore(kind, f"procs-{uuid.uuid4().hex[:8]}")
        shared.reset_call_counts()
    env = AWS_ENV
    configs, servers = [], []
    for i in range(3):
        path = tmp_path / f"procs{i}.yaml"
        path.write_text(CONFIG.format(rate=RATE, capacity=CAPACITY, other=1))
        configs.append(path)
        servers.append(shardgate(
            config=path, store=shared.store, env=env,
            args=[*shared.args, "--store-timeout", "2s",
                  "--partition-write-budget", str(WRITE_BUDGET)]))

    def reloader(stop):
        # Rewrite every server's file with another rule changed (the hot rule's parameters
        # stay, so its bound stays): each write is a new config to load.
        n = 0
        while not stop.is_set() and n < 200:
            n += 1
            for path in configs:
                path.write_text(CONFIG.format(rate=RATE, capacity=CAPACITY, other=n + 1))
            stop.wait(0.25)

    def enough(admitted, refused):
        return sum(refused[0]) > 0  # the clients ran the bucket dry at least once

    (admitted,), (refused,), (unanswered,), elapsed = run_clients(
        servers, [request()], RUN_S, 100_000, beside=[reloader], until=enough,
        max_s=4 * RUN_S)
    lost = check_unanswered([unanswered], [admitted], [refused])

    shards = shared.inspect("user=hot")
    existing = [s for s in shards["shards"] if s["exists"]]
    total_tc = sum(s["limits"]["rl"]["tc"] for s in existing)
    count = max(s["shard_count"] for s in existing)
    hits = sum(admitted)

    check_consumed(total_tc, hits, lost, f"{len(existing)} shards")
    # On every store, the Cluster included: there a split lands slot by slot
    # (redis/spread.rs), and a shard it gives up found missing before its create lands is
    # created as if empty since the raise, never full (issue 50: one CI run admitted 218
    # where 213 fit before that).
    bound = CAPACITY + RATE * elapsed
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
    spread = ""
    if kind == "redis-cluster":
        # The doubled bucket's shards are keys on slots of their own: its calls reach
        # every master, not the one node that holds shard 0.
        calls = dict(zip(shared.masters(), shared.script_calls()))
        spread = f"; script calls per master {list(calls.values())}"
        holding = {shared.master_of("user=hot", s) for s in range(count)}
        assert len(holding) >= 2, holding
        for master in holding:
            assert calls[master] > 0, (master, calls)
    print(f"{kind}: admitted {hits}, refused {sum(refused)} in {elapsed:.1f} s over {count} "
          f"shards; bound {bound:.0f}{spread}")


# ----------------------------------------------------------------------------------------
# Token leases (issue 18): three servers with default flags (leases on, as on DynamoDB by
# default) on one bucket large enough to be leased and limited below what they are offered.

LEASE_CAPACITY = 200  # an eighth of it is 25 tokens: a lease of several requests
LEASE_RATE = 50  # tokens per second: about a third of what the clients offer
LEASE_RUN_S = 5.0


ROOMY = 1_000_000  # per minute: a second bucket that never runs dry


def roomy_request():
    return rls_pb2.RateLimitRequest(
        domain="conc",
        descriptors=[ratelimit_pb2.RateLimitDescriptor(
            entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="other", value="x")])])


def bucket_tc(shared, entity):
    shards = shared.inspect(entity)
    existing = [s for s in shards["shards"] if s["exists"]]
    return sum(s["limits"]["rl"]["tc"] for s in existing), len(existing)


@pytest.mark.parametrize("kind", STORES)
def test_three_servers_with_leases_keep_the_bound_and_count_every_token(shardgate, tmp_path,
                                                                        kind):
    """On the limited bucket, Σ admitted ≤ capacity + rate × elapsed (leases take tokens
    before use, so the bound is the one without leases). Every client also uses a second
    bucket that never runs dry, whose leases are still outstanding when all three servers
    stop with SIGTERM. Afterwards Σ`tc` over each bucket's shards is exactly the tokens
    admitted on it: every unused lease went back."""
    shared = SharedStore(kind, f"leases-{uuid.uuid4().hex[:8]}")
    path = tmp_path / "leases.yaml"
    path.write_text(CONFIG.format(rate=LEASE_RATE, capacity=LEASE_CAPACITY, other=ROOMY))
    servers = [shardgate(config=path, store=shared.store, env=AWS_ENV, args=shared.args)
               for _ in range(3)]

    def enough(admitted, refused):
        return sum(refused[0]) > 0  # the clients offered more than the limit

    (admitted, roomy_admitted), (refused, roomy_refused), unanswered, elapsed = run_clients(
        servers, [request(), roomy_request()], LEASE_RUN_S, 1_000_000, until=enough,
        max_s=4 * LEASE_RUN_S)
    lost = check_unanswered(unanswered, [admitted, roomy_admitted], [refused, roomy_refused])

    seen = [s.metrics() for s in servers]
    taken = [m.value("shardgate_leases_taken_total") for m in seen]
    from_lease = [m.value("shardgate_lease_decisions_total") for m in seen]
    outstanding = sum(m.value("shardgate_lease_tokens_outstanding") for m in seen)
    for s in servers:
        s.proc.send_signal(signal.SIGTERM)
    for s in servers:
        assert s.proc.wait(timeout=20) == 0, s.log()[-2000:]
        assert "leases given back" in s.log(), s.log()[-2000:]

    total_tc, n_shards = bucket_tc(shared, "user=hot")
    roomy_tc, _ = bucket_tc(shared, "other=x")
    hits = sum(admitted)
    per_server = [sum(admitted[i * CLIENTS_PER_SERVER:(i + 1) * CLIENTS_PER_SERVER])
                  for i in range(3)]
    report = (f"{kind}: admitted {hits} {per_server}, refused {sum(refused)} in {elapsed:.1f} s; "
              f"leases taken {taken}, decisions from leases {from_lease}, "
              f"{outstanding:.0f} tokens outstanding at SIGTERM; roomy bucket {sum(roomy_admitted)}; "
              f"{lost} unanswered")
    print(report)
    assert sum(taken) > 0 and sum(from_lease) > 0, report
    assert outstanding > 0, f"no lease was outstanding at SIGTERM: {report}"
    assert sum(roomy_refused) == 0, roomy_refused
    assert sum(refused) > 0, f"the clients must offer more than the limit: {report}"
    assert hits <= LEASE_CAPACITY + LEASE_RATE * elapsed, report
    check_consumed(total_tc, hits, sum(unanswered[0]), f"{n_shards} shards; {report}")
    check_consumed(roomy_tc, sum(roomy_admitted), sum(unanswered[1]), f"roomy; {report}")


# ----------------------------------------------------------------------------------------
# Issue 50: two leasing servers on a bucket that doubles under their load. Once in four
# tries a run admitted 8,960 where 8,821 fit, because a doubling created its new shards
# full while the shard they split from kept (or had lent) its balance. Each run starts on
# a fresh bucket; the second keeps both cores busy with two other processes, so that the
# servers' store calls, lease fetches and doublings interleave as they do on a loaded node.

# Per store: the bucket's rate (its burst the same) and the writes per second one shard
# absorbs before the bucket doubles. DynamoDB Local answers a few hundred writes a second
# on this machine: a bucket of 100 it runs dry even on busy cores, doubling at 20 writes a
# second to 4–8 shards. Redis is offered 600–1,000 calls a second by these clients (fewer
# while other processes keep both cores busy, and on a loaded CI machine: a bucket of 400
# still runs dry): at 20 writes a second it would double to 32 shards at once, whose
# shares (13 tokens) are too small for a lease; at 100 it stops at 4–8 shards, where
# leases are taken. A run that has refused nothing yet goes on (up to three times as
# long): the bound means something only once the clients offer more than it.
DOUBLING = {"dynamodb": (100, 20), "redis": (400, 100), "redis-cluster": (400, 100)}
DOUBLING_RUN_S = 5.0
BURNER = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\n"


def cpu_burners(seconds):
    """Two processes that keep both cores busy for `seconds` (bounded by time)."""
    return [subprocess.Popen(["python3", "-c", BURNER.format(s=seconds)]) for _ in range(2)]


@pytest.mark.parametrize("kind", STORES)
def test_two_leasing_servers_doubling_admit_no_more_than_the_bucket_holds(shardgate, tmp_path,
                                                                          kind):
    """The issue's scenario with default flags but the write budget: two servers, leases
    on, one bucket of RATE per second with a burst of RATE, doubling under the clients'
    load. Every run: admitted ≤ capacity + rate × elapsed, and Σtc over the shards holds
    every admitted hit (no debit lost; more only by lease returns dropped or clipped,
    tokens lost, never minted)."""
    rate, write_budget = DOUBLING[kind]
    seen = []
    for run, busy in enumerate([False, True]):
        shared = SharedStore(kind, f"dbl-{uuid.uuid4().hex[:8]}")
        path = tmp_path / f"doubling{run}.yaml"
        path.write_text(CONFIG.format(rate=rate, capacity=rate, other=ROOMY))
        servers = [shardgate(config=path, store=shared.store, env=AWS_ENV,
                             args=[*shared.args, "--partition-write-budget",
                                   str(write_budget)])
                   for _ in range(2)]
        burners = cpu_burners(3 * DOUBLING_RUN_S + 2) if busy else []
        try:
            (admitted,), (refused,), (unanswered,), elapsed = run_clients(
                servers, [request()], DOUBLING_RUN_S, 1_000_000,
                until=lambda admitted, refused: sum(refused[0]) > 0, max_s=3 * DOUBLING_RUN_S)
        finally:
            for b in burners:
                b.kill()
                b.wait()
        lost = check_unanswered([unanswered], [admitted], [refused])
        metrics = [s.metrics() for s in servers]
        taken = sum(m.value("shardgate_leases_taken_total") for m in metrics)
        doublings = sum(m.value("shardgate_shard_doublings_total") for m in metrics)
        dropped = sum(m.value("shardgate_lease_returns_dropped_total") for m in metrics)
        for s in servers:
            s.proc.send_signal(signal.SIGTERM)
        for s in servers:
            assert s.proc.wait(timeout=20) == 0, s.log()[-2000:]
        hits = sum(admitted)
        bound = rate + rate * elapsed
        # Read before any assertion, so that a run over the bound also says whether the
        # store counted every admitted token (a minted token) or not (a lost debit).
        total_tc, n_shards = bucket_tc(shared, "user=hot")
        report = (f"{kind} run {run}{' (cores busy)' if busy else ''}: admitted {hits}, "
                  f"bound {bound:.2f}, refused {sum(refused)}, {lost} unanswered in "
                  f"{elapsed:.3f} s; leases taken {taken:.0f}, doublings {doublings:.0f}, "
                  f"lease returns dropped {dropped:.0f}; Σtc {total_tc} millitokens over "
                  f"{n_shards} shards")
        print(report)
        seen.append((taken, doublings))
        assert sum(refused) > 0, f"the clients must offer more than the limit: {report}"
        assert hits <= bound, report
        # No debit lost: every admitted token is in `tc`. More than admitted only as tokens
        # lost, never minted: a lease return that met its shard doubled is dropped, one
        # clipped at a shard's ceiling is applied in part (docs/configuration.md,
        # "Accounting").
        assert hits * 1000 <= total_tc, report
        print(f"  {total_tc - hits * 1000} millitokens taken but not admitted")
    # The runs tested what they are for: leases were taken and the bucket doubled.
    assert sum(t for t, _ in seen) > 0, seen
    assert sum(d for _, d in seen) > 0, seen
