"""The tokenizer we build from GGUF metadata matches transformers' token for token."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

TRICKY = [
    "Hello, world!",
    "1234567890 and 3.14159 and 1,000,000",
    "naïve café — Ünïcödé; Ελληνικά; 日本語のテキスト; русский",
    "emoji: 😀👍🏽🇫🇷 👨‍👩‍👧",
    "def f(x):\n\treturn x ** 2  # square\n\n\nclass A:\n    pass",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "   leading and trailing spaces   ",
    "tabs\tand\r\nwindows newlines",
    "",
    "a" * 300,
]


@pytest.mark.parametrize("text", TRICKY)
def test_encode_matches_transformers(real_fp32, hf_tokenizer, text):
    assert real_fp32.tokenizer.encode(text) == hf_tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("text", TRICKY)
def test_round_trip(real_fp32, text):
    tok = real_fp32.tokenizer
    assert tok.decode(tok.encode(text), skip_special_tokens=False) == text


def test_special_tokens_and_eos(real_fp32):
    tok = real_fp32.tokenizer
    assert tok.encode("<|im_end|>") == [2]
    assert tok.eos_token_ids == frozenset({2})
    assert tok.decode([1, 9690, 2]) == "system"
