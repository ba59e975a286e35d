"""Paged prefill / extend attention: chunks of new tokens over a paged prefix (varlen, causal).

The step's tokens are cut into tiles of up to BLOCK_T consecutive tokens of one sequence
(`extend_tiles`, computed once per step on the host). Grid (tiles, KV heads): a program
holds BLOCK_T tokens x the G query heads of one KV head as the rows of one matrix, so each
K/V page is loaded once for all of them, and walks the pages up to the tile's longest
context; row r sees key positions < context_lens of its token, which is the causal mask
inside the chunk and the whole cached prefix before it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton._common import interpreting, next_pow2, upcast_dots
from kernels.triton.attention_common import (
    LOG2E,
    load_k_pages,
    load_page_scales,
    load_v_pages,
    pages_per_step,
    unsupported_reason,
)
from kernels.triton.jit_utils import cast_for

ROWS_TARGET = 64        # BLOCK_T * G_PAD


@triton.jit
def _extend_kernel(q_ptr, kp_ptr, vp_ptr, ks_ptr, vs_ptr, tab_ptr, seq_ptr, ctx_ptr, tiles_ptr, out_ptr,
                   qk_scale,
                   sq_t, sq_h, skp_h, skp_b, svp_h, svp_b, sks_h, sks_b, svs_h, svs_b, stab_s, so_t, so_h,
                   G: tl.constexpr, G_PAD: tl.constexpr, BLOCK_T: tl.constexpr, D: tl.constexpr,
                   BS: tl.constexpr, P: tl.constexpr, PAGES: tl.constexpr, QUANT: tl.constexpr,
                   UPCAST: tl.constexpr, EMULATE_RNE: tl.constexpr):
    tile = tl.program_id(0)
    hk = tl.program_id(1)
    BLOCK_N: tl.constexpr = PAGES * BS
    M: tl.constexpr = BLOCK_T * G_PAD
    first = tl.load(tiles_ptr + 2 * tile).to(tl.int64)
    count = tl.load(tiles_ptr + 2 * tile + 1)
    seq = tl.load(seq_ptr + first).to(tl.int64)

    r = tl.arange(0, M)
    ti = r // G_PAD
    gi = r % G_PAD
    tok_ok = ti < count
    row_ok = tok_ok & (gi < G)
    tok = first + ti
    heads = hk * G + gi
    # Padding rows see position 0 only, so their softmax stays finite; they are never stored.
    ctx = tl.load(ctx_ptr + tok, mask=tok_ok, other=1).to(tl.int32)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + tok[:, None] * sq_t + heads[:, None] * sq_h + d[None, :], mask=row_ok[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([M], float("-inf"), tl.float32)
    l_i = tl.zeros([M], tl.float32)
    acc = tl.zeros([M, D], tl.float32)
    pg = tl.arange(0, PAGES)
    end = tl.max(ctx, axis=0)
    for n0 in range(0, end, BLOCK_N):
        page = n0 // BS + pg
        page_ok = page * BS < end
        blk = tl.load(tab_ptr + seq * stab_s + page, mask=page_ok, other=0).to(tl.int64)
        k = load_k_pages(kp_ptr + hk * skp_h, blk * skp_b, page_ok, D, BS, P, PAGES)
        if UPCAST:
            scores = tl.dot(q, k.to(tl.float32), input_precision="ieee")
        else:
            scores = tl.dot(q, k.to(q.dtype))
        scores = scores * qk_scale
        if QUANT:
            scores = scores * load_page_scales(ks_ptr + hk * sks_h, blk * sks_b, page_ok, BS, PAGES)[None, :]
        pos = n0 + tl.arange(0, BLOCK_N)
        scores = tl.where(pos[None, :] < ctx[:, None], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        # A row whose context ended before this step keeps m = m_new: alpha = 1, p = 0.
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if QUANT:
            p = p * load_page_scales(vs_ptr + hk * svs_h, blk * svs_b, page_ok, BS, PAGES)[None, :]
        v = load_v_pages(vp_ptr + hk * svp_h, blk * svp_b, page_ok, D, BS, P, PAGES)
        if UPCAST:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype))
        m_i = m_new

    out = acc / l_i[:, None]
    tl.store(out_ptr + tok[:, None] * so_t + heads[:, None] * so_h + d[None, :], cast_for(out_ptr, out, EMULATE_RNE),
             mask=row_ok[:, None])


def block_tokens(group: int) -> int:
    return max(1, ROWS_TARGET // next_pow2(group))


def extend_tiles(seq_of_token: torch.Tensor, block_t: int, host: list[int] | None = None) -> torch.Tensor:
    """[n_tiles, 2] int32 (first token, token count): runs of consecutive tokens of one
    sequence, cut every block_t tokens. Planned from `host` (seq_of_token as a host list)
    when given, else one device->host sync; callers do it once per step."""
    seqs = host if host is not None else seq_of_token.tolist()
    tiles: list[tuple[int, int]] = []
    i = 0
    while i < len(seqs):
        j = i + 1
        while j < len(seqs) and j - i < block_t and seqs[j] == seqs[i]:
            j += 1
        tiles.append((i, j - i))
        i = j
    out = torch.tensor(tiles, dtype=torch.int32).reshape(-1, 2)
    if seq_of_token.is_cuda:        # pinned + non_blocking: the copy queues before the kernel, no sync
        return out.pin_memory().to(seq_of_token.device, non_blocking=True)
    return out.to(seq_of_token.device)


def launch_extend(q, k_pool, v_pool, block_tables, seq_of_token, context_lens, scale, kv_scales,
                  tiles: torch.Tensor) -> torch.Tensor:
    t, hq, d = q.shape
    hkv, _, _, bs, p = k_pool.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if t == 0:
        return out
    if q.stride(-1) != 1:
        q = q.contiguous()
    g = hq // hkv
    quant = kv_scales is not None
    ks, vs = kv_scales if quant else (k_pool, v_pool)
    _extend_kernel[(tiles.shape[0], hkv)](
        q, k_pool, v_pool, ks, vs, block_tables, seq_of_token, context_lens, tiles, out, scale * LOG2E,
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1),
        ks.stride(0), ks.stride(1), vs.stride(0), vs.stride(1), block_tables.stride(0), out.stride(0), out.stride(1),
        G=g, G_PAD=next_pow2(g), BLOCK_T=block_tokens(g), D=d, BS=bs, P=p, PAGES=pages_per_step(bs), QUANT=quant,
        UPCAST=upcast_dots(q.dtype), EMULATE_RNE=interpreting())
    return out


def paged_extend_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
                           seq_of_token: torch.Tensor, context_lens: torch.Tensor, scale: float,
                           kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Same contract as kernels.reference.paged_attention_ref."""
    reason = unsupported_reason(q, k_pool, v_pool, kv_scales)
    if reason:
        raise ValueError(f"paged_extend_attention: {reason}")
    tiles = extend_tiles(seq_of_token, block_tokens(q.shape[1] // k_pool.shape[0]))
    return launch_extend(q, k_pool, v_pool, block_tables, seq_of_token, context_lens, scale, kv_scales, tiles)
