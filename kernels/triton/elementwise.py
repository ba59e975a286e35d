"""Fused per-token decoder ops: residual add + RMSNorm, SiLU * mul, rotary embedding.

Each is one pass over its rows with fp32 math, storing in the activation dtype. A program
takes ROWS whole rows (about 4k elements: one row at Llama-8B widths, several at SmolLM2's),
so small hidden sizes do not leave most lanes idle.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton._common import cdiv, interpreting, next_pow2, rows_per_program
from kernels.triton.jit_utils import cast_for


@triton.jit
def _add_rms_norm_kernel(res_ptr, delta_ptr, w_ptr, out_ptr, R, H, eps, s_res, s_delta, s_out,
                         HAS_DELTA: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                         EMULATE_RNE: tl.constexpr):
    row = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    ok = (row < R) & (cols < H)
    res = tl.load(res_ptr + row * s_res + cols, mask=ok, other=0.0)
    if HAS_DELTA:
        delta = tl.load(delta_ptr + row * s_delta + cols, mask=ok, other=0.0)
        res = cast_for(res_ptr, res.to(tl.float32) + delta.to(tl.float32), EMULATE_RNE)
        tl.store(res_ptr + row * s_res + cols, res, mask=ok)
    x = res.to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / H + eps)
    w = tl.load(w_ptr + cols, mask=cols < H, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * s_out + cols, cast_for(out_ptr, x * inv_rms[:, None] * w, EMULATE_RNE), mask=ok)


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, R, inter, s_gu, s_out, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                     EMULATE_RNE: tl.constexpr):
    row = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
    cols = (tl.program_id(1) * BLOCK + tl.arange(0, BLOCK))[None, :]
    ok = (row < R) & (cols < inter)
    gate = tl.load(gu_ptr + row * s_gu + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * s_gu + inter + cols, mask=ok, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * s_out + cols, cast_for(out_ptr, out, EMULATE_RNE), mask=ok)


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, T, H, D, sx_t, sx_h, sx_d, sc_t, sc_d, ss_t, ss_d, so_t, so_h,
                 ROWS: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr, EMULATE_RNE: tl.constexpr):
    t = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None, None]
    h = tl.arange(0, H_PAD)[None, :, None]
    d = tl.arange(0, D_PAD)[None, None, :]
    ok = (t < T) & (h < H) & (d < D)
    half = D // 2
    rolled = tl.where(d < half, d + half, d - half)         # roll(x, D/2): element d reads x[d - D/2]
    x = tl.load(x_ptr + t * sx_t + h * sx_h + d * sx_d, mask=ok, other=0.0).to(tl.float32)
    xr = tl.load(x_ptr + t * sx_t + h * sx_h + rolled * sx_d, mask=ok, other=0.0).to(tl.float32)
    cos = tl.load(cos_ptr + t * sc_t + d * sc_d, mask=(t < T) & (d < D), other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + t * ss_t + d * ss_d, mask=(t < T) & (d < D), other=0.0).to(tl.float32)
    tl.store(out_ptr + t * so_t + h * so_h + d, cast_for(out_ptr, x * cos + xr * sin, EMULATE_RNE),
             mask=ok)


def add_rms_norm_triton(residual: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                        eps: float) -> torch.Tensor:
    """Same contract as kernels.reference.add_rms_norm_ref; residual is [rows, H] with unit
    column stride (it is updated in place)."""
    if residual.dim() != 2 or residual.stride(1) != 1:
        raise ValueError("add_rms_norm_triton: residual must be [rows, H] with contiguous rows")
    rows, h = residual.shape
    out = torch.empty((rows, h), dtype=residual.dtype, device=residual.device)
    if delta is not None and delta.stride(-1) != 1:
        delta = delta.contiguous()
    per = rows_per_program(h)
    if rows:
        _add_rms_norm_kernel[(cdiv(rows, per),)](
            residual, delta if delta is not None else residual, weight, out, rows, h, eps, residual.stride(0),
            delta.stride(0) if delta is not None else 0, out.stride(0),
            HAS_DELTA=delta is not None, ROWS=per, BLOCK=next_pow2(h), EMULATE_RNE=interpreting())
    return out


def silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    """Same contract as kernels.reference.silu_mul_ref: [rows, 2I] -> [rows, I]."""
    flat = gate_up.reshape(-1, gate_up.shape[-1])
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    rows, inter = flat.shape[0], flat.shape[1] // 2
    out = torch.empty((rows, inter), dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, next_pow2(inter))
    per = rows_per_program(block)
    if rows:
        _silu_mul_kernel[(cdiv(rows, per), cdiv(inter, block))](flat, out, rows, inter, flat.stride(0), out.stride(0),
                                                                ROWS=per, BLOCK=block, EMULATE_RNE=interpreting())
    return out.view(*gate_up.shape[:-1], inter)


def apply_rope_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Same contract as kernels.reference_rope.apply_rope_ref: x [T, H, D] (any strides),
    cos/sin [T, 1, D] with the rotate-half sign folded into sin -> a new [T, H, D]."""
    t, h, d = x.shape
    out = torch.empty((t, h, d), dtype=x.dtype, device=x.device)
    per = rows_per_program(next_pow2(h) * next_pow2(d))
    if t:
        _rope_kernel[(cdiv(t, per),)](x, cos, sin, out, t, h, d, *x.stride(), cos.stride(0), cos.stride(2),
                                      sin.stride(0), sin.stride(2), out.stride(0), out.stride(1), ROWS=per,
                                      H_PAD=next_pow2(h), D_PAD=next_pow2(d), EMULATE_RNE=interpreting())
    return out
