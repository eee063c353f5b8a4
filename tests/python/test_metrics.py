"""Prometheus metrics (issue 5): every metric `GET /metrics` exports, asserted after a known
workload. Each test starts its own server; where a test has several steps, counters are
compared as differences between scrapes around each step.

The exposition is parsed strictly (conftest.Metrics): OpenMetrics text, `# EOF`, every
sample in a family declared by `# TYPE`, counters sampled as `<family>_total`.
"""
import time

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2

from test_independent_client import desc, request

OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT

P = "shardgate_"

RULES = """
domain: m
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 7, name: user_rpm}
  - key: tier
    value: gold
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        value: GET
        rate_limit: {unit: minute, requests_per_unit: 100}
  - key: leafonly
    descriptors:
      - key: method
        value_to_metric: true
        rate_limit: {unit: minute, requests_per_unit: 100}
  - key: svc
    value: "api-*"
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 1, name: a_rpm}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 100, name: b_rph}
  - key: hot
    rate_limit: {unit: second, requests_per_unit: 1000, name: hot_rps}
"""

RULE_COUNTERS = ["total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode"]
ENGINE_COUNTERS = ["fast_path_hits", "fast_path_refusals", "rejection_cache_hits", "slow_paths",
                   "slow_passes_followed", "shard_retries", "shard_doublings",
                   "shard_doublings_declined_at_max", "shard_doublings_declined_small_share",
                   "per_shard_ceiling_rejections", "consumption_only_retries", "refunds",
                   "contended_refusals"]
ROUND_TRIP_S = 1.1  # past the rejection cache's 1 s trust in a refused image


class Rpcs:
    """Sends ShouldRateLimit calls and counts them (whatever their outcome)."""

    def __init__(self, server):
        self.server = server
        self.sent = 0

    def __call__(self, req):
        self.sent += 1
        return self.server.should_rate_limit(req)


def engine_family(metrics, family):
    """The engine's families, under `shardgate_<name>` like every other metric."""
    return P + family


def engine(metrics, counter):
    return metrics.value(engine_family(metrics, counter) + "_total")


def diff_engine(before, after, counter):
    return engine(after, counter) - engine(before, counter)


def rule(metrics, counter, key, domain="m"):
    return metrics.get(f"{P}rate_limit_{counter}_total", 0.0, domain=domain, key=key)


def rule_counts(metrics, key):
    return {c: rule(metrics, c, key) for c in RULE_COUNTERS}


def diff(before, after, name, **labels):
    return after.get(name, 0.0, **labels) - before.get(name, 0.0, **labels)


def test_exposition_format_families_and_types(shardgate):
    server = shardgate(RULES)
    fresh = server.metrics()
    # A fresh server: config loaded once, nothing else happened yet. (Labelled families
    # appear with their first series.)
    assert fresh.value(P + "config_load_success_total") == 1
    assert fresh.value(P + "config_load_error_total") == 0
    assert fresh.value(P + "domain_not_found_total") == 0
    assert fresh.value(P + "requests_in_flight") == 0
    assert fresh.value(P + "rejection_cache_entries") == 0
    _, count, _ = fresh.histogram(P + "request_duration_seconds")
    assert count == 0
    for c in ENGINE_COUNTERS:
        assert engine(fresh, c) == 0, c
    assert fresh.series(engine_family(fresh, "bucket_shards")) == []

    for _ in range(3):  # 2/min in shadow mode: within, within and near, over and shadow
        r = server.should_rate_limit(request("m", desc(("shadow", "x"))))
        assert r.overall_code == OK
    status, ctype, text = server.http("GET", "/metrics")
    assert status == 200
    assert ctype.startswith("application/openmetrics-text"), ctype
    m = server.metrics()
    expected = {
        **{f"rate_limit_{c}": "counter" for c in RULE_COUNTERS},
        "domain_not_found": "counter",
        "global_shadow_mode": "counter",
        "config_load_success": "counter",
        "config_load_error": "counter",
        "config_info": "gauge",
        "store_calls": "counter",
        "store_call_duration_seconds": "histogram",
        "request_duration_seconds": "histogram",
        "requests_in_flight": "gauge",
        "rejection_cache_entries": "gauge",
    }
    missing = {P + f: t for f, t in expected.items() if m.type_of(P + f) != t}
    missing.update({c: "counter" for c in ENGINE_COUNTERS
                    if m.type_of(engine_family(m, c)) != "counter"})
    assert not missing, f"families missing or mistyped: {missing}; declared: {sorted(m.types)}"
    # Counters are sampled as <family>_total only.
    for (name, _), _ in m.samples.items():
        family = m._family(name)
        if m.type_of(family) == "counter":
            assert name == family + "_total", name


