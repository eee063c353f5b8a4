"""An independent client (grpcio + Envoy's published protos from xds-protos) against a real
`shardgate serve` process: the answers config.md promises, seen from outside the crate.

Limits are token buckets: `N per minute` is a bucket of N tokens refilled at N/min, so
after k requests it is full again in k × 60/N s, and a refused request waits for its
missing tokens plus 1 ms. The server runs on the system clock: durations are checked
against ranges that the milliseconds elapsed during the test allow.
"""
import json
import subprocess
import textwrap
import time

import grpc
import pytest
from google.protobuf import wrappers_pb2
from grpc_health.v1 import health_pb2
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2

from conftest import EXIT_TIMEOUT_S, binary, free_port

OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT
MINUTE = rls_pb2.RateLimitResponse.RateLimit.MINUTE
SECOND = rls_pb2.RateLimitResponse.RateLimit.SECOND
HOUR = rls_pb2.RateLimitResponse.RateLimit.HOUR


def desc(*entries, hits=None):
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if hits is not None:
        d.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=hits))
    return d


def request(domain, *descriptors, hits_addend=0):
    return rls_pb2.RateLimitRequest(
        domain=domain, descriptors=list(descriptors), hits_addend=hits_addend
    )


def reset_ms(status):
    d = status.duration_until_reset
    return d.seconds * 1000 + d.nanos // 1_000_000


def limit_of(status):
    assert status.HasField("current_limit"), status
    l = status.current_limit
    return (l.name, l.requests_per_unit, l.unit)


class Stopwatch:
    """Milliseconds since creation, with slack for the server's clock ticking apart."""

    def __init__(self):
        self.start = time.monotonic()

    def ms(self):
        return int((time.monotonic() - self.start) * 1000) + 2


# ----------------------------------------------------------------------------------------
# N per minute


FIVE_PER_MINUTE = """
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5, name: user_rpm}
"""


def test_five_per_minute_admits_exactly_five_then_over_limit_with_remaining_and_reset(shardgate):
    server = shardgate(FIVE_PER_MINUTE)
    clock = Stopwatch()
    for k in range(1, 6):
        r = server.should_rate_limit(request("api", desc(("user", "alice"))))
        (s,) = r.statuses
        assert r.overall_code == OK, (k, r)
        assert s.code == OK, (k, s)
        assert limit_of(s) == ("user_rpm", 5, MINUTE)
        elapsed = clock.ms()
        assert elapsed < 12_000, "too slow to judge: one token refills every 12 s"
        assert s.limit_remaining == 5 - k, (k, s)
        # Full again in k × 12 s, less what trickled back since the bucket was created.
        assert k * 12_000 - elapsed <= reset_ms(s) <= k * 12_000, (k, reset_ms(s), elapsed)

    r = server.should_rate_limit(request("api", desc(("user", "alice"))))
    (s,) = r.statuses
    assert r.overall_code == OVER_LIMIT, r
    assert s.code == OVER_LIMIT
    assert s.limit_remaining == 0
    assert limit_of(s) == ("user_rpm", 5, MINUTE)
    elapsed = clock.ms()
    assert 12_001 - elapsed <= reset_ms(s) <= 12_001, (reset_ms(s), elapsed)

    # Other users are not affected.
    r = server.should_rate_limit(request("api", desc(("user", "bob"))))
    assert (r.overall_code, r.statuses[0].limit_remaining) == (OK, 4)


# ----------------------------------------------------------------------------------------
# Several descriptors


ORDER = """
domain: order
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 1, name: a_rpm}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 5, name: b_rps}
  - key: c
    rate_limit: {unit: hour, requests_per_unit: 3, name: c_rph}
"""


