"""envoy-examples/front-proxy, exercised as a user runs it: its run.sh starts shardgate and
Envoy with the example's envoy.yaml and shardgate.yaml (on free ports instead of the
defaults), prints how to see a 429, and the requests it describes get exactly that."""
import os
import re
import signal
import time

import pytest

from envoy_e2e import (
    REPO, READY_TIMEOUT_S, STORE_TIMEOUT, E2EError, Process, free_port, http_get, port_open,
    unique, wait_until,
)

EXAMPLE = REPO / "envoy-examples" / "front-proxy"


@pytest.fixture
def front_proxy(store, shardgate_bin, envoy_bin, tmp_path):
    ports = {name: free_port() for name in
             ("LISTEN_PORT", "BACKEND_PORT", "ADMIN_PORT", "SHARDGATE_PORT",
              "SHARDGATE_HTTP_PORT")}
    env = store.env()
    env.update({k: str(v) for k, v in ports.items()})
    env.update({"SHARDGATE_BIN": shardgate_bin, "ENVOY_BIN": envoy_bin, "TMPDIR": str(tmp_path)})
    if store.name == "dynamodb":  # shardgate reads its store settings from the environment
        env.update({"SHARDGATE_STORE": "dynamodb", "SHARDGATE_TABLE": store.table,
                    "SHARDGATE_DYNAMODB_ENDPOINT": store.endpoint,
                    "SHARDGATE_NAMESPACE": store.namespace("front-proxy"),
                    "SHARDGATE_STORE_TIMEOUT": STORE_TIMEOUT})
    # Its own process group: run.sh and the two servers it starts are stopped together.
    proc = Process("run.sh", ["bash", EXAMPLE / "run.sh"], tmp_path / "run.log", env=env,
                   group=True)
    try:
        wait_until(lambda: not proc.alive() or "front-proxy is up" in proc.log(),
                   READY_TIMEOUT_S, "run.sh to say it is up", detail=proc.log)
        if not proc.alive():
            raise E2EError(f"run.sh exited with {proc.proc.returncode}:\n{proc.log()}")
    except E2EError as e:
        proc.stop()
        pytest.fail(str(e))
    yield proc, ports
    proc.stop()


def test_front_proxy_example_shows_a_429(front_proxy):
    proc, ports = front_proxy
    port = ports["LISTEN_PORT"]
    out = proc.log()
    # The printed recipe: six requests of one API key to the listener.
    assert re.search(rf"for i in 1 2 3 4 5 6; do curl .*x-api-key: alice.*127\.0\.0\.1:{port}/",
                     out), out

    key = {"x-api-key": unique("alice")}
    got = [http_get(port, "/", key) for _ in range(6)]
    assert [r.status for r in got] == [200] * 5 + [429], [r.headers for r in got]
    assert got[0].body == b"hello from the demo backend\n"
    assert got[0].header("x-ratelimit-limit") == \
        '5, 5;w=60;name="per_key", 20;w=1;name="per_ip"'
    assert [r.header("x-ratelimit-remaining") for r in got] == ["4", "3", "2", "1", "0", "0"]
    # The premium key has its own, larger limit.
    premium = [http_get(port, "/", {"x-api-key": "premium"}).status for _ in range(6)]
    assert premium == [200] * 6


def test_front_proxy_example_limits_a_tenant_over_rlqs(front_proxy):
    """The printed RLQS recipe: a tenant's requests, 200 ms apart; Envoy answers the first
    from its no-assignment fallback or the first token, then refuses by itself once
    shardgate's assignment (6 a minute: one token every 10 s) has arrived."""
    proc, ports = front_proxy
    port = ports["LISTEN_PORT"]
    out = proc.log()
    assert re.search(rf"for i in 1 2 3 4; do curl .*x-tenant: acme.*127\.0\.0\.1:{port}/", out), out
    tenant = {"x-tenant": unique("acme")}
    statuses = []
    for _ in range(10):
        statuses.append(http_get(port, "/", tenant).status)
        time.sleep(0.2)
    print(f"tenant over RLQS, a request every 200 ms: {statuses}")
    assert statuses[0] == 200, statuses
    assert 429 in statuses, statuses
    # 6 a minute: over 2 s, at most the first token and what arrived before the assignment.
    assert statuses.count(200) <= 3, statuses


def test_front_proxy_example_stops_everything_on_sigterm(front_proxy):
    proc, ports = front_proxy
    assert http_get(ports["LISTEN_PORT"], "/", {"x-api-key": unique("k")}).status == 200
    os.killpg(proc.pid, signal.SIGTERM)
    proc.proc.wait(timeout=30)
    assert "stopped; logs" in proc.log(), proc.log()
    for name in ("LISTEN_PORT", "SHARDGATE_PORT"):
        wait_until(lambda: not port_open(ports[name]), 10, f"{name} to close")


def test_front_proxy_example_fails_open_without_shardgate(front_proxy):
    proc, ports = front_proxy
    port = ports["LISTEN_PORT"]
    key = {"x-api-key": unique("k")}
    assert http_get(port, "/", key).header("x-ratelimit-limit") is not None
    # The README's experiment: stop shardgate (run.sh prints its pid); Envoy stays up.
    pid = int(re.search(r"shardgate pid (\d+)", proc.log()).group(1))
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: "shardgate exited; Envoy keeps running" in proc.log(), 30,
               "run.sh to notice shardgate exited", detail=proc.log)
    # failure_mode_deny: false — every request passes, past the 5/minute, without headers.
    got = [http_get(port, "/", key) for _ in range(7)]
    assert [r.status for r in got] == [200] * 7
    assert all(r.header("x-ratelimit-limit") is None for r in got)
    assert proc.alive()
