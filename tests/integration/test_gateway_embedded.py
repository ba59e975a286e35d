"""The gateway over real HTTP on the real model (fp32), with the official openai client:
answers equal the engine's own, streaming, n, seed, stop, logprobs, errors, and a client
that leaves mid-stream freeing its KV blocks."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from engines.engine_config import EngineConfig
from engines.llm_engine import LLMEngine
from engines.sampling_params import SamplingParams
from tests.gateway_harness import shared, start_embedded_gateway

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def gw(request, tmp_path_factory):
    return shared(request, "embedded-gateway", lambda: start_embedded_gateway(tmp_path_factory.mktemp("emb")))


@pytest.fixture(scope="module")
def client(gw):
    return openai.OpenAI(base_url=f"{gw.base}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(real_fp32):
    """Greedy text straight from an engine on the same weights: what the gateway must return."""
    engine = LLMEngine(real_fp32, EngineConfig(kv_cache_memory_bytes=64 * 2**20, max_model_len=512,
                                                max_num_seqs=16, max_num_batched_tokens=512))

    def answer(messages, max_tokens):
        ids = real_fp32.tokenizer.encode(real_fp32.chat_template.render(messages))
        out = engine.generate([ids], SamplingParams(max_tokens=max_tokens, temperature=0.0))[0]
        eos = real_fp32.tokenizer.eos_token_ids
        return real_fp32.tokenizer.decode([t for t in out if t not in eos]), len(ids)
    return answer


def test_chat_equals_the_engine_answer(client, reference):
    expected, prompt_len = reference(QUESTION, 24)
    resp = client.chat.completions.create(model="smol", messages=QUESTION, temperature=0, max_tokens=24)
    assert resp.choices[0].message.content == expected and "Paris" in expected
    assert resp.usage.prompt_tokens == prompt_len
    assert resp.object == "chat.completion" and resp.model == "smol"


def test_top_p_0_samples_the_likeliest_token_only(client, reference):
    """OpenAI's top_p range starts at 0: the nucleus then holds the likeliest token alone, so a
    sampled answer at temperature 1 is the greedy one."""
    expected, _ = reference(QUESTION, 12)
    for seed in (1, 2):
        resp = client.chat.completions.create(model="smol", messages=QUESTION, temperature=1, top_p=0, seed=seed,
                                              max_tokens=12)
        assert resp.choices[0].message.content == expected


def test_stream_concatenates_to_the_same_answer(client, reference):
    expected, prompt_len = reference(QUESTION, 24)
    chunks = list(client.chat.completions.create(model="smol", messages=QUESTION, temperature=0, max_tokens=24,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == prompt_len
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_with_n_choices(client):
    chunks = list(client.chat.completions.create(model="smol", messages=QUESTION, temperature=0.8, seed=7, n=2,
                                                 max_tokens=12, stream=True))
    texts = {0: "", 1: ""}
    finished = set()
    for chunk in chunks:
        choice = chunk.choices[0]
        texts[choice.index] += choice.delta.content or ""
        if choice.finish_reason:
            finished.add(choice.index)
    whole = client.chat.completions.create(model="smol", messages=QUESTION, temperature=0.8, seed=7, n=2,
                                           max_tokens=12)
    assert finished == {0, 1}
    assert [texts[0], texts[1]] == [c.message.content for c in whole.choices]   # same seeds, same answers


async def test_async_client_concurrent_requests(gw, reference):
    client = openai.AsyncOpenAI(base_url=f"{gw.base}/v1", api_key="unused", max_retries=0)
    questions = [[{"role": "user", "content": f"Name a colour that starts with the letter {c}."}] for c in "BGRY"]
    answers = await asyncio.gather(*(client.chat.completions.create(model="smol", messages=q, temperature=0,
                                                                    max_tokens=12) for q in questions))
    await client.close()
    assert [a.choices[0].message.content for a in answers] == [reference(q, 12)[0] for q in questions]


def test_n_and_seed(client):
    kw = {"model": "smol", "messages": QUESTION, "temperature": 1.0, "max_tokens": 16, "seed": 1234, "logprobs": True}
    first = client.chat.completions.create(n=3, **kw)
    again = client.chat.completions.create(n=3, **kw)
    single = client.chat.completions.create(n=1, **kw)
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in again.choices]       # seeded: reproducible
    assert len(set(texts)) > 1                                        # distinct seeds per choice
    assert single.choices[0].message.content == texts[0]              # choice 0 keeps the request's seed
    assert first.usage.completion_tokens == sum(len(c.logprobs.content) for c in first.choices)
    assert first.usage.prompt_tokens == single.usage.prompt_tokens    # one prompt, counted once


def test_stop_and_length(client):
    resp = client.chat.completions.create(model="smol", messages=QUESTION, temperature=0, max_tokens=24,
                                          stop=["Paris"])
    assert "Paris" not in resp.choices[0].message.content and resp.choices[0].finish_reason == "stop"
    resp = client.chat.completions.create(model="smol", messages=QUESTION, temperature=0, max_completion_tokens=3)
    assert resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == 3


def test_chat_logprobs(client):
    resp = client.chat.completions.create(model="smol", messages=QUESTION, temperature=0, max_tokens=8,
                                          logprobs=True, top_logprobs=3)
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens
    for tok in content:
        assert len(tok.top_logprobs) == 3 and tok.logprob <= 0
        assert tok.top_logprobs[0].logprob == pytest.approx(tok.logprob)   # greedy took the best token
        assert tok.top_logprobs[0].token == tok.token
    text = bytes(b for tok in content for b in tok.bytes).decode()
    assert text.startswith(resp.choices[0].message.content)


def test_completions_endpoint_with_logprobs(client):
    resp = client.completions.create(model="smol", prompt="The capital of France is", temperature=0, max_tokens=4,
                                     logprobs=2)
    lp = resp.choices[0].logprobs
    assert resp.object == "text_completion" and resp.choices[0].text.startswith(" Paris")
    assert "".join(lp.tokens) == resp.choices[0].text and len(lp.token_logprobs) == 4
    assert all(len(top) == 2 for top in lp.top_logprobs)
    two = client.completions.create(model="smol", prompt=["One, two,", "Red, green,"], temperature=0, max_tokens=3)
    assert [c.index for c in two.choices] == [0, 1] and two.choices[0].text != two.choices[1].text


def test_context_and_unsupported_errors(client):
    long = [{"role": "user", "content": "word " * 600}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="smol", messages=long, max_tokens=4)
    assert info.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="smol", messages=QUESTION, max_tokens=10_000)
    assert info.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as info:   # a tool result's call id is a string
        client.chat.completions.create(model="smol", messages=[*QUESTION, {"role": "tool", "content": "42",
                                                                           "tool_call_id": 42}],
                                       tools=[{"type": "function", "function": {"name": "f",
                                                                                "parameters": {"type": "object"}}}])
    assert info.value.body["param"] == "messages[1].tool_call_id"


def test_client_leaving_mid_stream_frees_kv_blocks(gw):
    engine = gw.runtime.tiers["smol"].engine.engine
    assert engine.block_manager.num_used_blocks == 0
    body = {"model": "smol", "messages": QUESTION, "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{gw.base}/v1/chat/completions", json=body, timeout=60) as resp:
        seen = 0
        for line in resp.iter_lines():
            seen += line.startswith("data: ")
            if seen == 5:
                break
        assert engine.block_manager.num_used_blocks > 0      # the request holds KV while it runs
    _assert_aborted(engine)


def test_client_leaving_before_a_plain_answer_frees_kv_blocks(gw):
    engine = gw.runtime.tiers["smol"].engine.engine
    body = {"model": "smol", "messages": QUESTION, "max_tokens": 400, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gw.base}/v1/chat/completions", json=body, timeout=httpx.Timeout(10, read=1.0))
    _assert_aborted(engine)


def _assert_aborted(engine) -> None:
    """The gone client's request leaves the engine with its KV blocks, and nothing decodes for it."""
    deadline = time.time() + 120
    while (engine.block_manager.num_used_blocks or engine.num_requests) and time.time() < deadline:
        time.sleep(0.02)
    assert engine.num_requests == 0 and engine.block_manager.num_used_blocks == 0
    # With no request left the engine has nothing to step: whatever the machine's speed, no
    # token is generated from here on (a request still decoding would add ~1 token per step).
    generated = engine.stats.generated_tokens
    assert not engine.has_unfinished()
    time.sleep(0.3)
    assert engine.stats.generated_tokens == generated


