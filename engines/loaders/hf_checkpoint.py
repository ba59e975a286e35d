"""Read a Hugging Face checkpoint directory: config.json, safetensors (sharded or not),
tokenizer.json, tokenizer_config.json and generation_config.json (the ids generation ends at,
which may be more than config.json's EOS: Qwen2.5's instruct models end at <|im_end|> or
<|endoftext|>)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from engines.errors import ModelLoadError
from engines.model_config import ModelConfig

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
GENERATION_CONFIG = "generation_config.json"


@dataclass
class HFCheckpoint:
    path: Path
    config: ModelConfig
    raw_config: dict[str, Any]
    tokenizer_json: Path
    tokenizer_config: dict[str, Any]
    end_of_generation_ids: list[int]       # config.json's EOS and generation_config.json's

    def load_tensors(self) -> dict[str, torch.Tensor]:
        return load_safetensors(self.path)


def open_hf_checkpoint(path: Path) -> HFCheckpoint:
    if not path.is_dir():
        raise ModelLoadError(f"model directory not found: {path}")
    raw = _read_json(path / "config.json")
    tokenizer_json = path / "tokenizer.json"
    if not tokenizer_json.is_file():
        raise ModelLoadError(f"{path} has no tokenizer.json")
    tok_cfg_path = path / "tokenizer_config.json"
    tok_cfg = _read_json(tok_cfg_path) if tok_cfg_path.is_file() else {}
    template_file = path / "chat_template.jinja"  # transformers >= 4.43 may store it apart
    if not tok_cfg.get("chat_template") and template_file.is_file():
        tok_cfg["chat_template"] = template_file.read_text()
    generation = _read_json(path / GENERATION_CONFIG) if (path / GENERATION_CONFIG).is_file() else {}
    ends = sorted({*_ids(raw.get("eos_token_id")), *_ids(generation.get("eos_token_id"))})
    return HFCheckpoint(path, ModelConfig.from_hf(raw), raw, tokenizer_json, tok_cfg, ends)


def _ids(value) -> list[int]:
    """An EOS field: one id, a list of them, or nothing."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [i for i in value if isinstance(i, int) and not isinstance(i, bool)]
    return []


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    index = path / INDEX_NAME
    if index.is_file():
        shards = sorted(set(_read_json(index).get("weight_map", {}).values()))
        if not shards:
            raise ModelLoadError(f"{index} has an empty weight_map")
    elif (path / SINGLE_NAME).is_file():
        shards = [SINGLE_NAME]
    else:
        raise ModelLoadError(f"{path} has no {SINGLE_NAME} or {INDEX_NAME}")
    tensors: dict[str, torch.Tensor] = {}
    for shard in shards:
        file = path / shard
        if not file.is_file():
            raise ModelLoadError(f"shard {shard} listed in the index is missing from {path}")
        try:
            tensors.update(load_file(str(file)))
        except (SafetensorError, OSError) as exc:
            raise ModelLoadError(f"{file} is not a readable safetensors file ({exc})") from None
    return tensors


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"{path} not found") from None
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
