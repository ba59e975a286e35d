"""Usage in a stream from an embedded tier, over real HTTP with the official openai client:
OpenAI's `include_usage` (one closing usage chunk) and vLLM's `continuous_usage_stats` (every
chunk carries the usage so far). The tier is the tiny byte-level Llama."""

from __future__ import annotations

import openai
import pytest

from tests.gateway_harness import start_byte_gateway

ASKED = [{"role": "user", "content": "Answer."}]
RUNNING = {"include_usage": True, "continuous_usage_stats": True}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    gw, _, _ = start_byte_gateway(tmp_path_factory.mktemp("stream-usage-gw"), seed=6)
    yield openai.OpenAI(base_url=f"{gw.base}/v1", api_key="unused", max_retries=0)
    gw.stop()


def _chat_chunks(client, options, n=1):
    return list(client.chat.completions.create(model="bytes", messages=ASKED, max_tokens=8, temperature=0, n=n,
                                               stream=True, stream_options=options, extra_body={"ignore_eos": True}))


@pytest.mark.parametrize("n", [1, 2])
def test_every_chat_chunk_carries_its_choices_usage_so_far(client, n):
    """vLLM's numbers: a chunk of choice i carries its prompt's tokens and the tokens choice i has
    generated so far; the closing chunk, the whole request's."""
    closing = _chat_chunks(client, {"include_usage": True}, n)[-1].usage
    chunks = _chat_chunks(client, RUNNING, n)
    last = chunks[-1].usage        # (its cached tokens differ: the second run finds the prompt cached)
    assert chunks[-1].choices == [] and (last.prompt_tokens, last.completion_tokens) == \
        (closing.prompt_tokens, closing.completion_tokens)
    assert closing.completion_tokens == 8 * n
    for index in range(n):
        running = [c.usage for c in chunks[:-1] if c.choices[0].index == index]
        assert all(u is not None and u.prompt_tokens == closing.prompt_tokens for u in running)
        done = [u.completion_tokens for u in running]
        assert done == sorted(done) and done[-1] == 8


def test_every_completion_chunk_carries_the_usage_so_far(client):
    chunks = list(client.completions.create(model="bytes", prompt="The cat", max_tokens=5, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True}, stream_options=RUNNING))
    done = [c.usage.completion_tokens for c in chunks[:-1]]
    assert done == sorted(done) and 1 <= done[0] and done[-1] == 5
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5


def test_without_continuous_stats_only_the_closing_chunk_has_usage(client):
    chunks = _chat_chunks(client, {"include_usage": True, "continuous_usage_stats": False})
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].usage is not None
