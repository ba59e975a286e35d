"""vLLM's guided decoding and sampling extensions on an embedded tier, over real HTTP with the
official openai client (`extra_body`, as vLLM's clients send them). The tier is the tiny byte-level
Llama: without the grammar mask its output is noise, so an answer inside the constraint is the
constraint's doing. Honoured fields change the output as vLLM's do; the ones no embedded engine
implements are a 400 naming the field, never silently ignored."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest

from gateway.response_format import MAX_CONSTRAINT_CHARS
from tests.gateway_harness import start_byte_gateway

MSG = [{"role": "user", "content": "Answer."}]
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999}, "ok": {"type": "boolean"}},
          "required": ["n", "ok"]}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    gw, tok, hf = start_byte_gateway(tmp_path_factory.mktemp("guided-gw"), seed=3)
    yield gw, tok
    gw.stop()


@pytest.fixture(scope="module")
def client(setup):
    return openai.OpenAI(base_url=f"{setup[0].base}/v1", api_key="unused", max_retries=0)


def _chat(client, seed=0, **extra):
    out = client.chat.completions.create(model="bytes", messages=MSG, max_tokens=40, seed=seed, extra_body=extra)
    return out.choices[0]


@pytest.mark.parametrize("extra", [{"guided_regex": r"[0-9]{3}-[a-z]{2}"},
                                   {"structured_outputs": {"regex": r"[0-9]{3}-[a-z]{2}"}}])
def test_a_regex_is_matched_whole(client, extra):
    for seed in range(3):
        choice = _chat(client, seed, **extra)
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", choice.message.content), choice.message.content
        assert choice.finish_reason == "stop"


@pytest.mark.parametrize("extra", [{"guided_choice": ["yes", "no", "maybe \"so\""]},
                                   {"structured_outputs": {"choice": ["yes", "no", "maybe \"so\""]}}])
def test_a_choice_is_one_of_the_options(client, extra):
    seen = set()
    for seed in range(6):
        seen.add(_chat(client, seed, **extra).message.content)
    assert seen <= {"yes", "no", "maybe \"so\""} and seen


def test_a_choice_holds_when_streamed(client):
    stream = client.chat.completions.create(model="bytes", messages=MSG, max_tokens=40, seed=1, stream=True,
                                            extra_body={"guided_choice": ["alpha", "beta"]})
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) in ("alpha", "beta")


@pytest.mark.parametrize("extra", [{"guided_json": SCHEMA}, {"guided_json": json.dumps(SCHEMA)},
                                   {"structured_outputs": {"json": SCHEMA}}])
def test_json_follows_the_schema(client, extra):
    for seed in range(2):
        content = _chat(client, seed, **extra).message.content
        jsonschema.validate(json.loads(content), SCHEMA)


def test_json_object_is_an_object(client):
    # Any object: noise may fill its keys past max_tokens, so a cut answer is checked as a prefix.
    for seed in range(3):
        choice = _chat(client, seed, structured_outputs={"json_object": True})
        assert choice.message.content.startswith("{"), choice.message.content
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict)


@pytest.mark.parametrize("grammar", ['start: "a" ("b" | "c")+ "d"',            # Lark
                                     'root ::= "a" ("b" | "c")+ "d"'])          # GBNF
def test_a_grammar_in_lark_or_gbnf_is_followed(client, grammar):
    for seed in range(2):
        content = _chat(client, seed, guided_grammar=grammar).message.content
        assert re.fullmatch(r"a[bc]+d", content), content


def test_the_completions_endpoint_takes_them_too(client):
    out = client.completions.create(model="bytes", prompt="x", max_tokens=20, seed=0,
                                    extra_body={"guided_regex": "[a-c]{4}"})
    assert re.fullmatch("[a-c]{4}", out.choices[0].text)


def test_stop_token_ids_end_the_answer_and_the_stop_text_may_be_kept(setup, client):
    stop_id = setup[1].token_to_id("c")
    choice = _chat(client, 0, guided_regex="abcdef", stop_token_ids=[stop_id])
    assert (choice.message.content, choice.finish_reason) == ("ab", "stop")
    kept = _chat(client, 0, guided_regex="abcdef", stop=["cd"], include_stop_str_in_output=True)
    assert kept.message.content == "abcd"
    # the stop token's text too, as vLLM keeps it
    assert _chat(client, 0, guided_regex="abcdef", stop_token_ids=[stop_id],
                 include_stop_str_in_output=True).message.content == "abc"
    assert _chat(client, 0, guided_regex="abcdef", stop=["cd"]).message.content == "ab"


def _post(setup, body):
    return httpx.post(f"{setup[0].base}/v1/chat/completions", timeout=60,
                      json={"model": "bytes", "messages": MSG, "max_tokens": 5, **body})


@pytest.mark.parametrize("body,param", [
    ({"guided_regex": "[0-9]+", "guided_choice": ["a"]}, "guided_choice"),
    ({"guided_json": SCHEMA, "structured_outputs": {"regex": "a"}}, "structured_outputs.regex"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ({"guided_regex": "("}, "guided_regex"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_json": [1, 2]}, "guided_json"),                           # neither a string nor an object
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_grammar": "root ::: nothing"}, "guided_grammar"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
    ({"guided_whitespace_pattern": " *"}, "guided_whitespace_pattern"),
    # Past the size bound the compiler's stack is sized for, by field and in total.
    ({"guided_regex": "a" * (MAX_CONSTRAINT_CHARS + 1)}, "guided_regex"),
    ({"structured_outputs": {"grammar": 'start: "a"' + " " * MAX_CONSTRAINT_CHARS}}, "structured_outputs.grammar"),
    ({"guided_choice": ["a" * 40_000, "b" * 40_000]}, "guided_choice"),
    ({"guided_json": "[" * 5000 + "]" * 5000}, "guided_json"),          # deeper than the JSON parser goes
    # A lone surrogate escape inside the schema's JSON text: no tokenizer can encode what it spells.
    ({"guided_json": '{"type": "string", "const": "\\ud800"}'}, "guided_json"),
    ({"structured_outputs": {"json": '{"enum": ["\\udfff"]}'}}, "structured_outputs.json"),
    # The gateway sets llguidance's options: a schema's own cannot make an unsupported keyword pass.
    ({"guided_json": {"type": "object", "not": {"type": "null"}, "x-guidance": {"lenient": True}}}, "guided_json"),
])
def test_a_constraint_that_cannot_be_honoured_is_a_400_naming_it(setup, body, param):
    response = _post(setup, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error


@pytest.mark.parametrize("field,value", [("length_penalty", 1.5), ("chat_template", "{{ messages }}"),
                                         ("best_of", 2),
                                         ("documents", [{"title": "a", "text": "b"}]),
                                         ("functions", [{"name": "f"}]),
                                         ("function_call", "auto")])
def test_an_extension_no_embedded_engine_has_is_a_400_naming_it(setup, field, value):
    response = _post(setup, {field: value})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and "not supported" in error["message"], error


@pytest.mark.parametrize("field,value", [("length_penalty", 1.0), ("use_beam_search", False),
                                         ("skip_special_tokens", True), ("add_generation_prompt", True),
                                         ("guided_decoding_backend", "xgrammar"), ("metadata", {"team": "a"}),
                                         ("top_k", -1),                        # vLLM's "off"
                                         ("logit_bias", {}),
                                         ("structured_outputs", {"regex": "ab", "disable_any_whitespace": True})])
def test_an_extension_at_its_neutral_value_is_accepted(setup, field, value):
    response = _post(setup, {field: value})
    assert response.status_code == 200, response.text


def _greedy(client, max_tokens, **extra):
    out = client.chat.completions.create(model="bytes", messages=MSG, max_tokens=max_tokens, temperature=0,
                                         extra_body=extra)
    return out.choices[0], out.usage


def test_logit_bias_steers_every_token(setup, client):
    q = setup[1].token_to_id("Q")
    choice, _ = _greedy(client, 6, logit_bias={str(q): 100})
    assert choice.message.content == "QQQQQQ" and choice.finish_reason == "length"
    assert "Q" not in _greedy(client, 6, logit_bias={str(q): -100})[0].message.content


def test_repetition_penalty_counts_what_was_written(setup, client):
    """'Q' and 'J' are in neither the prompt nor the template: the first 'Q' is free, the
    second is divided by the penalty and falls behind 'J'."""
    tok = setup[1]
    bias = {str(tok.token_to_id("Q")): 100, str(tok.token_to_id("J")): 90}
    assert _greedy(client, 2, logit_bias=bias)[0].message.content == "QQ"
    assert _greedy(client, 2, logit_bias=bias, repetition_penalty=100)[0].message.content == "QJ"


def test_min_tokens_holds_off_eos_and_stop_strings(setup, client):
    tok = setup[1]
    eos, q = tok.token_to_id("<|im_end|>"), tok.token_to_id("Q")
    choice, usage = _greedy(client, 20, logit_bias={str(eos): 100})
    assert (choice.message.content, choice.finish_reason, usage.completion_tokens) == ("", "stop", 1)
    choice, usage = _greedy(client, 20, logit_bias={str(eos): 100, str(q): 90}, min_tokens=5)
    assert (choice.message.content, choice.finish_reason, usage.completion_tokens) == ("QQQQQ", "stop", 6)
    # a stop string inside the first min_tokens tokens does not count; the next one does
    choice, _ = _greedy(client, 20, logit_bias={str(q): 100}, stop=["Q"], min_tokens=3)
    assert (choice.message.content, choice.finish_reason) == ("QQQ", "stop")


def test_allowed_token_ids_and_bad_words(setup, client):
    tok = setup[1]
    q, j = tok.token_to_id("Q"), tok.token_to_id("J")
    choice, _ = _greedy(client, 8, allowed_token_ids=[q, j])
    assert set(choice.message.content) <= {"Q", "J"} and len(choice.message.content) == 8
    # 'Q' leads by far, but may not follow itself: every other token is the other allowed one
    choice, _ = _greedy(client, 8, allowed_token_ids=[q, j], logit_bias={str(q): 100}, bad_words=["QQ"])
    assert choice.message.content == "QJQJQJQJ"


@pytest.mark.parametrize("body,param", [({"min_tokens": 6}, "min_tokens"), ({"logit_bias": {"260": 1}}, "logit_bias"),
                                        ({"allowed_token_ids": [1, 260]}, "allowed_token_ids"),
                                        ({"allowed_token_ids": []}, "allowed_token_ids"),
                                        ({"logit_bias": {"1": 101}}, "logit_bias.1"),
                                        ({"repetition_penalty": 0}, "repetition_penalty")])
def test_adjustments_out_of_range_are_a_400_naming_them(setup, body, param):
    response = _post(setup, body)          # max_tokens 5; the byte model's vocabulary is 260
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_special_tokens_show_only_when_not_skipped(setup, client):
    bos = setup[1].token_to_id("<s>")
    choice, usage = _greedy(client, 3, logit_bias={str(bos): 100})
    assert (choice.message.content, usage.completion_tokens) == ("", 3)
    choice, _ = _greedy(client, 3, logit_bias={str(bos): 100}, skip_special_tokens=False)
    assert choice.message.content == "<s><s><s>"


SELF_ONLY = {"$ref": "#"}
SELF_REQUIRED = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}


def test_a_schema_that_admits_no_string_is_a_400_before_it_runs(client):
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(client, guided_json=SELF_ONLY)
    assert caught.value.body["param"] == "guided_json"
    assert "cannot be enforced" in caught.value.body["message"]


def test_a_schema_no_finite_answer_satisfies_fails_instead_of_ending_as_a_stop(setup, client):
    """A property that requires an object like the one it is in: every answer is cut off. The
    request fails with a 400 naming the field, streamed or not (here the parser gives up at the
    first token, before a byte is sent), instead of a cut-off answer that says "stop"."""
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(client, guided_json=SELF_REQUIRED)
    assert caught.value.body["param"] == "guided_json"
    assert "could not be completed under the constraint" in caught.value.body["message"]
    body = {"model": "bytes", "messages": MSG, "max_tokens": 40, "stream": True, "guided_json": SELF_REQUIRED}
    response = httpx.post(f"{setup[0].base}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == "guided_json"


def test_a_dead_end_after_chunks_went_out_ends_the_stream_with_the_error(setup):
    """A property whose value may only be itself: the object's opening is streamed, then no token
    can continue it; the stream ends with the error event (naming the field), no "stop" chunk."""
    body = {"model": "bytes", "messages": MSG, "max_tokens": 40, "stream": True, "seed": 1,
            "guided_json": {"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}}}
    response = httpx.post(f"{setup[0].base}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200
    events = [json.loads(line[6:]) for line in response.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    chunks, last = events[:-1], events[-1]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks).startswith("{")
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
    assert last["error"]["param"] == "guided_json" and "could not be completed" in last["error"]["message"]


def test_a_choice_of_thousands_of_options_is_one_of_them(client):
    """Options are alternatives of one lexer terminal: as parser items they stopped the answer past
    2,000 of them."""
    options = [f"option {i}" for i in range(3000)]
    for seed in range(2):
        choice = _chat(client, seed, guided_choice=options)
        assert choice.message.content in options and choice.finish_reason == "stop", choice


def test_all_of_a_schema_is_kept_when_its_parts_name_different_keys(client):
    """Each part of an allOf names its own keys: the gateway keeps them open (closing one would
    forbid the other's required key, an unsatisfiable schema)."""
    schema = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
                         "required": ["a"]},
                        {"type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"]}]}
    for seed in range(2):
        choice = _chat(client, seed, guided_json=schema)
        if choice.finish_reason == "stop":
            jsonschema.validate(json.loads(choice.message.content), schema)
        else:
            assert choice.message.content.startswith("{"), choice


