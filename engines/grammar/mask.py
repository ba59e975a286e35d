"""Token masks of the constrained rows of a batch: one int32 bitmask row per constrained
sequence (llguidance's layout, 32 tokens per word), filled by llguidance's executor for all of
them at once, then unpacked and applied to those rows of the logits in one tensor operation.
Rows without a constraint are not touched (nor copied when no row has one)."""

from __future__ import annotations

import llguidance
import torch

from engines.grammar.state import GrammarState

# Byte value -> its 8 bits, lowest first. A little-endian int32 word's byte b holds the bits of
# tokens 32 w + 8 b ... + 7, so the mask read as bytes unpacks with one table lookup.
_BYTE_BITS = ((torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1).bool()


class MaskBuilder:
    """Reusable host buffers and the llguidance executor of one sampler."""

    def __init__(self, num_threads: int = 2):
        self._executor: llguidance.LLExecutor | None = None
        self._num_threads = num_threads
        self._buffer = torch.empty(0, dtype=torch.int32)

    def bitmask(self, states: list[GrammarState], vocab_size: int) -> torch.Tensor:
        """[len(states), ceil(vocab/32)] int32: bit j of word w allows token 32 w + j."""
        words = (vocab_size + 31) // 32
        n = len(states)
        if self._buffer.shape[0] < n or self._buffer.shape[1:] != (words,):
            self._buffer = torch.empty((max(n, 8), words), dtype=torch.int32)
        mask = self._buffer[:n]
        if self._executor is None:
            self._executor = llguidance.LLExecutor(num_threads=self._num_threads)
        self._executor.unsafe_compute_mask_ptr([(s.matcher, i) for i, s in enumerate(states)], mask.data_ptr(),
                                               words * 4, n)
        for i, s in enumerate(states):
            if s.is_error:
                # A refused token (never sampled under the mask, but a stop string or a caller may
                # force one) leaves the matcher in error: only EOS may follow, never an empty row.
                mask[i].zero_()
                for eos in s.eos_ids:
                    mask[i, eos // 32] |= _bit(eos % 32)
        return mask


def _bit(j: int) -> int:
    # Bit 31 of an int32 word is its sign bit.
    return (1 << j) - (1 << 32) if j == 31 else 1 << j


def unpack(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[n, words] int32 -> [n, vocab_size] bool (True = allowed)."""
    return _BYTE_BITS[bitmask.view(torch.uint8).long()].view(bitmask.shape[0], -1)[:, :vocab_size]


def apply_masks(logits: torch.Tensor, rows: list[int], allowed: torch.Tensor) -> torch.Tensor:
    """A copy of `logits` with the disallowed tokens of `rows` at -inf (the others unchanged)."""
    vocab = logits.shape[1]
    allowed = allowed[:, :vocab].to(logits.device, non_blocking=True)
    if len(rows) == logits.shape[0]:
        return logits.masked_fill(~allowed, float("-inf"))
    out = logits.clone()
    index = torch.tensor(rows, device=logits.device)
    out[index] = logits[index].masked_fill(~allowed, float("-inf"))
    return out
