"""The usage an upstream's stream reported, as one total to charge.

Usage in a stream is cumulative, never a piece to add up: OpenAI's closing usage chunk
(`choices: []`) is the whole request's; vLLM's continuous usage stats put in every chunk the usage
so far of that chunk's choice (its prompt's tokens, the tokens that choice has generated), and an
upstream may also put usage on its last content chunk before the closing one. Summing the reports
charged a 20-token answer 175 tokens. So a later report replaces an earlier one: per choice until
the closing chunk, which then replaces them all. A prompt's tokens count once for its n choices
(choices i*n .. i*n+n-1 share prompt i, as text completions number them). A chunk of several
choices carrying one usage is read as the request's so far, as a closing chunk is.
"""

from __future__ import annotations

from gateway.context import Usage


class StreamUsage:
    __slots__ = ("_cached", "_completion", "_counted", "_per_choice", "_per_prompt", "_prompt", "_whole", "n")

    def __init__(self, n: int):
        self.n = max(1, n)                   # choices per prompt
        self._per_choice: dict[int, int] = {}                 # index -> completion tokens so far
        self._per_prompt: dict[int, tuple[int, int]] = {}     # prompt -> (prompt tokens, cached)
        self._prompt = self._completion = self._cached = 0    # the per-choice reports' sums
        self._whole: Usage | None = None     # the last report for the whole request, if latest
        self._counted = Usage()              # what settle_into has added so far

    def report(self, usage: Usage, indexes: list[int]) -> None:
        """A chunk's usage; `indexes`: the chunk's choice indexes ([] for the closing chunk)."""
        if len(indexes) != 1:
            self._whole = usage
            return
        self._whole = None
        index = indexes[0]
        self._completion += usage.completion_tokens - self._per_choice.get(index, 0)
        self._per_choice[index] = usage.completion_tokens
        prompt, cached = self._per_prompt.get(index // self.n, (0, 0))
        self._prompt += usage.prompt_tokens - prompt
        self._cached += usage.cached_tokens - cached
        self._per_prompt[index // self.n] = (usage.prompt_tokens, usage.cached_tokens)

    @property
    def total(self) -> Usage | None:
        """The stream's usage so far; None when it reported none."""
        if self._whole is not None:
            return self._whole
        if not self._per_choice:
            return None
        return Usage(self._prompt, self._completion, self._cached)

    def settle_into(self, target: Usage) -> None:
        """Bring `target` (the request's usage, shared by its attempts) from what this stream
        added before to its total now: a later report replaces an earlier one there too."""
        total = self.total or Usage()
        counted = self._counted
        if total != counted:
            target.add(Usage(total.prompt_tokens - counted.prompt_tokens,
                             total.completion_tokens - counted.completion_tokens,
                             total.cached_tokens - counted.cached_tokens))
            self._counted = Usage(total.prompt_tokens, total.completion_tokens, total.cached_tokens)
