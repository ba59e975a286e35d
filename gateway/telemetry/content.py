"""Prompt and completion text in the GenAI message shape (gen_ai.input/output.messages).

Used only when both the operator (telemetry.record_content) and the tenant opted in; the
tracing module never calls these otherwise. Span event attributes cannot hold nested maps
in the Python SDK, so the structured messages travel as JSON strings.

Capped, as an upstream's failure detail is: the texts of one message list (or of one request's
outputs) keep CONTENT_LIMIT characters in all, so a megabyte prompt is not a megabyte span event
per tier call; a text cut short ends with a marker saying how many characters were left out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

CONTENT_LIMIT = 64 * 1024          # characters of text per message list / per request's outputs


def input_messages(messages: Sequence[Mapping[str, Any]] | str) -> str:
    """OpenAI chat messages (or a completions prompt) as gen_ai.input.messages JSON."""
    budget = _Budget()
    if isinstance(messages, str):
        return _dump([{"role": "user", "parts": [budget.text(messages)]}])
    out = []
    for message in messages:
        out.append({"role": str(message.get("role", "user")), "parts": _parts(message.get("content"), budget)})
    return _dump(out)


def output_messages(texts: Sequence[str], finish_reasons: Sequence[str | None]) -> str:
    """One assistant message per choice, in choice order, as gen_ai.output.messages JSON."""
    budget = _Budget()
    out = []
    for i, text in enumerate(texts):
        reason = finish_reasons[i] if i < len(finish_reasons) else None
        out.append({"role": "assistant", "parts": [budget.text(text)], "finish_reason": reason or "error"})
    return _dump(out)


def _parts(content: Any, budget: _Budget) -> list[dict]:
    if content is None:
        return []
    if isinstance(content, str):
        return [budget.text(content)]
    parts = []
    for part in content:  # OpenAI content parts: {"type": "text", "text": ...}
        if isinstance(part, Mapping) and part.get("type") == "text":
            parts.append(budget.text(str(part.get("text", ""))))
        elif isinstance(part, Mapping):
            parts.append({"type": str(part.get("type", "unknown"))})  # non-text parts: type only
    return parts


class _Budget:
    """The characters of text one JSON document may still record."""

    __slots__ = ("left",)

    def __init__(self, limit: int = CONTENT_LIMIT):
        self.left = limit

    def text(self, text: str) -> dict:
        if len(text) > self.left:
            kept = text[:self.left]
            text = f"{kept}[... {len(text) - len(kept)} characters not recorded]"
            self.left = 0
        else:
            self.left -= len(text)
        return {"type": "text", "content": text}


def _dump(value: list) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
