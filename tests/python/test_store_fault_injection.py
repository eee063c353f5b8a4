"""Store faults (issue 6, item 1): a real `shardgate serve --store dynamodb` against its own
DynamoDB Local, through `fault_proxy.py`, which the tests switch between pass-through and
a fault: a delay well past the store deadline, HTTP 500, ProvisionedThroughputExceeded and
ThrottlingException of the whole table (their reasons name the table's or the account's
limit: throttling of one bucket's partition is that bucket's answer, see
test_store_throttling.py), connection resets. DynamoDB Local itself is then stopped
(SIGSTOP), killed (SIGKILL) and restarted on the same port (empty: the table is created
again).

Two domains share one rule set and differ only in `failure_mode`. For every fault, a
bounded number of requests goes to each, one at a time, each with a client deadline far
above the store's, and what comes back is checked:

- `failure_mode: deny` → gRPC UNAVAILABLE, every time; `allow` → OK with no limit quoted
  (nothing counted), every time; both answered by the server, never by the client's
  deadline;
- each failure is counted (`shardgate_store_calls_total{outcome="error"}`, or
  `outcome="circuit_open"` for calls the open breaker failed without trying) and the
  "store failed" warning is rate limited (one line per 10 s, with the count of the rest);
- the circuit breaker opens: once 5 calls have failed, the HTTP requests reaching the
  proxy stay within one probe (at most 3 SDK attempts) per cool-off, while every request
  is still answered;
- when the fault goes (or DynamoDB Local is back with its table), decisions return within
  a bounded time with no restart, the proxy sees store calls again, and no debit was lost
  or made up: a bucket debited 3 times before the fault admits exactly the rest of its
  limit afterwards, then refuses.

The main server runs with default flags (the store timeout, 1 s, is a deadline DynamoDB
Local meets on a busy 2-core machine; the faults are far past it). Calls carry a client
deadline of 5 s, except where a test plays Envoy: a 50 ms deadline (as `grpc-timeout`)
must be answered by the server's `failure_mode` before the client gives up, never by the
client's own DEADLINE_EXCEEDED. One test checks that a breaker probe whose caller gave up
still settles the circuit.

Wall-clock latency is not asserted (the machine is shared and noisy); it is measured.
Per fault and domain, the outcome counts and the client-measured p50/p99/max answer times
(plus the server's own p99 bucket from `shardgate_request_duration_seconds`) are written
to `$SHARDGATE_REPORT_DIR/fault-report.txt` (default `target/fault-report.txt`) and shown
in pytest's terminal summary.
"""
import math
import os
import pathlib
import re
import signal
import subprocess
import time

import grpc
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2

from conftest import REPO, Server, add_summary, binary, free_port
from dynamodb_local import AWS_LOCAL_ENV, DynamoLocal, listening
from fault_proxy import FaultProxy

# What shardgate is built with (src/server/serve.rs, src/store/dynamodb.rs,
# src/service/decision/steps.rs); the bounds below are derived from them.
BREAKER_THRESHOLD = 5
BREAKER_COOL_OFF_S = 0.5
SDK_MAX_ATTEMPTS = 3
STORE_HEALTH_INTERVAL_S = 5.0
FAILURE_LOG_INTERVAL_S = 10.0

# The default store timeout (src/store/mod.rs): a deadline DynamoDB Local meets on a
# loaded 2-core machine, the whole Python suite running beside it; faults are far past it.
STORE_TIMEOUT_MS = 1000
DELAY_MS = 3 * STORE_TIMEOUT_MS
# What a caller playing Envoy allows (Envoy's default is 20 ms; 50 ms leaves the Python
# client and a busy machine room), and the delay its phase meets: past STORE_TIMEOUT, so
# the main server's health checks are never forwarded meanwhile.
ENVOY_DEADLINE_S = 0.05
ENVOY_PHASE_DELAY_MS = 2 * STORE_TIMEOUT_MS

CALL_DEADLINE_S = 5.0  # client deadline of one call: far above any store deadline
N = 200  # requests per domain per fault
N_BASE = 100  # requests per domain of the pass-through baseline (each one a store write)
LIMIT = 50  # `user` rule: per hour (no refill to speak of during the suite)
CARRY_LIMIT = 10  # `carry` rule: per hour
CARRY_BEFORE = 3  # debits of a carry bucket before its fault
RECOVERY_TIMEOUT_S = 10.0
OPENING_CALLS = 20  # calls (both domains) by which a failing store has opened the circuit
TABLE = "shardgate_faults"

