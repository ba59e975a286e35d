"""`tiergate quantize`, and the cached artifacts a tier asks for by name in its YAML."""

from __future__ import annotations

import hashlib
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
# GPTQ fits each layer to its calibration inputs: with 16 x 256 tokens it over-fits them (its error on
# other text was ~3x its error on the calibration text), so it reads more text than AWQ.
GPTQ_CALIBRATION = {"n": 64, "max_tokens": 512}
GPTQ_OPTIONS = {"act_order": True, "damp": 0.1}


def quantize_loaded(loaded, method: str, group_size: int) -> dict:
    """Quantize a loaded model in place; returns what the artifact's config records about it."""
    info = {"algorithm_version": ALGORITHM_VERSIONS[method]}
    if method == "int4-awq":
        calib = calibration_sequences(loaded.tokenizer, loaded.chat_template)
        awq_quantize(loaded.model, calib, group_size)
        info["calibration"] = f"{len(calib)} ShareGPT records from 2,000-6,000, <= 256 tokens"
    elif method == "int4-gptq":
        calib = calibration_sequences(loaded.tokenizer, loaded.chat_template, **GPTQ_CALIBRATION)
        gptq_quantize_model(loaded.model, calib, group_size, **GPTQ_OPTIONS)
        info["calibration"] = f"{len(calib)} ShareGPT records from 2,000-6,000, <= 512 tokens"
        info["gptq"] = {**GPTQ_OPTIONS, "sequential": False, "clip_search": True}
    else:
        quantize_model(loaded.model, method, group_size)
    return info


def quantize_to_dir(source: str, method: str, group_size: int, out_dir: Path) -> Path:
    """Quantize `source` (bf16 activations) and write a loadable artifact into `out_dir`."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {list(METHODS)}")
    loaded = load_model(source, "bfloat16")
    extra = {"source": str(loaded.path), **quantize_loaded(loaded, method, group_size)}
    save_artifact(loaded.model, loaded.path, out_dir, method, group_size, extra)
    return out_dir


def ensure_quantized(source: str, method: str, group_size: int, cache_root: Path | None = None) -> Path:
    """The cached artifact for (source, method, group), built once on first use."""
    src_dir = resolve_checkpoint_dir(source, cache_root)
    version = ALGORITHM_VERSIONS.get(method, 1)
    key = hashlib.sha256(f"{src_dir.resolve()}|{method}|{group_size}|v{version}".encode()).hexdigest()[:12]
    target = (cache_root or default_cache_root()) / "quantized" / f"{src_dir.name}-{method}-g{group_size}-{key}"
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
