"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of the
context's last n tokens (n from ngram_max down to ngram_min). No model, no KV; a proposal
is a point mass, which the exact acceptance rule handles (accept with probability p(x))."""

from __future__ import annotations

import time

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from engines.model_runner import ModelRunner
from engines.scheduler import ScheduledSeq


def lookup(tokens: np.ndarray, n_min: int, n_max: int, k: int) -> list[int]:
    """Up to k tokens continuing the latest earlier match of the longest matching suffix."""
    length = len(tokens)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        suffix = tokens[length - n:]
        # Windows that end before the last token: the suffix itself never matches.
        windows = sliding_window_view(tokens[:length - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start:start + k].tolist()
    return []


class NgramSource:
    name = "ngram"

    def __init__(self, n_min: int, n_max: int):
        self.n_min, self.n_max = n_min, n_max

    def attach(self, target_runner: ModelRunner) -> None:
        """A lookup reads only token ids: nothing to take from the target's forwards."""

    def propose(self, entries: list[tuple[ScheduledSeq, int]]) -> float | None:
        started = time.perf_counter()
        for s, k in entries:
            tokens = np.array(s.seq.all_token_ids, dtype=np.int64)
            s.draft_ids = lookup(tokens, self.n_min, self.n_max, k)
            s.draft_probs = None
        return time.perf_counter() - started
