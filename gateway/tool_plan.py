"""What a chat request's tools mean for an embedded engine: the messages its chat template sees
(assistant `tool_calls`, `tool` results), the tools it is shown, whether its answer is parsed for
calls, and the grammar that forces calls when `tool_choice` is `required` or names a function.

- `auto`: the model sees the tools and may call them; its text is parsed (gateway/tool_calls.py).
- `required`: the answer is one call (or, with parallel_tool_calls, several) to any of the tools,
  enforced by a grammar: `<tool_call>\\n{"name": <one of them>, "arguments": <its parameters>}\\n</tool_call>`.
- a named function: the same, to that function only.
- `none`: neither the tools nor parsing; the model answers in text (tool turns already in the
  conversation are still rendered).

The call tags are matched as the model's own tokens where its vocabulary has them (Qwen's
`<tool_call>` is one added token), else as text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pydantic_core

from engines.grammar import GrammarSpec
from engines.grammar.spec import JSON_OPTIONS
from engines.tokenizer import TextTokenizer
from engines.tool_prompt import CLOSE, OPEN
from gateway.errors import GatewayError
from gateway.response_format import closed_objects, rebased_refs
from gateway.schema import ChatCompletionRequest
from gateway.schema_tools import NamedToolChoice

_NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class ToolPlan:
    tools: list[dict[str, Any]]          # as sent: what the template shows the model
    forced: str | None                   # None (auto), "*" (required) or the named function
    parallel: bool

    @property
    def names(self) -> frozenset[str]:
        return frozenset(t["function"]["name"] for t in self.tools)

    def grammar(self, tokenizer: TextTokenizer) -> GrammarSpec | None:
        if self.forced is None:
            return None
        functions = [t["function"] for t in self.tools if self.forced in ("*", t["function"]["name"])]
        # Each function's parameters live under the root's $defs, their own references rebased
        # there: a `$ref` to "#/$defs/..." (pydantic's schemas) or to "#" means the parameters'
        # root, not the call's.
        defs = {f"tool{i}": rebased_refs(closed_objects(f.get("parameters") or _NO_ARGUMENTS), f"/$defs/tool{i}")
                for i, f in enumerate(functions)}
        options = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                    "properties": {"name": {"const": f["name"]}, "arguments": {"$ref": f"#/$defs/tool{i}"}}}
                   for i, f in enumerate(functions)]
        schema = dict(options[0]) if len(options) == 1 else {"anyOf": options}
        schema["$defs"] = defs
        schema["x-guidance"] = JSON_OPTIONS        # the separators response_format uses, no stray whitespace
        # Qwen writes "\n" after a call's closing tag whether or not another call follows, so
        # the grammar allows it after the last call too: the model, not the grammar, decides
        # whether one more comes (a grammar needing a call after every "\n" made it write calls
        # until max_tokens).
        repeat = ' ("\\n" call)*' if self.parallel else ""
        lark = (f'start: call{repeat} "\\n"?\n'
                f'call: {_tag(tokenizer, OPEN)} "\\n" body "\\n" {_tag(tokenizer, CLOSE)}\n'
                f"body: %json {json.dumps(schema, ensure_ascii=False)}\n")
        return GrammarSpec.lark(lark, param="tools")


def tool_plan(body: ChatCompletionRequest) -> ToolPlan | None:
    if not body.tools or body.tool_choice == "none":
        return None
    tools = [t.model_dump(exclude_unset=True) for t in body.tools]
    choice = body.tool_choice or "auto"
    forced = choice.function.name if isinstance(choice, NamedToolChoice) else None if choice == "auto" else "*"
    parallel = body.parallel_tool_calls is not False
    return ToolPlan(tools, forced, parallel)


def template_messages(body: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The conversation as the chat template reads it: role and text content, plus an assistant's
    `tool_calls` (arguments as objects, which Qwen's template prints with tojson) and a tool
    result's `tool_call_id`. A malformed tool turn is a 400 naming the field."""
    out = []
    for i, m in enumerate(body.messages):
        extra = m.model_extra or {}
        message: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        calls = extra.get("tool_calls")
        if calls is not None:
            if m.role != "assistant":
                raise GatewayError(400, "only assistant messages carry tool_calls", param=f"messages[{i}].tool_calls")
            message["tool_calls"] = [_call(c, f"messages[{i}].tool_calls[{j}]") for j, c in enumerate(calls)]
        call_id = extra.get("tool_call_id")
        if call_id is not None:
            # Optional, as /openapi.json documents the message: templates render results in order.
            if m.role != "tool" or not isinstance(call_id, str):
                raise GatewayError(400, "tool_call_id belongs to tool messages, as a string",
                                   param=f"messages[{i}].tool_call_id")
            message["tool_call_id"] = call_id
        out.append(message)
    return out


def _call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or \
            not isinstance(function.get("arguments"), str):
        raise GatewayError(400, "a tool call needs function.name and function.arguments (a JSON string)", param=where)
    if call.get("type", "function") != "function" or not isinstance(call.get("id", ""), str):
        raise GatewayError(400, "a tool call is of type 'function' and its id a string", param=where)
    try:
        # pydantic's parser, not json.loads: it refuses lone surrogate escapes ("\\ud800"), which
        # no tokenizer can encode, and nesting past its bounded depth.
        arguments = pydantic_core.from_json(function["arguments"] or "{}")
    except ValueError:
        arguments = function["arguments"]       # shown to the model as the text it was
    return {"id": call.get("id"), "type": "function", "function": {"name": function["name"], "arguments": arguments}}


def _tag(tokenizer: TextTokenizer, text: str) -> str:
    """A Lark reference to the one token spelling `text` when the vocabulary has it as an added
    token (the call opens with the token the model was taught to write, not the same bytes in
    pieces), else the text as a literal."""
    token_id = tokenizer.backend.token_to_id(text)
    if token_id is not None and token_id in tokenizer.backend.get_added_tokens_decoder():
        return f"<[{token_id}]>"
    return json.dumps(text)
