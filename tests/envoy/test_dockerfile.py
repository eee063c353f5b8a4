"""The Dockerfile, as far as it can be checked without Docker (none runs here): its
HEALTHCHECK command is run against a real shardgate, with the environment the image sets,
and must pass once the store has answered and fail while it never has (`/healthcheck` is
readiness: a store failing later leaves it passing); the ports and paths it
declares agree with each other; the build context leaves out what the build does not need.
"""
import json
import os
import re
import subprocess

import pytest

from envoy_e2e import REPO, E2EError, Shardgate, Store, free_port

DOCKERFILE = (REPO / "Dockerfile").read_text()


def env_of_image():
    (block,) = re.findall(r"^ENV (.*?)(?:\n(?!\s)|\Z)", DOCKERFILE, re.S | re.M)
    return dict(re.findall(r"(\w+)=(\S+)", block))


def healthcheck_argv():
    m = re.search(r"^HEALTHCHECK .*?CMD (\[.*?\])$", DOCKERFILE, re.S | re.M)
    return json.loads(m.group(1))


def run_healthcheck(http_port):
    env = dict(os.environ)
    env["SHARDGATE_HTTP_ADDR"] = env_of_image()["SHARDGATE_HTTP_ADDR"].rsplit(":", 1)[0] + \
        f":{http_port}"
    return subprocess.run(healthcheck_argv(), env=env, capture_output=True, text=True,
                          timeout=10).returncode


@pytest.mark.parametrize("store_up", [True, False], ids=["store-up", "store-down"])
def test_healthcheck_waits_for_the_store(store_up, shardgate_bin, tmp_path):
    store = (Store("memory") if store_up else
             Store("dynamodb", endpoint=f"http://127.0.0.1:{free_port()}", table="unreachable"))
    sg = Shardgate(shardgate_bin, REPO / "config" / "example.yaml", store, tmp_path, "docker")
    try:
        sg.start()
        if sg.http_port is None or not sg.listening():
            pytest.fail("this shardgate build has no HTTP port for the HEALTHCHECK")
        assert run_healthcheck(sg.http_port) == (0 if store_up else 1), sg.proc.log()
    except E2EError as e:
        pytest.fail(str(e))
    finally:
        sg.stop()


def test_healthcheck_fails_when_nothing_listens():
    assert run_healthcheck(free_port()) != 0


def test_image_ports_and_paths_agree():
    env = env_of_image()
    exposed = set(re.search(r"^EXPOSE (.*)$", DOCKERFILE, re.M).group(1).split())
    assert {env["SHARDGATE_GRPC_ADDR"].rsplit(":", 1)[1],
            env["SHARDGATE_HTTP_ADDR"].rsplit(":", 1)[1]} == exposed
    # The default config lands in the directory SHARDGATE_CONFIG names.
    (dest,) = re.findall(r"^COPY config/example\.yaml (\S+)$", DOCKERFILE, re.M)
    assert dest.startswith(env["SHARDGATE_CONFIG"] + "/")
    # Runs as a numeric non-root user.
    (user,) = re.findall(r"^USER (\S+)$", DOCKERFILE, re.M)
    assert re.fullmatch(r"[1-9]\d*:[1-9]\d*", user)


def test_build_context_excludes_local_state():
    ignored = {line.strip().rstrip("/") for line in
               (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {"target", ".venv", ".tools", ".git"} <= ignored
    # Everything the build copies is still in the context.
    copied = re.findall(r"^COPY (?!--from)(.+) \S+$", DOCKERFILE, re.M)
    for sources in copied:
        for src in sources.split():
            top = src.split("/")[0]
            assert top not in ignored and (REPO / src).exists(), src
