"""Attention over the paged KV pool on CPU, in a few large torch calls per layer.

The runner lays a step out as [decode tokens (one per sequence) | prefill chunks].
Per layer: all new K/V are written with one index_copy_, the decode tokens attend in one
padded SDPA call over their gathered blocks, and each prefill chunk in one SDPA call.
Everything that depends on the step (gather indices, masks) is built once in `prepare`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engines.kv_cache import KVPool


@dataclass
class PrefillChunk:
    token_start: int          # offset of the chunk in the step's flat tokens
    num_tokens: int
    context_start: int        # position of the chunk's first token in its sequence
    block_table: torch.Tensor | None  # blocks covering [0, context_start + num_tokens); None if no cached context
    mask: torch.Tensor | None         # [num_tokens, context_len] when there is cached context


@dataclass
class PagedStepMetadata:
    slot_mapping: torch.Tensor        # [T] destination slot of every new token
    num_decode: int
    decode_block_tables: torch.Tensor | None  # [B, max_blocks]
    decode_mask: torch.Tensor | None          # [B, 1, 1, max_blocks * block_size]
    prefills: list[PrefillChunk]


def build_step_metadata(block_size: int, decode: list[tuple[list[int], int]],
                        prefills: list[tuple[list[int], int, int]], slot_mapping: torch.Tensor) -> PagedStepMetadata:
    """decode: (block_table, context_len incl. the new token) per decoding sequence;
    prefills: (block_table, context_start, num_tokens) per chunk, in flat order after decodes."""
    dec_tables = dec_mask = None
    if decode:
        max_blocks = max(-(-ctx // block_size) for _, ctx in decode)
        tables = torch.zeros(len(decode), max_blocks, dtype=torch.long)
        lens = torch.empty(len(decode), dtype=torch.long)
        for i, (table, ctx) in enumerate(decode):
            n = -(-ctx // block_size)
            tables[i, :n] = torch.tensor(table[:n])
            lens[i] = ctx
        dec_tables = tables
        dec_mask = (torch.arange(max_blocks * block_size).unsqueeze(0) < lens.unsqueeze(1))[:, None, None, :]
    chunks = []
    offset = len(decode)
    for table, start, n in prefills:
        if start == 0:
            chunks.append(PrefillChunk(offset, n, 0, None, None))
        else:
            ctx = start + n
            blocks = -(-ctx // block_size)
            rows = torch.arange(start, ctx).unsqueeze(1)
            mask = torch.arange(blocks * block_size).unsqueeze(0) <= rows
            chunks.append(PrefillChunk(offset, n, start, torch.tensor(table[:blocks]), mask))
        offset += n
    return PagedStepMetadata(slot_mapping, len(decode), dec_tables, dec_mask, chunks)


class PagedAttention:
    def __init__(self, pool: KVPool):
        self.pool = pool
        self.meta: PagedStepMetadata | None = None

    def prepare(self, meta: PagedStepMetadata) -> None:
        self.meta = meta

    def _gather(self, layer: int, tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[..., n_blocks] block ids -> K, V as [..., n_blocks * block_size, kv_heads, head_dim]."""
        k = self.pool.k[layer][tables]
        v = self.pool.v[layer][tables]
        shape = (*tables.shape[:-1], -1, k.shape[-2], k.shape[-1])
        return k.reshape(shape), v.reshape(shape)

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        meta = self.meta
        pool = self.pool
        flat_k = pool.k[layer].view(-1, k.shape[1], k.shape[2])
        flat_v = pool.v[layer].view(-1, v.shape[1], v.shape[2])
        flat_k.index_copy_(0, meta.slot_mapping, k)
        flat_v.index_copy_(0, meta.slot_mapping, v)
        out = torch.empty_like(q)
        b = meta.num_decode
        if b:
            keys, values = self._gather(layer, meta.decode_block_tables)   # [B, L, Hkv, D]
            res = F.scaled_dot_product_attention(
                q[:b].unsqueeze(2),                                         # [B, Hq, 1, D]
                keys.transpose(1, 2), values.transpose(1, 2),
                attn_mask=meta.decode_mask, enable_gqa=True)
            out[:b] = res.squeeze(2)
        for chunk in meta.prefills:
            s, e = chunk.token_start, chunk.token_start + chunk.num_tokens
            query = q[s:e].transpose(0, 1).unsqueeze(0)
            if chunk.block_table is None:   # nothing cached before it: attend over its own k/v
                keys, values, causal = k[s:e], v[s:e], True
            else:
                keys, values = self._gather(layer, chunk.block_table)
                causal = False
            res = F.scaled_dot_product_attention(
                query, keys.transpose(0, 1).unsqueeze(0), values.transpose(0, 1).unsqueeze(0),
                attn_mask=chunk.mask, is_causal=causal, enable_gqa=True)
            out[s:e] = res[0].transpose(0, 1)
        return out
