"""The engine follows its model's device: KV pools, step tensors, sampler tensors, draft models.

No GPU here, so two stand-ins: on the CPU every tensor a step builds must sit on the model's
device (this checks the plumbing, not a device mistake: everything is on the CPU there); and
the model moved to the `meta` device, where every tensor it holds must be on meta and a
forward catches most tensors still created on the CPU (many ops mixing meta and CPU tensors
raise, though not all: F.linear(meta, cpu weight) returns meta, hence the explicit check). On meta, attention runs a stub that checks its
inputs' devices (the real attention ops read values, which meta tensors lack), so this covers
the engine's own tensors, not the kernels'.
"""

from __future__ import annotations

import pytest
import torch

from engines.attention.paged import build_step as real_build_step
from engines.engine_config import EngineConfig
from engines.errors import ModelLoadError
from engines.llm_engine import LLMEngine
from engines.loaded_model import load_model, resolve_device
from engines.model_runner import Chunk
from engines.sampler import Sampler
from engines.sampling_params import SamplingParams
from engines.sequence import Sequence
from engines.spec.config import SpeculativeConfig
from tests.tiny_models import TINY_VOCAB, write_tiny_checkpoint

META = torch.device("meta")


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-device")
    write_tiny_checkpoint(path, seed=3)
    return path


def _engine(loaded, **config) -> LLMEngine:
    return LLMEngine(loaded, EngineConfig(kv_cache_memory_bytes=2**20, block_size=16, max_num_seqs=4,
                                          max_num_batched_tokens=64, **config))


def _tensors_of(meta) -> dict[str, torch.Tensor]:
    return {name: value for name, value in vars(meta).items() if isinstance(value, torch.Tensor)}


@pytest.fixture
def step_tensors(monkeypatch) -> list[list[torch.Tensor]]:
    """Every tensor each runner forward builds for its step (indexing with a CPU index tensor
    works on any device, so these are checked one by one, not only by running the forward)."""
    steps = []

    def recording(*args, **kwargs):
        meta, extra = real_build_step(*args, **kwargs)
        steps.append(list(_tensors_of(meta).values()) + list(extra))
        return meta, extra

    monkeypatch.setattr("engines.model_runner.build_step", recording)
    return steps


@pytest.mark.parametrize("kv_dtype", [None, "int8"])
def test_every_step_tensor_is_on_the_models_device(tiny_path, kv_dtype, step_tensors):
    loaded = load_model(tiny_path, "float32")
    engine = _engine(loaded, kv_cache_dtype=kv_dtype)
    pool = engine.pool
    assert {t.device for t in (pool.k, pool.v) + (pool.scales(0) or ())} == {loaded.device}
    steps = step_tensors
    out = engine.generate([[5, 6, 7] * 7, [9, 10]], SamplingParams(max_tokens=3, temperature=0.8, seed=1))
    assert [len(o) for o in out] == [3, 3]
    assert steps and all(t.device == loaded.device for step in steps for t in step)
    assert all(len(step) == 7 for step in steps)     # slots, tables, seq_of_token, lens, ids, positions, rows


class _DeviceCheckingOps:
    """Attention ops for meta tensors: every input must be on the pool's device."""

    name = "meta-check"

    def __init__(self, device):
        self.device = device

    def begin_step(self, seq_of_token, seq_of_token_host=None):
        assert seq_of_token.device == self.device and isinstance(seq_of_token_host, list)

    def write_kv(self, k, v, k_pool, v_pool, slot_mapping, kv_scales=None):
        assert {t.device for t in (k, v, k_pool, v_pool, slot_mapping, *(kv_scales or ()))} == {self.device}

    def paged_attention(self, q, k_pool, v_pool, block_tables, seq_of_token, context_lens, scale, kv_scales=None):
        tensors = (q, k_pool, v_pool, block_tables, seq_of_token, context_lens, *(kv_scales or ()))
        assert {t.device for t in tensors} == {self.device}
        return torch.empty_like(q)


def _chunks(block_size: int) -> list[Chunk]:
    # A prefill chunk over a cached prefix, a fresh prompt and a decode, all in one step.
    return [Chunk([0, 1, 2], 20, list(range(3, 15)), 1), Chunk([3], 0, [4, 5, 6], 1), Chunk([4, 5], 17, [8], 1)]


