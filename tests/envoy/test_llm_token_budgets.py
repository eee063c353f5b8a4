"""The LLM token-budget recipe through Envoy 1.40: config/llm-tokens.yaml, run unedited.

shardgate serves the recipe's file (conftest `llm_recipe_stack`); Envoy's route
(envoy_e2e.llm_recipe_routes) sends, per (x-tenant, x-model):
- request path: kind=requests with 1 hit, kind=input_tokens and kind=output_tokens with
  `hits_addend: {number: 0}` (checks that take nothing);
- `apply_on_stream_done: true`: kind=input_tokens with `%RESP(x-input-tokens)%` and
  kind=output_tokens with `%RESP(x-output-tokens)%`, the usage the backend reports as the
  request's `x-simulate-input-tokens` / `x-simulate-output-tokens` ask.

All four limits of a (tenant, model) — rpm, input_tpm, output_tpm, output_tpd — live in one
bucket item. The recipe's rates are realistic, so balances refill during a test (input
6667 tokens/s, output 1667/s): balances read through `/json` are asserted within the
refill since the debit. The DynamoDB half also reads the item itself (`shardgate
inspect`), whose `tc` (millitokens taken, never refilled) is an exact ledger.

docs/configuration.md's recipe section shows these rules and this route; a test keeps
them the same.
"""
import json
import math
import re
import subprocess
import time

from envoy_e2e import (
    LLM_RECIPE_CONFIG, LLM_RECIPE_DOMAIN, READY_TIMEOUT_S, REPO, http_get, http_post_json,
    llm_recipe_routes, unique, wait_until,
)

PATH = "/v1/chat/completions"
RLS_CALLS = "cluster.shardgate.upstream_rq_completed"
RLS_ISSUED = "cluster.shardgate.upstream_rq_total"
PACE_S = 0.3
MODEL = "big-model"
# config/llm-tokens.yaml, as /rlconfig lists it (test_recipe_config_is_served).
RECIPE_RULES = [
    "llm.tenant.model.kind_requests: 600/minute resource llm; name rpm",
    "llm.tenant.model.kind_input_tokens: 400000/minute overdraft resource llm; name input_tpm",
    "llm.tenant.model.kind_output_tokens: 100000/minute overdraft [output_tpm] + "
    "20000000/day overdraft [output_tpd] resource llm",
]
LIMITS = {"rpm", "input_tpm", "output_tpm", "output_tpd"}
INPUT_TPM, OUTPUT_TPM = 400_000, 100_000
INPUT_RATE, OUTPUT_RATE = INPUT_TPM / 60, OUTPUT_TPM / 60  # tokens per second
# Envoy's x-ratelimit-limit on the request path: the answering limit, then every
# descriptor's (the output descriptor answers with output_tpm, the tighter of its two).
REQUEST_PATH_QUOTAS = ('600;w=60;name="rpm", 400000;w=60;name="input_tpm", '
                       '100000;w=60;name="output_tpm"')
MILLI = 1000


class Client:
    """Requests through Envoy, each waited for until its rate-limit calls are answered:
    the stream-done call is sent after the response, fire and forget, and what comes
    next must see its debit.

    Requests are paced PACE_S apart, so that a lease on DynamoDB (taken from 6 decisions
    a second) is given back within a request or two: its tokens taken ahead of use count
    in the item's ledger until then (`leases_back`)."""

    def __init__(self, stack):
        self.stack = stack
        envoy = stack.envoy
        # Every call issued so far answered (the warm-up's stream-done call may still be
        # on its way): from then on, this client's calls are the only ones.
        self.calls = wait_until(
            lambda: envoy.counter(RLS_CALLS) >= envoy.counter(RLS_ISSUED)
            and envoy.counter(RLS_CALLS),
            READY_TIMEOUT_S, "every rate-limit call answered", detail=stack.logs)
        self.last = 0.0

    def request(self, tenant, model, input_tokens, output_tokens):
        time.sleep(max(0.0, self.last + PACE_S - time.monotonic()))
        self.last = time.monotonic()
        r = self.stack.get(PATH, {
            "x-tenant": tenant, "x-model": model,
            "x-simulate-input-tokens": str(input_tokens),
            "x-simulate-output-tokens": str(output_tokens),
        })
        self.calls += 2 if r.status == 200 else 1
        wait_until(lambda: self.stack.envoy.counter(RLS_CALLS) >= self.calls, READY_TIMEOUT_S,
                   f"{self.calls} answered rate-limit calls", detail=self.stack.logs)
        return r


