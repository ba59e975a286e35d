"""Pieces shared by the paged attention kernels: page loads in the pool layout and the
checks that a pool fits them.

A page (one block of one KV head) is contiguous in both pools (K [D/P, BS, P], V [BS/P, D, P]),
so a kernel loads PAGES whole pages as [PAGES, D*BS] vectors (coalesced, whatever P is)
and rearranges them in registers into K^T [D, PAGES*BS] and V [PAGES*BS, D].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton._common import is_pow2

LOG2E = 1.4426950408889634
BLOCK_N_TARGET = 64     # key positions per inner-loop step


@triton.jit
def load_k_pages(kp_ptr, blk, page_ok, D: tl.constexpr, BS: tl.constexpr, P: tl.constexpr, PAGES: tl.constexpr):
    """blk [PAGES] block ids (int64, already offset to the KV head) -> K^T [D, PAGES*BS]."""
    e = tl.arange(0, D * BS)
    k = tl.load(kp_ptr + blk[:, None] + e[None, :], mask=page_ok[:, None], other=0.0)
    k = tl.permute(tl.reshape(k, (PAGES, D // P, BS, P)), (1, 3, 0, 2))
    return tl.reshape(k, (D, PAGES * BS))


@triton.jit
def load_v_pages(vp_ptr, blk, page_ok, D: tl.constexpr, BS: tl.constexpr, P: tl.constexpr, PAGES: tl.constexpr):
    """blk [PAGES] -> V [PAGES*BS, D]."""
    e = tl.arange(0, D * BS)
    v = tl.load(vp_ptr + blk[:, None] + e[None, :], mask=page_ok[:, None], other=0.0)
    v = tl.permute(tl.reshape(v, (PAGES, BS // P, D, P)), (0, 1, 3, 2))
    return tl.reshape(v, (PAGES * BS, D))


@triton.jit
def load_page_scales(s_ptr, blk, page_ok, BS: tl.constexpr, PAGES: tl.constexpr):
    """Per-token scales of PAGES pages -> [PAGES*BS] fp32."""
    o = tl.arange(0, BS)
    s = tl.load(s_ptr + blk[:, None] + o[None, :], mask=page_ok[:, None], other=0.0)
    return tl.reshape(s, (PAGES * BS,)).to(tl.float32)


def pages_per_step(block_size: int) -> int:
    return max(1, BLOCK_N_TARGET // block_size)


def unsupported_reason(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, kv_scales) -> str | None:
    """Why these tensors cannot go through the Triton attention kernels (None: they can)."""
    hkv, _, dp, bs, p = k_pool.shape
    d = q.shape[-1]
    if dp * p != d or q.shape[1] % hkv:
        return f"q {tuple(q.shape)} does not match the pool {tuple(k_pool.shape)}"
    if not (is_pow2(d) and d >= 16 and is_pow2(bs) and bs * pages_per_step(bs) >= 16):
        return f"head dim {d} and block size {bs} must be powers of two (head dim >= 16)"
    if k_pool.stride()[2:] != (bs * p, p, 1) or v_pool.stride()[2:] != (d * p, p, 1):
        return "pool pages must be contiguous"
    if (k_pool.dtype in (torch.int8, torch.float8_e4m3fn)) != (kv_scales is not None):
        return f"a {k_pool.dtype} pool {'needs' if kv_scales is None else 'takes no'} scales"
    if kv_scales is not None and any(s.stride(2) != 1 for s in kv_scales):
        return "scales must be contiguous along the block"
    return None
