"""Envoy's `failure_mode_deny` when shardgate is unreachable.

Observed with Envoy 1.40: the ratelimit filter treats a failed call (here: connection
refused) as an error; with `failure_mode_deny: true` it answers 500 (its `status_on_error`
default) and counts `cluster.<upstream>.ratelimit.error`; with `false` it lets the request
through (200) and also counts `ratelimit.failure_mode_allowed`.
"""
import pytest

from envoy_e2e import (
    E2EError, ROUTER, backend_listener, bootstrap, header, http_listener, ratelimit_filter,
    route, static_cluster, unique, wait_rate_limited_path,
)


def two_listener_config(ports, shardgate_port):
    """Two listeners in front of the same shardgate: `main` fails closed, `open` fails open."""
    routes = [route("/warmup", [{"actions": [{"generic_key": {"descriptor_value": "warmup"}}]}]),
              route("/user", [{"actions": [header("x-user", "user")]}])]
    router = {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}

    def listener(name, port, deny):
        return http_listener(name, port, routes, [ratelimit_filter("e2e", deny), router])

    return bootstrap(
        ports["admin"],
        [listener("main", ports["main"], True), listener("open", ports["open"], False),
         backend_listener(ports["backend"])],
        [static_cluster("shardgate", shardgate_port, http2=True),
         static_cluster("backend", ports["backend"])],
    )


@pytest.fixture
def failure_stack(stack_factory):
    s = stack_factory("failure", two_listener_config, extra_ports=("open",))
    # Both listeners are wired to shardgate: rate-limit headers come back on each.
    wait_rate_limited_path(s.envoy, port=s.envoy.ports["open"], detail=s.logs)
    return s


def test_shardgate_stopped_failure_mode_deny_true_answers_500(failure_stack):
    s = failure_stack
    user = {"x-user": unique("u")}
    assert s.get("/user", user).status == 200
    errors = s.envoy.counter("cluster.backend.ratelimit.error")
    s.shardgate.stop()
    r = s.get("/user", user)
    assert r.status == 500, r
    assert r.header("x-ratelimit-limit") is None
    assert s.envoy.counter("cluster.backend.ratelimit.error") == errors + 1
    # Back again on the same port: Envoy reconnects and limits again.
    try:
        s.shardgate.restart()
        wait_rate_limited_path(s.envoy, "/user", user, detail=s.logs)
    except E2EError as e:
        pytest.fail(str(e))


def test_shardgate_stopped_failure_mode_deny_false_answers_200(failure_stack):
    s = failure_stack
    port = s.envoy.ports["open"]
    allowed = s.envoy.counter("cluster.backend.ratelimit.failure_mode_allowed")
    s.shardgate.stop()
    user = {"x-user": unique("u")}
    # Fails open: every request passes, even past the rule's 3/minute.
    for _ in range(5):
        r = s.get("/user", user, port=port)
        assert r.status == 200, r
        assert r.header("x-ratelimit-limit") is None  # no verdict, no headers
    assert s.envoy.counter("cluster.backend.ratelimit.failure_mode_allowed") == allowed + 5
