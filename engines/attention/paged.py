"""Attention over the paged KV pool.

A step is flat: every token being computed — a decode token or a token of a prefill
chunk — attends over the first `context_len` positions of its own sequence (causality is
that length). Per layer, one op writes the step's new K/V into the pool and one op
attends for all tokens, reading the pool in place through block tables (kernels/: a C++
kernel on CPU, the torch reference where it cannot be built). The tensors describing the
step are built once, in `build_step_metadata`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engines.kv_cache import KVPool
from kernels.dispatch import AttentionOps


@dataclass
class PagedStepMetadata:
    slot_mapping: torch.Tensor    # [T] destination slot of every new token
    block_tables: torch.Tensor    # [S, max_blocks] per scheduled sequence (short rows padded)
    seq_of_token: torch.Tensor    # [T] row of block_tables for each token
    context_lens: torch.Tensor    # [T] positions each token attends over, itself included


def build_step_metadata(block_size: int, chunks: list[tuple[list[int], int, int]]) -> PagedStepMetadata:
    """chunks: (block_table, first position, number of tokens) per sequence, in flat order."""
    max_blocks = max(-(-(start + n) // block_size) for _, start, n in chunks)
    rows, slots, seq_of_token, lens = [], [], [], []
    for i, (table, start, n) in enumerate(chunks):
        used = -(-(start + n) // block_size)
        rows.append(table[:used] + [table[0]] * (max_blocks - used))
        slots.extend(table[p // block_size] * block_size + p % block_size for p in range(start, start + n))
        seq_of_token.extend([i] * n)
        lens.extend(range(start + 1, start + n + 1))
    return PagedStepMetadata(
        torch.tensor(slots, dtype=torch.long),
        torch.tensor(rows, dtype=torch.long),
        torch.tensor(seq_of_token, dtype=torch.long),
        torch.tensor(lens, dtype=torch.long),
    )


class PagedAttention:
    def __init__(self, pool: KVPool, ops: AttentionOps | None = None):
        self.pool = pool
        self.ops = ops or AttentionOps(pool.k.device)
        self.meta: PagedStepMetadata | None = None

    def prepare(self, meta: PagedStepMetadata) -> None:
        self.meta = meta

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        meta, pool = self.meta, self.pool
        scales = pool.scales(layer)
        self.ops.write_kv(k, v, pool.k[layer], pool.v[layer], meta.slot_mapping, scales)
        return self.ops.paged_attention(q, pool.k[layer], pool.v[layer], meta.block_tables, meta.seq_of_token,
                                        meta.context_lens, q.shape[-1] ** -0.5, scales)
