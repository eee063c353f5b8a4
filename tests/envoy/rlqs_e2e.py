"""Helpers of the RLQS end-to-end tests: an Envoy 1.40 with the `rate_limit_quota` filter
(bucket id `{tenant: <x-tenant header>}`, reports every REPORT_S) in front of the backend
listener, shardgate as its RLQS server, and a bounded load of paced requests."""
from __future__ import annotations

import http.client
import threading
import time

from envoy_e2e import ROUTER, backend_listener, bootstrap, http_listener, static_cluster

RLQS_FILTER = ("type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3."
               "RateLimitQuotaFilterConfig")
BUCKET_SETTINGS = ("type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3."
                   "RateLimitQuotaBucketSettings")
HEADER_INPUT = "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput"
DOMAIN = "rlqs"
REPORT_S = 1.0
LIMIT = 50  # requests per second: tests/envoy/rlqs.yaml, tenant=acme

RULES = f"""domain: {DOMAIN}
descriptors:
  - key: tenant
    value: acme
    rate_limit: {{unit: second, requests_per_unit: {LIMIT}}}
  - key: tenant
    value: banned
    rate_limit: {{unit: second, requests_per_unit: 0}}
  - key: tenant
    value: free
    rate_limit: {{unlimited: true}}
"""


def header_input(header="x-tenant"):
    return {"name": header, "typed_config": {"@type": HEADER_INPUT, "header_name": header}}


def tenant_input():
    return header_input("x-tenant")


def rlqs_filter(no_assignment="ALLOW_ALL", client_key=False):
    """Every request with an `x-tenant` header in the bucket `{tenant: <value>}` (with
    `client_key`, `{tenant: <x-tenant>, client: <x-client>}`)."""
    builder = {"tenant": {"custom_value": tenant_input()}}
    if client_key:
        builder["client"] = {"custom_value": header_input("x-client")}
    settings = {
        "@type": BUCKET_SETTINGS,
        "bucket_id_builder": {"bucket_id_builder": builder},
        "reporting_interval": f"{REPORT_S}s",
        "no_assignment_behavior": {"fallback_rate_limit": {"blanket_rule": no_assignment}},
    }
    matcher = {"matcher_list": {"matchers": [{
        "predicate": {"single_predicate": {
            "input": tenant_input(),
            "value_match": {"safe_regex": {"google_re2": {}, "regex": ".+"}},
        }},
        "on_match": {"action": {"name": "rlqs_bucket", "typed_config": settings}},
    }]}}
    return {"name": "envoy.filters.http.rate_limit_quota", "typed_config": {
        "@type": RLQS_FILTER,
        "rlqs_server": {"envoy_grpc": {"cluster_name": "shardgate"}},
        "domain": DOMAIN,
        "bucket_matchers": matcher,
    }}


def rlqs_envoy_config(ports, shardgate_port, no_assignment="ALLOW_ALL", client_key=False):
    routes = [{"match": {"prefix": "/"}, "route": {"cluster": "backend"}}]
    filters = [rlqs_filter(no_assignment, client_key), {"name": "envoy.filters.http.router",
                               "typed_config": {"@type": ROUTER}}]
    return bootstrap(
        ports["admin"],
        [http_listener("main", ports["main"], routes, filters),
         backend_listener(ports["backend"])],
        [static_cluster("shardgate", shardgate_port, http2=True),
         static_cluster("backend", ports["backend"])],
    )


class Load:
    """`threads` clients, each on one keep-alive connection to `port`, each at most
    `per_thread` requests per second, until `stop()`; every answer's (time, status)."""

    def __init__(self, port, tenant, threads=4, per_thread=40, headers=None):
        self.port = port
        self.tenant = tenant
        self.headers = {"x-tenant": tenant, **(headers or {})}
        self.per_thread = per_thread
        self.results: list[tuple[float, int]] = []
        self.lock = threading.Lock()
        self.running = True
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(threads)]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        self.running = False
        for t in self.threads:
            t.join(timeout=15)

    def run(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        gap = 1.0 / self.per_thread
        next_at = time.monotonic()
        while self.running:
            try:
                conn.request("GET", "/", headers=self.headers)
                r = conn.getresponse()
                r.read()
                status = r.status
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                status = 0
            with self.lock:
                self.results.append((time.monotonic(), status))
            next_at += gap
            time.sleep(max(0.0, next_at - time.monotonic()))
        conn.close()

    def admitted(self, start=None, end=None):
        return self.count(200, start, end)

    def count(self, status, start=None, end=None):
        with self.lock:
            return sum(1 for t, s in self.results if s == status
                       and (start is None or t >= start) and (end is None or t < end))

    def statuses(self):
        with self.lock:
            out: dict = {}
            for _, s in self.results:
                out[s] = out.get(s, 0) + 1
            return out
