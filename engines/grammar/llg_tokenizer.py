"""The llguidance view of one of our tokenizers (engines/tokenizer.py): built from the same
`tokenizers` vocabulary the engine encodes with, sized to the model's logits (a model may have
more rows than its tokenizer has tokens: those ids are never allowed)."""

from __future__ import annotations

import llguidance

from engines.tokenizer import TextTokenizer


def build_llg_tokenizer(tokenizer: TextTokenizer, vocab_size: int) -> llguidance.LLTokenizer:
    """About 0.5 s for SmolLM2's 49k tokens, 2 s for Qwen's 152k: built once per engine, off the
    engine thread (GrammarCompiler builds it on first use in its own worker)."""
    eos = sorted(tokenizer.eos_token_ids) or None
    return llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=vocab_size, eos_token=eos)


def token_reference(llg: llguidance.LLTokenizer, tokenizer: TextTokenizer, text: str) -> str | None:
    """`text` as a Lark reference to the one token spelling it when llguidance counts that token
    as special (it would not match the token's bytes as a literal): e.g. Qwen's `<tool_call>`."""
    token_id = tokenizer.backend.token_to_id(text)
    if token_id is None or not llg.is_special_token(token_id):
        return None
    return f"<[{token_id}]>"
