"""Tool calling over real HTTP with the official openai client on an embedded tier: the tiny
byte-level Llama (its template, ChatML, has no tools: the Hermes fallback of
engines/tool_prompt.py), whose own choices are noise, so a well-formed call is the grammar's doing.
`required` and a named function give parsed calls with finish_reason tool_calls, streamed as
OpenAI streams them; a tool result sent back gets an answer; bad tool turns are 400s."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.gateway_harness import RunningGateway, byte_model_config

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["C", "F"]}}}
TIME = {"type": "object", "additionalProperties": False, "required": ["zone"],
        "properties": {"zone": {"enum": ["UTC", "CET", "JST"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Time in a zone", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_time"}}


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    from tests.tiny_models import write_tiny_byte_checkpoint

    tmp = tmp_path_factory.mktemp("tools-gw")
    write_tiny_byte_checkpoint(tmp / "bytes", seed=5, initializer_range=0.2, max_position_embeddings=2048)
    path = tmp / "gateway.yaml"
    path.write_text(byte_model_config(tmp / "bytes", max_model_len=2048, kv_cache_memory="8MiB",
                                      max_num_batched_tokens=1024))
    gw = RunningGateway(path)
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def client(gw):
    return openai.OpenAI(base_url=f"{gw.base}/v1", api_key="unused", max_retries=0)


def _check_calls(calls, names) -> None:
    assert calls and all(c.type == "function" and c.id.startswith("call_") for c in calls)
    for c in calls:
        assert c.function.name in names
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


def _streamed(client, **kw):
    """(content, calls as {index: [id, name, arguments]}, finish reason) from a stream's deltas."""
    content, calls, reason = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for tc in choice.delta.tool_calls or []:
            if tc.index not in calls:
                assert tc.id and tc.function.name                    # id and name come first, once
                calls[tc.index] = [tc.id, tc.function.name, tc.function.arguments or ""]
            else:
                assert tc.id is None and tc.function.name is None
                calls[tc.index][2] += tc.function.arguments or ""
        reason = choice.finish_reason or reason
    return content, calls, reason


@pytest.mark.parametrize("choice,names", [("required", {"get_weather", "get_time"}), (NAMED, {"get_time"})])
def test_forced_calls_whole_and_streamed(client, choice, names):
    for seed in range(3):
        kw = dict(model="bytes", messages=ASK, tools=TOOLS, tool_choice=choice, seed=seed, max_tokens=200,
                  parallel_tool_calls=False)
        whole = client.chat.completions.create(**kw)
        message = whole.choices[0].message
        assert whole.choices[0].finish_reason == "tool_calls" and message.content is None
        _check_calls(message.tool_calls, names)
        assert len(message.tool_calls) == 1
        content, calls, reason = _streamed(client, **kw)
        assert reason == "tool_calls" and content == ""
        assert [(n, a) for _, n, a in calls.values()] == [(c.function.name, c.function.arguments)
                                                         for c in message.tool_calls]   # same seed, same call


def test_parallel_calls_are_indexed(client):
    for seed in range(4):
        whole = client.chat.completions.create(model="bytes", messages=ASK, tools=TOOLS, tool_choice="required",
                                               seed=seed, max_tokens=400)
        calls = whole.choices[0].message.tool_calls
        _check_calls(calls, set(SCHEMAS))
        if whole.choices[0].finish_reason == "tool_calls":
            _, streamed, _ = _streamed(client, model="bytes", messages=ASK, tools=TOOLS, tool_choice="required",
                                       seed=seed, max_tokens=400)
            assert sorted(streamed) == list(range(len(calls)))


