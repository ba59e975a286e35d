"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of the
context's last n tokens (n from ngram_max down to ngram_min). No model, no KV; a proposal
is a point mass, which the exact acceptance rule handles (accept with probability p(x)).

A request with a predicted output (OpenAI's `prediction`: an edit's original text, say) drafts
from it first: while the output repeats the prediction, its next tokens; after the two part,
the tokens after the place in the prediction that the output's last n tokens match, the one
nearest the output's own position (an edit moves text locally)."""

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


# After a departure, the prediction is searched this far either side of the output's position:
# an edit moves text locally, and the search stays a few microseconds per step whatever the
# prediction's length.
REALIGN_WINDOW = 512


def follow_prediction(prediction: np.ndarray, output: np.ndarray, n_min: int, n_max: int, k: int) -> list[int]:
    """Up to k tokens of the prediction that should come next after `output`."""
    m = len(output)
    if m <= len(prediction) and np.array_equal(prediction[:m], output):
        return prediction[m:m + k].tolist()
    lo = max(0, m - REALIGN_WINDOW)
    region = prediction[lo:m + REALIGN_WINDOW]
    for n in range(min(n_max, m, len(region)), n_min - 1, -1):
        windows = sliding_window_view(region, n)
        hits = np.flatnonzero((windows == output[m - n:]).all(axis=1))
        if hits.size:
            ends = lo + hits + n
            start = int(ends[np.argmin(np.abs(ends - m))])
            return prediction[start:start + k].tolist()
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
            seq = s.seq
            draft = []
            if seq.params.prediction_token_ids:
                if seq.prediction_array is None:
                    seq.prediction_array = np.array(seq.params.prediction_token_ids, dtype=np.int64)
                output = np.array(seq.output_ids, dtype=np.int64)
                draft = follow_prediction(seq.prediction_array, output, self.n_min, self.n_max, k)
            if not draft:
                draft = lookup(np.array(seq.all_token_ids, dtype=np.int64), self.n_min, self.n_max, k)
            s.draft_ids = draft
            s.draft_probs = None
        return time.perf_counter() - started