def test_engine_metric_names_carry_the_prefix_once(shardgate):
    """Observed: `shardgate_shardgate_shard_doublings_total` and the like. The engine's
    collector names already start with `shardgate_` and the registry prefixes again."""
    server = shardgate(RULES)
    m = server.metrics()
    doubled = sorted(f for f in m.types if f.startswith("shardgate_shardgate_"))
    assert doubled == [], f"doubly prefixed families: {doubled}"
    for c in ENGINE_COUNTERS:
        assert m.type_of(P + c) == "counter", c


def test_help_texts_end_with_one_full_stop(shardgate):
    """Observed: `# HELP shardgate_rate_limit_total_hits Hits of a rule (descriptors × hits)..`
    — the registry appends a '.' to help texts that already end with one."""
    server = shardgate(RULES)
    _, _, text = server.http("GET", "/metrics")
    doubled = [l for l in text.splitlines() if l.startswith("# HELP") and l.endswith("..")]
    assert doubled == [], "\n".join(doubled)


def test_rule_counters_config_info_and_request_metrics_after_a_known_workload(shardgate):
    server = shardgate(RULES)
    rpc = Rpcs(server)
    m0 = server.metrics()

    # 10 requests to a 7/min rule: 7 admitted, 3 refused. Near limit (≥ 80 % of the
    # capacity used after the hit): the 6th (6/7) and 7th; not the 5th (5/7 = 71 %).
    codes = [rpc(request("m", desc(("user", "alice")))).overall_code for _ in range(10)]
    assert codes == [OK] * 7 + [OVER_LIMIT] * 3
    m1 = server.metrics()
    assert rule_counts(m1, "m.user") == {
        "total_hits": 10, "within_limit": 7, "over_limit": 3, "near_limit": 2, "shadow_mode": 0}

    # hits_addend counts as that many hits: 3 hits, then 98 of 100 (not admitted).
    assert rpc(request("m", desc(("tier", "gold"), hits=3))).overall_code == OK
    assert rpc(request("m", desc(("tier", "gold"), hits=98))).overall_code == OVER_LIMIT
    m2 = server.metrics()
    assert rule_counts(m2, "m.tier_gold") == {
        "total_hits": 101, "within_limit": 3, "over_limit": 98, "near_limit": 0, "shadow_mode": 0}

    # Shadow mode, 2/min: 4 requests all answered OK; 2 over the limit let through.
    for _ in range(4):
        r = rpc(request("m", desc(("shadow", "x"))))
        assert (r.overall_code, r.statuses[0].code) == (OK, OK)
    m3 = server.metrics()
    assert rule_counts(m3, "m.shadow") == {
        "total_hits": 4, "within_limit": 2, "over_limit": 2, "near_limit": 1, "shadow_mode": 2}

    # detailed_metric: the request's own values; value_to_metric, node by node as
    # envoyproxy/ratelimit decides it: the request's value at a flagged key-only or
    # wildcard node, a literal value kept, an unflagged key-only node its key alone.
    for user in ["alice", "alice", "bob"]:
        assert rpc(request("m", desc(("detailed", user)))).overall_code == OK
    assert rpc(request("m", desc(("route", "r1"), ("method", "GET")))).overall_code == OK
    assert rpc(request("m", desc(("route", "r2"), ("method", "GET")))).overall_code == OK
    assert rpc(request("m", desc(("svc", "api-users")))).overall_code == OK
    assert rpc(request("m", desc(("leafonly", "x"), ("method", "PUT")))).overall_code == OK
    m4 = server.metrics()
    assert rule(m4, "total_hits", "m.detailed_alice") == 2
    assert rule(m4, "total_hits", "m.detailed_bob") == 1
    assert rule(m4, "total_hits", "m.route_r1.method_GET") == 1
    assert rule(m4, "total_hits", "m.route_r2.method_GET") == 1
    assert rule(m4, "total_hits", "m.svc_api-users") == 1
    assert rule(m4, "total_hits", "m.leafonly.method_PUT") == 1
    keys = {l["key"] for l, _ in m4.series(P + "rate_limit_total_hits_total")}
    assert not keys & {"m.detailed", "m.route.method_GET", "m.svc_api-*",
                       "m.leafonly_x.method_PUT"}, keys

    # Unknown domain: answered OK, counted, no rule counter.
    for _ in range(3):
        assert rpc(request("nope", desc(("user", "alice")))).overall_code == OK
    # A malformed request is answered (INVALID_ARGUMENT) and timed like any other.
    try:
        rpc(request("", desc(("user", "alice"))))
        raise AssertionError("an empty domain must be refused")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    m5 = server.metrics()
    assert diff(m0, m5, P + "domain_not_found_total") == 3
    assert {l["domain"] for l, _ in m5.series(P + "rate_limit_total_hits_total")} == {"m"}
    # Every label set counts hits = within + over, shadow ≤ over, near ≤ within.
    for labels, total in m5.series(P + "rate_limit_total_hits_total"):
        c = rule_counts(m5, labels["key"])
        assert c["within_limit"] + c["over_limit"] == total, (labels, c)
        assert c["shadow_mode"] <= c["over_limit"] and c["near_limit"] <= c["within_limit"], c

    # Request latency: one observation per ShouldRateLimit call; none in flight now.
    buckets, count, total = m5.histogram(P + "request_duration_seconds")
    assert count == rpc.sent == 27
    assert 0 < total < 5 * count, total
    assert m5.value(P + "requests_in_flight") == 0

    # The config: loaded once, no errors, its hash the one /rlconfig shows.
    _, _, rlconfig = server.http("GET", "/rlconfig")
    hash_ = rlconfig.splitlines()[0].removeprefix("config hash: ")
    assert len(hash_) == 16 and int(hash_, 16) >= 0, hash_
    assert m5.series(P + "config_info") == [({"hash": hash_}, 1.0)]
    assert m5.value(P + "config_load_success_total") == 1
    assert m5.value(P + "config_load_error_total") == 0


