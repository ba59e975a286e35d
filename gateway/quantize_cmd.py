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
from gateway.eval.calibration import calibration_sequences

log = logging.getLogger(__name__)

METHODS = ("int8", "int4-rtn", "int4-awq", "fp8")


def quantize_to_dir(source: str, method: str, group_size: int, out_dir: Path) -> Path:
    """Quantize `source` (bf16 activations) and write a loadable artifact into `out_dir`."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {list(METHODS)}")
    loaded = load_model(source, "bfloat16")
    extra = {"source": str(loaded.path)}
    if method == "int4-awq":
        calib = calibration_sequences(loaded.tokenizer, loaded.chat_template)
        awq_quantize(loaded.model, calib, group_size)
        extra["calibration"] = f"{len(calib)} ShareGPT records from 2,000-6,000"
    else:
        quantize_model(loaded.model, method, group_size)
    save_artifact(loaded.model, loaded.path, out_dir, method, group_size, extra)
    return out_dir


def ensure_quantized(source: str, method: str, group_size: int, cache_root: Path | None = None) -> Path:
    """The cached artifact for (source, method, group), built once on first use."""
    src_dir = resolve_checkpoint_dir(source, cache_root)
    key = hashlib.sha256(f"{src_dir.resolve()}|{method}|{group_size}".encode()).hexdigest()[:12]
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
