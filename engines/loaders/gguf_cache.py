"""Convert a GGUF file once into an HF-layout directory under a cache dir.

Parsing and dequantizing the GGUF and building the tokenizer take seconds; the cached
safetensors copy is memory-mapped on later starts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

from engines.errors import ModelLoadError
from engines.loaders.gguf_file import read_gguf
from engines.loaders.hf_checkpoint import GENERATION_CONFIG

log = logging.getLogger(__name__)

# Bump when the conversion changes, so stale caches are not reused.
CONVERTER_VERSION = 2


def default_cache_root() -> Path:
    env = os.environ.get("TIERGATE_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tiergate"


def cache_key(gguf_path: Path) -> str:
    stat = gguf_path.stat()
    ident = f"{gguf_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|v{CONVERTER_VERSION}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def converted_from(checkpoint_dir: Path) -> Path | None:
    """The GGUF file a cached conversion was made from (its safetensors metadata records it),
    None for any other directory or when that file is gone."""
    file = checkpoint_dir / "model.safetensors"
    if not file.is_file():
        return None
    try:
        with safe_open(str(file), "pt") as handle:
            source = (handle.metadata() or {}).get("source")
    except Exception:  # noqa: BLE001 - an unreadable file is "not a conversion" here; loading reports it
        return None
    return Path(source) if source and Path(source).is_file() else None


def materialize_gguf(gguf_path: Path, cache_root: Path | None = None, progress: bool = True) -> Path:
    """Return an HF-layout directory for `gguf_path`, converting it on the first call."""
    if not gguf_path.is_file():
        raise ModelLoadError(f"model file not found: {gguf_path}")
    root = cache_root or default_cache_root()
    target = root / f"{gguf_path.stem}-{cache_key(gguf_path)}"
    if (target / "model.safetensors").is_file():
        return target
    log.info("converting %s into %s (first start only)", gguf_path, target)
    contents = read_gguf(gguf_path, progress=progress)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
    try:
        (tmp / "config.json").write_text(json.dumps(contents.config.to_hf(), indent=2))
        (tmp / "tokenizer.json").write_text(contents.tokenizer_json)
        (tmp / "tokenizer_config.json").write_text(json.dumps(contents.tokenizer_config, indent=2))
        (tmp / GENERATION_CONFIG).write_text(json.dumps(contents.generation_config, indent=2))
        save_file(contents.tensors, str(tmp / "model.safetensors"), metadata={"source": str(gguf_path)})
        try:
            tmp.rename(target)  # atomic: a concurrent start either sees all or nothing
        except OSError:
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
