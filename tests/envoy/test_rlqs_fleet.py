"""Two shardgate replicas on one DynamoDB Local table, one Envoy 1.40 on each, one RLQS
bucket (tenant=acme, 50 requests per second, a burst of 50) under load through both
(docs/rlqs.md, "A fleet"): each replica draws its Envoys' tokens from the rule's bucket in
the shared store, so the two Envoys together stay within the one limit — where two
replicas dividing the limit on their own would each hand out all of it. Each Envoy starts
with `no_assignment_behavior: DENY_ALL`, so that nothing is admitted but by assignment."""
import os
import time

import pytest

from envoy_e2e import E2EError, Envoy, Shardgate, Store, create_table
from rlqs_e2e import LIMIT, RULES, Load, rlqs_envoy_config

BURST = LIMIT  # the rule's burst: requests_per_unit, as upstream's format has it
RUNWAY_S = 1.0  # src/service/rlqs/grant.rs: a replica's bank tops up to this much rate
RUN_S = 20.0
DDB_ENV = "SHARDGATE_TEST_DYNAMODB_ENDPOINT"  # as conftest.py


@pytest.fixture
def fleet(shardgate_bin, envoy_bin, tmp_path):
    endpoint = os.environ.get(DDB_ENV)
    if not endpoint:
        pytest.fail(f"{DDB_ENV} is not set: scripts/test starts DynamoDB Local")
    store = Store("dynamodb", endpoint=endpoint, table="shardgate-e2e-envoy", shared=True)
    rules = tmp_path / "rlqs.yaml"
    rules.write_text(RULES)
    started = []
    try:
        create_table(shardgate_bin, store, tmp_path / "create.log")
        pairs = []
        for tag in ("a", "b"):
            sg = Shardgate(shardgate_bin, rules, store, tmp_path, f"fleet-{tag}")
            started.append(sg.start())
            e = Envoy(envoy_bin, tmp_path, f"fleet-envoy-{tag}",
                      lambda ports, sg=sg: rlqs_envoy_config(ports, sg.port, "DENY_ALL"))
            started.append(e.start())
            pairs.append((sg, e))
    except E2EError as err:
        for p in reversed(started):
            p.stop()
        pytest.fail(str(err))
    yield pairs
    for p in reversed(started):
        p.stop()


def metric(sg, line_start):
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{sg.http_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(line_start))


def test_two_replicas_share_one_limit_through_the_store(fleet):
    (sg_a, envoy_a), (sg_b, envoy_b) = fleet
    load_a = Load(envoy_a.port, "acme", threads=2, per_thread=50).start()
    load_b = Load(envoy_b.port, "acme", threads=2, per_thread=50).start()
    t0 = time.monotonic()
    try:
        time.sleep(RUN_S)
    finally:
        load_a.stop()
        load_b.stop()
    end = time.monotonic()
    got_a, got_b = load_a.admitted(), load_b.admitted()
    total = got_a + got_b
    # What the store's bucket can give in the run: its burst and its refill, plus the
    # runway each replica draws ahead (the bank's tokens are drawn before they are spent).
    bound = BURST + LIMIT * (end - t0 + RUNWAY_S)
    drawn = [metric(sg, "shardgate_rlqs_drawn_tokens_total") for sg in (sg_a, sg_b)]
    draws = [metric(sg, "shardgate_rlqs_draws_total") for sg in (sg_a, sg_b)]
    settled = t0 + 6
    per_second = [load_a.admitted(t0 + i, t0 + i + 1) + load_b.admitted(t0 + i, t0 + i + 1)
                  for i in range(int(RUN_S))]
    print(f"fleet of 2 in {end - t0:.1f}s: a {got_a}, b {got_b}, together {total} "
          f"(bound {bound:.0f}; two replicas on their own would allow ~{2 * LIMIT * RUN_S:.0f}); "
          f"drawn {drawn} in {draws} draws; admitted per second {per_second}; "
          f"statuses a {load_a.statuses()}, b {load_b.statuses()}")
    assert set(load_a.statuses()) | set(load_b.statuses()) <= {200, 429}, \
        (load_a.statuses(), load_b.statuses())
    assert total <= bound, (total, bound)
    # Every token admitted was drawn from the store first.
    assert total <= sum(drawn), (total, drawn)
    # The limit is used, not starved: 70 % of it once the draws have settled.
    after = load_a.admitted(settled, end) + load_b.admitted(settled, end)
    assert after >= 0.7 * LIMIT * (end - settled), (after, end - settled)
    # Neither replica's Envoy is shut out.
    assert min(got_a, got_b) >= 0.2 * total, (got_a, got_b)
