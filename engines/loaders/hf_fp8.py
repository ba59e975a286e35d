"""Ready-made FP8 checkpoints in the common Hugging Face layouts: each decoder linear's
`weight` stored as float8_e4m3fn beside a `weight_scale` that is per tensor (a scalar or
[1]) or per output channel ([N] or [N, 1]), with w = weight * weight_scale.

config.json's quantization_config names the producer: quant_method "fp8" (AutoFP8 / vLLM
style), "fbgemm_fp8", or "compressed-tensors" (llm-compressor, format "float-quantized"
with 8-bit float weights and "tensor" or "channel" strategy). Layers the checkpoint left
unquantized (its ignore list) keep their plain weight. Activation scales (`input_scale`)
are not used: on CPU FP8 is a weight storage format and activations stay bf16/fp32.
Block-wise scales (`weight_scale_inv` with weight_block_size) are not supported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from engines.errors import ModelLoadError
from engines.model import LlamaForCausalLM
from engines.quantization.fp8 import Fp8Linear

FP8_METHODS = ("fp8", "fbgemm_fp8", "compressed-tensors")
_GROUPS = (
    ("self_attn", "qkv_proj", ("q_proj", "k_proj", "v_proj")),
    ("self_attn", "o_proj", ("o_proj",)),
    ("mlp", "gate_up_proj", ("gate_proj", "up_proj")),
    ("mlp", "down_proj", ("down_proj",)),
)


def fp8_checkpoint_method(raw_config: dict[str, Any]) -> str | None:
    """The quant_method of an FP8 checkpoint's config.json, None if it is not one we read as FP8."""
    qc = raw_config.get("quantization_config") or {}
    method = qc.get("quant_method")
    if method not in FP8_METHODS:
        return None
    if qc.get("weight_block_size"):
        raise ModelLoadError(f"FP8 checkpoint with block-wise scales (weight_block_size={qc['weight_block_size']}) "
                             "is not supported; tiergate reads per-tensor or per-channel FP8 scales")
    if method == "compressed-tensors":
        if qc.get("format") not in (None, "float-quantized", "naive-quantized"):
            raise ModelLoadError(f"compressed-tensors format {qc.get('format')!r} is not supported; "
                                 "tiergate reads 'float-quantized' FP8 checkpoints")
        for name, group in (qc.get("config_groups") or {}).items():
            w = group.get("weights") or {}
            if w.get("type") != "float" or w.get("num_bits") != 8 or w.get("strategy") not in ("tensor", "channel"):
                raise ModelLoadError(f"compressed-tensors group {name!r} has weights {w}; tiergate reads 8-bit "
                                     "float weights with 'tensor' or 'channel' scales")
    return method


def _channel_scales(hf: Mapping[str, torch.Tensor], base: str, rows: int) -> torch.Tensor:
    scale = hf.get(f"{base}.weight_scale")
    if scale is None:
        raise ModelLoadError(f"FP8 checkpoint lacks tensor {base + '.weight_scale'!r}")
    scale = scale.float().reshape(-1)
    if scale.numel() == 1:                       # per tensor: the same scale for every channel
        return scale.expand(rows).clone()
    if scale.numel() != rows:
        raise ModelLoadError(f"{base}.weight_scale has {scale.numel()} values; expected 1 (per tensor) or "
                             f"{rows} (per output channel)")
    return scale


def install_fp8_linears(model: LlamaForCausalLM, hf: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Replace each decoder linear stored in FP8 by an Fp8Linear (q/k/v and gate/up fused, a
    per-tensor scale repeated over its rows). Returns the tensors for load_hf_state_dict, with
    the consumed weights renamed `.qweight` so that it leaves those linears alone."""
    consumed: set[str] = set()
    for i, layer in enumerate(model.layers):
        for block_name, ours, parts in _GROUPS:
            bases = [f"model.layers.{i}.{block_name}.{part}" for part in parts]
            weights = [hf.get(f"{base}.weight") for base in bases]
            is_fp8 = [w is not None and w.dtype == torch.float8_e4m3fn for w in weights]
            if not any(is_fp8):
                continue
            if not all(is_fp8):
                raise ModelLoadError(f"layer {i}: {', '.join(parts)} must all be FP8 or all unquantized")
            scales = [_channel_scales(hf, base, w.shape[0]) for base, w in zip(bases, weights)]
            biases = [hf[f"{base}.bias"] for base in bases if f"{base}.bias" in hf]
            bias = torch.cat(biases).to(model.dtype) if biases else None
            block = getattr(layer, block_name)
            expected = (getattr(block, ours).out_features, getattr(block, ours).in_features)
            q = torch.cat(weights)
            if tuple(q.shape) != expected:
                raise ModelLoadError(f"layer {i} {ours}: FP8 weights of shape {tuple(q.shape)}, model expects {expected}")
            setattr(block, ours, Fp8Linear(None, bias, q=q, scales=torch.cat(scales)))
            consumed.update(bases)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in hf.items():
        base, _, suffix = name.rpartition(".")
        if base in consumed and suffix == "weight":
            out[f"{base}.qweight"] = tensor
        elif tensor.dtype == torch.float8_e4m3fn and base not in consumed:
            raise ModelLoadError(f"tensor {name!r} is FP8 but not a decoder linear; tiergate cannot load it")
        else:
            out[name] = tensor
    return out
