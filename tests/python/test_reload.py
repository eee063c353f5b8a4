"""Hot reload of `--config` (issue 5): a config change applies without a restart, never
half-applies, and a bad one keeps the previous config in force.

The acceptance test rewrites the config 200 times (a third of them invalid) with in-place
writes, atomic renames (`tmp → limits.yaml`) and Kubernetes ConfigMap symlink swaps
(`..<timestamp>/limits.yaml`, `..data → ..<timestamp>`, `limits.yaml → ..data/limits.yaml`,
`..data` replaced atomically through a temporary symlink and a rename), while a client
thread sends requests without pause. Every valid file carries its own
`requests_per_unit`, so the value the server reports in `current_limit` says which file
is in force; every invalid file carries one too, so a half-applied bad file would show.
"""
import itertools
import os
import random
import shutil
import threading
import time

import grpc
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT

APPLY_WITHIN_S = 1.0  # the bound for a valid write to be served
ERROR_COUNTED_WITHIN_S = 1.0
CLIENT_MAX_S = 120.0  # the client thread stops by itself after this, whatever happens


def request(domain, *entries, hits=None):
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if hits is not None:
        d.hits_addend.value = hits
    return rls_pb2.RateLimitRequest(domain=domain, descriptors=[d])


# ----------------------------------------------------------------------------------------
# Config files

def valid(rpu):
    # A per-second limit far above what one client thread sends: never over limit.
    return (
        "domain: edge\n"
        "descriptors:\n"
        "  - key: tenant\n"
        f"    rate_limit: {{unit: second, requests_per_unit: {rpu}, name: tenant_rps}}\n"
    )


# Each is rejected for a different reason, so two invalid files in a row give two
# different error texts (the watcher reports a failure identical to the last one once).
INVALID = [
    lambda rpu: valid(rpu).replace("name: tenant_rps}", "name: tenant_rps, colour: blue}"),
    lambda rpu: valid(rpu).replace("}\n", "\n"),  # YAML syntax: unclosed flow mapping
    lambda rpu: valid(rpu).replace("unit: second", "unit: fortnight"),
    lambda rpu: valid(rpu).replace(f"requests_per_unit: {rpu}", f"requests_per_unit: {rpu}.5"),
    lambda rpu: valid(rpu) + valid(rpu).split("descriptors:\n", 1)[1],  # duplicate key
    lambda rpu: valid(rpu).replace("domain: edge", "domain: ''"),
]


class ConfigDir:
    """`dir/limits.yaml`, rewritten three ways. The ConfigMap layout is what the kubelet
    builds: the data in a timestamped hidden directory, `..data` pointing at it, and
    `limits.yaml` a symlink through `..data`; an update writes a new timestamped directory,
    swaps `..data` with a rename, and removes the old directory."""

    def __init__(self, path):
        self.dir = path
        self.dir.mkdir()
        self.file = path / "limits.yaml"
        self.generation = itertools.count()

    def is_configmap(self):
        return self.file.is_symlink()

    def write_in_place(self, text):
        assert not self.file.is_symlink(), "in place means the file itself"
        with open(self.file, "w") as f:  # truncate and write the same inode
            f.write(text)

    def rename_over(self, text):
        tmp = self.dir / "limits.yaml.tmp"  # not *.yaml: never loaded from a directory
        tmp.write_text(text)
        os.replace(tmp, self.file)

    def configmap_swap(self, text):
        n = next(self.generation)
        ts = self.dir / f"..2026_11_29_23_59_{n:04d}.{random.randrange(10**9)}"
        ts.mkdir()
        (ts / "limits.yaml").write_text(text)
        tmp = self.dir / "..data_tmp"
        os.symlink(ts.name, tmp)
        os.replace(tmp, self.dir / "..data")  # renames the link itself: atomic
        if not self.file.is_symlink():
            link = self.dir / "limits.yaml.link"
            os.symlink("..data/limits.yaml", link)
            os.replace(link, self.file)
        for old in self.dir.glob("..2026_*"):
            if old.name != ts.name:
                shutil.rmtree(old)

    def write(self, mode, text):
        {"in-place": self.write_in_place, "rename": self.rename_over,
         "configmap": self.configmap_swap}[mode](text)


