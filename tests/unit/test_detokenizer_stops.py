"""Stop strings against text pushed unchecked (the tokens before min_tokens), on the tiny
byte-level tokenizer: a stop string wholly inside that text never counts, one that reaches past
it does."""

from __future__ import annotations

import pytest

from engines.detokenizer import IncrementalDetokenizer
from engines.tokenizer import TextTokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from tests.tiny_models import write_tiny_byte_checkpoint

    path = tmp_path_factory.mktemp("bytes")
    write_tiny_byte_checkpoint(path)
    return TextTokenizer.from_file(path / "tokenizer.json", {})


def _push(detok, tok, text, check):
    return [detok.push(tok.encode(ch, add_special_tokens=False)[0], check) for ch in text]


def test_a_stop_string_inside_unchecked_text_never_counts(tok):
    detok = IncrementalDetokenizer(tok, stop=["\n", "END"])
    assert _push(detok, tok, "a\n", check=False) == [False, False]
    assert _push(detok, tok, "bc", check=True) == [False, False]      # the longer stop string's window holds "\n"
    assert _push(detok, tok, "xEND", check=True) == [False, False, False, True]
    assert detok.text == "a\nbcx"


def test_a_stop_string_reaching_past_the_unchecked_text_counts(tok):
    detok = IncrementalDetokenizer(tok, stop=["ab"], include_stop=True)
    _push(detok, tok, "xa", check=False)
    assert _push(detok, tok, "b", check=True) == [True]
    assert detok.text == "xab"
