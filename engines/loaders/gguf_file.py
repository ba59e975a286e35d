"""Read a llama.cpp GGUF file into Hugging Face layout: config, fp32 tensors, tokenizer.

Quantized blocks (Q4_1, Q8_0, ...) are dequantized with `gguf.quants`, and the Q/K rows,
permuted by llama.cpp for its interleaved RoPE, are put back in rotate-half order.
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
from engines.loaders.gguf_tokenizer import build_gguf_tokenizer
from engines.model_config import ModelConfig, RopeScaling

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


def read_gguf(path: Path, progress: bool = True) -> GGUFContents:
    import gguf  # heavy import, only needed on a cache miss

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # the gguf package raises bare ValueError/struct errors
        raise ModelLoadError(f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc})") from None
    meta = {name: _field_value(field) for name, field in reader.fields.items()}
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ModelLoadError(f"{path}: GGUF architecture {arch!r} is not supported (expected 'llama')")
    config = _config(meta, reader)
    tensors = {}
    for t in tqdm(reader.tensors, desc="dequantizing GGUF", unit="tensor", disable=not progress, leave=False):
        name = _hf_name(t.name)
        if name is None:
            continue
        try:
            array = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise ModelLoadError(f"{path}: tensor {t.name} uses unsupported type {t.tensor_type.name}") from None
        weight = torch.from_numpy(np.array(array, dtype=np.float32, copy=True))
        if name.endswith("q_proj.weight"):
            weight = _unpermute(weight, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            weight = _unpermute(weight, config.num_key_value_heads)
        tensors[name] = weight
    tokenizer = build_gguf_tokenizer(
        meta.get("tokenizer.ggml.model", "gpt2"),
        meta.get("tokenizer.ggml.pre", "default"),
        meta["tokenizer.ggml.tokens"],
        meta.get("tokenizer.ggml.token_type") or [1] * len(meta["tokenizer.ggml.tokens"]),
        meta.get("tokenizer.ggml.merges") or [],
    )
    tokens = meta["tokenizer.ggml.tokens"]
    tok_cfg = {
        "chat_template": meta.get("tokenizer.chat_template"),
        "bos_token": _token(tokens, meta.get("tokenizer.ggml.bos_token_id")),
        "eos_token": _token(tokens, meta.get("tokenizer.ggml.eos_token_id")),
        "pad_token": _token(tokens, meta.get("tokenizer.ggml.padding_token_id")),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
    }
    return GGUFContents(config, tensors, tokenizer.to_str(), tok_cfg)


def _config(meta: dict[str, Any], reader) -> ModelConfig:
    try:
        heads = int(meta["llama.attention.head_count"])
        hidden = int(meta["llama.embedding_length"])
        rope_type = meta.get("llama.rope.scaling.type", "none")
        scaling = RopeScaling()
        if rope_type == "linear":
            scaling = RopeScaling(rope_type="linear", factor=float(meta["llama.rope.scaling.factor"]))
        names = {t.name for t in reader.tensors}
        return ModelConfig(
            vocab_size=int(meta.get("llama.vocab_size") or len(meta["tokenizer.ggml.tokens"])),
            hidden_size=hidden,
            intermediate_size=int(meta["llama.feed_forward_length"]),
            num_hidden_layers=int(meta["llama.block_count"]),
            num_attention_heads=heads,
            num_key_value_heads=int(meta.get("llama.attention.head_count_kv", heads)),
            head_dim=int(meta.get("llama.rope.dimension_count", hidden // heads)),
            rms_norm_eps=float(meta.get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
            rope_scaling=scaling,
            max_position_embeddings=int(meta.get("llama.context_length", 4096)),
            tie_word_embeddings="output.weight" not in names,
            attention_bias="blk.0.attn_q.bias" in names,
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
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
