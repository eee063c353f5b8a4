"""The `decision` spans exported over OTLP/gRPC (`serve --otlp-endpoint`), received by a
real OTLP trace receiver: the `TraceService/Export` of the OpenTelemetry protos (PyPI
`opentelemetry-proto`) served by grpcio on loopback, as an OpenTelemetry Collector would.

Each call's span must carry its domain, rules, outcome and store calls; the resource its
`service.name`; a call with W3C `traceparent` metadata must be a child of that span in
that trace; the spans of calls answered just before SIGTERM must still arrive (flushed at
shutdown); a caller's unsampled trace keeps its decision out; and a server not told to
export sends nothing and starts nothing of OpenTelemetry. Over OTLP/HTTP too: by flag, and
by envoyproxy/ratelimit's `TRACING_*` variables as Envoy Gateway sets them (upstream's
default transport is HTTP).

The store calls expected are the memory store's: a new bucket takes a debit that finds it
missing, a read and a create (3); an existing one a debit (1); a refusal repeated within
the rejection cache's second is answered from memory (0). `test_metrics.py` checks the
same counts on the metrics.
"""
import secrets
import signal

from envoy.service.ratelimit.v3 import rls_pb2

from conftest import EXIT_TIMEOUT_S, RPC_TIMEOUT_S
from otlp_receiver import HttpReceiver, Receiver
from test_independent_client import desc, request

OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT

RULES = """
domain: otel
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1}
"""

# Variables that would turn the export on (or off) from the environment the tests run in.
OTEL_ENV_CLEARED = {
    "OTEL_EXPORTER_OTLP_ENDPOINT": "",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "",
    "OTEL_SDK_DISABLED": "",
    "OTEL_SERVICE_NAME": "",
    "OTEL_RESOURCE_ATTRIBUTES": "",
    "OTEL_TRACES_SAMPLER": "parentbased_always_on",
}


def call(server, tenant, metadata=None):
    response = server.rls.ShouldRateLimit(
        request("otel", desc(("tenant", tenant))), timeout=RPC_TIMEOUT_S, metadata=metadata
    )
    return response.overall_code


def stop(server):
    """SIGTERM, then the exit code (the server drains its calls and flushes the spans)."""
    server.channel.close()
    server.proc.send_signal(signal.SIGTERM)
    return server.proc.wait(timeout=EXIT_TIMEOUT_S)


def by_start(spans):
    """Spans sorted by start time (the calls were made one after the other)."""
    return sorted(spans, key=lambda s: s[2].start_time_unix_nano)


def test_decision_spans_arrive_with_their_fields_resource_and_caller_trace(shardgate):
    receiver = Receiver()
    try:
        server = shardgate(
            RULES,
            args=["--otlp-endpoint", receiver.url],
            # Batches go out every 100 ms: these spans arrive while the server runs. The
            # SDK's debug log shows it running (absent in the test without the flag).
            env={**OTEL_ENV_CLEARED, "OTEL_BSP_SCHEDULE_DELAY": "100",
                 "RUST_LOG": "info,opentelemetry_sdk=debug"},
        )
        trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
        traceparent = f"00-{trace_id}-{parent_id}-01"
        # First, a caller that did not sample its request (flags 00): the parent-based
        # sampler drops this decision, so it is not among the spans below.
        unsampled = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-00"
        assert call(server, "unsampled", metadata=[("traceparent", unsampled)]) == OK
        codes = [
            call(server, "a"),  # a new bucket, created by its one debit
            call(server, "a"),  # refused from the rejection cache (that debit's image)
            call(server, "a"),  # refused again, from the cache
            call(server, "b", metadata=[("traceparent", traceparent)]),
        ]
        assert codes == [OK, OVER, OVER, OK], codes
        spans = by_start(receiver.wait_for(4, "spans exported while serving"))
        assert len(spans) == 4, [s[2] for s in spans]
        assert unsampled.split("-")[1] not in {s.trace_id.hex() for _, _, s in spans}

        seen = [(a["domain"], a["rules"], a["outcome"], a["store_calls"]) for _, a, _ in spans]
        assert seen == [
            ("otel", "otel.tenant", "OK", 1),
            ("otel", "otel.tenant", "OVER_LIMIT", 0),
            ("otel", "otel.tenant", "OVER_LIMIT", 0),
            ("otel", "otel.tenant", "OK", 1),
        ], seen
        for resource, attrs, span in spans:
            assert span.name == "decision", span
            assert resource["service.name"] == "shardgate", resource
            assert "failure_mode" not in attrs, attrs
            assert "engine_calls" not in attrs, attrs

        # Without a traceparent, each decision is a root span of a trace of its own.
        roots = [s for _, _, s in spans[:3]]
        assert all(s.parent_span_id == b"" for s in roots), roots
        assert len({s.trace_id for s in roots}) == 3, roots
        # With one, the decision is a child of the caller's span in the caller's trace.
        child = spans[3][2]
        assert child.trace_id.hex() == trace_id, child
        assert child.parent_span_id.hex() == parent_id, child
        assert child.span_id.hex() != parent_id, child

        assert stop(server) == 0, server.log()
        assert "BatchSpanProcessor" in server.log(), server.log()
    finally:
        receiver.stop()


