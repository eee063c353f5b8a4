"""statsd in envoyproxy/ratelimit's stat names (issue 30): a server started with upstream's
variables as Envoy Gateway sets them (`USE_STATSD=true`, `STATSD_PORT`) sends, over TCP as
upstream's stats library does, the per-rule counters as deltas, the config loads and the
call count and latency; with `--statsd-protocol udp`, the same in datagrams of whole
lines. The receivers here are plain sockets: each line is parsed as the statsd line
protocol (`name:value|type[|@rate]`), the way a statsd_exporter reads it.
"""
import socket
import threading
import time

from envoy.service.ratelimit.v3 import rls_pb2

from conftest import free_port
from test_independent_client import desc, request

OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT

RULES = """
domain: gw
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
"""

WAIT_S = 15.0  # flushes every second: lines arrive within a few


class Receiver:
    """Collects statsd lines on a loopback port, over TCP (one connection at a time, as
    the server keeps one) or UDP."""

    def __init__(self, protocol, port=0):
        self.lines = []
        self.datagrams = []
        self.lock = threading.Lock()
        kind = socket.SOCK_STREAM if protocol == "tcp" else socket.SOCK_DGRAM
        self.sock = socket.socket(socket.AF_INET, kind)
        self.sock.bind(("127.0.0.1", port))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.stopped = False
        if protocol == "tcp":
            self.sock.listen(4)
            target = self._tcp
        else:
            target = self._udp
        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def _add(self, text):
        with self.lock:
            self.lines.extend(l for l in text.split("\n") if l)

    def _tcp(self):
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            conn.settimeout(0.2)
            buf = b""
            while not self.stopped:
                try:
                    chunk = conn.recv(65536)
                except socket.timeout:
                    continue
                if not chunk:
                    break
                buf += chunk
                *whole, buf = buf.split(b"\n")
                for line in whole:
                    self._add(line.decode())
            conn.close()

    def _udp(self):
        while not self.stopped:
            try:
                data, _ = self.sock.recvfrom(65536)
            except socket.timeout:
                continue
            with self.lock:
                self.datagrams.append(data)
            self._add(data.decode())

    def counters(self):
        """Sum of every counter line by name."""
        totals = {}
        with self.lock:
            for line in self.lines:
                name, rest = line.split(":", 1)
                value, kind = rest.split("|")[:2]
                if kind == "c":
                    totals[name] = totals.get(name, 0) + int(value)
        return totals

    def timer_samples(self, name):
        """How many observations the timer lines of `name` stand for (1/rate each)."""
        n = 0.0
        with self.lock:
            for line in self.lines:
                if not line.startswith(name + ":"):
                    continue
                fields = line.split(":", 1)[1].split("|")
                assert fields[1] == "ms", line
                float(fields[0])
                rate = float(fields[2][1:]) if len(fields) > 2 else 1.0
                n += 1 / rate
        return round(n)

    def wait_for(self, check):
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if check(self.counters()):
                return True
            time.sleep(0.1)
        return False

    def close(self):
        self.stopped = True
        self.thread.join(timeout=2)
        self.sock.close()


def calls(server):
    codes = [server.should_rate_limit(request("gw", desc(("user", "ann")))).overall_code
             for _ in range(3)]
    assert codes == [OK, OK, OVER_LIMIT], codes


KEY = "ratelimit.service.rate_limit.gw.user"


def rule_counts(counters, tags=""):
    """The rule's three moving counters, by upstream's suffix."""
    return {s: counters.get(f"{KEY}.{s}{tags}")
            for s in ("total_hits", "within_limit", "over_limit")}


THREE_CALLS = {"total_hits": 3, "within_limit": 2, "over_limit": 1}


