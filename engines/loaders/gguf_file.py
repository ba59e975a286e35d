"""Read a llama.cpp GGUF file into Hugging Face layout: config, fp32 tensors, tokenizer.

Quantized blocks (Q4_1, Q4_K, Q8_0, ...) are dequantized with `gguf.quants`, and where
llama.cpp permuted the Q/K rows for its interleaved RoPE (llama, not qwen2: see the
architecture table in engines/model_config.py) they are put back in rotate-half order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from engines.errors import ModelLoadError
from engines.loaders.gguf_tokenizer import build_gguf_tokenizer, end_of_generation_ids
from engines.model_config import ARCHITECTURES, Architecture, ModelConfig, RopeScaling

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


@dataclass
class GGUFContents:
    config: ModelConfig
    tensors: dict[str, torch.Tensor]
    tokenizer_json: str
    tokenizer_config: dict[str, Any]
    generation_config: dict[str, Any]      # as an HF repo's generation_config.json: its EOS ids


@dataclass(frozen=True)
class TensorPlace:
    """Where a GGUF tensor goes: its HF name, and whether llama.cpp reordered its rows."""
    hf: str
    unpermute_heads: int | None = None     # Q/K of a permuting architecture: the head count

    def row_order(self, rows: int) -> torch.Tensor | None:
        """Indices taking the file's rows to ours (new[i] = old[order[i]]), None if the same."""
        return None if self.unpermute_heads is None else _unpermute(torch.arange(rows), self.unpermute_heads)


def gguf_decoder_names(reader, path: Path) -> dict[str, TensorPlace]:
    """GGUF tensor name -> TensorPlace, for every tensor our model reads (`reader`: of `path`)."""
    # The vocabulary's arrays are large and not needed here (the token list only ever stands in
    # for a missing vocab_size, which the shapes do not need).
    meta = {name: _field_value(field) for name, field in reader.fields.items()
            if not name.startswith("tokenizer.ggml.")}
    meta["tokenizer.ggml.tokens"] = ()
    arch = _architecture(meta, path)
    return _places(reader, arch, _config(meta, reader, arch))


def _architecture(meta: dict[str, Any], path) -> Architecture:
    arch_name = meta.get("general.architecture")
    if arch_name not in ARCHITECTURES:
        raise ModelLoadError(f"{path}: GGUF architecture {arch_name!r} is not supported "
                             f"(expected one of {sorted(ARCHITECTURES)})")
    return ARCHITECTURES[arch_name]


def _places(reader, arch: Architecture, config: ModelConfig) -> dict[str, TensorPlace]:
    heads = {"q_proj.weight": config.num_attention_heads, "k_proj.weight": config.num_key_value_heads}
    out = {}
    for t in reader.tensors:
        name = _hf_name(t.name)
        if name is None:
            continue
        permuted = next((n for suffix, n in heads.items() if name.endswith(suffix)), None)
        out[t.name] = TensorPlace(name, permuted if arch.gguf_permuted_qk else None)
    return out


def read_gguf(path: Path, progress: bool = True) -> GGUFContents:
    import gguf  # heavy import, only needed on a cache miss

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # the gguf package raises bare ValueError/struct errors
        raise ModelLoadError(f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc})") from None
    meta = {name: _field_value(field) for name, field in reader.fields.items()}
    arch = _architecture(meta, path)
    config = _config(meta, reader, arch)
    places = _places(reader, arch, config)
    tensors = {}
    for t in tqdm(reader.tensors, desc="dequantizing GGUF", unit="tensor", disable=not progress, leave=False):
        place = places.get(t.name)
        if place is None:
            continue
        try:
            array = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise ModelLoadError(f"{path}: tensor {t.name} uses unsupported type {t.tensor_type.name}") from None
        weight = torch.from_numpy(np.array(array, dtype=np.float32, copy=True))
        order = place.row_order(weight.shape[0])
        tensors[place.hf] = weight if order is None else weight[order].contiguous()
    tokens = meta["tokenizer.ggml.tokens"]
    token_types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    tokenizer = build_gguf_tokenizer(
        meta.get("tokenizer.ggml.model", "gpt2"),
        meta.get("tokenizer.ggml.pre", "default"),
        tokens,
        token_types,
        meta.get("tokenizer.ggml.merges") or [],
    )
    ends = end_of_generation_ids(tokens, token_types, [meta.get(f"tokenizer.ggml.{kind}_token_id")
                                                       for kind in ("eos", "eot", "eom")])
    tok_cfg = {
        "chat_template": meta.get("tokenizer.chat_template"),
        "bos_token": _token(tokens, meta.get("tokenizer.ggml.bos_token_id")),
        "eos_token": _token(tokens, meta.get("tokenizer.ggml.eos_token_id")),
        "pad_token": _token(tokens, meta.get("tokenizer.ggml.padding_token_id")),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
    }
    return GGUFContents(config, tensors, tokenizer.to_str(), tok_cfg, {"eos_token_id": ends})


def _config(meta: dict[str, Any], reader, arch: Architecture) -> ModelConfig:
    p = arch.gguf_prefix
    try:
        heads = int(meta[f"{p}.attention.head_count"])
        hidden = int(meta[f"{p}.embedding_length"])
        rope_type = meta.get(f"{p}.rope.scaling.type", "none")
        scaling = RopeScaling()
        if rope_type == "linear":
            scaling = RopeScaling(rope_type="linear", factor=float(meta[f"{p}.rope.scaling.factor"]))
        names = {t.name for t in reader.tensors}
        return ModelConfig(
            vocab_size=int(meta.get(f"{p}.vocab_size") or len(meta["tokenizer.ggml.tokens"])),
            hidden_size=hidden,
            intermediate_size=int(meta[f"{p}.feed_forward_length"]),
            num_hidden_layers=int(meta[f"{p}.block_count"]),
            num_attention_heads=heads,
            num_key_value_heads=int(meta.get(f"{p}.attention.head_count_kv", heads)),
            head_dim=int(meta.get(f"{p}.rope.dimension_count", hidden // heads)),
            rms_norm_eps=float(meta.get(f"{p}.attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(meta.get(f"{p}.rope.freq_base", 10000.0)),
            rope_scaling=scaling,
            max_position_embeddings=int(meta.get(f"{p}.context_length", 4096)),
            tie_word_embeddings="output.weight" not in names,
            # Where the architecture leaves a bias open, the file's tensors say (as HF's attention_bias).
            **arch.biases("blk.0.attn_q.bias" in names, "blk.0.ffn_up.bias" in names),
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
            architecture=arch.name,
        )
    except KeyError as exc:
        raise ModelLoadError(f"GGUF metadata lacks {exc.args[0]!r}") from None


def _field_value(field):
    try:
        return field.contents()
    except Exception:  # unusual field types are metadata we do not need
        return None


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _BLOCK.match(gguf_name)
    if match and match.group(2) in _BLOCK_NAMES:
        return f"model.layers.{match.group(1)}.{_BLOCK_NAMES[match.group(2)]}.{match.group(3)}"
    return None  # e.g. rope_freqs: derived from metadata instead


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's interleaved-RoPE row order: back to HF's rotate-half order."""
    rows = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(n_head, rows // n_head // 2, 2, *rest).transpose(1, 2).reshape(rows, *rest).contiguous()


def _token(tokens: list[str], idx) -> str | None:
    return tokens[int(idx)] if idx is not None and 0 <= int(idx) < len(tokens) else None
