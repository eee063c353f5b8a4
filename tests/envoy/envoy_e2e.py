"""Helpers of the Envoy end-to-end suite: processes (shardgate, Envoy) with bounded waits,
Envoy bootstrap configs built as data, and a small HTTP client.

Everything listens on 127.0.0.1 only. Every wait is bounded by a deadline.
"""
from __future__ import annotations

import http.client
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
LIMITS_DIR = HERE / "limits"

HTTP_TIMEOUT_S = 10.0
READY_TIMEOUT_S = 60.0  # DynamoDB Local's first calls are slow (JVM warm-up)
STOP_TIMEOUT_S = 10.0
START_ATTEMPTS = 3  # a port picked free can be taken before the process binds it

# Envoy's ratelimit filter waits this long for shardgate. Generous: the suite runs on a
# loaded 2-core machine next to a JVM (DynamoDB Local); a timeout would surface as a 500
# (failure_mode_deny) and fail the test loudly, never silently pass it.
RLS_TIMEOUT = "5s"
STORE_TIMEOUT = "2s"  # shardgate's deadline per DynamoDB call, below RLS_TIMEOUT

AWS_LOCAL_ENV = {
    "AWS_ACCESS_KEY_ID": "local",
    "AWS_SECRET_ACCESS_KEY": "local",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


class E2EError(Exception):
    """A process or a wait failed; the message carries the logs needed to see why."""


_HANDED_OUT = set()


def free_port() -> int:
    """A free loopback port never handed out before in this process: the kernel may give
    the same ephemeral port to two binds in a row once the first socket is closed, and two
    processes of one test must not be given the same port. With $SHARDGATE_TEST_PORTS
    (`LOW-HIGH`), only ports of that range: runs that share a machine keep to their own."""
    allowed = os.environ.get("SHARDGATE_TEST_PORTS")
    candidates = None
    if allowed:
        low, _, high = allowed.partition("-")
        candidates = iter(range(int(low), int(high) + 1))
    for _ in range(100 if candidates is None else 1000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", 0 if candidates is None else next(candidates)))
            except OSError:
                continue
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no fresh free port after 100 tries")


def unique(prefix: str) -> str:
    """A value no other test (or earlier run against the same table) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05, detail=None):
    """Polls `predicate` until it returns a truthy value (returned) or `timeout` seconds
    pass (E2EError naming `what`, plus `detail()` if given)."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except (OSError, http.client.HTTPException) as e:  # not up yet
            last_exc = e
        if time.monotonic() >= deadline:
            extra = f" (last error: {last_exc!r})" if last_exc else ""
            more = f"\n{detail()}" if detail else ""
            raise E2EError(f"timed out after {timeout}s waiting for {what}{extra}{more}")
        time.sleep(interval)


# --- HTTP ----------------------------------------------------------------------------------


@dataclass
class Response:
    status: int
    headers: dict  # lower-case names
    body: bytes

    def header(self, name: str):
        return self.headers.get(name.lower())


def http_get(port: int, path: str, headers: dict | None = None) -> Response:
    return http_call("GET", port, path, headers)


def http_post_json(port: int, path: str, doc) -> Response:
    return http_call("POST", port, path, {"content-type": "application/json"},
                     json.dumps(doc).encode())


def http_call(method: str, port: int, path: str, headers: dict | None = None,
              body: bytes | None = None) -> Response:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=HTTP_TIMEOUT_S)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        body = r.read()
        hdrs: dict = {}
        for k, v in r.getheaders():
            k = k.lower()
            hdrs[k] = f"{hdrs[k]}, {v}" if k in hdrs else v
        return Response(r.status, hdrs, body)
    finally:
        conn.close()


# --- processes -----------------------------------------------------------------------------


class Process:
    """A child process with its output in a log file. `stop()` ends it (SIGTERM, then
    SIGKILL after STOP_TIMEOUT_S); with `group=True` the child leads its own process group
    and the signal goes to that group (for scripts that start children of their own)."""

    def __init__(self, name, argv, log_path, env=None, group=False, cwd=None):
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = pathlib.Path(log_path)
        self.group = group
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=group,
            )

    @property
    def pid(self):
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self, tail: int = 60) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return f"[{self.name}: no log]"
        return f"--- {self.name} log ({self.log_path}) ---\n" + "\n".join(lines[-tail:])

    def _signal(self, sig):
        try:
            if self.group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)
        except ProcessLookupError:
            pass

    def stop(self):
        if self.alive():
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait(timeout=STOP_TIMEOUT_S)
        elif self.group:
            # The leader is gone; make sure nothing it started outlives it.
            self._signal(signal.SIGKILL)


