"""A Redis Cluster of the test's own: three masters and a replica each (Debian's
`redis-server`, nothing persisted), on free loopback ports with their bus ports picked free
too (`--cluster-port`, Redis 7), and a small `cluster-node-timeout` so that a killed master's
replica is promoted within about two seconds. For tests that change the topology —
failovers, a master killed, a slot migrated — which must never touch the shared Cluster
scripts/test starts.

It reads the topology as the servers see it (`CLUSTER NODES` of a live node), kills a node
(SIGKILL) and starts it again (it rejoins as its nodes.conf says), and waits until the
Cluster has settled; `Resp` polls a node without a process a poll. The tests drive the rest
as an operator does (test_redis_cluster_failover.py).
"""
import socket
import subprocess
import time

import pytest

from conftest import EXIT_TIMEOUT_S, free_port

NODE_TIMEOUT_MS = 1000
READY_TIMEOUT_S = 30.0


class Resp:
    """One plain connection to a node, for polling it often without a process a poll
    (`redis-cli` costs a few milliseconds of CPU each): commands in, replies parsed."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=EXIT_TIMEOUT_S)
        self.buf = self.sock.makefile("rb")

    def __call__(self, *args):
        parts = [f"*{len(args)}\r\n".encode()]
        for a in map(str, args):
            parts.append(f"${len(a.encode())}\r\n{a}\r\n".encode())
        self.sock.sendall(b"".join(parts))
        return self._reply()

    def _reply(self):
        line = self.buf.readline().rstrip(b"\r\n")
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.buf.read(n + 2)[:-2].decode()
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        raise RuntimeError(f"an unknown reply {line!r}")

    def close(self):
        self.buf.close()
        self.sock.close()


class Node:
    """One `redis-server` of the Cluster."""

    def __init__(self, base, index):
        self.port = free_port()
        self.bus = free_port()
        self.dir = base / f"node-{index}-{self.port}"
        self.dir.mkdir()
        self.proc = None
        self.start()

    def start(self):
        """Starts it (again, after `kill`: its nodes.conf makes it rejoin as it was)."""
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--cluster-port", str(self.bus),
             "--bind", "127.0.0.1", "--dir", str(self.dir), "--save", "", "--appendonly", "no",
             "--logfile", str(self.dir / "redis.log"), "--cluster-enabled", "yes",
             "--cluster-config-file", "nodes.conf",
             "--cluster-node-timeout", str(NODE_TIMEOUT_MS)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self.cli("PING", check=False) != "PONG":
            if time.monotonic() > deadline or self.proc.poll() is not None:
                pytest.fail(f"redis-server on port {self.port} did not answer")
            time.sleep(0.02)

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"

    @property
    def url(self):
        return f"redis://{self.addr}"

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def cli(self, *args, check=True, timeout=EXIT_TIMEOUT_S):
        """One `redis-cli` command's output, stripped (None when it failed and not
        `check`)."""
        done = subprocess.run(["redis-cli", "-p", str(self.port), *map(str, args)],
                              capture_output=True, text=True, timeout=timeout)
        out = done.stdout.strip()
        failed = done.returncode != 0 or out.startswith(("ERR", "(error)"))
        if failed and check:
            raise AssertionError(f"redis-cli -p {self.port} {args}: {out} {done.stderr}")
        return None if failed else out

    def info(self, section):
        """`INFO section` as a dict of its fields."""
        text = self.cli("INFO", section)
        return dict(l.split(":", 1) for l in text.splitlines() if ":" in l)

    def kill(self):
        """SIGKILL: nothing saved, connections reset, no goodbye to the Cluster."""
        self.proc.kill()
        self.proc.wait(timeout=EXIT_TIMEOUT_S)

    def stop(self):
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class LocalCluster:
    """Three masters, each with one replica."""

    def __init__(self, base):
        self.nodes = [Node(base, i) for i in range(6)]
        create = subprocess.run(
            ["redis-cli", "--cluster", "create", *(n.addr for n in self.nodes),
             "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True, text=True, timeout=60)
        assert create.returncode == 0, create.stdout + create.stderr
        self.wait_healthy()

    def live(self):
        return [n for n in self.nodes if n.alive()]

    def by_addr(self, addr):
        return next(n for n in self.nodes if n.addr == addr)

    def topology(self):
        """As a live node sees it: {addr: (id, role, master id or None, [slot ranges])}
        of every node not marked failed."""
        out = {}
        for line in self.live()[0].cli("CLUSTER", "NODES").splitlines():
            f = line.split()
            if "fail" in f[2] or "noaddr" in f[2]:
                continue
            role = "master" if "master" in f[2] else "replica"
            out[f[1].split("@")[0]] = (f[0], role, None if f[3] == "-" else f[3], f[8:])
        return out

    def masters(self):
        """The live masters that serve slots, by address."""
        return [self.by_addr(a) for a, (_, role, _, slots) in self.topology().items()
                if role == "master" and slots and self.by_addr(a).alive()]

    def node_id(self, node):
        return node.cli("CLUSTER", "MYID")

    def master_of_slot(self, slot):
        for addr, (_, role, _, slots) in self.topology().items():
            if role != "master":
                continue
            for r in slots:
                if r.startswith("["):
                    continue  # a slot being migrated or imported, listed apart
                lo, _, hi = r.partition("-")
                if int(lo) <= slot <= int(hi or lo):
                    return self.by_addr(addr)
        raise AssertionError(f"no master serves slot {slot}")

    def replica_of(self, master):
        mid = self.node_id(master)
        for addr, (_, role, of, _) in self.topology().items():
            if role == "replica" and of == mid and self.by_addr(addr).alive():
                return self.by_addr(addr)
        raise AssertionError(f"{master.addr} has no live replica")

    def keyslot(self, key):
        return int(self.live()[0].cli("CLUSTER", "KEYSLOT", key))

    def wait_healthy(self, timeout=READY_TIMEOUT_S):
        """Until every live node says cluster_state:ok, agrees on the masters, and every
        live replica's link to its master is up."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self._healthy():
                    return
            except (AssertionError, subprocess.TimeoutExpired, ValueError):
                pass
            if time.monotonic() > deadline:
                pytest.fail("the test's Redis Cluster did not settle:\n"
                            + "\n".join(f"{n.addr}: {n.cli('CLUSTER', 'NODES', check=False)}"
                                        for n in self.live()))
            time.sleep(0.1)

    def _healthy(self):
        views = set()
        for n in self.live():
            if "cluster_state:ok" not in n.cli("CLUSTER", "INFO"):
                return False
            lines = n.cli("CLUSTER", "NODES").splitlines()
            views.add(frozenset(l.split()[1].split("@")[0] for l in lines
                                if "master" in l.split()[2] and "fail" not in l.split()[2]))
            rep = n.info("replication")
            if rep.get("role") == "slave" and rep.get("master_link_status") != "up":
                return False
        return len(views) == 1

    def stop(self):
        for n in self.nodes:
            n.stop()
