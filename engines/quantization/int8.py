"""Weight-only INT8, symmetric, one scale per output channel.

On CPU the matmul is `aten._weight_int8pack_mm`, which wants bf16 activations (fp32 ones
are 15-80x slower), so activations are cast to bf16 around it.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.triton.select import use_triton


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float -> (int8 [N, K], fp32 scales [N]) with w ~= q * scale."""
    w = weight.float()
    scales = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


class Int8Linear(nn.Module):
    def __init__(self, weight: torch.Tensor | None, bias: torch.Tensor | None,
                 q: torch.Tensor | None = None, scales: torch.Tensor | None = None):
        super().__init__()
        if q is None:
            q, scales = quantize_int8(weight)
        self.out_features, self.in_features = q.shape
        self.register_buffer("qweight", q)
        self.register_buffer("scales", scales.to(torch.bfloat16))
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    @property
    def portable(self) -> dict[str, torch.Tensor]:
        return {"qweight": self.qweight, "scales": self.scales}

    def dequantized(self) -> torch.Tensor:
        return self.qweight.float() * self.scales.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if use_triton(x):
            from kernels.triton.gemm_weight_only import w8a16_linear
            return w8a16_linear(x, self.qweight, self.scales, self.bias)
        shape = x.shape
        out = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, shape[-1]).to(torch.bfloat16), self.qweight, self.scales)
        out = out.to(x.dtype).view(*shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias
