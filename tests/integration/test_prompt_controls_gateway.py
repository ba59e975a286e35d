"""vLLM's prompt controls on an embedded tier, over real HTTP with the official openai client:
`truncate_prompt_tokens` (the prompt's last tokens run), the chat template's
`add_generation_prompt`, `continue_final_message` and `chat_template_kwargs`, chat `echo`, and
`return_tokens_as_token_ids`. Each is checked against the same model given the equivalent plain
request (greedy, so equal outputs mean equal prompts). The tier is the tiny byte-level Llama with
the engine's ChatML template."""

from __future__ import annotations

import re

import httpx
import openai
import pytest

from tests.gateway_harness import start_byte_gateway

PROMPT = "The cat sat on the mat"
ASKED = [{"role": "user", "content": "Answer."}]
PREFILLED = ASKED + [{"role": "assistant", "content": "ab"}]
ASKED_TEXT = "<|im_start|>user\nAnswer.<|im_end|>\n"
CONTEXT = 256


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prompt-controls-gw")
    # The same model speculating with n-gram lookup, which drafts from a predicted output. Always
    # k drafts: adaptive k weighs measured draft and step times, and on a busy machine may draft
    # nothing, which these tests do not ask about.
    spec = (f"  speculating: {{model: '{tmp / 'bytes'}', dtype: float32, max_model_len: {CONTEXT}, kv_cache_memory: 4MiB,"
            f" max_num_seqs: 8, max_num_batched_tokens: 256,"
            f" speculative: {{method: ngram, num_tokens: 4, adaptive: false}}}}\n")
    gw, tok, hf = start_byte_gateway(tmp, seed=5, max_model_len=CONTEXT, tiers=spec,
                                     models="  speculating: {chain: [speculating]}\n")
    yield gw, tok
    gw.stop()


@pytest.fixture(scope="module")
def client(setup):
    return openai.OpenAI(base_url=f"{setup[0].base}/v1", api_key="unused", max_retries=0)


def _complete(client, prompt=PROMPT, **extra):
    return client.completions.create(model="bytes", prompt=prompt, max_tokens=6, temperature=0, extra_body=extra)


def _chat(client, messages=ASKED, **extra):
    return client.chat.completions.create(model="bytes", messages=messages, max_tokens=6, temperature=0,
                                          extra_body=extra)


def _post(setup, path, body):
    defaults = {"model": "bytes", "max_tokens": 4}
    defaults.update({"messages": ASKED} if path == "chat/completions" else {"prompt": PROMPT})
    return httpx.post(f"{setup[0].base}/v1/{path}", timeout=60, json={**defaults, **body})


# ---- truncate_prompt_tokens ------------------------------------------------------------------
def test_a_truncated_prompt_runs_its_last_tokens(setup, client):
    ids = setup[1].encode(PROMPT).ids
    cut = _complete(client, truncate_prompt_tokens=6)
    same = _complete(client, prompt=ids[-6:])
    assert cut.usage.prompt_tokens == 6
    assert cut.choices[0].text == same.choices[0].text
    assert _complete(client, truncate_prompt_tokens=len(ids) + 5).usage.prompt_tokens == len(ids)


def test_a_truncated_prompt_echoes_what_ran(setup, client):
    cut = _complete(client, truncate_prompt_tokens=6, echo=True, logprobs=1).choices[0]
    plain = _complete(client, prompt=PROMPT[-6:], echo=True, logprobs=1).choices[0]
    assert cut.text.startswith(PROMPT[-6:]) and not cut.text.startswith(PROMPT)
    assert cut.text == plain.text and cut.logprobs.tokens == plain.logprobs.tokens
    assert cut.logprobs.token_logprobs[0] is None and len(cut.logprobs.tokens) == 6 + 6


def test_a_truncated_echo_keeps_special_tokens_in_line_with_its_offsets(setup, client):
    prompt = "Hi<|im_end|>\n<|im_start|>assistant\n"
    cut = _complete(client, prompt=prompt, truncate_prompt_tokens=13, echo=True, logprobs=0).choices[0]
    assert cut.text.startswith("<|im_end|>\n<|im_start|>assistant\n")
    lp = cut.logprobs
    assert lp.tokens[:2] == ["<|im_end|>", "\n"] and lp.text_offset[:3] == [0, 10, 11]
    assert all(cut.text[o:].startswith(t) for o, t in zip(lp.text_offset[:13], lp.tokens[:13]))


