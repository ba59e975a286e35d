"""Prompt lookup: the longest suffix that occurred before, its latest occurrence, k tokens."""

from __future__ import annotations

import numpy as np

from engines.sampling_params import SamplingParams
from engines.scheduler import ScheduledSeq
from engines.sequence import Sequence
from engines.spec.ngram import NgramSource, lookup


def _lookup(tokens, k=3, n_min=1, n_max=4):
    return lookup(np.array(tokens), n_min, n_max, k)


def test_latest_earlier_occurrence_of_the_suffix_is_continued():
    assert _lookup([1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 8, 2, 3]) == [4, 7, 8]


def test_longer_suffixes_win_over_more_recent_short_ones():
    # "5 2 3" occurred at the start (followed by 6); "2 3" alone more recently (followed by 9).
    assert _lookup([5, 2, 3, 6, 0, 2, 3, 9, 5, 2, 3]) == [6, 0, 2]
    assert _lookup([5, 2, 3, 6, 0, 2, 3, 9, 5, 2, 3], n_max=2) == [9, 5, 2]


def test_the_suffix_never_matches_itself_and_k_limits_the_proposal():
    assert _lookup([7, 8, 9]) == []
    assert _lookup([4]) == []
    assert _lookup([1, 1, 1, 1], k=8) == [1]           # the match ending one before the end: one token left
    assert _lookup([1, 2, 3, 1, 2, 3, 1, 2], k=2) == [3, 1]
    assert _lookup([1, 2, 3, 1], n_min=2) == []         # a single-token match is below n_min


def test_source_fills_point_mass_drafts_from_prompt_and_output():
    seq = Sequence("a", [10, 11, 12, 13, 10, 11], SamplingParams())
    seq.output_ids = [12]
    s = ScheduledSeq(seq, start=6, num_tokens=1, num_lookahead=2)
    NgramSource(1, 3).propose([(s, 2)])
    assert s.draft_ids == [13, 10] and s.draft_probs is None
