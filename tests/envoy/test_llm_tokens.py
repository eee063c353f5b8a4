"""The LLM token pattern through Envoy 1.40.

Route /llm (envoy_e2e.main_routes) carries its rate limits in the ratelimit filter's
per-route config (`RateLimitPerRoute.rate_limits`):
- request path: (llm_tenant, kind=requests) with 1 hit, and (llm_tenant, kind=tokens) with
  `hits_addend: {number: 0}` — a check of the token budget that takes nothing;
- `apply_on_stream_done: true`: (llm_tenant, kind=tokens) with
  `hits_addend: {format: "%RESP(x-tokens-used)%"}` — after the response, the usage the
  upstream reported is debited.
Rules (limits/e2e.yaml): rpm 100/minute, and tpm 1000/hour with `overdraft: true` (a slow
refill, 1 token per 3.6 s, so that balances stay put during a test), both in the bucket item
`llm:<tenant>`. The backend reports `x-tokens-used` as the request's `x-simulate-tokens` asks.
"""
import math
import time

from envoy_e2e import READY_TIMEOUT_S, unique, wait_until

RLS_CALLS = "cluster.shardgate.upstream_rq_completed"
TPM_REFILL_S = 3600 / 1000  # seconds per token
BOTH_LIMITS = '100;w=60;name="rpm", 1000;w=3600;name="tpm"'


class Tenant:
    def __init__(self, stack, prefix):
        self.stack = stack
        self.name = unique(prefix)
        self.calls = stack.envoy.counter(RLS_CALLS)

    def request(self, tokens):
        """One /llm request whose upstream reports `tokens` used. For a 200, waits until
        the stream-done call has been answered too: it is sent after the response,
        fire and forget, and the next request must see its debit."""
        r = self.stack.get("/llm", {"x-tenant": self.name, "x-simulate-tokens": str(tokens)})
        self.calls += 2 if r.status == 200 else 1
        wait_until(lambda: self.stack.envoy.counter(RLS_CALLS) >= self.calls, READY_TIMEOUT_S,
                   f"{self.calls} answered rate-limit calls", detail=self.stack.logs)
        return r


def test_llm_usage_debited_at_stream_end_then_429(stack):
    t = Tenant(stack, "acme")
    start = time.monotonic()
    r1 = t.request(600)
    assert r1.status == 200, r1
    assert r1.header("x-tokens-used") == "600"
    # Request path: rpm took one request (99 left, the tightest); the token check took
    # nothing (1000 left).
    assert r1.header("x-ratelimit-limit") == f"100, {BOTH_LIMITS}", r1.headers
    assert r1.header("x-ratelimit-remaining") == "99"

    # 400 left: the check passes (rpm, 98 left, is still the tightest), then 600 more are
    # used: 200 tokens of debt.
    r2 = t.request(600)
    assert r2.status == 200, r2
    assert r2.header("x-ratelimit-limit") == f"100, {BOTH_LIMITS}", r2.headers

    # In debt: the check (0 hits) is refused until the debt is repaid at 1000/hour.
    r3 = t.request(1)
    elapsed = time.monotonic() - start
    assert r3.status == 429, (r3, stack.logs())
    assert r3.header("x-envoy-ratelimited") == "true"
    assert r3.header("x-ratelimit-limit") == f"1000, {BOTH_LIMITS}", r3.headers
    assert r3.header("x-ratelimit-remaining") == "0"
    # 200 tokens of debt: 720 s, less what was repaid since the first debit.
    debt_s = 200 * TPM_REFILL_S
    reset = int(r3.header("x-ratelimit-reset"))
    assert math.floor(debt_s - elapsed) <= reset <= math.ceil(debt_s), (reset, elapsed)
    assert t.request(1).status == 429  # still in debt

    # Another tenant has its own budget.
    assert Tenant(stack, "other").request(600).status == 200


def test_llm_checks_take_no_tokens(stack):
    t = Tenant(stack, "lean")
    r = t.request(995)
    assert r.status == 200
    debited = time.monotonic()
    # 5 tokens left. Ten more requests that use no tokens: each request-path check and each
    # stream-done report of 0 takes nothing, so all pass and the balance stays at 5 (had
    # Envoy sent no hits_addend, each would take 1 and the sixth would be refused).
    for i in range(10):
        r = t.request(0)
        assert r.status == 200, (i, r)
        assert r.header("x-ratelimit-limit") == f"1000, {BOTH_LIMITS}", r.headers
        refilled = math.ceil((time.monotonic() - debited) / TPM_REFILL_S)
        assert 5 <= int(r.header("x-ratelimit-remaining")) <= 5 + refilled, (i, r.headers)
    # 10 tokens used: 5 of debt, so the next check is refused.
    assert t.request(10).status == 200
    assert t.request(0).status == 429
