"""Block-quantized linears with int8 activations: llama.cpp's arithmetic on the GGUF's own blocks.

Weights stay in blocks of 32 along the input: 4-bit with a scale and a min (a Q4_1 block, a Q4_K
sub-block; `BlockQ4Linear`) or 8-bit with a scale (Q8_0; `BlockQ8Linear`). At run time each row
of activations is quantized to int8 per block of 32 (scale amax / 127) and every block's dot
product is taken in integers (kernels/cpu/block_linear.cpp). At the one to sixteen rows a
latency tier or a throughput worker steps, a linear is bound by its weight's bytes and its
instruction count: 4-bit blocks read a quarter of bf16's bytes and spend one integer
multiply-add per weight, where torch's W4A16 op converts every weight to floating point.
Quantizing the activations costs quality that weight-only INT4 does not (measured with
`tiergate eval ppl`, variant `w4a8-gguf`).

Off the C++ kernels (no compiler, another device) the torch reference computes the same values.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.block_layout import (deinterleave_columns, deinterleave_q4, deinterleave_q8, interleave_columns,
                                  interleave_q4, interleave_q8)
from kernels.cpu_extension import load_cpu_kernels
from kernels.linear import PackedWeight
from kernels.reference_gemm import (q4_block_linear_ref, q8_block_linear_ref, quantize_blocks_q8_ref,
                                    unpack_block_nibbles)

BLOCK = 32


_NATIVE_DTYPES = (torch.float32, torch.bfloat16)


def _native(x: torch.Tensor):
    return load_cpu_kernels() if x.is_cpu and x.dtype in _NATIVE_DTYPES else None


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[..., K] -> [M, K]; the model's 2-D activations pass through without a reshape (at batch 1
    each Python op is a visible share of a linear)."""
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