def test_a_truncated_chat_runs_the_templates_last_tokens(setup, client):
    rendered = setup[1].encode(ASKED_TEXT + "<|im_start|>assistant\n").ids
    cut = _chat(client, truncate_prompt_tokens=5)
    same = _complete(client, prompt=rendered[-5:])
    assert cut.usage.prompt_tokens == 5 and cut.choices[0].message.content == same.choices[0].text


def test_minus_one_keeps_what_the_context_holds(setup):
    long = "x" * (CONTEXT + 40)
    refused = _post(setup, "completions", {"prompt": long})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
    kept = _post(setup, "completions", {"prompt": long, "truncate_prompt_tokens": -1})
    assert kept.status_code == 200, kept.text
    assert kept.json()["usage"]["prompt_tokens"] == CONTEXT - 4


@pytest.mark.parametrize("value", [0, -2, "8"])
def test_a_truncation_that_keeps_nothing_or_is_no_count_is_a_400(setup, value):
    response = _post(setup, "completions", {"truncate_prompt_tokens": value})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "truncate_prompt_tokens"


# ---- the chat template's controls -------------------------------------------------------------
def test_without_a_generation_prompt_the_chat_ends_with_its_last_turn(setup, client):
    chat = _chat(client, add_generation_prompt=False)
    same = _complete(client, prompt=setup[1].encode(ASKED_TEXT).ids)
    assert chat.usage.prompt_tokens == same.usage.prompt_tokens
    assert chat.choices[0].message.content == same.choices[0].text


def test_a_continued_final_message_is_written_on(setup, client):
    chat = _chat(client, PREFILLED, continue_final_message=True, add_generation_prompt=False)
    same = _complete(client, prompt=setup[1].encode(ASKED_TEXT + "<|im_start|>assistant\nab").ids)
    assert chat.usage.prompt_tokens == same.usage.prompt_tokens
    assert chat.choices[0].message.content == same.choices[0].text
    closed = _chat(client, PREFILLED)      # the default closes the assistant's turn and opens a new one
    assert closed.usage.prompt_tokens > chat.usage.prompt_tokens


def test_continuing_while_opening_a_new_turn_is_a_400(setup):
    response = _post(setup, "chat/completions", {"messages": PREFILLED, "continue_final_message": True,
                                                 "add_generation_prompt": True})
    assert response.status_code == 400 and response.json()["error"]["param"] == "continue_final_message"


def test_template_variables_pass_but_cannot_replace_the_conversation(setup, client):
    # ChatML reads no variable of its own: an unknown one changes nothing.
    assert _chat(client, chat_template_kwargs={"enable_thinking": False}).choices[0].message.content == \
        _chat(client).choices[0].message.content
    for kwargs in ({"messages": []}, {"add_generation_prompt": False}, {"not a name": 1}):
        response = _post(setup, "chat/completions", {"chat_template_kwargs": kwargs})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "chat_template_kwargs"


# ---- chat echo --------------------------------------------------------------------------------
def test_chat_echo_leads_with_the_final_assistant_message(client):
    plain = _chat(client, PREFILLED, continue_final_message=True).choices[0].message.content
    echoed = _chat(client, PREFILLED, continue_final_message=True, echo=True).choices[0].message.content
    assert echoed == "ab" + plain
    # A final message that is not the assistant's is not echoed, unless no new turn is opened.
    assert _chat(client, echo=True).choices[0].message.content == _chat(client).choices[0].message.content
    open_turn = _chat(client, add_generation_prompt=False).choices[0].message.content
    assert _chat(client, add_generation_prompt=False, echo=True).choices[0].message.content == "Answer." + open_turn


def test_streamed_chat_echo_equals_the_whole_answer(client):
    whole = _chat(client, PREFILLED, continue_final_message=True, echo=True).choices[0].message.content
    stream = client.chat.completions.create(model="bytes", messages=PREFILLED, max_tokens=6, temperature=0,
                                            stream=True, extra_body={"continue_final_message": True, "echo": True})
    deltas = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert deltas[0].startswith("ab") and "".join(deltas) == whole


def test_chat_echo_with_tools_is_a_400(setup):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    response = _post(setup, "chat/completions", {"tools": tools, "echo": True})
    assert response.status_code == 400 and response.json()["error"]["param"] == "echo"


