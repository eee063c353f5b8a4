"""The HTTP surface (issue 5): `POST /json` answers like the gRPC call (200 OK, 429 over
limit, 400 with a message naming the field for a bad body), `GET /healthcheck`
(readiness) and `GET /healthcheck/store` (the store's health), and `GET /rlconfig`
(domains, rules and the config hash that the metrics show).

`/json` bodies are also read back with protobuf's own proto3-JSON parser
(`google.protobuf.json_format`) into Envoy's `RateLimitResponse`, so they are checked
against the mapping itself, not against a hand-written reading of it.
"""
import json
import re
import time

import grpc
import pytest

from google.protobuf import json_format
from grpc_health.v1 import health_pb2
from envoy.service.ratelimit.v3 import rls_pb2

from fake_dynamodb import FakeDynamo
from test_independent_client import desc, request

OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT

RULES = """
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3, name: user_rpm}
  - key: plan
    value: free
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: health
    rate_limit: {unlimited: true}
  - key: tenant
    metadata: {team: core, tier: 2}
    rate_limit: {unit: second, requests_per_unit: 50}
    descriptors:
      - key: api_key
        cascade: true
        rate_limit: {unit: minute, requests_per_unit: 10, burst: 20, overdraft: true, name: key_rpm}
"""


def json_body(domain, *descriptors, hits_addend=None):
    """A proto3-JSON RateLimitRequest: descriptors are lists of (key, value) pairs."""
    body = {"domain": domain,
            "descriptors": [{"entries": [{"key": k, "value": v} for k, v in d]} for d in descriptors]}
    if hits_addend is not None:
        body["hitsAddend"] = hits_addend
    return body


def post_json(server, body):
    """(HTTP status, parsed JSON, RateLimitResponse parsed by protobuf) of one /json call."""
    status, ctype, text = server.http("POST", "/json", body)
    assert ctype.startswith("application/json"), (status, ctype, text)
    data = json.loads(text)
    parsed = None
    if status in (200, 429):
        parsed = json_format.Parse(text, rls_pb2.RateLimitResponse())
    return status, data, parsed


def ms(duration):
    return duration.seconds * 1000 + duration.nanos // 1_000_000


def test_json_answers_200_then_429_like_the_grpc_path(shardgate):
    server = shardgate(RULES)
    grpc_answers = [server.should_rate_limit(request("api", desc(("user", "via-grpc"))))
                    for _ in range(5)]
    json_answers = [post_json(server, json_body("api", [("user", "via-json")])) for _ in range(5)]

    assert [r.overall_code for r in grpc_answers] == [OK, OK, OK, OVER_LIMIT, OVER_LIMIT]
    assert [status for status, _, _ in json_answers] == [200, 200, 200, 429, 429]
    for k, (g, (status, data, j)) in enumerate(zip(grpc_answers, json_answers)):
        # The raw body: proto3 JSON names, enums by name.
        assert data["overallCode"] == ("OK" if k < 3 else "OVER_LIMIT"), data
        (s,) = data["statuses"]
        assert s["code"] == data["overallCode"]
        assert s["limitRemaining"] == max(0, 2 - k), s
        assert s["currentLimit"] == {"name": "user_rpm", "requestsPerUnit": 3, "unit": "MINUTE"}, s
        assert re.fullmatch(r"\d+(\.\d+)?s", s["durationUntilReset"]), s
        # The same answer as gRPC, but for the milliseconds between the two runs.
        assert ms(j.statuses[0].duration_until_reset) > 0
        assert abs(ms(j.statuses[0].duration_until_reset) - ms(g.statuses[0].duration_until_reset)) < 2_000
        for r in (j, g):
            r.statuses[0].ClearField("duration_until_reset")
        assert j == g, (k, j, g)

    # One limiter behind both: gRPC and /json draw on the same bucket.
    status, data, _ = post_json(server, json_body("api", [("user", "shared")]))
    assert (status, data["statuses"][0]["limitRemaining"]) == (200, 2)
    r = server.should_rate_limit(request("api", desc(("user", "shared"))))
    assert (r.overall_code, r.statuses[0].limit_remaining) == (OK, 1)
    status, data, _ = post_json(server, json_body("api", [("user", "shared")], hits_addend=2))
    assert (status, data["overallCode"]) == (429, "OVER_LIMIT")


