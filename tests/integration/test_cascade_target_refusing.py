"""A cascade hands a request to its target only when the target would take the call: escalating
aborts the first tier's call, so a target whose breaker refuses calls, or that is at its
in-flight limit, would leave the request to start over on the first tier (its work done twice,
charged twice, and a fresh sample instead of the answer under way). Such a target is passed
over at the decision and the first tier's answer goes on."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.cascade_harness import SCOPE
from tests.gateway_harness import InstantUpstream, RunningGateway

K = 4
MSG = [{"role": "user", "content": "w5 w9 w17 w33"}]
TINY = ("{{model: '{path}', dtype: float32, max_model_len: 256, kv_cache_memory: 4MiB, block_size: 16, "
        "max_num_seqs: 8, max_num_batched_tokens: 256, capabilities: []}}")


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    from tests.tiny_models import write_tiny_checkpoint

    tmp = tmp_path_factory.mktemp("cascade-refusing")
    write_tiny_checkpoint(tmp / "small", seed=0)
    upstream = InstantUpstream()
    path = tmp / "gateway.yaml"
    path.write_text(f"""
auth: {{enabled: false}}
server: {{reload_poll_s: 0}}
tiers:
  small: {TINY.format(path=tmp / "small")}
  up: {{kind: upstream, base_url: "{upstream.base_url}", model: instant}}
  pricey: {{kind: upstream, base_url: "{upstream.base_url}", model: instant}}
models:
  plain-small: {{chain: [small], pinned: true}}
  only-up: {{chain: [up], pinned: true}}
  escalate: {{chain: [small], pinned: true, cascade: {{to: up, tokens: {K}, threshold: 0}}}}
  escalate-pricey: {{chain: [small], pinned: true, cascade: {{to: pricey, tokens: {K}, threshold: 0}}}}
limits:
  tenants: {{by_id: {{default: {{tokens_per_day: 100000000, cost_per_day: 1.0}}}}}}
  prices: {{pricey: {{input_per_1m: 1000000000}}}}
  breakers: {{by_name: {{up: {{min_calls: 2, failure_rate: 0.5, open_s: 600}}}}}}
""")
    gw = RunningGateway(path)
    gw.upstream = upstream
    yield gw
    gw.stop()
    upstream.stop()


def _control(gw, **update) -> None:
    httpx.post(gw.upstream.base_url.removesuffix("/v1") + "/__control", json=update).raise_for_status()


def _used(gw) -> int:
    """Tokens charged to the tenant's daily budget so far."""
    usage = asyncio.run_coroutine_threadsafe(gw.runtime.limits.budgets.usage(SCOPE), gw.server_loop())
    return usage.result(timeout=30).used_tokens_day


def test_an_open_breaker_on_the_target_keeps_the_first_tiers_answer(gw):
    client = openai.OpenAI(base_url=f"{gw.base}/v1", api_key="unused", max_retries=0)
    ask = dict(messages=MSG, max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    plain = client.chat.completions.create(model="plain-small", **ask)
    escalated = client.chat.completions.with_raw_response.create(model="escalate", **ask)
    assert escalated.headers["x-tiergate-tier"] == "up"          # a usable target takes the request
    _control(gw, fail_status=503)
    for _ in range(3):
        assert httpx.post(f"{gw.base}/v1/chat/completions", timeout=30,
                          json={"model": "only-up", "messages": MSG, "max_tokens": 2}).status_code == 503
    _control(gw, fail_status=None)
    before = _used(gw)
    for stream in (False, True):
        raw = client.chat.completions.with_raw_response.create(model="escalate", stream=stream, **ask)
        headers = raw.headers
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
        else:
            text = raw.parse().choices[0].message.content
        assert headers["x-tiergate-tier"] == "small" and "x-tiergate-fallbacks" not in headers, dict(headers)
        assert "cascade kept small (up unusable: circuit breaker open" in headers["x-tiergate-reasons"]
        assert text == plain.choices[0].message.content
    # Each request ran once on small: its prompt and answer, charged once.
    assert _used(gw) - before == 2 * (plain.usage.prompt_tokens + plain.usage.completion_tokens)


def test_a_target_the_budget_refuses_leaves_the_request_to_the_first_tier(gw):
    """The tenant's budget admits the first tier's call but not the target's (its price): the
    request is answered by the first tier, not refused with a 429 after work was done for it."""
    client = openai.OpenAI(base_url=f"{gw.base}/v1", api_key="unused", max_retries=0)
    ask = dict(messages=MSG, max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    plain = client.chat.completions.create(model="plain-small", **ask)
    for stream in (False, True):
        raw = client.chat.completions.with_raw_response.create(model="escalate-pricey", stream=stream, **ask)
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices) if stream \
            else raw.parse().choices[0].message.content
        assert raw.headers["x-tiergate-tier"] == "small" and raw.headers["x-tiergate-fallbacks"] == "pricey: budget"
        assert "cascade target pricey could not answer: answered by small" in raw.headers["x-tiergate-reasons"]
        assert text == plain.choices[0].message.content
