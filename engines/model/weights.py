"""Map a Hugging Face Llama state dict onto our fused module layout."""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from engines.errors import ModelLoadError
from engines.model.llama import LlamaForCausalLM

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# (our module under layers.N, the HF parts concatenated along the output dim, in order)
_FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}
_SINGLE = ("self_attn.o_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm")


def load_hf_state_dict(model: LlamaForCausalLM, hf: Mapping[str, torch.Tensor]) -> None:
    """Copy HF-named tensors into `model`, fusing q/k/v and gate/up. Fails on any gap.
    Linears stored quantized (`qweight`) were installed by their loader and are skipped."""
    cfg = model.config
    ours: dict[str, torch.Tensor] = {"embed_tokens.weight": _get(hf, "model.embed_tokens.weight")}
    ours["norm.weight"] = _get(hf, "model.norm.weight")
    if model.lm_head is not None:
        ours["lm_head.weight"] = _get(hf, "lm_head.weight")
    for i in range(cfg.num_hidden_layers):
        prefix = f"model.layers.{i}."
        for fused, parts in _FUSED.items():
            if f"{prefix}{parts[0]}.qweight" in hf:
                continue
            for suffix in ("weight", "bias"):
                names = [f"{prefix}{p}.{suffix}" for p in parts]
                if suffix == "bias" and names[0] not in hf:
                    continue
                ours[f"layers.{i}.{fused}.{suffix}"] = torch.cat([_get(hf, n) for n in names], dim=0)
        for single in _SINGLE:
            if f"{prefix}{single}.qweight" in hf:
                continue
            for suffix in ("weight", "bias"):
                name = f"{prefix}{single}.{suffix}"
                if suffix == "weight" or name in hf:
                    ours[f"layers.{i}.{single}.{suffix}"] = _get(hf, name)
    _check_no_extra_layers(hf, cfg.num_hidden_layers)
    params = dict(model.named_parameters())
    for name, tensor in ours.items():
        if name not in params:
            raise ModelLoadError(f"checkpoint tensor {name!r} has no place in the model (bias mismatch?)")
        target = params[name]
        if tuple(target.shape) != tuple(tensor.shape):
            raise ModelLoadError(f"tensor {name!r} has shape {tuple(tensor.shape)}, model expects {tuple(target.shape)}")
        with torch.no_grad():
            target.copy_(tensor.to(target.dtype))
    missing = sorted(set(params) - set(ours))
    if missing:
        raise ModelLoadError(f"checkpoint lacks {len(missing)} tensors, first {missing[0]!r}")


def _get(hf: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
    try:
        return hf[name]
    except KeyError:
        raise ModelLoadError(f"checkpoint lacks tensor {name!r}") from None


def _check_no_extra_layers(hf: Mapping[str, torch.Tensor], n_layers: int) -> None:
    for name in hf:
        match = _LAYER.match(name)
        if match and int(match.group(1)) >= n_layers:
            raise ModelLoadError(f"checkpoint has layer {match.group(1)} but config says {n_layers} layers")
