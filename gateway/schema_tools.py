"""The request fields of OpenAI's tool calling, validated so that classification and routing can
read them: `tools`, `tool_choice`, `parallel_tool_calls`.

They are checked here and forwarded unchanged: an upstream tier receives them as the client sent
them (the models keep unknown keys and their order, and dumping with exclude_unset gives back what
was sent); an embedded tier renders them with its chat template and parses or forces the calls
(gateway/tool_plan.py, gateway/tool_calls.py).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_serializer, model_validator

from gateway.response_format import MAX_SCHEMA_DEPTH, schema_depth

MAX_TOOLS = 128                     # OpenAI's own limit on functions per request
MAX_TOOLS_CHARS = 512 * 1024        # all tool definitions together, as JSON
MAX_DESCRIPTION_CHARS = 16 * 1024
TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


class _Part(BaseModel):
    """Dumped with its keys in the order the client sent them (pydantic would put the declared
    fields first): an upstream receives the tool definitions as they were written."""
    model_config = ConfigDict(extra="allow", strict=True)
    _order: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _note_order(cls, data, handler):
        part = handler(data)
        if isinstance(data, dict):
            part._order = tuple(data)
        return part

    @model_serializer(mode="wrap")
    def _in_sent_order(self, handler):
        out = handler(self)
        if not self._order or not isinstance(out, dict):
            return out
        ordered = {k: out[k] for k in self._order if k in out}
        ordered.update((k, v) for k, v in out.items() if k not in ordered)
        return ordered


class FunctionDefinition(_Part):
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str | None = Field(None, max_length=MAX_DESCRIPTION_CHARS)
    parameters: dict[str, Any] | None = Field(None, description="a JSON Schema object")
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _an_object(cls, value):
        # The arguments are an object (OpenAI refuses any other type here too).
        if value is not None and "type" in value and value["type"] != "object":
            raise ValueError(f"parameters must be the JSON Schema of an object (type 'object'), not "
                             f"type {str(value['type'])[:64]!r}")
        return value


class Tool(_Part):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Part):
    name: str = Field(pattern=TOOL_NAME_PATTERN)


class NamedToolChoice(_Part):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


def check_tools(tools: list[Tool]) -> None:
    """What the per-item checks cannot see: the size of all definitions together. Raises
    ValueError. (Two functions of one name are the model's problem, as at OpenAI.)"""
    size = sum(len(json.dumps(t.model_dump(exclude_unset=True), separators=(",", ":"))) for t in tools)
    if size > MAX_TOOLS_CHARS:
        raise ValueError(f"tools may hold at most {MAX_TOOLS_CHARS} characters of definitions, not {size}")
    for tool in tools:
        # An embedded tier compiles the parameters into a grammar: bounded like response_format's schema.
        if tool.function.parameters is not None and schema_depth(tool.function.parameters) > MAX_SCHEMA_DEPTH:
            raise ValueError(f"function '{tool.function.name}': parameters nest deeper than {MAX_SCHEMA_DEPTH} levels")


def check_tool_choice(choice: ToolChoice, tools: list[Tool] | None) -> None:
    """A choice other than "none" needs tools, and a named function must be one of them."""
    if choice == "none":
        return
    if not tools:
        raise ValueError("tool_choice is only allowed when tools are specified")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in {t.function.name for t in tools}:
        raise ValueError(f"tool_choice names function '{choice.function.name}', which tools does not define")