def test_store_calls_and_their_latency_histogram_by_operation(shardgate):
    server = shardgate(RULES)
    m0 = server.metrics()
    # A new bucket: one fast debit, which creates it (the memory store creates a missing
    # shard with its debit): no read, no commit, no slow path.
    assert server.should_rate_limit(request("m", desc(("user", "carol")))).overall_code == OK
    m1 = server.metrics()
    calls = lambda m, op, out: m.get(P + "store_calls_total", 0.0, operation=op, outcome=out)
    assert calls(m1, "debit", "applied") - calls(m0, "debit", "applied") == 1
    assert calls(m1, "debit", "missing") - calls(m0, "debit", "missing") == 0
    assert calls(m1, "read", "ok") - calls(m0, "read", "ok") == 0
    assert calls(m1, "commit", "committed") - calls(m0, "commit", "committed") == 0
    assert diff_engine(m0, m1, "slow_paths") == 0
    # An existing bucket: one conditional debit, nothing else.
    for _ in range(4):
        assert server.should_rate_limit(request("m", desc(("user", "carol")))).overall_code == OK
    m2 = server.metrics()
    assert calls(m2, "debit", "applied") - calls(m1, "debit", "applied") == 4
    assert diff_engine(m1, m2, "fast_path_hits") == 4
    assert sum(v for _, v in m2.series(P + "store_calls_total")) - \
        sum(v for _, v in m1.series(P + "store_calls_total")) == 4
    # /healthcheck/store probes the store with a read; /healthcheck (readiness) does not.
    assert server.http("GET", "/healthcheck")[0] == 200
    assert server.http("GET", "/healthcheck/store")[0] == 200
    m3 = server.metrics()
    assert calls(m3, "read", "ok") - calls(m2, "read", "ok") == 1

    # The histogram of each operation counts exactly that operation's calls.
    ops = {l["operation"] for l, _ in m3.series(P + "store_calls_total")}
    assert {"debit", "read"} <= ops, ops
    for op in ops:
        _, count, total = m3.histogram(P + "store_call_duration_seconds", operation=op)
        assert count == m3.sum(P + "store_calls_total", operation=op), op
        assert 0 <= total < count * 1.0, (op, total)
    outcomes = {(l["operation"], l["outcome"]) for l, _ in m3.series(P + "store_calls_total")}
    known = {("debit", "applied"), ("debit", "refused"), ("debit", "missing"), ("read", "ok"),
             ("commit", "committed"), ("commit", "conflict"), ("credit", "credited"),
             ("bump_shard_count", "won"), ("raise_shard_count", "raised")}
    assert {o for o in outcomes if o[0] in ("debit", "read", "commit")} <= known, outcomes


