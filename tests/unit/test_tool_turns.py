"""An assistant turn's tool call sent back in the history keeps its arguments as the text it was
when they are not JSON the parser can read, deeper than its recursion limit included: the
request goes on (the model is shown the text), never a 500 from the JSON parser."""

from __future__ import annotations

import json

from engines.tool_prompt import call_text
from gateway.schema import ChatCompletionRequest, parse_body
from gateway.tool_plan import template_messages

DEEP = "[" * 5000 + "]" * 5000


def _history(arguments: str) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [
        {"role": "user", "content": "Go."},
        {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                                              "function": {"name": "f", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "done"}]}
    return parse_body(ChatCompletionRequest, json.dumps(body).encode())


def test_arguments_too_deep_to_parse_stay_text():
    messages = template_messages(_history(DEEP))
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == DEEP
    assert DEEP in call_text(messages[1]["tool_calls"][0])


def test_readable_arguments_become_objects():
    messages = template_messages(_history('{"a": [1, 2]}'))
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"a": [1, 2]}
    assert call_text({"function": {"name": "f", "arguments": '{"a": 1}'}}) == \
        '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
