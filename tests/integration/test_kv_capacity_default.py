"""A tier whose KV cache holds fewer tokens for one request than its context (a small
`kv_cache_memory` beside a long `max_model_len`): a request without max_tokens runs to that
capacity and ends with `length`, as one with max_tokens inside it does, instead of being refused
for a default it did not choose; a max_tokens past the capacity is still a 400 naming it. Real
HTTP with the official openai client, the tiny byte-level Llama (8 KiB of fp32 KV per block of
16 tokens: 64 KiB is 8 blocks, one kept as headroom, so 112 tokens for a request)."""

from __future__ import annotations

import openai
import pytest

from tests.gateway_harness import start_byte_gateway

CAPACITY = 7 * 16


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    gw, _, _ = start_byte_gateway(tmp_path_factory.mktemp("kv-capacity"), seed=5, max_model_len=256,
                                  kv_cache_memory="64KiB")
    yield openai.OpenAI(base_url=f"{gw.base}/v1", api_key="unused", max_retries=0)
    gw.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_no_max_tokens_runs_to_the_kv_capacity(client, stream):
    kw = dict(model="bytes", messages=[{"role": "user", "content": "hi"}], temperature=0,
              extra_body={"ignore_eos": True})
    if stream:
        chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
        usage, reason = chunks[-1].usage, [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        answer = client.chat.completions.create(**kw)
        usage, reason = answer.usage, answer.choices[0].finish_reason
    assert reason == "length" and usage.total_tokens == CAPACITY


def test_max_tokens_past_the_capacity_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="bytes", messages=[{"role": "user", "content": "hi"}], max_tokens=200)
    assert caught.value.code == "context_length_exceeded" and "KV cache" in caught.value.body["message"]