def test_json_request_rules_match_grpc(shardgate):
    server = shardgate(RULES)
    # Several descriptors: statuses in request order; unlimited, shadow and unmatched.
    body = json_body("api", [("health", "x")], [("plan", "free")], [("nothing", "here")], [("user", "u")])
    status, data, j = post_json(server, body)
    assert status == 200, data
    assert [s["code"] for s in data["statuses"]] == ["OK"] * 4
    assert data["statuses"][0]["limitRemaining"] == 4294967295
    assert "currentLimit" not in data["statuses"][2]
    g = server.should_rate_limit(request("api", desc(("health", "x")), desc(("plan", "free")),
                                         desc(("nothing", "here")), desc(("user", "u2"))))
    for r in (j, g):
        for s in r.statuses:
            s.ClearField("duration_until_reset")
    assert j == g

    # The shadow rule is spent (1/hour) but never refuses; hits_addend as a string (the
    # proto3-JSON form of 64-bit numbers) and snake_case names are accepted.
    status, data, _ = post_json(server, {
        "domain": "api",
        "descriptors": [{"entries": [{"key": "user", "value": "snake"}], "hits_addend": "3"}]})
    assert (status, data["statuses"][0]["limitRemaining"]) == (200, 0), data
    status, data, _ = post_json(server, json_body("api", [("plan", "free")]))
    assert (status, data["overallCode"]) == (200, "OK")

    # Unknown domain: OK, no limit.
    status, data, _ = post_json(server, json_body("nope", [("user", "u")]))
    assert status == 200 and data["overallCode"] == "OK"
    assert "currentLimit" not in data["statuses"][0]

    # A descriptor's own limit override.
    status, data, _ = post_json(server, {"domain": "api", "descriptors": [
        {"entries": [{"key": "any", "value": "thing"}], "limit": {"requestsPerUnit": 1, "unit": "HOUR"}}]})
    assert status == 200 and data["statuses"][0]["currentLimit"]["requestsPerUnit"] == 1, data
    status, data, _ = post_json(server, {"domain": "api", "descriptors": [
        {"entries": [{"key": "any", "value": "thing"}], "limit": {"requestsPerUnit": 1, "unit": "HOUR"}}]})
    assert status == 429, data


def test_json_duration_until_reset_uses_canonical_fraction_digits(shardgate):
    """proto3 JSON (google.protobuf.Duration): 'Generated output always contains 0, 3, 6,
    or 9 fractional digits'. A fresh 50/second bucket after one hit is full again in
    exactly 20 ms."""
    server = shardgate(RULES)
    _, data, parsed = post_json(server, json_body("api", [("tenant", "fresh")]))
    assert ms(parsed.statuses[0].duration_until_reset) == 20
    assert data["statuses"][0]["durationUntilReset"] == "0.020s", data


def test_json_response_carries_the_dynamic_metadata_grpc_returns(shardgate):
    """With --response-dynamic-metadata, an answer carries envoyproxy/ratelimit's dynamic
    metadata (the domain, the descriptors, the passing rules' `metadata`); the /json
    response must be that response in proto3 JSON. Without the flag there is none, as
    upstream sends none unless RESPONSE_DYNAMIC_METADATA is set."""
    server = shardgate(RULES, args=["--response-dynamic-metadata"])
    g = server.should_rate_limit(request("api", desc(("tenant", "acme"))))
    assert g.overall_code == OK
    assert g.HasField("dynamic_metadata"), g
    meta = json_format.MessageToDict(g.dynamic_metadata)
    assert meta == {
        "domain": "api",
        "descriptors": [{"entries": ["tenant=acme"]}],
        "metadata": {"team": "core", "tier": 2},
    }, meta
    status, data, j = post_json(server, json_body("api", [("tenant", "globex")]))
    assert status == 200
    assert data.get("dynamicMetadata") == {
        "domain": "api",
        "descriptors": [{"entries": ["tenant=globex"]}],
        "metadata": {"team": "core", "tier": 2},
    }, data

    plain = shardgate(RULES)
    g = plain.should_rate_limit(request("api", desc(("tenant", "acme"))))
    assert not g.HasField("dynamic_metadata"), g


