"""Quantized checkpoints on disk: what `tiergate quantize` writes and the engine loads.

A directory with the source model's config.json and tokenizer files, a
quantization_config.json (method, group size, quantized module names) and one
model.safetensors holding every tensor under our own module names: quantized linears in a
portable form (int8 + scales; int4 nibbles + scales + zeros; fp8 + scales), everything else
(embeddings, norms — AWQ's folded scales included — biases) as is.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from engines.errors import ModelLoadError
from engines.model import LlamaForCausalLM
from engines.model.layers import Linear
from engines.quantization.fp8 import Fp8Linear
from engines.quantization.int4 import Int4Linear, unpack_nibbles
from engines.quantization.int8 import Int8Linear
from engines.quantization.w4a8 import BlockQ4Linear, BlockQ8Linear
from engines.quantization.w8a8 import W8A8Linear

QCONFIG_NAME = "quantization_config.json"
FORMAT_VERSION = 1
_QUANTIZED = (Int8Linear, Int4Linear, Fp8Linear, W8A8Linear, BlockQ4Linear, BlockQ8Linear)
_KIND_OF = {Int8Linear: "int8", Int4Linear: "int4", Fp8Linear: "fp8", W8A8Linear: "w8a8", BlockQ4Linear: "q4block",
            BlockQ8Linear: "q8block"}
# A quantized output head is a module of the model with no Linear before it.
_HEAD = "quantized_head"


def is_quantized_dir(path: Path) -> bool:
    return (path / QCONFIG_NAME).is_file()


def save_artifact(model: LlamaForCausalLM, source_dir: Path, out_dir: Path, method: str, group_size: int,
                  extra: dict | None = None) -> None:
    tensors: dict[str, torch.Tensor] = {}
    modules = []
    kinds: dict[str, str] = {}     # per module: a mixed artifact (int4-gguf: INT4 and INT8) says which
    for name, module in model.named_modules():
        if isinstance(module, _QUANTIZED):
            if module.portable is None:
                raise ValueError(f"{name} was loaded from an artifact and cannot be re-saved")
            modules.append(name)
            kinds[name] = _KIND_OF[type(module)]
            for key, value in module.portable.items():
                tensors[f"{name}.{key}"] = value.contiguous()
    for name, param in model.named_parameters():
        tensors[name] = param.detach().contiguous()
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "tiergate-quantized"})
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if (source_dir / name).is_file():
            shutil.copy(source_dir / name, out_dir / name)
    qconfig = {"format_version": FORMAT_VERSION, "method": method, "group_size": group_size,
               "dtype": str(model.dtype).removeprefix("torch."), "modules": modules, **(extra or {})}
    qconfig["module_kinds"] = kinds
    (out_dir / QCONFIG_NAME).write_text(json.dumps(qconfig, indent=2))


def read_qconfig(path: Path) -> dict:
    try:
        qconfig = json.loads((path / QCONFIG_NAME).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path / QCONFIG_NAME} is unreadable ({exc})") from None
    if qconfig.get("format_version") != FORMAT_VERSION:
        raise ModelLoadError(f"{path} has quantized format {qconfig.get('format_version')}, expected {FORMAT_VERSION}")
    return qconfig


def load_artifact_into(model: LlamaForCausalLM, path: Path, keep_portable: bool = False) -> dict:
    """Replace the model's linears by the stored quantized ones and load every other tensor.
    keep_portable: INT4 layers keep their nibble form, which the Triton W4A16 kernel and any
    non-CPU device read (the CPU op reads its own packed copy, so a CPU model drops it)."""
    qconfig = read_qconfig(path)
    try:
        tensors = load_file(str(path / "model.safetensors"))
    except Exception as exc:  # noqa: BLE001 - safetensors raises several types for corrupt files
        raise ModelLoadError(f"{path / 'model.safetensors'} is not readable ({exc})") from None
    method, group = qconfig["method"], qconfig["group_size"]
    kinds = qconfig.get("module_kinds") or {}
    for name in qconfig["modules"]:
        parent_name, _, attr = name.rpartition(".")
        kind = kinds.get(name) or ("int4" if method.startswith("int4") else method)
        if name == _HEAD:
            if kind != "q8block":
                raise ModelLoadError(f"{path}: an output head of kind {kind!r} is not supported")
            model.set_quantized_head(BlockQ8Linear(tensors[f"{name}.qweight"], tensors[f"{name}.scales"], None))
            continue
        old = model.get_submodule(name)
        if not isinstance(old, Linear):
            raise ModelLoadError(f"{path}: {name} is not a linear layer of this model")
        bias = tensors.get(f"{name}.bias")
        if kind == "int8":
            new = Int8Linear(None, bias, q=tensors[f"{name}.qweight"], scales=tensors[f"{name}.scales"])
        elif kind == "int4":
            q = unpack_nibbles(tensors[f"{name}.q"])
            new = Int4Linear(None, bias, group, q, tensors[f"{name}.scales"], tensors[f"{name}.zeros"],
                             in_features=old.in_features)
            if not keep_portable:
                new.portable = None  # the CPU op serves from its own pack: no second copy
        elif kind == "w8a8":
            new = W8A8Linear(None, bias, q=tensors[f"{name}.qweight"], scales=tensors[f"{name}.scales"])
        elif kind == "q4block":
            new = BlockQ4Linear(tensors[f"{name}.nibbles"], tensors[f"{name}.scales"], tensors[f"{name}.mins"], bias)
        elif kind == "q8block":
            new = BlockQ8Linear(tensors[f"{name}.qweight"], tensors[f"{name}.scales"], bias)
        elif kind == "fp8":
            new = Fp8Linear(None, bias, q=tensors[f"{name}.qweight"], scales=tensors[f"{name}.weight_scale"])
        else:
            raise ModelLoadError(f"{path}: unknown quantization method {method!r}")
        setattr(model.get_submodule(parent_name), attr, new)
    params = dict(model.named_parameters())
    missing = [n for n in params if n not in tensors]
    if missing:
        raise ModelLoadError(f"{path} lacks tensor {missing[0]!r}")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(tensors[name].to(param.dtype))
    return qconfig
