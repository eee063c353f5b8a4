"""Envoy's descriptor actions, end to end: Envoy builds descriptors from each request, asks
shardgate, and answers 429 when shardgate says OVER_LIMIT. Rules: tests/envoy/limits/e2e.yaml;
routes: envoy_e2e.main_routes."""
from envoy_e2e import unique


def statuses(stack, path, headers, n):
    return [stack.get(path, headers).status for _ in range(n)]


def assert_limited(r, name, rpu, window):
    """A 429 from Envoy's ratelimit filter naming the rule that refused."""
    assert r.status == 429, r
    assert r.header("x-envoy-ratelimited") == "true", r.headers
    assert r.header("x-ratelimit-limit").startswith(f'{rpu}, {rpu};w={window};name="{name}"'), \
        r.headers
    assert r.header("x-ratelimit-remaining") == "0", r.headers


def test_request_headers_descriptor_allows_n_then_429(stack):
    user = {"x-user": unique("u")}
    assert statuses(stack, "/user", user, 3) == [200, 200, 200]
    r = stack.get("/user", user)
    assert_limited(r, "per_user", 3, 60)
    assert r.body == b""  # Envoy's own 429, not the backend's answer
    # Refused requests take nothing: still refused, for as long as the bucket is empty.
    assert statuses(stack, "/user", user, 3) == [429, 429, 429]
    # Another header value is another bucket.
    assert statuses(stack, "/user", {"x-user": unique("u")}, 3) == [200, 200, 200]


def test_request_without_the_header_is_not_limited(stack):
    # request_headers without skip_if_absent: no header, no descriptor, no limit.
    assert statuses(stack, "/user", {}, 6) == [200] * 6


def test_cascade_key_limited_by_its_own_bucket(stack):
    tenant = unique("t")
    k1 = {"x-tenant": tenant, "x-api-key": "k1"}
    assert statuses(stack, "/cascade", k1, 3) == [200, 200, 200]
    assert_limited(stack.get("/cascade", k1), "key_rpm", 3, 60)


def test_cascade_keys_share_their_tenants_bucket(stack):
    tenant = unique("t")
    k1 = {"x-tenant": tenant, "x-api-key": "k1"}
    k2 = {"x-tenant": tenant, "x-api-key": "k2"}
    # k1 spends 3 of the tenant's 4; k2 (fresh, 3 of its own) gets the last one.
    assert statuses(stack, "/cascade", k1, 3) == [200, 200, 200]
    r = stack.get("/cascade", k2)
    assert r.status == 200
    # The tighter bucket speaks in the headers: the tenant's, now empty.
    assert r.header("x-ratelimit-limit") == '4, 4;w=60;name="tenant_rpm"', r.headers
    assert r.header("x-ratelimit-remaining") == "0"
    # k2 still has 2 tokens of its own, but the tenant has none: refused by the parent.
    assert_limited(stack.get("/cascade", k2), "tenant_rpm", 4, 60)
    # Another tenant's key with the same name is unaffected.
    other = {"x-tenant": unique("t"), "x-api-key": "k2"}
    assert statuses(stack, "/cascade", other, 3) == [200, 200, 200]


def test_nested_descriptor_exact_value_and_default(stack):
    org = unique("o")
    gold = {"x-org": org, "x-team": "gold"}
    blue = {"x-org": org, "x-team": "blue"}
    # (org, team=gold) matches the exact child: 4/min.
    assert statuses(stack, "/nested", gold, 4) == [200] * 4
    assert_limited(stack.get("/nested", gold), "gold_team", 4, 60)
    # (org, team=blue) falls to the key-only default: 2/min, its own bucket.
    assert statuses(stack, "/nested", blue, 2) == [200, 200]
    assert_limited(stack.get("/nested", blue), "any_team", 2, 60)
    # Another org: fresh buckets (the entity is the full path org=…/team=…).
    assert stack.get("/nested", {"x-org": unique("o"), "x-team": "gold"}).status == 200


def test_remote_address_limits_the_client_ip(stack):
    # Every request of the suite comes from 127.0.0.1; only this route limits by address.
    assert statuses(stack, "/remote", {}, 3) == [200, 200, 200]
    assert_limited(stack.get("/remote"), "per_ip", 3, 60)
    # use_remote_address: a forged X-Forwarded-For does not buy a fresh bucket.
    assert stack.get("/remote", {"x-forwarded-for": "203.0.113.7"}).status == 429


def test_generic_key_is_one_bucket_for_the_route(stack):
    # Different users, same descriptor (generic_key=catalog): one shared bucket.
    got = [stack.get("/catalog", {"x-user": unique("u")}).status for _ in range(3)]
    assert got == [200, 200, 200]
    assert_limited(stack.get("/catalog", {"x-user": unique("u")}), "catalog", 3, 60)


def test_header_value_match_limits_only_matching_requests(stack):
    mobile = {"user-agent": "Mozilla/5.0 (iPhone) Mobile/15E148"}
    desktop = {"user-agent": "Mozilla/5.0 (X11; Linux x86_64)"}
    assert statuses(stack, "/mobile", mobile, 2) == [200, 200]
    assert_limited(stack.get("/mobile", mobile), "mobile", 2, 60)
    # No match, no descriptor: never limited, and the headers say no limit applied.
    for _ in range(5):
        r = stack.get("/mobile", desktop)
        assert r.status == 200
        assert r.header("x-ratelimit-limit") is None