DENY, ALLOW = "faults_deny", "faults_allow"
DOMAINS = (DENY, ALLOW)


P = "shardgate_"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Warnings in shardgate's text log (`target: message fields`); the message alone is not
# enough: "the store failed repeatedly" also appears inside other warnings' errors.
FAILED_WARNING = "service::decision: store failed "
OPENED_WARNING = "store::breaker: store circuit opened"
HEALTH_WARNING = "service::server: store health check failed"


def rules(domain, failure_mode):
    return f"""\
domain: {domain}
failure_mode: {failure_mode}
descriptors:
  - key: user
    rate_limit: {{unit: hour, requests_per_unit: {LIMIT}, name: user_rph}}
  - key: carry
    rate_limit: {{unit: hour, requests_per_unit: {CARRY_LIMIT}, name: carry_rph}}
"""


# ----------------------------------------------------------------------------------------
# Processes: DynamoDB Local, shardgate


def start_shardgate(workdir, name, config_dir, endpoint, extra_args=()):
    """`shardgate serve --store dynamodb` on free loopback ports, ready (health SERVING)."""
    last = None
    for attempt in range(3):  # a port picked free may be taken before the server binds it
        port, hport = free_port(), free_port()
        log_path = workdir / f"shardgate-{name}-{attempt}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [binary(), "serve", "--config", str(config_dir),
                 "--grpc-addr", f"127.0.0.1:{port}", "--http-addr", f"127.0.0.1:{hport}",
                 "--store", "dynamodb", "--table", TABLE, "--dynamodb-endpoint", endpoint,
                 *extra_args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, **AWS_LOCAL_ENV},
            )
        server = Server(proc, port, log_path, http_port=hport)
        if server.wait_ready():
            return server
        last = server.log()
        if "cannot listen" not in last:
            break
    pytest.fail(f"shardgate ({name}) did not start:\n{last}")


# ----------------------------------------------------------------------------------------
# Calls, phases, the report


def descriptor(key, value):
    return ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value=value)])


def call(server, domain, key, value, deadline=CALL_DEADLINE_S):
    """One ShouldRateLimit: (outcome, milliseconds, limit_remaining or None). Outcomes:
    OK (a limit quoted), OK-open (OK, nothing quoted: failure_mode allow), OVER_LIMIT,
    UNAVAILABLE, or another gRPC code's name."""
    req = rls_pb2.RateLimitRequest(domain=domain, descriptors=[descriptor(key, value)])
    t = time.perf_counter()
    try:
        r = server.rls.ShouldRateLimit(req, timeout=deadline)
    except grpc.RpcError as e:
        return e.code().name, (time.perf_counter() - t) * 1000, None
    ms = (time.perf_counter() - t) * 1000
    (s,) = r.statuses
    if r.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT:
        return "OVER_LIMIT", ms, s.limit_remaining
    if r.overall_code == rls_pb2.RateLimitResponse.OK:
        return ("OK" if s.HasField("current_limit") else "OK-open"), ms, s.limit_remaining
    return f"code{r.overall_code}", ms, None


OUTCOMES = ("OK", "OK-open", "OVER_LIMIT", "UNAVAILABLE")

# Answers given because the store failed, per server (gRPC port): UNAVAILABLE (deny) or
# OK-open (allow); what the server's rate-limited warnings must add up to at most.
FAILED_ANSWERS = {}


def counted_call(server, domain, key, value, deadline=CALL_DEADLINE_S):
    result = call(server, domain, key, value, deadline)
    if result[0] in ("UNAVAILABLE", "OK-open"):
        FAILED_ANSWERS[server.port] = FAILED_ANSWERS.get(server.port, 0) + 1
    return result


def percentile(values, q):
    """Nearest-rank percentile."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def server_p99_bucket(before, after):
    """Upper bound (ms) of the histogram bucket holding the 99th percentile of the
    server's own answer times between two scrapes."""
    def buckets(m):
        return dict((le, v) for le, v in m.histogram(P + "request_duration_seconds")[0])
    b0, b1 = buckets(before), buckets(after)
    delta = sorted((le, b1[le] - b0.get(le, 0.0)) for le in b1)
    total = delta[-1][1]
    if total <= 0:
        return float("nan")
    for le, cum in delta:
        if cum >= 0.99 * total:
            return le * 1000
    return math.inf


