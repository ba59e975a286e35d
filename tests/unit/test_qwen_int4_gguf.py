"""int4-gguf: Q4_K tensors load into our INT4 g32 layers exactly as the GGUF stores them (no
second rounding), in tiny GGUF files written here (qwen2, and llama whose Q/K rows llama.cpp
permutes); the other linears are quantized by the rest method; the mixed artifact round-trips."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from tokenizers import pre_tokenizers

from engines.attention.contiguous import ContiguousAttention
from engines.loaded_model import load_model
from engines.quantization.artifact_cache import ensure_quantized
from engines.quantization.gguf_int4 import install_gguf_int4, q4_1_groups, q4k_groups
from engines.quantization.int4 import Int4Linear, dequantize_int4, unpack_nibbles
from engines.quantization.int8 import Int8Linear

Q4K = gguf.GGMLQuantizationType.Q4_K
_ULPS = 4 * torch.finfo(torch.float32).eps


def _q4k_blocks(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random but valid Q4_K data: every byte pattern is a block once d and dmin are finite."""
    n = rows * cols // 256
    blocks = rng.integers(0, 256, size=(n, 144), dtype=np.uint8)
    blocks[:, 0:2] = (np.abs(rng.normal(size=(n, 1))) * 2e-3).astype(np.float16).view(np.uint8)
    blocks[:, 2:4] = (np.abs(rng.normal(size=(n, 1))) * 2e-3).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, cols // 256 * 144)


def test_q4k_decoding_equals_gguf_dequantize():
    raw = _q4k_blocks(16, 512, np.random.default_rng(0))
    groups = q4k_groups(raw, 16, 512)
    expected = torch.from_numpy(np.asarray(gguf.quants.dequantize(raw, Q4K), dtype=np.float32))
    assert groups.q.min() >= 0 and groups.q.max() <= 15
    # d*sc*q - dmin*m restated as (q - 8) * scale + zero: equal up to fp32 rounding, no second rounding of q
    assert (groups.dequantized() - expected).abs().max() <= _ULPS * expected.abs().max()


def test_q4_1_decoding_equals_gguf_dequantize():
    rng = np.random.default_rng(1)
    rows, cols = 8, 128
    blocks = rng.integers(0, 256, size=(rows * cols // 32, 20), dtype=np.uint8)
    blocks[:, 0:2] = (np.abs(rng.normal(size=(len(blocks), 1))) * 2e-3).astype(np.float16).view(np.uint8)
    blocks[:, 2:4] = (rng.normal(size=(len(blocks), 1)) * 2e-2).astype(np.float16).view(np.uint8)
    raw = blocks.reshape(rows, cols // 32 * 20)
    groups = q4_1_groups(raw, rows, cols)
    expected = torch.from_numpy(np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_1),
                                           dtype=np.float32))
    assert groups.q.min() >= 0 and groups.q.max() <= 15 and groups.q.float().std() > 0
    assert (groups.dequantized() - expected).abs().max() <= _ULPS * expected.abs().max()


# arch -> (hidden, heads, kv heads, which tensors of each block are Q4_K)
ARCHS = {"qwen2": (64, 4, 2, ("ffn_down",)), "llama": (256, 4, 2, ("attn_q", "attn_k", "attn_v", "ffn_down"))}
INTERMEDIATE, LAYERS, VOCAB_BYTES = 256, 2, 256


def _write_tiny_gguf(path, arch: str, seed: int = 0):
    hidden, heads, kv, q4k = ARCHS[arch]
    head_dim = hidden // heads
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(INTERMEDIATE)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    tokens = sorted(pre_tokenizers.ByteLevel.alphabet()) + ["<|im_end|>"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * VOCAB_BYTES + [3])
    w.add_token_merges([])
    w.add_eos_token_id(VOCAB_BYTES)

    def dense(*shape, scale=0.05):
        return (rng.normal(size=shape) * scale).astype(np.float32)

    w.add_tensor("token_embd.weight", dense(len(tokens), hidden, scale=0.5))
    w.add_tensor("output.weight", dense(len(tokens), hidden))
    w.add_tensor("output_norm.weight", 1 + dense(hidden, scale=0.1))
    shapes = {"attn_q": (heads * head_dim, hidden), "attn_k": (kv * head_dim, hidden),
              "attn_v": (kv * head_dim, hidden), "attn_output": (hidden, heads * head_dim),
              "ffn_gate": (INTERMEDIATE, hidden), "ffn_up": (INTERMEDIATE, hidden), "ffn_down": (hidden, INTERMEDIATE)}
    for i in range(LAYERS):
        w.add_tensor(f"blk.{i}.attn_norm.weight", 1 + dense(hidden, scale=0.1))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", 1 + dense(hidden, scale=0.1))
        for name, (rows, cols) in shapes.items():
            if name in q4k:
                w.add_tensor(f"blk.{i}.{name}.weight", _q4k_blocks(rows, cols, rng), raw_dtype=Q4K)
            else:
                w.add_tensor(f"blk.{i}.{name}.weight", dense(rows, cols))
        if arch == "qwen2":
            for name in ("attn_q", "attn_k", "attn_v"):
                w.add_tensor(f"blk.{i}.{name}.bias", dense(shapes[name][0], scale=0.3))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _logits(model, ids):
    attn = ContiguousAttention(model.config, len(ids), model.dtype)
    attn.begin_step(0, len(ids))
    return model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)), attn))


