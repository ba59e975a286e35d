"""Tool calling for chat templates that know nothing of tools (SmolLM2's ChatML, any template
whose source never mentions `tools`): the conversation is rewritten into plain messages in the
Hermes format that Qwen's own template uses, then rendered by the model's template as usual.

- The tool signatures go into the system message (one is added if the chat has none), with the
  instruction to answer a call as `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`.
- An assistant message's `tool_calls` are appended to its content in that same format.
- `tool` messages become one user message per run of them, each result inside
  `<tool_response>...</tool_response>`.

So a model without tool training sees the same protocol a Hermes-tuned one does, and its answer
is parsed the same way (gateway/tool_calls.py).
"""

from __future__ import annotations

import json
from typing import Any

import pydantic_core

OPEN, CLOSE = "<tool_call>", "</tool_call>"

_PREAMBLE = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
             "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
_INSTRUCTION = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                "\"arguments\": <args-json-object>}\n</tool_call>")


def tools_system_text(tools: list[dict[str, Any]]) -> str:
    lines = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
    return _PREAMBLE + lines + _INSTRUCTION


def call_text(call: dict[str, Any]) -> str:
    """One call as the model writes it; `arguments` may be a dict or the JSON string OpenAI sends."""
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            # Refuses lone surrogate escapes (text no tokenizer encodes) and bounds the nesting.
            arguments = pydantic_core.from_json(arguments)
        except ValueError:
            pass     # kept as the string it is
    body = json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
    return f"{OPEN}\n{body}\n{CLOSE}"


def without_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The conversation as plain role/content messages (see the module docstring)."""
    out: list[dict[str, Any]] = []
    if tools:
        system = tools_system_text(tools)
        if messages and messages[0].get("role") == "system":
            out.append({"role": "system", "content": f"{messages[0].get('content') or ''}\n\n{system}"})
            messages = messages[1:]
        else:
            out.append({"role": "system", "content": system})
    for message in messages:
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            parts = [message.get("content") or ""] + [call_text(c) for c in message["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join(p for p in parts if p)})
        elif role == "tool":
            response = f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"
            if out and out[-1].get("_tool_responses"):
                out[-1]["content"] += "\n" + response
            else:
                out.append({"role": "user", "content": response, "_tool_responses": True})
        else:
            out.append({"role": role, "content": message.get("content") or ""})
    for message in out:
        message.pop("_tool_responses", None)
    return out