class Phase:
    """The calls of one fault, per domain: outcomes and answer times."""

    def __init__(self, label):
        self.label = label
        self.calls = {d: [] for d in DOMAINS}  # domain -> [(outcome, ms, remaining)]
        self.proxy_requests = None
        self.server_p99 = None
        self.recovery_s = None
        self.elapsed = 0.0
        self.starts = []  # seconds from the phase's start at which each call was sent
        self.steady = None  # (proxy requests, seconds) after the first OPENING_CALLS calls
        self.log_lines = None

    def add(self, domain, result):
        self.calls[domain].append(result)

    def outcomes(self, domain):
        out = {}
        for o, _, _ in self.calls[domain]:
            out[o] = out.get(o, 0) + 1
        return out

    def failures(self):
        return self.outcomes(DENY).get("UNAVAILABLE", 0) + self.outcomes(ALLOW).get("OK-open", 0)

    def rows(self):
        for d in DOMAINS:
            times = [ms for _, ms, _ in self.calls[d]]
            counts = self.outcomes(d)
            other = sum(v for k, v in counts.items() if k not in OUTCOMES)
            yield [
                self.label, "deny" if d == DENY else "allow", str(len(times)),
                *(str(counts.get(k, 0)) for k in OUTCOMES), str(other),
                f"{percentile(times, 0.5):.1f}", f"{percentile(times, 0.99):.1f}",
                f"{max(times) if times else float('nan'):.1f}",
                fmt(self.server_p99, "{:g}") if d == DENY else "",
                fmt(self.proxy_requests) if d == DENY else "",
                fmt(self.recovery_s, "{:.2f}") if d == DENY else "",
                fmt(self.log_lines) if d == DENY else "",
            ]


def fmt(v, spec="{}"):
    return "-" if v is None else spec.format(v)


HEADER = ["fault", "domain", "n", "OK", "OK-open", "OVER", "UNAVAIL", "other",
          "p50 ms", "p99 ms", "max ms", "srv p99<=ms", "store reqs", "recover s", "log lines"]

NOTES = """\
n: requests per domain, sent one at a time, each with a 5 s client deadline.
OK-open: OK with no limit quoted (failure_mode: allow). p50/p99/max: answer times
measured by the client (grpcio, loopback). srv p99<=ms: upper bound of the
shardgate_request_duration_seconds bucket that holds the server's own 99th percentile
(both domains). store reqs: HTTP requests that reached the fault proxy during the phase
(the breaker bounds them). recover s: time from removing the fault (or re-creating the
table) to the first decision. log lines: "store failed" plus "store circuit opened"
warnings written during the phase."""


