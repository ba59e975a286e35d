"""Load a model by name or path into a ready bundle: weights, tokenizer, chat template."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from engines.chat_template import ChatTemplate
from engines.errors import ModelLoadError
from engines.loaders.bundled_models import bundled_gguf_path, bundled_model
from engines.loaders.gguf_cache import default_cache_root, materialize_gguf
from engines.loaders.hf_awq import awq_group_size, install_awq_linears
from engines.loaders.hf_checkpoint import open_hf_checkpoint
from engines.loaders.hf_fp8 import fp8_checkpoint_method, install_fp8_linears
from engines.model import LlamaForCausalLM
from engines.model.fused_decoder import attach_fused_decoder
from engines.model.weights import load_hf_state_dict
from engines.model_config import ModelConfig
from engines.quantization.artifact import is_quantized_dir, load_artifact_into
from engines.quantization.dense_prefill import attach_dense_prefill, block_linears, measure_dense_rows
from engines.quantization.int4 import Int4Linear
from engines.tokenizer import TextTokenizer
from kernels.triton.select import kernel_choice

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
    # Steps of at least this many rows use dense copies of block-quantized weights
    # (quantization/dense_prefill.py); None: every step uses the blocks.
    dense_prefill_rows: int | None = None

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def device(self) -> torch.device:
        """Where the weights live; the engine puts its KV pool and step tensors there too."""
        return self.model.embed_tokens.weight.device


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise ModelLoadError(f"unknown dtype {name!r}; choose one of {sorted(DTYPES)}") from None


def resolve_device(name: str | torch.device | None) -> torch.device:
    """`device` of a config: "cpu" (default), "cuda", "cuda:N", "auto" (CUDA when present)."""
    if isinstance(name, torch.device):
        return name
    name = (name or "cpu").strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ModelLoadError(f"unknown device {name!r}; choose cpu, cuda, cuda:N or auto") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {name!r} asked for, but this torch sees no CUDA device")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ModelLoadError(f"device {name!r} asked for, but this machine has {torch.cuda.device_count()} GPU(s)")
    return device


def move_model(model: LlamaForCausalLM, device: torch.device) -> None:
    """Move loaded (maybe quantized) weights to `device` and repack them for it. Models are
    built and quantized on the CPU (the INT4 CPU pack and AWQ search are CPU ops), then moved."""
    if model.embed_tokens.weight.device == device:
        return
    if device.type != "cpu":
        for module in model.modules():
            if isinstance(module, Int4Linear):
                module.drop_cpu_pack()        # CPU-only layout; the nibble form serves elsewhere
    model.to(device)
    model.pack_weights()                      # oneDNN packs on CPU, the plain weight elsewhere
    attach_fused_decoder(model)


def gguf_source_path(source: str | Path | None, cache_root: Path | None = None) -> Path | None:
    """The GGUF file behind `source`: a bundled model's name (None and "default" are SmolLM2;
    "qwen" ...: engines/loaders/bundled_models.py) or a .gguf path. None for a directory."""
    bundled = bundled_model(source) if source is None or isinstance(source, str) else None
    if bundled is not None:
        return bundled_gguf_path(bundled, cache_root or default_cache_root())
    path = Path(source).expanduser()
    return path if path.suffix == ".gguf" or path.is_file() else None


def resolve_checkpoint_dir(source: str | Path | None, cache_root: Path | None = None) -> Path:
    """A bundled model's name or a .gguf file -> the GGUF's cached HF-layout conversion; else an HF dir."""
    gguf_path = gguf_source_path(source, cache_root)
    if gguf_path is not None:
        return materialize_gguf(gguf_path, cache_root)
    path = Path(source).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model path not found: {path}")
    return path


def load_model(
    source: str | Path | None = None,
    dtype: str | torch.dtype = "float32",
    cache_root: Path | None = None,
    device: str | torch.device | None = "cpu",
    dense_prefill: int | Literal["auto"] | None = None,
) -> LoadedModel:
    """dense_prefill: for block-quantized weights on a CPU, steps of at least that many rows run
    on dense copies; "auto" measures whether and from how many rows that is faster here."""
    started = time.perf_counter()
    torch_dtype = parse_dtype(dtype)
    target = resolve_device(device)
    ckpt = open_hf_checkpoint(resolve_checkpoint_dir(source, cache_root))
    tokenizer = TextTokenizer.from_file(ckpt.tokenizer_json, ckpt.tokenizer_config, ckpt.end_of_generation_ids)
    tokenizer.plain_encoder()      # built with the model, not on the first chat that needs it
    template = ChatTemplate(ckpt.tokenizer_config.get("chat_template"), tokenizer.bos_token, tokenizer.eos_token)
    model = LlamaForCausalLM(ckpt.config, torch_dtype)
    quantization = None
    if is_quantized_dir(ckpt.path):
        # INT4 layers keep their nibble form where the CPU op will not serve them (Triton, CUDA).
        keep_nibbles = target.type != "cpu" or kernel_choice() == "triton"
        qconfig = load_artifact_into(model, ckpt.path, keep_portable=keep_nibbles)
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
    dense_rows = None
    if target.type == "cpu":
        model.pack_weights()
        dense_rows = dense_prefill_rows(model, torch_dtype, dense_prefill)
        attach_fused_decoder(model)
    else:
        move_model(model, target)
    log.info("loaded %s (%s%s) on %s in %.1fs", ckpt.path.name, torch_dtype,
             f", {quantization}" if quantization else "", target, time.perf_counter() - started)
    return LoadedModel(str(source or "default"), ckpt.path, ckpt.config, model, tokenizer, template, quantization,
                       dense_rows)


def dense_prefill_rows(model: LlamaForCausalLM, dtype: torch.dtype, setting: int | str | None) -> int | None:
    """Attach dense copies to a CPU model's block-quantized linears for steps of at least
    `setting` rows ("auto": measured here); returns the row count in use, None when there are none."""
    if setting is None or not block_linears(model):
        return None
    rows = setting
    if setting == "auto":
        rows, speedups = measure_dense_rows(model, dtype)
        log.info("dense prefill: %s (block / dense time at %s)",
                 f"from {rows} rows" if rows else "off",
                 ", ".join(f"{n} rows {s:.2f}x" for n, s in speedups.items()))
    if rows is None:
        return None
    attach_dense_prefill(model, dtype, int(rows))
    return int(rows)
