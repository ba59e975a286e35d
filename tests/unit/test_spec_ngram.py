"""Prompt lookup: the longest suffix that occurred before, its latest occurrence, k tokens."""

from __future__ import annotations

import numpy as np

from engines.sampling_params import SamplingParams
from engines.scheduler import ScheduledSeq
from engines.sequence import Sequence
from engines.spec.ngram import NgramSource, follow_prediction, lookup


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


def _follow(prediction, output, k=3, n_min=1, n_max=4):
    return follow_prediction(np.array(prediction), np.array(output, dtype=np.int64), n_min, n_max, k)


def test_an_output_that_repeats_the_prediction_is_drafted_its_next_tokens():
    assert _follow([5, 6, 7, 8, 9], []) == [5, 6, 7]
    assert _follow([5, 6, 7, 8, 9], [5, 6]) == [7, 8, 9]
    assert _follow([5, 6, 7, 8, 9], [5, 6, 7, 8], k=3) == [9]
    assert _follow([5, 6], [5, 6]) == []


def test_after_a_departure_the_nearest_matching_place_is_continued():
    # The output inserted 40 before 7 8: "7 8" is found again and followed.
    assert _follow([5, 6, 7, 8, 9, 1], [5, 6, 40, 7, 8]) == [9, 1]
    # "1 2" occurs twice in the prediction: the occurrence ending nearest the output's length wins.
    prediction = [1, 2, 3, 0, 0, 0, 0, 0, 1, 2, 4, 0]
    assert _follow(prediction, [9, 9, 1, 2], k=1) == [3]
    assert _follow(prediction, [9, 9, 9, 9, 9, 9, 9, 1, 2], k=1) == [4]
    assert _follow([5, 6, 7], [1, 2, 3]) == []


def test_source_drafts_from_the_prediction_before_the_context():
    seq = Sequence("a", [10, 11, 12, 13, 10, 11], SamplingParams(prediction_token_ids=(12, 14, 15, 16)))
    seq.output_ids = [12]
    s = ScheduledSeq(seq, start=6, num_tokens=1, num_lookahead=2)
    NgramSource(1, 3).propose([(s, 2)])
    assert s.draft_ids == [14, 15]             # not the prompt's 13 10
    seq.output_ids = [99]                      # nothing in the prediction matches: the context's lookup
    NgramSource(1, 3).propose([(s, 2)])
    assert s.draft_ids == []


def test_a_prediction_is_bounded_and_checked():
    import pytest

    from engines.sampling_params import MAX_PREDICTION_TOKENS, InvalidRequestError

    with pytest.raises(InvalidRequestError):
        SamplingParams(prediction_token_ids=(1,) * (MAX_PREDICTION_TOKENS + 1)).validate()
    with pytest.raises(InvalidRequestError):
        SamplingParams(prediction_token_ids=(-1,)).validate()


def test_realignment_looks_only_near_the_outputs_position():
    from engines.spec.ngram import REALIGN_WINDOW

    far = [1, 2, 3] + [0] * (4 * REALIGN_WINDOW) + [1, 2, 4]
    output = [9] * (2 * REALIGN_WINDOW) + [1, 2]
    assert _follow(far, output) == []            # both matches lie outside the window
    near = [0] * (2 * REALIGN_WINDOW) + [1, 2, 5]
    assert _follow(near, output, k=1) == [5]