class Report:
    def __init__(self):
        self.phases = []
        self.notes = []

    def render(self):
        rows = [HEADER] + [r for p in self.phases for r in p.rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
        lines = ["  ".join(c.rjust(w) if i >= 2 else c.ljust(w)
                           for i, (c, w) in enumerate(zip(r, widths))).rstrip()
                 for r in rows]
        lines.insert(1, "-" * len(lines[0]))
        return "\n".join(lines + [""] + NOTES.splitlines() + self.notes) + "\n"


# ----------------------------------------------------------------------------------------
# The stack: DynamoDB Local, the proxy, the server under test


class Stack:
    def __init__(self, workdir, report):
        self.workdir = workdir
        self.report = report
        self.config_dir = workdir / "limits"
        self.config_dir.mkdir()
        (self.config_dir / "deny.yaml").write_text(rules(DENY, "deny"))
        (self.config_dir / "allow.yaml").write_text(rules(ALLOW, "allow"))
        self.ddb = DynamoLocal(workdir, TABLE)
        self.proxy = None
        self.server = None
        self.extra = []  # other servers started by tests, stopped at teardown

    def start(self):
        self.ddb.start()
        self.ddb.wait_listening()
        self.ddb.create_table()
        self.proxy = FaultProxy(self.ddb.port, self.workdir / "fault-proxy.log")
        self.server = start_shardgate(self.workdir, "main", self.config_dir, self.proxy.endpoint)

    def stop(self):
        for s in [self.server, *self.extra]:
            if s is not None:
                s.stop()
        if self.proxy is not None:
            self.proxy.stop()
        self.ddb.kill()

    # -- helpers -----------------------------------------------------------------------

    def log_lines(self, server, pattern):
        return [ANSI.sub("", l) for l in server.log().splitlines() if pattern in ANSI.sub("", l)]

    def warnings(self, server):
        """(store failed lines, circuit opened lines) so far."""
        return (len(self.log_lines(server, FAILED_WARNING)),
                len(self.log_lines(server, OPENED_WARNING)))

    def warm_up(self, server, prefix, want=20, max_calls=300, max_s=30.0):
        """Calls until `want` consecutive decisions on the deny domain (bounded)."""
        streak, deadline = 0, time.monotonic() + max_s
        for i in range(max_calls):
            o, _, _ = counted_call(server, DENY, "user", f"{prefix}-{i // LIMIT}")
            streak = streak + 1 if o in ("OK", "OVER_LIMIT") else 0
            if streak >= want or time.monotonic() > deadline:
                break
        return streak >= want

    def wait_decisions(self, server, user, timeout=RECOVERY_TIMEOUT_S):
        """Seconds until the deny domain decides again (OK), polling every 20 ms; None
        if it does not within `timeout`."""
        t0 = time.monotonic()
        last = None
        while time.monotonic() - t0 < timeout:
            last = counted_call(server, DENY, "user", user)
            if last[0] == "OK":
                return time.monotonic() - t0
            time.sleep(0.02)
        return None

    def debit_carry(self, server, tag):
        for d in DOMAINS:
            for k in range(1, CARRY_BEFORE + 1):
                o, _, rem = counted_call(server, d, "carry", tag)
                assert (o, rem) == ("OK", CARRY_LIMIT - k), (d, k, o, rem, server.log()[-3000:])

    def check_exact(self, server, key, tag, already, limit):
        """`limit - already` more admitted (remaining counting down to 0), then refused:
        nothing lost, nothing made up."""
        for d in DOMAINS:
            got = [counted_call(server, d, key, tag)[::2] for _ in range(limit - already + 1)]
            want = [("OK", limit - k) for k in range(already + 1, limit + 1)] + [("OVER_LIMIT", 0)]
            assert got == want, (d, tag, got)

    def run_phase(self, server, phase, values, n=N, key="user", pace_s=0.0, until=None,
                  deadline=CALL_DEADLINE_S):
        """`n` calls per domain, interleaved, cycling through descriptor `key=values[i]`;
        stops early when `until()` says so. Records proxy requests, the server's answer
        times and its warnings."""
        m0, s0, w0 = server.metrics(), self.proxy.stats(), self.warnings(server)
        t0 = time.monotonic()
        mid = None  # proxy counters and time after the first OPENING_CALLS calls
        for i in range(n):
            if i == OPENING_CALLS // 2:
                mid = (self.proxy.stats()["requests"], time.monotonic())
            for d in DOMAINS:
                phase.starts.append(time.monotonic() - t0)
                phase.add(d, counted_call(server, d, key, values[i % len(values)], deadline))
            if until is not None and until():
                break
            if pace_s:
                time.sleep(pace_s)
        phase.elapsed = time.monotonic() - t0
        m1, s1, w1 = server.metrics(), self.proxy.stats(), self.warnings(server)
        phase.proxy_requests = s1["requests"] - s0["requests"]
        phase.steady = None if mid is None else (s1["requests"] - mid[0], time.monotonic() - mid[1])
        phase.server_p99 = server_p99_bucket(m0, m1)
        phase.log_lines = (w1[0] - w0[0]) + (w1[1] - w0[1])
        self.report.phases.append(phase)
        answered = m1.value(P + "request_duration_seconds_count") - \
            m0.value(P + "request_duration_seconds_count")
        sent = len(phase.calls[DENY]) + len(phase.calls[ALLOW])
        assert answered == sent, ("every call answered by the server", answered, sent)
        # Failed calls: store errors, calls the open circuit failed without trying, and
        # requests whose deadline passed first (their store call goes on detached).
        errors = sum(m1.sum(P + "store_calls_total", outcome=o) - m0.sum(P + "store_calls_total", outcome=o)
                     for o in ("error", "circuit_open"))
        errors += m1.sum(P + "store_failure_answers_total", cause="deadline") - \
            m0.sum(P + "store_failure_answers_total", cause="deadline")
        fast_failed = m1.sum(P + "store_calls_total", outcome="circuit_open") - \
            m0.sum(P + "store_calls_total", outcome="circuit_open")
        return {"m0": m0, "m1": m1, "s0": s0, "s1": s1, "errors": errors,
                "fast_failed": fast_failed, "fault_log": (w1[0] - w0[0], w1[1] - w0[1])}

    def assert_failed_over(self, server, phase, seen, breaker=True):
        """Checks of a phase in which the store failed throughout."""
        deny, allow = phase.outcomes(DENY), phase.outcomes(ALLOW)
        assert deny == {"UNAVAILABLE": len(phase.calls[DENY])}, (phase.label, deny, server.log()[-3000:])
        assert allow == {"OK-open": len(phase.calls[ALLOW])}, (phase.label, allow, server.log()[-3000:])
        # Counted: each failed request failed at least one store call.
        assert seen["errors"] >= phase.failures(), (phase.label, seen["errors"], phase.failures())
        # Rate-limited warning: one "store failed" line per 10 s at most.
        failed_lines, _opened_lines = seen["fault_log"]
        assert failed_lines <= 1 + phase.elapsed / FAILURE_LOG_INTERVAL_S + 1, (phase.label, failed_lines)
        assert failed_lines < phase.failures() / 10
        if breaker:
            # The breaker opened: after BREAKER_THRESHOLD failed calls (each of at most
            # SDK_MAX_ATTEMPTS HTTP requests), only one probe per cool-off reaches the
            # store; the periodic health check is a call like any other (admitted as the
            # probe or refused), and another server's may share the proxy.
            # Open: calls failed without trying the store. (The "circuit opened" warning
            # is written once per opening, so a phase that starts with the circuit still
            # open from the previous fault writes none.)
            assert seen["fast_failed"] >= phase.failures() / 2, (
                phase.label, "the circuit never opened", seen["fast_failed"])

            def bound(seconds, opening):
                calls = opening + seconds / BREAKER_COOL_OFF_S + 1 \
                    + 2 * (seconds / STORE_HEALTH_INTERVAL_S + 1)
                return SDK_MAX_ATTEMPTS * calls

            # Every call sent before a store call could have failed (one ends by the store
            # timeout at the latest) was admitted: the breaker had seen no failure yet.
            # Past the first BREAKER_THRESHOLD, their callers had given up (a caller
            # waiting longer sends no other call meanwhile), so each made one attempt.
            early = sum(1 for t in phase.starts if t < STORE_TIMEOUT_MS / 1000)
            total = bound(phase.elapsed, BREAKER_THRESHOLD) + early
            assert phase.proxy_requests <= total, (phase.label, phase.proxy_requests, total)
            # The breaker at work: the store saw a small fraction of the failed requests.
            # (Not judged against the bound: it grows with the phase's length, which
            # depends on how fast this machine fails calls.)
            assert phase.proxy_requests < phase.failures() / 4, (
                phase.label, "the store saw too many of the failed calls", phase.proxy_requests)
            # Once open (after the first OPENING_CALLS calls), store calls stop growing
            # but for the probes, while calls are still answered.
            if phase.steady is not None:
                steady_requests, steady_s = phase.steady
                steady = bound(steady_s, 0)
                assert steady_requests <= steady, (phase.label, phase.steady, steady)
        assert server.proc.poll() is None, server.log()[-3000:]
        assert "panicked" not in server.log()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, pytestconfig):
    report = Report()
    s = Stack(tmp_path_factory.mktemp("store-faults"), report)
    started = time.monotonic()
    try:
        s.start()
        report.notes.append(f"\nstack started in {time.monotonic() - started:.1f}s "
                            "(DynamoDB Local, table, proxy, shardgate with default flags)")
        yield s
    finally:
        s.stop()
        text = report.render()
        out_dir = pathlib.Path(os.environ.get("SHARDGATE_REPORT_DIR") or REPO / "target")
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "fault-report.txt").write_text(text)
            where = out_dir / "fault-report.txt"
        except OSError as e:
            where = f"(not written: {e})"
        add_summary(pytestconfig, f"store faults: p50/p99/max answer time and outcome per fault; {where}", text)


