"""envoy-examples/istio and envoy-examples/kubernetes: the parts that can run here run.

- The Istio EnvoyFilter patches (ratelimit filter, shardgate cluster, route actions) are
  assembled into a real Envoy in front of a real shardgate serving the example ConfigMap's
  rules, and must limit.
- The probes' gRPC health service name is checked against the real server by Envoy's own
  gRPC health checker (a wrong name fails the check).
- The Kubernetes example's pod, its DynamoDB table gone after start-up (a fault proxy in
  front of DynamoDB Local answering HTTP 500): its readiness probe stays SERVING, so the
  pod stays in the Service, and Envoy gets each rule's `failure_mode` answer.
- The Kubernetes example on Redis (envoy-examples/kubernetes/redis): its pod's environment
  against a real redis-server started with the manifest's arguments limits an API key at
  its burst, with the buckets in that Redis.
- Every ConfigMap passes `shardgate check-config`; the manifests keep the properties their
  READMEs promise (ConfigMap mounted as a directory, non-root, DynamoDB settings, minimal
  IAM actions).
"""
import json
import os
import subprocess
import sys
import time
import socket
import urllib.error
import urllib.parse
import urllib.request

import pytest
import yaml

from envoy_e2e import (
    REPO, RLS_TIMEOUT, ROUTER, E2EError, Envoy, Shardgate, Store, bootstrap, backend_listener,
    create_table, header, http_listener, ratelimit_filter, route, static_cluster, unique,
    wait_until,
)

sys.path.insert(0, str(REPO / "tests" / "python"))
from fault_proxy import FaultProxy  # noqa: E402  (the store-fault suite's proxy, stdlib only)

ISTIO = REPO / "envoy-examples" / "istio"
K8S = REPO / "envoy-examples" / "kubernetes"


