"""Prompt logprobs on an embedded tier, over real HTTP with the official openai client.
Completions' `echo`: the prompt leads each choice's text, and with `logprobs` its tokens lead the
logprobs with their logprobs under the model (transformers' over the prompt, the first token's
null), streamed or not, from a text or token-id prompt, cached or not. vLLM's `prompt_logprobs`:
per prompt token its logprob and rank and the top alternatives, in completions' choices and
beside a chat's. The tier is the tiny byte-level Llama."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch

from tests.gateway_harness import start_byte_gateway

PROMPT = "The cat sat on"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    gw, tok, hf = start_byte_gateway(tmp_path_factory.mktemp("echo-gw"), seed=4)
    yield gw, tok, hf
    gw.stop()


@pytest.fixture(scope="module")
def client(setup):
    return openai.OpenAI(base_url=f"{setup[0].base}/v1", api_key="unused", max_retries=0)


def _complete(client, prompt=PROMPT, **kwargs):
    args = {"model": "bytes", "prompt": prompt, "max_tokens": 4, "temperature": 0, **kwargs}
    return client.completions.create(**args)


def _expected(hf, ids):
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)


def test_echo_puts_the_prompt_before_the_completion(client):
    plain = _complete(client).choices[0]
    echoed = _complete(client, echo=True).choices[0]
    assert echoed.text == PROMPT + plain.text and echoed.logprobs is None


def test_echo_with_logprobs_scores_every_prompt_token(setup, client):
    _, tok, hf = setup
    ids = tok.encode(PROMPT).ids
    plain_choice = _complete(client, logprobs=2).choices[0]
    plain, plain_text = plain_choice.logprobs, plain_choice.text
    lp = _complete(client, echo=True, logprobs=2).choices[0].logprobs
    n = len(ids)
    assert lp.tokens[:n] == list(PROMPT) and lp.tokens[n:] == plain.tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    expected = _expected(hf, ids)
    assert lp.token_logprobs[1:n] == pytest.approx([float(expected[p - 1, ids[p]]) for p in range(1, n)], abs=1e-4)
    for p in range(1, n):
        values, order = expected[p - 1].topk(2)
        top = {}
        for t, value in zip(order.tolist(), values.tolist()):   # of alternatives that read alike, the likeliest
            top.setdefault(tok.decode([t], skip_special_tokens=False), value)
        top.setdefault(lp.tokens[p], float(expected[p - 1, ids[p]]))     # the token itself is always there
        assert lp.top_logprobs[p] == pytest.approx(top, abs=1e-4)
    assert lp.token_logprobs[n:] == pytest.approx(plain.token_logprobs, abs=1e-5)
    # Offsets index the text: the prompt's ASCII one character per token, then the answer's
    # (whose byte tokens may complete no character, or one, each: test_prompt_controls_gateway.py),
    # never past its end.
    offsets = lp.text_offset
    assert offsets[:n + 1] == list(range(n + 1)) and offsets == sorted(offsets)
    assert offsets[-1] <= len(PROMPT + plain_text)


def test_a_cached_prompt_still_gets_its_logprobs(setup, client):
    _complete(client, prompt=PROMPT * 4)                       # the prompt's blocks are cached now
    lp = _complete(client, prompt=PROMPT * 4, echo=True, logprobs=0).choices[0].logprobs
    ids = setup[1].encode(PROMPT * 4).ids
    expected = _expected(setup[2], ids)
    assert lp.token_logprobs[1:len(ids)] == pytest.approx([float(expected[p - 1, ids[p]]) for p in range(1, len(ids))],
                                                          abs=1e-4)


def test_streamed_echo_equals_the_whole_answer(client):
    whole = _complete(client, echo=True, logprobs=1, n=2, seed=3, temperature=0.8)
    chunks = list(_complete(client, echo=True, logprobs=1, n=2, seed=3, temperature=0.8, stream=True))
    for choice in whole.choices:
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == choice.index]
        assert "".join(c.text for c in mine) == choice.text and choice.text.startswith(PROMPT)
        assert [t for c in mine if c.logprobs for t in c.logprobs.tokens] == choice.logprobs.tokens
        streamed = [v for c in mine if c.logprobs for v in c.logprobs.token_logprobs]
        assert streamed[0] is None and choice.logprobs.token_logprobs[0] is None
        assert streamed[1:] == pytest.approx(choice.logprobs.token_logprobs[1:], abs=1e-4)
        n = len(PROMPT)        # the prompt's offsets; later ones follow each stream's own text
        assert [o for c in mine if c.logprobs for o in c.logprobs.text_offset][:n] == choice.logprobs.text_offset[:n]


def test_each_prompt_echoes_its_own_text(setup, client):
    ids = setup[1].encode("dog").ids
    out = _complete(client, prompt=[ids, ids[:1]], echo=True)
    texts = {c.index: c.text for c in out.choices}
    assert texts[0].startswith("dog") and texts[1].startswith("d") and not texts[1].startswith("dog")


def test_vllm_prompt_logprobs_in_a_completion(setup, client):
    _, tok, hf = setup
    ids = tok.encode(PROMPT).ids
    out = _complete(client, extra_body={"prompt_logprobs": 2}).choices[0]
    plp = out.prompt_logprobs
    assert len(plp) == len(ids) and plp[0] is None
    expected = _expected(hf, ids)
    for p in range(1, len(ids)):
        row = expected[p - 1]
        mine = plp[p][str(ids[p])]
        assert mine["logprob"] == pytest.approx(float(row[ids[p]]), abs=1e-4)
        assert mine["rank"] == int((row > row[ids[p]]).sum()) + 1 and mine["decoded_token"] == PROMPT[p]
        by_rank = sorted(plp[p].values(), key=lambda v: v["rank"])
        assert [v["rank"] for v in by_rank[:2]] == [1, 2]
        assert [v["logprob"] for v in by_rank[:2]] == pytest.approx(row.topk(2).values.tolist(), abs=1e-4)
        assert len(plp[p]) == (2 if mine["rank"] <= 2 else 3)


def test_vllm_prompt_logprobs_beside_a_chat(client):
    out = client.chat.completions.create(model="bytes", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                         extra_body={"prompt_logprobs": 0})
    plp = out.prompt_logprobs
    assert len(plp) == out.usage.prompt_tokens and plp[0] is None
    assert all(len(entry) == 1 and next(iter(entry.values()))["rank"] >= 1 for entry in plp[1:])


@pytest.mark.parametrize("path,body", [("completions", {"prompt": PROMPT}),
                                       ("chat/completions", {"messages": [{"role": "user", "content": "hi"}]})])
def test_vllm_prompt_logprobs_with_stream_is_a_400(setup, path, body):
    response = httpx.post(f"{setup[0].base}/v1/{path}", timeout=60,
                          json={"model": "bytes", "stream": True, "prompt_logprobs": 1, **body})
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt_logprobs"


def test_echo_and_prompt_logprobs_keep_their_own_counts(setup, client):
    ids = setup[1].encode(PROMPT).ids
    out = _complete(client, echo=True, logprobs=1, extra_body={"prompt_logprobs": 3}).choices[0]
    # the likeliest token, and the token itself where it is another
    assert all(len(top) == 1 + (tok != max(top, key=top.get))
               for tok, top in zip(out.logprobs.tokens[1:], out.logprobs.top_logprobs[1:]))
    assert all(len(entry) in (3, 4) for entry in out.prompt_logprobs[1:]) and len(out.prompt_logprobs) == len(ids)


@pytest.mark.parametrize("stream", [False, True])
def test_choices_of_one_prompt_share_its_scores(client, stream):
    """The prompt is scored for the first choice only; every choice carries the same echo."""
    kwargs = dict(echo=True, logprobs=1, n=3, seed=5, temperature=1.0, stream=stream)
    if stream:
        per = {}
        for chunk in _complete(client, **kwargs):
            for c in chunk.choices:
                got = per.setdefault(c.index, ([], []))
                got[0].append(c.text)
                if c.logprobs:
                    got[1].extend(c.logprobs.token_logprobs)
        texts = {i: "".join(t) for i, (t, _) in per.items()}
        values = {i: v for i, (_, v) in per.items()}
    else:
        out = _complete(client, **kwargs)
        texts = {c.index: c.text for c in out.choices}
        values = {c.index: c.logprobs.token_logprobs for c in out.choices}
    assert sorted(texts) == [0, 1, 2] and all(t.startswith(PROMPT) for t in texts.values())
    n = len(PROMPT)
    assert values[0][:n] == values[1][:n] == values[2][:n] and values[0][0] is None


def test_a_loglikelihood_batch_as_lm_evaluation_harness_sends_it(setup):
    """lm-evaluation-harness' local-completions: token-id prompts (context + continuation) in one
    request, max_tokens 1, logprobs 1, echo; it sums token_logprobs[ctxlen:-1] and calls the
    continuation greedy when each token is its position's top alternative."""
    _, tok, hf = setup
    pairs = [("The cat sat", " on the mat"), ("Two plus two is", " four")]
    prompts = [tok.encode(c + x).ids for c, x in pairs]
    response = httpx.post(f"{setup[0].base}/v1/completions", timeout=60, json={
        "model": "bytes", "prompt": prompts, "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234,
        "echo": True})
    assert response.status_code == 200, response.text
    for choice in sorted(response.json()["choices"], key=lambda c: c["index"]):
        ids, (context, _) = prompts[choice["index"]], pairs[choice["index"]]
        ctxlen = len(tok.encode(context).ids)
        expected = _expected(hf, ids)
        continuation = [float(expected[p - 1, ids[p]]) for p in range(ctxlen, len(ids))]
        lps = choice["logprobs"]
        assert sum(lps["token_logprobs"][ctxlen:-1]) == pytest.approx(sum(continuation), abs=1e-3)
        greedy = all(int(expected[p - 1].argmax()) == ids[p] for p in range(ctxlen, len(ids)))
        assert all(t == max(top.values()) for t, top in zip(lps["token_logprobs"][ctxlen:-1],
                                                           lps["top_logprobs"][ctxlen:-1])) == greedy


@pytest.mark.parametrize("stream", [False, True])
def test_a_sampled_token_is_always_among_its_top_logprobs(client, stream):
    """Completions' `logprobs: k` gives the k likeliest tokens and the sampled one (up to k + 1),
    as OpenAI's legacy API and vLLM do; at temperature 1.5 most sampled tokens are not the likeliest.
    Tokens are named by id: the byte vocabulary's lone bytes all read as U+FFFD in text."""
    out = _complete(client, logprobs=1, temperature=1.5, seed=7, max_tokens=24, stream=stream,
                    extra_body={"return_tokens_as_token_ids": True})
    if stream:
        pairs = [(t, v, top) for chunk in out for c in chunk.choices if c.logprobs
                 for t, v, top in zip(c.logprobs.tokens, c.logprobs.token_logprobs, c.logprobs.top_logprobs)]
    else:
        lp = out.choices[0].logprobs
        pairs = list(zip(lp.tokens, lp.token_logprobs, lp.top_logprobs))
    assert len(pairs) == 24
    assert all(top[token] == pytest.approx(value) and len(top) <= 2 for token, value, top in pairs)
    assert any(len(top) == 2 for _, _, top in pairs)          # sampled below the likeliest at least once