# --- stores --------------------------------------------------------------------------------


@dataclass
class Store:
    """How to run `shardgate serve` on one store."""

    name: str  # memory | dynamodb
    endpoint: str | None = None
    table: str | None = None
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    # Every shardgate process on this Store shares one namespace (a fleet of replicas).
    shared: bool = False

    def namespace(self, tag: str) -> str:
        # One namespace per shardgate process (unless `shared`): no bucket is shared with
        # another test stack or with an earlier run against the same DynamoDB table.
        if self.shared:
            return f"e2e-envoy-{self.run_id}"
        return f"e2e-envoy-{self.run_id}-{tag}"

    def serve_args(self, tag: str) -> list[str]:
        if self.name == "memory":
            return ["--store", "memory"]
        return [
            "--store", "dynamodb",
            "--table", self.table,
            "--dynamodb-endpoint", self.endpoint,
            "--namespace", self.namespace(tag),
        ]

    def env(self) -> dict:
        # The test decides every setting: none leaks in from the caller's SHARDGATE_*.
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDGATE_")}
        if self.name == "dynamodb":
            env.update(AWS_LOCAL_ENV)
        return env


def create_table(shardgate_bin, store: Store, log_path):
    out = subprocess.run(
        [str(shardgate_bin), "table", "create", "--table", store.table,
         "--dynamodb-endpoint", store.endpoint],
        env=store.env(), capture_output=True, text=True, timeout=120,
    )
    pathlib.Path(log_path).write_text(out.stdout + out.stderr)
    if out.returncode != 0:
        raise E2EError(
            f"`shardgate table create` against {store.endpoint} failed "
            f"({out.returncode}):\n{out.stdout}{out.stderr}"
        )


# --- shardgate -----------------------------------------------------------------------------


_SERVE_FLAGS: dict = {}


def serve_flags(binary) -> str:
    """`shardgate serve --help`, once per binary: which optional flags this build has."""
    binary = str(binary)
    if binary not in _SERVE_FLAGS:
        out = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True,
                             timeout=30)
        _SERVE_FLAGS[binary] = out.stdout + out.stderr
    return _SERVE_FLAGS[binary]


class Shardgate:
    """`shardgate serve` on free loopback ports; `start()` returns once it accepts gRPC
    connections (it binds only after the config has loaded). If the build has an HTTP
    listener (`--http-addr`), it gets a free loopback port too, never the 0.0.0.0 default."""

    def __init__(self, binary, config, store: Store, workdir, tag, extra_args=()):
        self.binary = binary
        self.config = config
        self.extra_args = list(extra_args)
        self.store = store
        self.workdir = pathlib.Path(workdir)
        self.tag = tag
        self.port = None
        self.http_port = None
        self.proc = None
        self.starts = 0

    def argv(self):
        argv = [self.binary, "serve", "--config", self.config,
                "--grpc-addr", f"127.0.0.1:{self.port}", *self.store.serve_args(self.tag)]
        flags = serve_flags(self.binary)
        if "--http-addr" in flags:
            argv += ["--http-addr", f"127.0.0.1:{self.http_port}"]
        if "--shutdown-grace" in flags:
            argv += ["--shutdown-grace", "2s"]
        if self.store.name == "dynamodb" and "--store-timeout" in flags:
            # The default deadline (15 ms) is for DynamoDB itself; DynamoDB Local on a busy
            # test machine is slower, and a timeout would fail the test as a 500.
            argv += ["--store-timeout", STORE_TIMEOUT]
        return argv + self.extra_args

    def start(self, keep_port=False):
        for attempt in range(START_ATTEMPTS):
            if not (keep_port and self.port):
                self.port = free_port()
            self.http_port = free_port()
            self.starts += 1
            self.proc = Process(
                f"shardgate[{self.tag}]", self.argv(),
                self.workdir / f"shardgate-{self.tag}-{self.starts}.log",
                env=self.store.env(),
            )
            try:
                wait_until(lambda: not self.proc.alive() or self.listening(),
                           READY_TIMEOUT_S, f"shardgate[{self.tag}] to listen on {self.port}",
                           detail=self.proc.log)
            except E2EError:
                self.proc.stop()
                raise
            if self.proc.alive():
                return self
            log = self.proc.log()
            if "cannot listen" in log and attempt + 1 < START_ATTEMPTS:
                continue
            raise E2EError(f"shardgate exited with {self.proc.proc.returncode}:\n{log}")
        raise AssertionError("unreachable")

    def listening(self) -> bool:
        # Both listeners bound: after that, start-up cannot fail any more.
        has_http = "--http-addr" in serve_flags(self.binary)
        return port_open(self.port) and (not has_http or port_open(self.http_port))

    def stop(self):
        if self.proc is not None:
            self.proc.stop()

    def restart(self):
        """Starts again on the same gRPC port (Envoy's cluster points at it)."""
        self.stop()
        return self.start(keep_port=True)