# ---- return_tokens_as_token_ids ---------------------------------------------------------------
def _ids(names: list[str]) -> list[int]:
    assert all(re.fullmatch(r"token_id:\d+", n) for n in names), names
    return [int(n.split(":")[1]) for n in names]


def test_completion_logprobs_name_tokens_by_id(setup, client):
    plain = _complete(client, logprobs=2).choices[0]
    named = _complete(client, logprobs=2, return_tokens_as_token_ids=True).choices[0]
    assert named.text == plain.text
    assert setup[1].decode(_ids(named.logprobs.tokens)) == named.text
    assert named.logprobs.token_logprobs == plain.logprobs.token_logprobs
    assert named.logprobs.text_offset == plain.logprobs.text_offset       # offsets still count text
    for top in named.logprobs.top_logprobs:
        assert len(_ids(list(top))) == 2


def _offsets_whole_and_streamed(client, **kw):
    whole = client.completions.create(model="bytes", prompt=PROMPT, temperature=0, logprobs=2, **kw).choices[0]
    streamed, text = [], ""
    for chunk in client.completions.create(model="bytes", prompt=PROMPT, temperature=0, logprobs=2, stream=True, **kw):
        if chunk.choices:
            text += chunk.choices[0].text
            if chunk.choices[0].logprobs:
                streamed += chunk.choices[0].logprobs.text_offset
    assert text == whole.text
    return whole, streamed


@pytest.mark.parametrize("constraint,stop", [({"allowed_token_ids": "az"}, ["zzzzq"]),
                                             ({"guided_regex": "(\u00e9|a)+"}, None)])
def test_text_offsets_index_the_text_streamed_or_whole(setup, client, constraint, stop):
    """Offsets count the characters a token's bytes complete before it: the same whole or
    streamed, with text held back for a possible stop string ("z..."), and with characters
    spread over several byte tokens (each byte is a token here, so "é" is two)."""
    if "allowed_token_ids" in constraint:
        constraint = {"allowed_token_ids": sorted(setup[1].encode(c).ids[0] for c in constraint["allowed_token_ids"])}
    whole, streamed = _offsets_whole_and_streamed(client, max_tokens=16, stop=stop,
                                                  extra_body={"ignore_eos": True, **constraint})
    offsets = whole.logprobs.text_offset
    assert streamed == offsets and len(offsets) == 16
    data = whole.text.encode()       # each byte one token; a character cut at the end is not in the text
    assert offsets == [len(data[:i].decode("utf-8", errors="ignore")) for i in range(16)]


def test_stop_reason_names_the_stop_string_or_token_as_vllm_does(setup, client):
    """vLLM's stop_reason: the stop string or stop token id that ended the choice, null for a
    length cut; on whole answers and on a stream's last chunk, chat and completions alike."""
    b = setup[1].token_to_id("b")
    forced = {"guided_regex": "aab[ab]*", "ignore_eos": True}
    cases = [({"stop": ["zz", "ab"]}, "ab"), ({"extra_body": {"stop_token_ids": [b]}}, b), ({"max_tokens": 2}, None)]
    for kw, expected in cases:
        extra = {**forced, **kw.pop("extra_body", {})}
        kw = {"max_tokens": 8, **kw}
        whole = client.completions.create(model="bytes", prompt=PROMPT, extra_body=extra, **kw).choices[0]
        last = [c for c in client.completions.create(model="bytes", prompt=PROMPT, stream=True, extra_body=extra, **kw)
                if c.choices][-1].choices[0]
        chat = client.chat.completions.create(model="bytes", messages=ASKED, extra_body=extra, **kw).choices[0]
        for choice in (whole, last, chat):
            assert choice.finish_reason == ("length" if expected is None else "stop")
            assert choice.model_extra["stop_reason"] == expected, (kw, choice)


def test_chat_logprobs_name_tokens_by_id(setup, client):
    out = client.chat.completions.create(model="bytes", messages=ASKED, max_tokens=6, temperature=0, logprobs=True,
                                         top_logprobs=1, extra_body={"return_tokens_as_token_ids": True})
    content = out.choices[0].logprobs.content
    assert setup[1].decode(_ids([t.token for t in content])) == out.choices[0].message.content
    assert all(t.bytes == list(t.token.encode()) and len(_ids([a.token for a in t.top_logprobs])) == 1
               for t in content)


