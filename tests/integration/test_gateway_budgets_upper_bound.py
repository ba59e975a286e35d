"""No budget is exceeded at an upstream that counts like a real server: two gateway processes on
one real redis-server, hundreds of concurrent requests, an upstream reporting what a server
running SmolLM2 counts (its chat template, with the default system prompt it inserts, and its
tokenizer; tests/fakes/real_usage.py). The tokens the upstream served never exceed the tenant's
tokens_per_day, with the tier's tokenizer configured and without (the UTF-8 bound), every
refusal is a 429 in OpenAI form, and nothing is left reserved in Redis.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from pathlib import Path

import httpx
import pytest

from engines.loaded_model import resolve_checkpoint_dir
from gateway.schema import ChatCompletionRequest
from gateway.tier_tokenizers import TokenizerCounter
from gateway.token_bounds import prompt_bound
from policies.config import hash_api_key
from tests.fakes.real_usage import RealUsage
from tests.gateway_harness import free_port, shared
from tests.integration.test_gateway_budgets_replicas import Replicas
from tests.redis_server import launch

pytestmark = pytest.mark.slow

BUDGET = 1900                       # tokens per day of each tenant
REQUESTS = 300                      # per tenant, over both replicas
IN_FLIGHT = 64                      # at once
MAX_TOKENS = 7
MSG = [{"role": "user", "content": "Say something. Ça va? 日本語"}]
KEYS = {"bytes": "sk-bytes-0000001", "tokenized": "sk-tokenized-002"}   # tenant = model = tier


def _config(redis_url: str, prefix: str, upstream: int, tokenizer: Path) -> str:
    keys = "\n".join(f"    - {{tenant: {t}, sha256: {hash_api_key(k)}, name: {t}-key}}" for t, k in KEYS.items())
    return f"""
server: {{reload_poll_s: 0, log_requests: false}}
auth:
  enabled: true
  keys:
{keys}
tenants: {{bytes: {{}}, tokenized: {{}}}}
tiers:
  bytes: {{kind: upstream, base_url: "http://127.0.0.1:{upstream}/v1", model: smol-bytes}}
  tokenized: {{kind: upstream, base_url: "http://127.0.0.1:{upstream}/v1", model: smol-tokenized,
               tokenizer: "{tokenizer}"}}
models:
  bytes: {{chain: [bytes]}}
  tokenized: {{chain: [tokenized]}}
limits:
  store: {{backend: redis, url: "{redis_url}", key_prefix: {prefix}, on_store_failure: closed, timeout_s: 5}}
  tenants:
    by_id:
      bytes: {{tokens_per_day: {BUDGET}}}
      tokenized: {{tokens_per_day: {BUDGET}}}
"""


class BoundReplicas(Replicas):
    """Redis, one upstream counting like SmolLM2, two gateways (Replicas' process handling)."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="tiergate-bound-"))
        self.checkpoint = resolve_checkpoint_dir("default")
        self.redis = launch()
        self.prefix = "tb" + uuid.uuid4().hex[:8]
        self.procs = []
        try:
            self.flaky = free_port()        # Replicas.control() steers this one
            self._spawn(["-m", "tests.fakes.upstream", "--port", str(self.flaky)], "upstream")
            cfg = self.dir / "gateway.yaml"
            cfg.write_text(_config(self.redis.url, self.prefix, self.flaky, self.checkpoint / "tokenizer.json"))
            self.ports = [free_port(), free_port()]
            for port in self.ports:
                self._spawn(["-m", "gateway.cli", "serve", "--config", str(cfg), "--port", str(port)],
                            f"gateway-{port}")
            self.bases = [f"http://127.0.0.1:{p}" for p in self.ports]
            for url in [f"http://127.0.0.1:{self.flaky}/healthz"] + [b + "/readyz" for b in self.bases]:
                self._wait(url)
            self.control(usage_tokenizer=str(self.checkpoint))
        except BaseException:
            self.stop()
            raise


@pytest.fixture
def bound(request) -> BoundReplicas:
    return shared(request, "budget-bound-replicas", BoundReplicas)


async def _burst(bases: list[str], model: str) -> list[httpx.Response]:
    gate = asyncio.Semaphore(IN_FLIGHT)
    limits = httpx.Limits(max_connections=IN_FLIGHT, max_keepalive_connections=IN_FLIGHT)
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        async def one(i: int) -> httpx.Response:
            async with gate:
                return await client.post(f"{bases[i % 2]}/v1/chat/completions",
                                         json={"model": model, "messages": MSG, "max_tokens": MAX_TOKENS},
                                         headers={"authorization": f"Bearer {KEYS[model]}"})
        return await asyncio.gather(*(one(i) for i in range(REQUESTS)))


async def _redis_state(store, scope: str):
    try:
        return await store.usage(scope), await store.held()
    finally:
        await store.close()


@pytest.mark.parametrize("model", ["bytes", "tokenized"])
def test_the_upstream_never_serves_more_than_the_budget(bound, model):
    results = asyncio.run(_burst(bound.bases, model))
    served = [r.json()["usage"]["total_tokens"] for r in results if r.status_code == 200]
    refused = [r for r in results if r.status_code != 200]

    upstream_served = bound.control()["served_tokens"].get(f"smol-{model}", 0)
    assert sum(served) == upstream_served
    assert upstream_served <= BUDGET, f"{len(served)} admitted, {upstream_served} tokens served"

    assert refused, "the burst should exhaust the budget"
    for resp in refused:
        assert resp.status_code == 429
        error = resp.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
        # Spent, or full only with what requests in flight hold (a short wait)
        assert (error["type"], error["code"]) in {("insufficient_quota", "insufficient_quota"),
                                                  ("tokens", "rate_limit_exceeded")}
        assert int(resp.headers["retry-after"]) > 0

    # Refused means used + reserved + R > BUDGET then, and every reservation R turned into
    # `actual` tokens: at least actual / R of (BUDGET - R) was served in the end.
    body = ChatCompletionRequest.model_validate({"model": model, "messages": MSG})
    counter = TokenizerCounter.from_file(bound.checkpoint / "tokenizer.json") if model == "tokenized" else None
    reserved = prompt_bound(body, counter) + MAX_TOKENS
    actual = RealUsage(bound.checkpoint).answer({"messages": MSG, "max_tokens": MAX_TOKENS}, True)["usage"]
    assert all(tokens == actual["total_tokens"] for tokens in served)
    assert upstream_served >= actual["total_tokens"] * (BUDGET - reserved) / reserved

    usage, held = asyncio.run(_redis_state(bound.store(), f"t:{model}"))
    assert usage.used_tokens_day == upstream_served                 # every reconciliation landed once
    assert (usage.reserved_tokens_day, usage.in_flight) == (0, 0)
    assert held == 0
