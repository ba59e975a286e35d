"""The tokenizers of upstream tiers that name one (`tokenizer:`, a tokenizer.json), for their
budget reservations (gateway/token_bounds.py).

A file is loaded once (off the event loop: a 50k-token vocabulary takes ~0.2 s) and shared by
every tier and every reload that names the same path. A file that cannot be loaded is logged
once and counted without (the byte bound still holds); the config checked that it exists.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

from gateway.token_bounds import TextCounter

log = logging.getLogger(__name__)


class TokenizerCounter:
    """Tokens per text by one tokenizer, special-token strings counted as plain text: an upstream
    may parse them either way, and as text they are never fewer tokens."""

    def __init__(self, tokenizer: Tokenizer):
        tokenizer.encode_special_tokens = True
        self._tokenizer = tokenizer

    @classmethod
    def from_file(cls, path: str | Path) -> TokenizerCounter:
        return cls(Tokenizer.from_file(str(path)))

    def __call__(self, texts: Sequence[str]) -> list[int]:
        encoded = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [len(e.ids) for e in encoded]


def _load(path: str) -> TokenizerCounter | None:
    try:
        return TokenizerCounter.from_file(path)
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception on a bad file
        log.error("tokenizer %s could not be loaded (%s); its tier's prompts are bounded by their bytes", path, exc)
        return None


class TierTokenizers:
    def __init__(self) -> None:
        self._loaded: dict[str, TextCounter | None] = {}
        self._loading: dict[str, asyncio.Task] = {}

    async def counter(self, path: str | Path | None) -> TextCounter | None:
        if path is None:
            return None
        key = str(path)
        if key in self._loaded:
            return self._loaded[key]
        task = self._loading.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(asyncio.to_thread(_load, key))
            self._loading[key] = task
            task.add_done_callback(lambda done: self._done(key, done))
        # shield: a request cancelled while it waits must not cancel the load others wait for
        return await asyncio.shield(task)

    def _done(self, key: str, task: asyncio.Task) -> None:
        self._loading.pop(key, None)
        if not task.cancelled() and task.exception() is None:
            self._loaded[key] = task.result()
