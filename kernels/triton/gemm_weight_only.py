"""Weight-only quantized GEMMs: W4A16 (group-wise INT4) and W8A16 (per-channel INT8).

INT4 GPU layout = the portable form of engines/quantization/int4.py: nibbles [N, K/2] uint8
(column 2j in the low nibble, 2j+1 in the high one), fp32 scales and zeros [N, K/g] with
w = (q - 8) * scale + zero. HF AWQ checkpoints are converted to it at load
(engines/loaders/hf_awq.py), so one kernel serves both. Even and odd input columns are
multiplied with the low and high nibbles separately, so nibbles are never interleaved.
A tile of BLOCK_K columns lies in one group (BLOCK_K divides the group size). One input
row (batch-1 decode) takes the GEMV in kernels/triton/gemv_int4.py instead; from
DEQUANTIZE_MIN_ROWS rows (prefill) the weight is dequantized by one kernel and cuBLAS multiplies.
INT8: int8 [N, K] with one scale per output channel, applied once to the accumulator.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.triton._common import cdiv, interpreting, num_sms, upcast_dots
from kernels.triton.gemm_common import GemmPlan, finish, gemm_output, output_strides, plan_gemm, store_tile
from kernels.triton.gemv_int4 import launch_w4a16_gemv, plan_gemv
from kernels.triton.jit_utils import cast_for

# From this many rows W4A16 dequantizes the weight and multiplies it dense (H200, bench/gpu_sweep.py).
DEQUANTIZE_MIN_ROWS = 128


@triton.jit
def _dot(a, b, UPCAST: tl.constexpr):
    """a [M, K] @ b^T, b given as [N, K]."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision="ieee")
    return tl.dot(a, tl.trans(b.to(a.dtype)))


