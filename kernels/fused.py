"""Fused per-token decoder ops: Triton on CUDA (kernels/triton/), the C++ CPU kernel where it
built, else the torch reference."""

from __future__ import annotations

import torch

from kernels.cpu_extension import load_cpu_kernels
from kernels.reference import add_rms_norm_ref, silu_mul_ref
from kernels.reference_rope import apply_rope_ref
from kernels.triton.select import use_triton


def _native(t: torch.Tensor):
    return load_cpu_kernels() if t.device.type == "cpu" and t.dtype in (torch.float32, torch.bfloat16) else None


def add_rms_norm(residual: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """residual += delta in place (when given), then return RMSNorm(residual) * weight."""
    if use_triton(residual):
        from kernels.triton.elementwise import add_rms_norm_triton
        return add_rms_norm_triton(residual, delta, weight, eps)
    native = _native(residual)
    if native is not None and residual.dim() == 2:
        return native.add_rms_norm(residual, delta, weight, eps)
    return add_rms_norm_ref(residual, delta, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    if use_triton(gate_up):
        from kernels.triton.elementwise import silu_mul_triton
        return silu_mul_triton(gate_up)
    native = _native(gate_up)
    if native is not None and gate_up.dim() == 2:
        return native.silu_mul(gate_up)
    return silu_mul_ref(gate_up)


def rope_split_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, n_kv: int,
                   head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused QKV projection's output [T, (Hq + 2 Hkv) D] -> q [T, Hq, D] and k [T, Hkv, D]
    rotated (cos, sin: [T, 1, D], the sign of rotate_half folded into sin), v [T, Hkv, D].
    On the CPU one C++ pass writes all three contiguous; elsewhere Q and K, adjacent columns,
    are rotated together and v is a view."""
    t = qkv.shape[0]
    native = None if use_triton(qkv) else _native(qkv)
    if native is not None and qkv.dim() == 2 and qkv.stride(1) == 1 and cos.dtype == qkv.dtype:
        q, k, v = native.rope_split_qkv(qkv, cos, sin, n_heads, n_kv, head_dim)
        return q, k, v
    qk = qkv[:, : (n_heads + n_kv) * head_dim].view(t, n_heads + n_kv, head_dim)
    if use_triton(qkv):
        from kernels.triton.elementwise import apply_rope_triton
        qk = apply_rope_triton(qk, cos, sin)
    else:
        qk = apply_rope_ref(qk, cos, sin)
    v = qkv[:, (n_heads + n_kv) * head_dim:].view(t, n_kv, head_dim)
    return qk[:, :n_heads], qk[:, n_heads:], v
