"""OTLP trace receivers for the tests, keeping every export they are sent as an
OpenTelemetry Collector's `otlp` receiver would take them: over gRPC, the
`TraceService/Export` of the OpenTelemetry protos (PyPI `opentelemetry-proto`) served by
grpcio; over HTTP, `POST /v1/traces` with a protobuf `ExportTraceServiceRequest` body, as
the OTLP/HTTP specification has it. Each on a free loopback port. Used by
test_otlp_export.py and by tests/envoy/test_tracing.py."""
import http.server
import threading
import time
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

ARRIVAL_TIMEOUT_S = 10.0


class Exports:
    """The exports a receiver kept, and the waiting on them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.exports = []

    def spans(self):
        """[(resource attributes, span attributes, span)] of every span received."""
        with self.lock:
            exports = list(self.exports)
        out = []
        for export in exports:
            for rs in export.resource_spans:
                resource = attributes(rs.resource.attributes)
                # xds-protos ships an older copy of the OTLP protos under the same module
                # names; when another test imported it first, field 2 of ResourceSpans
                # is called instrumentation_library_spans (the same wire layout).
                scopes = rs.scope_spans if hasattr(rs, "scope_spans") else rs.instrumentation_library_spans
                for ss in scopes:
                    for span in ss.spans:
                        out.append((resource, attributes(span.attributes), span))
        return out

    def wait_for(self, count, what):
        """The spans received once there are at least `count`."""
        return self.wait_until(lambda spans: len(spans) >= count, f"{count} spans: {what}")

    def wait_until(self, predicate, what):
        """The spans received once `predicate(spans)` holds (polled, bounded in time)."""
        deadline = time.monotonic() + ARRIVAL_TIMEOUT_S
        while time.monotonic() < deadline:
            spans = self.spans()
            if predicate(spans):
                return spans
            time.sleep(0.05)
        spans = self.spans()
        raise AssertionError(f"not within {ARRIVAL_TIMEOUT_S}s: {what}; got {len(spans)} spans: "
                             + ", ".join(s.name for _, _, s in spans))


class Receiver(Exports, trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver on a free loopback port, keeping every export."""

    def __init__(self):
        Exports.__init__(self)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        assert self.port, "no free loopback port for the receiver"
        self.server.start()
        self.url = f"http://127.0.0.1:{self.port}"

    def Export(self, request, context):
        with self.lock:
            self.exports.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()

    def stop(self):
        self.server.stop(grace=None)



class HttpReceiver(Exports):
    """An OTLP/HTTP trace receiver (protobuf bodies) on a free loopback port; `url` is
    its base, to which the exporter adds `/v1/traces`. Requests anywhere else, or with
    another content type, are answered 404/415 and counted in `refused`."""

    def __init__(self):
        Exports.__init__(self)
        self.refused = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                kind = self.headers.get("Content-Type", "")
                if self.path != "/v1/traces" or kind != "application/x-protobuf":
                    with receiver.lock:
                        receiver.refused.append((self.path, kind))
                    self.send_response(404 if self.path != "/v1/traces" else 415)
                    self.end_headers()
                    return
                export = trace_service_pb2.ExportTraceServiceRequest()
                export.ParseFromString(body)
                with receiver.lock:
                    receiver.exports.append(export)
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def attributes(kvs):
    """OTLP key-values as a dict of Python values."""
    out = {}
    for kv in kvs:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind) if kind else None
    return out
