"""Attention over the paged KV pool.

A step is flat: every token being computed — a decode token or a token of a prefill
chunk — attends over the first `context_len` positions of its own sequence (causality is
that length). Per layer, one op writes the step's new K/V into the pool and one op
attends for all tokens, reading the pool in place through block tables (kernels/: a C++
kernel on CPU, the torch reference where it cannot be built). The tensors describing the
step are built once, in `build_step_metadata`, on the host, and reach the pool's device in
one copy.
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
    seq_of_token_host: list[int] | None = None   # the same on the host: kernels plan from it without a sync


_ALIGN = 2   # int64s: every tensor starts 16-byte aligned, as Triton specializes kernels on pointer alignment


def upload_int_lists(lists: list[list[int]], device: torch.device | str | None = None) -> list[torch.Tensor]:
    """int lists -> int64 tensors on `device`, with one host->device copy for all of them: one
    pinned buffer copied non_blocking on CUDA (stream-ordered before the kernels that read it;
    the caching host allocator keeps the buffer alive until the copy is done). On the CPU the
    tensors are views of one buffer, built as fast as separate ones. (CPU-only tests run the CPU
    and meta branches; bench/gpu_check.sh runs the CUDA one.)"""
    pads = [-len(values) % _ALIGN for values in lists]
    flat = torch.tensor([x for values, pad in zip(lists, pads) for x in (values + [0] * pad if pad else values)],
                        dtype=torch.long)
    device = torch.device(device or "cpu")
    if device.type == "cuda":
        flat = flat.pin_memory().to(device, non_blocking=True)
    elif device.type != "cpu":
        flat = flat.to(device)
    parts = flat.split([len(values) + pad for values, pad in zip(lists, pads)])
    return [part[:len(values)] if pad else part for part, values, pad in zip(parts, lists, pads)]


def step_index_lists(block_size: int, chunks: list[tuple[list[int], int, int]]
                     ) -> tuple[list[int], list[int], int, list[int], list[int]]:
    """(slots, block-table rows flattened, max_blocks, seq_of_token, context_lens) of a step."""
    max_blocks = max(-(-(start + n) // block_size) for _, start, n in chunks)
    rows, slots, seq_of_token, lens = [], [], [], []
    for i, (table, start, n) in enumerate(chunks):
        used = -(-(start + n) // block_size)
        rows.extend(table[:used])
        rows.extend([table[0]] * (max_blocks - used))
        slots.extend(table[p // block_size] * block_size + p % block_size for p in range(start, start + n))
        seq_of_token.extend([i] * n)
        lens.extend(range(start + 1, start + n + 1))
    return slots, rows, max_blocks, seq_of_token, lens


def build_step_metadata(block_size: int, chunks: list[tuple[list[int], int, int]],
                        device: torch.device | str | None = None) -> PagedStepMetadata:
    """chunks: (block_table, first position, number of tokens) per sequence, in flat order."""
    return build_step(block_size, chunks, device)[0]


def build_step(block_size: int, chunks: list[tuple[list[int], int, int]], device: torch.device | str | None = None,
               extra: list[list[int]] | None = None) -> tuple[PagedStepMetadata, list[torch.Tensor]]:
    """The step's metadata, and `extra` int lists (the runner's token ids, positions, logit
    rows) as tensors, all on `device` in one copy."""
    slots, rows, max_blocks, seq_of_token, lens = step_index_lists(block_size, chunks)
    tensors = upload_int_lists([slots, rows, seq_of_token, lens, *(extra or [])], device)
    meta = PagedStepMetadata(tensors[0], tensors[1].view(len(chunks), max_blocks), tensors[2], tensors[3],
                             seq_of_token)
    return meta, tensors[4:]


class PagedAttention:
    def __init__(self, pool: KVPool, ops: AttentionOps | None = None):
        self.pool = pool
        self.ops = ops or AttentionOps(pool.k.device)
        self.meta: PagedStepMetadata | None = None

    def prepare(self, meta: PagedStepMetadata) -> None:
        self.meta = meta
        self.ops.begin_step(meta.seq_of_token, meta.seq_of_token_host)

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        meta, pool = self.meta, self.pool
        scales = pool.scales(layer)
        self.ops.write_kv(k, v, pool.k[layer], pool.v[layer], meta.slot_mapping, scales)
        return self.ops.paged_attention(q, pool.k[layer], pool.v[layer], meta.block_tables, meta.seq_of_token,
                                        meta.context_lens, q.shape[-1] ** -0.5, scales)
