"""The interface every draft source implements."""

from __future__ import annotations

from typing import Protocol

from engines.scheduler import ScheduledSeq


class DraftSource(Protocol):
    name: str                   # "ngram", "draft" or "self": the key of its counters

    def propose(self, entries: list[tuple[ScheduledSeq, int]]) -> float | None:
        """Fill `draft_ids` (at most k tokens, maybe none) and `draft_probs` of each
        (scheduled decoding sequence, k). Drafts come from the distribution in `draft_probs`
        (rows per draft token, the sequence's sampling settings applied); None means a point
        mass (or a greedy request, which needs no distribution). Returns the seconds one
        draft token took for the whole batch (one draft decode step; a lookup's time), or
        None when this call measured none, for the cost estimate of adaptive k."""
        ...
