"""The operator's kit against the real thing (issue 20): a real Prometheus scrapes real
`shardgate serve` processes every second, evaluates deploy/prometheus/shardgate-rules.yml,
and the alerts fire when the trouble they name is made to happen; every query of the
Grafana dashboard (deploy/grafana/shardgate.json) is valid PromQL and returns data.

Two servers are scraped: one on the memory store (config reloads, sharding, the rejection
cache), and, when SHARDGATE_TEST_DYNAMODB_ENDPOINT is set (scripts/test sets it), one on
DynamoDB Local behind the fault proxy (store calls, failure_mode answers, consumed
capacity). Prometheus loads a copy of the rules file in which only the `for:` durations
are cut to 1 s, so that a test waits seconds, not minutes; the copy is checked to differ
from the file in nothing else.

Needs the `prometheus` binary (Debian's `prometheus` package; `.ci/run` installs it), or
its path in PROMETHEUS_BIN. Without it the tests are skipped, saying so.
"""
import json
import os
import pathlib
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2

from conftest import REPO, Server, binary, free_port
from dynamodb_local import AWS_LOCAL_ENV
from fault_proxy import FaultProxy
from test_independent_client import desc, request

RULES = REPO / "deploy" / "prometheus" / "shardgate-rules.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "shardgate.json"
PROMETHEUS = os.environ.get("PROMETHEUS_BIN") or shutil.which("prometheus")
ENDPOINT = os.environ.get("SHARDGATE_TEST_DYNAMODB_ENDPOINT")
TABLE = "shardgate_prometheus_tests"

ALERT_TIMEOUT_S = 60.0  # scrape and evaluation every second: alerts fire within seconds
READY_TIMEOUT_S = 30.0
MAX_CALLS = 5000  # every load loop stops at this many calls, or at its time limit

OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT

# `hot`: a bucket so large that a write budget of 5/s doubles it to its 32 shards within a
# few hundred calls; each shard then holds a 32nd of 100,000 (3125).
CONFIG = """\
domain: ops
failure_mode: deny
descriptors:
  - key: user
    rate_limit: {{unit: minute, requests_per_unit: {rpu}, name: user_rpm}}
  - key: hot
    rate_limit: {{unit: second, requests_per_unit: 100000, name: hot_rps}}
"""
BROKEN = "domain: ops\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight}\n"
WRITE_BUDGET = "5"
MAX_SHARDS = 32

pytestmark = pytest.mark.skipif(
    not PROMETHEUS, reason="prometheus not installed (apt-get install prometheus, or set "
    "PROMETHEUS_BIN); .ci/run installs it")


def alert_names(text):
    return re.findall(r"^\s*- alert: (\S+)\s*$", text, re.M)


def short_for(text):
    """The rules with every `for:` cut to 1 s."""
    return re.sub(r"^(\s*)for: \S+\s*$", r"\1for: 1s", text, flags=re.M)


class Prometheus:
    """A `prometheus` process on a free loopback port, scraping `targets` every second
    and evaluating `rules` every second, with its TSDB in `workdir`."""

    def __init__(self, workdir, targets, rules):
        self.port = free_port()
        config = workdir / "prometheus.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                       "scrape_timeout": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "shardgate",
                                "static_configs": [{"targets": targets}]}],
        }))
        self.log_path = workdir / "prometheus.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={config}",
                 f"--storage.tsdb.path={workdir / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"prometheus exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"prometheus not ready within {READY_TIMEOUT_S}s:\n{self.log()}")
            time.sleep(0.1)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def log(self):
        return self.log_path.read_text(errors="replace")[-3000:]

    def api(self, path, **params):
        """`GET /api/v1/<path>`: the `data` of a successful answer; the error of a failed
        one is a test failure."""
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:
            with e:
                body = json.loads(e.read())
        assert body.get("status") == "success", (path, params, body)
        return body["data"]

    def query(self, expr):
        return self.api("query", query=expr)["result"]

    def alerts(self):
        return self.api("alerts")["alerts"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start_shardgate(workdir, name, config, args=(), env=None):
    """`shardgate serve` on free loopback ports, ready (health SERVING)."""
    last = None
    for attempt in range(3):  # a port picked free may be taken before the server binds it
        port, hport = free_port(), free_port()
        log_path = workdir / f"shardgate-{name}-{attempt}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [binary(), "serve", "--config", str(config),
                 "--grpc-addr", f"127.0.0.1:{port}", "--http-addr", f"127.0.0.1:{hport}",
                 *args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
            )
        server = Server(proc, port, log_path, http_port=hport)
        if server.wait_ready():
            server.instance = f"127.0.0.1:{hport}"
            return server
        last = server.log()
        if "cannot listen" not in last:
            break
    pytest.fail(f"shardgate ({name}) did not start:\n{last}")