# ----------------------------------------------------------------------------------------
# A client that never pauses

class Client(threading.Thread):
    """Sends `request("edge", tenant=acme)` back to back on its own channel and records
    every answer's `current_limit.requests_per_unit`: the latest one with the time its
    request was sent, the sequence of distinct values, and every failed RPC."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.port = port
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.latest = (0.0, None)
        self.transitions = []  # [(sent, value)] each time the value changes
        self.failures = []  # [(sent, code, details)]
        self.answers = 0

    def run(self):
        req = request("edge", ("tenant", "acme"))
        deadline = time.monotonic() + CLIENT_MAX_S
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            while not self.stop.is_set() and time.monotonic() < deadline:
                sent = time.monotonic()
                try:
                    r = stub.ShouldRateLimit(req, timeout=5.0)
                except grpc.RpcError as e:
                    with self.lock:
                        self.failures.append((sent, e.code(), e.details()))
                    continue
                value = r.statuses[0].current_limit.requests_per_unit
                with self.lock:
                    self.answers += 1
                    self.latest = (sent, value)
                    if not self.transitions or self.transitions[-1][1] != value:
                        self.transitions.append((sent, value))

    def served_since(self, t0):
        """The value of the latest answer to a request sent after `t0`, else None."""
        with self.lock:
            sent, value = self.latest
        return value if sent >= t0 else None

    def finish(self):
        self.stop.set()
        self.join(timeout=10)
        assert not self.is_alive(), "client thread did not stop"


def wait_served(client, t0, rpu):
    """Seconds from `t0` until the client was answered with `rpu`; None after 1 s."""
    while time.monotonic() < t0 + APPLY_WITHIN_S:
        if client.served_since(t0) == rpu:
            return time.monotonic() - t0
        time.sleep(0.002)
    return None


def load_errors(server):
    return server.metrics().value("shardgate_config_load_error_total")


def wait_load_errors(server, expected, t0):
    """Polls /metrics until `config_load_error_total` reaches `expected`; the last value."""
    seen = None
    while time.monotonic() < t0 + ERROR_COUNTED_WITHIN_S:
        seen = load_errors(server)
        if seen >= expected:
            return seen
        time.sleep(0.01)
    return seen


def rlconfig_hash(server):
    status, _, text = server.http("GET", "/rlconfig")
    assert status == 200, text
    first = text.splitlines()[0]
    assert first.startswith("config hash: "), text
    return first.removeprefix("config hash: ").strip()


# ----------------------------------------------------------------------------------------
# The acceptance test

def churn(shardgate, tmp_path, writes, serve_directory, seed):
    """Rewrites the config `writes` times under load and checks every step; returns
    (client, number of valid writes, number of invalid writes, server)."""
    rng = random.Random(seed)
    cfg = ConfigDir(tmp_path / "cfg")
    initial = 99_999
    cfg.write_in_place(valid(initial))
    server = shardgate(config=cfg.dir if serve_directory else cfg.file)
    assert load_errors(server) == 0
    assert server.metrics().value("shardgate_config_load_success_total") == 1

    invalid_at = set(rng.sample(range(1, writes), writes // 3))  # the first write is valid
    client = Client(server.port)
    client.start()
    problems = []  # (write index, mode, what went wrong)
    expected_values = [initial]
    modes_used = {"in-place": 0, "rename": 0, "configmap": 0}
    n_invalid = 0
    variant = itertools.cycle(range(len(INVALID)))
    lags = []
    try:
        t_start = time.monotonic()
        for i in range(writes):
            if len(problems) >= 5:
                break  # enough to diagnose; keeps a broken server from taking minutes
            rpu = 100_000 + i
            modes = ["rename", "configmap"] + ([] if cfg.is_configmap() else ["in-place"])
            mode = rng.choice(modes)
            modes_used[mode] += 1
            if i in invalid_at:
                n_invalid += 1
                t0 = time.monotonic()
                cfg.write(mode, INVALID[next(variant)](rpu))
                seen = wait_load_errors(server, n_invalid, t0)
                if seen != n_invalid:
                    problems.append((i, mode, f"invalid write: config_load_error_total {seen}, expected {n_invalid} within {ERROR_COUNTED_WITHIN_S}s"))
                    n_invalid = seen  # resynchronise, so one miss is reported once
                # The previous config is still the one served, after the rejection.
                t1 = time.monotonic()
                still = None
                while still is None and time.monotonic() < t1 + APPLY_WITHIN_S:
                    still = client.served_since(t1)
                    time.sleep(0.002)
                if still != expected_values[-1]:
                    problems.append((i, mode, f"after an invalid write served {still}, expected {expected_values[-1]}"))
            else:
                t0 = time.monotonic()
                cfg.write(mode, valid(rpu))
                lag = wait_served(client, t0, rpu)
                expected_values.append(rpu)
                if lag is None:
                    problems.append((i, mode, f"valid write of {rpu} not served within {APPLY_WITHIN_S}s (serving {client.served_since(0)})"))
                else:
                    lags.append(lag)
            time.sleep(rng.uniform(0.0, 0.03))
        elapsed = time.monotonic() - t_start
    finally:
        client.finish()

    assert not problems, f"{len(problems)} problems, first: " + "\n".join(map(str, problems))
    assert all(modes_used.values()), modes_used
    assert client.failures == [], f"{len(client.failures)} failed RPCs, first {client.failures[:3]}"
    # Never half-applied, never back to an older file: the values the client saw are the
    # valid files' values, each once, in the order they were written.
    seen_values = [v for _, v in client.transitions]
    assert seen_values == expected_values, (
        f"served sequence differs from the written one; "
        f"unexpected: {sorted(set(seen_values) - set(expected_values))[:10]}"
    )
    n_valid = len(expected_values) - 1
    assert (n_valid, n_invalid) == (writes - writes // 3, writes // 3)

    metrics = server.metrics()
    assert metrics.value("shardgate_config_load_success_total") == 1 + n_valid
    assert metrics.value("shardgate_config_load_error_total") == n_invalid
    assert metrics.type_of("shardgate_config_load_error") == "counter"
    info = metrics.series("shardgate_config_info")
    assert info == [({"hash": rlconfig_hash(server)}, 1.0)], info
    print(f"\n{writes} writes ({modes_used}) in {elapsed:.1f}s; {client.answers} answers; "
          f"apply lag median {sorted(lags)[len(lags) // 2] * 1000:.0f} ms, max {max(lags) * 1000:.0f} ms")
    return server, n_valid, n_invalid


def test_200_rewrites_under_load_apply_each_valid_file_within_a_second_and_no_rpc_fails(
    shardgate, tmp_path
):
    server, n_valid, n_invalid = churn(shardgate, tmp_path, 200, serve_directory=False, seed=5)
    # One log line per load and per rejection, naming the file.
    log = server.log()
    assert log.count("config reloaded") == n_valid, log[-2000:]
    assert log.count("config reload rejected") == n_invalid, log[-2000:]


def test_rewrites_of_a_config_directory_apply_the_same_way(shardgate, tmp_path):
    churn(shardgate, tmp_path, 45, serve_directory=True, seed=6)


# ----------------------------------------------------------------------------------------
# Smaller reload properties

FIVE_PER_MINUTE = """\
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5, name: user_rpm}
"""

BROKEN = """\
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 50, name: user_rpm, colour: blue}
"""


def call(server, user="alice", hits=None):
    r = server.should_rate_limit(request("api", ("user", user), hits=hits))
    (s,) = r.statuses
    return r.overall_code, s.current_limit.requests_per_unit, s.limit_remaining


def wait_success_count(server, expected):
    deadline = time.monotonic() + APPLY_WITHIN_S
    seen = None
    while time.monotonic() < deadline:
        seen = server.metrics().value("shardgate_config_load_success_total")
        if seen >= expected:
            break
        time.sleep(0.01)
    assert seen == expected, f"config_load_success_total {seen}, expected {expected}"


def test_an_invalid_reload_keeps_the_previous_config_and_is_logged_with_file_and_line(
    shardgate, tmp_path
):
    config = tmp_path / "limits.yaml"
    config.write_text(FIVE_PER_MINUTE)
    server = shardgate(config=config)
    hash_before = rlconfig_hash(server)
    assert call(server) == (OK, 5, 4)
    assert call(server) == (OK, 5, 3)

    t0 = time.monotonic()
    config.write_text(BROKEN)
    assert wait_load_errors(server, 1, t0) == 1
    # Still the old rule (5/min, the same bucket), not the broken file's 50.
    assert call(server) == (OK, 5, 2)
    assert call(server) == (OK, 5, 1)
    assert call(server) == (OK, 5, 0)
    assert call(server)[:2] == (OVER_LIMIT, 5)
    metrics = server.metrics()
    assert metrics.value("shardgate_config_load_success_total") == 1
    assert metrics.series("shardgate_config_info") == [({"hash": hash_before}, 1.0)]
    assert rlconfig_hash(server) == hash_before
    log = server.log()
    assert "config reload rejected" in log, log
    assert f"{config}:4" in log and "colour" in log, log

    # Fixing the file applies it.
    config.write_text(FIVE_PER_MINUTE.replace("user_rpm", "user_rpm2"))
    wait_success_count(server, 2)
    assert rlconfig_hash(server) != hash_before


def test_buckets_survive_a_reload_that_keeps_their_limit(shardgate, tmp_path):
    config = tmp_path / "limits.yaml"
    config.write_text(FIVE_PER_MINUTE)
    server = shardgate(config=config)
    for remaining in (4, 3, 2):
        assert call(server) == (OK, 5, remaining)
    hash_before = rlconfig_hash(server)

    # Another rule added, this one unchanged: a new config, the same bucket.
    config.write_text(FIVE_PER_MINUTE + "  - key: other\n    rate_limit: {unit: hour, requests_per_unit: 9}\n")
    wait_success_count(server, 2)
    assert rlconfig_hash(server) != hash_before
    assert call(server) == (OK, 5, 1), "tokens taken before the reload are still taken"
    assert call(server) == (OK, 5, 0)
    assert call(server)[:2] == (OVER_LIMIT, 5)
    assert call(server, user="bob") == (OK, 5, 4)


def test_a_changed_limit_reaches_existing_buckets(shardgate, tmp_path):
    """docs/architecture.md, "Buckets and items": the changed limit's parameters are rewritten in the bucket and
    its balance is clamped to the new capacity; consumed tokens stay consumed."""
    config = tmp_path / "limits.yaml"
    config.write_text(FIVE_PER_MINUTE.replace("requests_per_unit: 5", "requests_per_unit: 10"))
    server = shardgate(config=config)
    assert call(server) == (OK, 10, 9)
    assert call(server) == (OK, 10, 8)
    assert call(server, user="bob") == (OK, 10, 9)
    for _ in range(7):
        call(server, user="bob")
    assert call(server, user="bob", hits=0) == (OK, 10, 2)

    # Lowered to 3: alice's 8 tokens are clamped to 3, then one is taken.
    config.write_text(FIVE_PER_MINUTE.replace("requests_per_unit: 5", "requests_per_unit: 3"))
    wait_success_count(server, 2)
    assert call(server) == (OK, 3, 2)
    # bob had 2 left: still 2 (not refilled to the new capacity), then one is taken.
    assert call(server, user="bob") == (OK, 3, 1)

    # Raised to 100: the balance stays where it was (refilling at the new rate), it does
    # not jump to the new capacity.
    config.write_text(FIVE_PER_MINUTE.replace("requests_per_unit: 5", "requests_per_unit: 100"))
    wait_success_count(server, 3)
    code, rpu, remaining = call(server)
    assert (code, rpu) == (OK, 100)
    assert 1 <= remaining <= 3, remaining


def test_a_burst_of_writes_is_debounced_into_one_load_of_the_last_file(shardgate, tmp_path):
    config = tmp_path / "limits.yaml"
    config.write_text(valid(1000))
    server = shardgate(config=config)
    for rpu in range(1001, 1011):  # ten writes, 5 ms apart: well inside the 100 ms quiet time
        config.write_text(valid(rpu))
        time.sleep(0.005)
    deadline = time.monotonic() + APPLY_WITHIN_S
    while time.monotonic() < deadline:
        r = server.should_rate_limit(request("edge", ("tenant", "acme")))
        if r.statuses[0].current_limit.requests_per_unit == 1010:
            break
        time.sleep(0.01)
    assert r.statuses[0].current_limit.requests_per_unit == 1010
    time.sleep(0.3)
    loads = server.metrics().value("shardgate_config_load_success_total") - 1
    # One load; two if the scheduler stalled the writer past the quiet time once.
    assert 1 <= loads <= 2, f"{loads} loads for a burst of 10 writes"


def test_new_and_deleted_files_in_a_config_directory(shardgate, tmp_path):
    d = tmp_path / "conf.d"
    d.mkdir()
    (d / "api.yaml").write_text(FIVE_PER_MINUTE)
    server = shardgate(config=d)
    assert call(server) == (OK, 5, 4)

    def served_limit(domain, key):
        r = server.should_rate_limit(request(domain, (key, "x")))
        s = r.statuses[0]
        return s.current_limit.requests_per_unit if s.HasField("current_limit") else None

    def eventually(what, expected):
        deadline = time.monotonic() + APPLY_WITHIN_S
        while time.monotonic() < deadline:
            got = what()
            if got == expected:
                return
            time.sleep(0.01)
        assert got == expected

    # A new file adds its domain.
    assert served_limit("edge", "tenant") is None
    (d / "edge.yml").write_text(valid(777))
    eventually(lambda: served_limit("edge", "tenant"), 777)
    # A second file for a domain already defined: rejected, both domains stay.
    (d / "dup.yaml").write_text(valid(888))
    assert wait_load_errors(server, 1, time.monotonic()) == 1
    assert served_limit("edge", "tenant") == 777
    assert "duplicate domain 'edge'" in server.log()
    (d / "dup.yaml").unlink()
    # A deleted file takes its domain away (unknown domain: OK without a limit).
    (d / "edge.yml").unlink()
    eventually(lambda: served_limit("edge", "tenant"), None)
    assert call(server) == (OK, 5, 3), "the other domain and its bucket are untouched"
    # Files that are not YAML are ignored.
    (d / "README.txt").write_text("not: [yaml")
    time.sleep(0.3)
    assert server.metrics().value("shardgate_config_load_error_total") == 1


# ----------------------------------------------------------------------------------------
# A `--config` file that is a symlink to a file in another directory


def symlinked_config(tmp_path, rpu):
    real = tmp_path / "srv"
    real.mkdir()
    (real / "limits.yaml").write_text(valid(rpu))
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "limits.yaml").symlink_to(real / "limits.yaml")
    return real / "limits.yaml", etc


def served_rpu(server):
    r = server.should_rate_limit(request("edge", ("tenant", "acme")))
    return r.statuses[0].current_limit.requests_per_unit


def edit_target_right_after_an_event(etc, target, rpu):
    """An event in the watched directory (here: an unrelated file) makes the watcher load
    and re-arm its 2 s poll; the in-place edit of the symlink's target follows."""
    (etc / "notes.txt").write_text(str(rpu))
    time.sleep(0.3)
    target.write_text(valid(rpu))
    return time.monotonic()


def test_in_place_edit_of_a_symlinked_config_target_is_applied_by_the_poll(shardgate, tmp_path):
    target, etc = symlinked_config(tmp_path, 1000)
    server = shardgate(config=etc / "limits.yaml")
    t0 = edit_target_right_after_an_event(etc, target, 1001)
    deadline = t0 + 3.0  # the 2 s safety poll, plus the quiet time
    while served_rpu(server) != 1001 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert served_rpu(server) == 1001


def test_in_place_edit_of_a_symlinked_config_target_is_applied_within_a_second(shardgate, tmp_path):
    target, etc = symlinked_config(tmp_path, 1000)
    server = shardgate(config=etc / "limits.yaml")
    t0 = edit_target_right_after_an_event(etc, target, 1001)
    while served_rpu(server) != 1001 and time.monotonic() < t0 + 3.0:
        time.sleep(0.02)
    lag = time.monotonic() - t0
    assert lag < APPLY_WITHIN_S, f"applied after {lag:.2f}s"
