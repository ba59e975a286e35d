"""Weight-only INT4, asymmetric, one scale and zero per group of input channels.

Values are 0..15 with w ~= (q - 8) * scale + zero, the convention of torch's CPU int4 ops
(`_convert_weight_to_int4pack_for_cpu` / `_weight_int4pack_mm_for_cpu`). When the group
size does not divide the input size (576 = 4.5 x 128 in SmolLM2), the weight is padded with
zero columns to the next multiple and the activations with zeros to match.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engines.quantization.methods import INT4_GROUP_SIZES
from kernels.reference_gemm import w4a16_linear_ref
from kernels.triton.select import use_triton


def quantize_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest. [N, K] -> (q int32 [N, K] in 0..15, scales [N, K/g], zeros [N, K/g])."""
    n, k = weight.shape
    if group_size not in INT4_GROUP_SIZES or k % group_size:
        raise ValueError(f"group size {group_size} must be one of {INT4_GROUP_SIZES} and divide {k}")
    w = weight.float().view(n, k // group_size, group_size)
    lo, hi = w.amin(dim=-1), w.amax(dim=-1)
    scales = ((hi - lo) / 15.0).clamp_min(1e-8)
    q = torch.round((w - lo[..., None]) / scales[..., None]).clamp(0, 15)
    zeros = lo + 8.0 * scales
    return q.to(torch.int32).view(n, k), scales, zeros


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """[N, K] values 0..15 -> [N, K/2] uint8, two per byte (low nibble first): the stored form."""
    return (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    p = packed.to(torch.int32)
    return torch.stack([p & 15, p >> 4], dim=-1).view(p.shape[0], -1)


def dequantize_int4(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    n, k = q.shape
    qg = q.float().view(n, k // group_size, group_size)
    return ((qg - 8.0) * scales[..., None] + zeros[..., None]).view(n, k)


class Int4Linear(nn.Module):
    def __init__(self, weight: torch.Tensor | None, bias: torch.Tensor | None, group_size: int,
                 q: torch.Tensor | None = None, scales: torch.Tensor | None = None, zeros: torch.Tensor | None = None,
                 in_features: int | None = None):
        super().__init__()
        self.in_features = in_features or weight.shape[1]
        if q is None:
            pad = -weight.shape[1] % group_size
            q, scales, zeros = quantize_int4(F.pad(weight.float(), (0, pad)), group_size)
        # The portable form: what an artifact stores, and what the Triton W4A16 kernel and the
        # off-CPU torch path read. An artifact-loaded CPU layer drops it (see quantization/artifact.py).
        self.portable: dict[str, torch.Tensor] | None = {
            "q": pack_nibbles(q), "scales": scales.float(), "zeros": zeros.float()}
        self.padded_in = q.shape[1]
        self.out_features = q.shape[0]
        self.group_size = group_size
        # The CPU op's own packed copy, built only for weights on the CPU (quantizing on another
        # device leaves the nibble form alone, as drop_cpu_pack does after a move).
        on_cpu = q.device.type == "cpu"
        self.register_buffer("qweight", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2) if on_cpu else None)
        # [K/g, N, 2] (scale, zero) in bf16, the layout the CPU op reads.
        self.register_buffer("scales_and_zeros", torch.stack([scales.t(), zeros.t()], dim=-1).to(torch.bfloat16)
                             .contiguous() if on_cpu else None)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    def _apply(self, fn, recurse=True):
        # `portable` is a plain dict, not buffers (weight_bytes would count it twice on CPU):
        # .to(device) must still move it, so the Triton path finds its nibbles on the device.
        super()._apply(fn, recurse)
        if self.portable is not None:
            self.portable = {key: fn(value) for key, value in self.portable.items()}
        return self

    def drop_cpu_pack(self) -> None:
        """Off the CPU the nibble form serves (Triton, or the torch reference); the CPU op's
        packed copy would only take device memory."""
        if self.portable is None:
            raise RuntimeError("this INT4 layer was loaded without its nibble form; it can only run on the CPU op")
        self.qweight = self.scales_and_zeros = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.portable
        if use_triton(x):   # W4A16 reads the portable nibbles
            from kernels.triton.gemm_weight_only import w4a16_linear
            if p is None:
                raise RuntimeError("this INT4 layer was loaded without its nibble form; the Triton path needs it")
            return w4a16_linear(x, p["q"], p["scales"], p["zeros"], self.group_size, self.bias)
        if self.qweight is None or x.device.type != "cpu":
            # Not on the CPU op (CUDA with TIERGATE_KERNELS=torch): dequantize, one fp32 matmul.
            return w4a16_linear_ref(x, p["q"], p["scales"], p["zeros"], self.group_size, self.bias)
        shape = x.shape
        flat = x.reshape(-1, shape[-1]).to(torch.bfloat16)
        if self.padded_in != self.in_features:
            flat = F.pad(flat, (0, self.padded_in - self.in_features))
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.qweight, self.group_size, self.scales_and_zeros)
        out = out.to(x.dtype).view(*shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias
