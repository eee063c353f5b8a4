"""The drop-in as an operator meets it (issue 48): envoyproxy/ratelimit's Deployment with
only the image swapped (deploy/kubernetes/upstream-deployment.yaml, the shape of Istio's
rate-limit sample), run as the image runs it — the Dockerfile's own `ENV` lines, read from
the Dockerfile, under the manifest's environment, as `/bin/ratelimit` — serves the
ConfigMap's rules on GRPC_PORT and PORT from the same Redis, limits its domain, logs at
LOG_LEVEL=debug one line per decision naming its descriptor and nothing of its
dependencies; `explain` and `inspect` in that pod, with only upstream's variables, read
what the server reads. And the states that used to be silent: a request for an unknown
domain (a warning once per interval, a counter), a bad rule file reverted to the content
in force ("config OK again", a load counted), a misspelled `/json` field (400 naming it).

Only what a pod cannot have here is replaced: the mount root (`/data` → a temporary
directory), the Redis Service's address (a local redis-server), and the ports the kubelet
maps (GRPC_PORT/PORT, free ports, set as upstream's variables).
"""
import json
import os
import re
import subprocess
import time

import pytest
import yaml

from conftest import EXIT_TIMEOUT_S, REPO, Server, binary, free_port
from test_independent_client import desc, request

OK = 1
OVER = 2
MANIFEST = REPO / "deploy" / "kubernetes" / "upstream-deployment.yaml"
DOCKERFILE = (REPO / "Dockerfile").read_text()
# A level and a target, as the text log writes each line (no colour: not a terminal).
# A span's context (`decision{…}: `) may stand between them.
LOG_LINE = re.compile(r"^\S+\s+(TRACE|DEBUG|INFO|WARN|ERROR)\s+(?:\S*\{.*?\}: )?([\w:]+): ")


def image_env():
    """Every variable the Dockerfile's `ENV` instructions set."""
    env = {}
    for block in re.findall(r"^ENV (.*?)(?:\n(?!\s)|\Z)", DOCKERFILE, re.S | re.M):
        env.update(re.findall(r"(\w+)=(\S+)", block))
    return env


def manifest():
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap"]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return configmap, container


def clean_env():
    """This process's environment without anything of ours or upstream's server settings."""
    drop = ("SHARDGATE_", "REDIS_", "RUNTIME_", "STATSD_", "USE_")
    return {k: v for k, v in os.environ.items()
            if not k.startswith(drop)
            and k not in ("RUST_LOG", "HOST", "PORT", "GRPC_HOST", "GRPC_PORT", "LOG_LEVEL",
                          "LOG_FORMAT", "NO_COLOR")}


class Pod:
    """The manifest's container as this machine can run it."""

    def __init__(self, tmp_path, redis_server):
        configmap, self.container = manifest()
        (mount,) = self.container["volumeMounts"]
        env = {e["name"]: e["value"] for e in self.container["env"]}
        root = tmp_path / "mnt"
        assert mount["mountPath"].startswith(env["RUNTIME_ROOT"] + "/")
        self.rules = root / mount["mountPath"].lstrip("/")
        self.rules.mkdir(parents=True)
        for name, text in configmap["data"].items():
            (self.rules / name).write_text(text)
        self.grpc_port, self.http_port = free_port(), free_port()
        assert env["REDIS_URL"] == "redis:6379", env
        self.upstream = {
            **env,
            "RUNTIME_ROOT": str(root / env["RUNTIME_ROOT"].lstrip("/")),
            "REDIS_URL": f"127.0.0.1:{redis_server.port}",
        }
        self.env = {**clean_env(), **image_env(), **self.upstream,
                    "GRPC_PORT": str(self.grpc_port), "PORT": str(self.http_port)}
        link = tmp_path / "bin" / "ratelimit"
        link.parent.mkdir()
        link.symlink_to(binary())
        assert self.container["command"] == ["/bin/ratelimit"]
        self.command = [str(link)]

    def start(self, tmp_path):
        log_path = tmp_path / "pod.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env=self.env)
        server = Server(proc, self.grpc_port, log_path, http_port=self.http_port)
        assert server.wait_ready(), server.log()
        return server

    def run(self, *args):
        """A command in the pod, with upstream's variables only (no ports of ours)."""
        env = {**clean_env(), **image_env(), **self.upstream}
        return subprocess.run([binary(), *args], env=env, capture_output=True, text=True,
                              timeout=60)


