"""Every command in README.md runs as written, in the README's order, as a newcomer would
type it: the set-up's server on its default ports, the first requests against it with the
answers the README shows, `check-config` with its output, and the fleet commands against
DynamoDB Local.

What is not literal, and why:
- `cargo run --release -- ` and `cargo run -q -- ` run the `shardgate` binary the suite
  built (the same code; a release build would take minutes);
- the fleet's commands get DynamoDB Local's endpoint, dummy credentials, a namespace of
  their own and free ports through the environment variables every flag reads; the Redis
  commands a Redis of their own (`scripts/redis-local`, started as the README says) on a
  free port instead of 6379;
- `scripts/test` (it is the suite running this test) and `bench/run` (minutes of load,
  run by hand) are named and not run; a command whose program is not installed
  (`grpcurl`) is reported and not run.

A command the README gains that this test does not know how to run fails the test, so
none is left unchecked by accident.
"""
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

from conftest import REPO, binary, free_port
from dynamodb_local import AWS_LOCAL_ENV

README = REPO / "README.md"
ENDPOINT = os.environ.get("SHARDGATE_TEST_DYNAMODB_ENDPOINT")
NOT_RUN = {
    "scripts/test": "the suite running this test",
    "bench/run": "minutes of load, run by hand (bench/README.md)",
}
READY_S = 60
COMMAND_S = 60


def blocks(text):
    """(info string, body) of every fenced block."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)


def sh_commands(body):
    """The commands of a `sh` block: continuation lines joined, trailing comments cut."""
    out = []
    for line in body.replace("\\\n", " ").splitlines():
        line = re.split(r"\s{2,}#", line)[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def console_steps(body):
    """(command, expected output) pairs of a `console` block."""
    steps = []
    for line in body.splitlines():
        if line.startswith("$ "):
            steps.append([line[2:], []])
        else:
            assert steps, f"console output before any command: {line!r}"
            steps[-1][1].append(line)
    return [(c, "\n".join(o)) for c, o in steps]


def literal(command):
    """The command as this test runs it (see the module comment)."""
    return re.sub(r"\bcargo run (--release|-q) -- ", f"{binary()} ", command)


def port_free(port):
    with socket.socket() as s:
        # As a server binds: connections of an earlier run in TIME_WAIT do not count.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def healthy(http_addr):
    try:
        with urllib.request.urlopen(f"http://{http_addr}/healthcheck", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


class Servers:
    """The `serve` commands started, stopped at the end."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.procs = []

    def start(self, command, env, http_addr):
        log = self.tmp_path / f"serve-{len(self.procs)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(shlex.split(literal(command)), cwd=REPO, env=env,
                                    stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        deadline = time.monotonic() + READY_S
        while not healthy(http_addr):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"`{command}` did not serve on {http_addr}:\n{log.read_text()}")
            time.sleep(0.1)

    def background(self, command, env):
        """A command the README puts in the background (`… &`)."""
        log = self.tmp_path / f"background-{len(self.procs)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(shlex.split(command.rstrip("& ")), cwd=REPO, env=env,
                                    stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc, log

    def stop(self):
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