class Stack:
    def __init__(self, workdir):
        self.workdir = workdir
        self.memory = self.dynamo = self.proxy = self.prometheus = None

    def start(self):
        self.config = self.workdir / "memory.yaml"
        self.config.write_text(CONFIG.format(rpu=5))
        self.memory = start_shardgate(
            self.workdir, "memory", self.config,
            ["--store", "memory", "--partition-write-budget", WRITE_BUDGET])
        targets = [self.memory.instance]
        if ENDPOINT:
            subprocess.run(
                [binary(), "table", "create", "--table", TABLE, "--dynamodb-endpoint", ENDPOINT],
                env={**os.environ, **AWS_LOCAL_ENV}, capture_output=True, text=True,
                timeout=60, check=True)
            upstream = int(urllib.parse.urlparse(ENDPOINT).port)
            self.proxy = FaultProxy(upstream, self.workdir / "fault-proxy.log")
            ddb_config = self.workdir / "dynamodb.yaml"
            ddb_config.write_text(CONFIG.format(rpu=5))
            self.dynamo = start_shardgate(
                self.workdir, "dynamodb", ddb_config,
                ["--store", "dynamodb", "--table", TABLE, "--dynamodb-endpoint",
                 self.proxy.endpoint, "--namespace", f"prom-{uuid.uuid4().hex[:8]}"],
                env=AWS_LOCAL_ENV)
            targets.append(self.dynamo.instance)
        self.rules_text = short_for(RULES.read_text())
        rules = self.workdir / "shardgate-rules.yml"
        rules.write_text(self.rules_text)
        self.prometheus = Prometheus(self.workdir, targets, rules)
        self.servers = [s for s in (self.memory, self.dynamo) if s]
        self.wait_scraped()

    def wait_scraped(self):
        """Until Prometheus has scraped every server at least twice (a rate needs two)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            got = self.prometheus.query(
                'count_over_time(shardgate_config_load_success_total{job="shardgate"}[1m])')
            counts = {r["metric"]["instance"]: float(r["value"][1]) for r in got}
            if all(counts.get(s.instance, 0) >= 2 for s in self.servers):
                return
            time.sleep(0.2)
        pytest.fail(f"prometheus did not scrape {[s.instance for s in self.servers]} twice "
                    f"within {READY_TIMEOUT_S}s:\n{self.prometheus.log()}")

    def stop(self):
        for s in (self.memory, self.dynamo):
            if s:
                s.stop()
        if self.prometheus:
            self.prometheus.stop()
        if self.proxy:
            self.proxy.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("prometheus"))
    try:
        s.start()
        yield s
    finally:
        s.stop()


def active(prometheus, alertname, instance=None, state="firing"):
    """The alerts called `alertname` in `state` (of `instance`, if given)."""
    return [a for a in prometheus.alerts()
            if a["labels"].get("alertname") == alertname and a["state"] == state
            and (instance is None or a["labels"].get("instance") == instance)]


def wait_alert(stack, alertname, instance, timeout=ALERT_TIMEOUT_S, while_waiting=None):
    """Polls `/api/v1/alerts` until `alertname` fires for `instance`; returns the alert.
    `while_waiting()` is called between polls (e.g. to keep traffic flowing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        firing = active(stack.prometheus, alertname, instance)
        if firing:
            return firing[0]
        if while_waiting:
            while_waiting()
        else:
            time.sleep(0.5)
    pytest.fail(f"{alertname} did not fire for {instance} within {timeout}s; alerts now: "
                f"{json.dumps(stack.prometheus.alerts())[:3000]}")


def wait_no_alert(stack, alertname, instance, timeout=ALERT_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not (active(stack.prometheus, alertname, instance)
                or active(stack.prometheus, alertname, instance, "pending")):
            return
        time.sleep(0.5)
    pytest.fail(f"{alertname} still active for {instance} after {timeout}s")


def assert_annotated(alert):
    ann = alert["annotations"]
    assert ann.get("summary") and ann.get("description"), alert
    anchor = ann["runbook_url"].split("#")[1]
    runbook = (REPO / "docs" / "operations.md").read_text()
    assert f"## {alert['labels']['alertname']}" in runbook, alert
    assert anchor == alert["labels"]["alertname"].lower(), alert


# ----------------------------------------------------------------------------------------


def test_prometheus_loads_every_rule_and_nothing_fires_on_healthy_servers(stack):
    text = RULES.read_text()
    # The copy Prometheus loads differs in its `for:` lines only.
    strip = lambda t: [l for l in t.split("\n") if not l.strip().startswith("for:")]
    assert strip(stack.rules_text) == strip(text)
    assert stack.rules_text != text

    groups = stack.prometheus.api("rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    loaded = sorted(r["name"] for r in rules if r["type"] == "alerting")
    assert loaded == sorted(alert_names(text)) and len(loaded) >= 11, loaded
    records = [r["name"] for r in rules if r["type"] == "recording"]
    assert len(records) == len(re.findall(r"^\s*- record: ", text, re.M)), records

    # Evaluated at least once, without error.
    deadline = time.monotonic() + READY_TIMEOUT_S
    while any(r["lastEvaluation"].startswith("0001") for r in rules):
        assert time.monotonic() < deadline, [r for r in rules if r["lastEvaluation"].startswith("0001")]
        time.sleep(0.5)
        rules = [r for g in stack.prometheus.api("rules")["groups"] for r in g["rules"]]
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad, bad
    # Every alert says what to do and where its runbook section is.
    runbook = (REPO / "docs" / "operations.md").read_text()
    for r in rules:
        if r["type"] == "alerting":
            ann = r["annotations"]
            assert ann.get("summary") and ann.get("description"), r
            assert ann["runbook_url"] == f"docs/operations.md#{r['name'].lower()}", r
            assert f"\n## {r['name']}\n" in runbook, r["name"]

    targets = stack.prometheus.api("targets")["activeTargets"]
    assert sorted(t["labels"]["instance"] for t in targets if t["health"] == "up") == \
        sorted(s.instance for s in stack.servers), targets
    # Healthy, idle servers: no alert at all.
    for s in stack.servers:
        s.should_rate_limit(request("ops", desc(("user", "healthy"))))
    time.sleep(3)
    assert stack.prometheus.alerts() == []


def test_a_rejected_reload_fires_ShardgateConfigReloadFailing_and_a_fixed_file_clears_it(stack):
    server = stack.memory
    errors = server.metrics().value("shardgate_config_load_error_total")
    stack.config.write_text(BROKEN)
    deadline = time.monotonic() + 10
    while server.metrics().value("shardgate_config_load_error_total") == errors:
        assert time.monotonic() < deadline, "the broken config was not rejected within 10 s"
        time.sleep(0.1)

    alert = wait_alert(stack, "ShardgateConfigReloadFailing", server.instance)
    assert_annotated(alert)
    assert alert["labels"]["severity"] == "warning"
    if stack.dynamo:  # the other server reloaded nothing
        assert not active(stack.prometheus, "ShardgateConfigReloadFailing", stack.dynamo.instance)

    stack.config.write_text(CONFIG.format(rpu=5) + "# fixed\n")
    wait_no_alert(stack, "ShardgateConfigReloadFailing", server.instance)


def drive_to_max_shards(server, entity="h", max_s=30.0):
    """Calls on one hot bucket until it has 32 shards (bounded in calls and time)."""
    req = request("ops", desc(("hot", entity)))
    deadline = time.monotonic() + max_s
    for n in range(MAX_CALLS):
        server.should_rate_limit(req)
        if n % 50 == 49:
            shards = server.metrics().get("shardgate_bucket_shards", 0,
                                          entity=f"hot={entity}", resource="ops")
            if shards == MAX_SHARDS:
                return n + 1
        if time.monotonic() > deadline:
            break
    pytest.fail(f"bucket hot={entity} not at {MAX_SHARDS} shards after {n + 1} calls")


def test_a_bucket_at_32_shards_and_a_request_over_a_shards_share_fire_their_alerts(stack):
    server = stack.memory
    drive_to_max_shards(server)
    # A shard holds 100,000 / 32 = 3125: a request for 5000 is refused by the ceiling,
    # though the bucket as a whole could hold it.
    before = server.metrics().value("shardgate_per_shard_ceiling_rejections_total")
    r = server.should_rate_limit(request("ops", desc(("hot", "h"), hits=5000)))
    assert r.overall_code == OVER_LIMIT, r
    assert server.metrics().value("shardgate_per_shard_ceiling_rejections_total") == before + 1

    ceiling = wait_alert(stack, "ShardgatePerShardCeilingRefusals", server.instance)
    at_max = wait_alert(stack, "ShardgateBucketAtMaxShards", server.instance)
    assert at_max["labels"]["entity"] == "hot=h" and at_max["labels"]["resource"] == "ops"
    # Keep the bucket hot (more than 32 × 5 writes/s, back to back) until a doubling has
    # been asked for and declined at 32.
    req = request("ops", desc(("hot", "h")))
    calls = [0]

    def keep_hot():
        for _ in range(200):
            if calls[0] < MAX_CALLS:
                calls[0] += 1
                server.should_rate_limit(req)

    declined = wait_alert(stack, "ShardgateShardDoublingsDeclined", server.instance,
                          while_waiting=keep_hot)
    assert declined["labels"]["reason"] == "at_max", declined
    for alert in (ceiling, at_max, declined):
        assert_annotated(alert)


def test_a_failing_store_fires_circuit_open_store_errors_and_failing_closed(stack):
    if not ENDPOINT:
        pytest.skip("SHARDGATE_TEST_DYNAMODB_ENDPOINT is not set: the store alerts need the "
                    "DynamoDB store (scripts/test starts DynamoDB Local and sets it)")
    server = stack.dynamo
    for i in range(5):
        assert server.should_rate_limit(request("ops", desc(("user", f"warm{i}")))).overall_code == OK
    stack.proxy.set("http500")
    unavailable = [0]
    calls = [0]

    def fail_some():
        # Requests under a `deny` rule while the store fails: answered UNAVAILABLE.
        for _ in range(10):
            if calls[0] >= MAX_CALLS:
                break
            calls[0] += 1
            try:
                server.rls.ShouldRateLimit(request("ops", desc(("user", "down"))), timeout=2)
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE, e
                unavailable[0] += 1
        time.sleep(0.1)

    try:
        alerts = [wait_alert(stack, name, server.instance, while_waiting=fail_some)
                  for name in ("ShardgateStoreCircuitOpen", "ShardgateStoreErrors",
                               "ShardgateFailingClosed")]
    finally:
        stack.proxy.set("pass")
    assert unavailable[0] > 0
    for alert in alerts:
        assert_annotated(alert)
    # The memory server's store never failed.
    for name in ("ShardgateStoreCircuitOpen", "ShardgateFailingClosed", "ShardgateFailingOpen"):
        assert not active(stack.prometheus, name, stack.memory.instance), name


# ----------------------------------------------------------------------------------------
# The dashboard

# Series only a DynamoDB server exports (the memory store makes no metered calls).
DYNAMODB_ONLY = ("shardgate_store_calls_total", "shardgate_store_call_duration_seconds",
                 "shardgate_store_consumed_capacity_units_total",
                 "shardgate_store_failure_answers_total",
                 # Token leases are on by default on DynamoDB only.
                 "shardgate_lease_tokens_outstanding")


def panel_targets(dashboard):
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel, target


def grafana_to_promql(expr):
    """The dashboard's variables as Grafana would fill them for "All"."""
    return (expr.replace("$__rate_interval", "2m").replace('"$job"', '".+"')
            .replace('"$instance"', '".+"'))


def wait_deciding(server, timeout=30.0):
    """Until the server decides requests again (its store answers)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            server.should_rate_limit(request("ops", desc(("user", "probe"))))
            return
        except grpc.RpcError as e:
            if time.monotonic() > deadline:
                pytest.fail(f"{server.instance} not deciding within {timeout}s: {e}")
            time.sleep(0.2)


def test_the_dashboard_is_importable_and_every_panel_query_returns_data(stack):
    dashboard = json.loads(DASHBOARD.read_text())
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), ids
    targets = list(panel_targets(dashboard))
    assert len(targets) >= 20
    for panel, target in targets:
        assert panel["datasource"]["uid"] == target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
    titles = " | ".join(p["title"] for p in dashboard["panels"]).lower()
    for topic in ("outcome", "by rule", "latency", "store calls", "capacity", "cost",
                  "shard", "rejection cache", "reload"):
        assert topic in titles, topic

    # Load: admitted and refused hits, rejection-cache hits, a hot bucket sharded, a reload.
    # (The DynamoDB server's breaker may still be open from the store-fault test.)
    for server in stack.servers:
        wait_deciding(server)
        for _ in range(10):
            server.should_rate_limit(request("ops", desc(("user", "dash"))))
        for _ in range(200):
            server.should_rate_limit(request("ops", desc(("hot", "dash"))))
    stack.config.write_text(CONFIG.format(rpu=5) + "# dashboard\n")
    if stack.dynamo:  # a few failure_mode answers
        stack.proxy.set("http500")
        try:
            for _ in range(3):
                with pytest.raises(grpc.RpcError):
                    stack.dynamo.rls.ShouldRateLimit(
                        request("ops", desc(("user", "dash-down"))), timeout=2)
        finally:
            stack.proxy.set("pass")
    time.sleep(3)  # a few scrapes

    empty, checked = [], 0
    for panel, target in targets:
        expr = grafana_to_promql(target["expr"])
        assert "$" not in expr, expr
        result = stack.prometheus.query(expr)  # fails the test on invalid PromQL
        if not ENDPOINT and any(m in expr for m in DYNAMODB_ONLY):
            continue  # valid, but only a DynamoDB server has these series
        checked += 1
        if not result:
            empty.append(f"{panel['title']} / {target['refId']}: {expr}")
    assert not empty, "panel queries without data:\n" + "\n".join(empty)
    assert checked >= (len(targets) if ENDPOINT else 15), checked

    # The cost panels say what the capacity counter says, at $0.625 per million writes.
    if ENDPOINT:
        units = stack.prometheus.query(
            'sum(shardgate_store_consumed_capacity_units_total'
            '{operation=~"UpdateItem|PutItem|TransactWriteItems"})')
        assert units and float(units[0]["value"][1]) > 0, units
