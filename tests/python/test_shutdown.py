"""Graceful shutdown (issue 5): on SIGTERM (or SIGINT) the server stops accepting, lets
the calls in flight finish within `--shutdown-grace`, and exits 0.

What "accepted" means here, precisely: a call is accepted once the server's handler has
started on it. A call the server refuses before that — a connection to a closed listener
(connection refused), or an HTTP/2 stream opened after the server's GOAWAY (refused, safe
to retry) — fails on the client with UNAVAILABLE, and is allowed to. Any other failure, or
an accepted call without its answer, is a bug. Two ways to see from outside which calls
the handler started:

- memory store, one bucket of a million tokens that never refills: every accepted call
  takes exactly one token and is told the balance after its own debit, so the balances
  the clients received must be 999999, 999998, … with no hole. A hole is a call that took
  a token and whose answer was lost. (The newest debits cannot be checked this way: the
  store is gone with the process.)
- a stand-in DynamoDB endpoint on loopback, every call with its own bucket: the first
  thing the handler does is one `UpdateItem` for that bucket, so the set of buckets the
  stand-in saw is exactly the set of accepted calls, and every one of them must have been
  answered. Holding each `UpdateItem` for a while makes sure calls are in flight when the
  signal arrives; the server's own `requests_in_flight` gauge confirms it.
"""
import collections
import signal
import threading
import time

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from fake_dynamodb import FakeDynamo
from test_independent_client import desc, request

OK = rls_pb2.RateLimitResponse.OK
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE

GRACE_S = 5
CALL_TIMEOUT_S = 10.0
LOAD_MAX_S = 30.0  # every load thread stops by itself after this

MILLION = """
domain: s
descriptors:
  - key: k
    rate_limit: {unit: year, requests_per_unit: 1, burst: 1000000}
"""


# ----------------------------------------------------------------------------------------
# Load: client threads that keep a window of calls outstanding


class Call:
    __slots__ = ("ident", "sent", "done", "response", "code", "details")

    def __init__(self, ident, sent):
        self.ident, self.sent = ident, sent
        self.done = self.response = self.code = self.details = None


class Load:
    """`threads` client threads, each with its own channel and `window` calls outstanding
    at all times (HTTP/2 streams on one connection), until stopped. `make(ident)` builds
    the request of call number `ident`."""

    def __init__(self, port, make, threads=6, window=16):
        self.port, self.make, self.window = port, make, window
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.calls = []
        self.next_ident = 0
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def _ident(self):
        with self.lock:
            self.next_ident += 1
            return self.next_ident

    def _run(self):
        deadline = time.monotonic() + LOAD_MAX_S
        channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        outstanding = collections.deque()
        try:
            while not self.stop.is_set() and time.monotonic() < deadline:
                while len(outstanding) < self.window:
                    call = Call(self._ident(), time.monotonic())
                    future = stub.ShouldRateLimit.future(self.make(call.ident), timeout=CALL_TIMEOUT_S)
                    future.add_done_callback(lambda f, c=call: self._done(c, f))
                    outstanding.append((call, future))
                    with self.lock:
                        self.calls.append(call)
                _, oldest = outstanding.popleft()
                try:
                    oldest.result(timeout=CALL_TIMEOUT_S + 1)
                except grpc.RpcError:
                    pass
                except grpc.FutureTimeoutError:
                    pass  # recorded as unfinished below
            for _, f in outstanding:  # let the last ones finish (or fail)
                try:
                    f.result(timeout=CALL_TIMEOUT_S + 1)
                except (grpc.RpcError, grpc.FutureTimeoutError):
                    pass
        finally:
            channel.close()

    @staticmethod
    def _done(call, future):
        call.done = time.monotonic()
        e = future.exception()
        if e is None:
            call.response = future.result()
        else:
            call.code, call.details = e.code(), e.details()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=CALL_TIMEOUT_S + 5)
        assert not any(t.is_alive() for t in self.threads), "load threads did not stop"
        with self.lock:
            return list(self.calls)


