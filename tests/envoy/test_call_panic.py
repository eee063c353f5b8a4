"""One call's panic stays in its call, seen through a real Envoy.

The server is a build with the test-only `test-hooks` feature (a descriptor entry keyed
`shardgate-test-panic` makes its call panic; no release build has it):

    cargo build --bin shardgate --features test-hooks
    cp target/debug/shardgate target/debug/shardgate-test-hooks
    cargo build --bin shardgate   # the ordinary binary back (a relink)

and `SHARDGATE_TEST_HOOKS_BIN` names it (default: target/debug/shardgate-test-hooks).
200 requests go through one Envoy worker at once, so their rate-limit calls are in flight
together on its one HTTP/2 connection to shardgate; one of them carries the trigger.
Envoy must count exactly one `ratelimit.error` (the panicking call, answered INTERNAL, which
`failure_mode_deny` turns into a 500), answer the 199 others 200 with their rate-limit
headers, and keep its connection: no new one is opened.
"""
import os
import pathlib

import pytest

from conftest import start_stack
from envoy_e2e import (
    REPO, ROUTER, Store, at_once, backend_listener, bootstrap, generous_user_rules, header,
    http_get, http_listener, ratelimit_filter, route, static_cluster, unique,
)

CALLS = 200

CONFIG = generous_user_rules("panics")


def hooks_bin():
    path = pathlib.Path(os.environ.get(
        "SHARDGATE_TEST_HOOKS_BIN", REPO / "target" / "debug" / "shardgate-test-hooks"))
    if not path.is_file():
        pytest.fail(f"{path} not found: build it as this module's docstring says")
    return str(path)


def envoy_config(ports, shardgate_port):
    rate_limits = [{"actions": [header("x-user", "user")]},
                   {"actions": [header("x-boom", "shardgate-test-panic")]}]
    routes = [route("/warmup", [{"actions": [header("x-user", "user")]}]),
              route("/p", rate_limits)]
    filters = [ratelimit_filter("panics", failure_mode_deny=True),
               {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}]
    return bootstrap(
        ports["admin"],
        [http_listener("main", ports["main"], routes, filters), backend_listener(ports["backend"])],
        [static_cluster("shardgate", shardgate_port, http2=True),
         static_cluster("backend", ports["backend"])],
    )


def test_a_panicking_call_costs_envoy_one_error(envoy_bin, tmp_path):
    config = tmp_path / "rules"
    config.mkdir()
    (config / "panics.yaml").write_text(CONFIG)
    stack = start_stack(
        hooks_bin(), envoy_bin, Store("memory"), tmp_path, "panic",
        envoy_config, config=str(config),
        wait_ready=lambda st: _ready(st))
    try:
        envoy = stack.envoy
        errors = envoy.counter("cluster.backend.ratelimit.error")
        connections = envoy.counter("cluster.shardgate.upstream_cx_total")

        def headers_of(i):
            headers = {"x-user": unique("u")}
            if i == CALLS // 2:
                headers["x-boom"] = "now"
            return headers

        statuses = [(r.status, r.header("x-ratelimit-limit") is not None)
                    for r in at_once(envoy, "/p", headers_of, CALLS)]
        assert statuses[CALLS // 2] == (500, False), statuses[CALLS // 2]
        others = [s for i, s in enumerate(statuses) if i != CALLS // 2]
        assert others == [(200, True)] * (CALLS - 1), sorted(set(others))
        assert envoy.counter("cluster.backend.ratelimit.error") == errors + 1
        assert envoy.counter("cluster.shardgate.upstream_cx_total") == connections, \
            "Envoy's connection to shardgate stayed open"
        assert stack.shardgate.proc.alive()
        page = http_get(stack.shardgate.http_port, "/metrics").body.decode()
        assert 'shardgate_call_panics_total{end="internal"} 1' in page, page
        assert "test-only panic trigger" in stack.shardgate.proc.log(tail=400)
    finally:
        stack.stop()


def _ready(stack):
    from envoy_e2e import wait_rate_limited_path
    wait_rate_limited_path(stack.envoy, "/warmup", {"x-user": "warm"}, detail=stack.logs)