# ----------------------------------------------------------------------------------------
# The faults


def test_baseline_pass_through_admits_exactly_the_limit(stack):
    server = stack.server
    assert stack.warm_up(server, "warm"), "no 20 consecutive decisions while warming up"
    phase = Phase("pass-through")
    buckets = N_BASE // LIMIT
    seen = stack.run_phase(server, phase, [f"base-{u}" for u in range(buckets)], n=N_BASE)
    # Buckets of LIMIT, as many as it takes: every call admitted, each bucket drained.
    for d in DOMAINS:
        assert phase.outcomes(d) == {"OK": N_BASE}, (d, phase.outcomes(d), server.log()[-3000:])
        remaining = sorted(r for _, _, r in phase.calls[d])
        assert remaining == sorted(list(range(LIMIT)) * buckets), (d, [r for _, _, r in phase.calls[d]])
    assert seen["errors"] == 0
    # Every bucket went through the proxy to DynamoDB, and DynamoDB counted the writes. Not
    # one per call: with token leases (on by default) one write may answer several calls;
    # the refusals below show every bucket drained in the store itself.
    forwarded = seen["s1"]["forwarded"] - seen["s0"]["forwarded"]
    assert forwarded >= 2 * buckets, forwarded
    units = sum(seen["m1"].sum(P + "store_consumed_capacity_units_total", operation=o)
                - seen["m0"].sum(P + "store_consumed_capacity_units_total", operation=o)
                for o in ("UpdateItem", "PutItem", "TransactWriteItems"))
    assert units >= 2 * buckets, units
    stack.report.notes.append(
        f"pass-through: {2 * N_BASE} admitted calls took {forwarded} store requests and "
        f"{units:g} write units")
    # One more per bucket is refused.
    for d in DOMAINS:
        for u in range(buckets):
            assert counted_call(server, d, "user", f"base-{u}")[::2] == ("OVER_LIMIT", 0)


