"""W4A16 at one input row (batch-1 decode): a GEMV without tensor cores.

A tensor-core tile would pad the single row to 16 and move every dequantized weight tile
through shared memory into the MMA layout; at one row the product is pure weight
streaming, so each program multiplies its [BLOCK_N, BLOCK_K] weight tile by the row with
FMAs in registers and reduces along K. The group's scale and zero are applied once per
tile, not per weight: sum_k w_k x_k = scale * sum_k q_k x_k + (zero - 8 * scale) * sum_k x_k,
so a weight costs a nibble extract, a convert and one FMA. Memory parallelism comes from
programs, not pipelining: K is split until there are several programs per SM, and the
split partial sums go through kernels.triton.gemm_common.finish.

Layout: that of kernels/triton/gemm_weight_only.py (nibbles [N, K/2], scales and zeros [N, K/g]).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton._common import cdiv
from kernels.triton.gemm_common import GemmPlan, output_strides, split_k_plan, store_tile

BLOCK_N = 64
PROGRAMS_PER_SM = 8       # enough independent tile loads in flight to stream HBM on Hopper


@triton.jit
def _w4a16_gemv_kernel(x_ptr, q_ptr, s_ptr, z_ptr, bias_ptr, out_ptr, N, K, k_per_split, sq_n, ss_n, sz_n, so_s, so_m,
                       GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                       SPLIT: tl.constexpr, EMULATE_RNE: tl.constexpr):
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    half = tl.arange(0, BLOCK_K // 2)
    n_ok = rn < N
    acc = tl.zeros([BLOCK_N], tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    for k0 in range(k_start, k_end, BLOCK_K):
        # Splits start on a tile boundary. Triton's alignment analysis knows integers only to
        # be multiples of 16 and loses that through k0 // 2: the hints keep the weight loads
        # 16-byte vectors (8-byte without them, bench/compile_check.py's PTX).
        k0 = tl.multiple_of(k0, BLOCK_K)
        cols = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
        x_even, x_odd = tl.split(tl.reshape(x, [BLOCK_K // 2, 2]))
        # No K mask: the weight is padded to whole groups, so a tile that starts below K is
        # all in bounds (zero inputs cancel the padding).
        kp = tl.multiple_of(k0 // 2, BLOCK_K // 2)
        packed = tl.load(q_ptr + rn[:, None] * sq_n + (kp + half)[None, :], mask=n_ok[:, None], other=0,
                         eviction_policy="evict_first")
        q_dot_x = tl.sum((packed & 15).to(tl.float32) * x_even[None, :]
                         + (packed >> 4).to(tl.float32) * x_odd[None, :], axis=1)
        group = k0 // GROUP
        scale = tl.load(s_ptr + rn * ss_n + group, mask=n_ok, other=0.0).to(tl.float32)
        zero = tl.load(z_ptr + rn * sz_n + group, mask=n_ok, other=0.0).to(tl.float32)
        acc += scale * q_dot_x + (zero - 8.0 * scale) * tl.sum(x, axis=0)
    store_tile(out_ptr, bias_ptr, acc[None, :], tl.arange(0, 1), rn, pid_k, 1, N, so_s, so_m, HAS_BIAS, SPLIT,
               EMULATE_RNE)


def plan_gemv(n: int, k: int, block_k: int, sms: int) -> GemmPlan:
    """block_m = 1 marks the GEMV. K is split until there are PROGRAMS_PER_SM programs per
    SM (at most 32 splits); on the interpreter (sms = 1) one split."""
    wanted = cdiv(PROGRAMS_PER_SM * sms, cdiv(n, BLOCK_N)) if sms > 1 else 1
    return split_k_plan(1, BLOCK_N, block_k, k, wanted)


def launch_w4a16_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                      group_size: int, bias: torch.Tensor | None, out: torch.Tensor, plan: GemmPlan,
                      emulate_rne: bool) -> None:
    """x [1, K] (contiguous row) into `out`: [1, N] activations (one split) or [S, 1, N] fp32."""
    n, k = qweight.shape[0], x.shape[1]
    _w4a16_gemv_kernel[(cdiv(n, plan.block_n), plan.split_k)](
        x, qweight, scales, zeros, bias if bias is not None else scales, out, n, k, plan.k_per_split,
        qweight.stride(0), scales.stride(0), zeros.stride(0), *output_strides(out, plan),
        GROUP=group_size, BLOCK_N=plan.block_n, BLOCK_K=plan.block_k, HAS_BIAS=bias is not None,
        SPLIT=plan.split_k > 1, EMULATE_RNE=emulate_rne, num_warps=plan.num_warps)