def _held_tensors(model: torch.nn.Module):
    """Every tensor a model holds: parameters, buffers, and tensors kept as plain attributes
    (packed weights, the tied head, INT4 portable forms), which .to() would not move. A CPU
    weight would not be caught by the forward alone: F.linear(meta x, cpu w) returns meta."""
    for module in model.modules():
        yield from module.parameters(recurse=False)
        yield from module.buffers(recurse=False)
        for value in vars(module).values():
            if isinstance(value, torch.Tensor):
                yield value
            elif isinstance(getattr(value, "data", None), torch.Tensor):       # PackedWeight
                yield value.data
            elif isinstance(value, dict):
                yield from (v for v in value.values() if isinstance(v, torch.Tensor))


@pytest.mark.parametrize("kv_dtype", [None, "int8", "int4"])
def test_a_forward_on_the_meta_device_creates_no_cpu_tensor(tiny_path, kv_dtype, step_tensors):
    loaded = load_model(tiny_path, "float32", device="meta")
    assert loaded.device == META
    held = list(_held_tensors(loaded.model))
    assert held and {t.device for t in held} == {META}
    engine = _engine(loaded, kv_cache_dtype=kv_dtype)
    pool = engine.pool
    assert {t.device for t in (pool.k, pool.v) + (pool.scales(0) or ())} == {META}
    assert engine.runner.device == META
    engine.runner.attn.ops = _DeviceCheckingOps(META)
    logits = engine.runner.forward(_chunks(engine.pool.block_size))
    assert logits.device == META and logits.shape == (3, TINY_VOCAB)
    assert len(step_tensors) == 1 and all(t.device == META for t in step_tensors[0])


def test_the_self_draft_follows_the_target_onto_the_device(tiny_path):
    """INT4 self-draft: quantized on the CPU, moved with its nibbles; its pool and its forward
    (through the torch W4A16 reference off the CPU) stay on the target's device."""
    loaded = load_model(tiny_path, "float32", device="meta")
    engine = _engine(loaded, speculative=SpeculativeConfig(method="self", draft_quantization="int4-rtn",
                                                           draft_group_size=32))
    source = engine.speculator.source
    assert source.pool.k.device == META and source.runner.device == META
    int4 = [m for m in source.model.modules() if type(m).__name__ == "Int4Linear"]
    assert int4 and all(m.qweight is None and m.portable["q"].device == META for m in int4)
    engine.runner.attn.inner.ops = source.runner.attn.ops = _DeviceCheckingOps(META)
    assert engine.runner.forward(_chunks(16)).device == META       # also mirrors K/V into the draft pool
    assert source.runner.forward(_chunks(16)).device == META


def test_sampler_tensors_follow_the_logits(tiny_path):
    """Logit bias, penalties, temperature / top-k / top-p / min-p and seeded draws on meta logits.
    (Bans and allowed lists read their masked row's values, which meta tensors do not have.)"""
    logits = torch.empty(2, TINY_VOCAB, device=META)
    params = [SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, presence_penalty=0.5, seed=3,
                             repetition_penalty=1.3, logit_bias={4: 2.0}),
              SamplingParams(temperature=1.2, frequency_penalty=0.2, seed=4)]
    seqs = [Sequence(f"r{i}", [1, 2], p) for i, p in enumerate(params)]
    for s in seqs:
        s.output_ids.extend([5, 6, 5])
    sampler = Sampler(seed=0)
    adjusted = sampler.adjust(logits, seqs)
    assert adjusted.device == META
    probs = sampler.probs(adjusted, params)
    assert probs.device == META
    assert sampler.draw(probs, [s.uniform_at() for s in seqs]).device == META


def test_devices_by_name():
    assert resolve_device(None) == resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ModelLoadError, match="unknown device"):
        resolve_device("tpu9")
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="no CUDA"):
            resolve_device("cuda")


def test_tier_yaml_takes_a_device_and_defaults_to_cpu():
    from pydantic import ValidationError

    from policies.tier_config import EmbeddedTierConfig

    assert EmbeddedTierConfig().device == "cpu"
    assert EmbeddedTierConfig(device="cuda:1").device == "cuda:1"
    with pytest.raises(ValidationError, match="device"):
        EmbeddedTierConfig(device="gpu")


def test_int4_quantization_on_the_device_keeps_only_the_nibble_form(tiny_path):
    """Quantizing a model already moved off the CPU builds no CPU pack (that op is CPU-only)."""
    from engines.quantization import quantize_model
    from engines.quantization.int4 import Int4Linear

    loaded = load_model(tiny_path, "float32", device="meta")
    quantize_model(loaded.model, "int4-rtn", 32, progress=False)
    layers = [m for m in loaded.model.modules() if isinstance(m, Int4Linear)]
    assert layers and all(m.qweight is None and m.portable["q"].device == META for m in layers)
    x = torch.empty(3, layers[0].in_features, device=META)
    assert layers[0](x).shape == (3, layers[0].out_features)