# --- Envoy configuration -------------------------------------------------------------------

HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
RATELIMIT = "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit"
RATELIMIT_PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute"
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
HTTP_OPTIONS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def static_cluster(name, port, http2=False, http2_options=None):
    """A cluster of one loopback endpoint; `http2` speaks HTTP/2 to it, with Envoy's
    `http2_protocol_options` set to `http2_options` (e.g. `max_concurrent_streams`)."""
    cluster = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "0.25s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
                "socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}],
        },
    }
    if http2:
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": HTTP_OPTIONS,
                "explicit_http_config": {"http2_protocol_options": dict(http2_options or {})},
            }
        }
    return cluster


def ratelimit_filter(domain, failure_mode_deny, timeout=RLS_TIMEOUT, x_ratelimit_headers=True):
    """The http ratelimit filter; `x_ratelimit_headers=False` leaves Envoy's own
    `x-ratelimit-*` headers off (for headers shardgate adds itself)."""
    config = {
        "@type": RATELIMIT,
        "domain": domain,
        "failure_mode_deny": failure_mode_deny,
        "timeout": timeout,
        "rate_limit_service": {
            "transport_api_version": "V3",
            "grpc_service": {"envoy_grpc": {"cluster_name": "shardgate"}},
        },
    }
    if x_ratelimit_headers:
        config["enable_x_ratelimit_headers"] = "DRAFT_VERSION_03"
    return {"name": "envoy.filters.http.ratelimit", "typed_config": config}


def http_listener(name, port, routes, http_filters):
    return {
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": HCM,
                "stat_prefix": name,
                # The connection's peer is the client address (remote_address action);
                # a client-sent X-Forwarded-For is not trusted.
                "use_remote_address": True,
                "route_config": {"virtual_hosts": [
                    {"name": name, "domains": ["*"], "routes": routes}]},
                "http_filters": http_filters,
            },
        }]}],
    }


def backend_listener(port):
    """The upstream every route proxies to: a second listener of the same Envoy answering
    200 itself. It reports an LLM's usage as the request asks: `x-tokens-used` from
    `x-simulate-tokens`, `x-input-tokens` and `x-output-tokens` from
    `x-simulate-input-tokens` and `x-simulate-output-tokens` (a header not asked for is left
    out). Rate limiting needs a routed cluster: Envoy's ratelimit filter skips
    `direct_response` routes, so the main listener cannot answer by itself."""
    usage = [("x-tokens-used", "x-simulate-tokens"),
             ("x-input-tokens", "x-simulate-input-tokens"),
             ("x-output-tokens", "x-simulate-output-tokens")]
    routes = [{
        "match": {"prefix": "/"},
        "direct_response": {"status": 200, "body": {"inline_string": "backend ok\n"}},
        "response_headers_to_add": [
            {"header": {"key": reported, "value": f"%REQ({asked})%"}}
            for reported, asked in usage],
    }]
    return http_listener("backend", port, routes, [{"name": "envoy.filters.http.router",
                                                   "typed_config": {"@type": ROUTER}}])


