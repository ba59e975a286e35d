"""Tiny random Llama checkpoints written in Hugging Face layout, for fast tests."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers

TINY_VOCAB = 128


def tiny_hf_config(**overrides):
    from transformers import LlamaConfig

    base = dict(
        vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2,
    )
    base.update(overrides)
    return LlamaConfig(**base)


def write_tiny_checkpoint(path: Path, seed: int = 0, max_shard_size: str | None = None, **overrides):
    """Save a random transformers Llama (and a word-level tokenizer) into `path`."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_hf_config(**overrides)).eval()
    with torch.no_grad():  # random norms and biases, so a wiring mistake shows in the logits
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("bias"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p) if name.endswith("norm.weight") else 0.1 * torch.randn_like(p))
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, safe_serialization=True, **kwargs)
    vocab = {f"w{i}": i for i in range(TINY_VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text('{"eos_token": "w2", "bos_token": "w1"}')
    return model


BYTE_SPECIALS = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"]


def write_tiny_byte_checkpoint(path: Path, seed: int = 0, **overrides):
    """A tiny random Llama over a byte-level vocabulary (the 256 bytes, then BYTE_SPECIALS), so it
    can spell any text, JSON included: for constrained-decoding tests, where the word-level
    tokenizer above could not produce a single brace. No chat template: the engine's ChatML one."""
    from tokenizers import decoders

    vocab_size = 256 + len(BYTE_SPECIALS)
    model = write_tiny_checkpoint(path, seed=seed, vocab_size=vocab_size, bos_token_id=256,
                                  eos_token_id=vocab_size - 1, **overrides)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(BYTE_SPECIALS)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text('{"eos_token": "<|im_end|>", "bos_token": "<s>"}')
    return model