def peek(stack, tenant, model):
    """The token limits' answers for (tenant, model) now, from shardgate's `/json` with 0
    hits (takes nothing): {kind: (code, answering limit's name, remaining)}."""
    kinds = ["input_tokens", "output_tokens"]
    r = http_post_json(stack.shardgate.http_port, "/json", {
        "domain": LLM_RECIPE_DOMAIN,
        "descriptors": [{"entries": [{"key": "tenant", "value": tenant},
                                     {"key": "model", "value": model},
                                     {"key": "kind", "value": k}],
                         "hitsAddend": 0} for k in kinds],
    })
    assert r.status in (200, 429), r
    statuses = json.loads(r.body)["statuses"]
    return {k: (s["code"], s["currentLimit"]["name"], int(s.get("limitRemaining", 0)))
            for k, s in zip(kinds, statuses)}


def metrics(stack):
    page = http_get(stack.shardgate.http_port, "/metrics").body.decode()
    out = {}
    for line in page.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def store_writes(stack):
    """Writes to the store so far: items created, and debits applied to an item."""
    m = metrics(stack)
    return (m.get('shardgate_store_calls_total{operation="commit",outcome="committed"}', 0)
            + m.get('shardgate_store_calls_total{operation="debit",outcome="applied"}', 0))


def memory_items_made(stack):
    """Items the memory store holds plus those it dropped: grows by one per item made."""
    m = metrics(stack)
    dropped = sum(v for k, v in m.items()
                  if k.startswith("shardgate_memory_store_evictions_total{"))
    return m["shardgate_memory_store_items"] + dropped


