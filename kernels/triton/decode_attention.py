"""Paged decode attention: one query token per program row-group, split-K over the context.

Grid (tokens, KV heads, splits). A program takes the G query heads that share one KV head
(GQA: each K/V page is loaded once for the group, G padded to 16 rows for tensor cores),
walks its share of the token's context PAGES pages at a time (block table lookup per page,
int8/FP8 pages dequantized in registers: K scale on the score, V scale on the
probability), and keeps an online softmax. With more than one split, each writes its
partial output and base-2 log-sum-exp, and a second kernel merges them.

Every token is independent, so the kernel is exact for any step (prefill chunks too); it
is the fast choice when each sequence brings one token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton._common import cdiv, interpreting, next_pow2, num_sms, upcast_dots
from kernels.triton.attention_common import (
    LOG2E,
    load_k_pages,
    load_page_scales,
    load_v_pages,
    pages_per_step,
    unsupported_reason,
)
from kernels.triton.jit_utils import cast_for

MAX_SPLITS = 64


@triton.jit
def _decode_kernel(q_ptr, kp_ptr, vp_ptr, ks_ptr, vs_ptr, tab_ptr, seq_ptr, ctx_ptr, out_ptr, part_ptr, lse_ptr,
                   qk_scale, partition,
                   sq_t, sq_h, skp_h, skp_b, svp_h, svp_b, sks_h, sks_b, svs_h, svs_b, stab_s,
                   so_t, so_h, sp_t, sp_h, sp_s, sl_t, sl_h,
                   G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, P: tl.constexpr,
                   PAGES: tl.constexpr, QUANT: tl.constexpr, UPCAST: tl.constexpr, SPLIT: tl.constexpr,
                   EMULATE_RNE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    hk = tl.program_id(1)
    split = tl.program_id(2)
    BLOCK_N: tl.constexpr = PAGES * BS
    ctx = tl.load(ctx_ptr + t).to(tl.int32)
    seq = tl.load(seq_ptr + t).to(tl.int64)
    start = split * partition
    end = tl.minimum(ctx, start + partition)

    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D)
    heads = hk * G + g
    q = tl.load(q_ptr + t * sq_t + heads[:, None] * sq_h + d[None, :], mask=g[:, None] < G, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D], tl.float32)
    pg = tl.arange(0, PAGES)
    for n0 in range(start, end, BLOCK_N):
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
        scores = tl.where((pos < end)[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
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

    has = l_i > 0.0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    row_ok = g[:, None] < G
    if SPLIT:
        tl.store(part_ptr + t * sp_t + heads[:, None] * sp_h + split * sp_s + d[None, :], out, mask=row_ok)
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        tl.store(lse_ptr + t * sl_t + heads * sl_h + split, lse, mask=g < G)
    else:
        tl.store(out_ptr + t * so_t + heads[:, None] * so_h + d[None, :], cast_for(out_ptr, out, EMULATE_RNE),
                 mask=row_ok)


@triton.jit
def _merge_kernel(part_ptr, lse_ptr, out_ptr, n_splits, sp_t, sp_h, sp_s, sl_t, sl_h, so_t, so_h,
                  D: tl.constexpr, S_PAD: tl.constexpr, EMULATE_RNE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, S_PAD)
    d = tl.arange(0, D)
    lse = tl.load(lse_ptr + t * sl_t + h * sl_h + s, mask=s < n_splits, other=float("-inf"))
    w = tl.exp2(lse - tl.max(lse, axis=0))            # split 0 is never empty: the max is finite
    part = tl.load(part_ptr + t * sp_t + h * sp_h + s[:, None] * sp_s + d[None, :], mask=(s < n_splits)[:, None],
                   other=0.0)
    out = tl.sum(w[:, None] * part, axis=0) / tl.sum(w, axis=0)
    tl.store(out_ptr + t * so_t + h * so_h + d, cast_for(out_ptr, out, EMULATE_RNE))


def choose_splits(tokens: int, kv_heads: int, max_context: int, block_n: int, sms: int) -> int:
    """Enough (token, head, split) programs to fill `sms` multiprocessors twice, from the
    block table's width (an upper bound on the context, known without a device sync)."""
    steps = cdiv(max_context, block_n)
    wanted = cdiv(2 * sms, max(1, tokens * kv_heads))
    return max(1, min(steps, wanted, MAX_SPLITS))


def launch_decode(q, k_pool, v_pool, block_tables, seq_of_token, context_lens, scale, kv_scales, n_splits: int,
                  **launch_options):
    """launch_options (num_warps, num_stages) go to the attention kernel: for tuning sweeps."""
    t, hq, d = q.shape
    hkv, _, _, bs, p = k_pool.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if t == 0:
        return out
    if q.stride(-1) != 1:
        q = q.contiguous()
    pages = pages_per_step(bs)
    block_n = pages * bs
    max_context = block_tables.shape[1] * bs
    partition = cdiv(cdiv(max_context, block_n), n_splits) * block_n
    n_splits = cdiv(max_context, partition)
    g = hq // hkv
    quant = kv_scales is not None
    ks, vs = kv_scales if quant else (k_pool, v_pool)
    if n_splits > 1:
        part = torch.empty((t, hq, n_splits, d), dtype=torch.float32, device=q.device)
        lse = torch.empty((t, hq, n_splits), dtype=torch.float32, device=q.device)
    else:
        part = lse = out                                  # unused
    _decode_kernel[(t, hkv, n_splits)](
        q, k_pool, v_pool, ks, vs, block_tables, seq_of_token, context_lens, out, part, lse,
        scale * LOG2E, partition,
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1),
        ks.stride(0), ks.stride(1), vs.stride(0), vs.stride(1), block_tables.stride(0),
        out.stride(0), out.stride(1), part.stride(0), part.stride(1), part.stride(2), lse.stride(0), lse.stride(1),
        G=g, G_PAD=max(16, next_pow2(g)), D=d, BS=bs, P=p, PAGES=pages, QUANT=quant,
        UPCAST=upcast_dots(q.dtype), SPLIT=n_splits > 1, EMULATE_RNE=interpreting(), **launch_options)
    if n_splits > 1:
        _merge_kernel[(t, hq)](part, lse, out, n_splits, part.stride(0), part.stride(1), part.stride(2),
                               lse.stride(0), lse.stride(1), out.stride(0), out.stride(1),
                               D=d, S_PAD=next_pow2(n_splits), EMULATE_RNE=interpreting())
    return out


def paged_decode_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
                           seq_of_token: torch.Tensor, context_lens: torch.Tensor, scale: float,
                           kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Same contract as kernels.reference.paged_attention_ref."""
    reason = unsupported_reason(q, k_pool, v_pool, kv_scales)
    if reason:
        raise ValueError(f"paged_decode_attention: {reason}")
    block_n = pages_per_step(k_pool.shape[3]) * k_pool.shape[3]
    splits = choose_splits(q.shape[0], k_pool.shape[0], block_tables.shape[1] * k_pool.shape[3], block_n,
                           num_sms(q.device))
    return launch_decode(q, k_pool, v_pool, block_tables, seq_of_token, context_lens, scale, kv_scales, splits)
