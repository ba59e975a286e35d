"""Completions' logprobs from the engine's token scores: alternatives that read alike keep the
likeliest one's value (the sampled token keeps its own), and text offsets count the characters
a token's bytes complete."""

from __future__ import annotations

from engines.sampler import TokenLogprob
from gateway.openai_format import TextOffsets, completion_logprobs


class _Bytes:
    """Token i is byte i; no text offsets are asked of it."""

    def piece(self, token_id: int) -> tuple[str, list[int]]:
        return bytes([token_id]).decode("utf-8", errors="replace"), [token_id]



class _NoOffsets:
    def next(self, token_id: int) -> int:
        return 0


def test_alternatives_that_read_alike_keep_the_likeliest_value():
    # 0xC3 and 0xA9 both read as U+FFFD alone; the likelier (0xC3) comes first.
    lp = TokenLogprob(ord("a"), -2.0, [(0xC3, -0.3), (ord("a"), -2.0), (0xA9, -4.7)])
    top = completion_logprobs([lp], _Bytes(), _NoOffsets())["top_logprobs"][0]
    assert top == {"\ufffd": -0.3, "a": -2.0}
    sampled = TokenLogprob(0xA9, -4.7, [(0xC3, -0.3), (ord("a"), -2.0), (0xA9, -4.7)])
    assert completion_logprobs([sampled], _Bytes(), _NoOffsets())["top_logprobs"][0]["\ufffd"] == -4.7   # its own value


def test_offsets_count_completed_characters_across_chunks(tmp_path):
    from engines.tokenizer import TextTokenizer
    from gateway.openai_format import TokenPieces
    from tests.tiny_models import write_tiny_byte_checkpoint

    write_tiny_byte_checkpoint(tmp_path)
    tok = TextTokenizer.from_file(tmp_path / "tokenizer.json", {})
    pieces = TokenPieces(tok)
    ids = tok.encode("aé€b", add_special_tokens=False)          # one token per byte: 1 + 2 + 3 + 1
    offsets = TextOffsets(pieces)
    first = completion_logprobs([TokenLogprob(t, -1.0, []) for t in ids[:3]], pieces, offsets)["text_offset"]
    rest = completion_logprobs([TokenLogprob(t, -1.0, []) for t in ids[3:]], pieces, offsets)["text_offset"]
    assert first + rest == [0, 1, 1, 2, 2, 2, 3]
