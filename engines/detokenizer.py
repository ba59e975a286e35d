"""Incremental detokenization with stop strings.

Byte-level tokens can end inside a UTF-8 character, so text is produced only once it
decodes cleanly. Text that might be the start of a stop string is held back from the
stream until it is known not to be one.
"""

from __future__ import annotations

from engines.tokenizer import TextTokenizer

class IncrementalDetokenizer:
    def __init__(self, tokenizer: TextTokenizer, stop: list[str], include_stop: bool = False,
                 skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stop = stop
        self.include_stop = include_stop
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""
        self._emitted = 0
        self.stopped = False
        self.matched: str | None = None      # the stop string that ended the text

    def push(self, token_id: int, check_stop: bool = True) -> bool:
        """Add a token; return True when a stop string completed (text is cut there). With
        `check_stop` false the token's text is not searched: a stop string that ends in it
        does not count (min_tokens)."""
        self._ids.append(token_id)
        decode, skip = self.tokenizer.decode, self.skip_special_tokens
        before = decode(self._ids[self._prefix_offset:self._read_offset], skip_special_tokens=skip)
        now = decode(self._ids[self._prefix_offset:], skip_special_tokens=skip)
        if len(now) <= len(before) or now.endswith("\ufffd"):
            return False
        old_end = len(self.text)
        self.text += now[len(before):]
        # The window slides: the tokens just rendered become the context for the next ones.
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return check_stop and self._check_stop(old_end)

    def _check_stop(self, old_end: int) -> bool:
        """A stop string counts only where it reaches into the text added after `old_end`: one
        wholly before it was searched already, or was not to be searched (min_tokens)."""
        if not self.stop:
            return False
        found = [(i, s) for s in self.stop if (i := self.text.find(s, max(0, old_end - len(s) + 1))) >= 0]
        if not found:
            return False
        index, stop = min(found, key=lambda hit: hit[0])     # where two start together: the first listed
        self.text = self.text[: index + len(stop) if self.include_stop else index]
        self.stopped = True
        self.matched = stop
        return True

    def take_delta(self, final: bool) -> str:
        """New text safe to send: everything when final, else all but a possible stop prefix."""
        end = len(self.text) if (final or self.stopped) else max(self._emitted, len(self.text) - self._hold)
        delta = self.text[self._emitted:end]
        self._emitted = end
        return delta