def test_spans_of_the_last_calls_are_flushed_at_shutdown(shardgate):
    receiver = Receiver()
    try:
        server = shardgate(
            RULES,
            args=["--otlp-endpoint", receiver.url],
            # No batch is due before the signal: only the shutdown's flush sends these.
            env={**OTEL_ENV_CLEARED, "OTEL_BSP_SCHEDULE_DELAY": "60000"},
        )
        tenants = [f"last{i}" for i in range(5)]
        assert [call(server, t) for t in tenants] == [OK] * 5
        assert receiver.spans() == [], "a batch went out before the signal"
        assert stop(server) == 0, server.log()
        # The process has exited: whatever it exported has been received.
        spans = receiver.spans()
        assert len(spans) == 5, [s[2] for s in spans]
        assert all(a["outcome"] == "OK" and a["store_calls"] == 1 for _, a, _ in spans), spans
        assert "span export flushed and stopped" in server.log(), server.log()
    finally:
        receiver.stop()


def test_the_sdk_variables_turn_the_export_on_and_name_the_service(shardgate):
    """No flag: `OTEL_EXPORTER_OTLP_ENDPOINT` and `OTEL_SERVICE_NAME`, as the OpenTelemetry
    SDKs read them, are enough."""
    receiver = Receiver()
    try:
        server = shardgate(
            RULES,
            env={
                **OTEL_ENV_CLEARED,
                "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
                "OTEL_SERVICE_NAME": "edge-limits",
                "OTEL_BSP_SCHEDULE_DELAY": "100",
            },
        )
        assert call(server, "a") == OK
        [(resource, attrs, _)] = receiver.wait_for(1, "span exported by the SDK's variables")
        assert resource["service.name"] == "edge-limits", resource
        assert attrs["outcome"] == "OK", attrs
        assert stop(server) == 0, server.log()
    finally:
        receiver.stop()


def test_without_the_flag_nothing_is_sent_and_nothing_started(shardgate):
    receiver = Receiver()
    try:
        # Debug logging everywhere, spans logged: the decision spans are enabled, and an
        # OpenTelemetry SDK that was set up would log its batch processor at debug (the
        # first test sees it do so).
        env = {**OTEL_ENV_CLEARED, "RUST_LOG": "debug", "NO_COLOR": "1",
               "OTEL_BSP_SCHEDULE_DELAY": "100"}
        server = shardgate(RULES, args=["--log-spans"], env=env)
        traceparent = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
        assert call(server, "a") == OK
        assert call(server, "a", metadata=[("traceparent", traceparent)]) == OVER
        assert stop(server) == 0, server.log()
        assert receiver.spans() == []
        log = server.log()
        assert "decision{" in log, "the decision spans were not enabled:\n" + log
        assert "opentelemetry" not in log, log
    finally:
        receiver.stop()


def test_otel_sdk_disabled_turns_the_export_off(shardgate):
    receiver = Receiver()
    try:
        env = {**OTEL_ENV_CLEARED, "OTEL_SDK_DISABLED": "true", "OTEL_BSP_SCHEDULE_DELAY": "100"}
        server = shardgate(RULES, args=["--otlp-endpoint", receiver.url], env=env)
        assert call(server, "a") == OK
        assert stop(server) == 0, server.log()
        assert receiver.spans() == []
    finally:
        receiver.stop()


def test_the_http_protocol_posts_protobuf_to_v1_traces(shardgate):
    receiver = HttpReceiver()
    try:
        env = {**OTEL_ENV_CLEARED, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        server = shardgate(RULES, args=["--otlp-endpoint", receiver.url,
                                        "--otlp-protocol", "http"], env=env)
        assert call(server, "a") == OK
        [(resource, attrs, span)] = receiver.wait_for(1, "span over OTLP/HTTP")
        assert span.name == "decision", span
        assert resource["service.name"] == "shardgate", resource
        assert attrs["domain"] == "otel" and attrs["outcome"] == "OK", attrs
        assert stop(server) == 0, server.log()
        assert receiver.refused == [], receiver.refused
    finally:
        receiver.stop()


def test_upstreams_tracing_variables_export_over_http_with_its_names(shardgate):
    """Envoy Gateway's `enable-tracing` Deployment: TRACING_ENABLED with the service's
    name, namespace and instance, and the collector's OTLP/HTTP base URL."""
    receiver = HttpReceiver()
    try:
        # The SDK's naming and sampling variables left unset (an empty one would win
        # over upstream's, as every variable of ours does).
        kept = ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER")
        env = {
            **{k: v for k, v in OTEL_ENV_CLEARED.items() if k not in kept},
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "TRACING_ENABLED": "true",
            "TRACING_SERVICE_NAME": "envoy-ratelimit",
            "TRACING_SERVICE_NAMESPACE": "envoy-gateway-system",
            "TRACING_SERVICE_INSTANCE_ID": "envoy-ratelimit-7d9f",
            "TRACING_SAMPLING_RATE": "1.0",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        }
        server = shardgate(RULES, env=env)
        assert call(server, "a") == OK
        [(resource, attrs, _)] = receiver.wait_for(1, "span sent by upstream's variables")
        assert resource["service.name"] == "envoy-ratelimit", resource
        assert resource["service.namespace"] == "envoy-gateway-system", resource
        assert resource["service.instance.id"] == "envoy-ratelimit-7d9f", resource
        assert attrs["outcome"] == "OK", attrs
        assert stop(server) == 0, server.log()
    finally:
        receiver.stop()
