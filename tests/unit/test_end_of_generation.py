"""The ids generation ends at. A GGUF names one EOS; the control tokens spelled as the end of a
turn or a text end generation too (llama.cpp's rule; Qwen2.5's generation_config lists
<|endoftext|> beside <|im_end|>), and ordinary or user-defined tokens with those spellings do not.
An HF checkpoint's generation_config.json adds its own to config.json's."""

from __future__ import annotations

import json

from engines.loaders.gguf_tokenizer import end_of_generation_ids
from engines.loaders.hf_checkpoint import open_hf_checkpoint

NORMAL, CONTROL, USER = 1, 3, 4


def test_control_tokens_that_end_a_turn_or_a_text_join_the_declared_ids():
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "hello", "<|eot_id|>", "<end_of_turn>", "<|end|>"]
    types = [CONTROL, CONTROL, CONTROL, NORMAL, USER, NORMAL, CONTROL]
    assert end_of_generation_ids(tokens, types, [2, None, None]) == [0, 2, 6]
    assert end_of_generation_ids(tokens, types, [3, 99, None]) == [0, 2, 3, 6]     # an id past the vocabulary: dropped


def test_generation_config_adds_to_config_eos(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 8,
                                                      "hidden_size": 8, "intermediate_size": 16,
                                                      "num_hidden_layers": 1, "num_attention_heads": 2,
                                                      "eos_token_id": 5}))
    (tmp_path / "tokenizer.json").write_text("{}")
    assert open_hf_checkpoint(tmp_path).end_of_generation_ids == [5]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 3, True]}))
    assert open_hf_checkpoint(tmp_path).end_of_generation_ids == [3, 5]