def test_statuses_come_back_in_request_order(shardgate):
    server = shardgate(ORDER)
    assert server.should_rate_limit(request("order", desc(("a", "1")))).overall_code == OK

    r = server.should_rate_limit(
        request("order", desc(("c", "1")), desc(("x", "no rule")), desc(("a", "1")), desc(("b", "1")))
    )
    assert r.overall_code == OVER_LIMIT
    assert [s.code for s in r.statuses] == [OK, OK, OVER_LIMIT, OK]
    assert limit_of(r.statuses[0]) == ("c_rph", 3, HOUR)
    assert not r.statuses[1].HasField("current_limit")
    assert limit_of(r.statuses[2]) == ("a_rpm", 1, MINUTE)
    assert limit_of(r.statuses[3]) == ("b_rps", 5, SECOND)

    # Admitted, other order: both debited once, statuses in the new order.
    r = server.should_rate_limit(request("order", desc(("b", "1")), desc(("c", "1"))))
    assert r.overall_code == OK
    assert [limit_of(s)[0] for s in r.statuses] == ["b_rps", "c_rph"]
    assert [s.limit_remaining for s in r.statuses] == [4, 2], "the refused request took nothing"


# ----------------------------------------------------------------------------------------
# Cascade (docs/configuration.md, "Cascade")


CASCADE = """
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 3, name: tenant_rpm}
    descriptors:
      - key: api_key
        cascade: true
        entity: "key:{api_key}"
        rate_limit: {unit: minute, requests_per_unit: 10, name: key_rpm}
  # A window on the api-key buckets above (same entity, resource and limit name): read
  # with hits_addend 0, it shows an api key's own balance.
  - key: probe_api_key
    entity: "key:{probe_api_key}"
    rate_limit: {unit: minute, requests_per_unit: 10, name: key_rpm}
"""


def test_cascade_parent_limit_refuses_the_child_which_keeps_its_tokens(shardgate):
    server = shardgate(CASCADE)

    def call_k1():
        return server.should_rate_limit(request("edge", desc(("tenant", "acme"), ("api_key", "k1"))))

    def k1_balance():
        r = server.should_rate_limit(request("edge", desc(("probe_api_key", "k1"), hits=0)))
        assert r.statuses[0].code == OK
        return r.statuses[0].limit_remaining

    clock = Stopwatch()
    for k in range(1, 4):
        r = call_k1()
        assert r.overall_code == OK, (k, r)
        # The tighter of tenant (3 − k) and key (10 − k) is reported.
        assert r.statuses[0].limit_remaining == 3 - k
    assert k1_balance() == 7

    r = call_k1()
    (s,) = r.statuses
    assert r.overall_code == OVER_LIMIT, "the tenant's 3/min is spent"
    assert limit_of(s) == ("tenant_rpm", 3, MINUTE)
    assert s.limit_remaining == 0
    # One tenant token (20 s) + 1 ms, less what trickled back since the first request.
    assert 20_001 - clock.ms() <= reset_ms(s) <= 20_001, reset_ms(s)
    assert k1_balance() == 7, "all or nothing: the refused request took nothing from k1"

    # Another key of the same tenant shares the tenant bucket; another tenant does not.
    r = server.should_rate_limit(request("edge", desc(("tenant", "acme"), ("api_key", "k2"))))
    assert r.overall_code == OVER_LIMIT
    r = server.should_rate_limit(request("edge", desc(("tenant", "globex"), ("api_key", "k1"))))
    assert r.overall_code == OK
    assert k1_balance() == 6, "k1 is keyed by api key alone here (entity key:{api_key})"


def test_cascade_child_limit_refuses_without_debiting_the_parent(shardgate):
    server = shardgate(CASCADE.replace("requests_per_unit: 3,", "requests_per_unit: 50,")
                       .replace("requests_per_unit: 10,", "requests_per_unit: 2,"))
    for _ in range(2):
        assert server.should_rate_limit(
            request("edge", desc(("tenant", "acme"), ("api_key", "k1")))
        ).overall_code == OK
    r = server.should_rate_limit(request("edge", desc(("tenant", "acme"), ("api_key", "k1"))))
    assert r.overall_code == OVER_LIMIT
    assert limit_of(r.statuses[0]) == ("key_rpm", 2, MINUTE)
    # The tenant rule alone: 50 − 2 admitted − this one = 47 (the refused one took nothing).
    r = server.should_rate_limit(request("edge", desc(("tenant", "acme"))))
    assert (r.overall_code, r.statuses[0].limit_remaining) == (OK, 47)


