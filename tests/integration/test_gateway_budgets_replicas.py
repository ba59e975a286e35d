"""Two gateway processes (`tiergate serve`) sharing one real redis-server: 1,000 concurrent
requests against one token budget never admit more than it, the rest get a 429 from that
budget (insufficient_quota once spent, rate_limit_exceeded while requests in flight hold the
rest), and afterwards nothing is left reserved in Redis.

`Replicas` (the two gateways, their instant upstreams and the Redis) is shared with
test_gateway_breakers.py through `shared()`: one set of processes per test session.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest

from gateway.schema import ChatCompletionRequest
from gateway.token_bounds import prompt_bound
from tests.fakes.upstream import ANSWER
from policies.budgets.redis_store import RedisBudgetStore
from policies.config import hash_api_key
from tests.gateway_harness import free_port, shared
from tests.redis_server import launch

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
QUOTA_KEY = "sk-quota-00000001"
APP_KEY = "sk-app-000000002"
BUDGET = 3000                      # tokens per month of tenant 'quota'
MSG = [{"role": "user", "content": "Say something."}]
# Reserved per request: the prompt's upper bound, plus max_tokens 9.
ESTIMATE = prompt_bound(ChatCompletionRequest.model_validate({"model": "m", "messages": MSG})) + 9
ACTUAL = 2 + len(ANSWER.split())   # used: the instant upstream counts 2 prompt words + 9 answer words


def replicas_config(redis_url: str, prefix: str, instant: int, flaky: int) -> str:
    return f"""
server: {{reload_poll_s: 0, log_requests: false}}
auth:
  enabled: true
  keys:
    - {{tenant: quota, sha256: {hash_api_key(QUOTA_KEY)}, name: quota-key}}
    - {{tenant: app, sha256: {hash_api_key(APP_KEY)}, name: app-key}}
tenants: {{quota: {{}}, app: {{}}}}
tiers:
  instant: {{kind: upstream, base_url: "http://127.0.0.1:{instant}/v1", model: instant}}
  primary: {{kind: upstream, base_url: "http://127.0.0.1:{flaky}/v1", model: flaky}}
  backup: {{kind: upstream, base_url: "http://127.0.0.1:{instant}/v1", model: instant}}
models:
  budgeted: {{chain: [instant]}}
  flaky: {{chain: [primary, backup]}}
  flaky-only: {{chain: [primary]}}
limits:
  store: {{backend: redis, url: "{redis_url}", key_prefix: {prefix}, on_store_failure: closed, timeout_s: 5}}
  tenants:
    by_id:
      quota: {{tokens_per_month: {BUDGET}}}
  breakers:
    by_name:
      primary: {{window_s: 60, min_calls: 4, failure_rate: 0.5, open_s: 3, half_open_probes: 2}}
  retry: {{budget_ratio: 1.0, min_retries_per_window: 100}}
"""


class Replicas:
    """Redis, two instant upstreams ('instant' and the steerable 'flaky') and two gateways."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="tiergate-replicas-"))
        self.redis = launch()
        self.prefix = "tg" + uuid.uuid4().hex[:8]
        self.procs: list[subprocess.Popen] = []
        try:
            self.instant, self.flaky = free_port(), free_port()
            for port in (self.instant, self.flaky):
                self._spawn(["-m", "tests.fakes.upstream", "--port", str(port)], f"upstream-{port}")
            cfg = self.dir / "gateway.yaml"
            cfg.write_text(replicas_config(self.redis.url, self.prefix, self.instant, self.flaky))
            self.ports = [free_port(), free_port()]
            for port in self.ports:
                self._spawn(["-m", "gateway.cli", "serve", "--config", str(cfg), "--port", str(port)],
                            f"gateway-{port}")
            self.bases = [f"http://127.0.0.1:{p}" for p in self.ports]
            for url in [f"http://127.0.0.1:{p}/healthz" for p in (self.instant, self.flaky)] + \
                       [b + "/readyz" for b in self.bases]:
                self._wait(url)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, args: list[str], name: str) -> None:
        log = open(self.dir / f"{name}.log", "w")  # noqa: SIM115 - the child writes to it
        self.procs.append(subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                           env={**os.environ, "PYTHONUNBUFFERED": "1"}))

    def _wait(self, url: str, timeout_s: float = 90) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.1)
        raise RuntimeError(f"{url} did not come up; logs:\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"--- {f.name}\n{f.read_text()[-3000:]}" for f in sorted(self.dir.glob("*.log")))

    def control(self, **update) -> dict:
        """Steer the flaky upstream (tests/fakes/upstream.py's /__control) and read its counts."""
        url = f"http://127.0.0.1:{self.flaky}/__control"
        return (httpx.post(url, json=update) if update else httpx.get(url)).json()

    def store(self) -> RedisBudgetStore:
        import redis.asyncio as aioredis
        return RedisBudgetStore(aioredis.Redis.from_url(self.redis.url), self.prefix, owns_client=True)

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.redis.stop()


@pytest.fixture
def replicas(request) -> Replicas:
    return shared(request, "budget-replicas", Replicas)


async def _burst(bases: list[str], n: int) -> list[tuple[int, int, dict]]:
    """n requests at once, alternating between the gateways: (replica, status, body)."""
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        async def one(i: int):
            resp = await client.post(f"{bases[i % 2]}/v1/chat/completions",
                                     json={"model": "budgeted", "messages": MSG, "max_tokens": 9},
                                     headers={"authorization": f"Bearer {QUOTA_KEY}"})
            return i % 2, resp.status_code, resp.json()
        return await asyncio.gather(*(one(i) for i in range(n)))


async def _redis_state(store: RedisBudgetStore):
    try:
        return await store.usage("t:quota"), await store.held()
    finally:
        await store.close()


def test_two_replicas_never_admit_more_than_the_budget(replicas):
    results = asyncio.run(_burst(replicas.bases, 1000))
    served = [(replica, body["usage"]["total_tokens"]) for replica, status, body in results if status == 200]
    refused = [body["error"] for _, status, body in results if status != 200]
    assert len(served) + len(refused) == 1000
    # A budget refusal: spent (insufficient_quota), or full only with what requests in flight
    # hold (rate_limit_exceeded, a short wait). No other limit is configured.
    assert all((e["code"], e["type"]) in {("insufficient_quota", "insufficient_quota"),
                                          ("rate_limit_exceeded", "tokens")} for e in refused), refused[:3]
    admitted = sum(tokens for _, tokens in served)
    assert all(tokens == ACTUAL for _, tokens in served)
    assert admitted <= BUDGET
    # A refusal means used + reserved + ESTIMATE > BUDGET at that moment; every reservation then
    # turns into ACTUAL tokens, so at least ACTUAL / ESTIMATE of that was admitted in the end.
    assert admitted >= ACTUAL * (BUDGET - ESTIMATE) / ESTIMATE
    assert {replica for replica, _ in served} == {0, 1}           # both replicas admitted some
    usage, held = asyncio.run(_redis_state(replicas.store()))
    assert usage.used_tokens_month == admitted                     # every reconciliation landed once
    assert (usage.reserved_tokens_month, usage.in_flight, held) == (0, 0, 0)
