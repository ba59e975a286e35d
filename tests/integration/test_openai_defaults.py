"""What a client migrating from OpenAI's API relies on, over real HTTP in front of the fake
upstream: legacy completions generate 16 tokens unless told otherwise (and the upstream is told
so), n reaches OpenAI's 128 where the server's cap allows, top_p 0 is in range, model cards have
a creation time, and every response, whatever its path or status, carries an x-request-id."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from gateway.schema import CompletionRequest
from policies.config import hash_api_key
from tests.gateway_harness import InstantUpstream, RunningGateway

KEY = "sk-defaults-000000001"


@pytest.fixture(scope="module")
def upstream():
    server = InstantUpstream()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gw(upstream, tmp_path_factory):
    path = tmp_path_factory.mktemp("gw-defaults") / "gateway.yaml"
    path.write_text(f"""
server: {{reload_poll_s: 0}}
auth:
  keys:
    - {{tenant: app, sha256: {hash_api_key(KEY)}}}
tenants: {{app: {{}}}}
tiers:
  up: {{kind: upstream, base_url: "{upstream.base_url}", model: instant}}
models:
  m: {{chain: [up]}}
""")
    server = RunningGateway(path)
    yield server
    server.stop()


def _last_body(upstream: InstantUpstream) -> dict:
    return httpx.get(upstream.base_url.removesuffix("/v1") + "/__control", timeout=10).json()["last_body"]


def test_completions_default_to_16_tokens_and_the_upstream_is_told(gw, upstream):
    assert CompletionRequest.model_validate({"model": "m", "prompt": "a"}).output_limit == 16
    assert CompletionRequest.model_validate({"model": "m", "prompt": "a", "max_tokens": None}).output_limit == 16
    client = openai.OpenAI(base_url=f"{gw.base}/v1", api_key=KEY, max_retries=0)
    client.completions.create(model="m", prompt="Once upon a time")
    assert _last_body(upstream)["max_tokens"] == 16
    client.completions.create(model="m", prompt="Once upon a time", max_tokens=40)
    assert _last_body(upstream)["max_tokens"] == 40
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert "max_tokens" not in _last_body(upstream)          # chat has no such default


def test_n_up_to_128_and_top_p_0_are_accepted(gw):
    client = openai.OpenAI(base_url=f"{gw.base}/v1", api_key=KEY, max_retries=0)
    answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], n=128,
                                            max_tokens=2, top_p=0)
    assert len(answer.choices) == 128
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], n=129)
    assert info.value.body["param"] == "n"


def test_model_cards_have_a_creation_time(gw):
    client = openai.OpenAI(base_url=f"{gw.base}/v1", api_key=KEY, max_retries=0)
    cards = client.models.list().data
    assert cards and all(0 < card.created <= time.time() for card in cards)
    assert client.models.retrieve("m").created == cards[0].created


@pytest.mark.parametrize("method, path, auth, status", [
    ("GET", "/v1/models", True, 200),
    ("GET", "/v1/models", False, 401),
    ("GET", "/v1/models/m", True, 200),
    ("GET", "/v1/models/nope", True, 404),
    ("GET", "/v1/nothing", True, 404),
    ("GET", "/v1/chat/completions", True, 405),
    ("GET", "/healthz", False, 200),
    ("POST", "/tokenize", True, 400),
])
def test_every_response_carries_a_request_id(gw, method, path, auth, status):
    headers = {"authorization": f"Bearer {KEY}"} if auth else {}
    resp = httpx.request(method, gw.base + path, headers=headers, timeout=10, content=b"{}")
    assert resp.status_code == status
    assert len(resp.headers.get("x-request-id", "")) == 32
    assert resp.headers.get_list("x-request-id") == [resp.headers["x-request-id"]]


def test_the_sdk_reads_an_error_s_request_id(gw):
    client = openai.OpenAI(base_url=f"{gw.base}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("nope")
    assert info.value.request_id
