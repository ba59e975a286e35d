"""Render chat messages with the model's own Jinja template, as transformers does."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
from jinja2.defaults import DEFAULT_NAMESPACE
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engines.errors import ModelLoadError
from engines.tool_prompt import without_tools

# Used only when a model ships no template at all.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# Variables the renderer itself sets, and Jinja's own globals (`namespace`, `range`, ...): a
# caller's extra template variables may not replace them.
RESERVED_VARIABLES = frozenset({"messages", "tools", "add_generation_prompt", "continue_final_message",
                                "bos_token", "eos_token", "raise_exception", "strftime_now"}) | \
    frozenset(DEFAULT_NAMESPACE)

# Stands in for the final message's content while rendering a conversation to be continued: where
# it lands is where that message's text begins, whatever the template writes around it.
_CONTINUE_MARK = "\x00tiergate-continue-final-message\x00"


class ChatTemplateError(ValueError):
    """The template refused the messages (raise_exception in the template)."""


def _raise(message: str):
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    # transformers' filter, not jinja's: jinja's sorts keys and escapes HTML, so a tool schema
    # (Qwen's template prints `tools | tojson`) would read differently from what the model was tuned on.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class ChatTemplate:
    def __init__(self, source: str | None, bos_token: str | None = None, eos_token: str | None = None):
        self.source = source or CHATML_TEMPLATE
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = _raise
        env.filters["tojson"] = _tojson
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(self.source)
        except jinja2.TemplateSyntaxError as exc:
            raise ModelLoadError(f"chat template does not parse (line {exc.lineno}: {exc.message})") from None

    @property
    def supports_tools(self) -> bool:
        """The template renders `tools` and tool-call turns itself (Qwen's does; ChatML does not)."""
        return "tools" in self.source

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None, continue_final_message: bool = False,
               variables: dict[str, Any] | None = None) -> str:
        """`tools` (OpenAI's tool definitions) go to a template that supports them as `tools`; for
        one that does not, the conversation is rewritten in the Hermes format first
        (engines/tool_prompt.py). Messages may carry `tool_calls` and `tool` turns either way.

        `continue_final_message` leaves the final message open, without the end of its turn, so
        that the model goes on writing it (a prefilled answer). `variables` are the template's own
        (e.g. a template's switches); none may be one of RESERVED_VARIABLES."""
        extra = dict(variables or {})
        clash = RESERVED_VARIABLES.intersection(extra)
        if clash:
            raise ChatTemplateError(f"template variable {sorted(clash)[0]!r} is set by the renderer")
        if continue_final_message:
            if add_generation_prompt:
                raise ChatTemplateError("continue_final_message and add_generation_prompt exclude each other")
            return self._continued(messages, tools, extra)
        return self._render(messages, add_generation_prompt, tools, extra)

    def _continued(self, messages: list[dict[str, Any]], tools, extra: dict[str, Any]) -> str:
        final = messages[-1]
        content = final.get("content") or ""
        if not isinstance(content, str) or _CONTINUE_MARK in content:
            raise ChatTemplateError("the final message cannot be continued")
        marked = messages[:-1] + [{**final, "content": _CONTINUE_MARK}]
        text = self._render(marked, False, tools, extra)
        at = text.rfind(_CONTINUE_MARK)
        if at < 0:
            raise ChatTemplateError("the chat template does not print the final message's content, so it cannot be continued")
        return text[:at] + content

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool, tools, extra: dict[str, Any]) -> str:
        if not self.supports_tools:
            if tools or any(m.get("tool_calls") or m.get("role") == "tool" for m in messages):
                messages = without_tools(messages, tools)
        elif tools:
            extra = {**extra, "tools": tools}
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            )
        except ChatTemplateError:
            raise
        except (jinja2.TemplateError, TypeError, ValueError, AttributeError, KeyError, IndexError,
                ArithmeticError, RecursionError) as exc:
            # A template reading a caller's variable of a type it does not expect fails in Python,
            # not in Jinja: still the request's fault.
            raise ChatTemplateError(f"chat template failed: {exc}") from None