# ----------------------------------------------------------------------------------------
# Composite bucket (docs/configuration.md, "Buckets")


LLM = """
domain: llm
descriptors:
  - key: tenant
    descriptors:
      - key: model
        descriptors:
          - key: kind
            value: requests
            entity: "{tenant}/{model}"
            rate_limit: {unit: minute, requests_per_unit: 3, name: rpm}
          - key: kind
            value: tokens
            entity: "{tenant}/{model}"
            rate_limit: {unit: hour, requests_per_unit: 1000, name: tph}
"""


def llm_call(tokens, model="gpt"):
    return request(
        "llm",
        desc(("tenant", "acme"), ("model", model), ("kind", "requests")),
        desc(("tenant", "acme"), ("model", model), ("kind", "tokens"), hits=tokens),
    )


def test_composite_rpm_and_tpm_are_debited_together_or_not_at_all(shardgate):
    server = shardgate(LLM)
    clock = Stopwatch()
    r = server.should_rate_limit(llm_call(400))
    assert r.overall_code == OK
    assert [limit_of(s)[0] for s in r.statuses] == ["rpm", "tph"]
    assert [s.limit_remaining for s in r.statuses] == [2, 600]

    r = server.should_rate_limit(llm_call(400))
    assert r.overall_code == OK
    assert [s.limit_remaining for s in r.statuses] == [1, 200]

    r = server.should_rate_limit(llm_call(400))
    assert r.overall_code == OVER_LIMIT
    assert [s.code for s in r.statuses] == [OK, OVER_LIMIT]
    assert [s.limit_remaining for s in r.statuses] == [1, 200], "nothing taken"
    # 200 missing tokens at 1000/h (3.6 s each) + 1 ms, less what trickled back.
    assert 720_001 - clock.ms() <= reset_ms(r.statuses[1]) <= 720_001, reset_ms(r.statuses[1])

    r = server.should_rate_limit(llm_call(200))
    assert r.overall_code == OK
    assert [s.limit_remaining for s in r.statuses] == [0, 0]
    # The request count is spent too: even a zero-token call is refused now.
    r = server.should_rate_limit(llm_call(0))
    assert [s.code for s in r.statuses] == [OVER_LIMIT, OK]

    # Another model is another bucket.
    r = server.should_rate_limit(llm_call(10, model="mini"))
    assert [s.limit_remaining for s in r.statuses] == [2, 990]


# ----------------------------------------------------------------------------------------
# Request rules, health


def test_unknown_domain_is_ok_and_bad_requests_are_invalid_argument(shardgate):
    server = shardgate(FIVE_PER_MINUTE)
    r = server.should_rate_limit(request("nope", desc(("user", "alice")), desc(("a", "b"))))
    assert r.overall_code == OK
    assert [s.code for s in r.statuses] == [OK, OK]
    assert not any(s.HasField("current_limit") for s in r.statuses)

    for bad, field in [(request("", desc(("user", "alice"))), "domain"), (request("api"), "descriptors")]:
        with pytest.raises(grpc.RpcError) as e:
            server.should_rate_limit(bad)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in e.value.details()