@pytest.fixture
def pod(tmp_path, redis_server):
    return Pod(tmp_path, redis_server)


def test_upstreams_deployment_with_only_the_image_swapped(pod, tmp_path, redis_server):
    # The image sets nothing that shadows upstream's variables.
    assert not [k for k in image_env() if k.startswith("SHARDGATE_") or k == "RUST_LOG"]
    assert {p["containerPort"] for p in pod.container["ports"]} == {8080, 8081, 6070}
    server = pod.start(tmp_path)
    try:
        # The ConfigMap's domain is limited: /productpage at 1 a minute, the deny-list
        # idiom always; on GRPC_PORT.
        calls = [
            ("PATH", "/productpage"), ("PATH", "/productpage"), ("PATH", "/reviews"),
            ("remote_address", "10.0.0.66"),
        ]
        codes = [server.should_rate_limit(request("ratelimit", desc(c))).overall_code
                 for c in calls]
        assert codes == [OK, OVER, OK, OVER], codes
        # The image's own example is not what is served.
        status, _, text = server.http("GET", "/rlconfig")
        assert status == 200 and "ratelimit" in text, text
        assert "edge" not in text, text
        status, _, _ = server.http("GET", "/healthcheck")
        assert status == 200
        metrics = server.metrics()
        (info,) = metrics.series("shardgate_build_info")
        assert info[1] == 1 and info[0]["version"] and info[0]["features"], info
        # In the Deployment's Redis.
        assert redis_server.keys("{}default/BUCKET#PATH=%2Fproductpage#ratelimit#*"), \
            redis_server.keys()
    finally:
        server.stop()
    log = server.log()
    assert "\x1b[" not in log, "colour codes in a file"
    lines = [LOG_LINE.match(l) for l in log.splitlines() if l.strip()]
    assert all(lines), [l for l, m in zip(log.splitlines(), lines) if not m]
    targets = {m.group(2) for m in lines}
    # LOG_LEVEL=debug is shardgate's level: no line of a dependency crate.
    assert targets and all(t.split("::")[0] == "shardgate" for t in targets), targets
    # One decision line per call, naming its descriptor and answer.
    decisions = [l for l in log.splitlines() if "shardgate::service::decision: decision " in l]
    assert len(decisions) == 4, decisions
    for (key, value), line, answer in zip(calls, decisions,
                                          ["OK", "OVER_LIMIT", "OK", "OVER_LIMIT"]):
        assert f"descriptors=[{key}={value}]" in line, line
        assert "domain=ratelimit" in line and f'answer="{answer}"' in line, line
    # Start-up: the version; the rules read where RUNTIME_ROOT says; the ports; nothing
    # of ours overriding anything.
    assert re.search(r"INFO shardgate: shardgate starting version=", log), log
    assert re.search(rf"config loaded path={re.escape(str(pod.rules))} domains=1 names=ratelimit ",
                     log), log
    for var in ("RUNTIME_ROOT", "GRPC_PORT", "PORT", "LOG_LEVEL", "REDIS_URL"):
        assert re.search(rf"honoured from={var} ", log), (var, log)
    assert "wins over" not in log, log