def test_upstreams_statsd_variables_send_its_stat_names_over_tcp(shardgate):
    receiver = Receiver("tcp")
    try:
        server = shardgate(RULES, env={
            "USE_STATSD": "true",
            "STATSD_HOST": "127.0.0.1",
            "STATSD_PORT": str(receiver.port),
            "STATS_FLUSH_INTERVAL": "1s",
            "EXTRA_TAGS": "zone:eu",
        })
        calls(server)
        assert receiver.wait_for(lambda c: rule_counts(c, ".__zone=eu") == THREE_CALLS
                                 and c.get("ratelimit_server.ShouldRateLimit.total_requests") == 3
                                 ), (receiver.lines, server.log())
        got = receiver.counters()
        # The second call took the last token (near the limit); only what moved is sent:
        # shadow mode never did.
        assert got.get(f"{KEY}.near_limit.__zone=eu") == 1, got
        assert not any("shadow_mode" in n for n in got), got
        # The first load counted, with the extra tags on upstream's `ratelimit.` names.
        assert got.get("ratelimit.service.config_load_success.__zone=eu") == 1, got
        # Deltas: one more call adds one, never the totals again.
        server.should_rate_limit(request("gw", desc(("user", "bob"))))
        assert receiver.wait_for(
            lambda c: c.get(f"{KEY}.total_hits.__zone=eu") == 4), receiver.lines
        assert receiver.counters()[f"{KEY}.within_limit.__zone=eu"] == 3
        assert receiver.timer_samples("ratelimit_server.ShouldRateLimit.response_time") == 4
        # `/metrics` still serves the same counts.
        m = server.metrics()
        assert m.value("shardgate_rate_limit_total_hits_total", domain="gw", key="gw.user") == 4
    finally:
        receiver.close()


def test_config_loads_carry_extra_tags_and_udp_sends_whole_lines(shardgate):
    receiver = Receiver("udp")
    try:
        server = shardgate(RULES, args=[
            "--statsd-addr", f"127.0.0.1:{receiver.port}", "--statsd-protocol", "udp",
            "--statsd-flush-interval", "1s", "--statsd-tags", "zone:eu,app:rl",
        ])
        calls(server)
        assert receiver.wait_for(
            lambda c: rule_counts(c, ".__app=rl.__zone=eu") == THREE_CALLS), receiver.lines
        assert all(len(d) <= 1432 for d in receiver.datagrams), [len(d) for d in receiver.datagrams]
        assert all(b"\n\n" not in d and not d.endswith(b"\n") for d in receiver.datagrams)
        # The server's own names carry no tags, as upstream's.
        assert receiver.counters().get("ratelimit_server.ShouldRateLimit.total_requests") == 3
    finally:
        receiver.close()


def test_counts_made_before_statsd_listens_arrive_once_it_does(shardgate):
    """An exporter sidecar that starts after the server (issue 46, item 3): the TCP
    connect is refused for 5 s, during which calls are counted; once the listener is up,
    those counts arrive, once each, and nothing was dropped."""
    port = free_port()
    server = shardgate(RULES, args=[
        "--statsd-addr", f"127.0.0.1:{port}", "--statsd-protocol", "tcp",
        "--statsd-flush-interval", "1s",
    ])
    started = time.monotonic()
    calls(server)
    time.sleep(max(0.0, 5.0 - (time.monotonic() - started)))
    failed = server.metrics().value("shardgate_statsd_send_failures_total")
    assert failed >= 2, f"the refused connects were counted: {failed}"
    receiver = Receiver("tcp", port=port)
    try:
        assert receiver.wait_for(lambda c: rule_counts(c) == THREE_CALLS
                                 and c.get("ratelimit_server.ShouldRateLimit.total_requests") == 3
                                 ), (receiver.lines, server.log())
        # Sent once: a later flush adds only what moved since.
        server.should_rate_limit(request("gw", desc(("user", "bob"))))
        assert receiver.wait_for(lambda c: rule_counts(c)["total_hits"] == 4), receiver.lines
        assert receiver.counters()["ratelimit.service.config_load_success"] == 1
        assert server.metrics().value("shardgate_statsd_lines_dropped_total") == 0
    finally:
        receiver.close()
