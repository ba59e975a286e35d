"""Load a model by name or path into a ready bundle: weights, tokenizer, chat template."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engines.chat_template import ChatTemplate
from engines.errors import ModelLoadError
from engines.loaders.default_model import default_gguf_path
from engines.loaders.gguf_cache import materialize_gguf
from engines.loaders.hf_awq import awq_group_size, install_awq_linears
from engines.loaders.hf_checkpoint import open_hf_checkpoint
from engines.loaders.hf_fp8 import fp8_checkpoint_method, install_fp8_linears
from engines.model import LlamaForCausalLM
from engines.model.weights import load_hf_state_dict
from engines.model_config import ModelConfig
from engines.quantization.artifact import is_quantized_dir, load_artifact_into
from engines.tokenizer import TextTokenizer

log = logging.getLogger(__name__)

DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}


@dataclass
class LoadedModel:
    name: str
    path: Path
    config: ModelConfig
    model: LlamaForCausalLM
    tokenizer: TextTokenizer
    chat_template: ChatTemplate
    quantization: str | None = None   # e.g. "int4-awq-g128", part of the engine's cache identity

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise ModelLoadError(f"unknown dtype {name!r}; choose one of {sorted(DTYPES)}") from None


def resolve_checkpoint_dir(source: str | Path | None, cache_root: Path | None = None) -> Path:
    """None -> the bundled default GGUF; a .gguf file -> its cached conversion; else an HF dir."""
    if source is None or str(source) == "default":
        return materialize_gguf(default_gguf_path(), cache_root)
    path = Path(source).expanduser()
    if path.suffix == ".gguf" or path.is_file():
        return materialize_gguf(path, cache_root)
    if not path.exists():
        raise ModelLoadError(f"model path not found: {path}")
    return path


def load_model(
    source: str | Path | None = None,
    dtype: str | torch.dtype = "float32",
    cache_root: Path | None = None,
) -> LoadedModel:
    started = time.perf_counter()
    torch_dtype = parse_dtype(dtype)
    ckpt = open_hf_checkpoint(resolve_checkpoint_dir(source, cache_root))
    tokenizer = TextTokenizer.from_file(ckpt.tokenizer_json, ckpt.tokenizer_config, ckpt.config.eos_token_id)
    template = ChatTemplate(ckpt.tokenizer_config.get("chat_template"), tokenizer.bos_token, tokenizer.eos_token)
    model = LlamaForCausalLM(ckpt.config, torch_dtype)
    quantization = None
    if is_quantized_dir(ckpt.path):
        qconfig = load_artifact_into(model, ckpt.path)
        quantization = f"{qconfig['method']}-g{qconfig['group_size']}"
    else:
        tensors = ckpt.load_tensors()
        awq_group = awq_group_size(ckpt.raw_config)
        fp8_method = fp8_checkpoint_method(ckpt.raw_config)
        if awq_group is not None:
            install_awq_linears(model, tensors, awq_group)
            quantization = f"awq-checkpoint-g{awq_group}"
        elif fp8_method is not None:
            tensors = install_fp8_linears(model, tensors)
            quantization = f"fp8-checkpoint-{fp8_method}"
        load_hf_state_dict(model, tensors)
    model.eval()
    model.pack_weights()
    log.info("loaded %s (%s%s) in %.1fs", ckpt.path.name, torch_dtype,
             f", {quantization}" if quantization else "", time.perf_counter() - started)
    return LoadedModel(str(source or "default"), ckpt.path, ckpt.config, model, tokenizer, template, quantization)
