"""Paged KV pools and steps for the Triton attention tests, in the engine's pool layout."""

from __future__ import annotations

import torch

QUANTIZED = (torch.int8, torch.float8_e4m3fn)


def pack_of(dtype: torch.dtype, d: int, bs: int) -> int:
    return 2 if torch.empty((), dtype=dtype).element_size() == 2 and d % 2 == 0 and bs % 2 == 0 else 1


def make_pool(dtype, hkv, blocks, d, bs, seed=0, layers=2, layer=1):
    """Random K/V pools (+ scales for int8/FP8), returned as one layer's views of a
    [layers, ...] tensor, as AttentionOps receives them (so head/block strides are real)."""
    g = torch.Generator().manual_seed(seed)
    p = pack_of(dtype, d, bs)
    k_shape, v_shape = (layers, hkv, blocks, d // p, bs, p), (layers, hkv, blocks, bs // p, d, p)
    if dtype == torch.int8:
        k = torch.randint(-127, 128, k_shape, generator=g, dtype=torch.int8)
        v = torch.randint(-127, 128, v_shape, generator=g, dtype=torch.int8)
    elif dtype == torch.float8_e4m3fn:
        k = (torch.randn(k_shape, generator=g) * 100).clamp(-448, 448).to(dtype)
        v = (torch.randn(v_shape, generator=g) * 100).clamp(-448, 448).to(dtype)
    else:
        k, v = torch.randn(k_shape, generator=g).to(dtype), torch.randn(v_shape, generator=g).to(dtype)
    scales = None
    if dtype in QUANTIZED:
        top = 1 / 127 if dtype == torch.int8 else 1 / 448
        ks, vs = ((torch.rand(layers, hkv, blocks, bs, generator=g) + 0.5) * 2 * top for _ in range(2))
        scales = (ks.to(torch.float16)[layer], vs.to(torch.float16)[layer])
    return k[layer], v[layer], scales


def decode_step(lens, hq, d, blocks, bs, dtype, seed=1):
    """One query token per sequence; each sequence gets distinct random blocks."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(lens)
    width = int(-(-lens.max() // bs))
    tables = torch.stack([torch.randperm(blocks, generator=g)[:width] for _ in lens])
    q = torch.randn(len(lens), hq, d, generator=g).to(q_dtype(dtype))
    return q, tables, torch.arange(len(lens)), lens


def mixed_step(hq, d, blocks, bs, dtype, seed=2):
    """A step as the scheduler builds it: a decode (context 17), a 20-token chunk over a
    cached prefix of 80, a whole 33-token prompt, a single-token prompt and a 70-token
    chunk after 30 cached (more than one extend tile)."""
    g = torch.Generator().manual_seed(seed)
    chunks = [(16, 1), (80, 20), (0, 33), (0, 1), (30, 70)]      # (cached positions, new tokens)
    width = max(-(-(s + n) // bs) for s, n in chunks)
    tables = torch.stack([torch.randperm(blocks, generator=g)[:width] for _ in chunks])
    seq = torch.cat([torch.full((n,), i) for i, (_, n) in enumerate(chunks)])
    lens = torch.cat([torch.arange(s + 1, s + n + 1) for s, n in chunks])
    q = torch.randn(len(seq), hq, d, generator=g).to(q_dtype(dtype))
    return q, tables, seq, lens


def q_dtype(pool_dtype: torch.dtype) -> torch.dtype:
    return torch.bfloat16 if pool_dtype in QUANTIZED else pool_dtype


def tolerance(dtype: torch.dtype) -> float:
    """fp32 math on both sides for fp32; one or two output roundings for 16-bit."""
    return 2e-5 if dtype == torch.float32 else (4e-3 if dtype == torch.float16 else 3e-2)