# ---- prediction (OpenAI's predicted outputs) --------------------------------------------------
def _accepted_drafts(setup) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{setup[0].base}/metrics", timeout=60).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "tiergate_tier_spec_accepted_tokens_total" and sample.labels.get("tier") == "speculating":
                return sample.value
    return 0.0


def test_a_predicted_output_is_drafted_from_and_changes_no_token(setup, client):
    # Letters only: the answer's text then tokenizes back to its very tokens (noise bytes would not).
    letters = [setup[1].token_to_id(c) for c in "abcdefghij"]
    for model in ("bytes", "speculating"):
        def ask(**extra):
            return client.chat.completions.create(
                model=model, messages=ASKED, max_tokens=12, temperature=0,
                extra_body={"ignore_eos": True, "allowed_token_ids": letters, **extra}).choices[0].message.content
        plain = ask()
        before = _accepted_drafts(setup)
        assert ask(prediction={"type": "content", "content": plain}) == plain
        if model == "speculating":       # most of the answer came as accepted drafts
            assert _accepted_drafts(setup) - before >= 6
        assert ask(prediction={"type": "content", "content": [{"type": "text", "text": "something else"}]}) == plain


def test_a_seeded_sampled_answer_is_the_same_with_a_prediction_and_drafted_from_it(setup, client):
    """A seed names one text: a right prediction is accepted draft by draft (the target draws each
    position with the seed's own uniform), a wrong one changes nothing."""
    letters = [setup[1].token_to_id(c) for c in "abcdefghij"]

    def ask(**extra):
        return client.chat.completions.create(
            model="speculating", messages=ASKED, max_tokens=12, temperature=1.0, seed=11,
            extra_body={"ignore_eos": True, "allowed_token_ids": letters, **extra}).choices[0].message.content
    plain = ask()
    assert len(set(plain)) > 3                  # sampled, not one letter over and over
    before = _accepted_drafts(setup)
    assert ask(prediction={"type": "content", "content": plain}) == plain
    assert _accepted_drafts(setup) - before >= 6
    assert ask(prediction={"type": "content", "content": plain[:3] + "zzzz" + plain[3:]}) == plain


@pytest.mark.parametrize("prediction", [{"type": "content"}, {"type": "text", "content": "a"},
                                        {"type": "content", "content": [{"type": "image"}]},
                                        {"type": "content", "content": "x" * ((1 << 15) + 1)}])
def test_a_malformed_prediction_is_a_400(setup, prediction):
    response = _post(setup, "chat/completions", {"model": "speculating", "prediction": prediction})
    assert response.status_code == 400 and response.json()["error"]["param"] == "prediction"


# ---- echo without generation -------------------------------------------------------------------
def test_echo_with_max_tokens_0_scores_the_prompt_and_generates_nothing(setup, client):
    """OpenAI's (and vLLM's) way to score a prompt: the echo and its logprobs are those of the same
    request that generates, and the answer holds nothing more, whole or streamed."""
    scored = client.completions.create(model="bytes", prompt=PROMPT, max_tokens=0, echo=True, logprobs=1).choices[0]
    generating = client.completions.create(model="bytes", prompt=PROMPT, max_tokens=3, echo=True, logprobs=1,
                                           temperature=0).choices[0]
    prompt_len = len(setup[1].encode(PROMPT).ids)
    assert scored.text == PROMPT and scored.finish_reason == "length"
    assert scored.logprobs.token_logprobs == generating.logprobs.token_logprobs[:prompt_len]
    assert len(scored.logprobs.tokens) == prompt_len
    usage = client.completions.create(model="bytes", prompt=PROMPT, max_tokens=0, echo=True).usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (prompt_len, 0)
    chunks = list(client.completions.create(model="bytes", prompt=PROMPT, max_tokens=0, echo=True, logprobs=1,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == PROMPT
    assert [lp for c in chunks for lp in c.choices[0].logprobs.token_logprobs] == scored.logprobs.token_logprobs
    assert chunks[-1].choices[0].finish_reason == "length"


def test_max_tokens_0_without_echo_is_a_400(setup):
    for path, body in (("completions", {"max_tokens": 0}), ("chat/completions", {"max_tokens": 0}),
                       ("completions", {"max_tokens": 0, "echo": True, "use_beam_search": True})):
        response = _post(setup, path, body)
        assert response.status_code == 400 and response.json()["error"]["param"] == "max_tokens", body
