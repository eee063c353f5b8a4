"""The Rate Limit Quota Service against a real Envoy 1.40: the `rate_limit_quota` filter in
front of the backend, shardgate as its RLQS server (docs/rlqs.md), one rule of 50 requests
per second on the tenant header; no store is involved (the memory store only).

Observed with Envoy 1.40: a new bucket's first request sends a report at once; until it is
answered (a few ms) Envoy applies the filter's `no_assignment_behavior` (ALLOW_ALL here:
the 50-odd extra requests of the first second at 160 offered per second), then enforces
shardgate's token bucket itself and answers a request over it 429. It reports every 5 s,
whatever the bucket's `reporting_interval` says."""
import time

import pytest

from envoy_e2e import E2EError, Envoy, Shardgate, Store, http_get, wait_until
from rlqs_e2e import LIMIT, REPORT_S, RULES, Load, rlqs_envoy_config

LOAD_S = 12.0
ENVOY_REPORT_S = 5.0  # Envoy 1.40's fixed report cycle


@pytest.fixture
def rlqs_stack(shardgate_bin, envoy_bin, tmp_path):
    rules = tmp_path / "rlqs.yaml"
    rules.write_text(RULES)
    sg = Shardgate(shardgate_bin, rules, Store("memory"), tmp_path, "rlqs")
    envoy = None
    try:
        sg.start()
        envoy = Envoy(envoy_bin, tmp_path, "rlqs", lambda ports: rlqs_envoy_config(ports, sg.port))
        envoy.start()
    except E2EError as e:
        if envoy is not None:
            envoy.stop()
        sg.stop()
        pytest.fail(str(e))
    yield sg, envoy
    envoy.stop()
    sg.stop()


def first_denial(envoy, tenant):
    """Waits until a request of `tenant` is answered 429 (its assignment is enforced)."""
    return wait_until(lambda: envoy.get("/", {"x-tenant": tenant}).status == 429, 20,
                      f"a 429 for tenant {tenant}", interval=0.01)


def test_a_limit_is_enforced_by_envoy_within_the_bound(rlqs_stack):
    sg, envoy = rlqs_stack
    load = Load(envoy.port, "acme", threads=4, per_thread=40).start()
    try:
        time.sleep(LOAD_S)
    finally:
        load.stop()
    statuses = load.statuses()
    start = load.results[0][0]
    end = load.results[-1][0]
    # Once the first assignment is in force (the first report's round trip), Envoy admits
    # at most the limit over the window plus the bucket it starts full (one second's).
    settled = start + 1.0
    window = end - settled
    admitted = load.admitted(settled)
    bound = LIMIT * window + LIMIT
    per_second = [load.admitted(start + i, start + i + 1) for i in range(int(end - start))]
    print(f"admitted per second {per_second}")
    print(f"statuses {statuses}; after 1 s: {admitted} admitted in "
          f"{window:.1f}s (bound {bound:.0f})")
    assert admitted <= bound, (admitted, bound, statuses)
    # The limit is used, not starved: 90 % of it at least.
    assert admitted >= 0.9 * LIMIT * window, (admitted, window, statuses)
    assert statuses.get(429, 0) > 0, statuses
    assert set(statuses) <= {200, 429}, statuses


def test_deny_and_allow_rules_become_blanket_assignments(rlqs_stack):
    sg, envoy = rlqs_stack
    first_denial(envoy, "banned")
    # Denied from then on, every request.
    assert all(envoy.get("/", {"x-tenant": "banned"}).status == 429 for _ in range(20))
    # An unlimited tenant: never denied, well past the 50/s rule of another tenant.
    load = Load(envoy.port, "free", threads=2, per_thread=50).start()
    try:
        time.sleep(3 * REPORT_S)
    finally:
        load.stop()
    assert load.statuses().get(200, 0) > 0 and set(load.statuses()) == {200}, load.statuses()


def metric(sg, line_start):
    """The value of the first line of shardgate's /metrics that starts with `line_start`."""
    body = http_get(sg.http_port, "/metrics").body.decode()
    for line in body.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {line_start} in /metrics:\n{body}")


