"""Request bodies as clients really send them: null for a field with a default means that default
(OpenAI's reference marks them nullable, and its Python client sends null for a keyword given as
None), /openapi.json says so, and a refused value is reported where it is wrong (an image part,
a part's missing text, a bad item of a list) rather than as the first branch of a union."""

from __future__ import annotations

import json

import pytest

from gateway.errors import GatewayError
from gateway.openapi import openapi_document
from gateway.schema import ChatCompletionRequest, CompletionRequest, parse_body

USER = [{"role": "user", "content": "hi"}]


def _chat(**fields) -> bytes:
    return json.dumps({"model": "m", "messages": USER, **fields}).encode()


def _error(model, raw: bytes) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        parse_body(model, raw)
    assert caught.value.status == 400
    return caught.value


def test_null_means_the_default_in_chat_and_completions():
    chat = parse_body(ChatCompletionRequest, _chat(n=None, stream=None, logprobs=None, ignore_eos=None))
    assert (chat.n, chat.stream, chat.logprobs, chat.ignore_eos) == (1, False, False, False)
    streamed = parse_body(ChatCompletionRequest, _chat(stream=True, stream_options={"include_usage": None,
                                                                                    "continuous_usage_stats": None}))
    assert not streamed.include_usage and not streamed.continuous_usage
    completion = parse_body(CompletionRequest, json.dumps({"model": "m", "prompt": "x", "n": None, "echo": None,
                                                           "stream": None}).encode())
    assert (completion.n, completion.echo, completion.stream) == (1, False, False)


@pytest.mark.parametrize("field, value", [("n", 0), ("n", 129), ("n", 1.5), ("n", "2"), ("stream", "yes"),
                                          ("logprobs", 1)])
def test_values_other_than_null_are_still_checked(field, value):
    assert _error(ChatCompletionRequest, _chat(**{field: value})).param == field


def test_openapi_documents_null_for_those_fields():
    schemas = openapi_document(["m"])["components"]["schemas"]
    chat, completion = schemas["ChatCompletionRequest"]["properties"], schemas["CompletionRequest"]["properties"]
    for props, field in [(chat, "n"), (chat, "stream"), (chat, "logprobs"), (completion, "echo")]:
        assert {"type": "null"} in props[field]["anyOf"], field
    assert {"type": "integer", "minimum": 1, "maximum": 128} in chat["n"]["anyOf"]


@pytest.mark.parametrize("kind", ["image_url", "input_audio", "file"])
def test_a_non_text_content_part_says_the_models_read_text_only(kind):
    raw = _chat(messages=[{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                                       {"type": kind, kind: {"url": "https://example.com/x"}}]}])
    error = _error(ChatCompletionRequest, raw)
    assert error.param == "messages[0].content" and f"'{kind}'" in error.message and "text only" in error.message


@pytest.mark.parametrize("fields, param, words", [
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text", "required"),
    ({"stop": ["a", 3]}, "stop[1]", "valid string"),
    ({"messages": [{"role": "user", "content": []}]}, "messages[0].content", "empty array"),
    ({"messages": [{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}]}, "messages[0]",
     "only an assistant message holds refusal parts"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools[0].function.parameters", "JSON Schema of an object"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function"}},
     "tool_choice.function", "required"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "sometimes"},
     "tool_choice", "'none', 'auto' or 'required'"),
])
def test_a_union_reports_the_error_inside_the_value(fields, param, words):
    error = _error(ChatCompletionRequest, _chat(**fields))
    assert error.param == param and words in error.message, error.message


def test_an_assistant_refusal_part_is_its_text():
    body = ChatCompletionRequest.model_validate_json(_chat(messages=[
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}, {"type": "text", "text": " Sorry."}]}]))
    assert body.messages[1].text() == "I can't. Sorry."
