"""envoyproxy/ratelimit's integration cases (`test/integration/integration_test.go`,
`testBasicBaseConfig`, on its `runtime/current/ratelimit/config/` rules), against the
shardgate binary over gRPC with the same rule files and requests.

Where upstream's answer follows from its design, not its contract, shardgate's is
asserted and the difference is the documented one (docs/configuration.md, "Differences
from envoyproxy/ratelimit"): with two descriptors in one request, upstream counts the
descriptor that fits even when the other refuses the request; shardgate's request is all
or nothing, so the one that fits keeps its tokens. That is the answer upstream itself
gives with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, which its test also checks.
"""
import random

from envoy.service.ratelimit.v3 import rls_pb2

from test_independent_client import desc, request

OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT
SECOND = rls_pb2.RateLimitResponse.RateLimit.SECOND
MINUTE = rls_pb2.RateLimitResponse.RateLimit.MINUTE
HOUR = rls_pb2.RateLimitResponse.RateLimit.HOUR
P = "shardgate_"

BASIC = """
domain: basic
descriptors:
  - key: key1
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: one_per_minute
    rate_limit: {unit: minute, requests_per_unit: 1}
"""

ANOTHER = """
domain: another
descriptors:
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: key4
    rate_limit: {unit: day, requests_per_unit: 20}
"""


def status_of(s):
    limit = s.current_limit if s.HasField("current_limit") else None
    return (s.code, limit and limit.requests_per_unit, limit and limit.unit, s.limit_remaining)


def hits(metrics, counter, domain, key):
    return metrics.get(f"{P}rate_limit_{counter}_total", 0.0, domain=domain, key=key)


def test_basic_base_config(shardgate, tmp_path):
    rules = tmp_path / "config"
    rules.mkdir()
    (rules / "basic.yaml").write_text(BASIC)
    (rules / "another.yaml").write_text(ANOTHER)
    server = shardgate(config=rules)

    # An unknown domain: OK, no limit.
    r = server.should_rate_limit(request("foo", desc(("hello", "world"))))
    assert r.overall_code == OK
    assert [status_of(s) for s in r.statuses] == [(OK, None, None, 0)]

    # 50/second: the first request leaves 49.
    r = server.should_rate_limit(request("basic", desc(("key1", "foo"))))
    assert r.overall_code == OK
    assert [status_of(s) for s in r.statuses] == [(OK, 50, SECOND, 49)]
    m = server.metrics()
    assert hits(m, "total_hits", "basic", "basic.key1") == 1

    # 20/minute on a random value, 25 times: 20 admitted counting down, then refused.
    value = str(random.randrange(1 << 62))
    for i in range(25):
        r = server.should_rate_limit(request("another", desc(("key2", value))))
        over = i >= 20
        expected = (OVER_LIMIT, 20, MINUTE, 0) if over else (OK, 20, MINUTE, 20 - (i + 1))
        assert r.overall_code == (OVER_LIMIT if over else OK), (i, r)
        assert [status_of(s) for s in r.statuses] == [expected], (i, r)
        assert r.statuses[0].duration_until_reset.ToMilliseconds() > 0, (i, r)
    m = server.metrics()
    assert hits(m, "total_hits", "another", "another.key2") == 25
    assert hits(m, "over_limit", "another", "another.key2") == 5

    # Two descriptors of one domain, new values: key2 20/minute, key3 10/hour. Both fit
    # ten times; then key3 refuses and the request is refused whole, key2 keeping its 10.
    value = str(random.randrange(1 << 62))
    for i in range(15):
        r = server.should_rate_limit(
            request("another", desc(("key2", value)), desc(("key3", value))))
        got = [status_of(s) for s in r.statuses]
        if i < 10:
            assert r.overall_code == OK, (i, r)
            assert got == [(OK, 20, MINUTE, 20 - (i + 1)), (OK, 10, HOUR, 10 - (i + 1))], i
        else:
            assert r.overall_code == OVER_LIMIT, (i, r)
            assert got == [(OK, 20, MINUTE, 10), (OVER_LIMIT, 10, HOUR, 0)], i
    m = server.metrics()
    assert hits(m, "total_hits", "another", "another.key3") == 15
    assert hits(m, "over_limit", "another", "another.key3") == 5
    assert hits(m, "over_limit", "another", "another.key2") == 5  # only the first loop's

    # upstream's duration until reset counts down to its window's end between two
    # requests; a token bucket's is the time until it is full again, which each hit
    # lengthens (a 20/day bucket refills one token every 72 minutes).
    first = server.should_rate_limit(request("another", desc(("key4", "durTest"))))
    second = server.should_rate_limit(request("another", desc(("key4", "durTest"))))
    d1 = first.statuses[0].duration_until_reset.ToMilliseconds()
    d2 = second.statuses[0].duration_until_reset.ToMilliseconds()
    # After one hit the bucket is full again in 72 min; after two, in about twice that.
    assert 0 < d1 <= 72 * 60_000 < d2 <= 2 * 72 * 60_000, (d1, d2)