@triton.jit
def _w4a16_kernel(x_ptr, q_ptr, s_ptr, z_ptr, bias_ptr, out_ptr, M, N, K, k_per_split,
                  sx_m, sq_n, ss_n, sz_n, so_s, so_m,
                  GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  UPCAST: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, EMULATE_RNE: tl.constexpr):
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    half = tl.arange(0, BLOCK_K // 2)
    m_ok = rm < M
    n_ok = rn < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    for k0 in range(k_start, k_end, BLOCK_K):
        k0 = tl.multiple_of(k0, BLOCK_K)        # alignment hints: see kernels/triton/gemv_int4.py
        # One contiguous load, split into even and odd columns in registers (two strided
        # loads were 2-byte scalar loads, too narrow for the asynchronous copy pipeline).
        cols = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * sx_m + cols[None, :], mask=m_ok[:, None] & (cols < K)[None, :], other=0.0)
        x_even, x_odd = tl.split(tl.reshape(x, [BLOCK_M, BLOCK_K // 2, 2]))
        # Row mask only: the weight is padded to whole groups (no tile reads past it); zero
        # inputs cancel the padding.
        kp = tl.multiple_of(k0 // 2, BLOCK_K // 2)
        packed = tl.load(q_ptr + rn[:, None] * sq_n + (kp + half)[None, :], mask=n_ok[:, None], other=0)
        group = k0 // GROUP
        scale = tl.load(s_ptr + rn * ss_n + group, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        zero = tl.load(z_ptr + rn * sz_n + group, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        w_low = ((packed & 15).to(tl.float32) - 8.0) * scale + zero
        w_high = ((packed >> 4).to(tl.float32) - 8.0) * scale + zero
        acc += _dot(x_even, w_low, UPCAST)
        acc += _dot(x_odd, w_high, UPCAST)
    store_tile(out_ptr, bias_ptr, acc, rm, rn, pid_k, M, N, so_s, so_m, HAS_BIAS, SPLIT, EMULATE_RNE)


@triton.jit
def _dequantize_int4_kernel(q_ptr, s_ptr, z_ptr, out_ptr, N, K, sq_n, ss_n, sz_n, so_n, GROUP: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EMULATE_RNE: tl.constexpr):
    """out[:, :K] = (q - 8) * scale + zero, in out's dtype: the values the tile kernel hands its
    MMA. BLOCK_K divides the group, so a tile reads one scale and zero per row."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    k0 = tl.multiple_of(pid_k * BLOCK_K, BLOCK_K)
    kp = tl.multiple_of(k0 // 2, BLOCK_K // 2)
    packed = tl.load(q_ptr + rn[:, None] * sq_n + (kp + tl.arange(0, BLOCK_K // 2))[None, :], mask=n_ok[:, None],
                     other=0)
    group = k0 // GROUP
    scale = tl.load(s_ptr + rn * ss_n + group, mask=n_ok, other=0.0).to(tl.float32)[:, None]
    zero = tl.load(z_ptr + rn * sz_n + group, mask=n_ok, other=0.0).to(tl.float32)[:, None]
    w_low = ((packed & 15).to(tl.float32) - 8.0) * scale + zero          # even columns
    w_high = ((packed >> 4).to(tl.float32) - 8.0) * scale + zero         # odd columns
    w = tl.reshape(tl.join(w_low, w_high), [BLOCK_N, BLOCK_K])
    cols = k0 + tl.arange(0, BLOCK_K)
    tl.store(out_ptr + rn[:, None] * so_n + cols[None, :], cast_for(out_ptr, w, EMULATE_RNE),
             mask=n_ok[:, None] & (cols < K)[None, :])


@triton.jit
def _w8a16_kernel(x_ptr, q_ptr, s_ptr, bias_ptr, out_ptr, M, N, K, k_per_split, sx_m, sq_n, so_s, so_m,
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
        x = tl.load(x_ptr + rm[:, None] * sx_m + (k0 + rk)[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(q_ptr + rn[:, None] * sq_n + (k0 + rk)[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0)
        acc += _dot(x, w, UPCAST)           # int8 values are exact in bf16
    acc = acc * tl.load(s_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    store_tile(out_ptr, bias_ptr, acc, rm, rn, pid_k, M, N, so_s, so_m, HAS_BIAS, SPLIT, EMULATE_RNE)


def _flat(x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def w4a16_plan(m: int, n: int, k: int, group_size: int, device: torch.device) -> GemmPlan:
    """The GEMV (block_m 1) for one row, tensor-core tiles for more."""
    if group_size < 32 or group_size & (group_size - 1):
        raise ValueError(f"W4A16 kernel: group size {group_size} must be a power of two >= 32")
    if m == 1:
        return plan_gemv(n, k, min(group_size, 128), num_sms(device))
    return plan_gemm(m, n, k, min(group_size, 128), num_sms(device))


def dequantize_w4(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int, k: int,
                  dtype: torch.dtype) -> torch.Tensor:
    """The first k columns of the INT4 weight, dequantized to `dtype` [N, k] by one kernel."""
    n = qweight.shape[0]
    out = torch.empty((n, k), dtype=dtype, device=qweight.device)
    block_k = min(group_size, 128)
    block_n = 32
    _dequantize_int4_kernel[(cdiv(n, block_n), cdiv(k, block_k))](
        qweight, scales, zeros, out, n, k, qweight.stride(0), scales.stride(0), zeros.stride(0), out.stride(0),
        GROUP=group_size, BLOCK_N=block_n, BLOCK_K=block_k, EMULATE_RNE=interpreting())
    return out


def w4a16_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 group_size: int, bias: torch.Tensor | None = None, plan: GemmPlan | None = None) -> torch.Tensor:
    """x [..., K] @ dequant(q)^T (+ bias) -> [..., N]; K may be shorter than the padded 2 * q.shape[1].
    Same contract as kernels.reference_gemm.w4a16_linear_ref (plan: tile override for benchmarks)."""
    flat = _flat(x)
    m, k = flat.shape
    n = qweight.shape[0]
    if 2 * qweight.shape[1] < k:
        raise ValueError(f"W4A16: input width {k} exceeds the weight's {2 * qweight.shape[1]}")
    if 2 * qweight.shape[1] != scales.shape[1] * group_size or scales.shape != zeros.shape:
        # Tiles read whole groups without a K mask: the weight must be padded to them.
        raise ValueError(f"W4A16: weight width {2 * qweight.shape[1]} is not {scales.shape[1]} groups of "
                         f"{group_size} (scales {tuple(scales.shape)}, zeros {tuple(zeros.shape)})")
    if plan is None and m >= DEQUANTIZE_MIN_ROWS:
        # Prefill-sized steps: dequantize once and let the dense GEMM (cuBLAS) multiply; the
        # tile kernel dequantizes every weight tile once per row tile, in CUDA cores.
        weight = dequantize_w4(qweight, scales, zeros, group_size, k, flat.dtype)
        out = F.linear(flat, weight, None if bias is None else bias.to(flat.dtype))
        return out.view(*x.shape[:-1], n)
    plan = plan or w4a16_plan(m, n, k, group_size, x.device)
    if plan.k_per_split % plan.block_k or group_size % plan.block_k:
        raise ValueError(f"W4A16: tiles of {plan.block_k} columns must divide the split ({plan.k_per_split}) "
                         f"and the group ({group_size})")    # the kernels' alignment hints assume both
    out = gemm_output(plan, m, n, x.dtype, x.device)
    if plan.block_m == 1:
        if m != 1:
            raise ValueError(f"W4A16: a GEMV plan takes one row, got {m}")
        launch_w4a16_gemv(flat, qweight, scales, zeros, group_size, bias, out, plan, interpreting())
    elif m:
        _w4a16_kernel[plan.grid(m, n)](
            flat, qweight, scales, zeros, bias if bias is not None else scales, out, m, n, k, plan.k_per_split,
            flat.stride(0), qweight.stride(0), scales.stride(0), zeros.stride(0), *output_strides(out, plan),
            GROUP=group_size, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_K=plan.block_k,
            UPCAST=upcast_dots(x.dtype), HAS_BIAS=bias is not None, SPLIT=plan.split_k > 1,
            EMULATE_RNE=interpreting(), num_warps=plan.num_warps)
    return finish(out, plan, bias, x.dtype).view(*x.shape[:-1], n)


def w8a16_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                 bias: torch.Tensor | None = None, plan: GemmPlan | None = None) -> torch.Tensor:
    """x [..., K] @ (q * scales[:, None])^T (+ bias). Same contract as reference_gemm.w8a16_linear_ref."""
    flat = _flat(x)
    m, k = flat.shape
    n = qweight.shape[0]
    plan = plan or plan_gemm(m, n, k, 128, num_sms(x.device))
    out = gemm_output(plan, m, n, x.dtype, x.device)
    if m:
        _w8a16_kernel[plan.grid(m, n)](
            flat, qweight, scales, bias if bias is not None else scales, out, m, n, k, plan.k_per_split,
            flat.stride(0), qweight.stride(0), *output_strides(out, plan),
            BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_K=plan.block_k, UPCAST=upcast_dots(x.dtype),
            HAS_BIAS=bias is not None, SPLIT=plan.split_k > 1, EMULATE_RNE=interpreting(),
            num_warps=plan.num_warps)
    return finish(out, plan, bias, x.dtype).view(*x.shape[:-1], n)
