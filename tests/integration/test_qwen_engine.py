"""Qwen2.5-Coder-0.5B in the batching engine beyond what tests/integration/test_engine.py runs on
both bundled models (batched == alone, prefix-cache hits): ngram speculation keeps the greedy
tokens (fp32), the C++ kernels serve its 14/2-head attention over an INT8 KV pool, and the
quantized weights (int8, INT4 as the GGUF stores it) with INT8 KV still answer sensibly."""

from __future__ import annotations

import pytest
import torch

from engines.loaded_model import load_model
from engines.quantization import quantize_model
from engines.quantization.build import quantize_loaded
from engines.quantization.int4 import Int4Linear
from engines.sampling_params import SamplingParams
from engines.spec.config import SpeculativeConfig
from tests.integration.test_engine import MAX_TOKENS, _assert_no_leak, _engine, _prompts

pytestmark = pytest.mark.slow

CHECKS = {  # prompt -> what a sensible greedy answer contains
    "What is the capital of France?": "Paris",
    "Write a Python function that returns the square of x.": "def ",
    "What is 12 times 12?": "144",
}


def _chat(loaded, text: str) -> list[int]:
    return loaded.tokenizer.encode(loaded.chat_template.render([{"role": "user", "content": text}]))


@pytest.fixture(scope="module")
def plain(qwen_fp32):
    return _engine(qwen_fp32).generate(_prompts(qwen_fp32), SamplingParams(max_tokens=MAX_TOKENS, temperature=0))


def test_ngram_speculation_gives_the_plain_greedy_tokens(qwen_fp32, plain):
    spec = SpeculativeConfig(method="ngram", num_tokens=4, max_batch=32)
    engine = _engine(qwen_fp32, speculative=spec)
    assert engine.generate(_prompts(qwen_fp32), SamplingParams(max_tokens=MAX_TOKENS, temperature=0)) == plain
    stats = engine.stats.spec["ngram"]
    assert stats.proposed_tokens > stats.accepted_tokens > 0          # drafts accepted and rejected
    _assert_no_leak(engine)


def _answers(loaded, **engine_overrides) -> list[str]:
    engine = _engine(loaded, **engine_overrides)
    outs = engine.generate([_chat(loaded, q) for q in CHECKS], SamplingParams(max_tokens=48, temperature=0))
    _assert_no_leak(engine)
    return [loaded.tokenizer.decode(o) for o in outs]


@pytest.fixture(scope="module")
def qwen_bf16():
    return load_model("qwen", "bfloat16")


def test_int8_kv_runs_on_the_cpp_kernels_and_answers(qwen_bf16):
    engine = _engine(qwen_bf16, kv_cache_dtype="int8")
    ops = engine.runner.attn.ops
    q = torch.empty(1, qwen_bf16.config.num_attention_heads, qwen_bf16.config.head_dim, dtype=torch.bfloat16)
    assert ops.name == "cpu-cpp" and ops._native_quantized_ok(q, engine.pool.k[0])
    for answer, needle in zip(_answers(qwen_bf16, kv_cache_dtype="int8"), CHECKS.values()):
        assert needle in answer, answer


@pytest.mark.parametrize("method", ["int8", "int4-gguf"])
def test_quantized_weights_with_int8_kv_answer(method):
    loaded = load_model("qwen", "bfloat16")
    if method == "int8":
        quantize_model(loaded.model, "int8", progress=False)
    else:
        quantize_loaded(loaded, "int4-gguf", 32)
        assert sum(isinstance(m, Int4Linear) for m in loaded.model.modules()) == 12    # the Q4_K down projections
    for answer, needle in zip(_answers(loaded, kv_cache_dtype="int8"), CHECKS.values()):
        assert needle in answer, answer


def test_an_answer_ends_at_endoftext_as_at_im_end(qwen_fp32):
    """The GGUF names <|im_end|> as EOS; Qwen2.5's instruct models also end at <|endoftext|> (their
    generation_config lists both, llama.cpp ends at both). After a finished turn, the greedy next
    token is <|endoftext|>, and the answer ends there instead of going on with a new text."""
    tok = qwen_fp32.tokenizer
    assert tok.eos_token_ids == {151643, 151645}
    prompt = tok.encode("<|im_start|>user\nSay OK.<|im_end|>\n<|im_start|>assistant\nOK.<|im_end|>\n")
    [out] = _engine(qwen_fp32).generate([prompt], SamplingParams(max_tokens=40, temperature=0))
    assert out == [151643]
