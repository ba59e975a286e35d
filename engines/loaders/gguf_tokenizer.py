"""Build a `tokenizers` byte-level BPE from the vocabulary stored in GGUF metadata."""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from engines.errors import ModelLoadError

# GGUF token types (llama.cpp's llama_token_type).
_CONTROL, _USER_DEFINED = 3, 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _pre_tokenizer(pre: str):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder", "refact"):
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in ("default", "gpt-2", "gpt2"):
        return byte_level
    if pre in ("llama-bpe", "llama3", "smaug-bpe"):
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
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
