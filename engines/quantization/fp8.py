"""FP8 e4m3 weights with one fp32 scale per output channel.

On CPU FP8 is a storage format and the matmul runs in bf16/fp32: since the scale is per
output channel, y = (x W8^T) * scale, so the e4m3 weight converts to bf16 exactly and the
scale is applied to the output. Decode-sized inputs (<= 8 rows) run the C++ kernel that
converts each weight chunk in registers (kernels/cpu/fp8_linear.cpp), reading one byte per
weight; larger ones convert the weight to bf16 for that call and run a bf16 GEMM. Where
the C++ kernels are unavailable the weight is converted with torch. On CUDA the Triton FP8
GEMM runs (kernels/triton/gemm_fp8.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.cpu_extension import load_cpu_kernels
from kernels.triton.select import use_triton

E4M3_MAX = 448.0
FUSED_MAX_ROWS = 8    # the C++ kernel's row limit; above it converting once per call wins


def quantize_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    w = weight.float()
    scales = (w.abs().amax(dim=1) / E4M3_MAX).clamp_min(1e-12)
    return (w / scales[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scales


class Fp8Linear(nn.Module):
    def __init__(self, weight: torch.Tensor | None, bias: torch.Tensor | None, q: torch.Tensor | None = None,
                 scales: torch.Tensor | None = None):
        super().__init__()
        if q is None:
            q, scales = quantize_fp8(weight)
        self.in_features, self.out_features = q.shape[1], q.shape[0]
        self.register_buffer("qweight", q.contiguous())
        self.register_buffer("weight_scale", scales.float().reshape(-1).contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    @property
    def portable(self) -> dict[str, torch.Tensor]:
        return {"qweight": self.qweight, "weight_scale": self.weight_scale}

    def dequantized(self) -> torch.Tensor:
        return self.qweight.float() * self.weight_scale[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if use_triton(x):   # real FP8 GEMM: activations quantized per token (kernels/triton/gemm_fp8.py)
            from kernels.triton.gemm_fp8 import fp8_linear

            return fp8_linear(x, self.qweight, self.weight_scale, self.bias)
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        native = load_cpu_kernels() if x.device.type == "cpu" else None
        if native is not None and flat.shape[0] <= FUSED_MAX_ROWS and flat.dtype in (torch.float32, torch.bfloat16):
            out = native.fp8_linear(flat, self.qweight, self.weight_scale)
        else:
            w = native.fp8_to_bf16(self.qweight) if native is not None else self.qweight
            out = (F.linear(flat, w.to(flat.dtype)).float() * self.weight_scale).to(x.dtype)
        out = out.view(*shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias.to(x.dtype)
