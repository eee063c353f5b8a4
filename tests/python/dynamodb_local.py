"""DynamoDB Local as a process of its own, for tests that stop, kill, restart or start it
cold: `scripts/dynamodb-local` on a free loopback port (the script installs the emulator
on first use and execs java, so `pid` is the JVM's: it can be stopped and killed
directly), and `shardgate table create` against it.
"""
import os
import signal
import socket
import subprocess
import time

import pytest

from conftest import REPO, binary, free_port

DDB_START_TIMEOUT_S = float(os.environ.get("SHARDGATE_DDB_START_TIMEOUT", "180"))

# Dummy credentials for a loopback emulator; nothing is looked up elsewhere.
AWS_LOCAL_ENV = {
    "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local", "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": "/nonexistent",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
}


def listening(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


class DynamoLocal:
    """`scripts/dynamodb-local` on a port of its own, with `table` created on demand."""

    def __init__(self, workdir, table):
        self.workdir = workdir
        self.table = table
        self.port = free_port()
        self.proc = None
        self.starts = 0

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        """Starts it (again, on the same port) and returns without waiting."""
        self.starts += 1
        self.log_path = self.workdir / f"dynamodb-local-{self.starts}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [str(REPO / "scripts" / "dynamodb-local")],
                env={**os.environ, "SHARDGATE_DDB_PORT": str(self.port)},
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_listening(self, timeout=DDB_START_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"DynamoDB Local exited with {self.proc.returncode}:\n{self.log()}")
            if listening(self.port):
                return
            time.sleep(0.05)
        pytest.fail(f"DynamoDB Local not listening on {self.port} within {timeout}s:\n{self.log()}")

    def create_table(self, timeout=30.0):
        """`shardgate table create`, directly (not through the proxy), retried while the
        emulator warms up."""
        deadline = time.monotonic() + timeout
        while True:
            r = subprocess.run(
                [binary(), "table", "create", "--table", self.table, "--dynamodb-endpoint", self.endpoint],
                env={**os.environ, **AWS_LOCAL_ENV}, capture_output=True, text=True, timeout=60,
            )
            if r.returncode == 0:
                return r.stdout.strip()
            if time.monotonic() > deadline:
                pytest.fail(f"table create failed: {r.stdout}{r.stderr}")
            time.sleep(0.5)

    def signal(self, sig):
        os.kill(self.proc.pid, sig)

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)

    def log(self):
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""