def test_explain_and_inspect_in_the_pod_read_what_the_server_reads(pod, tmp_path):
    server = pod.start(tmp_path)
    try:
        assert server.should_rate_limit(
            request("ratelimit", desc(("PATH", "/productpage")))).overall_code == OK
        body = {"domain": "ratelimit",
                "descriptors": [{"entries": [{"key": "PATH", "value": "/productpage"}]}]}
        status, _, served = server.http("POST", "/explain", body)
        assert status == 200, served
        done = pod.run("explain", "ratelimit", "PATH=/productpage")
        assert done.returncode == 0, done.stderr
        first, _, explained = done.stdout.partition("\n")
        assert first.startswith("balances: Redis"), done.stdout
        # The server adds what only it knows (whether it holds a lease on the bucket);
        # the command, a process of its own, holds none and says nothing of leases.
        lease = "  lease on this server: "
        assert any(line.startswith(lease) for line in served.splitlines()), served
        assert lease not in explained, explained
        from_store = "\n".join(line for line in served.splitlines()
                               if not line.startswith(lease))
        # The same text, but for the wait until a request fits: each reads its own clock,
        # a moment apart (60 ms when the machine is busy).
        waits = re.compile(r"fits in ([0-9.]+) s")
        assert (waits.sub("fits in _ s", explained.rstrip("\n"))
                == waits.sub("fits in _ s", from_store.rstrip("\n"))), (explained, served)
        pairs = list(zip(waits.findall(explained), waits.findall(from_store)))
        assert pairs and all(abs(float(a) - float(b)) < 2.0 for a, b in pairs), pairs
        assert "0 of 1 tokens left" in explained, explained
        done = pod.run("inspect", "--entity", "PATH=%2Fproductpage", "--resource", "ratelimit")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["shard_count"] >= 1, done.stdout
    finally:
        server.stop()
    # Without a shared store the command says its balances are no server's.
    rules = pod.rules / "config.yaml"
    done = subprocess.run([binary(), "explain", "--config", str(rules), "ratelimit",
                           "PATH=/productpage"], env=clean_env(), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("balances: an empty embedded store"), done.stdout
    assert "1 of 1 tokens left" in done.stdout, done.stdout
    done = subprocess.run([binary(), "inspect", "--entity", "x", "--resource", "r"],
                          env=clean_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "--store" in done.stderr, done.stderr
    # check-config takes --config, as every command that reads rules; the path alone too.
    for args in (["--config", str(rules)], [str(rules)]):
        done = subprocess.run([binary(), "check-config", *args], env=clean_env(),
                              capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stdout) == (0, "OK\n"), done.stderr


RULES = """
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: key_only
    rate_limit: {unit: minute, requests_per_unit: 1}
"""


def test_an_unknown_domain_is_warned_about_once_per_interval_and_counted(shardgate):
    server = shardgate(RULES)
    for _ in range(3):
        r = server.should_rate_limit(request("shopp", desc(("user", "u"))))
        assert r.overall_code == OK
    warnings = [l for l in server.log().splitlines() if "domain no rule defines" in l]
    assert len(warnings) == 1, server.log()
    assert "domain=shopp" in warnings[0] and "known_domains=shop" in warnings[0], warnings
    assert server.metrics().value("shardgate_domain_not_found_total") == 3


def test_a_bad_file_reverted_to_the_content_in_force_says_config_ok_again(shardgate,
                                                                           tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    server = shardgate(config=path)

    def wait_for(text, count=1):
        deadline = time.monotonic() + 20
        while server.log().count(text) < count:
            assert time.monotonic() < deadline, (text, server.log())
            time.sleep(0.05)

    path.write_text(RULES + "  - key: broken\n    rate_limit: {unit: fortnight}\n")
    wait_for("config reload rejected")
    loads = server.metrics().value("shardgate_config_load_success_total")
    assert server.metrics().value("shardgate_config_load_error_total") == 1
    path.write_text(RULES)
    wait_for("config OK again")
    # Counted as a load: ShardgateConfigReloadFailing's condition ends.
    assert server.metrics().value("shardgate_config_load_success_total") == loads + 1


def test_json_refuses_a_misspelled_field_by_name_and_debits_nothing(shardgate):
    server = shardgate(RULES)
    body = {"domain": "shop",
            "descriptors": [{"entries": [{"key": "key_only", "valu": "v"}]}]}
    status, _, text = server.http("POST", "/json", body)
    assert status == 400, (status, text)
    assert "descriptors[0].entries[0].valu: unknown field" in text, text
    assert len(text) < 300, text
    # The key-only rule's bucket was not touched: its one token is still there.
    r = server.should_rate_limit(request("shop", desc(("key_only", ""))))
    assert r.overall_code == OK, r


def test_one_of_ours_beside_upstreams_wins_and_says_so_once(pod, tmp_path):
    # A Deployment that sets both: ours is followed (a flag would beat both), and the
    # start-up log names the two and which one wins, once.
    ours = tmp_path / "ours.yaml"
    ours.write_text(RULES)
    pod.env["SHARDGATE_CONFIG"] = str(ours)
    server = pod.start(tmp_path)
    try:
        r = server.should_rate_limit(request("shop", desc(("user", "u"))))
        assert r.statuses[0].current_limit.requests_per_unit == 2, r
        r = server.should_rate_limit(request("ratelimit", desc(("PATH", "/productpage"))))
        assert not r.statuses[0].HasField("current_limit"), r
    finally:
        server.stop()
    wins = [l for l in server.log().splitlines() if "wins over" in l]
    assert len(wins) == 1, server.log()
    assert "SHARDGATE_CONFIG" in wins[0] and "RUNTIME_ROOT" in wins[0], wins
