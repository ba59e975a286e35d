"""A constraint whose text spells a token the tokenizer has on its own, over Qwen2.5-Coder's real
vocabulary: `<tool_call>` (an ordinary added token) is written with that token, `<|im_start|>` (a
special one) with ordinary tokens, and the special token itself is never allowed for it. Before,
llguidance counted both as special and forced the special token its own grammar then refused:
the answer failed mid-way with a 400."""

from __future__ import annotations

import re

import numpy as np
import pytest

from engines.grammar import GrammarCompiler, GrammarSpec
from engines.loaded_model import resolve_checkpoint_dir
from engines.loaders.hf_checkpoint import open_hf_checkpoint
from engines.tokenizer import TextTokenizer

pytestmark = pytest.mark.slow

TOOL_CALL, IM_START = 151657, 151644


@pytest.fixture(scope="module")
def qwen():
    ckpt = open_hf_checkpoint(resolve_checkpoint_dir("qwen"))
    tok = TextTokenizer.from_file(ckpt.tokenizer_json, ckpt.tokenizer_config, ckpt.config.eos_token_id)
    compiler = GrammarCompiler(tok, ckpt.config.vocab_size)
    yield tok, compiler
    compiler.shutdown()


def _walk(compiler: GrammarCompiler, tok: TextTokenizer, spec: GrammarSpec) -> tuple[list[int], set[int]]:
    """The tokens a sampler writes taking, at each step, the lowest id the mask allows other than
    EOS (until only EOS is left), and every id the mask allowed on the way."""
    state = compiler.new_state(spec)
    path: list[int] = []
    seen: set[int] = set()
    for _ in range(64):
        words = np.frombuffer(state.matcher.compute_bitmask(), dtype=np.uint32)
        allowed = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))
        seen.update(int(i) for i in allowed)
        choices = [int(i) for i in allowed if int(i) not in state.eos_ids]
        if not choices:
            break
        assert state.accept(choices[0]), state.matcher.get_error()
        path.append(choices[0])
    assert state.is_accepting and not state.is_error
    return path, seen


@pytest.mark.parametrize("text", ["<tool_call>", "say <tool_call> now", "<|im_start|>", "a <|im_start|>b"])
def test_text_spelling_a_tokenizer_token_is_written_as_that_text(qwen, text):
    tok, compiler = qwen
    for spec in (GrammarSpec.regex(re.escape(text), "guided_regex"), GrammarSpec.choice([text, "z"], "guided_choice"),
                 GrammarSpec.json_schema({"const": text})):
        path, seen = _walk(compiler, tok, spec)
        written = tok.decode(path, skip_special_tokens=True)
        assert written == (text if spec.kind != "json_schema" else f'"{text}"'), (spec.kind, path)
        assert IM_START not in seen                   # the special token never stands for its text
        if "<tool_call>" in text and spec.kind == "regex":
            assert TOOL_CALL in path                  # the ordinary added token spells it
