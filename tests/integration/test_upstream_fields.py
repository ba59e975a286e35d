"""Request body fields an upstream tier receives, over real HTTP: known fields are type-checked
at the schema (a bad one is a 400, never a 500), an unknown one is a 400 naming it, or dropped,
or forwarded where the tier's config names it, and the client's own cache_salt never leaves."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.gateway_harness import InstantUpstream, RunningGateway

MSG = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    upstream = InstantUpstream()
    url = upstream.base_url
    path = tmp_path_factory.mktemp("gw-fields") / "gateway.yaml"
    path.write_text(f"""
auth: {{enabled: false}}
server: {{reload_poll_s: 0}}
tiers:
  strict: {{kind: upstream, base_url: "{url}", model: instant}}
  lenient: {{kind: upstream, base_url: "{url}", model: instant, unknown_fields: drop}}
  custom: {{kind: upstream, base_url: "{url}", model: instant, extra_body_fields: [priority]}}
models:
  strict: {{chain: [strict]}}
  lenient: {{chain: [lenient]}}
  custom: {{chain: [custom]}}
  strict-then-custom: {{chain: [strict, custom]}}
""")
    gw = RunningGateway(path)
    yield gw, upstream
    gw.stop()
    upstream.stop()


def _control(upstream: InstantUpstream) -> dict:
    return httpx.get(upstream.base_url.removesuffix("/v1") + "/__control").json()


def _chat(gw, model: str, **extra) -> httpx.Response:
    return httpx.post(f"{gw.base}/v1/chat/completions", json={"model": model, "messages": MSG, **extra}, timeout=30)


def _completion(gw, model: str, **extra) -> httpx.Response:
    return httpx.post(f"{gw.base}/v1/completions", json={"model": model, "prompt": "one two", **extra}, timeout=30)


def _openai_error(resp: httpx.Response, status: int = 400) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    return error


def test_an_unknown_field_is_a_400_naming_it_and_never_sent(setup):
    gw, upstream = setup
    before = _control(upstream)["completions"]
    for resp in (_chat(gw, "strict", priority=10), _completion(gw, "strict", priority=10),
                 _chat(gw, "strict", stream=True, priority=10)):
        error = _openai_error(resp)
        assert error["param"] == "priority" and error["code"] == "unknown_parameter"
        assert "priority" in error["message"]
    assert _control(upstream)["completions"] == before


def test_an_unknown_field_is_dropped_or_forwarded_by_the_tier_config(setup):
    gw, upstream = setup
    known = {"guided_regex": "[a-z]+", "repetition_penalty": 1.1, "stop_token_ids": [2, 7], "min_tokens": 1}
    assert _chat(gw, "lenient", priority=10, kv_transfer_params={"x": 1}, **known).status_code == 200
    sent = _control(upstream)["last_body"]
    assert "priority" not in sent and "kv_transfer_params" not in sent
    assert {k: sent[k] for k in known} == known            # known extensions go as sent
    assert _chat(gw, "custom", priority=10).status_code == 200
    assert _control(upstream)["last_body"]["priority"] == 10
    # A tier that rejects the field is passed over for one that takes it.
    resp = _chat(gw, "strict-then-custom", priority=3)
    assert resp.status_code == 200 and resp.headers["x-tiergate-tier"] == "custom"
    assert resp.headers["x-tiergate-fallbacks"] == "strict: tier_unfit"


@pytest.mark.parametrize("field,value", [("best_of", "x"), ("guided_json", 5), ("guided_choice", [1, 2]),
                                         ("repetition_penalty", -1.0), ("stop_token_ids", ["a"]),
                                         ("logit_bias", {"50256": 1000}), ("min_tokens", "3"),
                                         ("bad_words", ["  "]), ("bad_words", ["x" * 1024] * 65)])
def test_a_known_extension_of_the_wrong_type_is_a_400(setup, field, value):
    gw, _ = setup
    error = _openai_error(_chat(gw, "lenient", **{field: value}))
    assert re.split(r"[.\[]", error["param"])[0] == field        # the field, or a part of it (stop_token_ids[0])


def test_best_of_of_the_wrong_type_is_a_400_on_both_endpoints(setup):
    gw, _ = setup
    for resp in (_completion(gw, "strict", best_of="x"), _chat(gw, "strict", best_of="x"),
                 _chat(gw, "strict", stream=True, best_of="x")):
        assert _openai_error(resp)["param"] == "best_of"


def test_the_clients_cache_salt_never_reaches_the_upstream(setup):
    gw, upstream = setup
    resp = _chat(gw, "strict", cache_salt="end-user-42")
    assert resp.status_code == 200
    assert _control(upstream)["last_body"].get("cache_salt") != "end-user-42"
