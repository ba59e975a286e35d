"""Building blocks of the decoder: RMSNorm, a swappable Linear, SwiGLU."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.fused import add_rms_norm, silu_mul
from kernels.linear import PackedWeight


class RMSNorm(nn.Module):
    """Computed in fp32 whatever the model dtype: torch's fused fp32 kernel is both more
    accurate and several times faster on CPU than its bf16 path. The weight stays fp32."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, dtype=torch.float32), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return add_rms_norm(x, None, self.weight, self.eps)

    def add_and_norm(self, residual: torch.Tensor, delta: torch.Tensor | None) -> torch.Tensor:
        """residual += delta in place, then normalise it: one fused pass."""
        return add_rms_norm(residual, delta, self.weight, self.eps)


class Linear(nn.Module):
    """y = x W^T (+ b). `pack()` prepares the weight for fast CPU GEMMs once loaded;
    quantization replaces this module with a quantized variant."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), requires_grad=False)
        self.bias = (
            nn.Parameter(torch.zeros(out_features, dtype=dtype), requires_grad=False) if bias else None
        )
        self._packed: PackedWeight | None = None

    def pack(self) -> None:
        self._packed = PackedWeight(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is not None:
            return self._packed.linear(x, self.bias)
        return F.linear(x, self.weight, self.bias)


class SwiGLU(nn.Module):
    """The Llama MLP with gate and up fused into one matmul."""

    def __init__(self, hidden: int, intermediate: int, bias: bool, dtype: torch.dtype):
        super().__init__()
        self.intermediate = intermediate
        self.gate_up_proj = Linear(hidden, 2 * intermediate, bias, dtype)
        self.down_proj = Linear(intermediate, hidden, bias, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_mul(self.gate_up_proj(x)))
