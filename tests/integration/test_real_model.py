"""Our model on each bundled GGUF equals transformers' loading of the same file (fp32):
SmolLM2-135M (llama: Q/K rows unpermuted, tied head) and Qwen2.5-Coder-0.5B (qwen2: q/k/v
biases, untied head, Q4_K/Q5_0/Q6_K/Q8_0 tensors)."""

from __future__ import annotations

import pytest
import torch

from engines.attention.contiguous import ContiguousAttention
from engines.simple_generate import SimpleSampling, generate_tokens

pytestmark = pytest.mark.slow

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain photosynthesis to a ten-year-old, in three sentences.",
    "1234 + 5678 = ? Show your steps.",
]
# name -> (our model, transformers' model, transformers' tokenizer) fixtures
MODELS = {"default": ("real_fp32", "hf_reference", "hf_tokenizer"),
          "qwen": ("qwen_fp32", "qwen_hf_reference", "qwen_hf_tokenizer")}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city, in <b>°C</b>",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module", params=list(MODELS))
def model_name(request):
    return request.param


@pytest.fixture(scope="module")
def ours(model_name, request):
    return request.getfixturevalue(MODELS[model_name][0])


@pytest.fixture(scope="module")
def reference(model_name, request):
    return request.getfixturevalue(MODELS[model_name][1])


def _prompt_ids(loaded, text: str) -> list[int]:
    return loaded.tokenizer.encode(loaded.chat_template.render([{"role": "user", "content": text}]))


@pytest.mark.parametrize("text", PROMPTS)
def test_prefill_logits_match_transformers(ours, reference, text):
    ids = _prompt_ids(ours, text)
    attn = ContiguousAttention(ours.config, len(ids), torch.float32)
    attn.begin_step(0, len(ids))
    hidden = ours.model(torch.tensor(ids), torch.arange(len(ids)), attn)
    logits = ours.model.compute_logits(hidden)
    with torch.no_grad():
        ref = reference(torch.tensor([ids])).logits[0].float()
    assert logits.shape == ref.shape
    assert (logits - ref).abs().max().item() < 1e-3


@pytest.mark.parametrize("text", [PROMPTS[1], "Write a short essay about the history of Rome."])
def test_greedy_32_tokens_identical_to_transformers(ours, reference, text):
    ids = _prompt_ids(ours, text)
    eos = ours.tokenizer.eos_token_ids
    out = list(generate_tokens(ours.model, ids, SimpleSampling(max_tokens=32), eos))
    with torch.no_grad():
        ref = reference.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)
    assert len(out) == 32  # these prompts have long answers: all 32 tokens are compared
    assert out == ref[0, len(ids):].tolist()


def test_capital_of_france_is_paris(ours, model_name):
    ids = _prompt_ids(ours, PROMPTS[0])
    out = list(generate_tokens(ours.model, ids, SimpleSampling(max_tokens=24), ours.tokenizer.eos_token_ids))
    text = ours.tokenizer.decode(out)
    if model_name == "qwen":
        assert text == "The capital of France is Paris."
    else:
        assert "Paris" in text


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["plain", "tools"])
def test_chat_template_renders_as_transformers(ours, model_name, request, tools):
    """Qwen's template renders tools itself, as transformers does; SmolLM2's has none, so tools
    reach it through the documented fallback (engines/tool_prompt.py: the Hermes tool prompt in
    the system turn), rendered by its own template as transformers renders those messages."""
    from engines.tool_prompt import without_tools

    hf_tokenizer = request.getfixturevalue(MODELS[model_name][2])
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
    extra = {"tools": tools} if tools else {}
    if tools and not ours.chat_template.supports_tools:
        assert model_name == "default"
        expected = hf_tokenizer.apply_chat_template(without_tools(messages, tools), tokenize=False,
                                                    add_generation_prompt=True)
        assert "get_weather" in expected
    else:
        expected = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)
    assert ours.chat_template.render(messages, **extra) == expected


@pytest.mark.parametrize("content", ["The capital is", ""], ids=["prefilled", "empty"])
def test_a_continued_answer_renders_as_transformers(ours, model_name, request, content):
    """vLLM's continue_final_message: the final assistant turn left open, as transformers leaves it
    (for an empty message transformers keeps the closed turn; ours opens it, which is the point)."""
    hf_tokenizer = request.getfixturevalue(MODELS[model_name][2])
    messages = [{"role": "user", "content": "Name France's capital."}, {"role": "assistant", "content": content}]
    ours_text = ours.chat_template.render(messages, add_generation_prompt=False, continue_final_message=True)
    if content:
        assert ours_text == hf_tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    else:
        opened = hf_tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
        assert ours_text == opened
    closed = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert ours.chat_template.render(messages, add_generation_prompt=False) == closed


def test_seeded_sampling_is_reproducible(ours):
    ids = _prompt_ids(ours, "Tell me a story.")
    runs = [list(generate_tokens(ours.model, ids, SimpleSampling(max_tokens=16, temperature=1.0, seed=7)))
            for _ in range(2)]
    assert runs[0] == runs[1]
