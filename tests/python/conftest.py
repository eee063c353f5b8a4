"""Fixtures for the independent-client tests: a real `shardgate serve` process on free
loopback ports with a config file the test writes, ready once gRPC health says SERVING.

The binary is `$SHARDGATE_BIN`, else `target/debug/shardgate` (scripts/test builds it).
Also here: a client for the HTTP surface (`Server.http`) and a parser of the OpenMetrics
text `GET /metrics` serves (`Metrics`).
"""
import json
import math
import os
import pathlib
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from envoy.service.ratelimit.v3 import rls_pb2_grpc

REPO = pathlib.Path(__file__).resolve().parents[2]
BINARY = pathlib.Path(os.environ.get("SHARDGATE_BIN", REPO / "target" / "debug" / "shardgate"))

RPC_TIMEOUT_S = 5.0
READY_TIMEOUT_S = 20.0
EXIT_TIMEOUT_S = 10.0


_HANDED_OUT = set()

# `SHARDGATE_TEST_PORTS=LOW-HIGH`: hand out listening ports from that range only (a
# machine shared by several test runs gives each a range of its own); else the kernel's.
_RANGE = os.environ.get("SHARDGATE_TEST_PORTS")


def _bind_free(port):
    """The port bound (0: the kernel picks), or None when it is taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return None
        return s.getsockname()[1]


def free_port():
    """A free loopback port never handed out before in this process: the kernel may give
    the same ephemeral port to two binds in a row once the first socket is closed, and two
    processes of one test must not be given the same port."""
    if _RANGE:
        low, high = (int(p) for p in _RANGE.split("-"))
        for port in range(low, high + 1):
            if port not in _HANDED_OUT and _bind_free(port):
                _HANDED_OUT.add(port)
                return port
        raise RuntimeError(f"no free port left in SHARDGATE_TEST_PORTS={_RANGE}")
    for _ in range(100):
        port = _bind_free(0)
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no fresh free port after 100 tries")


def binary():
    if not BINARY.is_file():
        pytest.fail(f"{BINARY} not found: build it with `cargo build` (scripts/test does)")
    return str(BINARY)


class Server:
    """One `shardgate serve` process and a channel to it."""

    def __init__(self, proc, port, log_path, http_port=None):
        self.proc = proc
        self.port = port
        self.http_port = http_port
        self.log_path = log_path
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.rls = rls_pb2_grpc.RateLimitServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def log(self):
        return self.log_path.read_text(errors="replace")

    def should_rate_limit(self, request):
        return self.rls.ShouldRateLimit(request, timeout=RPC_TIMEOUT_S)

    def http(self, method, path, body=None, timeout=RPC_TIMEOUT_S):
        """One HTTP call to the `--http-addr` listener: `(status, content type, text)`.
        `body` may be bytes, a str, or anything else (sent as JSON)."""
        assert self.http_port, "this server was started without a known HTTP port"
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}{path}", data=body, method=method,
            headers={"Content-Type": "application/json"} if body is not None else {},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.headers.get("Content-Type", ""), r.read().decode()
        except urllib.error.HTTPError as e:
            with e:
                return e.code, e.headers.get("Content-Type", ""), e.read().decode()

    def metrics(self):
        """Scrapes `GET /metrics` and parses it."""
        status, ctype, text = self.http("GET", "/metrics")
        assert status == 200, (status, text)
        return Metrics(text, ctype)

    def health_status(self, service):
        return self.health.Check(
            health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT_S
        ).status

    def wait_ready(self):
        """Waits until gRPC health says SERVING: False if the process exits first, a test
        failure if time runs out. The port is polled with plain TCP connects first, since a
        gRPC channel that failed to connect backs off for about a second."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                status = self.health.Check(
                    health_pb2.HealthCheckRequest(service=""),
                    timeout=RPC_TIMEOUT_S,
                    wait_for_ready=True,
                ).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return True
                last = f"health status {status}"
            except (OSError, grpc.RpcError) as e:  # not listening yet
                last = e
            time.sleep(0.02)
        self.stop()
        pytest.fail(f"shardgate not SERVING within {READY_TIMEOUT_S}s ({last}):\n{self.log()}")

    def stop(self):
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=EXIT_TIMEOUT_S)


