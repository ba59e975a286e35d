"""response_format over real HTTP with the official openai client, on a gateway whose embedded tier
is the tiny byte-level Llama (noise without the mask, so a valid answer is the grammar's doing) and
whose upstream tier is the fake upstream: `parse()` gives a parsed object, streamed JSON is valid,
a bad or oversized schema is a 400 naming response_format, and the upstream receives
response_format and tools exactly as the client sent them."""

from __future__ import annotations

import json
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.gateway_harness import InstantUpstream, RunningGateway, byte_model_config

MSG = [{"role": "user", "content": "Describe a pet as JSON."}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "strict": True,
                                           "parameters": {"type": "object", "additionalProperties": False,
                                                          "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


class Pet(BaseModel):
    name: str = Field(max_length=8)
    kind: Literal["cat", "dog", "fish"]
    age: int = Field(ge=0, le=30)
    vaccinated: bool


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from tests.tiny_models import write_tiny_byte_checkpoint

    tmp = tmp_path_factory.mktemp("structured-gw")
    write_tiny_byte_checkpoint(tmp / "bytes", seed=3, initializer_range=0.2)
    upstream = InstantUpstream()
    path = tmp / "gateway.yaml"
    path.write_text(byte_model_config(tmp / "bytes",
                                      tiers=f'  up: {{kind: upstream, base_url: "{upstream.base_url}", model: instant}}\n',
                                      models="  up: {chain: [up]}\n"))
    gw = RunningGateway(path)
    yield gw, upstream
    gw.stop()
    upstream.stop()


@pytest.fixture(scope="module")
def client(setup):
    return openai.OpenAI(base_url=f"{setup[0].base}/v1", api_key="unused", max_retries=0)


def test_parse_returns_a_parsed_object(client):
    for seed in range(3):
        completion = client.chat.completions.parse(model="bytes", messages=MSG, response_format=Pet, seed=seed,
                                                    max_tokens=150)
        message = completion.choices[0].message
        assert isinstance(message.parsed, Pet), message.content
        assert completion.choices[0].finish_reason == "stop"
        assert completion.usage.completion_tokens > 0


def test_json_object_streamed_and_not_is_json(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": Pet.model_json_schema()}}
    schema = Pet.model_json_schema()
    for seed in range(2):
        whole = client.chat.completions.create(model="bytes", messages=MSG, response_format=fmt, seed=seed,
                                               max_tokens=150)
        jsonschema.validate(json.loads(whole.choices[0].message.content), schema)
        chunks = list(client.chat.completions.create(model="bytes", messages=MSG, response_format=fmt, seed=seed,
                                                     max_tokens=150, stream=True,
                                                     stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == whole.choices[0].message.content             # same seed, same constrained answer
        assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    loose = client.chat.completions.create(model="bytes", messages=MSG, response_format={"type": "json_object"},
                                           seed=1, max_tokens=200)
    if loose.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(loose.choices[0].message.content), dict)


def test_completions_endpoint_takes_response_format_too(setup):
    gw, _ = setup
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": Pet.model_json_schema()}}
    resp = httpx.post(f"{gw.base}/v1/completions", json={"model": "bytes", "prompt": "A pet:", "max_tokens": 150,
                                                         "seed": 4, "response_format": fmt}, timeout=60)
    assert resp.status_code == 200, resp.text
    Pet.model_validate_json(resp.json()["choices"][0]["text"])


@pytest.mark.parametrize("fmt,why", [
    ({"type": "xml"}, "type"),
    ({"type": "json_schema"}, "json_schema"),
    ({"type": "json_schema", "json_schema": {"name": "has space", "schema": {}}}, "name"),
    ({"type": "json_schema", "json_schema": {"name": "n", "schema": []}}, "schema"),
    ({"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}, "extra": 1}}, "unknown"),
    ({"type": "json_schema", "json_schema": {"name": "n", "schema": {"description": "x" * 70_000}}}, "characters"),
    ({"type": "json_schema", "json_schema": {"name": "n", "schema": json.loads('{"items":' * 40 + "{}" + "}" * 40)}},
     "deeper"),
])
def test_a_malformed_response_format_is_a_400_naming_it(setup, fmt, why):
    for model in ("bytes", "up"):        # refused at the edge, whatever tier would answer
        resp = httpx.post(f"{setup[0].base}/v1/chat/completions",
                          json={"model": model, "messages": MSG, "max_tokens": 4, "response_format": fmt}, timeout=30)
        error = resp.json()["error"]
        assert resp.status_code == 400 and error["param"] == "response_format" and why in error["message"], resp.text
        assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"type": "no-such-type"}}},
    {"type": "string", "pattern": "(unclosed"},
])
def test_a_schema_the_engine_cannot_enforce_is_a_400_naming_response_format(client, schema):
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            answer = client.chat.completions.create(
                model="bytes", messages=MSG, max_tokens=8, stream=stream,
                response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": schema}})
            list(answer) if stream else None
        assert info.value.body["param"] == "response_format"


def test_deeply_nested_tool_parameters_are_a_400_naming_tools(setup):
    deep = json.loads('{"items":' * 40 + "{}" + "}" * 40)
    tools = [{"type": "function", "function": {"name": "f", "parameters": deep}}]
    resp = httpx.post(f"{setup[0].base}/v1/chat/completions",
                      json={"model": "bytes", "messages": MSG, "max_tokens": 4, "tools": tools}, timeout=30)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "tools", resp.text


def test_the_upstream_receives_response_format_and_tools_as_sent(setup):
    gw, upstream = setup
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "strict": True, "schema": Pet.model_json_schema()}}
    body = {"model": "up", "messages": MSG, "max_tokens": 4, "response_format": fmt, "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": False}
    for stream in (False, True):
        resp = httpx.post(f"{gw.base}/v1/chat/completions", json={**body, "stream": stream}, timeout=30)
        assert resp.status_code == 200, resp.text
        sent = httpx.get(upstream.base_url.removesuffix("/v1") + "/__control").json()["last_body"]
        for field in ("response_format", "tools", "tool_choice", "parallel_tool_calls"):
            # The same JSON text, key order and all: compared as serialized, not as parsed values.
            assert json.dumps(sent[field]) == json.dumps(body[field]), field
