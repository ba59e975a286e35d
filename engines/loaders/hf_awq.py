"""Ready-made AWQ checkpoints in the common Hugging Face layout (AutoAWQ "gemm"):
per linear `qweight` [in, out/8] int32 and `qzeros` [in/group, out/8] int32, eight 4-bit
values per int32 in the interleaved order below, and `scales` [in/group, out] fp16, with
w = (q - z) * s. They are converted to our INT4 modules (w = (q - 8) * s + zero)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from engines.errors import ModelLoadError
from engines.model import LlamaForCausalLM
from engines.quantization.int4 import Int4Linear

# Nibble i (bits 4i..4i+3) of an int32 holds output column 8j + AWQ_ORDER[i].
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_GROUPS = (
    ("self_attn", "qkv_proj", ("q_proj", "k_proj", "v_proj")),
    ("self_attn", "o_proj", ("o_proj",)),
    ("mlp", "gate_up_proj", ("gate_proj", "up_proj")),
    ("mlp", "down_proj", ("down_proj",)),
)


def awq_group_size(raw_config: dict[str, Any]) -> int | None:
    """The group size of an AWQ checkpoint's config.json, None if it is not AWQ."""
    qc = raw_config.get("quantization_config") or {}
    if qc.get("quant_method") != "awq":
        return None
    if qc.get("bits", 4) != 4 or str(qc.get("version", "gemm")).lower() != "gemm" or not qc.get("zero_point", True):
        raise ModelLoadError(f"unsupported AWQ variant {qc}; tiergate reads 4-bit GEMM checkpoints with zero points")
    return int(qc.get("group_size", 128))


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """[rows, cols/8] int32 -> [rows, cols] values 0..15."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    nibbles = (packed.to(torch.int32).unsqueeze(-1) >> shifts) & 15          # [rows, cols/8, 8]
    out = torch.empty_like(nibbles)
    out[..., list(AWQ_ORDER)] = nibbles
    return out.reshape(packed.shape[0], -1)


def pack_awq(values: torch.Tensor) -> torch.Tensor:
    """Inverse of unpack_awq ([rows, cols] 0..15 -> [rows, cols/8] int32), for writing test files."""
    v = values.to(torch.int64).reshape(values.shape[0], -1, 8)[..., list(AWQ_ORDER)]
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    packed = (v << shifts).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def install_awq_linears(model: LlamaForCausalLM, hf: Mapping[str, torch.Tensor], group_size: int) -> None:
    """Replace each decoder linear by an Int4Linear built from the checkpoint's AWQ tensors."""
    for i, layer in enumerate(model.layers):
        for block_name, ours, parts in _GROUPS:
            block = getattr(layer, block_name)
            qs, scales, zeros, biases = [], [], [], []
            for part in parts:
                base = f"model.layers.{i}.{block_name}.{part}"
                try:
                    q = unpack_awq(hf[f"{base}.qweight"]).t()
                    z = unpack_awq(hf[f"{base}.qzeros"]).t().float()
                    s = hf[f"{base}.scales"].float().t()
                except KeyError as exc:
                    raise ModelLoadError(f"AWQ checkpoint lacks tensor {exc.args[0]!r}") from None
                qs.append(q)
                scales.append(s)
                zeros.append(s * (8.0 - z))        # (q - z) s == (q - 8) s + s (8 - z)
                if f"{base}.bias" in hf:
                    biases.append(hf[f"{base}.bias"])
            in_features = getattr(block, ours).in_features
            if in_features % group_size:
                raise ModelLoadError(f"AWQ group size {group_size} does not divide {in_features}")
            bias = torch.cat(biases).to(model.dtype) if biases else None
            setattr(block, ours, Int4Linear(None, bias, group_size, torch.cat(qs).contiguous(),
                                            torch.cat(scales), torch.cat(zeros), in_features=in_features))