@pytest.fixture
def shardgate(tmp_path):
    """`shardgate(yaml_text)` starts a server on that config and returns a ready Server.

    Keywords: `config=PATH` serves an existing file or directory instead of `yaml_text`;
    `args=[...]` adds `serve` arguments (`store=` replaces `--store memory`); `env={...}`
    adds environment variables; `grpc_port`/`http_port` pin the ports (no retry then).
    Servers still running at the end of the test are stopped."""
    servers = []

    def start(config_text=None, *, config=None, args=(), grpc_port=None, http_port=None,
              store="memory", env=None):
        if config is None:
            config = tmp_path / f"config{len(servers)}.yaml"
            config.write_text(config_text)
        pinned = grpc_port is not None or http_port is not None
        # A port picked free can be taken before the server binds it: retry a few times.
        for attempt in range(1 if pinned else 3):
            port = grpc_port or free_port()
            hport = http_port or free_port()
            log_path = tmp_path / f"shardgate{len(servers)}-{attempt}.log"
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    [binary(), "serve", "--config", str(config),
                     "--grpc-addr", f"127.0.0.1:{port}", "--http-addr", f"127.0.0.1:{hport}",
                     "--store", store, *args],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env={**os.environ, **(env or {})},
                )
            server = Server(proc, port, log_path, http_port=hport)
            servers.append(server)
            if server.wait_ready():
                return server
            if "cannot listen" not in server.log():
                pytest.fail(f"shardgate exited with {proc.returncode}:\n{server.log()}")
        pytest.fail(f"shardgate could not bind its ports:\n{server.log()}")

    yield start
    for s in servers:
        s.stop()


class RedisServer:
    """Debian's `redis-server` on a free loopback port, nothing persisted."""

    def __init__(self, tmp_path):
        self.port = free_port()
        self.dir = tmp_path / f"redis-{self.port}"
        self.dir.mkdir()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.dir), "--save", "", "--appendonly", "no"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self.cli("PING") != "PONG":
            if time.monotonic() > deadline or self.proc.poll() is not None:
                pytest.fail(f"redis-server on port {self.port} did not answer")
            time.sleep(0.05)

    def cli(self, *args):
        """One `redis-cli` command's output (stripped), or None when it failed."""
        done = subprocess.run(["redis-cli", "-p", str(self.port), *args],
                              capture_output=True, text=True, timeout=EXIT_TIMEOUT_S)
        return done.stdout.strip() if done.returncode == 0 else None

    def keys(self, pattern="*"):
        return sorted(k for k in (self.cli("--scan", "--pattern", pattern) or "").splitlines() if k)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def redis_server(tmp_path):
    """A fresh Redis for the test (the Redis store's own suites use scripts/redis-local)."""
    server = RedisServer(tmp_path)
    yield server
    server.stop()


# ----------------------------------------------------------------------------------------
# Reports shown in pytest's terminal summary (also with -q)

_SUMMARIES = pytest.StashKey[list]()


def add_summary(config, title, text):
    """Shows `text` under `title` at the end of the run (e.g. a measurement table)."""
    config.stash.setdefault(_SUMMARIES, []).append((title, text))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for title, text in config.stash.get(_SUMMARIES, []):
        terminalreporter.write_sep("-", title)
        for line in text.rstrip("\n").split("\n"):
            terminalreporter.write_line(line)


# ----------------------------------------------------------------------------------------
# OpenMetrics text (what `GET /metrics` serves)

_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+(\S+))?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(,|$)')
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "info": ("_info",),
    "unknown": ("",),
}


