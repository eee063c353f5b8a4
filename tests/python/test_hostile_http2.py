"""Hostile HTTP/2 clients against the real binary's gRPC port, written with PyPI `h2`
(frames a client library would never send are allowed by turning its checks off, or by
opening streams before the server's SETTINGS are read): thousands of streams on one
connection, floods of resets, bodies trickled byte by byte, bodies announced too large,
the process out of file descriptors.

Each attack checks what the server answers the offender, that its memory stays bounded
(VmRSS from /proc) and, for the descriptors, that it keeps its CPU (utime + stime from
/proc); and during each, a well-behaved grpcio client on its own connection keeps getting
OK answers inside a 1 s deadline. Every loop is bounded in count and time; traffic stays on
127.0.0.1.
"""
import os
import resource
import select
import socket
import struct
import time
import urllib.parse

import grpc
import pytest
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2 as common_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from conftest import add_summary

RULES = """
domain: hostile
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000}
"""

RLS_PATH = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
MAX_STREAMS = 1024  # --grpc-max-concurrent-streams's default
MAX_MESSAGE = 64 * 1024  # --grpc-max-message-bytes's default
# How much a process's resident memory may grow during an attack. A connection's worth of
# bounded streams is a few MiB; what an attack could make an unbounded server hold is
# hundreds.
RSS_GROWTH_BOUND_KIB = 48 * 1024
PATIENCE_S = 10.0