def load_all(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def one(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, [d["kind"] for d in docs])
    return found[0]


def write_configmap(configmap_path, directory):
    """Writes a ConfigMap's data as the files of a mounted directory."""
    cm = one(load_all(configmap_path), "ConfigMap")
    directory.mkdir()
    for key, text in cm["data"].items():
        (directory / key).write_text(text)
    return directory


def container(deployment):
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def grpc_probe_service(deployment):
    """The gRPC health service the readiness probe asks for, on the gRPC port. Liveness is
    a TCP check of that port: a store outage must not restart the replicas."""
    c = container(deployment)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": 8081, "http": 8080}, ports
    ready = c["readinessProbe"]["grpc"]
    assert ready["port"] == ports["grpc"]
    assert c["livenessProbe"]["tcpSocket"]["port"] in ("grpc", ports["grpc"])
    assert "grpc" not in c["livenessProbe"] and "httpGet" not in c["livenessProbe"]
    return ready["service"]


# --- Istio: the patches in a real Envoy ----------------------------------------------------


def istio_patches():
    docs = load_all(ISTIO / "envoyfilter.yaml")
    patches = [p for d in docs if d["kind"] == "EnvoyFilter" for p in d["spec"]["configPatches"]]
    by_kind = {p["applyTo"]: p for p in patches}
    assert set(by_kind) == {"HTTP_FILTER", "CLUSTER", "VIRTUAL_HOST"}
    return by_kind


def istio_envoy_config(ports, shardgate_port, probe_service):
    patches = istio_patches()
    http_filter = patches["HTTP_FILTER"]["patch"]["value"]
    assert patches["HTTP_FILTER"]["patch"]["operation"] == "INSERT_BEFORE"
    assert patches["HTTP_FILTER"]["match"]["listener"]["filterChain"]["filter"]["subFilter"][
        "name"] == "envoy.filters.http.router"
    # This machine is slower than a cluster (and may run DynamoDB Local): the example's
    # timeout is replaced so that a slow answer cannot pass as fail-open.
    http_filter["typed_config"]["timeout"] = RLS_TIMEOUT

    cluster = patches["CLUSTER"]["patch"]["value"]
    (lb,) = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    addr = lb["endpoint"]["address"]["socket_address"]
    assert addr == {"address": "shardgate.shardgate.svc.cluster.local", "port_value": 8081}
    addr.update(address="127.0.0.1", port_value=shardgate_port)  # the Service, here
    # Envoy checks the same gRPC health service the Kubernetes probes ask for.
    cluster["health_checks"] = [{
        "timeout": "1s", "interval": "0.2s", "no_traffic_interval": "0.2s",
        "unhealthy_threshold": 1, "healthy_threshold": 1,
        "grpc_health_check": {"service_name": probe_service},
    }]

    listener = http_listener("gateway", ports["main"], [
        {"match": {"prefix": "/"}, "route": {"cluster": "backend"}}],
        [http_filter, {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}])
    vhost = listener["filter_chains"][0]["filters"][0]["typed_config"]["route_config"][
        "virtual_hosts"][0]
    vhost.update(patches["VIRTUAL_HOST"]["patch"]["value"])  # MERGE into every virtual host
    return bootstrap(ports["admin"], [listener, backend_listener(ports["backend"])],
                     [cluster, static_cluster("backend", ports["backend"])])


def start_istio(shardgate_bin, envoy_bin, store, tmp_path, probe_service):
    limits = write_configmap(ISTIO / "configmap.yaml", tmp_path / "limits")
    sg = Shardgate(shardgate_bin, limits, store, tmp_path, f"istio-{store.name}")
    envoy = Envoy(envoy_bin, tmp_path, f"istio-{store.name}",
                  lambda ports: istio_envoy_config(ports, sg.port, probe_service))
    sg.start()
    try:
        envoy.start()
    except E2EError:
        sg.stop()
        raise
    return sg, envoy


@pytest.fixture
def istio(store, shardgate_bin, envoy_bin, tmp_path):
    service = grpc_probe_service(one(load_all(ISTIO / "deployment.yaml"), "Deployment"))
    try:
        sg, envoy = start_istio(shardgate_bin, envoy_bin, store, tmp_path, service)
    except E2EError as e:
        pytest.fail(str(e))
    yield sg, envoy
    envoy.stop()
    sg.stop()


def test_istio_envoyfilter_limits_per_api_key(istio):
    sg, envoy = istio
    # The readiness probe's health service answers SERVING (Envoy's health checker agrees).
    wait_until(lambda: envoy.counter("cluster.shardgate.health_check.success") >= 1, 30,
               "a successful gRPC health check of shardgate", detail=sg.proc.log)
    assert envoy.counter("cluster.shardgate.health_check.failure") == 0

    # per_key: 100/minute. Count 200s until the first 429 (bounded); the refill during the
    # loop (100/minute) may add a few.
    key = {"x-api-key": unique("k")}
    start = time.monotonic()
    ok, last = 0, None
    for _ in range(150):
        last = envoy.get("/", key)
        if last.status != 200:
            break
        ok += 1
    elapsed = time.monotonic() - start
    assert last.status == 429, last
    assert 100 <= ok <= 100 + int(elapsed * 100 / 60) + 1, (ok, elapsed)
    assert last.header("x-ratelimit-limit").startswith('100, 100;w=60;name="per_key"'), last.headers
    # Nothing failed open on the way.
    assert envoy.counter("cluster.backend.ratelimit.error") == 0
    # Without the header only remote_address applies (50/s, burst 100): allowed.
    assert envoy.get("/", {}).status == 200


def test_istio_wrong_probe_service_fails_the_health_check(store, shardgate_bin, envoy_bin,
                                                          tmp_path):
    # The check above can fail: a service name shardgate does not serve is NOT_FOUND.
    try:
        sg, envoy = start_istio(shardgate_bin, envoy_bin, store, tmp_path, "no-such-service")
    except E2EError as e:
        pytest.fail(str(e))
    try:
        wait_until(lambda: envoy.counter("cluster.shardgate.health_check.failure") >= 1, 30,
                   "a failed gRPC health check", detail=sg.proc.log)
        assert envoy.counter("cluster.shardgate.health_check.success") == 0
    except E2EError as e:
        pytest.fail(str(e))
    finally:
        envoy.stop()
        sg.stop()


# --- manifests -----------------------------------------------------------------------------


@pytest.mark.parametrize("example", [ISTIO, K8S], ids=["istio", "kubernetes"])
def test_configmap_rules_are_valid(example, shardgate_bin, tmp_path):
    limits = write_configmap(example / "configmap.yaml", tmp_path / "limits")
    out = subprocess.run([shardgate_bin, "check-config", str(limits)], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.strip() == "OK", out.stdout + out.stderr


@pytest.mark.parametrize("example", [ISTIO, K8S], ids=["istio", "kubernetes"])
def test_deployment_mounts_the_configmap_as_a_directory(example):
    docs = load_all(example / "deployment.yaml")
    d = one(docs, "Deployment")
    pod = d["spec"]["template"]["spec"]
    c = container(d)
    (mount,) = c["volumeMounts"]
    # subPath mounts never receive ConfigMap updates.
    assert "subPath" not in mount and mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    cm = one(load_all(example / "configmap.yaml"), "ConfigMap")
    assert volume["configMap"]["name"] == cm["metadata"]["name"]
    config_args = [a for a in c["args"] if a.startswith("--config=")]
    env = {e["name"]: e["value"] for e in c.get("env", [])}
    config = config_args[0].split("=", 1)[1] if config_args else env.get("SHARDGATE_CONFIG")
    assert config == mount["mountPath"]
    # Non-root, as the image's numeric user.
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert grpc_probe_service(d) == "ratelimit"


def test_istio_memory_store_runs_one_replica():
    d = one(load_all(ISTIO / "deployment.yaml"), "Deployment")
    c = container(d)
    assert d["spec"]["replicas"] == 1  # memory store: replicas would multiply the limits
    assert not any("--store" in a and "dynamodb" in a for a in c["args"])
    labels = d["spec"]["template"]["metadata"]["labels"]
    assert labels["sidecar.istio.io/inject"] == "false"


def test_kubernetes_deployment_uses_dynamodb_with_its_own_identity():
    docs = load_all(K8S / "deployment.yaml")
    d = one(docs, "Deployment")
    env = {e["name"]: e["value"] for e in container(d)["env"]}
    assert env["SHARDGATE_STORE"] == "dynamodb"
    assert env["SHARDGATE_TABLE"] == "shardgate"
    assert "AWS_ACCESS_KEY_ID" not in env and "SHARDGATE_DYNAMODB_ENDPOINT" not in env
    accounts = {a["metadata"]["name"]: a for a in load_all(K8S / "serviceaccount.yaml")}
    sa = d["spec"]["template"]["spec"]["serviceAccountName"]
    assert "eks.amazonaws.com/role-arn" in accounts[sa]["metadata"]["annotations"]
    job = one(load_all(K8S / "table-create-job.yaml"), "Job")
    job_pod = job["spec"]["template"]["spec"]
    assert job_pod["serviceAccountName"] != sa and job_pod["serviceAccountName"] in accounts
    assert job_pod["containers"][0]["args"] == ["table", "create"]
    svc = one(load_all(K8S / "service.yaml"), "Service")
    assert svc["spec"]["clusterIP"] == "None"  # STRICT_DNS sees every replica


def test_kubernetes_redis_pod_limits_on_a_real_redis(shardgate_bin, tmp_path):
    redis_docs = load_all(K8S / "redis" / "redis.yaml")
    (redis_c,) = one(redis_docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    args = redis_c["args"]
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    assert one(redis_docs, "Service")["metadata"]["name"] == "redis"
    d = one(load_all(K8S / "redis" / "deployment.yaml"), "Deployment")
    c = container(d)
    assert c["args"] == ["serve"] and grpc_probe_service(d) == "ratelimit"
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["SHARDGATE_STORE"] == "redis"
    assert env["SHARDGATE_REDIS_URL"] == "redis://redis.shardgate.svc:6379"
    assert "serviceAccountName" not in d["spec"]["template"]["spec"]

    # The pod, here: the manifest's Redis arguments on a free port, the pod's variables
    # with the Service's address and the listeners moved to free loopback ports.
    redis_port = unique_port()
    redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                              "--dir", str(tmp_path), *args], stdout=subprocess.DEVNULL,
                             stderr=subprocess.STDOUT)
    http_port = unique_port()
    limits = write_configmap(K8S / "configmap.yaml", tmp_path / "limits")
    pod_env = {**os.environ, **env,
               "SHARDGATE_REDIS_URL": f"redis://127.0.0.1:{redis_port}",
               "SHARDGATE_CONFIG": str(limits),
               "SHARDGATE_GRPC_ADDR": f"127.0.0.1:{unique_port()}",
               "SHARDGATE_HTTP_ADDR": f"127.0.0.1:{http_port}"}
    log = open(tmp_path / "pod.log", "wb")
    pod = subprocess.Popen([shardgate_bin, *c["args"]], env=pod_env, stdout=log,
                           stderr=subprocess.STDOUT)
    try:
        def healthy():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthcheck",
                                            timeout=1) as r:
                    return r.status == 200
            except OSError:
                return False
        wait_until(healthy, 30, "the pod serving on Redis")
        body = json.dumps({"domain": "edge", "descriptors": [{"entries": [
            {"key": "tenant", "value": "acme"}, {"key": "api_key", "value": "k1"}]}]}).encode()
        codes = []
        for _ in range(201):  # the API key's burst is 200
            req = urllib.request.Request(f"http://127.0.0.1:{http_port}/json", data=body)
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    codes.append(json.loads(r.read())["overallCode"])
            except urllib.error.HTTPError as e:  # /json answers OVER_LIMIT with 429
                assert e.code == 429, e
                codes.append(json.loads(e.read())["overallCode"])
        assert codes[:200] == ["OK"] * 200 and codes[200] == "OVER_LIMIT", codes[190:]
        keys = subprocess.run(["redis-cli", "-p", str(redis_port), "--scan", "--pattern",
                               "{}production/BUCKET#*"], capture_output=True, text=True,
                              timeout=10).stdout.split()
        assert sorted(keys) == ["{}production/BUCKET#tenant=acme#edge#0",
                                "{}production/BUCKET#tenant=acme/api_key=k1#edge#0"], keys
    finally:
        pod.terminate()
        pod.wait(timeout=15)
        redis.terminate()
        redis.wait(timeout=15)
        log.close()


