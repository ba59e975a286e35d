"""Routing over real HTTP with embedded tiers: each profile to its tier, fallback past a tier
that failed to load, a cascade escalating on a low mean logprob, readiness, reload limits."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.gateway_harness import shared, start_embedded_gateway

pytestmark = pytest.mark.slow

MSG = [{"role": "user", "content": "Tell me about the sea."}]


@pytest.fixture(scope="module")
def gw(request, tmp_path_factory):
    return shared(request, "embedded-gateway", lambda: start_embedded_gateway(tmp_path_factory.mktemp("emb")))


@pytest.fixture(scope="module")
def client(gw):
    return openai.OpenAI(base_url=f"{gw.base}/v1", api_key="unused", max_retries=0)


def _ask(client, model, hint=None, messages=MSG, **kw):
    headers = {"x-tiergate-profile": hint} if hint else {}
    raw = client.chat.completions.with_raw_response.create(model=model, messages=messages, max_tokens=4,
                                                           temperature=0, extra_headers=headers, **kw)
    return raw.headers, raw.parse()


@pytest.mark.parametrize("hint,tier", [("latency", "tiny-a"), ("memory", "tiny-b"), ("throughput", "smol"),
                                       (None, "smol")])
def test_each_profile_goes_to_its_tier(client, hint, tier):
    headers, _ = _ask(client, "multi", hint)
    assert headers["x-tiergate-tier"] == tier
    assert headers["x-tiergate-profile"] == (hint or "throughput")


def test_prompt_length_rule_uses_real_token_counts(gw, client):
    smol = gw.runtime.tiers["smol"].engine.engine.loaded
    text = "The sea is wide and deep. " * 45
    ids = smol.tokenizer.encode(smol.chat_template.render([{"role": "user", "content": text}]))
    assert len(ids) >= 300
    headers, resp = _ask(client, "multi", messages=[{"role": "user", "content": text}])
    assert headers["x-tiergate-profile"] == "memory"
    assert headers["x-tiergate-reasons"] == f"rule long: prompt_tokens {len(ids)} >= 300, model multi"
    # The memory route starts at tiny-b, whose 256-token context cannot hold it: the next tier answers.
    assert headers["x-tiergate-tier"] == "smol"
    assert headers["x-tiergate-fallbacks"] == "tiny-b: tier_unfit"
    assert resp.usage.prompt_tokens == len(ids)


def test_fallback_past_a_tier_that_failed_to_load(client):
    headers, resp = _ask(client, "routed")
    assert headers["x-tiergate-tier"] == "smol" and resp.choices[0].message.content
    assert headers["x-tiergate-fallbacks"] == "broken: not_ready"


def test_a_tier_that_failed_to_load_is_not_worth_a_retry(gw):
    # It will not come up without an operator: a plain 503 with no Retry-After (which would have
    # the openai clients wait and ask again for nothing).
    resp = httpx.post(f"{gw.base}/v1/chat/completions", json={"model": "broken-only", "messages": MSG, "max_tokens": 4})
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "no_tier_available"
    assert "retry-after" not in resp.headers and "retry" not in resp.json()["error"]["message"]
    assert resp.headers["x-tiergate-fallbacks"] == "broken: not_ready"


def test_cascade_escalates_on_low_mean_logprob(gw, client):
    # The tiny random model is unsure of every token (mean logprob near -log(128)): escalate, before
    # anything is sent, to the real model, whose answer the client gets as if routed there.
    headers, resp = _ask(client, "esc")
    assert headers["x-tiergate-tier"] == "smol" and headers["x-tiergate-escalated-from"] == "tiny-a"
    assert "cascade tiny-a -> smol: mean_logprob" in headers["x-tiergate-reasons"]
    assert resp.choices[0].logprobs is None          # logprobs were for the gateway, not asked by the client
    _, plain = _ask(client, "smol")
    assert resp.choices[0].message.content == plain.choices[0].message.content
    headers, _ = _ask(client, "no-esc")
    assert headers["x-tiergate-tier"] == "tiny-a" and "x-tiergate-escalated-from" not in headers
    with httpx.stream("POST", f"{gw.base}/v1/chat/completions",
                      json={"model": "esc", "messages": MSG, "max_tokens": 4, "stream": True}) as r:
        assert r.headers["x-tiergate-tier"] == "smol"    # streams escalate too: their start is held back
        r.read()


def test_readyz_waits_for_every_tier(gw):
    resp = httpx.get(f"{gw.base}/readyz")
    assert resp.status_code == 503                       # `broken` never loads
    tiers = resp.json()["tiers"]
    assert tiers["broken"]["state"] == "failed" and "model path not found" in tiers["broken"]["error"]
    assert {tiers[t]["state"] for t in ("smol", "tiny-a", "tiny-b")} == {"ready"}
    assert httpx.get(f"{gw.base}/healthz").status_code == 200


def test_reload_refuses_to_change_an_embedded_tier(gw):
    original = gw.config_path.read_text()
    try:
        gw.config_path.write_text(original.replace("max_model_len: 512", "max_model_len: 1024"))
        assert gw.reload() is False and "embedded tier 'smol'" in gw.reloader.last_error
        gw.config_path.write_text(original.replace("  no-esc:", "  renamed-alias: {chain: [smol]}\n  no-esc:"))
        assert gw.reload() is True
        assert gw.runtime.tiers["smol"].engine is not None    # the loaded engine was kept, not rebuilt
    finally:
        gw.config_path.write_text(original)
        gw.reload()
