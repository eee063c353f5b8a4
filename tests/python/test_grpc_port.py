"""The gRPC port's protocol small print and its connections' ends, against the real
binary with a raw HTTP/2 client (PyPI `h2`, `test_hostile_http2.Client`): HTTP 415 for a
request that is not gRPC; a declared but unused compression accepted; health honouring
`grpc-timeout`; a health `Watch` that holds neither an aged connection nor a SIGTERM; a
silent TCP client that does not delay shutdown; the connection-level metrics.

Every wait is bounded; traffic stays on 127.0.0.1.
"""
import signal
import socket
import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from test_hostile_http2 import Client, calm_call, grpc_prefix, RLS_PATH
from test_independent_client import desc, request

RULES = """
domain: port
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000}
"""
WATCH_PATH = "/grpc.health.v1.Health/Watch"
PATIENCE_S = 10.0


class Recording(Client):
    """A raw client that also keeps each stream's `:status` and trailers."""

    def __init__(self, port):
        self.statuses = {}
        self.fields = {}
        self.data = {}
        super().__init__(port)

    def _record(self, event):
        import h2.events
        if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
            fields = dict(event.headers)
            if ":status" in fields:
                self.statuses[event.stream_id] = fields[":status"]
            self.fields.setdefault(event.stream_id, {}).update(fields)
        if isinstance(event, h2.events.DataReceived):
            self.data[event.stream_id] = self.data.get(event.stream_id, b"") + event.data
        super()._record(event)


def headers(path, content_type="application/grpc", extra=()):
    return [(":method", "POST"), (":scheme", "http"), (":path", path),
            (":authority", "127.0.0.1"), ("content-type", content_type),
            ("te", "trailers"), *extra]


def rls_message(user="u"):
    body = request("port", desc(("user", user))).SerializeToString()
    return grpc_prefix(len(body)) + body


def open_watch(client, stream_id=1, extra=()):
    client.conn.send_headers(stream_id, headers(WATCH_PATH, extra=extra))
    message = health_pb2.HealthCheckRequest(service="").SerializeToString()
    client.send_data(stream_id, grpc_prefix(len(message)) + message, end=True)


def test_a_request_that_is_not_grpc_is_415(shardgate):
    server = shardgate(RULES)
    c = Recording(server.port)
    try:
        c.conn.send_headers(1, headers(RLS_PATH, content_type="application/json"))
        c.send_data(1, b'{"domain": "port"}', end=True)
        c.conn.send_headers(3, headers(RLS_PATH))
        c.send_data(3, rls_message(), end=True)
        assert c.pump_until(lambda: 1 in c.answers and 3 in c.answers)
        assert c.statuses[1] == "415", c.fields[1]
        status, message = c.answers[1]
        assert status == "13" and "application/json" in message, c.answers[1]
        assert (c.statuses[3], c.answers[3][0]) == ("200", "0"), "a gRPC call on the same connection"
    finally:
        c.close()


def test_identity_and_unused_compression_are_accepted(shardgate):
    server = shardgate(RULES)
    c = Recording(server.port)
    try:
        cases = {
            1: ([("grpc-encoding", "identity")], rls_message()),
            3: ([("grpc-encoding", "gzip")], rls_message()),  # declared, not used: served
            5: ([("grpc-encoding", "gzip")], b"\x01" + rls_message()[1:]),  # used: refused
        }
        for stream_id, (extra, body) in cases.items():
            c.conn.send_headers(stream_id, headers(RLS_PATH, extra=extra))
            c.send_data(stream_id, body, end=True)
        assert c.pump_until(lambda: all(s in c.answers for s in cases))
        assert c.answers[1][0] == "0", c.answers[1]
        assert c.answers[3][0] == "0", c.answers[3]
        assert c.answers[5][0] == "12", c.answers[5]
        assert c.fields[5].get("grpc-accept-encoding") == "identity", c.fields[5]
    finally:
        c.close()


def test_health_watch_honours_grpc_timeout(shardgate):
    server = shardgate(RULES)
    c = Recording(server.port)
    try:
        started = time.monotonic()
        open_watch(c, extra=[("grpc-timeout", "50m")])
        assert c.pump_until(lambda: 1 in c.answers), (c.fields, c.resets)
        took = time.monotonic() - started
        assert c.answers[1][0] == "4", c.answers[1]  # DEADLINE_EXCEEDED
        assert len(c.data.get(1, b"")) > 0, "the current status came first"
        assert took >= 0.045, took
    finally:
        c.close()