REFUSED_STREAM = h2.errors.ErrorCodes.REFUSED_STREAM
ENHANCE_YOUR_CALM = h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
PROTOCOL_ERROR = h2.errors.ErrorCodes.PROTOCOL_ERROR
NO_ERROR = h2.errors.ErrorCodes.NO_ERROR


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def cpu_seconds(pid):
    """User and system CPU time of the process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of stat(5); fields[0] is field 3.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def calm_call(server, value="calm"):
    """One call from the well-behaved grpcio client: OK, inside its 1 s deadline (grpcio
    fails the call with DEADLINE_EXCEEDED otherwise)."""
    request = rls_pb2.RateLimitRequest(
        domain="hostile",
        descriptors=[common_pb2.RateLimitDescriptor(
            entries=[common_pb2.RateLimitDescriptor.Entry(key="user", value=value)])],
    )
    answer = server.rls.ShouldRateLimit(request, timeout=1.0)
    assert answer.overall_code == rls_pb2.RateLimitResponse.OK, answer


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
PING = 0x6


def frame_types(data):
    """The types of the whole HTTP/2 frames in `data`, in order."""
    types, at = [], 0
    while at + 9 <= len(data):
        length = int.from_bytes(data[at:at + 3], "big")
        types.append(data[at + 3])
        at += 9 + length
    return types


def grpc_prefix(length):
    return struct.pack(">BI", 0, length)


class Client:
    """One raw HTTP/2 connection driven by h2, recording what the server sends back."""

    def __init__(self, port, checked=True, watch=None):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        config = h2.config.H2Configuration(
            client_side=True, header_encoding="utf-8",
            validate_outbound_headers=checked, normalize_outbound_headers=checked,
            validate_inbound_headers=False,
        )
        self.conn = h2.connection.H2Connection(config=config)
        self.conn.initiate_connection()
        self.answers = {}  # stream id -> (grpc-status, grpc-message)
        self.resets = {}  # stream id -> error code
        self.goaway = None  # the GOAWAY's error code
        self.goaway_last_stream = None
        self.closed = False
        # The server's process, whose VmRSS is sampled at each read (its peak kept).
        self.watch = watch
        self.peak_rss_kib = 0
        self.flush()

    def flush(self):
        data = self.conn.data_to_send()
        if data and not self.closed:
            try:
                self.sock.sendall(data)
            except OSError:
                # The server closed: what it sent before (a GOAWAY) is still to be read.
                pass

    def open_call(self, stream_id, path=RLS_PATH, headers=None):
        self.conn.send_headers(stream_id, headers or [
            (":method", "POST"), (":scheme", "http"), (":path", path),
            (":authority", "127.0.0.1"), ("content-type", "application/grpc"),
            ("te", "trailers"),
        ])

    def send_data(self, stream_id, data, end=False):
        """Sends what flow control allows now; False once the stream or connection is
        closed."""
        try:
            window = min(self.conn.local_flow_control_window(stream_id), len(data))
            if window == 0 and data:
                return not self.closed and self.goaway is None  # wait for a window update
            self.conn.send_data(stream_id, data[:window], end_stream=end and window == len(data))
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError, KeyError):
            return False
        self.flush()
        return not self.closed and self.goaway is None

    def pump(self, timeout):
        """Reads what the server sent within `timeout` and records it."""
        if self.watch is not None:
            self.peak_rss_kib = max(self.peak_rss_kib, rss_kib(self.watch))
        if self.closed:
            return
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return
        try:
            data = self.sock.recv(1 << 20)
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            events = []
        for event in events:
            self._record(event)
        self.flush()

    def _record(self, event):
        if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
            fields = dict(event.headers)
            if "grpc-status" in fields:
                message = urllib.parse.unquote(fields.get("grpc-message", ""))
                self.answers[event.stream_id] = (fields["grpc-status"], message)
        elif isinstance(event, h2.events.StreamReset):
            self.resets[event.stream_id] = event.error_code
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = event.error_code
            self.goaway_last_stream = event.last_stream_id
        elif isinstance(event, h2.events.DataReceived):
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)

    def pump_until(self, done, seconds=PATIENCE_S):
        deadline = time.monotonic() + seconds
        while not done() and not self.closed and time.monotonic() < deadline:
            self.pump(0.05)
        return done()

    def close(self):
        self.sock.close()

    def refused(self):
        return sorted(s for s, code in self.resets.items() if code == REFUSED_STREAM)


_MEASURED = []


@pytest.fixture(scope="module", autouse=True)
def measurements(pytestconfig):
    """Shows what the attacks cost the server at the end of the run."""
    yield
    if _MEASURED:
        add_summary(pytestconfig, "hostile HTTP/2: the server's resident memory and CPU",
                    "\n".join(_MEASURED))


def measured(what, value):
    _MEASURED.append(f"{what}: {value}")


@pytest.fixture
def h2_client():
    """`h2_client(port, checked=True, watch=None)` opens a Client; all are closed when the test ends,
    passed or not (a connection left open would hold the server's shutdown)."""
    clients = []

    def open_client(port, checked=True, watch=None):
        clients.append(Client(port, checked, watch))
        return clients[-1]

    yield open_client
    for c in clients:
        c.close()


def test_thousands_of_streams_on_one_connection(shardgate, h2_client):
    server = shardgate(RULES)
    pid = server.proc.pid
    calm_call(server, "warm")
    rss_before = rss_kib(pid)

    # Streams past the limit but fewer than the server resets before it calls it a
    # flood: each one past the limit is refused; each one let in waits for a body that
    # never comes and is answered DEADLINE_EXCEEDED when its time (--store-timeout, 1 s)
    # is up.
    few = h2_client(server.port, watch=pid)
    opened = MAX_STREAMS + 100
    for i in range(opened):
        few.open_call(1 + 2 * i)
    few.flush()
    calm_call(server)
    few.pump_until(lambda: len(few.answers) + len(few.refused()) >= opened)
    refused = few.refused()
    assert len(refused) == opened - MAX_STREAMS, (len(refused), few.goaway)
    assert min(refused) == 1 + 2 * MAX_STREAMS, "the streams past the limit"
    statuses = {status for status, _ in few.answers.values()}
    assert len(few.answers) == MAX_STREAMS and statuses == {"4"}, statuses

    # Thousands: past the server's budget of refusals the offender is sent GOAWAY
    # ENHANCE_YOUR_CALM and its connection closed.
    many = h2_client(server.port, watch=pid)
    for i in range(5_000):
        many.open_call(1 + 2 * i)
    many.flush()
    calm_call(server)
    assert many.pump_until(lambda: many.closed), "the offender's connection is closed"
    assert many.goaway == ENHANCE_YOUR_CALM, many.goaway
    assert REFUSED_STREAM in many.resets.values()
    rss_growth = max(few.peak_rss_kib, many.peak_rss_kib, rss_kib(pid)) - rss_before
    measured("RSS peak growth, 1124 then 5000 streams on one connection", f"{rss_growth} KiB")
    assert rss_growth < RSS_GROWTH_BOUND_KIB, f"RSS grew {rss_growth} KiB"
    calm_call(server, "after")


def test_reset_floods(shardgate, h2_client):
    server = shardgate(RULES)
    pid = server.proc.pid
    calm_call(server, "warm")
    rss_before = rss_kib(pid)

    # Requests the server must reset itself (no :method), sent by the thousand without
    # reading a byte of what it answers: the server does not queue resets without end but
    # sends GOAWAY ENHANCE_YOUR_CALM and closes the connection.
    malformed = h2_client(server.port, checked=False, watch=pid)
    for i in range(3_000):
        malformed.conn.send_headers(1 + 2 * i, [(":scheme", "http"), (":path", "/")], end_stream=True)
    malformed.flush()
    calm_call(server)
    time.sleep(0.5)  # not reading meanwhile
    calm_call(server)
    assert malformed.pump_until(lambda: malformed.closed), "the offender's connection is closed"
    assert malformed.goaway == ENHANCE_YOUR_CALM, malformed.goaway
    # It stopped reading the offender's streams after its budget of 1024 resets; the
    # resets still queued were dropped with the connection.
    assert malformed.goaway_last_stream <= 1 + 2 * 1_023, malformed.goaway_last_stream
    protocol_errors = sum(1 for c in malformed.resets.values() if c == PROTOCOL_ERROR)
    assert protocol_errors <= 1_024, protocol_errors

    # The client's own resets (HTTP/2 Rapid Reset): streams opened and cancelled at once,
    # by the thousand. Past 20 streams reset before the server took them up, the offender
    # is sent GOAWAY ENHANCE_YOUR_CALM.
    rapid = h2_client(server.port, watch=pid)
    for i in range(5_000):
        stream = 1 + 2 * i
        rapid.open_call(stream)
        rapid.conn.reset_stream(stream, error_code=h2.errors.ErrorCodes.CANCEL)
        if i % 500 == 499:
            rapid.flush()
            calm_call(server)
    rapid.flush()
    assert rapid.pump_until(lambda: rapid.closed), "the offender's connection is closed"
    assert rapid.goaway == ENHANCE_YOUR_CALM, rapid.goaway
    calm_call(server, "after")
    rss_growth = max(malformed.peak_rss_kib, rapid.peak_rss_kib, rss_kib(pid)) - rss_before
    measured("RSS peak growth, 3000 malformed requests then 5000 rapid resets", f"{rss_growth} KiB")
    assert rss_growth < RSS_GROWTH_BOUND_KIB, f"RSS grew {rss_growth} KiB"


def test_slow_bodies_are_answered_when_their_time_is_up(shardgate, h2_client):
    server = shardgate(RULES)
    calm_call(server, "warm")
    slow = h2_client(server.port)
    streams = [1 + 2 * i for i in range(20)]
    message = b"\x0a\x07hostile" + b"\x12\x00" * 5
    body = grpc_prefix(len(message)) + message
    for stream in streams:
        slow.open_call(stream)
    slow.flush()
    started = time.monotonic()
    # One byte per stream every 100 ms: the bodies would take 3 s; the server gives a body
    # --store-timeout (1 s) from its headers.
    for byte in range(len(body)):
        if time.monotonic() - started > 5.0 or len(slow.answers) == len(streams):
            break
        for stream in streams:
            if stream not in slow.answers:
                slow.send_data(stream, body[byte:byte + 1])
        slow.pump(0.1)
        calm_call(server)
    slow.pump_until(lambda: len(slow.answers) == len(streams) and len(slow.resets) == len(streams))
    for stream in streams:
        status, message = slow.answers.get(stream, (None, None))
        assert status == "4", (stream, status, message)
        assert message == "the request body was not whole within 1s (--store-timeout)", message
        assert slow.resets.get(stream) == NO_ERROR, "the stream is reset, its state freed"
    calm_call(server, "after")


def test_oversized_declared_bodies_are_refused_at_the_prefix(shardgate, h2_client):
    server = shardgate(RULES)
    pid = server.proc.pid
    calm_call(server, "warm")

    # The prefix alone, the stream left open: answered without waiting for the body.
    one = h2_client(server.port)
    one.open_call(1)
    one.send_data(1, grpc_prefix(MAX_MESSAGE + 1))
    assert one.pump_until(lambda: 1 in one.answers), "answered at the prefix"
    assert one.answers[1] == (
        "8", "the request message announces 65537 bytes, more than the 65536-byte limit"
    )

    # Bodies announced just under gRPC's customary 4 MiB, pushed as fast as flow control
    # lets: each is refused at its prefix and reset, so the server gathers none of them.
    rss_before = rss_kib(pid)
    pushy = h2_client(server.port, watch=pid)
    streams = [1 + 2 * i for i in range(64)]
    chunk = b"\x00" * 16_384
    for stream in streams:
        pushy.open_call(stream)
        pushy.send_data(stream, grpc_prefix((4 << 20) - 1))
    open_streams = set(streams)
    deadline = time.monotonic() + 5.0
    sent = 0
    while open_streams and time.monotonic() < deadline and not pushy.closed:
        for stream in list(open_streams):
            if stream in pushy.resets or stream in pushy.answers or not pushy.send_data(stream, chunk):
                open_streams.discard(stream)
            else:
                sent += len(chunk)
        pushy.pump(0.01)
    calm_call(server)
    pushy.pump_until(lambda: len(pushy.answers) == len(streams))
    assert {s for s, _ in pushy.answers.values()} == {"8"}, f"{pushy.answers}; {sent} bytes sent"
    rss_growth = max(pushy.peak_rss_kib, rss_kib(pid)) - rss_before
    measured("RSS peak growth, 64 bodies announced at 4 MiB", f"{rss_growth} KiB ({sent} bytes sent)")
    assert rss_growth < RSS_GROWTH_BOUND_KIB, f"RSS grew {rss_growth} KiB ({sent} bytes sent)"
    calm_call(server, "after")


def test_out_of_file_descriptors_the_port_keeps_its_cpu_and_recovers(shardgate):
    server = shardgate(RULES)
    pid = server.proc.pid
    calm_call(server, "warm")  # the well-behaved client's connection exists before
    # A few descriptors to spare, then idle connections until the server cannot accept:
    # those it could not accept wait in its listen queue.
    spare = 6
    open_fds = len(os.listdir(f"/proc/{pid}/fd"))
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (open_fds + spare, hard))
    hostile = []
    try:
        for _ in range(spare + 20):
            hostile.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        time.sleep(0.3)
        assert len(os.listdir(f"/proc/{pid}/fd")) >= open_fds + spare - 1, "out of descriptors"
        # A second out of descriptors: the server pauses accepting instead of retrying at
        # once, which would take most of a core.
        before = cpu_seconds(pid)
        time.sleep(1.0)
        spent = cpu_seconds(pid) - before
        measured("CPU over a second out of descriptors", f"{spent:.2f} s")
        assert spent < 0.15, f"{spent:.2f} s of CPU in a second out of descriptors"
        calm_call(server, "during")
    finally:
        for s in hostile:
            s.close()
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
    # Descriptors free again: a new connection is accepted and served.
    fresh = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        request = rls_pb2.RateLimitRequest(
            domain="hostile",
            descriptors=[common_pb2.RateLimitDescriptor(
                entries=[common_pb2.RateLimitDescriptor.Entry(key="user", value="fresh")])],
        )
        answer = rls_pb2_grpc.RateLimitServiceStub(fresh).ShouldRateLimit(
            request, timeout=5.0, wait_for_ready=True)
        assert answer.overall_code == rls_pb2.RateLimitResponse.OK
    finally:
        fresh.close()
    failures = server.metrics().value("shardgate_grpc_accept_failures_total")
    assert failures >= 1, failures
    assert "accepting a connection failed" in server.log()