def unique_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def actions_and_resources(path):
    policy = json.loads(path.read_text())
    actions, resources = set(), set()
    for st in policy["Statement"]:
        assert st["Effect"] == "Allow"
        actions |= set(st["Action"])
        resources |= {st["Resource"]} if isinstance(st["Resource"], str) else set(st["Resource"])
    return actions, resources


def test_iam_policies_are_minimal():
    run_actions, run_resources = actions_and_resources(K8S / "iam-policy.json")
    # Exactly what the calls need (tests/dynamodb_edges.rs derives it from the calls made):
    # a transaction is authorised by the puts and updates it carries.
    assert run_actions == {"dynamodb:UpdateItem", "dynamodb:PutItem", "dynamodb:BatchGetItem"}
    create_actions, create_resources = actions_and_resources(K8S / "iam-policy-table-create.json")
    assert create_actions == {"dynamodb:CreateTable", "dynamodb:DescribeTable",
                              "dynamodb:UpdateTimeToLive"}
    for resources in (run_resources, create_resources):
        (arn,) = resources
        assert arn.startswith("arn:aws:dynamodb:") and arn.endswith(":table/shardgate"), arn
        assert "*" not in arn


# --- Kubernetes: readiness through a store outage -------------------------------------------

DDB_ENV = "SHARDGATE_TEST_DYNAMODB_ENDPOINT"
# shardgate re-checks its store every 5 s (STORE_HEALTH_INTERVAL); the outage outlasts two
# of those checks and the 2 s each may take.
OUTAGE_WATCHED_S = 12.0


