"""shardgate up, its DynamoDB table unreachable: the domain's `failure_mode` decides what
shardgate answers, and Envoy's `failure_mode_deny` what the client sees.

- `failure_mode: deny` (default): shardgate answers gRPC UNAVAILABLE; Envoy, failing closed,
  answers 500.
- `failure_mode: allow`: shardgate answers OK, counting nothing; Envoy passes the request.
- gRPC health (service `ratelimit`, the readiness probes' name) is NOT_SERVING meanwhile:
  the store has never answered since start-up (a store failing later leaves the server
  ready; see test_k8s_examples.py).

Not parametrized over stores: the point is a DynamoDB store whose endpoint refuses
connections (a closed loopback port), which needs no DynamoDB at all.
"""
import pytest

from envoy_e2e import (
    HERE, ROUTER, E2EError, Envoy, Shardgate, Store, backend_listener, bootstrap, free_port,
    header, http_listener, ratelimit_filter, route_with_filter_rate_limits, static_cluster,
    unique, wait_until,
)


def config(ports, shardgate_port):
    def limited(prefix, domain):
        r = route_with_filter_rate_limits(prefix, [{"actions": [header("x-user", "user")]}])
        # RateLimitPerRoute.domain overrides the filter's domain for this route.
        r["typed_per_filter_config"]["envoy.filters.http.ratelimit"]["domain"] = domain
        return r

    routes = [limited("/deny", "store_down_deny"), limited("/allow", "store_down_allow")]
    filters = [ratelimit_filter("unused", failure_mode_deny=True),
               {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}]
    return bootstrap(
        ports["admin"],
        [http_listener("main", ports["main"], routes, filters), backend_listener(ports["backend"])],
        [static_cluster("shardgate", shardgate_port, http2=True),
         static_cluster("backend", ports["backend"]), health_checked(shardgate_port)],
    )


def health_checked(shardgate_port):
    """A cluster no route uses, whose only job is Envoy's gRPC health check of shardgate
    with the service name the Kubernetes readiness probes use."""
    cluster = static_cluster("shardgate_health", shardgate_port, http2=True)
    cluster["health_checks"] = [{
        "timeout": "1s", "interval": "0.2s", "no_traffic_interval": "0.2s",
        "unhealthy_threshold": 1, "healthy_threshold": 1,
        "grpc_health_check": {"service_name": "ratelimit"},
    }]
    return cluster


@pytest.fixture(scope="module")
def down(shardgate_bin, envoy_bin, tmp_path_factory):
    """shardgate on a DynamoDB endpoint that refuses connections, behind Envoy."""
    workdir = tmp_path_factory.mktemp("store-down")
    dead = Store("dynamodb", endpoint=f"http://127.0.0.1:{free_port()}", table="unreachable")
    sg = Shardgate(shardgate_bin, HERE / "limits-store-down", dead, workdir, "store-down")
    envoy = Envoy(envoy_bin, workdir, "store-down", lambda ports: config(ports, sg.port))
    try:
        sg.start()
        envoy.start()
    except E2EError as e:
        envoy.stop()
        sg.stop()
        pytest.fail(str(e))
    yield sg, envoy
    envoy.stop()
    sg.stop()


def test_store_unreachable_deny_500_allow_200(down):
    sg, envoy = down
    user = {"x-user": unique("u")}
    ok = envoy.counter("cluster.backend.ratelimit.ok")
    for _ in range(2):  # past the 1/minute: nothing is counted while the store is down
        r = envoy.get("/allow", user)
        assert r.status == 200, (r, sg.proc.log())
    assert envoy.counter("cluster.backend.ratelimit.ok") == ok + 2

    errors = envoy.counter("cluster.backend.ratelimit.error")
    r = envoy.get("/deny", user)
    assert r.status == 500, (r, sg.proc.log())
    assert envoy.counter("cluster.backend.ratelimit.error") == errors + 1
    assert "rate-limit store unavailable" in sg.proc.log(tail=400) or \
        "store unavailable" in sg.proc.log(tail=400), sg.proc.log()


def test_grpc_health_is_not_serving_while_the_store_is_down(down):
    sg, envoy = down
    # NOT_SERVING, not a network error: the server is up, its store is not. A readiness
    # probe on this service takes the pod out of the Service's endpoints.
    wait_until(lambda: envoy.counter("cluster.shardgate_health.health_check.failure") >= 3, 30,
               "failed gRPC health checks", detail=sg.proc.log)
    assert envoy.counter("cluster.shardgate_health.health_check.network_failure") == 0
    assert envoy.counter("cluster.shardgate_health.membership_healthy") == 0


def test_store_unreachable_allow_sends_no_rate_limit_headers(down):
    """Failing open counts nothing, so it must not tell the client how much is left."""
    sg, envoy = down
    r = envoy.get("/allow", {"x-user": unique("u")})
    assert r.status == 200
    assert not any(h.startswith("x-ratelimit-") for h in r.headers), r.headers
