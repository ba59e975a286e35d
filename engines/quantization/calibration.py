"""Calibration text for the activation-aware methods (AWQ, GPTQ).

The engine reads no data set of its own: the caller passes a `CalibrationSource` (the CLI takes
it from bench/datasets). Its name is part of every artifact's settings, so artifacts calibrated
on other text are never mixed up in the cache.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

Conversation = list[dict[str, str]]     # chat messages: {"role": ..., "content": ...}
MIN_CALIBRATION_TOKENS = 64


@dataclass(frozen=True)
class CalibrationSource:
    name: str                                       # recorded in the artifact, e.g. "ShareGPT 2,000-6,000"
    conversations: Callable[[], Iterable[Conversation]]


def calibration_sequences(tokenizer, chat_template, source: CalibrationSource, n: int = 16,
                          max_tokens: int = 256) -> list[list[int]]:
    """Token ids of the first `n` conversations of `source` with at least 64 tokens, cut to `max_tokens`."""
    out: list[list[int]] = []
    for messages in source.conversations():
        if len(out) == n:
            break
        ids = tokenizer.encode(chat_template.render(messages, add_generation_prompt=False))[:max_tokens]
        if len(ids) >= MIN_CALIBRATION_TOKENS:
            out.append(ids)
    return out
