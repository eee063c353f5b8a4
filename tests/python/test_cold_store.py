"""A newcomer's first fleet: a DynamoDB Local started just now (a cold JVM, whose first
calls take far longer than later ones), `shardgate table create`, then `shardgate serve
--store dynamodb` with default flags. Once gRPC health says SERVING, fourteen black-box
scenarios — N then over, cascade, a composite item, wildcards, a shared wildcard, hits,
overdraft, all or nothing, concurrency, values too long for a key — answer exactly as on
the embedded store, each call with a 2 s client deadline.

(With a 15 ms store deadline, the default before, the cold store failed 13 of the 14: its
first calls missed the deadline, five in a row opened the circuit, and every tenant got
UNAVAILABLE.)
"""
import concurrent.futures
import json
import os
import subprocess

import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2
from google.protobuf import wrappers_pb2

from conftest import binary
from dynamodb_local import AWS_LOCAL_ENV, DynamoLocal

RULES = """\
domain: cold
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 5}
    descriptors:
      - key: api_key
        cascade: true
        rate_limit: {unit: hour, requests_per_unit: 2}
  - key: llm
    descriptors:
      - key: kind
        value: requests
        entity: "{llm}"
        rate_limit: {unit: hour, requests_per_unit: 4, name: rpm}
      - key: kind
        value: tokens
        entity: "{llm}"
        rate_limit: {unit: hour, requests_per_unit: 100, overdraft: true, name: tpm}
  - key: path
    value: "/api/*"
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: path
    value: "/shared/*"
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: path
    value: /free
    rate_limit: {unlimited: true}
"""

CALL_TIMEOUT_S = 2.0
CODES = {rls_pb2.RateLimitResponse.OK: "OK", rls_pb2.RateLimitResponse.OVER_LIMIT: "OVER"}


def descriptor(entries, hits=None):
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries])
    if hits is not None:
        d.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=hits))
    return d


def ask(server, *descriptors, domain="cold"):
    """One call: the overall code and each descriptor's (code, remaining)."""
    r = server.rls.ShouldRateLimit(
        rls_pb2.RateLimitRequest(domain=domain, descriptors=list(descriptors)),
        timeout=CALL_TIMEOUT_S)
    return CODES[r.overall_code], [(CODES[s.code], s.limit_remaining) for s in r.statuses]


def codes(server, n, *descriptors):
    return [ask(server, *descriptors)[0] for _ in range(n)]


def one(key, value, hits=None):
    return descriptor([(key, value)], hits)


# Each scenario: a name and a function of a server giving what it answered, and what it
# must answer (the same on every store).
def n_then_over(s):
    return codes(s, 4, one("user", "u1"))


def cascade(s):
    pair = lambda k: descriptor([("tenant", "t1"), ("api_key", k)])
    # key1 spends its 2; key2 its 2 of what the tenant's 5 leave; the tenant has 1 more.
    return [codes(s, 3, pair("k1")), codes(s, 3, pair("k2")), codes(s, 2, one("tenant", "t1"))]


def composite(s):
    return codes(s, 5, descriptor([("llm", "a"), ("kind", "requests")]))


def tokens_overdraft(s):
    tokens = lambda hits: descriptor([("llm", "b"), ("kind", "tokens")], hits)
    # A check (0 hits) passes; 150 tokens used are recorded (the balance was 100, so
    # reported over); then the tenant is in debt and the next check is over.
    return [ask(s, tokens(0)), ask(s, tokens(150)), ask(s, tokens(0))]


def wildcard(s):
    return [codes(s, 3, one("path", "/api/x")), codes(s, 1, one("path", "/api/y"))]


def shared_wildcard(s):
    return [ask(s, one("path", p))[0] for p in ("/shared/a", "/shared/b", "/shared/c")]


def unlimited(s):
    return [ask(s, one("path", "/free")) for _ in range(5)]


def unknown_domain(s):
    return ask(s, one("user", "u1"), domain="nowhere")