def route(prefix, rate_limits):
    """A proxied route with route-level `rate_limits` (the classic form)."""
    return {"match": {"prefix": prefix},
            "route": {"cluster": "backend", "rate_limits": rate_limits}}


def route_with_filter_rate_limits(prefix, rate_limits):
    """A proxied route whose rate limits live in the ratelimit filter's per-route config
    (`RateLimitPerRoute.rate_limits`). Envoy 1.40 honours `hits_addend` (number or
    substitution format) only there; on route-level `rate_limits` it is not sent."""
    return {
        "match": {"prefix": prefix},
        "route": {"cluster": "backend"},
        "typed_per_filter_config": {"envoy.filters.http.ratelimit": {
            "@type": RATELIMIT_PER_ROUTE, "rate_limits": rate_limits}},
    }


def header(name, key):
    return {"request_headers": {"header_name": name, "descriptor_key": key}}


def main_routes():
    """The routes of the main test stack, one per behaviour under test."""
    llm = [header("x-tenant", "llm_tenant")]
    return [
        route("/warmup", [{"actions": [{"generic_key": {"descriptor_value": "warmup"}}]}]),
        route("/user", [{"actions": [header("x-user", "user")]}]),
        route("/xrl", [
            {"actions": [header("x-client", "client")]},
            {"actions": [header("x-client", "client_hourly")]},
        ]),
        route("/cascade", [{"actions": [header("x-tenant", "tenant"),
                                        header("x-api-key", "api_key")]}]),
        route("/nested", [{"actions": [header("x-org", "org"), header("x-team", "team")]}]),
        route("/remote", [{"actions": [{"remote_address": {}}]}]),
        route("/catalog", [{"actions": [{"generic_key": {"descriptor_value": "catalog"}}]}]),
        route("/mobile", [{"actions": [{"header_value_match": {
            "descriptor_value": "mobile",
            "headers": [{"name": "user-agent", "string_match": {"contains": "Mobile"}}],
        }}]}]),
        route_with_filter_rate_limits("/llm", [
            # Request path: one request, and a check of the token budget that takes nothing.
            {"actions": [*llm, {"generic_key": {"descriptor_key": "kind",
                                                "descriptor_value": "requests"}}]},
            {"actions": [*llm, {"generic_key": {"descriptor_key": "kind",
                                                "descriptor_value": "tokens"}}],
             "hits_addend": {"number": 0}},
            # Stream end: the tokens the upstream reported in its response header.
            {"actions": [*llm, {"generic_key": {"descriptor_key": "kind",
                                                "descriptor_value": "tokens"}}],
             "apply_on_stream_done": True,
             "hits_addend": {"format": "%RESP(x-tokens-used)%"}},
        ]),
    ]


# The recipe of docs/configuration.md, "Token budgets for LLM traffic (recipe)": the rules
# are config/llm-tokens.yaml (domain "llm"), run as they are.
LLM_RECIPE_CONFIG = REPO / "config" / "llm-tokens.yaml"
LLM_RECIPE_DOMAIN = "llm"


def llm_recipe_routes():
    """The recipe's route: every path, per (tenant, model) from the `x-tenant` and
    `x-model` headers. Request path: one request, and a check (0 hits) of each token
    budget. Stream end: the input and output tokens the upstream reported, each on its
    own descriptor."""
    who = [header("x-tenant", "tenant"), header("x-model", "model")]

    def kind(value):
        return [*who, {"generic_key": {"descriptor_key": "kind", "descriptor_value": value}}]

    return [route_with_filter_rate_limits("/", [
        {"actions": kind("requests")},
        {"actions": kind("input_tokens"), "hits_addend": {"number": 0}},
        {"actions": kind("output_tokens"), "hits_addend": {"number": 0}},
        {"actions": kind("input_tokens"), "apply_on_stream_done": True,
         "hits_addend": {"format": "%RESP(x-input-tokens)%"}},
        {"actions": kind("output_tokens"), "apply_on_stream_done": True,
         "hits_addend": {"format": "%RESP(x-output-tokens)%"}},
    ])]


def bootstrap(admin_port, listeners, clusters):
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1",
                                                 "port_value": admin_port}}},
        "static_resources": {"listeners": listeners, "clusters": clusters},
    }


