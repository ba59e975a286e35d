"""Attention over the paged KV pool on CPU, in a few large torch calls per layer.

The runner lays a step out as [decode tokens (one per sequence) | prefill chunks].
Per layer: all new K/V are written with one index_copy_; the decode tokens attend in one
call of the paged decode op (kernels/: a C++ kernel reading the pool in place on CPU, or
the torch reference); fresh prefill chunks of similar length are right-padded into one
batch, and chunks that continue a cached context attend over their gathered blocks. Prefill
attention is two batched matmuls and an fp32 softmax: on CPU that is 2-4x faster than
SDPA's flash kernel at these lengths. Indices and masks are built once per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engines.kv_cache import KVPool
from kernels.dispatch import AttentionOps


@dataclass
class PrefillChunk:
    token_start: int          # offset of the chunk in the step's flat tokens
    num_tokens: int
    context_start: int        # position of the chunk's first token in its sequence (> 0)
    block_ids: torch.Tensor           # blocks covering its whole context
    bias: torch.Tensor                # [num_tokens, context blocks * block_size]: 0 or -inf


@dataclass
class FreshPrefillGroup:
    """Prefill chunks with nothing cached before them and similar lengths, attended in one
    SDPA call: right-padded to `length` (causal masking keeps real tokens off the padding)."""
    gather: torch.Tensor      # [n_seqs * length] step rows to read (padding repeats a valid row)
    n_seqs: int
    length: int
    bias: torch.Tensor        # [length, length] causal: 0 or -inf
    src: torch.Tensor         # positions of real tokens in the padded layout
    dst: torch.Tensor         # their rows in the step


@dataclass
class PagedStepMetadata:
    slot_mapping: torch.Tensor        # [T] destination slot of every new token
    num_decode: int
    decode_block_tables: torch.Tensor | None  # [B, max_blocks] (short rows padded with a valid block)
    decode_context_lens: torch.Tensor | None  # [B] tokens each decode token attends over
    prefills: list[PrefillChunk]              # chunks that continue cached context
    fresh_groups: list[FreshPrefillGroup]


def build_step_metadata(block_size: int, decode: list[tuple[list[int], int]],
                        prefills: list[tuple[list[int], int, int]], slot_mapping: torch.Tensor) -> PagedStepMetadata:
    """decode: (block_table, context_len incl. the new token) per decoding sequence;
    prefills: (block_table, context_start, num_tokens) per chunk, in flat order after decodes."""
    dec_tables = dec_lens = None
    if decode:
        max_blocks = max(-(-ctx // block_size) for _, ctx in decode)
        rows = []
        for table, ctx in decode:
            n = -(-ctx // block_size)
            rows.append(table[:n] + [table[0]] * (max_blocks - n))
        dec_tables = torch.tensor(rows, dtype=torch.long)
        dec_lens = torch.tensor([ctx for _, ctx in decode], dtype=torch.long)
    chunks = []
    fresh: list[tuple[int, int]] = []       # (step offset, length)
    offset = len(decode)
    for table, start, n in prefills:
        if start == 0:
            fresh.append((offset, n))
        else:
            ctx = start + n
            blocks = -(-ctx // block_size)
            rows = torch.arange(start, ctx).unsqueeze(1)
            hidden = torch.arange(blocks * block_size).unsqueeze(0) > rows
            bias = torch.zeros(hidden.shape).masked_fill_(hidden, float("-inf"))
            chunks.append(PrefillChunk(offset, n, start, torch.tensor(table[:blocks], dtype=torch.long), bias))
        offset += n
    return PagedStepMetadata(slot_mapping, len(decode), dec_tables, dec_lens, chunks, _group_fresh(fresh))


def _group_fresh(fresh: list[tuple[int, int]], max_waste: float = 0.2) -> list[FreshPrefillGroup]:
    """Sort by length and cut into groups whose padding stays under `max_waste`."""
    groups: list[list[tuple[int, int]]] = []
    for item in sorted(fresh, key=lambda x: -x[1]):
        if groups:
            group = groups[-1]
            longest = group[0][1]
            real = sum(n for _, n in group) + item[1]
            if longest * (len(group) + 1) <= (1 + max_waste) * real:
                group.append(item)
                continue
        groups.append([item])
    out = []
    for group in groups:
        length = group[0][1]
        gather, src, dst = [], [], []
        for i, (offset, n) in enumerate(group):
            gather.extend(range(offset, offset + n))
            gather.extend([offset] * (length - n))
            src.extend(range(i * length, i * length + n))
            dst.extend(range(offset, offset + n))
        causal = torch.full((length, length), float("-inf")).triu_(1)
        out.append(FreshPrefillGroup(torch.tensor(gather), len(group), length, causal,
                                     torch.tensor(src), torch.tensor(dst)))
    return out


class PagedAttention:
    def __init__(self, pool: KVPool, ops: AttentionOps | None = None):
        self.pool = pool
        self.ops = ops or AttentionOps(pool.k.device)
        self.meta: PagedStepMetadata | None = None

    def prepare(self, meta: PagedStepMetadata) -> None:
        self.meta = meta

    def _gather(self, layer: int, block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Block ids -> K, V as [kv_heads, n_blocks * block_size, head_dim]."""
        k, v = self.pool.k[layer], self.pool.v[layer]            # [Hkv, NB, bs, D]
        hkv, _, bs, d = k.shape
        n = block_ids.numel()
        return k.index_select(1, block_ids).view(hkv, n * bs, d), v.index_select(1, block_ids).view(hkv, n * bs, d)

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        meta = self.meta
        pool = self.pool
        hkv, d = k.shape[1], k.shape[2]
        pool.k[layer].view(hkv, -1, d).index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
        pool.v[layer].view(hkv, -1, d).index_copy_(1, meta.slot_mapping, v.transpose(0, 1))
        out = torch.empty_like(q)
        b = meta.num_decode
        if b:
            out[:b] = self.ops.paged_decode(q[:b], pool.k[layer], pool.v[layer], meta.decode_block_tables,
                                            meta.decode_context_lens, d ** -0.5)
        for group in meta.fresh_groups:
            out.index_copy_(0, group.dst, self._fresh_group(group, q, k, v).index_select(0, group.src))
        for chunk in meta.prefills:
            s, e = chunk.token_start, chunk.token_start + chunk.num_tokens
            keys, values = self._gather(layer, chunk.block_ids)
            res = prefill_attention(q[s:e].transpose(0, 1).unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0),
                                    chunk.bias)
            out[s:e] = res[0].transpose(0, 1)
        return out

    @staticmethod
    def _fresh_group(group: FreshPrefillGroup, q, k, v) -> torch.Tensor:
        """Causal attention of each chunk over its own tokens -> [n_seqs * length, Hq, D]."""
        def padded(x):
            return x.index_select(0, group.gather).view(group.n_seqs, group.length, *x.shape[1:]).transpose(1, 2)
        res = prefill_attention(padded(q), padded(k), padded(v), group.bias)
        return res.transpose(1, 2).reshape(-1, q.shape[1], q.shape[2])


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """q: [B, Hq, n, D]; k, v: [B, Hkv, L, D]; bias: [n, L] additive. Returns [B, Hq, n, D].

    Query head h reads KV head h // G; the G query heads of a KV head are stacked into one
    matrix so each batched matmul sees [G * n, D] x [D, L].
    """
    b, hq, n, d = q.shape
    hkv, length = k.shape[1], k.shape[2]
    g = hq // hkv
    qg = q.reshape(b, hkv, g * n, d)
    scores = torch.matmul(qg, k.transpose(-1, -2)).view(b, hkv, g, n, length).float()
    scores.mul_(d ** -0.5).add_(bias)
    probs = torch.softmax(scores, dim=-1).to(v.dtype).view(b, hkv, g * n, length)
    return torch.matmul(probs, v).view(b, hq, n, d)
