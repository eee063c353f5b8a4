"""The Dockerfile, as far as it can be checked without Docker (none runs here): its
HEALTHCHECK command is run against a real shardgate, with the environment the image sets,
and must pass once the store has answered and fail while it never has (`/healthcheck` is
readiness: a store failing later leaves it passing), on the HTTP port the server itself
would pick (ours, else upstream's PORT, else the default); the ports and paths it declares
agree with the binary's defaults; it sets no variable of ours that would shadow one of
envoyproxy/ratelimit's (issue 48); the build context leaves out what the build does not
need.
"""
import json
import os
import re
import subprocess

import pytest

from envoy_e2e import REPO, E2EError, Shardgate, Store, free_port

DOCKERFILE = (REPO / "Dockerfile").read_text()


def env_of_image():
    """Every `ENV` instruction's variables (none, today)."""
    env = {}
    for block in re.findall(r"^ENV (.*?)(?:\n(?!\s)|\Z)", DOCKERFILE, re.S | re.M):
        env.update(re.findall(r"(\w+)=(\S+)", block))
    return env


def serve_defaults(binary):
    """`serve --help`'s defaults, by flag: what the image runs with."""
    text = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True,
                          timeout=10).stdout
    defaults = {}
    for flag, body in re.findall(r"^\s+(?:-\w, )?(--[\w-]+)[^\n]*\n((?:\s{8,}.*\n?)*)",
                                 text, re.M):
        m = re.search(r"\[default: ([^;\]\s]+)", " ".join(body.split()))
        if m:
            defaults[flag] = m.group(1)
    return defaults


def healthcheck_argv():
    m = re.search(r"^HEALTHCHECK .*?CMD (\[.*?\])$", DOCKERFILE, re.S | re.M)
    return json.loads(m.group(1))


def run_healthcheck(http_port, by="SHARDGATE_HTTP_ADDR"):
    """The HEALTHCHECK command with the port given as the server would read it: ours, or
    upstream's PORT."""
    env = {k: v for k, v in os.environ.items() if k not in ("SHARDGATE_HTTP_ADDR", "PORT")}
    env.update(env_of_image())
    env[by] = f"0.0.0.0:{http_port}" if by == "SHARDGATE_HTTP_ADDR" else str(http_port)
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
        want = 0 if store_up else 1
        assert run_healthcheck(sg.http_port) == want, sg.proc.log()
        assert run_healthcheck(sg.http_port, by="PORT") == want, sg.proc.log()
    except E2EError as e:
        pytest.fail(str(e))
    finally:
        sg.stop()


def test_healthcheck_fails_when_nothing_listens():
    assert run_healthcheck(free_port()) != 0


def test_the_image_sets_no_variable_that_shadows_upstreams():
    # Ours win over envoyproxy/ratelimit's variables; one set by the image would win over
    # a Deployment's RUNTIME_ROOT, GRPC_PORT, PORT, LOG_LEVEL, REDIS_URL... (issue 48).
    shadowing = [k for k in env_of_image() if k.startswith("SHARDGATE_") or k == "RUST_LOG"]
    assert shadowing == [], shadowing


def test_image_ports_and_paths_agree(shardgate_bin):
    defaults = serve_defaults(shardgate_bin)
    exposed = set(re.search(r"^EXPOSE (.*)$", DOCKERFILE, re.M).group(1).split())
    assert {defaults["--grpc-addr"].rsplit(":", 1)[1],
            defaults["--http-addr"].rsplit(":", 1)[1]} == exposed, defaults
    # The default config lands in the directory the binary reads by default.
    (dest,) = re.findall(r"^COPY config/example\.yaml (\S+)$", DOCKERFILE, re.M)
    assert dest.startswith(defaults["--config"] + "/"), defaults
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


def test_the_image_binary_carries_no_debug_info():
    # The image copies the release build (issue 48: 267 MB with debug info, 44.5 MB
    # without). Checked on the profile, without building: the build the Dockerfile runs
    # is `cargo build --release`, and the release profile keeps no debug info in it.
    import tomllib
    (build,) = re.findall(r"cargo build ([^\n\\]*)", DOCKERFILE)
    assert "--release" in build.split() and "--profile" not in build, build
    profiles = tomllib.loads((REPO / "Cargo.toml").read_text())["profile"]
    release = profiles["release"]
    no_debug = release.get("debug", False) in (False, 0, "none")
    stripped = release.get("strip") in ("debuginfo", "symbols", True)
    split = release.get("split-debuginfo") in ("packed", "unpacked")
    assert no_debug and stripped or split, release
    # The DWARF bench/profile needs is in a profile of its own, not in the image's.
    assert profiles["profiling"]["inherits"] == "release", profiles
