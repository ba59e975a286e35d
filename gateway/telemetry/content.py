"""Prompt and completion text in the GenAI message shape (gen_ai.input/output.messages).

Used only when both the operator (telemetry.record_content) and the tenant opted in; the
tracing module never calls these otherwise. Span event attributes cannot hold nested maps
in the Python SDK, so the structured messages travel as JSON strings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def input_messages(messages: Sequence[Mapping[str, Any]] | str) -> str:
    """OpenAI chat messages (or a completions prompt) as gen_ai.input.messages JSON."""
    if isinstance(messages, str):
        return _dump([{"role": "user", "parts": [_text(messages)]}])
    out = []
    for message in messages:
        out.append({"role": str(message.get("role", "user")), "parts": _parts(message.get("content"))})
    return _dump(out)


def output_messages(texts: Sequence[str], finish_reasons: Sequence[str | None]) -> str:
    """One assistant message per choice, in choice order, as gen_ai.output.messages JSON."""
    out = []
    for i, text in enumerate(texts):
        reason = finish_reasons[i] if i < len(finish_reasons) else None
        out.append({"role": "assistant", "parts": [_text(text)], "finish_reason": reason or "error"})
    return _dump(out)


def _parts(content: Any) -> list[dict]:
    if content is None:
        return []
    if isinstance(content, str):
        return [_text(content)]
    parts = []
    for part in content:  # OpenAI content parts: {"type": "text", "text": ...}
        if isinstance(part, Mapping) and part.get("type") == "text":
            parts.append(_text(str(part.get("text", ""))))
        elif isinstance(part, Mapping):
            parts.append({"type": str(part.get("type", "unknown"))})  # non-text parts: type only
    return parts


def _text(text: str) -> dict:
    return {"type": "text", "content": text}


def _dump(value: list) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
