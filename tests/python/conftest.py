"""Fixtures for the independent-client tests: a real `shardgate serve` process on a free
loopback port with a config file the test writes, ready once gRPC health says SERVING.

The binary is `$SHARDGATE_BIN`, else `target/debug/shardgate` (scripts/test builds it).
"""
import os
import pathlib
import socket
import subprocess
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from envoy.service.ratelimit.v3 import rls_pb2_grpc

REPO = pathlib.Path(__file__).resolve().parents[2]
BINARY = pathlib.Path(os.environ.get("SHARDGATE_BIN", REPO / "target" / "debug" / "shardgate"))

RPC_TIMEOUT_S = 5.0
READY_TIMEOUT_S = 20.0
EXIT_TIMEOUT_S = 10.0


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binary():
    if not BINARY.is_file():
        pytest.fail(f"{BINARY} not found: build it with `cargo build` (scripts/test does)")
    return str(BINARY)


class Server:
    """One `shardgate serve` process and a channel to it."""

    def __init__(self, proc, port, log_path):
        self.proc = proc
        self.port = port
        self.log_path = log_path
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.rls = rls_pb2_grpc.RateLimitServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def log(self):
        return self.log_path.read_text(errors="replace")

    def should_rate_limit(self, request):
        return self.rls.ShouldRateLimit(request, timeout=RPC_TIMEOUT_S)

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
    """`shardgate(yaml_text)` starts a server on that config and returns a ready Server."""
    servers = []

    def start(config_text):
        config = tmp_path / f"config{len(servers)}.yaml"
        config.write_text(config_text)
        # A port picked free can be taken before the server binds it: retry a few times.
        for attempt in range(3):
            port = free_port()
            log_path = tmp_path / f"shardgate{len(servers)}-{attempt}.log"
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    [binary(), "serve", "--config", str(config),
                     "--grpc-addr", f"127.0.0.1:{port}", "--http-addr", "127.0.0.1:0", "--store", "memory"],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                )
            server = Server(proc, port, log_path)
            servers.append(server)
            if server.wait_ready():
                return server
            if "cannot listen" not in server.log():
                pytest.fail(f"shardgate exited with {proc.returncode}:\n{server.log()}")
        pytest.fail(f"shardgate could not bind a free port:\n{server.log()}")

    yield start
    for s in servers:
        s.stop()
