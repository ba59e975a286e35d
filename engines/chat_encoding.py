"""A chat's token ids, its messages' text kept as text.

A chat template writes each turn's markers (ChatML's <|im_start|> and <|im_end|>) as the special
tokens the model was trained on. A message, a tool call or a tool definition that spells one
of them is the client's text, not a marker: read as the special token, it would let a caller
forge a system turn or end its own turn early (HF's apply_chat_template and vLLM's default do
read it so). Here every special-token spelling in the client's strings is written into the
template as a placeholder the client cannot know (a fresh random one per chat), and the
rendered text is encoded piece by piece: the template's text with its markers as special
tokens, each placeholder as the spelling's plain text. A chat without such spellings is encoded
in one piece, exactly as before.

Completions prompts are not chats: there, as on vLLM, a special-token spelling is the token.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from typing import Any

from engines.tokenizer import TextTokenizer

Render = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], str]


def encode_chat(tokenizer: TextTokenizer, render: Render, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None, add_special_tokens: bool = True) -> list[int]:
    """render(messages, tools) -> the template's text; its token ids as described above."""
    spelling = tokenizer.special_spelling
    if spelling is None or not _spells_any(spelling, [messages, tools]):
        return tokenizer.encode(render(messages, tools), add_special_tokens)
    found: list[str] = []
    mark = f"TGSPELLING{secrets.token_hex(8)}N"

    def placeholder(match: re.Match[str]) -> str:
        found.append(match.group())
        return f"{mark}{len(found) - 1}E"

    text = render(_map_strings(messages, lambda s: spelling.sub(placeholder, s)),
                  _map_strings(tools, lambda s: spelling.sub(placeholder, s)))
    ids: list[int] = []
    for i, part in enumerate(re.split(f"{mark}([0-9]+)E", text)):
        if i % 2:
            ids += tokenizer.encode_as_text(found[int(part)])
        elif part:
            ids += tokenizer.encode(part, add_special_tokens=False)
    return tokenizer.with_bos(ids) if add_special_tokens else ids


def _spells_any(spelling: re.Pattern[str], value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if spelling.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def _map_strings(value: Any, change: Callable[[str], str]) -> Any:
    """A copy of `value` (JSON-like: the messages, the tools) with every string, keys too, changed.
    Recursive: the values' depth is bounded where they are parsed (the body's parser and the
    tool schemas' depth check)."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {change(k) if isinstance(k, str) else k: _map_strings(v, change) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_strings(v, change) for v in value]
    if isinstance(value, tuple):
        return tuple(_map_strings(v, change) for v in value)
    return value
