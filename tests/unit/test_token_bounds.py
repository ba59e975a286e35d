"""The budget estimate is an upper bound: for any messages, at least the prompt tokens a server
running SmolLM2 counts (its real tokenizer and chat template, special-token strings in the
content parsed as special tokens, as vLLM does), with the tokenizer configured and without."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from engines.chat_template import ChatTemplate
from engines.loaded_model import resolve_checkpoint_dir
from engines.tokenizer import TextTokenizer
from gateway.schema import ChatCompletionRequest, CompletionRequest
from gateway.tier_tokenizers import TokenizerCounter
from gateway.token_bounds import (
    DEFAULT_OUTPUT_BOUND,
    TOOLS_OVERHEAD,
    output_bound,
    prompt_bound,
    utf8_length,
)

PROPERTY = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>assistant\n", "\n", "\n\n", " ",
            "   ", "1234567", "\u0958", "\ufdfa", "\U0001d160", "\U0001f600", "é", "日本語"]
# Text with surrogates excluded (not valid in the JSON a client sends), salted with what tokenizers
# treat specially: special-token strings, whitespace runs, digits, characters that normal forms lengthen.
TEXT = st.lists(st.one_of(st.text(st.characters(blacklist_categories=("Cs",)), max_size=40),
                          st.sampled_from(SPECIALS)), max_size=8).map("".join)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]), "content": TEXT},
    optional={"name": st.text(st.characters(codec="utf-8", categories=("L", "N")), min_size=1, max_size=12)})


class SmolServer:
    """What a server running SmolLM2 counts: its tokenizer.json and chat template."""

    def __init__(self):
        ckpt = resolve_checkpoint_dir("default")
        config = json.loads((ckpt / "tokenizer_config.json").read_text())
        self.path = ckpt / "tokenizer.json"
        self.tokenizer = TextTokenizer(Tokenizer.from_file(str(self.path)), config)
        self.template = ChatTemplate(config.get("chat_template"), self.tokenizer.bos_token, self.tokenizer.eos_token)

    def chat_tokens(self, messages: list[dict]) -> int:
        rendered = self.template.render([{"role": m["role"], "content": m["content"]} for m in messages])
        return len(self.tokenizer.encode(rendered))

    def prompt_tokens(self, prompt: str) -> int:
        return len(self.tokenizer.encode(prompt))


@pytest.fixture(scope="module")
def smol() -> SmolServer:
    return SmolServer()


@pytest.fixture(scope="module")
def counter(smol) -> TokenizerCounter:
    return TokenizerCounter.from_file(smol.path)


def chat(messages: list[dict], **extra) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": messages, **extra})


@PROPERTY
@given(messages=st.lists(MESSAGE, min_size=1, max_size=6))
def test_chat_bound_covers_the_real_count(smol, counter, messages):
    real = smol.chat_tokens(messages)
    body = chat(messages)
    assert prompt_bound(body) >= real
    assert prompt_bound(body, counter) >= real


@PROPERTY
@given(prompts=st.lists(TEXT, min_size=1, max_size=4), suffix=st.one_of(st.none(), TEXT))
def test_completions_bound_covers_the_real_count(smol, counter, prompts, suffix):
    real = sum(smol.prompt_tokens(p + (suffix or "")) for p in prompts)
    body = CompletionRequest.model_validate({"model": "m", "prompt": prompts, "suffix": suffix})
    assert prompt_bound(body) >= real
    assert prompt_bound(body, counter) >= real


def test_token_id_prompts_count_as_given(counter):
    body = CompletionRequest.model_validate({"model": "m", "prompt": [[5, 6, 7], [8]]})
    assert prompt_bound(body) == prompt_bound(body, counter) >= 4


def test_the_tokenizer_tightens_the_bound_on_ordinary_text(smol, counter):
    messages = [{"role": "system", "content": "You answer in one short sentence."},
                {"role": "user", "content": "What is the capital of France? Please answer briefly."}]
    body = chat(messages)
    real = smol.chat_tokens(messages)
    assert real <= prompt_bound(body, counter) < prompt_bound(body)


def test_special_token_strings_count_as_plain_text(smol, counter):
    # Parsed as a special token it is one; an upstream may just as well read it as text.
    assert len(smol.tokenizer.encode("<|im_start|>")) == 1
    assert counter(["<|im_start|>"])[0] > 1


def test_normal_forms_that_lengthen_a_text_are_counted():
    assert utf8_length("plain ascii") == 11
    assert utf8_length("\u0958") == 6          # 3 bytes; its NFC form is 6
    assert utf8_length("\ufdfa") == 33         # 3 bytes; its NFKC form is 33


def test_tools_and_unknown_fields_are_counted():
    messages = [{"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "description": "the city, in full"}}}}}]
    plain = prompt_bound(chat(messages))
    with_tools = prompt_bound(chat(messages, tools=tools))
    assert with_tools >= plain + TOOLS_OVERHEAD + len(json.dumps(tools, separators=(",", ":")))
    calls = [{"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}]
    assert prompt_bound(chat(messages + calls)) > plain + len("get_weather") + len("Paris")


def test_output_bound_per_choice_and_prompt():
    body = CompletionRequest.model_validate({"model": "m", "prompt": ["a", "b"], "max_tokens": 7, "n": 2,
                                             "best_of": 3})
    assert output_bound(body, None) == (7 * 3 * 2, None)            # best_of sequences are generated
    assert output_bound(chat([{"role": "user", "content": "x"}], max_tokens=5, n=4), 100) == (20, None)


def test_without_max_tokens_the_context_or_a_cap_bounds_the_output():
    body = chat([{"role": "user", "content": "x"}], n=2)
    assert output_bound(body, 1000) == (2000, None)                 # an upstream stops at its context
    assert output_bound(body, 1000, exact_prompt=30) == (2 * 970, None)    # an embedded tier: exactly
    assert output_bound(body, None) == (2 * DEFAULT_OUTPUT_BOUND, DEFAULT_OUTPUT_BOUND)   # sent as max_tokens
