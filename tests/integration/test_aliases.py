"""Model aliases and what a request needs, over real HTTP: every alias is listed (/v1/models and the
model enum of /openapi.json); a routed alias follows the routing rules (code goes to the larger
tier), a pinned one walks its own chain whatever the rules; a request with tools passes over the
tiers that cannot honour them (a typed skip) and reaches one that can with its tools unchanged,
or gets OpenAI's 400 naming `tools` when none can."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.cascade_harness import cg, client  # noqa: F401 - fixtures

CODE = [{"role": "user", "content": "Why does this fail?\ndef area(r):\n    return 3.14 * r * r"}]
PROSE = [{"role": "user", "content": "Tell me about the sea."}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}}, "required": ["city"]}}}]
ALIASES = ["auto", "plain-small", "plain-large", "with-up", "keep", "escalate", "keep-entropy",
           "escalate-entropy", "up-first", "keep-gain", "escalate-gain", "up-gain"]




def _ask(client, model, messages, **kw):
    raw = client.chat.completions.with_raw_response.create(model=model, messages=messages, max_tokens=4,
                                                           temperature=0, **kw)
    return raw.headers, raw.parse()


def test_every_alias_is_listed(cg, client):
    assert [m.id for m in client.models.list().data] == ALIASES
    schema = httpx.get(f"{cg.base}/openapi.json").json()["components"]["schemas"]
    for request in ("ChatCompletionRequest", "CompletionRequest"):
        assert schema[request]["properties"]["model"]["enum"] == ALIASES
    assert "tools" in schema["ChatCompletionRequest"]["properties"]


def test_routed_alias_sends_code_to_the_larger_tier_and_a_pinned_one_is_not_re_routed(client):
    headers, _ = _ask(client, "auto", CODE)
    assert headers["x-tiergate-tier"] == "large" and headers["x-tiergate-profile"] == "memory"
    assert "needs code (syntax def)" in headers["x-tiergate-reasons"]
    headers, _ = _ask(client, "auto", PROSE)
    assert headers["x-tiergate-tier"] == "small" and "needs" not in headers["x-tiergate-reasons"]
    headers, _ = _ask(client, "plain-small", CODE)         # pinned: the code rule does not apply
    assert headers["x-tiergate-tier"] == "small" and "needs code" in headers["x-tiergate-reasons"]


def test_tools_skip_embedded_tiers_and_reach_an_upstream_unchanged(cg, client):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    headers, answer = _ask(client, "with-up", PROSE, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False)
    assert headers["x-tiergate-tier"] == "up" and headers["x-tiergate-fallbacks"] == "small: capability"
    assert "needs tools" in headers["x-tiergate-reasons"] and answer.choices[0].message.content
    sent = httpx.get(cg.upstream.base_url.removesuffix("/v1") + "/__control").json()["last_body"]
    assert (sent["tools"], sent["tool_choice"], sent["parallel_tool_calls"]) == (TOOLS, choice, False)
    metrics = httpx.get(f"{cg.base}/metrics").text
    assert 'tiergate_tier_skips_total{capability="tools",reason="capability",tier="small"}' in metrics


def test_tools_no_tier_can_honour_get_a_400_naming_tools(client):
    with pytest.raises(openai.BadRequestError) as info:
        _ask(client, "auto", PROSE, tools=TOOLS)
    error = info.value.body
    assert (error["param"], error["code"], error["type"]) == ("tools", "unsupported_capability",
                                                              "invalid_request_error")
    assert info.value.response.headers["x-tiergate-fallbacks"] == "small: capability; large: capability"
    with pytest.raises(openai.BadRequestError) as info:
        _ask(client, "auto", PROSE, response_format={"type": "json_object"})
    assert info.value.body["param"] == "response_format"


@pytest.mark.parametrize("extra,param", [
    ({"tools": [{"type": "function", "function": {"name": "no spaces"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": ["x"]}}]}, "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": "x" * (1 << 20)}}]},
     "tools[0].function.description"),
    ({"tool_choice": "required"}, "tool_choice"),                           # no tools to choose from
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
])
def test_bad_tools_are_400_naming_the_field(cg, extra, param):
    body = {"model": "with-up", "messages": PROSE, "max_tokens": 4, **extra}
    resp = httpx.post(f"{cg.base}/v1/chat/completions", json=body)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text


def test_logprobs_is_a_capability_tiers_can_lack(cg, client):
    """The tiny tiers declare no capabilities: a request asking for logprobs skips them for the
    upstream, named in the fallbacks and counted in the skip metric."""
    resp = httpx.post(f"{cg.base}/v1/chat/completions", json={"model": "with-up", "messages": PROSE, "max_tokens": 4,
                                                              "logprobs": True, "top_logprobs": 2})
    assert resp.status_code == 200 and resp.headers["x-tiergate-tier"] == "up", resp.text
    assert resp.headers["x-tiergate-fallbacks"] == "small: capability"
    assert "needs logprobs" in resp.headers["x-tiergate-reasons"]
    metrics = httpx.get(f"{cg.base}/metrics").text
    assert 'tiergate_tier_skips_total{capability="logprobs",reason="capability",tier="small"}' in metrics
    plain = httpx.post(f"{cg.base}/v1/chat/completions", json={"model": "with-up", "messages": PROSE, "max_tokens": 4})
    assert plain.headers["x-tiergate-tier"] == "small"
