"""The request fields of OpenAI's tool calling, validated so that classification and routing can
read them: `tools`, `tool_choice`, `parallel_tool_calls`.

They are checked here and forwarded unchanged: an upstream tier receives them as the client sent
them (the models keep unknown keys, and dumping with exclude_unset gives back what was sent); an
embedded tier cannot honour them yet, so routing passes it over (SkipReason.CAPABILITY).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_TOOLS = 128                     # OpenAI's own limit on functions per request
MAX_TOOLS_CHARS = 512 * 1024        # all tool definitions together, as JSON
MAX_DESCRIPTION_CHARS = 16 * 1024
TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class FunctionDefinition(_Part):
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str | None = Field(None, max_length=MAX_DESCRIPTION_CHARS)
    parameters: dict[str, Any] | None = Field(None, description="a JSON Schema object")
    strict: bool | None = None


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


def check_tool_choice(choice: ToolChoice, tools: list[Tool] | None) -> None:
    """A choice other than "none" needs tools, and a named function must be one of them."""
    if choice == "none":
        return
    if not tools:
        raise ValueError("tool_choice is only allowed when tools are specified")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in {t.function.name for t in tools}:
        raise ValueError(f"tool_choice names function '{choice.function.name}', which tools does not define")
