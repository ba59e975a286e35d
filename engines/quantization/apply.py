"""Swap a loaded model's decoder Linear layers for quantized ones, with progress."""

from __future__ import annotations

from torch import nn
from tqdm import tqdm

from engines.model import LlamaForCausalLM
from engines.model.layers import Linear
from engines.quantization.fp8 import Fp8Linear
from engines.quantization.int4 import Int4Linear
from engines.quantization.int8 import Int8Linear
from engines.quantization.methods import LAYER_METHODS
from engines.quantization.int4 import quantize_int4
from engines.quantization.w4a8 import BlockQ4Linear
from engines.quantization.w8a8 import W8A8Linear


def quantized_linear(method: str, layer: Linear, group_size: int) -> nn.Module:
    """`layer` as a quantized module of a layer method (LAYER_METHODS), with no data."""
    if method == "int8":
        return Int8Linear(layer.weight, layer.bias)
    if method == "int4-rtn":
        return Int4Linear(layer.weight, layer.bias, group_size)
    if method == "fp8":
        return Fp8Linear(layer.weight, layer.bias)
    if method == "w8a8":
        return W8A8Linear(layer.weight, layer.bias)
    if method == "w4a8":     # INT4 RTN in blocks of 32, whatever `group_size` says: the activations' block
        return BlockQ4Linear.from_groups(*quantize_int4(layer.weight, 32), layer.bias)
    raise ValueError(f"unknown quantization method {method!r}; choose one of {LAYER_METHODS}")


def quantize_model(model: LlamaForCausalLM, method: str, group_size: int = 128, progress: bool = True) -> int:
    """Quantize every decoder Linear in place; returns how many layers were replaced."""
    targets = [(name, module) for name, module in model.named_modules()
               if isinstance(module, Linear) and name.startswith("layers.")]
    for name, module in tqdm(targets, desc=f"quantizing ({method})", disable=not progress, leave=False):
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name), attr, quantized_linear(method, module, group_size))
    return len(targets)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of all parameters and buffers except derived tables (RoPE) and packed copies."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for name, buf in model.named_buffers():
        if not name.startswith("rope."):
            total += buf.numel() * buf.element_size()
    return total
