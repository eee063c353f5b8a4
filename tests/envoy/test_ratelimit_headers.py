"""`enable_x_ratelimit_headers: DRAFT_VERSION_03`: what Envoy 1.40 derives from shardgate's
statuses, observed and checked against the rules.

Envoy (source/extensions/filters/http/ratelimit/ratelimit_headers.cc) picks, among the
statuses that carry a `current_limit`, the one with the lowest `limit_remaining`, and sets
- `x-ratelimit-limit`: that status's `requests_per_unit`, then for *every* status with a
  limit `, <requests_per_unit>;w=<unit in seconds>` and `;name="<name>"` when named;
- `x-ratelimit-remaining`: its `limit_remaining` (whole tokens left after this request);
- `x-ratelimit-reset`: its `duration_until_reset`, whole seconds, truncated.
shardgate's `duration_until_reset` is the time until the bucket is full again (OK) or
until the request would fit (OVER_LIMIT); the burst does not appear in the headers.

Rules: client_rpm = 6/minute with burst 3 (one token per 10 s, at most 3 stored),
client_hourly = 100/hour.
"""
import math
import time

from envoy_e2e import (
    ROUTER, backend_listener, bootstrap, http_listener, main_routes, ratelimit_filter,
    static_cluster, unique,
)

LIMIT = '6, 6;w=60;name="client_rpm", 100;w=3600;name="client_hourly"'
REFILL_S = 10.0  # 60 s / 6


def reset_bounds(ideal_s, elapsed_s):
    """`x-ratelimit-reset` is floor(true duration); the true duration is `ideal_s` less the
    refill earned while requests were in flight (at most `elapsed_s`, measured around them)."""
    return math.floor(max(0.0, ideal_s - elapsed_s)), math.floor(ideal_s)


def test_x_ratelimit_headers_follow_the_bucket(stack):
    client = {"x-client": unique("c")}
    start = time.monotonic()
    seen = []
    for k in range(1, 4):
        r = stack.get("/xrl", client)
        elapsed = time.monotonic() - start
        assert r.status == 200, r
        assert r.header("x-ratelimit-limit") == LIMIT, r.headers
        # k tokens taken from a full bucket of 3.
        assert r.header("x-ratelimit-remaining") == str(3 - k), r.headers
        # Full again once k tokens have refilled: k × 10 s (less what refilled meanwhile).
        lo, hi = reset_bounds(k * REFILL_S, elapsed)
        reset = int(r.header("x-ratelimit-reset"))
        assert lo <= reset <= hi, (k, reset, lo, hi, elapsed)
        seen.append(reset)
    assert seen[0] < seen[1] < seen[2]

    # The fourth does not fit: 429, nothing left, and the reset is the wait for one token.
    r = stack.get("/xrl", client)
    elapsed = time.monotonic() - start
    assert r.status == 429, r
    assert r.header("x-envoy-ratelimited") == "true"
    assert r.header("x-ratelimit-limit") == LIMIT, r.headers
    assert r.header("x-ratelimit-remaining") == "0"
    lo, hi = reset_bounds(REFILL_S, elapsed)
    assert lo <= int(r.header("x-ratelimit-reset")) <= hi, (r.headers, elapsed)


def test_no_rate_limit_headers_without_a_descriptor(stack):
    r = stack.get("/xrl", {})
    assert r.status == 200
    assert not any(h.startswith("x-ratelimit-") for h in r.headers), r.headers


def server_headers_envoy_config(ports, shardgate_port):
    """The main routes, with Envoy's own x-ratelimit-* headers off."""
    filters = [ratelimit_filter("e2e", failure_mode_deny=True, x_ratelimit_headers=False),
               {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}]
    return bootstrap(
        ports["admin"],
        [http_listener("main", ports["main"], main_routes(), filters),
         backend_listener(ports["backend"])],
        [static_cluster("shardgate", shardgate_port, http2=True),
         static_cluster("backend", ports["backend"])],
    )


def test_server_side_ratelimit_headers_arrive_on_200_and_429(stack_factory):
    """`shardgate serve --rate-limit-headers` (envoyproxy/ratelimit's
    LIMIT_RESPONSE_HEADERS_ENABLED): the answer's `response_headers_to_add` reach the
    client through Envoy on allowed and refused requests, with Envoy adding none of its
    own. They speak for the descriptor with the least left (client_rpm: 3 stored, one per
    10 s); the reset is whole seconds rounded up."""
    s = stack_factory("server-headers", server_headers_envoy_config,
                      shardgate_args=["--rate-limit-headers"])
    client = {"x-client": unique("c")}
    start = time.monotonic()
    for k in range(1, 4):
        r = s.get("/xrl", client)
        elapsed = time.monotonic() - start
        assert r.status == 200, r
        assert not any(h.startswith("x-ratelimit-") for h in r.headers), r.headers
        assert r.header("ratelimit-limit") == "6", r.headers
        assert r.header("ratelimit-remaining") == str(3 - k), r.headers
        # Full again after k tokens, k × 10 s, less what refilled meanwhile; rounded up.
        reset = int(r.header("ratelimit-reset"))
        assert math.ceil(max(0.0, k * REFILL_S - elapsed)) <= reset <= k * REFILL_S, (
            k, reset, elapsed)
    r = s.get("/xrl", client)
    elapsed = time.monotonic() - start
    assert r.status == 429, r
    assert r.header("ratelimit-limit") == "6", r.headers
    assert r.header("ratelimit-remaining") == "0", r.headers
    reset = int(r.header("ratelimit-reset"))
    assert math.ceil(max(0.0, REFILL_S - elapsed)) <= reset <= REFILL_S + 1, (reset, elapsed)
