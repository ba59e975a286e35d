"""The tokenizer we build from GGUF metadata matches transformers' token for token, for each
bundled model: SmolLM2 (GPT-2 byte-level BPE, digits split) and Qwen2.5-Coder (the qwen2 split)."""

from __future__ import annotations

import functools

import pytest

from engines.loaded_model import resolve_checkpoint_dir
from engines.loaders.hf_checkpoint import open_hf_checkpoint
from engines.tokenizer import TextTokenizer

pytestmark = pytest.mark.slow

TRICKY = [
    "Hello, world!",
    "1234567890 and 3.14159 and 1,000,000",
    "naïve café — Ünïcödé; Ελληνικά; 日本語のテキスト; русский",
    "emoji: 😀👍🏽🇫🇷 👨‍👩‍👧",
    "def f(x):\n\treturn x ** 2  # square\n\n\nclass A:\n    pass",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "   leading and trailing spaces   ",
    "tabs\tand\r\nwindows newlines",
    "",
    "a" * 300,
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}",
    "中文分词测试：我爱北京天安门。한국어 텍스트도 있어요.",
    "🤖🚀✨ emoji at the end 🇯🇵",
    "12345678901234567890 0.000001 1e-10 3,141,592",
    "I'm sure you'RE right; they'll say WE'VE seen it",
    "x\u00a0y\u2003z and e\u0301 vs é",
    "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\n"
    "<tool_call>\n{\"name\": \"f\"}\n</tool_call><|im_end|>",
]

# Per model: a text that is one control token, its id, and the eos ids.
SPECIALS = {"default": ("<|im_end|>", 2, {0, 2}), "qwen": ("<|im_end|>", 151645, {151643, 151645})}


@pytest.fixture(scope="module", params=["default", "qwen"])
def model_name(request):
    return request.param


@functools.cache
def _our_tokenizer(model_name: str) -> TextTokenizer:
    ckpt = open_hf_checkpoint(resolve_checkpoint_dir(model_name))
    return TextTokenizer.from_file(ckpt.tokenizer_json, ckpt.tokenizer_config, ckpt.end_of_generation_ids)


@pytest.fixture(scope="module")
def ours(model_name):
    return _our_tokenizer(model_name)


@pytest.fixture(scope="module")
def reference(model_name, request):
    return request.getfixturevalue("hf_tokenizer" if model_name == "default" else "qwen_hf_tokenizer")


@pytest.mark.parametrize("text", TRICKY)
def test_encode_matches_transformers(ours, reference, text):
    assert ours.encode(text) == reference.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("text", TRICKY)
def test_round_trip(ours, text):
    assert ours.decode(ours.encode(text), skip_special_tokens=False) == text


def test_special_tokens_and_eos(ours, model_name):
    text, token_id, eos = SPECIALS[model_name]
    assert ours.encode(text) == [token_id]
    assert ours.eos_token_ids == frozenset(eos)
    assert ours.decode([token_id]) == ""                  # special: skipped when decoding


def test_smollm2_decodes_system():
    assert _our_tokenizer("default").decode([1, 9690, 2]) == "system"


def test_qwen_tool_tags_are_whole_tokens_but_not_special():
    tok = _our_tokenizer("qwen")
    ids = tok.encode("<tool_call>x</tool_call>")
    assert ids[0] == 151657 and ids[-1] == 151658
    assert tok.decode(ids) == "<tool_call>x</tool_call>"     # user-defined: kept in the text