def run(command, env):
    done = subprocess.run(literal(command), shell=True, cwd=REPO, env=env, timeout=COMMAND_S,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return done.returncode, done.stdout


def test_every_readme_command_runs_as_written(tmp_path):
    if not ENDPOINT:
        pytest.fail("SHARDGATE_TEST_DYNAMODB_ENDPOINT is not set (scripts/test starts "
                    "DynamoDB Local and sets it)")
    if not (port_free(8080) and port_free(8081)):
        pytest.skip("ports 8080 and 8081, the README's defaults, are taken on this machine")
    # `shardgate` on PATH is the binary the suite built.
    path = f"{os.path.dirname(binary())}{os.pathsep}{os.environ.get('PATH', '')}"
    base = {**os.environ, "RUST_LOG": "warn", "PATH": path}
    fleet = {**base, **AWS_LOCAL_ENV, "SHARDGATE_DYNAMODB_ENDPOINT": ENDPOINT,
             "SHARDGATE_NAMESPACE": f"readme-{os.getpid()}",
             "SHARDGATE_GRPC_ADDR": f"127.0.0.1:{free_port()}",
             "SHARDGATE_HTTP_ADDR": f"127.0.0.1:{free_port()}"}
    redis_port = free_port()
    on_redis = {**base, "SHARDGATE_NAMESPACE": f"readme-{os.getpid()}",
                "SHARDGATE_GRPC_ADDR": f"127.0.0.1:{free_port()}",
                "SHARDGATE_HTTP_ADDR": f"127.0.0.1:{free_port()}"}
    servers = Servers(tmp_path)
    ran, skipped, unknown = [], [], []
    try:
        for info, body in blocks(README.read_text()):
            if info == "console":
                for command, expected in console_steps(body):
                    env = fleet if " table " in command or "--store dynamodb" in command else base
                    code, output = run(command, env)
                    assert output.rstrip("\n") == expected, (
                        f"`{command}` (exit {code}) printed:\n{output}\nthe README shows:\n{expected}")
                    ran.append(command)
            elif info == "sh":
                for command in sh_commands(body):
                    program = shlex.split(command)[0]
                    redis = "--store redis" in command or program == "scripts/redis-local"
                    if redis:
                        command = command.replace("6379", str(redis_port))
                    if program == "scripts/redis-local":
                        proc, log = servers.background(command, base)
                        deadline = time.monotonic() + READY_S
                        while "ready" not in log.read_text():
                            if proc.poll() is not None or time.monotonic() > deadline:
                                pytest.fail(f"`{command}` did not start:\n{log.read_text()}")
                            time.sleep(0.1)
                        ran.append(command)
                    elif redis and " serve " in f" {command} ":
                        servers.start(command, on_redis, on_redis["SHARDGATE_HTTP_ADDR"])
                        # A first request, so that `inspect` has a bucket to show.
                        req = urllib.request.Request(
                            f"http://{on_redis['SHARDGATE_HTTP_ADDR']}/json", data=json.dumps(
                                {"domain": "edge", "descriptors": [{"entries": [
                                    {"key": "tenant", "value": "acme"},
                                    {"key": "api_key", "value": "k1"}]}]}).encode())
                        with urllib.request.urlopen(req, timeout=5) as r:
                            assert r.status == 200
                        ran.append(command)
                    elif redis:
                        code, output = run(command, on_redis)
                        assert code == 0, f"`{command}` exited {code}:\n{output}"
                        assert json.loads(output)["shards"][0]["exists"], output
                        ran.append(command)
                    elif program in NOT_RUN:
                        skipped.append(f"{command}: {NOT_RUN[program]}")
                    elif program == "grpcurl" and not shutil.which("grpcurl"):
                        skipped.append(f"{command}: grpcurl is not installed here")
                    elif " serve " in f" {command} ":
                        dynamo = "--store dynamodb" in command
                        env = fleet if dynamo else base
                        servers.start(command, env,
                                      fleet["SHARDGATE_HTTP_ADDR"] if dynamo else "127.0.0.1:8080")
                        ran.append(command)
                    elif program == "shardgate" or program == "grpcurl":
                        env = fleet if program == "shardgate" else base
                        code, output = run(command, env)
                        assert code == 0, f"`{command}` exited {code}:\n{output}"
                        if " inspect " in command:
                            shards = json.loads(output)
                            assert shards["shard_count"] >= 1, output
                        ran.append(command)
                    else:
                        unknown.append(command)
    finally:
        servers.stop()
    assert not unknown, f"README commands this test does not know how to run: {unknown}"
    print(f"\nREADME: {len(ran)} commands ran as written; not run: {skipped}")
    # The set-up's server, the first requests, check-config and the fleet, at least.
    assert len(ran) >= 8, ran