def _unrows(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return out if x.dim() == 2 else out.view(*x.shape[:-1], out.shape[-1])


class _KernelArgs:
    """The kernel's tensors as one plain tuple, cached: at batch 1 a linear's arithmetic takes
    microseconds, and reading buffers through nn.Module attribute lookup cost as much again.
    Rebuilt after anything that moves or converts the module's tensors (`_apply`)."""

    _ARG_NAMES: tuple[str, ...] = ()

    def _kernel_args(self) -> tuple:
        args = self.__dict__.get("_args")
        if args is None:
            args = tuple(getattr(self, name) for name in self._ARG_NAMES)
            self.__dict__["_args"] = args
        return args

    def _apply(self, fn, recurse=True):
        self.__dict__["_args"] = None
        return super()._apply(fn, recurse)


def pack_block_nibbles(q: torch.Tensor) -> torch.Tensor:
    """[N, K] values 0..15 -> [N, K/2] uint8, per block of 32: elements 0..15 in the low nibbles
    of its 16 bytes, 16..31 in the high ones (GGUF's order, which the kernel unpacks with one shift)."""
    n, k = q.shape
    blocks = q.to(torch.uint8).view(n, k // BLOCK, BLOCK)
    return (blocks[..., :16] | (blocks[..., 16:] << 4)).reshape(n, k // 2)


def quantize_blocks_q8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float -> (int8 [N, K], fp32 scales [N, K/32]), w ~= q * scale per block: the rule the
    activations are quantized by, which is Q8_0's (a block's largest magnitude maps to 127, so a
    Q8_0 block comes back with its own values)."""
    _check_width(weight.shape[1])
    q, scales, _ = quantize_blocks_q8_ref(weight)
    return q, scales


def _check_width(k: int) -> None:
    if k % BLOCK:
        raise ValueError(f"block-quantized linears need an input width that is a multiple of {BLOCK}, not {k}")


class BlockQ4Linear(_KernelArgs, nn.Module):
    """w = scale * q + min per block of 32, q in 0..15. Held in the kernel's interleaved layout
    (kernels/block_layout.py); `portable` gives the GGUF block order back."""

    def __init__(self, nibbles: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, half = nibbles.shape
        self.in_features = half * 2
        _check_width(self.in_features)
        self.register_buffer("packed", interleave_q4(unpack_block_nibbles(nibbles)))
        self.register_buffer("packed_scales", interleave_columns(scales))
        self.register_buffer("packed_mins", interleave_columns(mins))
        self.bias = None if bias is None else nn.Parameter(bias.detach().float().clone(), requires_grad=False)
        # A dense copy for steps of many rows (engines/quantization/dense_prefill.py), or None.
        self.dense: PackedWeight | None = None
        self.dense_bias: torch.Tensor | None = None
        self.dense_min_rows = 0

    @classmethod
    def from_groups(cls, q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                    bias: torch.Tensor | None) -> BlockQ4Linear:
        """From INT4 g32 in the (q - 8) * scale + zero convention (engines/quantization/int4.py)."""
        _check_width(q.shape[1])
        return cls(pack_block_nibbles(q), scales, zeros.float() - 8.0 * scales.float(), bias)

    @property
    def portable(self) -> dict[str, torch.Tensor]:
        n = self.out_features
        return {"nibbles": pack_block_nibbles(deinterleave_q4(self.packed, n)),
                "scales": deinterleave_columns(self.packed_scales, n),
                "mins": deinterleave_columns(self.packed_mins, n)}

    def dequantized(self) -> torch.Tensor:
        n, k = self.out_features, self.in_features
        q = deinterleave_q4(self.packed, n).float().view(n, k // BLOCK, BLOCK)
        scales = deinterleave_columns(self.packed_scales, n)
        mins = deinterleave_columns(self.packed_mins, n)
        return (q * scales[..., None] + mins[..., None]).view(n, k)

    _ARG_NAMES = ("packed", "packed_scales", "packed_mins", "bias")

    def fused_form(self) -> tuple[int, list[torch.Tensor]]:
        """What kernels/cpu/decoder_layer.cpp takes for this linear: kind 4 and its kernel's tensors."""
        return 4, [t for t in self._kernel_args() if t is not None]

    def attach_dense(self, dtype: torch.dtype, min_rows: int) -> None:
        """Multiply steps of at least `min_rows` rows by a dense `dtype` copy of these weights
        (the same values, dequantized), where that measured faster (dense_prefill.py)."""
        self.dense = PackedWeight(self.dequantized().to(dtype))
        self.dense_bias = None if self.bias is None else self.bias.to(dtype)
        self.dense_min_rows = min_rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = _rows(x)
        dense = self.dense
        if dense is not None and flat.shape[0] >= self.dense_min_rows and x.is_cpu:
            return _unrows(dense.linear(flat.to(dense.data.dtype), self.dense_bias), x).to(x.dtype)
        native = _native(x)
        if native is not None:
            # The kernel writes x's dtype itself: no second pass converting its fp32 sums.
            return _unrows(native.q4_block_linear(flat, *self._kernel_args(), self.out_features, False), x)
        p = self.portable
        out = _unrows(q4_block_linear_ref(flat, p["nibbles"], p["scales"], p["mins"], self.bias), x)
        return out if x.dtype is torch.float32 else out.to(x.dtype)


class BlockQ8Linear(_KernelArgs, nn.Module):
    """w = scale * q per block of 32, q in -127..127. Held in the kernel's interleaved layout."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        _check_width(self.in_features)
        self.register_buffer("packed", interleave_q8(qweight))
        self.register_buffer("packed_scales", interleave_columns(scales))
        self.bias = None if bias is None else nn.Parameter(bias.detach().float().clone(), requires_grad=False)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> BlockQ8Linear:
        return cls(*quantize_blocks_q8(weight), bias)

    @property
    def portable(self) -> dict[str, torch.Tensor]:
        n = self.out_features
        return {"qweight": deinterleave_q8(self.packed, n), "scales": deinterleave_columns(self.packed_scales, n)}

    def dequantized(self) -> torch.Tensor:
        n, k = self.out_features, self.in_features
        p = self.portable
        return (p["qweight"].float().view(n, k // BLOCK, BLOCK) * p["scales"][..., None]).view(n, k)

    _ARG_NAMES = ("packed", "packed_scales", "bias")
    dense = None                  # no dense prefill copy for these

    def fused_form(self) -> tuple[int, list[torch.Tensor]]:
        """What kernels/cpu/decoder_layer.cpp takes for this linear: kind 8 and its kernel's tensors."""
        return 8, [t for t in self._kernel_args() if t is not None]

    def _product(self, x: torch.Tensor, float_output: bool) -> torch.Tensor:
        native = _native(x)
        flat = _rows(x)
        if native is not None:
            return _unrows(native.q8_block_linear(flat, *self._kernel_args(), self.out_features, float_output), x)
        p = self.portable
        out = _unrows(q8_block_linear_ref(flat, p["qweight"], p["scales"], self.bias), x)
        return out if float_output or x.dtype is torch.float32 else out.to(x.dtype)

    def forward_float(self, x: torch.Tensor) -> torch.Tensor:
        """The product in fp32 whatever x's dtype (an output head's logits)."""
        return self._product(x, True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._product(x, False)
