"""FP8 e4m3 weights with one fp32 scale per output channel.

On CPU FP8 is a storage format: the weight is dequantized to the activation dtype for
each matmul. (The CUDA path gets real FP8 GEMMs from the kernels issue.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.triton.select import use_triton

E4M3_MAX = 448.0


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
        self.register_buffer("qweight", q)
        self.register_buffer("weight_scale", scales.float())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    @property
    def portable(self) -> dict[str, torch.Tensor]:
        return {"qweight": self.qweight, "weight_scale": self.weight_scale}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if use_triton(x):   # real FP8 GEMM: activations quantized per token (kernels/triton/gemm_fp8.py)
            from kernels.triton.gemm_fp8 import fp8_linear
            return fp8_linear(x, self.qweight, self.weight_scale, self.bias)
        w = (self.qweight.to(torch.float32) * self.weight_scale[:, None]).to(x.dtype)
        return F.linear(x, w, None if self.bias is None else self.bias.to(x.dtype))