PROXY_FAULTS = [
    ("delay", DELAY_MS, None, f"delay {DELAY_MS}ms"),
    ("http500", 0, None, "HTTP 500"),
    # The table's capacity and the account's quota: every bucket throttled alike.
    ("ptee", 0, "TableWriteProvisionedThroughputExceeded",
     "400 ProvisionedThroughputExceeded (table)"),
    ("throttle", 0, "TableWriteAccountLimitExceeded", "400 ThrottlingException (account)"),
    ("reset", 0, None, "connection reset"),
]


@pytest.mark.parametrize("fault,ms,reason,label", PROXY_FAULTS,
                         ids=[f[0] for f in PROXY_FAULTS])
def test_proxy_fault(stack, fault, ms, reason, label):
    server, proxy = stack.server, stack.proxy
    proxy.set("pass")
    assert stack.wait_decisions(server, f"{fault}-ready") is not None, server.log()[-3000:]
    stack.debit_carry(server, fault)

    proxy.set(fault, ms, reason=reason)
    phase = Phase(label)
    # Every call of the fault on the bucket debited before it: a debit applied behind
    # the server's back would show below.
    seen = stack.run_phase(server, phase, [fault], key="carry")
    stack.assert_failed_over(server, phase, seen)
    s1 = seen["s1"]
    assert s1["faulted"].get(fault, 0) - seen["s0"]["faulted"].get(fault, 0) >= 1, s1
    # Nothing the server saw fail was applied behind its back.
    assert s1["forwarded"] == seen["s0"]["forwarded"], s1

    # The fault goes: decisions again, with no restart, and store calls flow again.
    before = proxy.set("pass")
    phase.recovery_s = stack.wait_decisions(server, f"{fault}-after")
    assert phase.recovery_s is not None, f"no recovery within {RECOVERY_TIMEOUT_S}s:\n{server.log()[-3000:]}"
    stack.check_exact(server, "carry", fault, CARRY_BEFORE, CARRY_LIMIT)
    assert proxy.stats()["forwarded"] > before["forwarded"]


def test_a_contended_bucket_is_a_short_refusal_not_an_outage(stack):
    """A single-item write DynamoDB refuses with TransactionConflictException (a
    transaction holds the item) is retried with jitter; when it persists the request is
    refused with a short reset, as the reference engine answers contention — on either
    domain, whatever its failure_mode — and the circuit never opens. The bucket is then
    exactly as before: nothing was taken."""
    server, proxy = stack.server, stack.proxy
    proxy.set("pass")
    assert stack.wait_decisions(server, "conflict-ready") is not None, server.log()[-3000:]
    stack.debit_carry(server, "conflict")
    m0 = server.metrics()
    proxy.set("conflict")
    for d in DOMAINS:
        for _ in range(10):
            req = rls_pb2.RateLimitRequest(domain=d, descriptors=[descriptor("carry", "conflict")])
            r = server.rls.ShouldRateLimit(req, timeout=CALL_DEADLINE_S)
            (s,) = r.statuses
            assert r.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT, (d, r)
            reset_ms = s.duration_until_reset.seconds * 1000 + s.duration_until_reset.nanos // 10**6
            assert reset_ms == 100, (d, r)
    m1 = server.metrics()
    assert m1.sum(P + "store_calls_total", outcome="circuit_open") == \
        m0.sum(P + "store_calls_total", outcome="circuit_open"), "the circuit never opened"
    assert m1.sum(P + "store_failure_answers_total") == m0.sum(P + "store_failure_answers_total")
    assert proxy.stats()["faulted"].get("conflict", 0) >= 20 * 4, "each write tried four times"
    proxy.set("pass")
    stack.check_exact(server, "carry", "conflict", CARRY_BEFORE, CARRY_LIMIT)