def test_a_reload_that_lowers_the_limit_is_enforced_within_two_report_intervals(
        rlqs_stack, tmp_path):
    sg, envoy = rlqs_stack
    load = Load(envoy.port, "acme", threads=2, per_thread=50).start()
    try:
        time.sleep(3)
        # An atomic rename, as a ConfigMap update or a deploy does it.
        staged = tmp_path / "staged.yaml"
        staged.write_text(RULES.replace(f"requests_per_unit: {LIMIT}", "requests_per_unit: 10"))
        staged.rename(tmp_path / "rlqs.yaml")
        reloaded = time.monotonic()
        time.sleep(2 * ENVOY_REPORT_S + 3)
    finally:
        load.stop()
    after = reloaded + 2 * ENVOY_REPORT_S
    lowered = load.admitted(after, after + 3)
    print(f"admitted per second {[load.admitted(reloaded + i, reloaded + i + 1) for i in range(13)]}")
    # 10 a second from then on (and the bucket it starts full: a second of it).
    assert lowered <= 10 * 3 + 10, lowered
    assert lowered >= 0.8 * 10 * 3, lowered
    assert metric(sg, "shardgate_rlqs_streams_open ") == 1
    assert metric(sg, "shardgate_rlqs_buckets ") == 1
    assert metric(sg, 'shardgate_rlqs_assignments_sent_total{kind="token_bucket"}') >= 2
    assert metric(sg, 'shardgate_rlqs_reported_requests_total{verdict="denied"}') > 0
    assert metric(sg, 'shardgate_rlqs_reported_requests_total{verdict="allowed"}') > 0


def test_a_broken_stream_is_reopened_and_the_limit_holds_across_it(rlqs_stack):
    sg, envoy = rlqs_stack
    load = Load(envoy.port, "acme", threads=2, per_thread=50).start()
    try:
        first_denial(envoy, "acme")
        # The server goes away and comes back on the same port: the stream breaks, Envoy
        # keeps its assignment (15 s TTL) and opens a new stream at a later report.
        sg.restart()
        restarted = time.monotonic()
        wait_until(lambda: metric(sg, "shardgate_rlqs_streams_open ") == 1,
                   3 * ENVOY_REPORT_S, "Envoy's new RLQS stream")
        reopened = time.monotonic()
        time.sleep(3)
    finally:
        load.stop()
    window = time.monotonic() - restarted
    admitted = load.admitted(restarted)
    print(f"stream reopened {reopened - restarted:.1f}s after the restart; "
          f"{admitted} admitted in {window:.1f}s")
    assert admitted <= LIMIT * window + 2 * LIMIT, (admitted, window)
    assert load.count(429, reopened) > 0


def test_an_rlqs_section_drops_a_key_so_two_envoy_buckets_share_one_limit(
        shardgate_bin, envoy_bin, tmp_path):
    """Bucket ids `{tenant, client}`; the rules' `rlqs: {keys: [tenant]}` drops `client`,
    so two clients of one tenant share the tenant's 50/s (without the section each client
    would be a descriptor of its own, and with a key-only `client` rule, a limit of its
    own)."""
    rules = tmp_path / "rlqs.yaml"
    rules.write_text(RULES + "rlqs:\n  keys: [tenant]\n")
    sg = Shardgate(shardgate_bin, rules, Store("memory"), tmp_path, "rlqs")
    envoy = None
    try:
        sg.start()
        envoy = Envoy(envoy_bin, tmp_path, "rlqs",
                      lambda ports: rlqs_envoy_config(ports, sg.port, client_key=True))
        envoy.start()
        loads = [Load(envoy.port, "acme", threads=2, per_thread=40, headers={"x-client": c})
                 for c in ("web", "batch")]
        for load in loads:
            load.start()
        try:
            time.sleep(ENVOY_REPORT_S + 9)
        finally:
            for load in loads:
                load.stop()
        said = http_get(sg.http_port, "/rlconfig").body.decode()
    finally:
        if envoy is not None:
            envoy.stop()
        sg.stop()
    start = min(load.results[0][0] for load in loads)
    end = max(load.results[-1][0] for load in loads)
    # After one of Envoy's 5 s report cycles: the second bucket's first report (sent
    # alone, at its first request) gets a floor share beside the first's whole limit; the
    # next report carries both, and the first's share falls before the second's rises.
    settled = start + ENVOY_REPORT_S + 1.0
    window = end - settled
    each = [load.admitted(settled) for load in loads]
    bound = LIMIT * window + 2 * LIMIT
    for load in loads:
        print(f"{load.headers}: admitted per second "
              f"{[load.admitted(start + i, start + i + 1) for i in range(int(end - start))]}")
    print(f"admitted after {settled - start:.0f} s: {each} in {window:.1f}s (bound {bound:.0f})")
    print(said)
    assert sum(each) <= bound, (each, bound)
    assert sum(each) >= 0.8 * LIMIT * window, (each, window)
    assert all(n >= 0.25 * LIMIT * window for n in each), each
    # One bucket (the descriptor tenant=acme) held twice by one Envoy's stream.
    assert "rlqs buckets: 1:" in said and "rlqs (tenant=acme): 1 Envoy stream" in said, said
    assert said.count(" %") == 2, said