class Watching:
    """A grpcio health `Watch` on a channel of its own, read in a thread: the statuses
    it sent, and how and when it ended. (The raw client cannot be used here: PyPI h2
    refuses every frame after a GOAWAY, and the `Watch` ends just after one.)"""

    def __init__(self, port):
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.statuses = []
        self.code = None
        self.ended = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        stub = health_pb2_grpc.HealthStub(self.channel)
        try:
            for answer in stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60):
                self.statuses.append(answer.status)
        except grpc.RpcError as e:
            self.code = e.code()
        self.ended = time.monotonic()

    def wait_open(self):
        deadline = time.monotonic() + PATIENCE_S
        while not self.statuses and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.statuses, "the Watch sent the current status"

    def wait_end(self, seconds):
        self.thread.join(timeout=seconds)
        assert not self.thread.is_alive(), f"the Watch still open after {seconds}s"

    def close(self):
        self.channel.close()


def test_an_aged_connection_with_an_open_watch_closes_within_the_grace(shardgate):
    server = shardgate(RULES, args=["--grpc-max-connection-age", "1s",
                                    "--grpc-max-connection-age-grace", "20s"])
    watch = Watching(server.port)
    try:
        watch.wait_open()
        started = time.monotonic()
        watch.wait_end(25)
        # At its age (1 s, give or take a tenth) the Watch is ended UNAVAILABLE with the
        # GOAWAY (its client watches again on a new connection), far inside the 20 s
        # grace: the connection closes then.
        assert watch.code == grpc.StatusCode.UNAVAILABLE, watch.code
        assert watch.ended - started < 5, watch.ended - started
        m = server.metrics()
        assert m.value("shardgate_grpc_goaways_sent_total", code="no_error") >= 1
        assert m.value("shardgate_grpc_connections_closed_by_server_total", reason="age_grace") == 0
    finally:
        watch.close()


def test_sigterm_with_an_open_watch_exits_within_the_grace(shardgate):
    server = shardgate(RULES, args=["--shutdown-grace", "20s"])
    watch = Watching(server.port)
    try:
        watch.wait_open()
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(timeout=25)
        took = time.monotonic() - started
        assert code == 0, server.log()
        watch.wait_end(10)
        assert watch.code == grpc.StatusCode.UNAVAILABLE, watch.code
        assert took < 5, f"exit took {took:.1f}s of a 20s grace"
    finally:
        watch.close()


def test_a_silent_tcp_client_does_not_delay_shutdown(shardgate):
    server = shardgate(RULES, args=["--shutdown-grace", "20s"])
    silent = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        calm_call(server)  # the server is serving, the silent connection accepted
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(timeout=25)
        took = time.monotonic() - started
        assert code == 0, server.log()
        assert took < 5, f"exit took {took:.1f}s of a 20s grace"
    finally:
        silent.close()


def test_connection_metrics(shardgate):
    server = shardgate(RULES, args=["--grpc-max-concurrent-streams", "2"])
    c = Recording(server.port)
    try:
        # Two calls held open (no body yet), a third refused past the limit.
        for stream_id in (1, 3, 5):
            c.conn.send_headers(stream_id, headers(RLS_PATH))
        c.flush()
        assert c.pump_until(lambda: 5 in c.resets)
        m = server.metrics()
        assert m.value("shardgate_grpc_connections_open") >= 1
        assert m.value("shardgate_grpc_calls_in_flight") >= 2
        assert m.value("shardgate_grpc_stream_resets_sent_total", code="refused_stream") >= 1
        assert m.value("shardgate_call_panics_total", end="internal") == 0
        for stream_id in (1, 3):
            c.send_data(stream_id, rls_message(), end=True)
        assert c.pump_until(lambda: 1 in c.answers and 3 in c.answers)
        c.close()
        deadline = time.monotonic() + PATIENCE_S
        while time.monotonic() < deadline:
            m = server.metrics()
            if m.value("shardgate_grpc_calls_in_flight") == 0:
                break
            time.sleep(0.05)
        assert m.value("shardgate_grpc_calls_in_flight") == 0
    finally:
        c.close()
