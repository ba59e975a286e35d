"""Build a `tokenizers` byte-level BPE from the vocabulary stored in GGUF metadata."""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from engines.errors import ModelLoadError

# GGUF token types (llama.cpp's llama_token_type).
_CONTROL, _USER_DEFINED = 3, 4
# Control tokens that end a turn or a text: llama.cpp ends generation at them besides the declared
# EOS (a GGUF names one EOS; Qwen2.5's instruct models end at <|im_end|> or <|endoftext|>, as
# their HF generation_config says).
_END_TEXTS = frozenset({"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>",
                        "<EOT>", "<|end_of_text|>"})

# The split regexes llama.cpp and transformers use for each `tokenizer.ggml.pre` (the merges were
# learned on text split this way). Llama 3 groups digits by three, Qwen2 splits them one by one.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_REGEXES = {
    "llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT,
}
# GPT-2's own regex inside ByteLevel; the StarCoder family splits digits one by one first.
_GPT2_STYLE = {"default": False, "gpt-2": False, "gpt2": False, "smollm": True, "starcoder": True, "refact": True}


def _pre_tokenizer(pre: str):
    if pre in _SPLIT_REGEXES:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLIT_REGEXES[pre]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    if pre in _GPT2_STYLE:
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if _GPT2_STYLE[pre]:
            return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        return byte_level
    raise ModelLoadError(f"unsupported GGUF tokenizer pre-tokenizer {pre!r}")


def build_gguf_tokenizer(model: str, pre: str, tokens: list[str], token_types: list[int], merges: list[str]) -> Tokenizer:
    if model != "gpt2":
        raise ModelLoadError(f"unsupported GGUF tokenizer model {model!r}; only byte-level BPE ('gpt2') is supported")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, token_types) if ty == _CONTROL]
    user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, token_types) if ty == _USER_DEFINED]
    tok.add_special_tokens(specials)
    if user:
        tok.add_tokens(user)
    return tok


def end_of_generation_ids(tokens: list[str], token_types: list[int], declared: list[int | None]) -> list[int]:
    """The ids generation ends at: the declared ones (EOS, EOT, EOM) and the control tokens
    spelled as the end of a turn or a text."""
    ids = {i for i in declared if isinstance(i, int) and 0 <= i < len(tokens)}
    ids.update(i for i, (text, kind) in enumerate(zip(tokens, token_types)) if kind == _CONTROL and text in _END_TEXTS)
    return sorted(ids)
