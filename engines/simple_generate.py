"""Single-sequence generation over a contiguous cache.

The reference path for tests and the CLI until the batching engine serves them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from engines.attention.contiguous import ContiguousAttention
from engines.errors import ContextLengthError
from engines.model import LlamaForCausalLM


@dataclass
class SimpleSampling:
    max_tokens: int = 128
    temperature: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False


def generate_tokens(
    model: LlamaForCausalLM,
    prompt_ids: list[int],
    sampling: SimpleSampling,
    eos_ids: frozenset[int] = frozenset(),
) -> Iterator[int]:
    """Yield generated token ids one by one (greedy when temperature is 0).

    The request is checked when this is called, not at the first token: the cache for the whole
    request is allocated up front, so a request past the model's context must fail before that."""
    if not prompt_ids:
        raise ValueError("prompt must contain at least one token")
    context = model.config.max_position_embeddings
    if len(prompt_ids) + sampling.max_tokens > context:
        raise ContextLengthError(
            f"prompt ({len(prompt_ids)} tokens) plus max_tokens ({sampling.max_tokens}) exceeds the "
            f"context length {context}", "max_tokens")
    return _generate(model, prompt_ids, sampling, eos_ids)


def _generate(model: LlamaForCausalLM, prompt_ids: list[int], sampling: SimpleSampling,
              eos_ids: frozenset[int]) -> Iterator[int]:
    total = len(prompt_ids) + sampling.max_tokens
    device = model.embed_tokens.weight.device
    attn = ContiguousAttention(model.config, total, model.dtype, device)
    generator = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
    ids = torch.tensor(prompt_ids, dtype=torch.long, device=device)
    start = 0
    for _ in range(sampling.max_tokens):
        attn.begin_step(start, ids.numel())
        positions = torch.arange(start, start + ids.numel(), device=device)
        hidden = model(ids, positions, attn)
        logits = model.compute_logits(hidden[-1:])[0]
        token = _sample(logits, sampling.temperature, generator)
        yield token
        if token in eos_ids and not sampling.ignore_eos:
            return
        start += ids.numel()
        ids = torch.tensor([token], dtype=torch.long, device=device)


def _sample(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    if temperature <= 0:
        return int(logits.argmax())
    # Drawn on the host: a seeded CPU generator gives the same tokens on any device.
    probs = torch.softmax(logits / temperature, dim=-1).cpu()
    return int(torch.multinomial(probs, 1, generator=generator))
