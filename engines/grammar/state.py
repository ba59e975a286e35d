"""One constrained sequence's place in its grammar: an llguidance matcher advanced by every token
the sequence appends, and nothing else.

The state follows the sequence's output tokens, not its KV: a preempted sequence is recomputed
from prompt + output with its matcher where it was, a prefix-cache hit changes no output token,
and an abort simply drops the state with the sequence.
"""

from __future__ import annotations

import llguidance

from engines.grammar.errors import GrammarError

MAX_DETAIL_CHARS = 200


class GrammarState:
    __slots__ = ("digest", "eos_ids", "matcher")

    def __init__(self, matcher: llguidance.LLMatcher, eos_ids: tuple[int, ...], digest: str):
        self.matcher = matcher
        self.eos_ids = eos_ids
        self.digest = digest

    def accept(self, token_id: int) -> bool:
        """Advance past a sampled token; False if the grammar refused it (the state is then in
        error, and the mask allows only EOS from here on)."""
        return self.matcher.consume_token(token_id)

    @property
    def is_stopped(self) -> bool:
        """Complete: nothing but EOS may follow (also true in error)."""
        return self.matcher.is_stopped()

    @property
    def is_error(self) -> bool:
        return self.matcher.is_error()

    @property
    def is_accepting(self) -> bool:
        return self.matcher.is_accepting()

    def failure(self, param: str) -> GrammarError | None:
        """Why the output could not go on under the constraint, once the matcher is in error: a
        schema no finite answer satisfies (a property that requires itself) or one past the parser's
        limits. The answer so far is not a complete one, so the request fails with this."""
        if not self.matcher.is_error():
            return None
        detail = " ".join(self.matcher.get_error().replace("<non-verbose/>", "").split())[:MAX_DETAIL_CHARS]
        return GrammarError(f"{param}: the answer could not be completed under the constraint ({detail})", param)
