"""Throttling of one bucket's partition is that bucket's answer, never an outage (issue 27,
point 12): a real `shardgate serve --store dynamodb` with default flags, in front of its
own DynamoDB Local through `fault_proxy.py`, whose faults are narrowed here to one
bucket's requests (`key=`), as DynamoDB throttles one hot partition.

- A bucket whose every request is throttled (`ProvisionedThroughputExceeded` or
  `ThrottlingException`, with no reason naming the table's limit) is answered OVER_LIMIT
  with a 100 ms reset — on both domains, whatever its `failure_mode` — while another
  bucket is decided as usual all along; the circuit never opens and no request is
  answered by `failure_mode`. Afterwards the bucket holds exactly what it held: the
  refusals took nothing. Before, each throttle was a store failure: UNAVAILABLE or OK
  unlimited, and the breaker opened for every bucket.
- A single throttled fast debit on an existing bucket's shard drives that bucket's
  doubling (the same as a `wcu` run dry), and the request is admitted on a new shard.

Throttling of the whole table stays an outage: test_store_fault_injection.py's `ptee` and
`throttle` cases carry the table's and the account's throttling reasons.
"""
import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2

from test_store_fault_injection import (
    ALLOW, CARRY_BEFORE, CARRY_LIMIT, CALL_DEADLINE_S, DENY, DOMAINS, P, Report, Stack, call,
    descriptor,
)

THROTTLES = [
    ("ptee", "400 ProvisionedThroughputExceeded"),
    ("throttle", "400 ThrottlingException"),
]
CALLS = 10  # rounds: in each, HOT_RUN calls on the throttled bucket per domain, then one
HOT_RUN = 3  # on another bucket per domain (six hot in a row: past the breaker's five)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("store-throttling"), Report())
    try:
        s.start()
        yield s
    finally:
        s.stop()


def answer(server, domain, key, value):
    """(overall code's name, the descriptor's reset in ms) of one ShouldRateLimit, or the
    gRPC error's code name."""
    req = rls_pb2.RateLimitRequest(domain=domain, descriptors=[descriptor(key, value)])
    try:
        r = server.rls.ShouldRateLimit(req, timeout=CALL_DEADLINE_S)
    except grpc.RpcError as e:
        return e.code().name
    (s,) = r.statuses
    code = rls_pb2.RateLimitResponse.Code.Name(r.overall_code)
    return code, s.duration_until_reset.seconds * 1000 + s.duration_until_reset.nanos // 10**6


def counters(server, proxy, fault):
    m = server.metrics()
    return {
        "circuit_open": m.sum(P + "store_calls_total", outcome="circuit_open"),
        "store_errors": m.sum(P + "store_calls_total", outcome="error"),
        "throttled_calls": m.sum(P + "store_calls_total", outcome="throttled"),
        "failure_answers": m.sum(P + "store_failure_answers_total"),
        "throttled_refusals": m.sum(P + "throttled_refusals_total"),
        "doublings": m.sum(P + "shard_doublings_total"),
        "faulted": proxy.stats()["faulted"].get(fault, 0),
    }


def delta(after, before):
    return {k: after[k] - before[k] for k in after}


@pytest.mark.parametrize("fault,label", THROTTLES, ids=[t[0] for t in THROTTLES])
def test_a_throttled_bucket_is_refused_for_a_moment_while_the_others_are_decided(
        stack, fault, label):
    server, proxy = stack.server, stack.proxy
    proxy.set("pass")
    assert stack.wait_decisions(server, f"{fault}-ready") is not None, server.log()[-3000:]
    hot, other = f"hot-{fault}", f"other-{fault}"
    stack.debit_carry(server, hot)
    before = counters(server, proxy, fault)
    # Every request on the hot bucket's items (both domains' buckets of `carry=<hot>`).
    proxy.set(fault, key=f"#carry={hot}#")
    hot_answers, other_answers = [], []
    for _ in range(CALLS):
        for d in DOMAINS:
            hot_answers += [answer(server, d, "carry", hot) for _ in range(HOT_RUN)]
        for d in DOMAINS:
            other_answers.append(call(server, d, "user", other)[::2])
    seen = delta(counters(server, proxy, fault), before)
    # The other bucket first: before, the circuit opened for it too.
    want = [("OK", 50 - 1 - i) for i in range(CALLS) for _ in DOMAINS]
    assert other_answers == want, (label, other_answers, seen)
    assert hot_answers == [("OVER_LIMIT", 100)] * (2 * HOT_RUN * CALLS), (label, hot_answers)
    assert seen["circuit_open"] == 0 and seen["store_errors"] == 0, seen
    assert seen["failure_answers"] == 0, seen
    hot_calls = 2 * HOT_RUN * CALLS
    assert seen["throttled_refusals"] == hot_calls, seen
    assert seen["throttled_calls"] >= hot_calls, seen
    # Answered at once: one throttled request for the debit, one for the doubling's read.
    assert hot_calls <= seen["faulted"] <= 2 * hot_calls, seen
    assert seen["doublings"] == 0, seen
    proxy.set("pass")
    stack.check_exact(server, "carry", hot, CARRY_BEFORE, CARRY_LIMIT)
    assert server.proc.poll() is None and "panicked" not in server.log()


def test_a_throttled_debit_doubles_its_bucket(stack):
    """One throttled fast debit on shard 0 of an existing bucket: the bucket doubles (its
    shard 0 raised to two shards) and the request is admitted on the new shard."""
    server, proxy = stack.server, stack.proxy
    proxy.set("pass")
    tag = "doubling"
    assert call(server, DENY, "user", tag)[::2] == ("OK", 49)
    before = counters(server, proxy, "throttle")
    # The next write on shard 0's item (quoted: not shard 01…), once.
    proxy.set("throttle", key=f'#user={tag}#{DENY}#0"', op="UpdateItem", times=1)
    o, _, _ = call(server, DENY, "user", tag)
    m = server.metrics()
    seen = delta(counters(server, proxy, "throttle"), before)
    assert o == "OK", (o, seen, server.log()[-3000:])
    assert seen["faulted"] == 1 and seen["doublings"] == 1, seen
    assert seen["throttled_refusals"] == 0 and seen["failure_answers"] == 0, seen
    assert m.value(P + "bucket_shards", entity=f"user={tag}", resource=DENY) == 2
    proxy.set("pass")
    # The other domain's bucket of the same user is its own: decided as usual.
    assert call(server, ALLOW, "user", tag)[::2] == ("OK", 49)
