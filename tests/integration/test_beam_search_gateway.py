"""vLLM's `use_beam_search` on an embedded tier, over real HTTP with the official openai client.
The beams equal transformers' beam search over the same weights (fp32, `generate(num_beams=n)`),
best first; streamed answers equal whole ones; usage counts every token the search generated;
fields that would shape sampling are a 400 naming them. The tier is the tiny byte-level Llama."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch
from transformers import GenerationConfig

from tests.gateway_harness import start_byte_gateway

PROMPT = "The cat sat"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    # Every stream here is a beam search, which has no time to first token: a breaker that counts
    # any measured TTFT as slow must never open.
    slow = "limits: {breakers: {default: {min_calls: 1, slow_ttft_s: 0.000001, slow_rate: 0.5}}}\n"
    gw, tok, hf = start_byte_gateway(tmp_path_factory.mktemp("beam-gw"), seed=7, sections=slow)
    yield gw, tok, hf
    gw.stop()


@pytest.fixture(scope="module")
def client(setup):
    return openai.OpenAI(base_url=f"{setup[0].base}/v1", api_key="unused", max_retries=0)


def _beams(client, n, max_tokens, **extra):
    return client.completions.create(model="bytes", prompt=PROMPT, n=n, max_tokens=max_tokens,
                                     extra_body={"use_beam_search": True, **extra})


def _transformers_beams(setup, ids, n, max_tokens, **config) -> list[str]:
    _, tok, hf = setup
    cfg = GenerationConfig(num_beams=n, num_return_sequences=n, do_sample=False, max_new_tokens=max_tokens,
                           pad_token_id=0, early_stopping=False, **config)
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), generation_config=cfg)
    return [tok.decode(seq[len(ids):].tolist()) for seq in out]


@pytest.mark.parametrize("n", [1, 3])
def test_the_beams_are_transformers_beams(setup, client, n):
    ids = setup[1].encode(PROMPT).ids
    out = _beams(client, n, 5, ignore_eos=True)
    assert [c.text for c in sorted(out.choices, key=lambda c: c.index)] == \
        _transformers_beams(setup, ids, n, 5, eos_token_id=None)
    assert all(c.finish_reason == "length" for c in out.choices)
    # One engine call on the prompt, then one per live beam per step: 1 + 4n tokens generated, and
    # every later call's prompt (11-15 tokens, less than a cache block) prefilled again.
    assert out.usage.completion_tokens == 1 + 4 * n
    assert out.usage.prompt_tokens == len(ids) + n * sum(len(ids) + k for k in range(1, 5))


def _likeliest_printable(setup, ids) -> tuple[int, str]:
    """The token the model finds likeliest after `ids` among those that print one ASCII character."""
    _, tok, hf = setup
    with torch.no_grad():
        order = hf(torch.tensor([ids])).logits[0, -1].argsort(descending=True).tolist()
    for token in order:
        text = tok.decode([token])
        if len(text) == 1 and text.isprintable() and text.isascii():
            return token, text
    raise AssertionError("no printable token")


def test_a_stop_token_ends_its_beam_and_is_not_shown(setup, client):
    ids = setup[1].encode(PROMPT).ids
    stop, char = _likeliest_printable(setup, ids)
    out = _beams(client, 3, 6, stop_token_ids=[stop])
    assert not any(char in c.text for c in out.choices)       # every beam that picked it ended there


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_a_beam_stopping_on_the_likeliest_token_scores_best(setup, client, ignore_eos):
    # ignore_eos ignores the model's EOS alone: stop_token_ids still end beams.
    ids = setup[1].encode(PROMPT).ids
    stop = _likeliest_token(setup, ids)
    first = sorted(_beams(client, 3, 1, stop_token_ids=[stop], ignore_eos=ignore_eos).choices, key=lambda c: c.index)
    assert (first[0].text, first[0].finish_reason) == ("", "stop")
    assert all(c.finish_reason == "length" and c.text for c in first[1:])


def _likeliest_token(setup, ids) -> int:
    with torch.no_grad():
        return int(setup[2](torch.tensor([ids])).logits[0, -1].argmax())


def test_chat_beams_stream_as_they_answer(client):
    args = {"model": "bytes", "messages": [{"role": "user", "content": "Hi"}], "n": 2, "max_tokens": 4,
            "extra_body": {"use_beam_search": True, "ignore_eos": True}}
    whole = client.chat.completions.create(**args)
    texts = {c.index: c.message.content for c in whole.choices}
    assert len(texts) == 2 and texts[0] != texts[1]
    streamed = {0: "", 1: ""}
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args))
    for chunk in chunks[:-1]:
        streamed[chunk.choices[0].index] += chunk.choices[0].delta.content or ""
    assert streamed == texts
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 1 + 3 * 2


def test_a_streamed_beam_search_is_not_a_slow_first_token(setup, client):
    args = {"model": "bytes", "prompt": PROMPT, "n": 2, "max_tokens": 3, "stream": True,
            "extra_body": {"use_beam_search": True, "ignore_eos": True}}
    for _ in range(3):
        assert len([c for c in client.completions.create(**args) if c.choices]) == 2
    assert httpx.post(f"{setup[0].base}/v1/completions", timeout=60,
                      json={"model": "bytes", "prompt": PROMPT, "max_tokens": 2}).status_code == 200


def test_length_penalty_is_honoured_with_beam_search_only(setup, client):
    ids = setup[1].encode(PROMPT).ids
    out = _beams(client, 3, 6, length_penalty=2.0, ignore_eos=True)
    assert [c.text for c in sorted(out.choices, key=lambda c: c.index)] == \
        _transformers_beams(setup, ids, 3, 6, eos_token_id=None, length_penalty=2.0)
    alone = httpx.post(f"{setup[0].base}/v1/completions", timeout=60,
                       json={"model": "bytes", "prompt": PROMPT, "length_penalty": 2.0})
    assert alone.status_code == 400 and alone.json()["error"]["param"] == "length_penalty"


@pytest.mark.parametrize("field,value", [("temperature", 0.7), ("top_p", 0.5), ("logprobs", 2), ("logprobs", 0),
                                         ("n", 11), ("length_penalty", 2000.0), ("length_penalty", -11),
                                         ("stop", ["x"]), ("logit_bias", {"65": 5}), ("echo", True),
                                         ("guided_regex", "[a-z]+"), ("min_tokens", 2)])
def test_what_beam_search_cannot_honour_is_a_400(setup, field, value):
    body = {"model": "bytes", "prompt": PROMPT, "max_tokens": 3, "use_beam_search": True, field: value}
    response = httpx.post(f"{setup[0].base}/v1/completions", timeout=60, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field


def test_beam_search_at_the_neutral_sampling_values(client):
    out = _beams(client, 2, 3, temperature=0, ignore_eos=True)
    assert len(out.choices) == 2