def test_rejection_cache_hits_and_refunds(shardgate):
    server = shardgate(RULES)
    assert server.should_rate_limit(request("m", desc(("a", "1")))).overall_code == OK
    m0 = server.metrics()
    # Refused five times in a row: the first from the store's answer, the others from the
    # rejection cache without a store call.
    for _ in range(5):
        assert server.should_rate_limit(request("m", desc(("a", "1")))).overall_code == OVER_LIMIT
    m1 = server.metrics()
    hits = diff_engine(m0, m1, "rejection_cache_hits")
    store = sum(v for _, v in m1.series(P + "store_calls_total")) - \
        sum(v for _, v in m0.series(P + "store_calls_total"))
    assert hits >= 3, hits
    assert store + hits == 5, (store, hits)  # each refusal: one store call or a cache hit

    # Two buckets in one request, `a` spent, `b` not: once the cached refusal has aged
    # out, both are debited together, `a` refuses, and `b`'s debit is refunded.
    assert server.should_rate_limit(request("m", desc(("b", "1")))).overall_code == OK
    time.sleep(ROUND_TRIP_S)
    m2 = server.metrics()
    r = server.should_rate_limit(request("m", desc(("a", "1")), desc(("b", "1"))))
    assert r.overall_code == OVER_LIMIT
    m3 = server.metrics()
    assert diff_engine(m2, m3, "refunds") == 1
    assert diff_engine(m2, m3, "rejection_cache_hits") == 0
    assert m3.sum(P + "store_calls_total", operation="credit") - \
        m2.sum(P + "store_calls_total", operation="credit") == 1
    # `b` kept its tokens: 100 − 1 from the single request above (+ 0.03 refilled).
    r = server.should_rate_limit(request("m", desc(("b", "1"), hits=0)))
    assert r.statuses[0].limit_remaining == 99


def test_rejection_cache_entries_are_dropped_once_no_request_can_use_them(shardgate):
    """A bucket refused once and never asked for again must not stay in the cache: while
    an entry is held, every admitted request pays a lookup. The server prunes entries
    neither stored nor refreshed within two cache lifetimes (2 s), once a second."""
    server = shardgate(RULES)
    for i in range(3):  # a_rpm is 1/min: one admitted, then refused
        server.should_rate_limit(request("m", desc(("a", f"idle{i}"))))
        r = server.should_rate_limit(request("m", desc(("a", f"idle{i}"))))
        assert r.overall_code == OVER_LIMIT
    held = server.metrics().value(P + "rejection_cache_entries")
    assert held == 3, held
    # Still refused from the cache while the image is young: the entry is in use.
    m0 = server.metrics()
    assert server.should_rate_limit(request("m", desc(("a", "idle0")))).overall_code == OVER_LIMIT
    assert diff_engine(m0, server.metrics(), "rejection_cache_hits") == 1
    deadline = time.monotonic() + 10  # 2 s horizon + 1 s tick, with room for a slow machine
    while time.monotonic() < deadline:
        held = server.metrics().value(P + "rejection_cache_entries")
        if held == 0:
            break
        time.sleep(0.2)
    assert held == 0, held
    # Nothing was lost: the buckets are still spent, now refused by the store.
    m1 = server.metrics()
    for i in range(3):
        assert server.should_rate_limit(request("m", desc(("a", f"idle{i}")))).overall_code == OVER_LIMIT
    m2 = server.metrics()
    assert diff_engine(m1, m2, "rejection_cache_hits") == 0
    assert m2.value(P + "rejection_cache_entries") == 3


def burst(server, n):
    for i in range(n):
        r = server.should_rate_limit(request("m", desc(("hot", "h"))))
        assert r.overall_code == OK, (i, r)


