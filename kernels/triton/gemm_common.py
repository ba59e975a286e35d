"""Tiles, split-K and the epilogue shared by the GEMM kernels.

Decode GEMMs (a few rows) are bound by reading the weight, which needs enough programs
to keep every SM streaming: first narrower column tiles, then, when even 16-wide tiles
are too few (small N), K is split and one more kernel adds the fp32 partial sums, the
bias and casts (two launches in all). With one split the GEMM kernel adds the bias and
writes the activation dtype itself (one launch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.triton._common import cdiv, interpreting, next_pow2
from kernels.triton.jit_utils import cast_for


@dataclass(frozen=True)
class GemmPlan:
    block_m: int
    block_n: int
    block_k: int
    split_k: int
    k_per_split: int          # a multiple of block_k
    num_warps: int = 4

    def grid(self, m: int, n: int) -> tuple[int, int, int]:
        return cdiv(m, self.block_m), cdiv(n, self.block_n), self.split_k


def plan_gemm(m: int, n: int, k: int, block_k: int, sms: int) -> GemmPlan:
    """Tiles for an [m, k] x [k, n] product on `sms` multiprocessors."""
    block_m = 16 if m <= 16 else (32 if m <= 32 else 64)
    m_tiles = cdiv(m, block_m)
    warps = 4
    if m <= 64:
        block_n = next((bn for bn in (64, 32) if m_tiles * cdiv(n, bn) >= sms), 16)
    else:
        # 64 x 128 tiles (every GEMM kernel): with 4 warps and 128-wide K steps W4A16's
        # dequantized operand and accumulator sit at the 255-register cap on sm_90
        # (bench/compile_check.py); 8 warps and 64-wide steps leave it about 150.
        block_n, block_k, warps = 128, min(block_k, 64), 8
    tiles = m_tiles * cdiv(n, block_n)
    split = 1 if tiles >= sms else cdiv(2 * sms, tiles)
    return split_k_plan(block_m, block_n, block_k, k, split, warps)


def split_k_plan(block_m: int, block_n: int, block_k: int, k: int, wanted: int, num_warps: int = 4) -> GemmPlan:
    """A plan splitting K about `wanted` ways (at most 32, at most one per K step), each
    split a whole number of K steps; the last split may be shorter."""
    steps = cdiv(k, block_k)
    split = max(1, min(steps, wanted, 32))
    per_split = cdiv(steps, split) * block_k
    return GemmPlan(block_m, block_n, block_k, cdiv(k, per_split), per_split, num_warps)


@triton.jit
def store_tile(out_ptr, bias_ptr, acc, rm, rn, pid_k, M, N, so_s, so_m, HAS_BIAS: tl.constexpr,
               SPLIT: tl.constexpr, EMULATE_RNE: tl.constexpr):
    """One split: + bias, activation dtype, into the output. Several: fp32 into partial[pid_k]."""
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    if SPLIT:
        tl.store(out_ptr + pid_k * so_s + rm[:, None] * so_m + rn[None, :], acc, mask=mask)
    else:
        if HAS_BIAS:
            acc = acc + tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + rm[:, None] * so_m + rn[None, :], cast_for(out_ptr, acc, EMULATE_RNE), mask=mask)


def gemm_output(plan: GemmPlan, m: int, n: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Where the kernel writes: the [M, N] result, or [S, M, N] fp32 partial sums."""
    if plan.split_k == 1:
        return torch.empty((m, n), dtype=dtype, device=device)
    return torch.empty((plan.split_k, m, n), dtype=torch.float32, device=device)


@triton.jit
def _sum_splits_kernel(part_ptr, bias_ptr, out_ptr, N, n_splits, sp_s, sp_m, so_m, HAS_BIAS: tl.constexpr,
                       BLOCK: tl.constexpr, EMULATE_RNE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    total = tl.zeros([BLOCK], tl.float32)
    for s in range(n_splits):
        total += tl.load(part_ptr + s * sp_s + row * sp_m + cols, mask=ok, other=0.0)
    if HAS_BIAS:
        total += tl.load(bias_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * so_m + cols, cast_for(out_ptr, total, EMULATE_RNE), mask=ok)


def finish(out: torch.Tensor, plan: GemmPlan, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """The [M, N] result: as written (one split), or the partial sums added, with the bias,
    in the activation dtype by one kernel."""
    if plan.split_k == 1:
        return out
    splits, m, n = out.shape
    result = torch.empty((m, n), dtype=dtype, device=out.device)
    if m:
        block = min(1024, next_pow2(n))
        _sum_splits_kernel[(m, cdiv(n, block))](out, bias if bias is not None else out, result, n, splits,
                                                out.stride(0), out.stride(1), result.stride(0),
                                                HAS_BIAS=bias is not None, BLOCK=block, EMULATE_RNE=interpreting())
    return result


def output_strides(out: torch.Tensor, plan: GemmPlan) -> tuple[int, int]:
    return (out.stride(0), out.stride(1)) if plan.split_k > 1 else (0, out.stride(0))
