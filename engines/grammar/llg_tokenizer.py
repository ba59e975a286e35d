"""The llguidance view of one of our tokenizers (engines/tokenizer.py): built from the same
`tokenizers` vocabulary the engine encodes with, sized to the model's logits (a model may have
more rows than its tokenizer has tokens: those ids are never allowed).

Which tokens are special is the tokenizer's own word for it. llguidance, reading a tokenizer
file, also counts every added token shaped like `<...>` as special (Qwen's `<tool_call>` is an
ordinary one) and tokenizes text with the special tokens recognised in it; a constraint whose
text spells one (a regex or a choice holding "<tool_call>" or "<|im_start|>") then made it force
a special token whose bytes its own grammar refuses, and the answer failed mid-way. So it gets
the vocabulary as bytes, the special tokens the tokenizer marks, and an encoder that reads
special tokens' spellings as plain text: such text is written with ordinary tokens (or the
ordinary added token that spells it), and a special token is only ever what a grammar names
(`<|im_end|>`, `<[id]>`).
"""

from __future__ import annotations

import llguidance
from llguidance import TokenizerWrapper

from engines.tokenizer import TextTokenizer


class _Vocabulary:
    """What llguidance's TokenizerWrapper reads: every token's bytes, the special ids, and the
    encoder (called with text)."""

    bos_token_id = None

    def __init__(self, tokenizer: TextTokenizer, vocab_size: int):
        backend = tokenizer.backend
        # llguidance's own reading gives the bytes of every ordinary token (byte-level or not).
        reader = llguidance.LLTokenizer(backend.to_str(), n_vocab=vocab_size)
        added = backend.get_added_tokens_decoder()
        known = backend.get_vocab_size()
        self.tokens = [added[i].content.encode() if i in added else reader.decode_bytes([i]) if i < known else b""
                       for i in range(vocab_size)]
        self.special_token_ids = sorted(i for i, token in added.items() if token.special and i < vocab_size)
        eos = sorted(tokenizer.eos_token_ids)
        self.eos_token_id = eos[0] if eos else None
        self._encode = tokenizer.encode_as_text

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError("text only")       # TokenizerWrapper then hands text, never bytes
        return self._encode(text)


def build_llg_tokenizer(tokenizer: TextTokenizer, vocab_size: int) -> llguidance.LLTokenizer:
    """About 1 s for SmolLM2's 49k tokens, 2 s for Qwen's 152k: built once per engine, off the
    engine thread (GrammarCompiler builds it on first use in its own worker)."""
    eos = sorted(tokenizer.eos_token_ids) or None
    return llguidance.LLTokenizer(TokenizerWrapper(_Vocabulary(tokenizer, vocab_size)), n_vocab=vocab_size,
                                  eos_token=eos)
