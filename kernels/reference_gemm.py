"""Torch references of the quantized GEMM kernels (kernels/triton/gemm_*.py): dequantize,
then one fp32 matmul. Signatures equal the kernels'."""

from __future__ import annotations

import torch

E4M3_MAX = 448.0


def _finish(y: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def dequantize_int4_nibbles(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                            group_size: int) -> torch.Tensor:
    """[N, K/2] uint8 (low nibble = even column) + [N, K/g] scales, zeros -> fp32 [N, K],
    w = (q - 8) * scale + zero."""
    p = qweight.to(torch.int32)
    q = torch.stack([p & 15, p >> 4], dim=-1).reshape(p.shape[0], -1).float()
    n, k = q.shape
    w = (q.view(n, k // group_size, group_size) - 8.0) * scales.float()[..., None] + zeros.float()[..., None]
    return w.view(n, k)


def w4a16_linear_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                     group_size: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] with K <= the padded width 2 * qweight.shape[1] (missing columns are zeros)."""
    w = dequantize_int4_nibbles(qweight, scales, zeros, group_size)
    k = x.shape[-1]
    return _finish(x.float() @ w[:, :k].t(), bias, x)


def w8a16_linear_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    w = qweight.float() * scales.float()[:, None]
    return _finish(x.float() @ w.t(), bias, x)


def quantize_rows_fp8_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row dynamic e4m3: scale = max(amax / 448, 1e-12) in fp32."""
    xf = x.float()
    scales = (xf.abs().amax(dim=-1) / E4M3_MAX).clamp_min(1e-12)
    q = (xf / scales[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scales


def fp8_linear_ref(x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor,
                   bias: torch.Tensor | None = None) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    q, scales = quantize_rows_fp8_ref(flat)
    y = (q.float() @ qweight.float().t()) * scales[:, None] * weight_scale.float()[None, :]
    return _finish(y, bias, x).view(*x.shape[:-1], qweight.shape[0])


def quantize_rows_int8_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row dynamic symmetric int8: q = round(x * 127 / amax), scale = amax / 127 (a row of
    zeros gets scale 1). The C++ kernel computes the same values in the same order."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1)
    zero = amax == 0
    inv = torch.where(zero, torch.zeros_like(amax), 127.0 / torch.where(zero, torch.ones_like(amax), amax))
    q = torch.round(xf * inv[:, None]).clamp(-127, 127).to(torch.int8)
    return q, torch.where(zero, torch.ones_like(amax), amax / 127.0)


def w8a8_linear_ref(x: torch.Tensor, qweight: torch.Tensor, col_scale: torch.Tensor,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] quantized per row to int8, times int8 qweight [N, K]^T, scaled back by row and
    column scales. The products are summed in float64, exact for any K a model has (|sum| <
    K * 127^2 < 2^53), so this equals an int32 GEMM."""
    q, row_scale = quantize_rows_int8_ref(x)
    acc = (q.double() @ qweight.double().t()).float()
    y = acc * (row_scale[:, None] * col_scale.float()[None, :])
    return _finish(y, bias, x)


def quantize_blocks_q8_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per block of 32 along K: q = round(x * 127 / amax), d = amax / 127, s = d * sum(q) (the
    C++ kernel's activation format). x [M, K] -> (int8 [M, K], fp32 [M, K/32], fp32 [M, K/32])."""
    m, k = x.shape
    xb = x.float().reshape(m, k // 32, 32)
    amax = xb.abs().amax(dim=-1)
    inv = torch.where(amax > 0, 127.0 / amax.clamp_min(1e-30), torch.zeros_like(amax))
    q = torch.round(xb * inv[..., None]).clamp(-127, 127)
    d = amax / 127.0
    return q.to(torch.int8).reshape(m, k), d, d * q.sum(dim=-1)


def unpack_block_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[N, K/2] uint8, per block of 32 elements 0..15 in the low nibbles and 16..31 in the high
    ones -> [N, K] uint8 values 0..15."""
    n, half = packed.shape
    blocks = packed.view(n, half // 16, 16)
    return torch.cat([blocks & 15, blocks >> 4], dim=-1).reshape(n, half * 2)


def _block_dots(qa: torch.Tensor, da: torch.Tensor, wq: torch.Tensor, wd: torch.Tensor) -> torch.Tensor:
    """sum over blocks of da * dw * dot(qa, qw), the integer dots exact in float64."""
    m, k = qa.shape
    n = wq.shape[0]
    dots = torch.einsum("mbi,nbi->mnb", qa.double().view(m, k // 32, 32), wq.double().view(n, k // 32, 32))
    return (dots * (da.double()[:, None, :] * wd.double()[None, :, :])).sum(-1)


def q4_block_linear_ref(x: torch.Tensor, nibbles: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
                        bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] quantized per block of 32 to int8, times 4-bit blocks (nibbles [N, K/2] as
    unpack_block_nibbles reads them; w = scale * q + min). fp32 [M, N]."""
    qa, da, sa = quantize_blocks_q8_ref(x)
    y = (_block_dots(qa, da, unpack_block_nibbles(nibbles), scales) + sa.double() @ mins.double().t()).float()
    return y if bias is None else y + bias.float()


def q8_block_linear_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                        bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] quantized per block of 32 to int8, times int8 blocks (w = scale * q). fp32 [M, N]."""
    qa, da, _ = quantize_blocks_q8_ref(x)
    y = _block_dots(qa, da, qweight, scales).float()
    return y if bias is None else y + bias.float()
