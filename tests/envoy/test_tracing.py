"""Envoy's trace reaching shardgate: Envoy 1.40 traces with its OpenTelemetry tracer, its
rate-limit filter's gRPC call carries W3C `traceparent`, and the `decision` span shardgate
exports (`--otlp-endpoint`) is a child of that call's span, in Envoy's trace. Envoy and
shardgate export to one OTLP receiver (tests/python/otlp_receiver.py), as both would to an
OpenTelemetry Collector."""
import pathlib
import sys

import pytest

from conftest import main_envoy_config
from envoy_e2e import static_cluster, unique

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from otlp_receiver import Receiver  # noqa: E402

OTEL_CONFIG = "type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig"


def traced_config(receiver_port):
    """The main stack's Envoy, tracing every request with OpenTelemetry to the receiver."""
    def build(ports, shardgate_port):
        config = main_envoy_config(ports, shardgate_port)
        resources = config["static_resources"]
        main = next(l for l in resources["listeners"] if l["name"] == "main")
        hcm = main["filter_chains"][0]["filters"][0]["typed_config"]
        hcm["tracing"] = {
            "random_sampling": {"value": 100},
            "provider": {"name": "envoy.tracers.opentelemetry", "typed_config": {
                "@type": OTEL_CONFIG,
                "grpc_service": {"envoy_grpc": {"cluster_name": "otel"}, "timeout": "1s"},
                "service_name": "envoy-e2e",
            }},
        }
        resources["clusters"].append(static_cluster("otel", receiver_port, http2=True))
        return config
    return build


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.stop()


def test_the_decision_span_is_a_child_of_envoys_rate_limit_call(stack_factory, receiver):
    s = stack_factory("tracing", traced_config(receiver.port),
                      shardgate_args=["--otlp-endpoint", receiver.url])
    user = {"x-user": unique("u")}
    for _ in range(6):  # Envoy sends its spans in batches of 5 (or every 5 s)
        assert s.get("/user", user).status in (200, 429)

    def linked(spans):
        ids = {(sp.trace_id, sp.span_id) for res, _, sp in spans
               if res.get("service.name") == "envoy-e2e"}
        return [sp for res, _, sp in spans
                if res.get("service.name") == "shardgate" and sp.name == "decision"
                and (sp.trace_id, sp.parent_span_id) in ids]

    spans = receiver.wait_until(lambda spans: linked(spans),
                                "a decision span whose parent is an Envoy span")
    decision = linked(spans)[0]
    parent = next(sp for res, _, sp in spans if res.get("service.name") == "envoy-e2e"
                  and sp.span_id == decision.parent_span_id)
    # The parent is Envoy's span of the gRPC call to shardgate, itself under the request's.
    assert "ShouldRateLimit" in parent.name, parent
    assert parent.parent_span_id, parent
    assert decision.name == "decision"
