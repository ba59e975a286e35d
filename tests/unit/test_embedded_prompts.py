"""How an embedded tier turns a request body into token ids (gateway/tiers/embedded_prompts.py):
vLLM's add_special_tokens and truncate_prompt_tokens, on a tokenizer that adds a BOS token."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from engines.chat_template import ChatTemplate
from engines.tokenizer import TextTokenizer
from gateway.schema import ChatCompletionRequest, CompletionRequest, parse_body
from gateway.tiers.embedded_prompts import render_prompts, truncate_prompts


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """The parts of a loaded model that prompts are built with: the tiny byte tokenizer, told to
    add `<s>` as Llama 2 style tokenizers do, and ChatML."""
    from tests.tiny_models import write_tiny_byte_checkpoint

    path = tmp_path_factory.mktemp("bos") / "bytes"
    write_tiny_byte_checkpoint(path)
    tok = TextTokenizer.from_file(path / "tokenizer.json", {"bos_token": "<s>", "add_bos_token": True})
    return SimpleNamespace(tokenizer=tok, chat_template=ChatTemplate(None, "<s>"))


def _body(model, **fields):
    return parse_body(model, json.dumps({"model": "m", **fields}).encode())


def test_add_special_tokens_false_leaves_out_the_bos(loaded):
    bos = loaded.tokenizer.bos_token_id
    [with_bos] = render_prompts(loaded, _body(CompletionRequest, prompt="ab"))
    [without] = render_prompts(loaded, _body(CompletionRequest, prompt="ab", add_special_tokens=False))
    assert with_bos[0] == bos and without == with_bos[1:]
    # Token-id prompts are taken as given either way.
    assert render_prompts(loaded, _body(CompletionRequest, prompt=[5, 6], add_special_tokens=True)) == [[5, 6]]
    [chat] = render_prompts(loaded, _body(ChatCompletionRequest, messages=[{"role": "user", "content": "a"}],
                                          add_special_tokens=False))
    assert chat[0] != bos


def test_truncation_keeps_the_last_tokens_and_leaves_short_prompts_untouched(loaded):
    body = _body(CompletionRequest, prompt=["abcdef", "ab"], truncate_prompt_tokens=3)
    prompts = render_prompts(loaded, body)
    cut = truncate_prompts(body, prompts, 100)
    assert cut[0] == prompts[0][-3:] and cut[1] is prompts[1]
    whole = _body(CompletionRequest, prompt="abcdef", truncate_prompt_tokens=-1, max_tokens=4)
    assert len(truncate_prompts(whole, render_prompts(loaded, whole), 6)[0]) == 2      # 6 - max_tokens
    assert truncate_prompts(whole, render_prompts(loaded, whole), None) == render_prompts(loaded, whole)
