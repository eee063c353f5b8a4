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

from envoy_e2e import unique

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
