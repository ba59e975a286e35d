"""Shared fixtures: the real model (ours and the transformers reference) and tiny models."""

from __future__ import annotations

import pytest
import torch

torch.manual_seed(0)


@pytest.fixture(scope="session")
def real_fp32():
    from engines.loaded_model import load_model

    return load_model("default", "float32")


@pytest.fixture(scope="session")
def default_gguf():
    from engines.loaders.default_model import default_gguf_path

    return default_gguf_path()


@pytest.fixture(scope="session")
def hf_reference(default_gguf):
    """transformers' own GGUF loader: an independent dequantize + unpermute of the same file."""
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(
        default_gguf.parent, gguf_file=default_gguf.name, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="session")
def hf_tokenizer(default_gguf):
    import transformers
    return transformers.AutoTokenizer.from_pretrained(default_gguf.parent, gguf_file=default_gguf.name)
