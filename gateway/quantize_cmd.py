"""`tiergate quantize`, and the cached artifacts a tier asks for by name in its YAML."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from pathlib import Path

from engines.loaded_model import load_model, resolve_checkpoint_dir
from engines.loaders.gguf_cache import default_cache_root
from engines.quantization import quantize_model
from engines.quantization.artifact import is_quantized_dir, save_artifact
from engines.quantization.awq import awq_quantize
from engines.quantization.gptq_model import gptq_quantize_model
from gateway.eval.calibration import calibration_sequences

log = logging.getLogger(__name__)

METHODS = ("int8", "int4-rtn", "int4-awq", "int4-gptq", "fp8")
# Part of the cache key and the artifact's config: bump a method's version whenever its algorithm
# changes, so an artifact an older version built is never reused (AWQ 2: the Gram-matrix searches).
ALGORITHM_VERSIONS = {"int8": 1, "int4-rtn": 1, "int4-awq": 2, "int4-gptq": 1, "fp8": 1}
AWQ_CALIBRATION = {"n": 16, "max_tokens": 256}
# GPTQ fits each layer to its calibration inputs: with 16 x 256 tokens it over-fits them (its error on
# other text was ~3x its error on the calibration text), so it reads more text than AWQ.
GPTQ_CALIBRATION = {"n": 64, "max_tokens": 512}
GPTQ_OPTIONS = {"act_order": True, "damp": 0.1}


def method_settings(method: str) -> dict:
    """Everything besides the source and group size that decides a method's output: recorded in
    the artifact's config and hashed into its cache key, so a changed setting builds a new one."""
    settings: dict = {"algorithm_version": ALGORITHM_VERSIONS[method]}
    if method == "int4-awq":
        settings["calibration"] = {**AWQ_CALIBRATION, "records_from": "ShareGPT 2,000-6,000"}
    elif method == "int4-gptq":
        settings["calibration"] = {**GPTQ_CALIBRATION, "records_from": "ShareGPT 2,000-6,000"}
        settings["gptq"] = {**GPTQ_OPTIONS, "sequential": False, "clip_search": True}
    return settings


def quantize_loaded(loaded, method: str, group_size: int) -> dict:
    """Quantize a loaded model in place; returns what the artifact's config records about it."""
    if method == "int4-awq":
        calib = calibration_sequences(loaded.tokenizer, loaded.chat_template, **AWQ_CALIBRATION)
        awq_quantize(loaded.model, calib, group_size)
    elif method == "int4-gptq":
        calib = calibration_sequences(loaded.tokenizer, loaded.chat_template, **GPTQ_CALIBRATION)
        gptq_quantize_model(loaded.model, calib, group_size, **GPTQ_OPTIONS)
    else:
        quantize_model(loaded.model, method, group_size)
    return method_settings(method)


def quantize_to_dir(source: str, method: str, group_size: int, out_dir: Path) -> Path:
    """Quantize `source` (bf16 activations) and write a loadable artifact into `out_dir`."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {list(METHODS)}")
    loaded = load_model(source, "bfloat16")
    extra = {"source": str(loaded.path), **quantize_loaded(loaded, method, group_size)}
    save_artifact(loaded.model, loaded.path, out_dir, method, group_size, extra)
    return out_dir


def artifact_dir(source: str, method: str, group_size: int, cache_root: Path | None = None) -> Path:
    """Where the cached artifact of (source, method, group, the method's settings) lives."""
    src_dir = resolve_checkpoint_dir(source, cache_root)
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {list(METHODS)}")
    settings = json.dumps(method_settings(method), sort_keys=True)
    key = hashlib.sha256(f"{src_dir.resolve()}|{method}|{group_size}|{settings}".encode()).hexdigest()[:12]
    return (cache_root or default_cache_root()) / "quantized" / f"{src_dir.name}-{method}-g{group_size}-{key}"


def ensure_quantized(source: str, method: str, group_size: int, cache_root: Path | None = None) -> Path:
    """The cached artifact for (source, method, group), built once on first use."""
    src_dir = resolve_checkpoint_dir(source, cache_root)
    target = artifact_dir(source, method, group_size, cache_root)
    if is_quantized_dir(target):
        return target
    log.warning("building the %s g%d artifact for %s (first start only)", method, group_size, src_dir.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    try:
        quantize_to_dir(str(src_dir), method, group_size, tmp)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