# --- Envoy ---------------------------------------------------------------------------------


class Envoy:
    """A real Envoy on free loopback ports. `build(ports)` returns the bootstrap (a dict) or
    config text for the chosen ports: {"admin": p, "main": p, "backend": p, ...} plus the
    names passed in `extra_ports`."""

    def __init__(self, binary, workdir, tag, build, extra_ports=()):
        self.binary = binary
        self.workdir = pathlib.Path(workdir)
        self.tag = tag
        self.build = build
        self.port_names = ["admin", "main", "backend", *extra_ports]
        self.ports: dict = {}
        self.proc = None

    @property
    def port(self):
        return self.ports["main"]

    def start(self):
        for attempt in range(START_ATTEMPTS):
            self.ports = {n: free_port() for n in self.port_names}
            config = self.build(self.ports)
            path = self.workdir / f"envoy-{self.tag}-{attempt}.yaml"
            path.write_text(config if isinstance(config, str) else json.dumps(config, indent=1))
            self.proc = Process(
                f"envoy[{self.tag}]",
                [self.binary, "-c", path, "--disable-hot-restart", "--concurrency", "1",
                 "--log-level", "warn"],
                self.workdir / f"envoy-{self.tag}-{attempt}.log",
            )
            try:
                wait_until(lambda: not self.proc.alive() or self.admin_ready(),
                           READY_TIMEOUT_S, f"envoy[{self.tag}] admin /ready",
                           detail=self.proc.log)
            except E2EError:
                self.proc.stop()
                raise
            if self.proc.alive():
                return self
            log = self.proc.log()
            if "ddress already in use" in log and attempt + 1 < START_ATTEMPTS:
                continue
            raise E2EError(f"envoy exited with {self.proc.proc.returncode}:\n{log}")
        raise AssertionError("unreachable")

    def admin_ready(self) -> bool:
        return http_get(self.ports["admin"], "/ready").status == 200

    def stop(self):
        if self.proc is not None:
            self.proc.stop()

    def get(self, path, headers=None, port=None) -> Response:
        return http_get(port or self.port, path, headers)

    def counter(self, name) -> int:
        """A counter from the admin /stats (0 while it has never been used)."""
        r = http_get(self.ports["admin"], f"/stats?filter=^{re.escape(name)}$")
        for line in r.body.decode().splitlines():
            k, _, v = line.partition(": ")
            if k == name:
                return int(v)
        return 0


def generous_user_rules(domain: str) -> str:
    """A rule file of `domain` limiting each `user` to a million requests a second: the
    requests of a burst are all admitted, each one still decided."""
    return f"""
domain: {domain}
descriptors:
  - key: user
    rate_limit: {{unit: second, requests_per_unit: 1000000}}
"""


def at_once(envoy: "Envoy", path: str, headers_of, calls: int) -> list:
    """`calls` GETs of `path` through `envoy`, released together from as many threads
    (so that one Envoy worker has their rate-limit calls in flight together), the i-th
    with `headers_of(i)`; their responses in that order."""
    responses = [None] * calls
    errors = []
    go = threading.Barrier(calls)

    def one(i):
        headers = headers_of(i)
        try:
            go.wait(timeout=30)
            responses[i] = envoy.get(path, headers)
        except Exception as e:  # reported below, not lost with its thread
            errors.append(f"request {i}: {e!r}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a request through Envoy did not end"
    assert not errors, errors[:5]
    return responses


def wait_rate_limited_path(envoy: Envoy, path="/warmup", headers=None, port=None, what=None,
                           detail=None):
    """Waits until a request through Envoy comes back 200 *with* rate-limit headers (Envoy's
    `x-ratelimit-limit`, or `ratelimit-limit` when shardgate adds them): the whole path
    (listener, ratelimit filter, shardgate, store, backend) works."""
    def ok():
        r = envoy.get(path, headers, port=port)
        limited = r.header("x-ratelimit-limit") or r.header("ratelimit-limit")
        return r.status == 200 and limited is not None and r
    return wait_until(ok, READY_TIMEOUT_S, what or f"a rate-limited 200 on {path}",
                      interval=0.1, detail=detail)
