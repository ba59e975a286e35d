"""The paged-cache ops on Triton, with the interface of kernels.dispatch.AttentionOps.

Per step the attention picks its kernel without a device sync: when the step has one token
per sequence (T == rows of the block table) the split-K decode kernel, otherwise the
extend kernel, whose tiles are computed once per step and reused by every layer.
Shapes the kernels do not cover (head dim or block size not a power of two) run the
torch reference, with one warning.
"""

from __future__ import annotations

import logging

import torch

from kernels.reference import paged_attention_ref
from kernels.triton._common import num_sms
from kernels.triton.attention_common import pages_per_step, unsupported_reason
from kernels.triton.decode_attention import choose_splits, launch_decode
from kernels.triton.extend_attention import block_tokens, extend_tiles, launch_extend
from kernels.triton.store_kv import write_kv_quantized_triton, write_kv_triton

log = logging.getLogger(__name__)


class TritonAttentionOps:
    name = "triton"

    def __init__(self) -> None:
        # One step's extend tiles, keyed by the identity of its seq_of_token tensor (held,
        # so the id cannot be reused while cached).
        self._tiles_for: torch.Tensor | None = None
        self._tiles: torch.Tensor | None = None
        self._host_for: torch.Tensor | None = None
        self._host_seqs: list[int] | None = None
        self._warned = False

    def begin_step(self, seq_of_token: torch.Tensor, seq_of_token_host: list[int] | None) -> None:
        self._host_for, self._host_seqs = seq_of_token, seq_of_token_host

    def write_kv(self, k, v, k_pool, v_pool, slot_mapping, kv_scales=None) -> None:
        """kv_scales: (k_scale, v_scale) for an int8 or FP8 pool, else None."""
        if kv_scales is None:
            write_kv_triton(k, v, k_pool, v_pool, slot_mapping)
        else:
            write_kv_quantized_triton(k, v, k_pool, v_pool, *kv_scales, slot_mapping)

    def paged_attention(self, q, k_pool, v_pool, block_tables, seq_of_token, context_lens, scale: float,
                        kv_scales=None):
        reason = unsupported_reason(q, k_pool, v_pool, kv_scales)
        if reason:
            if not self._warned:
                log.warning("Triton attention cannot take this cache (%s); using the torch reference", reason)
                self._warned = True
            return paged_attention_ref(q, k_pool, v_pool, block_tables, seq_of_token, context_lens, scale, kv_scales)
        if q.shape[0] == block_tables.shape[0]:
            bs = k_pool.shape[3]
            splits = choose_splits(q.shape[0], k_pool.shape[0], block_tables.shape[1] * bs, pages_per_step(bs) * bs,
                                   num_sms(q.device))
            return launch_decode(q, k_pool, v_pool, block_tables, seq_of_token, context_lens, scale, kv_scales, splits)
        if self._tiles_for is not seq_of_token:
            host = self._host_seqs if self._host_for is seq_of_token else None
            self._tiles = extend_tiles(seq_of_token, block_tokens(q.shape[1] // k_pool.shape[0]), host)
            self._tiles_for = seq_of_token
        return launch_extend(q, k_pool, v_pool, block_tables, seq_of_token, context_lens, scale, kv_scales,
                             self._tiles)