def test_the_port_flags_set_its_limits(shardgate, h2_client):
    server = shardgate(RULES, args=[
        "--grpc-max-concurrent-streams", "16", "--grpc-max-message-bytes", "1000",
        "--grpc-keepalive-interval", "300ms", "--grpc-keepalive-timeout", "300ms",
        "--grpc-max-connection-age", "2s",
    ])
    client = h2_client(server.port)
    for i in range(20):
        client.open_call(1 + 2 * i)
    client.send_data(1, grpc_prefix(1001))
    client.pump_until(lambda: 1 in client.answers and len(client.resets) >= 4)
    assert client.conn.remote_settings.max_concurrent_streams == 16
    refused = client.refused()
    assert refused == [1 + 2 * i for i in range(16, 20)], refused
    assert client.answers[1] == (
        "8", "the request message announces 1001 bytes, more than the 1000-byte limit"
    )
    # A peer that never answers pings is dropped once a ping goes unanswered.
    silent = socket.create_connection(("127.0.0.1", server.port), timeout=PATIENCE_S)
    silent.sendall(PREFACE + struct.pack(">I", 0)[1:] + b"\x04\x00" + struct.pack(">I", 0))
    received = b""
    while data := silent.recv(65536):  # until the server closes (or PATIENCE_S passes)
        received += data
    assert PING in frame_types(received), "pinged before being dropped"
    silent.close()
    # A connection older than --grpc-max-connection-age is sent GOAWAY (NO_ERROR).
    aged = h2_client(server.port)
    assert aged.pump_until(lambda: aged.goaway is not None), "GOAWAY"
    assert aged.goaway == NO_ERROR
    calm_call(server)


def test_upstream_connection_age_is_honoured(shardgate, h2_client):
    """envoyproxy/ratelimit's GRPC_MAX_CONNECTION_AGE, in Go's duration syntax, ages
    connections as --grpc-max-connection-age does; its _GRACE is ignored (and said so)."""
    server = shardgate(RULES, env={
        "GRPC_MAX_CONNECTION_AGE": "1.5s", "GRPC_MAX_CONNECTION_AGE_GRACE": "1h",
    })
    aged = h2_client(server.port)
    assert aged.pump_until(lambda: aged.goaway is not None), "GOAWAY"
    assert aged.goaway == NO_ERROR
    log = server.log()
    assert "SHARDGATE_GRPC_MAX_CONNECTION_AGE" in log and "GRPC_MAX_CONNECTION_AGE_GRACE" in log