def k8s_envoy_config(ports, shardgate_port, probe_service):
    """Envoy in front of the example's pod: the filter fails closed (`failure_mode_deny`),
    so a rule's UNAVAILABLE shows as 500; the shardgate cluster is health checked with the
    readiness probe's service, as the kubelet asks it."""
    cluster = static_cluster("shardgate", shardgate_port, http2=True)
    cluster["health_checks"] = [{
        "timeout": "1s", "interval": "0.2s", "no_traffic_interval": "0.2s",
        "unhealthy_threshold": 1, "healthy_threshold": 1,
        "grpc_health_check": {"service_name": probe_service},
    }]
    routes = [
        route("/tenant", [{"actions": [header("x-tenant", "tenant")]}]),
        route("/address", [{"actions": [{"remote_address": {}}]}]),
    ]
    filters = [ratelimit_filter("edge", failure_mode_deny=True),
               {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}]
    return bootstrap(ports["admin"],
                     [http_listener("main", ports["main"], routes, filters),
                      backend_listener(ports["backend"])],
                     [cluster, static_cluster("backend", ports["backend"])])


def rule_failure_modes(configmap_path):
    """Each top-level rule key of the example's `edge` domain and its `failure_mode`
    (the domain's where the rule sets none)."""
    cm = one(load_all(configmap_path), "ConfigMap")
    domain = yaml.safe_load(cm["data"]["edge.yaml"])
    return {d["key"]: d.get("failure_mode", domain.get("failure_mode", "deny"))
            for d in domain["descriptors"]}