def test_a_cached_refusal_names_the_field_of_the_request_it_refuses(setup):
    schema = {"type": "object", "properties": {"a": {"type": "no such type"}}}
    first = _post(setup, {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}})
    again = _post(setup, {"guided_json": schema})
    assert first.status_code == again.status_code == 400
    assert again.json()["error"]["param"] == "guided_json"
    assert again.json()["error"]["message"].startswith("guided_json:"), again.json()


@pytest.mark.parametrize("extra,expected", [
    ({"guided_regex": re.escape("<|im_start|>") + "ab"}, {"<|im_start|>ab"}),
    ({"guided_choice": ["<|im_end|>"]}, {"<|im_end|>"}),
])
def test_a_constraint_spelling_a_special_token_is_written_as_text(client, extra, expected):
    """The special tokens' spellings are text to a constraint: written with ordinary tokens (the
    special token is never forced for them, nor taken for the end of the answer)."""
    for seed in range(2):
        choice = _chat(client, seed, **extra)
        assert choice.message.content in expected and choice.finish_reason == "stop", choice


def test_a_seeded_prompt_answers_the_same_wherever_it_sits_in_a_list(client):
    """Every prompt of a list gets the request's sampling, its seed included (as at vLLM)."""
    def texts(prompts):
        out = client.completions.create(model="bytes", prompt=prompts, max_tokens=12, temperature=1.0, seed=5)
        return [c.text for c in sorted(out.choices, key=lambda c: c.index)]
    alone = texts(["The weather"])[0]
    assert texts(["Once upon", "The weather"])[1] == alone == texts(["The weather", "Once upon"])[0]


def test_the_sampled_tokens_own_logprob_is_in_its_top_logprobs(client):
    """Byte tokens of one multi-byte character each read as U+FFFD: the top_logprobs entry under
    that text is the sampled token's own value, not another byte's."""
    out = client.completions.create(model="bytes", prompt="x", max_tokens=8, temperature=0, logprobs=5,
                                    extra_body={"guided_regex": "(é|ü|ñ){4}"})
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == 8
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert top[token] == value