@pytest.fixture
def cache(tmp_path):
    """The conversions' cache root (passed explicitly: TIERGATE_CACHE_DIR would also move the C++
    kernels' build, and rebuild them)."""
    return tmp_path / "cache"


@pytest.mark.parametrize("arch", list(ARCHS))
def test_q4k_linears_hold_the_files_weights_exactly(tmp_path, cache, arch):
    path = _write_tiny_gguf(tmp_path / f"tiny-{arch}.gguf", arch)
    loaded = load_model(path, "float32", cache_root=cache)
    assert loaded.config.architecture == arch
    dense = {name: m.weight.detach().clone() for name, m in loaded.model.named_modules() if hasattr(m, "weight")}
    counts = install_gguf_int4(loaded.model, path, "int8")
    expected_q4k = {"qwen2": 1, "llama": 2}[arch] * LAYERS        # down; llama: fused q/k/v and down
    assert counts == {"as_stored": expected_q4k, "int8": 4 * LAYERS - expected_q4k}
    seen = 0
    for name, module in loaded.model.named_modules():
        if isinstance(module, Int4Linear):
            p = module.portable
            w = dequantize_int4(unpack_nibbles(p["q"]), p["scales"], p["zeros"], 32)
            # The file's values (Q/K rows unpermuted too), up to fp32 rounding of (q - 8) * s + z.
            assert (w - dense[name]).abs().max() <= _ULPS * dense[name].abs().max(), name
            seen += 1
        elif name.startswith("layers.") and name.endswith(("proj", "gate_up_proj")):
            assert isinstance(module, Int8Linear), name
    assert seen == expected_q4k


def test_mixed_artifact_round_trips_and_stays_close_to_bf16(tmp_path, cache):
    """Through the cache a tier's `quantization: int4-gguf` uses: built from the cached conversion
    (which records its GGUF), with the file's group size whatever the tier asks."""
    path = _write_tiny_gguf(tmp_path / "tiny.gguf", "qwen2", seed=1)
    out = ensure_quantized(str(path), "int4-gguf", 128, cache_root=cache)
    artifact = load_model(out, "bfloat16")
    assert artifact.quantization == "int4-gguf-g32"
    kinds = {type(m) for m in artifact.model.modules()}
    assert Int4Linear in kinds and Int8Linear in kinds
    in_memory = load_model(path, "bfloat16", cache_root=cache)
    install_gguf_int4(in_memory.model, path)
    ids = [5, 17, 99, 3, 200, 42, 7, 7, 64]
    got = _logits(artifact.model, ids)
    assert torch.equal(got, _logits(in_memory.model, ids))
    reference = _logits(load_model(path, "bfloat16", cache_root=cache).model, ids)
    assert (got - reference).abs().max() < 0.05 * reference.abs().max()


def test_int4_gguf_refuses_a_source_without_a_gguf(tmp_path, cache):
    from tests.tiny_models import write_tiny_checkpoint

    write_tiny_checkpoint(tmp_path / "hf")
    with pytest.raises(ValueError, match="GGUF"):
        ensure_quantized(str(tmp_path / "hf"), "int4-gguf", 32, cache_root=cache)