def answered(calls):
    return [c for c in calls if c.response is not None]


def describe_failures(calls):
    return collections.Counter((c.code, c.details) for c in calls if c.code is not None)


def sigterm_and_wait(server, sig=signal.SIGTERM, timeout=GRACE_S + 5):
    """Sends `sig`; returns (time sent, seconds until the process exited, exit code)."""
    t_sig = time.monotonic()
    server.proc.send_signal(sig)
    code = server.proc.wait(timeout=timeout)
    return t_sig, time.monotonic() - t_sig, code


def test_sigterm_under_load_answers_every_accepted_call_and_exits_0(shardgate):
    server = shardgate(MILLION, args=["--shutdown-grace", f"{GRACE_S}s"])
    load = Load(server.port, lambda ident: request("s", desc(("k", "one")))).start()
    try:
        deadline = time.monotonic() + 10
        while len(answered(load.calls)) < 500 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(answered(load.calls)) >= 500, "the load did not get going"
        t_sig, took, code = sigterm_and_wait(server)
        time.sleep(0.3)  # clients keep knocking at a closed door for a moment
    finally:
        calls = load.finish()

    assert code == 0, server.log()[-3000:]
    assert took < GRACE_S, f"exited {took:.2f}s after the signal"
    unfinished = [c for c in calls if c.done is None]
    assert unfinished == [], f"{len(unfinished)} calls never finished"
    failed = [c for c in calls if c.code is not None]
    # Before the signal nothing fails; after it only refusals (never accepted) fail.
    early = [c for c in failed if c.done < t_sig]
    assert early == [], describe_failures(early)
    assert all(c.code == UNAVAILABLE for c in failed), describe_failures(failed)
    # Every token taken was reported to its caller: balances 999999 … with no hole.
    ok = answered(calls)
    taken = sorted(1_000_000 - c.response.statuses[0].limit_remaining for c in ok)
    assert taken == list(range(1, len(ok) + 1)), (
        f"{len(ok)} answers; holes at {sorted(set(range(1, taken[-1] + 1)) - set(taken))[:20]}")
    in_flight_at_signal = [c for c in ok if c.sent < t_sig < c.done]
    assert in_flight_at_signal, "no call was answered across the signal"
    assert "every call in flight finished" in server.log()
    print(f"\n{len(calls)} calls: {len(ok)} answered ({len(in_flight_at_signal)} across the "
          f"signal), {len(failed)} refused {dict(describe_failures(failed))}; exit after {took:.2f}s")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_after_exit_a_new_server_starts_on_the_same_ports(shardgate, sig):
    first = shardgate(MILLION)
    assert first.should_rate_limit(request("s", desc(("k", "x")))).overall_code == OK
    assert first.http("GET", "/healthcheck")[0] == 200
    _, took, code = sigterm_and_wait(first, sig)
    assert code == 0 and took < GRACE_S, (code, took)
    first.channel.close()

    second = shardgate(MILLION, grpc_port=first.port, http_port=first.http_port)
    r = second.should_rate_limit(request("s", desc(("k", "x"))))
    assert (r.overall_code, r.statuses[0].limit_remaining) == (OK, 999_999), "a new process, new buckets"
    assert second.http("GET", "/healthcheck")[0] == 200


# ----------------------------------------------------------------------------------------
# Calls held in the store when the signal arrives


PER_CALL_BUCKETS = MILLION.replace("domain: s", "domain: s\nfailure_mode: deny")


def dynamo_server(shardgate, fake, grace, store_timeout="30s"):
    options = fake.serve_options(store_timeout)
    options["args"] += ["--shutdown-grace", grace]
    return shardgate(PER_CALL_BUCKETS, **options)


def issue(server, idents):
    """Starts one call per ident on the server's channel; returns {ident: future}."""
    return {i: server.rls.ShouldRateLimit.future(request("s", desc(("k", str(i)))), timeout=CALL_TIMEOUT_S)
            for i in idents}