def hits_addend(s):
    return [ask(s, one("user", "u2", hits=3)), ask(s, one("user", "u2"))]


def hits_beyond_the_limit(s):
    return [ask(s, one("user", "u3", hits=4)), ask(s, one("user", "u3"))]


def all_or_nothing(s):
    codes(s, 3, one("user", "u4"))
    refused = ask(s, one("user", "u4"), one("user", "u4x"))
    return [refused, codes(s, 4, one("user", "u4x"))]


def concurrency(s):
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        got = list(pool.map(lambda _: ask(s, one("user", "u5"))[0], range(12)))
    return sorted(got)


def long_value(s):
    return codes(s, 4, one("user", "/" * 1024))


def multibyte_value(s):
    return codes(s, 4, one("user", "é" * 512))


SCENARIOS = [
    (n_then_over, ["OK", "OK", "OK", "OVER"]),
    (cascade, [["OK", "OK", "OVER"], ["OK", "OK", "OVER"], ["OK", "OVER"]]),
    (composite, ["OK"] * 4 + ["OVER"]),
    (tokens_overdraft, [("OK", [("OK", 100)]), ("OVER", [("OVER", 0)]), ("OVER", [("OVER", 0)])]),
    (wildcard, [["OK", "OK", "OVER"], ["OK"]]),
    (shared_wildcard, ["OK", "OK", "OVER"]),
    (unlimited, [("OK", [("OK", 4294967295)])] * 5),
    (unknown_domain, ("OK", [("OK", 0)])),
    (hits_addend, [("OK", [("OK", 0)]), ("OVER", [("OVER", 0)])]),
    (hits_beyond_the_limit, [("OVER", [("OVER", 3)]), ("OK", [("OK", 2)])]),
    (all_or_nothing, [("OVER", [("OVER", 0), ("OK", 3)]), ["OK", "OK", "OK", "OVER"]]),
    (concurrency, ["OK"] * 3 + ["OVER"] * 9),
    (long_value, ["OK", "OK", "OK", "OVER"]),
    (multibyte_value, ["OK", "OK", "OK", "OVER"]),
]


@pytest.fixture(scope="module")
def cold_ddb(tmp_path_factory):
    ddb = DynamoLocal(tmp_path_factory.mktemp("cold-ddb"), "shardgate")
    ddb.start()
    try:
        ddb.wait_listening()
        yield ddb
    finally:
        ddb.kill()


def test_default_flags_on_a_cold_store_answer_as_the_embedded_store(shardgate, cold_ddb):
    # Created and served at once, while the emulator is as cold as it will ever be.
    cold_ddb.create_table()
    fleet = shardgate(RULES, store="dynamodb", args=["--dynamodb-endpoint", cold_ddb.endpoint],
                      env=AWS_LOCAL_ENV)
    assert "store answered: serving" in fleet.log(), fleet.log()
    embedded = shardgate(RULES)
    for scenario, expected in SCENARIOS:
        on_dynamodb = scenario(fleet)
        assert on_dynamodb == expected, (scenario.__name__, on_dynamodb, fleet.log()[-3000:])
        assert scenario(embedded) == expected, scenario.__name__
    metrics = fleet.metrics()
    assert metrics.sum("shardgate_store_failure_answers_total") == 0, "no request failed"

    # `inspect` finds the bucket of a value too long for a key by the same rule: the
    # entity as shardgate encodes it, stored under its digest.
    entity = "user=" + "%2F" * 1024
    r = subprocess.run(
        [binary(), "inspect", "--store", "dynamodb", "--table", "shardgate",
         "--dynamodb-endpoint", cold_ddb.endpoint,
         "--entity", entity, "--resource", "cold"],
        env={**os.environ, **AWS_LOCAL_ENV}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert shown["stored_entity"].startswith("#sha256:"), shown
    (shard,) = shown["shards"]
    assert shard["exists"] and shard["limits"]["rl"]["tokens"] == 0.0, shard