def test_round_trip_with_a_tool_result(client):
    first = client.chat.completions.create(model="bytes", messages=ASK, tools=TOOLS, tool_choice=NAMED, seed=1,
                                           max_tokens=100)
    call = first.choices[0].message.tool_calls[0]
    followup = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"time": "12:00"})}]
    for stream in (False, True):
        if stream:
            content, calls, reason = _streamed(client, model="bytes", messages=followup, tools=TOOLS,
                                               tool_choice="none", seed=2, max_tokens=16)
        else:
            answer = client.chat.completions.create(model="bytes", messages=followup, tools=TOOLS,
                                                    tool_choice="none", seed=2, max_tokens=16)
            content, calls, reason = answer.choices[0].message.content, answer.choices[0].message.tool_calls, \
                answer.choices[0].finish_reason
        assert content and not calls and reason in ("stop", "length")


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_usage_counts_the_constrained_tokens(client, seed):
    """Every token the grammar let through is counted: at least the call's compact text (one byte
    token each) and the EOS, and the same count, seeded, whether the answer streams or not."""
    kw = dict(model="bytes", messages=ASK, tools=TOOLS, tool_choice=NAMED, seed=seed, max_tokens=1000)
    whole = client.chat.completions.create(**kw)
    assert whole.choices[0].finish_reason == "tool_calls"        # the grammar ended it, not max_tokens
    call = whole.choices[0].message.tool_calls[0]
    text = f'<tool_call>\n{{"name": "{call.function.name}", "arguments": {call.function.arguments}}}\n</tool_call>'
    assert len(text.encode()) + 1 <= whole.usage.completion_tokens < 1000
    usage = None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        usage = chunk.usage or usage
    assert usage.completion_tokens == whole.usage.completion_tokens


@pytest.mark.parametrize("messages,param", [
    ([*ASK, {"role": "tool", "content": "x", "tool_call_id": 7}], "messages[1].tool_call_id"),
    ([*ASK, {"role": "user", "content": "x", "tool_call_id": "c"}], "messages[1].tool_call_id"),
    ([*ASK, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f"}}]}],
     "messages[1].tool_calls[0]"),
    ([*ASK, {"role": "user", "content": "x", "tool_calls": []}], "messages[1].tool_calls"),
    ([*ASK, {"role": "assistant", "tool_calls": [{"id": "c", "type": "custom", "function": {"name": "f", "arguments": "{}"}}]}],
     "messages[1].tool_calls[0]"),
    ([*ASK, {"role": "assistant", "tool_calls": [{"id": 7, "type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
     "messages[1].tool_calls[0]"),
])
def test_malformed_tool_turns_are_400s(gw, messages, param):
    resp = httpx.post(f"{gw.base}/v1/chat/completions", json={"model": "bytes", "messages": messages, "tools": TOOLS,
                                                              "max_tokens": 4}, timeout=30)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text


# Arguments are a JSON string inside the body: a lone surrogate escape in them ("\ud800" as six
# characters) passes the body's parser, and json.loads would turn it into text no tokenizer can
# encode (a 500). They are shown to the model as the text they are instead.
LONE_SURROGATE_CALL = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "\\ud800"}'}}]},
    {"role": "tool", "content": "12:00", "tool_call_id": "c1"}]


@pytest.mark.parametrize("path,extra", [("/v1/chat/completions", {"max_tokens": 2}),
                                        ("/v1/chat/completions", {"max_tokens": 2, "stream": True}),
                                        ("/tokenize", {})])
def test_a_lone_surrogate_escape_in_tool_call_arguments_is_text(gw, path, extra):
    resp = httpx.post(f"{gw.base}{path}", json={"model": "bytes", "messages": LONE_SURROGATE_CALL, "tools": TOOLS,
                                                **extra}, timeout=60)
    assert resp.status_code == 200, resp.text
    if path == "/tokenize":
        ids = resp.json()["tokens"]
        plain = httpx.post(f"{gw.base}/tokenize", json={"model": "bytes", "tools": TOOLS, "messages": [
            *ASK, {**LONE_SURROGATE_CALL[1], "tool_calls": [{**LONE_SURROGATE_CALL[1]["tool_calls"][0], "function": {
                "name": "get_time", "arguments": '{"zone": "UTC"}'}}]}, LONE_SURROGATE_CALL[2]]}, timeout=60)
        assert len(ids) > len(plain.json()["tokens"])     # the escape's six characters, as text
