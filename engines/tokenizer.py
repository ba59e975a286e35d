"""Text <-> token ids for a model, with its special tokens and stop ids."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from engines.errors import ModelLoadError

# tokenizers holds the GIL through `encode` and `decode` but releases it in their batch forms.
# Long inputs go through the batch forms so that a thread tokenizing a megabyte prompt leaves
# the event loop (and every other request on it) running; short ones keep the cheaper call.
_RELEASE_GIL_FROM = 2048


class TextTokenizer:
    def __init__(self, backend: Tokenizer, tokenizer_config: dict[str, Any], eos_token_id=None):
        self.backend = backend
        self.config = tokenizer_config
        self.bos_token = _token_text(tokenizer_config.get("bos_token"))
        self.eos_token = _token_text(tokenizer_config.get("eos_token"))
        self.bos_token_id = backend.token_to_id(self.bos_token) if self.bos_token else None
        self.add_bos = bool(tokenizer_config.get("add_bos_token", False)) and self.bos_token_id is not None
        eos_ids = set()
        if self.eos_token and backend.token_to_id(self.eos_token) is not None:
            eos_ids.add(backend.token_to_id(self.eos_token))
        if isinstance(eos_token_id, int):
            eos_ids.add(eos_token_id)
        elif isinstance(eos_token_id, list):
            eos_ids.update(eos_token_id)
        self.eos_token_ids: frozenset[int] = frozenset(eos_ids)
        added = backend.get_added_tokens_decoder()
        self.special_ids: frozenset[int] = frozenset(i for i, tok in added.items() if tok.special)
        # The special tokens' spellings, longest first (where one spelling starts another, the
        # longer is the token), found in text to keep them text (engines/chat_encoding.py).
        spellings = sorted({tok.content for tok in added.values() if tok.special and tok.content}, key=len, reverse=True)
        self.special_spelling: re.Pattern[str] | None = \
            re.compile("|".join(map(re.escape, spellings))) if spellings else None
        self._plain: Tokenizer | None = None
        self._plain_lock = threading.Lock()

    @classmethod
    def from_file(cls, path: Path, tokenizer_config: dict[str, Any], eos_token_id=None) -> "TextTokenizer":
        try:
            backend = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on malformed JSON
            raise ModelLoadError(f"{path} is not a valid tokenizer.json ({exc})") from None
        return cls(backend, tokenizer_config, eos_token_id)

    def eos_token_id_or(self, default: int) -> int:
        """One EOS id (e.g. to pad with), or `default` when the model names none."""
        return min(self.eos_token_ids) if self.eos_token_ids else default

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; special-token strings in it (e.g. ChatML tags) map to their ids."""
        ids = _encode(self.backend, text)
        return self.with_bos(ids) if add_special_tokens else ids

    def encode_as_text(self, text: str) -> list[int]:
        """Token ids of `text` with special-token spellings in it read as plain text ("<|im_end|>"
        as the characters '<', '|', ...), never as the special tokens."""
        return _encode(self.plain_encoder(), text)

    def with_bos(self, ids: list[int]) -> list[int]:
        """`ids` opened with the BOS token, where the tokenizer adds one and they do not start with it."""
        if self.add_bos and (not ids or ids[0] != self.bos_token_id):
            return [self.bos_token_id, *ids]
        return ids

    def plain_encoder(self) -> Tokenizer:
        """A copy of the tokenizer that reads special-token spellings as text. Built once (0.4 s
        for a 150k vocabulary): model loads build it off the serving path."""
        if self._plain is None:
            with self._plain_lock:
                if self._plain is None:
                    plain = Tokenizer.from_str(self.backend.to_str())
                    plain.encode_special_tokens = True
                    self._plain = plain
        return self._plain

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if len(ids) >= _RELEASE_GIL_FROM:
            return self.backend.decode_batch([ids], skip_special_tokens=skip_special_tokens)[0]
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)


def _encode(backend: Tokenizer, text: str) -> list[int]:
    if len(text) >= _RELEASE_GIL_FROM:
        return backend.encode_batch([text], add_special_tokens=False)[0].ids
    return backend.encode(text, add_special_tokens=False).ids


def _token_text(value) -> str | None:
    # tokenizer_config.json may hold a plain string or an AddedToken dict.
    if isinstance(value, dict):
        return value.get("content")
    return value