def test_health_reports_serving(shardgate):
    server = shardgate(FIVE_PER_MINUTE)
    for service in ["", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService"]:
        assert server.health_status(service) == health_pb2.HealthCheckResponse.SERVING, service


# ----------------------------------------------------------------------------------------
# Broken config


BROKEN = textwrap.dedent("""\
    domain: api
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 5, colour: blue}
""")


def run(args):
    return subprocess.run(
        [binary(), *args], capture_output=True, text=True, timeout=EXIT_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


def test_check_config_accepts_a_good_file_and_rejects_a_broken_one_with_file_and_line(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(FIVE_PER_MINUTE)
    r = run(["check-config", str(good)])
    assert (r.returncode, r.stdout.strip()) == (0, "OK"), r

    bad = tmp_path / "bad.yaml"
    bad.write_text(BROKEN)
    r = run(["check-config", str(bad)])
    assert r.returncode != 0, r
    assert f"{bad}:4" in r.stderr, r.stderr
    assert "colour" in r.stderr, r.stderr


def test_serve_refuses_to_start_on_a_broken_config_with_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(BROKEN)
    r = run(["serve", "--config", str(bad), "--grpc-addr", f"127.0.0.1:{free_port()}", "--http-addr", "127.0.0.1:0"])
    assert r.returncode != 0, r
    output = r.stdout + r.stderr
    assert f"{bad}:4" in output, output
    assert "colour" in output, output


def test_request_bounds_are_configurable_on_the_command_line(shardgate):
    server = shardgate(FIVE_PER_MINUTE, args=["--max-descriptors", "2", "--max-value-bytes", "8"])
    server.should_rate_limit(request("api", desc(("user", "a")), desc(("user", "b"))))
    cases = [
        (request("api", desc(("user", "a")), desc(("user", "b")), desc(("user", "c"))),
         "descriptors: 3 exceeds the maximum of 2"),
        (request("api", desc(("user", "123456789"))),
         "descriptors[0].entries[0].value: 9 bytes exceeds the maximum of 8"),
    ]
    for bad, message in cases:
        with pytest.raises(grpc.RpcError) as e:
            server.should_rate_limit(bad)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in e.value.details()


def test_worker_threads_are_set_on_the_command_line(shardgate):
    def serving_line(server):
        for line in server.log().splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                if record.get("fields", {}).get("message") == "serving":
                    return record["fields"]
        raise AssertionError(f"no 'serving' line:\n{server.log()}")

    one = shardgate(FIVE_PER_MINUTE, args=["--worker-threads", "1", "--log-format", "json"])
    assert serving_line(one)["worker_threads"] == 1
    assert one.should_rate_limit(request("api", desc(("user", "a")))).overall_code == OK
    # Without the flag: tokio's default, one per core this process may use.
    default = shardgate(FIVE_PER_MINUTE, args=["--log-format", "json"])
    assert serving_line(default)["worker_threads"] >= 1
    # Zero is refused before anything starts, naming the flag.
    bad = subprocess.run(
        [binary(), "serve", "--config", "unused.yaml", "--worker-threads", "0"],
        capture_output=True, text=True, timeout=30,
    )
    assert bad.returncode != 0
    assert "--worker-threads" in bad.stderr and "zero" in bad.stderr, bad.stderr


def test_one_thread_serves_a_shared_store_and_stops_cleanly(shardgate, redis_server):
    """`--worker-threads 1` runs tokio's current-thread scheduler: the store's calls, the
    lease task and the shutdown all run on that one thread."""
    one = shardgate(FIVE_PER_MINUTE, store="redis", args=[
        "--worker-threads", "1", "--redis-url", f"redis://127.0.0.1:{redis_server.port}"])
    codes = [one.should_rate_limit(request("api", desc(("user", "b")))).overall_code
             for _ in range(8)]
    assert codes == [OK] * 5 + [OVER_LIMIT] * 3, codes
    one.proc.terminate()
    assert one.proc.wait(timeout=30) == 0, one.log()


def test_undecodable_bytes_are_invalid_argument_naming_the_field(shardgate):
    server = shardgate(FIVE_PER_MINUTE)
    raw = grpc.insecure_channel(f"127.0.0.1:{server.port}").unary_unary(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
    # RateLimitRequest{domain: <0xff 0xfe>}: field 1, length 2, bytes that are not UTF-8.
    with pytest.raises(grpc.RpcError) as e:
        raw(b"\x0a\x02\xff\xfe", timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "domain" in e.value.details() and "UTF-8" in e.value.details()
    # A truncated message is refused the same way, and the server keeps answering.
    with pytest.raises(grpc.RpcError) as e:
        raw(b"\x0a\x05ab", timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert server.should_rate_limit(request("api", desc(("user", "still")))).overall_code == OK
