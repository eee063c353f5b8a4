"""A port whose task ends stops the server being ready, end to end (issue 49, item 3).

The server is the test-only build with the `test-hooks` feature (scripts/test builds
target/debug/shardgate-test-hooks; SHARDGATE_TEST_HOOKS_BIN names another):
`SHARDGATE_TEST_END_TASK=grpc|http` ends that port's task on its own, its listener
dropped, as a task that returned or panicked would. The other surface must say the server
is not ready within 1 s of the port going away (an orchestrator stops routing to it), and
the process must exit non-zero naming the task: never up and ready with a dead listener.
"""
import os
import pathlib
import socket
import subprocess
import time
import urllib.error
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from conftest import REPO, free_port

RULES = """
domain: sup
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 10}
"""
END_AFTER_MS = 1500
POLL_S = 0.01


def hooks_bin():
    path = pathlib.Path(os.environ.get(
        "SHARDGATE_TEST_HOOKS_BIN", REPO / "target" / "debug" / "shardgate-test-hooks"))
    if not path.is_file():
        pytest.fail(f"{path} not found: scripts/test builds it (--features test-hooks)")
    return str(path)


def port_open(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def http_ready(port):
    """/healthcheck answered 200 (False: 503, or no answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthcheck", timeout=0.5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def grpc_ready(port):
    """gRPC health said SERVING (False: NOT_SERVING, or no answer)."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            status = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=0.5).status
        except grpc.RpcError:
            return False
    return status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("task,name", [("grpc", "gRPC port"), ("http", "HTTP port")])
def test_a_port_whose_task_ends_is_not_ready_within_a_second_and_the_server_exits(
        tmp_path, task, name):
    config = tmp_path / "rules.yaml"
    config.write_text(RULES)
    grpc_port, http_port = free_port(), free_port()
    log_path = tmp_path / "server.log"
    env = {**os.environ, "SHARDGATE_TEST_END_TASK": task,
           "SHARDGATE_TEST_END_TASK_AFTER_MS": str(END_AFTER_MS)}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [hooks_bin(), "serve", "--config", str(config), "--grpc-addr",
             f"127.0.0.1:{grpc_port}", "--http-addr", f"127.0.0.1:{http_port}"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
    ended_port, other_ready = (grpc_port, lambda: http_ready(http_port)) if task == "grpc" \
        else (http_port, lambda: grpc_ready(grpc_port))
    try:
        # Ready on both surfaces first (the hook fires END_AFTER_MS after the ports bind).
        deadline = time.monotonic() + 10
        while not (http_ready(http_port) and grpc_ready(grpc_port)):
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(POLL_S)
        # The moment the port goes away, then the moment the other surface stops saying
        # ready (or the process is gone): at most a second apart.
        deadline = time.monotonic() + 10
        while port_open(ended_port):
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(POLL_S)
        gone = time.monotonic()
        while proc.poll() is None and other_ready():
            assert time.monotonic() - gone < 5, "still ready 5 s after its port ended"
            time.sleep(POLL_S)
        not_ready_after = time.monotonic() - gone
        code = proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = log_path.read_text()
    print(f"{name} ended: not ready after {not_ready_after * 1000:.0f} ms, exit {code}")
    assert not_ready_after <= 1.0, (not_ready_after, log[-2000:])
    assert code != 0, log[-2000:]
    assert f"the {name} task ended unexpectedly" in log, log[-2000:]