BAD_BODIES = [
    # (body, field the message must start with)
    (b"not json", "body is not JSON"),
    (b"", "body is not JSON"),
    (b"[]", "request"),
    ({"domain": 5, "descriptors": []}, "domain"),
    ({"domain": "api", "descriptors": {"entries": []}}, "descriptors"),
    ({"domain": "api", "descriptors": ["user"]}, "descriptors[0]"),
    ({"domain": "api", "descriptors": [{"entries": {"key": "user"}}]}, "descriptors[0].entries"),
    ({"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": 7}]}]},
     "descriptors[0].entries[0].value"),
    ({"domain": "api", "descriptors": [{"entries": [{"key": True, "value": "x"}]}]},
     "descriptors[0].entries[0].key"),
    ({"domain": "api", "hitsAddend": -1, "descriptors": [{"entries": [{"key": "user", "value": "b"}]}]},
     "hitsAddend"),
    ({"domain": "api", "hitsAddend": 1.5, "descriptors": [{"entries": [{"key": "user", "value": "b"}]}]},
     "hitsAddend"),
    ({"domain": "api", "hitsAddend": 4294967296, "descriptors": [{"entries": [{"key": "user", "value": "b"}]}]},
     "hitsAddend"),
    ({"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": "b"}], "hitsAddend": "-3"}]},
     "descriptors[0].hitsAddend"),
    ({"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": "b"}],
                                        "limit": {"requestsPerUnit": 1, "unit": "fortnight"}}]},
     "descriptors[0].limit.unit"),
    ({"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": "b"}],
                                        "limit": {"requestsPerUnit": -1, "unit": "HOUR"}}]},
     "descriptors[0].limit.requestsPerUnit"),
    # Valid JSON, invalid request (the gRPC path's INVALID_ARGUMENT).
    ({"domain": "", "descriptors": [{"entries": [{"key": "user", "value": "b"}]}]}, "domain"),
    ({"domain": "api", "descriptors": []}, "descriptors"),
    ({"domain": "api", "descriptors": [{"entries": []}]}, "descriptors[0].entries"),
    ({"domain": "api", "descriptors": [{"entries": [{"key": "", "value": "b"}]}]},
     "descriptors[0].entries[0].key"),
]


def test_bad_bodies_are_400_with_a_message_naming_the_field(shardgate):
    server = shardgate(RULES)
    failures = []
    for body, field in BAD_BODIES:
        status, ctype, text = server.http("POST", "/json", body)
        try:
            error = json.loads(text)["error"]
        except (ValueError, KeyError, TypeError):
            error = None
        if status != 400 or not ctype.startswith("application/json") or \
                not isinstance(error, str) or not error.startswith(field):
            failures.append((body, field, status, text))
    assert failures == [], "\n".join(map(str, failures))
    # None of them took a token or was counted as a hit.
    status, data, _ = post_json(server, json_body("api", [("user", "b")]))
    assert (status, data["statuses"][0]["limitRemaining"]) == (200, 2)
    assert server.metrics().value("shardgate_rate_limit_total_hits_total", domain="api", key="api.user") == 1


def test_json_only_takes_post(shardgate):
    server = shardgate(RULES)
    status, _, _ = server.http("GET", "/json")
    assert status == 405


