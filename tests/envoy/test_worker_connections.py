"""How many connections one Envoy worker opens to shardgate, and what sets it.

Envoy keeps one HTTP/2 connection per worker to the rate-limit cluster and opens another
when a connection has as many calls in flight as it may carry. Cheap calls of one
connection are decided on one core (docs/architecture.md, "Every core for one busy
connection"), so docs/operations.md tells an operator with more cores than Envoy workers to
cap the streams in Envoy's cluster (`http2_protocol_options.max_concurrent_streams`).
These tests hold that advice to a real Envoy 1.40 with one worker and a burst of 200 calls:

- capped in Envoy's cluster, the burst arrives over several connections, every call
  answered;
- by default (Envoy's cap 2^31 - 1, shardgate's 1024) one connection carries it all;
- capped by shardgate's own SETTINGS (`--grpc-max-concurrent-streams 8`), Envoy opens more
  connections too, but sends each new one a burst before it has read the limit; h2 refuses
  the streams past it, Envoy does not retry a refused rate-limit call, and each refusal is
  one call failed, counted alike by Envoy and by shardgate's
  `shardgate_grpc_stream_resets_sent_total{code="refused_stream"}`, each a
  `ratelimit.error` in Envoy. shardgate warns at start-up of a limit below 100.

By hand, with these tests' set-up and the counts printed: a cap of 8 in Envoy's cluster
opened 15, 18 and 21 connections in three runs; shardgate's limit of 8 had 73, 116, 139
and 140 of the 200 calls refused in four.
"""
import collections
import re

from conftest import start_stack
from envoy_e2e import (
    ROUTER, Store, at_once, backend_listener, bootstrap, generous_user_rules, header,
    http_get, http_listener, ratelimit_filter, route, static_cluster, unique,
    wait_rate_limited_path,
)

CALLS = 200
CAP = 8

RULES = generous_user_rules("spread")


def envoy_config(cap):
    """One worker's Envoy (the suite runs `--concurrency 1`) whose rate-limit cluster
    carries at most `cap` calls per connection (None: Envoy's default)."""
    def build(ports, shardgate_port):
        cluster = static_cluster(
            "shardgate", shardgate_port, http2=True,
            http2_options=None if cap is None else {"max_concurrent_streams": cap})
        routes = [route("/", [{"actions": [header("x-user", "user")]}])]
        filters = [ratelimit_filter("spread", failure_mode_deny=True),
                   {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}]
        return bootstrap(
            ports["admin"],
            [http_listener("main", ports["main"], routes, filters),
             backend_listener(ports["backend"])],
            [cluster, static_cluster("backend", ports["backend"])],
        )
    return build


# What a burst came back with and what each side counted: Envoy's connections opened and
# still open, its rate-limit errors and the resets it received; shardgate's open
# connections and the streams it refused; shardgate's log.
Burst = collections.namedtuple(
    "Burst", "statuses opened active ratelimit_errors resets_received open refused log")


def burst(shardgate_bin, envoy_bin, tmp_path, tag, cap, shardgate_args=()):
    """CALLS requests through Envoy's one worker at once, each its own user (bucket); what
    came back and what each side counted."""
    rules = tmp_path / f"rules-{tag}"
    rules.mkdir()
    (rules / "spread.yaml").write_text(RULES)
    stack = start_stack(
        shardgate_bin, envoy_bin, Store("memory"), tmp_path, tag, envoy_config(cap),
        shardgate_args=shardgate_args, config=str(rules),
        wait_ready=lambda st: wait_rate_limited_path(
            st.envoy, "/warmup", {"x-user": "warm"}, detail=st.logs))
    try:
        responses = at_once(stack.envoy, "/p", lambda i: {"x-user": unique("u")}, CALLS)
        page = http_get(stack.shardgate.http_port, "/metrics").body.decode()
        envoy = stack.envoy
        return Burst(
            statuses=collections.Counter(r.status for r in responses),
            opened=envoy.counter("cluster.shardgate.upstream_cx_total"),
            active=envoy.counter("cluster.shardgate.upstream_cx_active"),
            ratelimit_errors=envoy.counter("cluster.backend.ratelimit.error"),
            resets_received=envoy.counter("cluster.shardgate.http2.rx_reset"),
            open=metric(page, "shardgate_grpc_connections_open"),
            refused=metric(page, 'shardgate_grpc_stream_resets_sent_total{code="refused_stream"}'),
            log=stack.shardgate.proc.log(tail=200),
        )
    finally:
        stack.stop()


def metric(page, name):
    """The value of the series `name` (with its labels) on shardgate's /metrics page."""
    found = re.search(rf"^{re.escape(name)} (\d+)$", page, re.M)
    assert found, f"{name} not on /metrics"
    return int(found.group(1))


def test_streams_capped_in_envoys_cluster_spread_one_worker_over_connections(
        shardgate_bin, envoy_bin, tmp_path):
    got = burst(shardgate_bin, envoy_bin, tmp_path, "capped", CAP)
    assert got.statuses == {200: CALLS}, got.statuses
    assert got.opened >= 2, f"one worker opened {got.opened} connection(s)"
    assert got.active >= 2 and got.open == got.active, \
        f"Envoy holds {got.active} connections, shardgate {got.open}"
    assert (got.refused, got.resets_received, got.ratelimit_errors) == (0, 0, 0)


def test_by_default_one_worker_keeps_one_connection(shardgate_bin, envoy_bin, tmp_path):
    got = burst(shardgate_bin, envoy_bin, tmp_path, "default", None)
    assert got.statuses == {200: CALLS}, got.statuses
    assert (got.opened, got.open, got.refused, got.ratelimit_errors) == (1, 1, 0, 0)
    assert "--grpc-max-concurrent-streams" not in got.log


def test_a_limit_in_shardgates_settings_refuses_envoys_bursts_and_counts_them(
        shardgate_bin, envoy_bin, tmp_path):
    got = burst(shardgate_bin, envoy_bin, tmp_path, "settings", None,
                shardgate_args=["--grpc-max-concurrent-streams", str(CAP)])
    assert got.opened >= 2, "Envoy reads the limit and opens more connections"
    assert set(got.statuses) <= {200, 500}, got.statuses
    failed = got.statuses[500]
    assert failed > 0, "a burst on each new connection meets the limit before it is read"
    assert (got.refused, got.ratelimit_errors) == (failed, failed), \
        f"{failed} calls failed; shardgate refused {got.refused}, Envoy erred {got.ratelimit_errors}"
    # Envoy counts every reset it receives, whatever its code; here each is a refusal.
    assert got.resets_received == failed, got.resets_received
    assert f"--grpc-max-concurrent-streams {CAP} is below 100" in got.log