def _unescape(v):
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), v)


def _labels(text):
    """`{a="x",b="y"}` → {"a": "x", "b": "y"}; the whole text must parse."""
    labels, body, pos = {}, text[1:-1], 0
    while pos < len(body):
        m = _LABEL.match(body, pos)
        assert m, f"bad label set {text!r} at {body[pos:]!r}"
        assert m.group(1) not in labels, f"label {m.group(1)} repeated in {text!r}"
        labels[m.group(1)] = _unescape(m.group(2))
        pos = m.end()
    return labels


class Metrics:
    """A parsed OpenMetrics exposition: every sample, by family. Parsing is strict: each
    sample belongs to a family declared by `# TYPE` before it, with a suffix its type
    allows (counters end in `_total`), no series appears twice, and the text ends with
    `# EOF`."""

    def __init__(self, text, content_type=""):
        self.text = text
        self.content_type = content_type
        self.types = {}  # family name -> type
        self.samples = {}  # (sample name, frozenset of label items) -> float
        lines = text.split("\n")
        assert lines[-1] == "" and lines[-2] == "# EOF", f"no final '# EOF':\n{text[-300:]}"
        for line in lines[:-2]:
            if not line.strip():
                continue
            if line.startswith("#"):
                parts = line.split(" ", 3)
                assert parts[1] in ("TYPE", "HELP", "UNIT"), line
                if parts[1] == "TYPE":
                    assert parts[2] not in self.types, f"family {parts[2]} declared twice"
                    assert parts[3] in _SUFFIXES or parts[3] in ("gaugehistogram", "stateset", "summary"), line
                    self.types[parts[2]] = parts[3]
                continue
            m = _SAMPLE.match(line)
            assert m, f"unparsable sample line {line!r}"
            name, labels, value = m.group(1), m.group(2), m.group(3)
            family = self._family(name)
            assert family is not None, f"sample {name} belongs to no declared family:\n{line}"
            labels = _labels(labels) if labels else {}
            key = (name, frozenset(labels.items()))
            assert key not in self.samples, f"series repeated: {line}"
            self.samples[key] = float(value)

    def _family(self, name):
        for family, kind in self.types.items():
            for suffix in _SUFFIXES.get(kind, ("",)):
                if name == family + suffix:
                    return family
        return None

    def type_of(self, family):
        return self.types.get(family)

    def series(self, name):
        """[(labels dict, value)] of every sample called `name`."""
        return [(dict(k[1]), v) for k, v in self.samples.items() if k[0] == name]

    def get(self, name, default=None, **labels):
        """The sample `name` with exactly these labels (`default` if absent)."""
        return self.samples.get((name, frozenset(labels.items())), default)

    def value(self, name, **labels):
        """Like `get`, but the sample must exist."""
        v = self.get(name, **labels)
        assert v is not None, (
            f"no sample {name}{labels}; have: "
            + ", ".join(f"{n}{dict(l)}" for n, l in self.samples if n.startswith(name))
        )
        return v

    def sum(self, name, **labels):
        """Sum of the samples `name` whose labels include these."""
        return sum(v for l, v in self.series(name) if labels.items() <= l.items())

    def histogram(self, family, **labels):
        """(buckets [(le, cumulative count)], count, sum) of one histogram series, checked
        for consistency: cumulative counts never decrease and `+Inf` equals `_count`."""
        assert self.types.get(family) == "histogram", (family, self.types.get(family))
        buckets = sorted(
            (float(l["le"]), v) for l, v in self.series(family + "_bucket")
            if {k: x for k, x in l.items() if k != "le"} == labels
        )
        count = self.value(family + "_count", **labels)
        total = self.value(family + "_sum", **labels)
        assert buckets and buckets[-1][0] == math.inf, buckets
        assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])), buckets
        assert buckets[-1][1] == count, (buckets[-1], count)
        return buckets, count, total