def outcome(future):
    try:
        return future.result(timeout=CALL_TIMEOUT_S + 1)
    except grpc.RpcError as e:
        return e.code()


def wait_seen(fake, n, within=5.0):
    deadline = time.monotonic() + within
    while fake.seen_count() < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fake.seen_count() >= n, f"the store saw {fake.seen_count()} of {n} calls"


def test_calls_in_flight_at_sigterm_are_answered_before_exit(shardgate):
    # The held calls are released by the test, a second after the signal, so none can be
    # answered before it however slow the machine is; `hold` is only a cap below the grace.
    hold = GRACE_S - 1.0
    release_after_s = 1.0
    with FakeDynamo(hold) as fake:
        server = dynamo_server(shardgate, fake, f"{GRACE_S}s")
        # A warm-up call, not held, so the connections are up.
        fake.release.set()
        r = server.should_rate_limit(request("s", desc(("k", "0"))))
        assert r.overall_code == OK, r
        fake.release = threading.Event()

        n = 40
        held = issue(server, range(1, n + 1))
        wait_seen(fake, n + 1)
        m = server.metrics()
        assert m.value("shardgate_requests_in_flight") == n, "all held in the store"
        t_sig = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        # After the signal: a new connection is refused, a new call is not accepted.
        late_channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        late = {}
        try:
            late_stub = rls_pb2_grpc.RateLimitServiceStub(late_channel)
            late = {i: late_stub.ShouldRateLimit.future(request("s", desc(("k", str(i)))), timeout=CALL_TIMEOUT_S)
                    for i in range(1001, 1011)}
            late.update(issue(server, range(2001, 2011)))
            time.sleep(max(0.0, t_sig + release_after_s - time.monotonic()))
            t_release = time.monotonic()
            fake.release.set()
            outcomes = {i: outcome(f) for i, f in {**held, **late}.items()}
        finally:
            late_channel.close()
        code = server.proc.wait(timeout=GRACE_S + 5)
        took = time.monotonic() - t_sig

    assert code == 0, server.log()[-3000:]
    # The held calls were in flight across the signal and all got their answers.
    not_ok = {i: o for i, o in outcomes.items() if i in held and not isinstance(o, rls_pb2.RateLimitResponse)}
    assert not_ok == {}, not_ok
    assert all(fake.answered[i] > t_sig for i in held), "held until after the signal"
    # Every call the server accepted (its handler reached the store) was answered; the
    # others were refused with UNAVAILABLE before being accepted.
    for i, o in outcomes.items():
        if i in fake.seen:
            assert isinstance(o, rls_pb2.RateLimitResponse) and o.overall_code == OK, (i, o)
        else:
            assert o == UNAVAILABLE, (i, o)
    assert not any(i in fake.seen for i in late), "accepted after the signal"
    # It waited for them (until the release), and no longer than the grace period.
    assert t_release - t_sig <= took < GRACE_S, (t_release - t_sig, took)
    assert "every call in flight finished" in server.log()


def test_the_grace_period_bounds_the_wait_for_calls_in_flight(shardgate):
    with FakeDynamo(hold=20.0) as fake:  # far longer than the grace period
        server = dynamo_server(shardgate, fake, "1s")
        held = issue(server, range(1, 11))
        wait_seen(fake, 10)
        t_sig = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(timeout=10)
        took = time.monotonic() - t_sig
        fake.release.set()
        outcomes = [outcome(f) for f in held.values()]
    assert code == 0, server.log()[-3000:]
    assert 0.9 < took < 3.0, f"exited {took:.2f}s after the signal, grace 1s"
    assert "calls still in flight at the end of the grace period" in server.log()
    # Cut off by the exit, not answered: they fail (UNAVAILABLE), never hang.
    assert all(o == UNAVAILABLE for o in outcomes), outcomes
