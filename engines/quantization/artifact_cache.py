"""The cached quantized artifacts a tier asks for by method name in its YAML: built once, then loaded."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from pathlib import Path

from engines.loaded_model import resolve_checkpoint_dir
from engines.loaders.gguf_cache import default_cache_root
from engines.quantization.artifact import is_quantized_dir
from engines.quantization.build import method_settings, quantize_to_dir
from engines.quantization.calibration import CalibrationSource
from engines.quantization.methods import effective_group_size

log = logging.getLogger(__name__)


def artifact_dir(source: str, method: str, group_size: int, cache_root: Path | None = None,
                 calibration: CalibrationSource | None = None) -> Path:
    """Where the cached artifact of (source, method, group, the method's settings) lives."""
    src_dir = resolve_checkpoint_dir(source, cache_root)
    group_size = effective_group_size(method, group_size)
    settings = json.dumps(method_settings(method, calibration), sort_keys=True)
    key = hashlib.sha256(f"{src_dir.resolve()}|{method}|{group_size}|{settings}".encode()).hexdigest()[:12]
    return (cache_root or default_cache_root()) / "quantized" / f"{src_dir.name}-{method}-g{group_size}-{key}"


def ensure_quantized(source: str, method: str, group_size: int, cache_root: Path | None = None,
                     calibration: CalibrationSource | None = None) -> Path:
    """The cached artifact for (source, method, group), built once on first use."""
    src_dir = resolve_checkpoint_dir(source, cache_root)
    target = artifact_dir(source, method, group_size, cache_root, calibration)
    if is_quantized_dir(target):
        return target
    log.warning("building the %s g%d artifact for %s (first start only)", method, group_size, src_dir.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    try:
        quantize_to_dir(str(src_dir), method, group_size, tmp, calibration)
        try:
            tmp.rename(target)    # atomic: a concurrent start sees all of it or nothing
        except OSError:
            if not is_quantized_dir(target):   # else another process (a second gateway) built it first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
