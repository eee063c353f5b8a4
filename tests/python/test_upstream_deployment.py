"""An envoyproxy/ratelimit Deployment's environment starts shardgate unchanged (issue 17):
`shardgate serve` with no flags at all, only upstream's variables (its example
Deployment's rule directory layout with a domain over two files, ports, log settings,
Redis and statsd settings),
serves the same rules on the same ports from the same Redis (issue 29), logs in the format
asked for, and names the variables it ignores once — started as `shardgate serve`, or as upstream's image starts
its server, `/bin/ratelimit` with no arguments (a link to shardgate under that name). A
setting it cannot follow stops it with a message naming it.
"""
import json
import os
import subprocess

import pytest

from envoy.service.ratelimit.v3 import rls_pb2

from conftest import EXIT_TIMEOUT_S, Server, binary, free_port
from test_independent_client import desc, request

OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT

RULES = """
domain: rl
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
"""


def base_env():
    """The process environment without any of our own variables (they would win)."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("SHARDGATE_") and k not in ("RUST_LOG", "HOST", "PORT")}


def command(invocation, tmp_path):
    """The argv that starts the server: ours, or upstream's entrypoint name with none."""
    if invocation == "shardgate serve":
        return [binary(), "serve"]
    link = tmp_path / "bin" / "ratelimit"
    link.parent.mkdir()
    link.symlink_to(binary())
    return [str(link)]


@pytest.mark.parametrize("invocation", ["shardgate serve", "/bin/ratelimit"])
def test_an_upstream_deployment_environment_serves_its_rules(tmp_path, invocation, redis_server):
    # upstream's layout: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/*.yaml
    rules = tmp_path / "data" / "ratelimit" / "config"
    rules.mkdir(parents=True)
    (rules / "rl.yaml").write_text(RULES)
    # A second file for the same domain, which MERGE_DOMAIN_CONFIG merges.
    (rules / "rl-more.yaml").write_text(
        "domain: rl\ndescriptors:\n  - key: tenant\n"
        "    rate_limit: {unit: minute, requests_per_unit: 1}\n")
    grpc_port, http_port = free_port(), free_port()
    env = {
        **base_env(),
        "RUNTIME_ROOT": str(tmp_path / "data"),
        "RUNTIME_SUBDIRECTORY": "ratelimit",
        "RUNTIME_WATCH_ROOT": "false",
        "RUNTIME_IGNOREDOTFILES": "true",
        "GRPC_HOST": "127.0.0.1",
        "GRPC_PORT": str(grpc_port),
        "HOST": "127.0.0.1",
        "PORT": str(http_port),
        "LOG_LEVEL": "info",
        "LOG_FORMAT": "json",
        "USE_STATSD": "false",
        "BACKEND_TYPE": "redis",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": f"127.0.0.1:{redis_server.port}",
        "LIMIT_RESPONSE_HEADERS_ENABLED": "true",
        "RESPONSE_DYNAMIC_METADATA": "true",
        "MERGE_DOMAIN_CONFIG": "true",
    }
    log_path = tmp_path / "shardgate.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command(invocation, tmp_path), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, env=env)
    server = Server(proc, grpc_port, log_path, http_port=http_port)
    try:
        assert server.wait_ready(), server.log()
        codes = [server.should_rate_limit(request("rl", desc(("user", "alice")))).overall_code
                 for _ in range(3)]
        assert codes == [OK, OK, OVER_LIMIT], codes
        r = server.should_rate_limit(request("rl", desc(("user", "bob"))))
        headers = {h.key: h.value for h in r.response_headers_to_add}
        assert headers == {"RateLimit-Limit": "2", "RateLimit-Remaining": "1",
                           "RateLimit-Reset": "30"}, headers
        assert r.dynamic_metadata.fields["domain"].string_value == "rl", r
        tenant = [server.should_rate_limit(request("rl", desc(("tenant", "t")))).overall_code
                  for _ in range(2)]
        assert tenant == [OK, OVER_LIMIT], tenant
        status, _, text = server.http("GET", "/healthcheck")
        assert status == 200, text
        # The buckets are in that Redis, one item per (entity, resource, shard).
        assert redis_server.keys("{}default/BUCKET#*") == [
            "{}default/BUCKET#tenant=t#rl#0",
            "{}default/BUCKET#user=alice#rl#0",
            "{}default/BUCKET#user=bob#rl#0",
        ]
    finally:
        server.stop()

    lines = [json.loads(l) for l in server.log().splitlines() if l.strip()]
    ignored = [l for l in lines if "ignored" in l.get("fields", {})]
    # Nothing of this environment is ignored: USE_STATSD=false, RUNTIME_IGNOREDOTFILES=true
    # and RUNTIME_WATCH_ROOT=false ask for what shardgate does (no statsd unless asked,
    # dot files skipped, the rule directory itself watched).
    assert ignored == [], ignored
    honoured = {l["fields"]["from"] for l in lines
                if l.get("fields", {}).get("message") == "envoyproxy/ratelimit variable honoured"}
    assert {"RUNTIME_ROOT", "GRPC_PORT", "PORT", "LOG_LEVEL", "LOG_FORMAT",
            "LIMIT_RESPONSE_HEADERS_ENABLED", "RESPONSE_DYNAMIC_METADATA",
            "MERGE_DOMAIN_CONFIG", "BACKEND_TYPE", "REDIS_URL"} <= honoured, honoured


def test_a_setting_shardgate_cannot_follow_stops_it_by_name(tmp_path):
    config = tmp_path / "rules.yaml"
    config.write_text(RULES)
    env = {**base_env(), "SHARDGATE_CONFIG": str(config),
           "SHARDGATE_GRPC_ADDR": f"127.0.0.1:{free_port()}",
           "SHARDGATE_HTTP_ADDR": f"127.0.0.1:{free_port()}",
           "GRPC_UDS": "/tmp/ratelimit.sock"}
    done = subprocess.run([binary(), "serve"], env=env, capture_output=True, text=True,
                          timeout=EXIT_TIMEOUT_S)
    assert done.returncode != 0, done
    assert "GRPC_UDS" in done.stderr and "TCP only" in done.stderr, done.stderr
    assert len(done.stderr) < 1024, done.stderr