def test_a_caller_with_envoys_deadline_gets_the_failure_mode_answer(stack):
    """A caller that allows 50 ms (sent as `grpc-timeout`, as Envoy sends its filter's
    timeout) against a store that hangs for seconds: the server answers it by
    `failure_mode` within its deadline — UNAVAILABLE or OK — never leaving it to the
    client's own DEADLINE_EXCEEDED; the breaker still opens. The same caller is decided
    normally when the store answers."""
    server, proxy = stack.server, stack.proxy
    proxy.set("pass")
    assert stack.wait_decisions(server, "envoy-ready") is not None, server.log()[-3000:]
    base = Phase(f"pass-through, {ENVOY_DEADLINE_S * 1000:.0f} ms caller")
    stack.run_phase(server, base, ["envoy-base"], n=20, deadline=ENVOY_DEADLINE_S)
    for d in DOMAINS:  # the emulator may miss 50 ms now and then: reported, not judged
        assert set(base.outcomes(d)) <= set(OUTCOMES) | {"DEADLINE_EXCEEDED"}, base.outcomes(d)

    proxy.set("delay", ENVOY_PHASE_DELAY_MS)
    phase = Phase(f"delay {ENVOY_PHASE_DELAY_MS}ms, {ENVOY_DEADLINE_S * 1000:.0f} ms caller")
    seen = stack.run_phase(server, phase, ["envoy"], deadline=ENVOY_DEADLINE_S)
    stack.assert_failed_over(server, phase, seen)
    proxy.set("pass")
    assert stack.wait_decisions(server, "envoy-after") is not None, server.log()[-3000:]


def test_breaker_recovers_after_a_probe_whose_caller_gave_up(stack):
    """The breaker's probe may ride on a call whose caller gives up first (Envoy's 20 ms
    `grpc-timeout`): the server answers that caller by `failure_mode` at its deadline,
    and the probe's store call goes on in the background to its own end, where it
    settles the circuit. Here: the circuit opens on a slow store, the next probe rides on
    a call with a 50 ms deadline, then the store comes back."""
    # A proxy of its own, so that its counters see this server's store calls only.
    proxy = FaultProxy(stack.ddb.port, stack.workdir / "fault-proxy-probe-cancel.log")
    server = None
    try:
        server = start_shardgate(stack.workdir, "probe-cancel", stack.config_dir, proxy.endpoint)
        assert stack.wait_decisions(server, "pc-ready") is not None, server.log()[-3000:]
        proxy.set("delay", DELAY_MS)
        for _ in range(6):  # five failures open the circuit
            assert counted_call(server, DENY, "user", "pc")[0] == "UNAVAILABLE"
        # The first call after the cool-off carries the probe, unless the periodic health
        # check took it. Proof that it did: its store call reached the store (the proxy
        # holds it), and the server answered the call itself, by failure_mode.
        tries = []
        for _ in range(5):
            time.sleep(BREAKER_COOL_OFF_S + 0.3)
            m0, p0 = server.metrics(), proxy.stats()["requests"]
            outcome = counted_call(server, DENY, "user", "pc", deadline=ENVOY_DEADLINE_S)[0]
            time.sleep(0.2)
            m1, p1 = server.metrics(), proxy.stats()["requests"]
            handled = m1.value(P + "request_duration_seconds_count") - \
                m0.value(P + "request_duration_seconds_count")
            tries.append((outcome, handled, p1 - p0))
            if (outcome, handled, p1 - p0) == ("UNAVAILABLE", 1, 1):
                break
        else:
            pytest.fail(f"no call carried a probe past its deadline: {tries}\n{server.log()[-3000:]}")
        proxy.set("pass")
        recovered = stack.wait_decisions(server, "pc-after", timeout=5.0)
        if recovered is None:
            pytest.fail(
                f"5 s after the store came back, every call still fails at once and none "
                f"reaches the store ({proxy.stats()['requests'] - p1} requests); "
                f"/healthcheck: {server.http('GET', '/healthcheck')}")
    finally:
        if server is not None:
            server.stop()
        proxy.stop()