def test_shard_doublings_and_bucket_shards(shardgate):
    # 5 writes per second per shard item: a burst on one bucket must spread it.
    server = shardgate(RULES, args=["--partition-write-budget", "5"])
    burst(server, 40)
    m = server.metrics()
    doublings = engine(m, "shard_doublings")
    assert doublings >= 1
    shards = m.series(engine_family(m, "bucket_shards"))
    assert len(shards) == 1, shards
    labels, count = shards[0]
    assert labels == {"entity": "hot=h", "resource": "m"}
    # Each doubling this server won doubled the count: 1 → 2 → 4 … ≤ 32.
    assert count == 2 ** doublings and 2 <= count <= 32, (count, doublings)
    assert m.type_of(engine_family(m, "bucket_shards")) == "gauge"
    # The engine's counters agree with the store calls (no contention: every applied
    # debit is a fast-path hit, every slow path one commit). A doubling
    # from c shards reads them and commits shard 0's new count, then one commit per other
    # existing shard: between 1 and c commits, c - 1 in all at most over the doublings.
    assert engine(m, "fast_path_hits") == m.value(
        P + "store_calls_total", operation="debit", outcome="applied")
    commits = m.sum(P + "store_calls_total", operation="commit")
    slow = engine(m, "slow_paths")
    assert slow + doublings <= commits <= slow + count - 1, (slow, doublings, commits)
    # Reads: one per slow path but the bucket's first (shard 0 found absent is created
    # unread; a later shard found absent reads shard 0's count instead), one per
    # doubling, and the periodic store health check.
    assert slow - 1 + doublings <= m.sum(P + "store_calls_total", operation="read")
    assert rule_counts(m, "m.hot") == {
        "total_hits": 40, "within_limit": 40, "over_limit": 0, "near_limit": 0, "shadow_mode": 0}
    assert m.value(P + "requests_in_flight") == 0


def test_per_shard_ceiling_rejection(shardgate):
    server = shardgate(RULES, args=["--partition-write-budget", "5"])
    # The 1st request creates the bucket, the next five drain shard 0's `wcu` (5 writes
    # a second), the 7th finds it dry and doubles the bucket to two shards.
    burst(server, 7)
    m = server.metrics()
    assert m.series(engine_family(m, "bucket_shards")) == [({"entity": "hot=h", "resource": "m"}, 2.0)]
    # The whole limit in one request: a one-shard bucket admits it when full (as this
    # one is again 1.1 s after taking 7 of its 1000/s), but neither of two shards ever
    # holds more than its share, 500.
    time.sleep(ROUND_TRIP_S)  # and no cached image answers for the store
    r = server.should_rate_limit(request("m", desc(("hot", "h"), hits=1000)))
    assert r.overall_code == OVER_LIMIT
    assert r.statuses[0].limit_remaining == 500, r
    m2 = server.metrics()
    assert diff_engine(m, m2, "per_shard_ceiling_rejections") == 1
    assert rule(m2, "over_limit", "m.hot") == 1000
    # Half the limit still fits on one shard.
    r = server.should_rate_limit(request("m", desc(("hot", "h"), hits=500)))
    assert r.overall_code == OK, r
    assert diff_engine(m, server.metrics(), "per_shard_ceiling_rejections") == 1


def test_every_per_shard_ceiling_rejection_is_counted(shardgate):
    """On a bucket spread over many shards, the same never-fitting request is refused each
    time and counted each time, whichever path refused it: the fast debit of a written
    shard, the slow path of a shard never written (no image to cache), or the rejection
    cache once every shard has been written and refused (how many the burst wrote depends
    on its draw, so the mix of paths varies from run to run; the count must not)."""
    server = shardgate(RULES, args=["--partition-write-budget", "5"])
    burst(server, 40)
    m0 = server.metrics()
    count = m0.series(engine_family(m0, "bucket_shards"))[0][1]
    assert count >= 8, count
    tries = 12
    for _ in range(tries):
        r = server.should_rate_limit(request("m", desc(("hot", "h"), hits=1000)))
        assert r.overall_code == OVER_LIMIT
    m1 = server.metrics()
    assert diff_engine(m0, m1, "per_shard_ceiling_rejections") == tries
