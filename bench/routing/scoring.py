"""Quality of one (prompt, model) pair: bits per byte of the reference answer, teacher-forced.

Bits per byte, not per token, so that two models with different tokenizers are comparable: the
answer's -log2 p summed over its tokens, divided by its UTF-8 byte count. One forward over the
whole chat-templated (prompt + answer) sequence with the contiguous attention backend gives
every needed logit, and the prompt's own mean logprob (a routing signal the prefill gives for
free) comes from the same forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from engines.attention.contiguous import ContiguousAttention

LN2 = math.log(2.0)


@dataclass(frozen=True)
class ExchangeScore:
    prompt_tokens: int
    answer_tokens: int
    answer_bytes: int
    answer_bits: float
    # Mean natural-log probability of the prompt's tokens (each given those before it; the first
    # token has no prediction): known after the prefill, before any answer token.
    prompt_mean_logprob: float | None = None
    # The final hidden states at the prompt's last token and the rows before it that were asked
    # for (what the engine reports with the first token, SamplingParams.prompt_hidden_rows),
    # concatenated: the same forward computes them.
    prompt_hidden: tuple[float, ...] | None = None

    @property
    def bits_per_byte(self) -> float:
        return self.answer_bits / self.answer_bytes


def encode_prompt(loaded, question: str) -> list[int]:
    """The question as the tier would receive it: one user turn in the model's chat template."""
    return loaded.tokenizer.encode(loaded.chat_template.render([{"role": "user", "content": question}]))


def encode_exchange(loaded, question: str, reference: str) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids) in the model's own chat template and tokenizer: the prompt as
    the tier would receive it, the answer as the tokens that would follow it."""
    return encode_prompt(loaded, question), loaded.tokenizer.encode(reference, add_special_tokens=False)


def score_question(loaded, question: str, reference: str, *, prompt_logprobs: bool = False,
                   hidden_rows: tuple[int, ...] = (0,)) -> ExchangeScore:
    """The reference's bits per byte after the question, in the loaded model's own template
    (with `prompt_logprobs`, the prompt's mean logprob and its hidden state at `hidden_rows` as well)."""
    prompt_ids, answer_ids = encode_exchange(loaded, question, reference)
    return score_exchange(loaded.model, prompt_ids, answer_ids, len(reference.encode("utf-8")),
                          prompt_logprobs=prompt_logprobs, hidden_rows=hidden_rows)


def template_tail_tokens(loaded) -> int:
    """How many tokens the chat template puts after the user's text (the turn's closing token,
    then the assistant's opening): the first of them is that many rows, less one, before the
    prompt's last token."""
    a, b = encode_prompt(loaded, "alpha"), encode_prompt(loaded, "beta gamma, delta")
    tail = 0
    while tail < min(len(a), len(b)) - 1 and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    return tail


def hidden_at_rows(hidden: torch.Tensor, n_prompt: int, rows: tuple[int, ...]) -> tuple[float, ...]:
    """The prompt's rows `rows` back from its last token (clamped to its first), concatenated."""
    return tuple(torch.cat([hidden[max(0, n_prompt - 1 - back)] for back in rows]).float().tolist())


@torch.inference_mode()
def final_hidden(model, ids: list[int]) -> torch.Tensor:
    """One forward over `ids` from position 0 (contiguous attention): every row's final hidden state."""
    device = model.embed_tokens.weight.device
    attn = ContiguousAttention(model.config, len(ids), model.dtype, device)
    attn.begin_step(0, len(ids))
    return model(torch.tensor(ids, device=device), torch.arange(len(ids), device=device), attn)


@torch.inference_mode()
def score_exchange(model, prompt_ids: list[int], answer_ids: list[int], answer_bytes: int, *,
                   prompt_logprobs: bool = False, hidden_rows: tuple[int, ...] = (0,)) -> ExchangeScore:
    if not prompt_ids or not answer_ids or answer_bytes <= 0:
        raise ValueError("scoring needs a non-empty prompt and a non-empty answer")
    ids = prompt_ids + answer_ids
    n_prompt = len(prompt_ids)
    device = model.embed_tokens.weight.device
    hidden = final_hidden(model, ids)
    # Row r predicts token r + 1; only the rows whose prediction is wanted get logits (the LM
    # head over a 150k vocabulary costs as much as the rest of a small model).
    first_row = 0 if prompt_logprobs else n_prompt - 1
    logprobs = torch.log_softmax(model.compute_logits(hidden[first_row:len(ids) - 1]), dim=-1)
    targets = torch.tensor(ids[first_row + 1:], device=device)
    token_logprobs = logprobs.gather(1, targets.unsqueeze(1)).squeeze(1).double()
    answer_start = n_prompt - 1 - first_row
    answer_bits = -float(token_logprobs[answer_start:].sum()) / LN2
    prompt_mean = prompt_hidden = None
    if prompt_logprobs:
        prompt_mean = float(token_logprobs[:answer_start].mean()) if answer_start else 0.0
        prompt_hidden = hidden_at_rows(hidden, n_prompt, hidden_rows)
    return ExchangeScore(n_prompt, len(answer_ids), answer_bytes, answer_bits, prompt_mean, prompt_hidden)
