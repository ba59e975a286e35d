"""The engine forced onto the Triton kernels (TIERGATE_KERNELS=triton, under the interpreter)
produces the same greedy tokens as on its CPU path, for a tiny random Llama: chunked
prefills, decodes and a prefix-cache hit in mixed steps, with fp32 and int8 KV."""

from __future__ import annotations

import collections

import pytest

from engines.engine_config import EngineConfig
from engines.llm_engine import LLMEngine
from engines.loaded_model import load_model
from engines.sampling_params import SamplingParams
from kernels.triton.select import kernel_choice
from tests.tiny_models import TINY_VOCAB, write_tiny_checkpoint

# GQA with 3 query heads per KV head (as SmolLM2), head dim 32.
TINY = {"hidden_size": 192, "intermediate_size": 256, "num_attention_heads": 6, "num_key_value_heads": 2}
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-triton")
    write_tiny_checkpoint(path, seed=11, **TINY)
    return path


def _prompts():
    import random

    rng = random.Random(5)
    shared = [rng.randrange(3, TINY_VOCAB) for _ in range(40)]
    first = [shared]                                                  # fills the prefix cache
    second = [shared[:36] + [7, 9, 11], [rng.randrange(3, TINY_VOCAB) for _ in range(70)], [4, 5, 6]]
    return first, second


def _generate(path, kv_dtype):
    loaded = load_model(path, "float32")
    engine = LLMEngine(loaded, EngineConfig(kv_cache_memory_bytes=2**20, block_size=16, max_num_seqs=4,
                                            max_num_batched_tokens=32, kv_cache_dtype=kv_dtype))
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    first, second = _prompts()
    outputs = engine.generate(first, params) + engine.generate(second, params)
    assert engine.stats.prefix_hit_tokens >= 32                       # the second round reused 2 blocks
    return engine, outputs


@pytest.fixture
def forced_triton(monkeypatch):
    """TIERGATE_KERNELS=triton for one test, counting the calls into each Triton kernel."""
    from kernels.triton import attention_ops, elementwise

    calls = collections.Counter()

    def spy(module, name):
        real = getattr(module, name)

        def counted(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        monkeypatch.setattr(module, name, counted)

    for name in ("write_kv_triton", "write_kv_quantized_triton", "launch_decode", "launch_extend"):
        spy(attention_ops, name)
    for name in ("add_rms_norm_triton", "silu_mul_triton", "apply_rope_triton"):
        spy(elementwise, name)
    monkeypatch.setenv("TIERGATE_KERNELS", "triton")
    kernel_choice.cache_clear()
    yield calls
    kernel_choice.cache_clear()          # monkeypatch restores the variable right after


@pytest.mark.parametrize("kv_dtype", [None, "int8"])
def test_engine_on_triton_kernels_gives_the_cpu_paths_greedy_tokens(tiny_path, kv_dtype, request):
    reference_engine, reference = _generate(tiny_path, kv_dtype)
    assert reference_engine.runner.attn.ops.name != "triton"
    calls = request.getfixturevalue("forced_triton")
    engine, outputs = _generate(tiny_path, kv_dtype)
    assert engine.runner.attn.ops.name == "triton"
    assert outputs == reference
    assert all(len(o) == MAX_TOKENS for o in outputs)
    store = "write_kv_quantized_triton" if kv_dtype else "write_kv_triton"
    for name in (store, "launch_decode", "launch_extend", "add_rms_norm_triton", "silu_mul_triton",
                 "apply_rope_triton"):
        assert calls[name] > 0, f"{name} never ran"


@pytest.mark.parametrize("method,tol", [("int8", 1e-2), ("int4-rtn", 1e-2), ("fp8", 0.1)])
def test_quantized_linears_run_the_triton_gemms_inside_the_model(tiny_path, method, tol, monkeypatch):
    """W8A16 / W4A16 / FP8 modules dispatch to their kernels in a real forward. Logits stay
    within `tol` of the CPU path, which rounds activations to bf16 (int8, int4) or keeps them
    unquantized (fp8, where the GPU path quantizes them per token); a wrong kernel is off by ~1."""
    import torch

    from engines.attention.contiguous import ContiguousAttention
    from engines.quantization import quantize_model
    from kernels.triton import gemm_fp8, gemm_weight_only

    ids = torch.randint(3, TINY_VOCAB, (24,), generator=torch.Generator().manual_seed(1))

    def logits():
        model = load_model(tiny_path, "float32").model
        quantize_model(model, method, 32, progress=False)
        attn = ContiguousAttention(model.config, ids.numel(), model.dtype)
        attn.begin_step(0, ids.numel())
        return model.compute_logits(model(ids, torch.arange(ids.numel()), attn))

    cpu = logits()
    calls = collections.Counter()
    for module, name in ((gemm_weight_only, "w8a16_linear"), (gemm_weight_only, "w4a16_linear"),
                         (gemm_fp8, "fp8_linear")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name, **k: calls.update([_name]) or _real(*a, **k))
    monkeypatch.setenv("TIERGATE_KERNELS", "triton")
    kernel_choice.cache_clear()
    try:
        triton_logits = logits()
    finally:
        kernel_choice.cache_clear()          # monkeypatch restores the variable at teardown
    expected = {"int8": "w8a16_linear", "int4-rtn": "w4a16_linear", "fp8": "fp8_linear"}[method]
    assert calls == {expected: 2 * 4}                      # 2 layers x (qkv, o, gate_up, down)
    assert (triton_logits - cpu).abs().max() < tol


@pytest.mark.slow          # ~30 s of interpreted GEMV launches; the other tests here cover the engine fast
def test_int4_engine_decodes_batch1_through_the_gemv_with_the_reference_paths_tokens(tiny_path, monkeypatch):
    """One sequence: prefill chunks run the W4A16 tiles, every decode step the batch-1 GEMV.
    Greedy tokens equal those of the torch reference W4A16 (the nibble form dequantized, fp32),
    which the INT4 layers take once their CPU pack is dropped."""
    from engines.quantization import quantize_model
    from engines.quantization.int4 import Int4Linear
    from kernels.triton import gemm_weight_only

    def generate():
        loaded = load_model(tiny_path, "float32")
        quantize_model(loaded.model, "int4-rtn", 32, progress=False)
        for module in loaded.model.modules():
            if isinstance(module, Int4Linear):
                module.drop_cpu_pack()
        engine = LLMEngine(loaded, EngineConfig(kv_cache_memory_bytes=2**20, block_size=16, max_num_seqs=1,
                                                max_num_batched_tokens=32))
        return engine.generate([_prompts()[1][1]], SamplingParams(max_tokens=MAX_TOKENS, temperature=0,
                                                                   ignore_eos=True))

    reference = generate()
    gemv_rows = collections.Counter()
    real = gemm_weight_only.launch_w4a16_gemv
    monkeypatch.setattr(gemm_weight_only, "launch_w4a16_gemv",
                        lambda x, *a: gemv_rows.update([x.shape[0]]) or real(x, *a))
    monkeypatch.setenv("TIERGATE_KERNELS", "triton")
    kernel_choice.cache_clear()
    try:
        outputs = generate()
    finally:
        kernel_choice.cache_clear()
    assert outputs == reference and len(outputs[0]) == MAX_TOKENS
    assert gemv_rows == {1: (MAX_TOKENS - 1) * 2 * 4}     # each decode step: 2 layers x (qkv, o, gate_up, down)