def test_dynamodb_local_stopped_killed_and_restarted(stack):
    server, proxy, ddb = stack.server, stack.proxy, stack.ddb
    proxy.set("pass")
    assert stack.wait_decisions(server, "sig-ready") is not None, server.log()[-3000:]

    # SIGSTOP: connections are accepted by the kernel, nothing answers.
    ddb.signal(signal.SIGSTOP)
    try:
        phase = Phase("SIGSTOP DynamoDB Local")
        seen = stack.run_phase(server, phase, ["sigstop"])
        stack.assert_failed_over(server, phase, seen)
        assert seen["s1"]["forwarded"] == seen["s0"]["forwarded"]
    finally:
        # SIGKILL: gone, connections refused (a stopped process dies of SIGKILL too).
        ddb.kill()
    phase = Phase("SIGKILL DynamoDB Local")
    # Paced to span several cool-offs: the circuit is still open from SIGSTOP (its last
    # probe may hang up to the store timeout), and an unpaced phase (~0.4 s) can end
    # before any probe reaches the dead store.
    seen = stack.run_phase(server, phase, ["sigkill"], pace_s=0.01)
    stack.assert_failed_over(server, phase, seen)
    assert seen["s1"]["upstream_errors"] > seen["s0"]["upstream_errors"], seen["s1"]

    # Restart on the same port; requests keep being answered while the JVM starts.
    started = time.monotonic()
    ddb.start()
    phase = Phase("restarting DynamoDB Local")
    seen = stack.run_phase(server, phase, ["restarting"], pace_s=0.01,
                           until=lambda: listening(ddb.port))
    stack.assert_failed_over(server, phase, seen, breaker=phase.elapsed > 2)
    ddb.wait_listening()

    # Back, but empty (in memory): no table yet, still failing.
    phase = Phase("restarted, table missing")
    seen = stack.run_phase(server, phase, ["no-table"], n=50)
    stack.assert_failed_over(server, phase, seen, breaker=False)
    ddb.create_table()
    table_back = time.monotonic()

    phase = Phase("restart-recovery")
    phase.recovery_s = stack.wait_decisions(server, "restart-after", timeout=RECOVERY_TIMEOUT_S)
    assert phase.recovery_s is not None, f"no recovery after the restart:\n{server.log()[-3000:]}"
    # A JVM just started answers slowly at first: warm it before judging decisions.
    assert stack.warm_up(server, "rewarm"), "no 20 consecutive decisions after the restart"
    seen = stack.run_phase(server, phase, ["restarted"], n=LIMIT)
    for d in DOMAINS:
        assert phase.outcomes(d) == {"OK": LIMIT}, (d, phase.outcomes(d))
        assert [r for _, _, r in phase.calls[d]] == list(range(LIMIT))[::-1]
    assert seen["errors"] == 0
    # The calls reached the restarted store (with token leases, fewer requests than calls),
    # and drained the bucket there.
    assert seen["s1"]["forwarded"] - seen["s0"]["forwarded"] >= 2
    for d in DOMAINS:
        assert counted_call(server, d, "user", "restarted")[::2] == ("OVER_LIMIT", 0)
    stack.report.notes.append(
        f"DynamoDB Local restart: listening after {table_back - started:.1f}s "
        f"(table re-created); decisions {phase.recovery_s:.2f}s after that")


def test_store_failure_warnings_are_rate_limited_and_count_the_rest(stack):
    """Over every fault above, the main server wrote one "store failed" warning per 10 s
    at most, each with the number of failures it did not log since the previous one."""
    server = stack.server
    lines = stack.log_lines(server, FAILED_WARNING)
    suppressed = [int(m.group(1)) for m in
                  (re.search(r"similar_failures_not_logged=(\d+)", l) for l in lines) if m]
    assert len(suppressed) == len(lines) > 0, lines
    failed = FAILED_ANSWERS.get(server.port, 0)
    assert max(suppressed) > 0, lines
    assert sum(1 + n for n in suppressed) <= failed, (suppressed, failed)
    assert len(lines) < failed / 50, (len(lines), failed)
    opened = len(stack.log_lines(server, OPENED_WARNING))
    health = len(stack.log_lines(server, HEALTH_WARNING))
    stack.report.notes.append(
        f"main server log: {failed} answers given on store failure, {len(lines)} 'store failed' "
        f"warnings (counting {sum(suppressed)} more), {opened} 'store circuit opened' and "
        f"{health} 'store health check failed' warnings (these two are not rate limited)")
