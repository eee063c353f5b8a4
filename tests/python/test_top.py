"""`GET /top` (issue 46, item 1): per rule, the descriptor values most refused and most
admitted over the last minutes, counted by the decisions themselves. A tenant bursting
past its limit through gRPC tops its rule's refused table within 2 s, with its share,
while the admitted table still lists the quiet tenants."""
import json
import time

from test_independent_client import desc, request

OK, OVER = 1, 2

RULES = """
domain: shop
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 5}
"""


def top(server, query=""):
    status, ctype, text = server.http("GET", "/top" + query)
    assert status == 200, (status, text)
    assert ctype.startswith("application/json"), ctype
    return json.loads(text)


def rule(report, key):
    [found] = [r for r in report["rules"] if r["rule"] == key]
    return found


def test_a_bursting_tenant_tops_the_refused_table_within_two_seconds(shardgate):
    server = shardgate(RULES)
    empty = rule(top(server), "shop.tenant")
    assert empty["refused"] == {"total": 0, "top": []}, empty
    assert empty["source"].endswith(":4"), empty["source"]
    # Quiet tenants stay under the limit; one tenant bursts 60 requests past it.
    for t in ("t1", "t2", "t3"):
        for _ in range(2):
            assert server.should_rate_limit(request("shop", desc(("tenant", t)))).overall_code == OK
    codes = [server.should_rate_limit(request("shop", desc(("tenant", "noisy")))).overall_code
             for _ in range(60)]
    assert codes.count(OVER) == 55, codes
    burst_end = time.monotonic()
    while True:
        report = top(server, "?n=3&domain=shop")
        refused = rule(report, "shop.tenant")["refused"]
        if refused["top"] and refused["top"][0]["value"] == "tenant=noisy":
            break
        assert time.monotonic() - burst_end < 2.0, refused
        time.sleep(0.05)
    assert refused["total"] == 55
    assert refused["top"][0] == {"value": "tenant=noisy", "count": 55, "error": 0, "share": 1.0}
    admitted = rule(report, "shop.tenant")["admitted"]
    assert admitted["total"] == 11
    assert len(admitted["top"]) == 3, "?n=3 lists three"
    assert admitted["top"][0]["value"] == "tenant=noisy" and admitted["top"][0]["count"] == 5
    assert report["window_seconds"] == 300
    assert top(server, "?domain=other")["rules"] == []
    status, _, text = server.http("GET", "/top?n=lots")
    assert status == 400, text


def test_no_top_values_keeps_no_tables(shardgate):
    server = shardgate(RULES, args=["--no-top-values"])
    server.should_rate_limit(request("shop", desc(("tenant", "t1"))))
    report = top(server)
    assert report["enabled"] is False and report["rules"] == [], report


def test_the_top_values_metric_is_off_by_default_and_bounded_when_on(shardgate):
    def burst(server):
        for t in ("t1", "t2", "t3"):
            server.should_rate_limit(request("shop", desc(("tenant", t))))
        for _ in range(8):
            server.should_rate_limit(request("shop", desc(("tenant", "noisy"))))

    off = shardgate(RULES)
    burst(off)
    assert off.metrics().series("shardgate_top_refused_hits") == []
    on = shardgate(RULES, args=["--top-values-metric", "2"])
    burst(on)
    m = on.metrics()
    assert m.value("shardgate_top_refused_hits", domain="shop", rule="shop.tenant",
                   value="tenant=noisy") == 3
    admitted = m.series("shardgate_top_admitted_hits")
    assert len(admitted) == 2, f"top 2 only, of 4 values admitted: {admitted}"
    assert ({"domain": "shop", "rule": "shop.tenant", "value": "tenant=noisy"}, 5) in admitted
