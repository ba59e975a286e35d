"""Shared fixtures: the real model (ours and the transformers reference) and tiny models."""

from __future__ import annotations

# The OpenMP wait policy `tiergate` runs with, set before torch loads OpenMP: the tests run
# servers, clients and engines in one process on shared cores.
import gateway.cli.omp_wait_policy  # noqa: F401,I001

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


# Qwen2.5-Coder-0.5B-Instruct (architecture qwen2), the second bundled model, and its references.

@pytest.fixture(scope="session")
def qwen_fp32():
    from engines.loaded_model import load_model

    return load_model("qwen", "float32")


@pytest.fixture(scope="session")
def qwen_gguf():
    from engines.loaders.bundled_models import bundled_gguf_path, bundled_model
    from engines.loaders.gguf_cache import default_cache_root

    return bundled_gguf_path(bundled_model("qwen"), default_cache_root())


@pytest.fixture(scope="session")
def qwen_hf_reference(qwen_gguf):
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(
        qwen_gguf.parent, gguf_file=qwen_gguf.name, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="session")
def qwen_hf_tokenizer(qwen_gguf):
    import transformers
    return transformers.AutoTokenizer.from_pretrained(qwen_gguf.parent, gguf_file=qwen_gguf.name)
