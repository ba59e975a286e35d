"""The sampler's mask pieces: llguidance's int32 bitmask unpacked to one bool per token (bit j of
word w is token 32 w + j, bit 31 the sign bit included), applied to the constrained rows only."""

from __future__ import annotations

import torch

from engines.grammar.mask import _bit, apply_masks, unpack


def _reference(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    out = torch.zeros(bitmask.shape[0], vocab, dtype=torch.bool)
    for r in range(bitmask.shape[0]):
        for t in range(vocab):
            out[r, t] = (int(bitmask[r, t // 32]) >> (t % 32)) & 1 == 1
    return out


def test_unpack_matches_the_bit_layout():
    g = torch.Generator().manual_seed(0)
    vocab = 100                                  # not a multiple of 32: the last word is cut
    bitmask = torch.randint(-2**31, 2**31 - 1, (3, 4), dtype=torch.int32, generator=g)
    assert torch.equal(unpack(bitmask, vocab), _reference(bitmask, vocab))
    one = torch.zeros(1, 4, dtype=torch.int32)
    one[0, 2] = _bit(31)                         # token 95 alone, through the sign bit
    assert unpack(one, vocab).nonzero().tolist() == [[0, 95]]


def test_only_constrained_rows_change():
    logits = torch.randn(4, 8)
    allowed = torch.tensor([[True, False] * 4, [False] * 7 + [True]])
    out = apply_masks(logits, [1, 3], allowed)
    assert torch.equal(out[[0, 2]], logits[[0, 2]])
    assert torch.equal(out[1, ::2], logits[1, ::2]) and torch.isinf(out[1, 1::2]).all()
    assert out[3].argmax() == 7 and torch.isinf(out[3, :7]).all()
    assert torch.equal(apply_masks(logits[:2], [0, 1], allowed), logits[:2].masked_fill(~allowed, float("-inf")))
