"""INT4 as stored on the real SmolLM2 GGUF (Q4_1 blocks of 32): every decoder linear loads the
file's own nibbles, their weights equal gguf's dequantization to fp32 rounding, and the model,
built as the `fast` tier builds it, answers as the fp32 model does."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from engines.loaded_model import load_model
from engines.quantization.build import quantize_loaded
from engines.quantization.gguf_int4 import read_int4_weights
from engines.quantization.int4 import Int4Linear
from engines.sampling_params import SamplingParams
from tests.integration.test_engine import _assert_no_leak, _engine

pytestmark = pytest.mark.slow

QUESTIONS = {"What is the capital of France?": "Paris", "What is the opposite of hot?": "cold"}


def test_every_q4_1_tensor_loads_as_stored(default_gguf):
    ours = read_int4_weights(default_gguf)
    reader = gguf.GGUFReader(str(default_gguf))
    q4_1 = [t for t in reader.tensors if t.tensor_type == gguf.GGMLQuantizationType.Q4_1]
    assert len(q4_1) == len(ours) == 210
    for t in q4_1[::23]:          # a spread of layers and projections (the whole file takes long)
        ref = torch.from_numpy(np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
        block, name = int(t.name.split(".")[1]), t.name.split(".")[2]
        hf = next(k for k in ours if k.startswith(f"model.layers.{block}.") and k.split(".")[-2] in _HF[name])
        got = ours[hf].dequantized()
        if name in ("attn_q", "attn_k"):   # our rows follow HF's rotate-half order: compare as sets of rows
            got, ref = got.sort(dim=0).values, ref.sort(dim=0).values
        assert (got - ref).abs().max() <= 4 * torch.finfo(torch.float32).eps * ref.abs().max(), t.name


_HF = {"attn_q": ("q_proj",), "attn_k": ("k_proj",), "attn_v": ("v_proj",), "attn_output": ("o_proj",),
       "ffn_gate": ("gate_proj",), "ffn_up": ("up_proj",), "ffn_down": ("down_proj",)}


def test_the_int4_model_answers_as_the_fp32_one(real_fp32):
    loaded = load_model("default", "bfloat16")
    settings = quantize_loaded(loaded, "int4-gguf", 32)
    assert settings["linears"] == {"as_stored": 4 * loaded.config.num_hidden_layers, "int8": 0}
    assert sum(isinstance(m, Int4Linear) for m in loaded.model.modules()) == 4 * loaded.config.num_hidden_layers
    params = SamplingParams(max_tokens=24, temperature=0)
    answers = {}
    for name, model in (("int4", loaded), ("fp32", real_fp32)):
        engine = _engine(model, kv_cache_dtype="int8") if name == "int4" else _engine(model)
        prompts = [model.tokenizer.encode(model.chat_template.render([{"role": "user", "content": q}]))
                   for q in QUESTIONS]
        answers[name] = [model.tokenizer.decode(o) for o in engine.generate(prompts, params)]
        _assert_no_leak(engine)
    for (question, needle), int4, fp32 in zip(QUESTIONS.items(), answers["int4"], answers["fp32"]):
        assert needle.lower() in int4.lower() and needle.lower() in fp32.lower(), (question, int4, fp32)
