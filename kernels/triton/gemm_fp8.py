"""FP8 GEMM: e4m3 weights with per-output-channel fp32 scales, activations quantized per
token to e4m3 on the fly (fp32 scale = amax / 448), fp32 accumulation.

On Hopper tl.dot takes the e4m3 operands directly (FP8 tensor cores; the weight [N, K] is
already K-major), each K step's partial product promoted to fp32; under the interpreter the
operands are upcast to fp32, where products of e4m3 values are exact.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton._common import interpreting, next_pow2, num_sms
from kernels.triton.gemm_common import GemmPlan, finish, gemm_output, output_strides, plan_gemm, store_tile
from kernels.triton.jit_utils import to_e4m3

E4M3_MAX = 448.0
MIN_SCALE = 1e-12


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, s_ptr, K, sx_m, sq_m, BLOCK: tl.constexpr, EMULATE_RNE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    amax = tl.zeros([BLOCK], tl.float32)
    for k0 in range(0, K, BLOCK):
        x = tl.load(x_ptr + row * sx_m + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.max(amax, axis=0) / 448.0, 1e-12)
    for k0 in range(0, K, BLOCK):
        x = tl.load(x_ptr + row * sx_m + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
        q = to_e4m3(tl.minimum(tl.maximum(x / scale, -448.0), 448.0), EMULATE_RNE)
        tl.store(q_ptr + row * sq_m + k0 + cols, q, mask=k0 + cols < K)
    tl.store(s_ptr + row, scale)


@triton.jit
def _fp8_gemm_kernel(a_ptr, b_ptr, as_ptr, bs_ptr, bias_ptr, out_ptr, M, N, K, k_per_split, sa_m, sb_n, so_s, so_m,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
                     HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, EMULATE_RNE: tl.constexpr):
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    for k0 in range(k_start, k_end, BLOCK_K):
        k_ok = (k0 + rk) < K
        a = tl.load(a_ptr + rm[:, None] * sa_m + (k0 + rk)[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptr + rn[:, None] * sb_n + (k0 + rk)[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        if UPCAST:
            acc += tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision="ieee")
        else:
            # Each K step's product is added to the fp32 accumulator by ordinary adds rather than
            # passed into the MMA as its accumulator: Hopper's FP8 MMA accumulates with fewer
            # than fp32's bits, and over K = 14336 that drifts past 1 % of the output.
            acc += tl.dot(a, tl.trans(b))
    a_scale = tl.load(as_ptr + rm, mask=m_ok, other=0.0)
    b_scale = tl.load(bs_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)
    acc = acc * a_scale[:, None] * b_scale[None, :]
    store_tile(out_ptr, bias_ptr, acc, rm, rn, pid_k, M, N, so_s, so_m, HAS_BIAS, SPLIT, EMULATE_RNE)


def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] -> (e4m3 [M, K], fp32 scales [M]). Same contract as reference_gemm.quantize_rows_fp8_ref."""
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty(m, dtype=torch.float32, device=x.device)
    if m:
        _quantize_rows_kernel[(m,)](x, q, scales, k, x.stride(0), q.stride(0), BLOCK=min(1024, next_pow2(k)),
                                     EMULATE_RNE=interpreting())
    return q, scales


def fp8_linear(x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor,
               bias: torch.Tensor | None = None, plan: GemmPlan | None = None) -> torch.Tensor:
    """x [..., K] -> [..., N]: per-token e4m3 activations x e4m3 weights, fp32 scales.
    Same contract as kernels.reference_gemm.fp8_linear_ref."""
    flat = x.reshape(-1, x.shape[-1])
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    m, k = flat.shape
    n = qweight.shape[0]
    a, a_scale = quantize_rows_fp8(flat)
    plan = plan or plan_gemm(m, n, k, 128, num_sms(x.device))
    out = gemm_output(plan, m, n, x.dtype, x.device)
    if m:
        _fp8_gemm_kernel[plan.grid(m, n)](
            a, qweight, a_scale, weight_scale, bias if bias is not None else weight_scale, out, m, n, k,
            plan.k_per_split, a.stride(0), qweight.stride(0), *output_strides(out, plan),
            BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_K=plan.block_k, UPCAST=interpreting(),
            HAS_BIAS=bias is not None, SPLIT=plan.split_k > 1, EMULATE_RNE=interpreting(),
            num_warps=plan.num_warps)
    return finish(out, plan, bias, x.dtype).view(*x.shape[:-1], n)
