"""An INT4 model saved by `tiergate quantize` and loaded back runs the Triton W4A16 kernel
(its layers keep their nibble form when Triton or a non-CPU device will serve them), with
logits within tolerance of the CPU int4 op on the same artifact. Under the interpreter."""

from __future__ import annotations

import collections

import pytest
import torch

from engines.attention.contiguous import ContiguousAttention
from engines.loaded_model import load_model
from engines.quantization import quantize_model
from engines.quantization.artifact import save_artifact
from engines.quantization.int4 import Int4Linear
from kernels.triton.select import kernel_choice
from tests.tiny_models import TINY_VOCAB, write_tiny_checkpoint

TINY = {"hidden_size": 192, "intermediate_size": 256, "num_attention_heads": 6, "num_key_value_heads": 2}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    root = tmp_path_factory.mktemp("int4-artifact")
    write_tiny_checkpoint(root / "src", seed=13, **TINY)
    loaded = load_model(root / "src", "float32")
    quantize_model(loaded.model, "int4-rtn", 64, progress=False)
    save_artifact(loaded.model, loaded.path, root / "q", "int4-rtn", 64)
    return root / "q"


def _logits(path):
    model = load_model(path, "float32").model
    ids = torch.randint(3, TINY_VOCAB, (20,), generator=torch.Generator().manual_seed(2))
    attn = ContiguousAttention(model.config, ids.numel(), model.dtype)
    attn.begin_step(0, ids.numel())
    return model, model.compute_logits(model(ids, torch.arange(ids.numel()), attn))


def test_artifact_int4_layers_run_the_triton_gemm(artifact, monkeypatch):
    cpu_model, cpu = _logits(artifact)
    layers = [m for m in cpu_model.modules() if isinstance(m, Int4Linear)]
    assert layers and all(m.portable is None for m in layers)     # the CPU op serves: no second copy
    from kernels.triton import gemm_weight_only

    calls = collections.Counter()
    real = gemm_weight_only.w4a16_linear
    monkeypatch.setattr(gemm_weight_only, "w4a16_linear", lambda *a, **k: calls.update(["w4a16"]) or real(*a, **k))
    monkeypatch.setenv("TIERGATE_KERNELS", "triton")
    kernel_choice.cache_clear()
    try:
        triton_model, triton_logits = _logits(artifact)
    finally:
        kernel_choice.cache_clear()
    assert all(m.portable is not None for m in triton_model.modules() if isinstance(m, Int4Linear))
    assert calls["w4a16"] == 2 * 4                          # 2 layers x (qkv, o, gate_up, down)
    # The CPU op rounds activations to bf16; a wrong kernel or layout is off by ~1.
    assert (triton_logits - cpu).abs().max() < 1e-2


def test_artifact_layer_with_nibbles_equals_the_torch_op(artifact):
    """One artifact layer: the Triton GEMM over the kept nibbles equals the torch reference."""
    from engines.model import LlamaForCausalLM
    from engines.model_config import ModelConfig
    from engines.quantization.artifact import load_artifact_into
    from kernels.reference_gemm import w4a16_linear_ref
    from kernels.triton.gemm_weight_only import w4a16_linear

    model = LlamaForCausalLM(ModelConfig.from_hf(_config(artifact)), torch.float32)
    load_artifact_into(model, artifact, keep_portable=True)
    layer = model.layers[0].mlp.down_proj
    p = layer.portable
    x = torch.randn(5, layer.in_features, generator=torch.Generator().manual_seed(0))
    want = w4a16_linear_ref(x, p["q"], p["scales"], p["zeros"], layer.group_size, layer.bias)
    got = w4a16_linear(x, p["q"], p["scales"], p["zeros"], layer.group_size, layer.bias)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def _config(path) -> dict:
    import json

    return json.loads((path / "config.json").read_text())
