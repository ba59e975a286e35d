"""The interface every draft source implements."""

from __future__ import annotations

from typing import Protocol

from engines.model_runner import ModelRunner
from engines.scheduler import ScheduledSeq


class DraftSource(Protocol):
    name: str                   # "ngram", "draft" or "self": the key of its counters

    def attach(self, target_runner: ModelRunner) -> None:
        """Join the target's forwards through the runner's public hooks, if the source
        needs to (the self-draft stores the target's K/V); called once, at build time."""
        ...

    def propose(self, entries: list[tuple[ScheduledSeq, int]]) -> float | None:
        """Fill `draft_ids` (at most k tokens, maybe none) and `draft_probs` of each
        (scheduled decoding sequence, k). Drafts come from the distribution in `draft_probs`
        (rows per draft token, the sequence's sampling settings applied); None means a point
        mass (or a greedy request, which needs no distribution). Returns the seconds one
        draft token took for the whole batch (one draft decode step; a lookup's time), or
        None when this call measured none, for the cost estimate of adaptive k."""
        ...
