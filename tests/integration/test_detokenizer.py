"""Incremental detokenization on the real tokenizer: UTF-8 splits and stop strings."""

from __future__ import annotations

import pytest

from engines.detokenizer import IncrementalDetokenizer

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("text", ["Hello, world! 123", "emoji 😀👍🏽 and 日本語 text", "code:\n\tx = {'a': 1}"])
def test_streamed_deltas_rebuild_the_text(real_fp32, text):
    tok = real_fp32.tokenizer
    detok = IncrementalDetokenizer(tok, stop=[])
    pieces = []
    for token in tok.encode(text):
        detok.push(token)
        pieces.append(detok.take_delta(final=False))
        assert "\ufffd" not in pieces[-1]
    pieces.append(detok.take_delta(final=True))
    assert "".join(pieces) == text


def test_stop_string_across_tokens_is_never_streamed(real_fp32):
    tok = real_fp32.tokenizer
    detok = IncrementalDetokenizer(tok, stop=["STOP here"])
    streamed = ""
    stopped = False
    for token in tok.encode("some words then STOP here and more"):
        stopped = detok.push(token)
        streamed += detok.take_delta(final=stopped)
        if stopped:
            break
    assert stopped and streamed == "some words then "


def test_stop_strings_starting_at_the_same_place_end_at_the_first_listed(real_fp32):
    """vLLM's rule: where several stop strings are found at one place, the first listed wins."""
    tok = real_fp32.tokenizer
    for stop, kept in ((["four", "fo"], "one two three four"), (["fo", "four"], "one two three fo")):
        detok = IncrementalDetokenizer(tok, stop=stop, include_stop=True)
        assert any(detok.push(token) for token in tok.encode("one two three four five"))
        assert detok.text == kept
