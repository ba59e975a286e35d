"""W8A8: INT8 weights (symmetric, one scale per output channel, the same values as weight-only
INT8) and INT8 activations quantized per token at run time, multiplied in int32.

On a CPU with AVX-512 VNNI an int8 GEMM does four multiply-adds where fp32 does one, so this
is the fastest dense format at the batch sizes a throughput tier runs (bench profile measures
it against bf16 and fp32 per machine). The activation's scale is its row's own (per token), so
a request's numbers do not depend on the other rows of the batch. The C++ kernel
(kernels/cpu/int8_linear.cpp) does quantize, GEMM (oneDNN, at::_int_mm) and rescale in one
call; elsewhere (no compiler, another device) the torch reference computes the same values,
slowly: this format is written for CPUs, where FP8 or INT4 serve a GPU better.
"""

from __future__ import annotations

import torch
from torch import nn

from engines.quantization.int8 import Int8Linear
from kernels.cpu_extension import load_cpu_kernels
from kernels.reference_gemm import w8a8_linear_ref


class W8A8Linear(Int8Linear):
    """Weight-only INT8's stored form (and artifact tensors); only the product differs."""

    def __init__(self, weight: torch.Tensor | None, bias: torch.Tensor | None,
                 q: torch.Tensor | None = None, scales: torch.Tensor | None = None):
        super().__init__(weight, bias, q, scales)
        # The rescale reads fp32 scales and bias (the scales' one bf16 rounding is the stored form).
        self.qweight = self.qweight.contiguous()
        self.scales = self.scales.float()
        if self.bias is not None:
            self.bias = nn.Parameter(self.bias.detach().float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        native = load_cpu_kernels() if x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16) else None
        if native is not None:
            out = native.w8a8_linear(flat, self.qweight, self.scales, self.bias)
        else:
            out = w8a8_linear_ref(flat, self.qweight, self.scales, self.bias)
        return out.view(*shape[:-1], self.out_features)