def test_beam_search_equals_transformers_on_the_real_model(client, hf_reference, hf_tokenizer):
    """vLLM's use_beam_search: the three best beams of 8 tokens, as transformers' num_beams finds them."""
    import torch
    from transformers import GenerationConfig

    prompt = "The three primary colours are"
    ids = hf_tokenizer(prompt, return_tensors="pt").input_ids
    cfg = GenerationConfig(num_beams=3, num_return_sequences=3, do_sample=False, max_new_tokens=8,
                           eos_token_id=None, pad_token_id=0, early_stopping=False)
    with torch.no_grad():
        expected = [hf_tokenizer.decode(s[ids.shape[1]:]) for s in hf_reference.generate(ids, generation_config=cfg)]
    out = client.completions.create(model="smol", prompt=prompt, n=3, max_tokens=8,
                                    extra_body={"use_beam_search": True, "ignore_eos": True})
    assert [c.text for c in sorted(out.choices, key=lambda c: c.index)] == expected


def test_a_prefilled_answer_is_continued(client):
    messages = QUESTION + [{"role": "assistant", "content": "The capital of France is"}]
    resp = client.chat.completions.create(model="smol", messages=messages, temperature=0, max_tokens=8,
                                          extra_body={"continue_final_message": True, "add_generation_prompt": False,
                                                      "echo": True})
    text = resp.choices[0].message.content
    assert text.startswith("The capital of France is") and "Paris" in text