def test_kubernetes_pod_stays_ready_and_answers_each_rules_failure_mode_in_a_store_outage(
        shardgate_bin, envoy_bin, tmp_path):
    """Readiness means "warmed up", not "the store answers": a pod taken out of the
    Service in a store outage leaves Envoy's filter-level failure mode to answer for
    every rule alike, and with every pod out, no rule's own `failure_mode` is ever
    given. Here the table fails after start-up: the probe's service stays SERVING, and
    the tenant rule (deny) is answered UNAVAILABLE (Envoy, failing closed: 500) while the
    client-address rule (allow) lets its request through. Before, the probe turned
    NOT_SERVING within one store health interval."""
    modes = rule_failure_modes(K8S / "configmap.yaml")
    assert modes == {"tenant": "deny", "remote_address": "allow"}, modes
    endpoint = os.environ.get(DDB_ENV)
    if not endpoint:
        pytest.fail(f"{DDB_ENV} is not set: this test needs DynamoDB Local (scripts/test starts it)")
    upstream = urllib.parse.urlsplit(endpoint).port
    proxy = FaultProxy(upstream, tmp_path / "fault-proxy.log")
    sg = envoy = None
    try:
        store = Store("dynamodb", endpoint=proxy.endpoint, table="shardgate-e2e-k8s")
        create_table(shardgate_bin, store, tmp_path / "create.log")
        probe = grpc_probe_service(one(load_all(K8S / "deployment.yaml"), "Deployment"))
        limits = write_configmap(K8S / "configmap.yaml", tmp_path / "limits")
        sg = Shardgate(shardgate_bin, limits, store, tmp_path, "k8s-outage")
        sg.start()
        envoy = Envoy(envoy_bin, tmp_path, "k8s-outage",
                      lambda ports: k8s_envoy_config(ports, sg.port, probe))
        envoy.start()
        wait_until(lambda: envoy.counter("cluster.shardgate.health_check.success") >= 1, 60,
                   "the readiness probe's service SERVING", detail=sg.proc.log)
        tenant = {"x-tenant": unique("t")}
        assert envoy.get("/tenant", tenant).status == 200
        assert envoy.get("/address").status == 200

        proxy.set("http500")
        failures = envoy.counter("cluster.shardgate.health_check.failure")
        errors = envoy.counter("cluster.backend.ratelimit.error")
        answers = []
        started = time.monotonic()
        while time.monotonic() - started < OUTAGE_WATCHED_S:
            answers.append((envoy.get("/tenant", tenant).status, envoy.get("/address").status))
            assert envoy.counter("cluster.shardgate.health_check.failure") == failures, (
                "the probe's service went NOT_SERVING", sg.proc.log(tail=2000))
            time.sleep(0.5)
        assert envoy.counter("cluster.shardgate.membership_healthy") == 1
        # deny: UNAVAILABLE, refused by Envoy failing closed; allow: OK, passed.
        assert set(answers) == {(500, 200)}, answers
        assert envoy.counter("cluster.backend.ratelimit.error") == errors + len(answers)
        assert "store health check failed" in sg.proc.log(tail=5000), "the store did fail"
    except E2EError as e:
        pytest.fail(str(e))
    finally:
        proxy.set("pass")
        if envoy is not None:
            envoy.stop()
        if sg is not None:
            sg.stop()
        proxy.stop()