def inspect(stack, store, shardgate_bin, tenant, model):
    """The bucket item of (tenant, model) as `shardgate inspect` reads it (DynamoDB), once
    every lease is back."""
    leases_back(stack)
    sg = stack.shardgate
    out = subprocess.run(
        [shardgate_bin, "inspect", "--store", "dynamodb", "--table", store.table,
         "--dynamodb-endpoint", store.endpoint, "--namespace", store.namespace(sg.tag),
         "--entity", f"{tenant}/{model}", "--resource", "llm"],
        env=store.env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def leases_back(stack):
    """Waits until this server holds no token in a lease: a request and its stream-done
    debit come within milliseconds, a rate from which the default lease policy leases the
    bucket (2 decisions in a 250-ms window, over its 6/s), and a lease's tokens count in
    the item's ledger (`tc`) until its rest is given back — within its lifetime (1 s) of
    the bucket going quiet. The ledger is exact after that."""
    outstanding = lambda: metrics(stack).get("shardgate_lease_tokens_outstanding", 0.0)
    wait_until(lambda: outstanding() == 0.0, 10.0, "every lease given back",
               detail=lambda: f"outstanding {outstanding()}\n{stack.logs()}")


def taken(item):
    """Tokens each limit of a one-shard item has given out since it was made."""
    assert item["shard_count"] == 1, item
    return {name: l["tc"] / MILLI for name, l in item["shards"][0]["limits"].items()
            if name != "wcu"}  # wcu: the store's write budget, not a limit of the rules


def within_refill(remaining, floor, rate, since):
    """`remaining` is `floor` plus at most what the refill added since `since`."""
    return floor <= remaining <= floor + math.ceil(rate * (time.monotonic() - since)) + 1


def doc_recipe_blocks():
    """The YAML blocks of docs/configuration.md's recipe section, parsed: the rules, then
    the route."""
    import yaml  # tests/envoy/requirements.txt

    text = (REPO / "docs" / "configuration.md").read_text()
    start = text.index("## Token budgets for LLM traffic (recipe)")
    section = text[start:text.index("\n## ", start + 1)]
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", section, re.S)]


def test_docs_show_what_is_tested():
    """The recipe's section shows the rules of config/llm-tokens.yaml and the route this
    suite runs."""
    import yaml

    rules, routes = doc_recipe_blocks()
    recipe = yaml.safe_load(LLM_RECIPE_CONFIG.read_text())
    assert rules["domain"] == recipe["domain"] == LLM_RECIPE_DOMAIN
    assert rules["descriptors"] == recipe["descriptors"]
    per_route = "envoy.filters.http.ratelimit"
    shown = routes["routes"][0]["typed_per_filter_config"][per_route]
    tested = llm_recipe_routes()[0]["typed_per_filter_config"][per_route]
    assert shown == tested


def test_recipe_config_is_served(llm_recipe_stack):
    text = http_get(llm_recipe_stack.shardgate.http_port, "/rlconfig").body.decode()
    lines = [line.strip() for line in text.splitlines()]
    for rule in RECIPE_RULES:
        assert rule in lines, text


def test_usage_debited_at_stream_end_each_into_its_own_limit(llm_recipe_stack, store,
                                                             shardgate_bin):
    stack, c, tenant = llm_recipe_stack, Client(llm_recipe_stack), unique("acme")
    start = time.monotonic()
    r = c.request(tenant, MODEL, 150_000, 30_000)
    assert r.status == 200, r
    assert (r.header("x-input-tokens"), r.header("x-output-tokens")) == ("150000", "30000")
    # The request path sent all three descriptors (every limit is quoted) and was answered
    # by rpm, 599 left: the token checks found full budgets.
    assert r.header("x-ratelimit-limit") == f"600, {REQUEST_PATH_QUOTAS}", r.headers
    assert r.header("x-ratelimit-remaining") == "599"

    # After the stream ended: input tokens came out of input_tpm, output tokens out of
    # output_tpm (the tighter of output_tpm/output_tpd), each only its own count.
    p = peek(stack, tenant, MODEL)
    assert p["input_tokens"][:2] == ("OK", "input_tpm"), p
    assert within_refill(p["input_tokens"][2], INPUT_TPM - 150_000, INPUT_RATE, start), p
    assert p["output_tokens"][:2] == ("OK", "output_tpm"), p
    assert within_refill(p["output_tokens"][2], OUTPUT_TPM - 30_000, OUTPUT_RATE, start), p

    # Five requests that use no tokens: each takes a request, none a token.
    for i in range(5):
        assert c.request(tenant, MODEL, 0, 0).status == 200, i
    if store.name == "dynamodb":
        # The item's ledger, exact: 6 requests; the token limits took the reported usage
        # and not one token more for the 12 request-path checks.
        assert taken(inspect(stack, store, shardgate_bin, tenant, MODEL)) == {
            "rpm": 6, "input_tpm": 150_000, "output_tpm": 30_000, "output_tpd": 30_000}


def test_output_debt_refuses_that_tenant_and_model_only(llm_recipe_stack, store,
                                                        shardgate_bin):
    stack, c, tenant = llm_recipe_stack, Client(llm_recipe_stack), unique("heavy")
    debited = time.monotonic()  # before the debit: bounds the refill since
    r = c.request(tenant, MODEL, 1_000, 250_000)
    # The check passed (full budgets); the 250,000 output tokens reported at stream end
    # were all recorded: output_tpm is 150,000 below zero.
    assert r.status == 200, r

    r = c.request(tenant, MODEL, 10, 10)
    assert r.status == 429, (r, stack.logs())
    assert r.header("x-envoy-ratelimited") == "true"
    # Refused by output_tpm, until the refill (100,000/minute) has paid the debt back.
    assert r.header("x-ratelimit-limit") == f"100000, {REQUEST_PATH_QUOTAS}", r.headers
    assert r.header("x-ratelimit-remaining") == "0"
    debt_s = 150_000 / OUTPUT_RATE  # 90 s
    reset = int(r.header("x-ratelimit-reset"))
    elapsed = time.monotonic() - debited
    assert math.floor(debt_s - elapsed) - 1 <= reset <= math.ceil(debt_s), (reset, elapsed)

    # Output tokens are in debt, input tokens are not.
    p = peek(stack, tenant, MODEL)
    assert p["output_tokens"] == ("OVER_LIMIT", "output_tpm", 0), p
    assert p["input_tokens"][:2] == ("OK", "input_tpm"), p
    assert within_refill(p["input_tokens"][2], INPUT_TPM - 1_000, INPUT_RATE, debited), p

    # The same tenant's other model, and another tenant on the same model, are served.
    assert c.request(tenant, "small-model", 10, 10).status == 200
    assert c.request(unique("other"), MODEL, 10, 10).status == 200
    assert c.request(tenant, MODEL, 0, 0).status == 429  # still in debt

    if store.name == "dynamodb":
        # The refused requests took nothing, not even a request.
        assert taken(inspect(stack, store, shardgate_bin, tenant, MODEL)) == {
            "rpm": 1, "input_tpm": 1_000, "output_tpm": 250_000, "output_tpd": 250_000}


def test_limits_share_one_store_item(llm_recipe_stack, store, shardgate_bin):
    stack, c, tenant = llm_recipe_stack, Client(llm_recipe_stack), unique("shared")
    writes, items = store_writes(stack), memory_items_made(stack) if store.name == "memory" else 0

    # A new (tenant, model): the request path (rpm and both checks) makes one item; the
    # stream end debits input and output tokens in it, one write.
    assert c.request(tenant, MODEL, 500, 700).status == 200
    assert store_writes(stack) - writes == 2
    # Again: one write per rate-limit call, however many limits it debits.
    assert c.request(tenant, MODEL, 500, 700).status == 200
    assert store_writes(stack) - writes == 4
    # Another model of the tenant: an item of its own.
    assert c.request(tenant, "small-model", 1, 1).status == 200

    if store.name == "memory":
        assert memory_items_made(stack) - items == 2
    else:
        item = inspect(stack, store, shardgate_bin, tenant, MODEL)
        assert set(item["shards"][0]["limits"]) - {"wcu"} == LIMITS, item
        assert taken(item) == {"rpm": 2, "input_tpm": 1_000, "output_tpm": 1_400,
                               "output_tpd": 1_400}