def test_healthcheck(shardgate):
    server = shardgate(RULES)
    status, _, text = server.http("GET", "/healthcheck")
    assert (status, text.strip()) == (200, "OK")


def wait_for(done, timeout_s):
    """Polls `done` every 50 ms until it holds or `timeout_s` passes; its last answer."""
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)
    return done()


READY_SERVICES = ["", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService"]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# The `store` health service is re-checked every 5 s (STORE_HEALTH_INTERVAL), each check
# bounded by 2 s.
STORE_CHECK_S = 5 + 2 + 3


def test_readiness_stays_while_the_store_fails_and_the_store_check_follows_it(shardgate):
    """Readiness (`/healthcheck`; gRPC health of the server and the rate-limit service)
    means the store has answered since start-up: a store failing later leaves the server
    ready, each request answered by its rules' `failure_mode` (deny here: UNAVAILABLE),
    which only a server its callers still reach can give. The store's own health is
    `/healthcheck/store` and the gRPC service `store`: 503 and NOT_SERVING while it fails,
    200 and SERVING once it answers again. Before, `/healthcheck` and every health
    service followed the store."""
    with FakeDynamo() as store:
        server = shardgate(RULES, **store.serve_options("200ms"))
        assert server.http("GET", "/healthcheck")[::2] == (200, "OK\n")
        assert server.http("GET", "/healthcheck/store")[::2] == (200, "OK\n")
        assert server.health_status("store") == SERVING
        store.failing = True
        status, _, text = server.http("GET", "/healthcheck/store")
        assert status == 503 and text.startswith("store unavailable"), (status, text)
        with pytest.raises(grpc.RpcError) as e:
            server.should_rate_limit(request("api", desc(("user", "u"))))
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert wait_for(lambda: server.health_status("store") == NOT_SERVING, STORE_CHECK_S)
        # Ready all along.
        assert server.http("GET", "/healthcheck")[::2] == (200, "OK\n")
        for service in READY_SERVICES:
            assert server.health_status(service) == SERVING, service
        store.failing = False
        # The store's health is back once it answers (after the breaker's cool-off).
        assert wait_for(lambda: server.http("GET", "/healthcheck/store")[0] == 200, 5)
        assert wait_for(lambda: server.health_status("store") == SERVING, STORE_CHECK_S)


def test_rlconfig_lists_domains_rules_and_the_hash_the_metrics_show(shardgate, tmp_path):
    server = shardgate(RULES)
    status, ctype, text = server.http("GET", "/rlconfig")
    assert status == 200 and ctype.startswith("text/plain"), (status, ctype)
    lines = text.splitlines()
    hash_ = lines[0].removeprefix("config hash: ")
    assert re.fullmatch(r"[0-9a-f]{16}", hash_), lines[0]
    assert server.metrics().series("shardgate_config_info") == [({"hash": hash_}, 1.0)]
    assert lines[1:] == [
        "domain api:",
        "  api.user: 3/minute resource api; name user_rpm",
        "  api.plan_free: 1/hour resource api; shadow_mode",
        "  api.health: unlimited resource api",
        "  api.tenant: 50/second resource api",
        "  api.tenant.api_key: 10/minute burst 20 overdraft resource api; "
        "cascade to api.tenant, name key_rpm",
    ], text

    # Two domains from a directory, listed by name.
    d = tmp_path / "conf.d"
    d.mkdir()
    (d / "b.yaml").write_text("domain: zeta\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 9}\n")
    (d / "a.yaml").write_text(RULES)
    other = shardgate(config=d)
    _, _, text2 = other.http("GET", "/rlconfig")
    domains = [l for l in text2.splitlines() if l.startswith("domain ")]
    assert domains == ["domain api:", "domain zeta:"], text2
    assert "  zeta.k: 9/day resource zeta" in text2.splitlines()
    hash2 = text2.splitlines()[0].removeprefix("config hash: ")
    assert hash2 != hash_
    assert other.metrics().series("shardgate_config_info") == [({"hash": hash2}, 1.0)]
