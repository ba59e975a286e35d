"""The logprob of every prompt token under the model (SamplingParams.prompt_logprobs), with its
rank and the top alternatives: what completions' `echo` with `logprobs` and vLLM's
`prompt_logprobs` return, and what scoring tools (lm-evaluation-harness' loglikelihood) read.

The row at prompt position p predicts token p + 1, so each prefill chunk yields the logprobs of
the tokens after its rows, the prompt's last row excepted (it predicts the first generated
token, and is sampled as usual). Such a request's prompt is computed whole, never read from the
prefix cache (Sequence.prompt_rows_to_compute): a cached block has no logits. The logits of a
chunk's rows are made a few rows at a time, so a long chunk never holds a [rows, vocabulary]
tensor at once. Each scored row costs an lm-head product and a few passes over the vocabulary
(about one more row's forward for a small model with a large vocabulary); the rows a step
scores are bounded by its token budget, so a step carrying them takes at most about twice as
long.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engines.sampler import TokenLogprob, chosen_and_top
from engines.sequence import Sequence

ROWS_PER_PASS = 64


def rows_in_chunk(seq: Sequence, start: int, num_tokens: int, flat: int) -> list[tuple[int, Sequence, int]]:
    """(flat row, sequence, position) for the chunk's rows that predict a prompt token."""
    end = min(start + num_tokens, len(seq.prompt_ids) - 1)
    return [(flat + p - start, seq, p) for p in range(start, end)]


def score(hidden: torch.Tensor, rows: list[tuple[int, Sequence, int]],
          compute_logits: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Each row's next prompt token's logprob (and top alternatives), kept on its sequence by
    the position of the token it scores (a recomputed prefill overwrites, never duplicates)."""
    for begin in range(0, len(rows), ROWS_PER_PASS):
        part = rows[begin:begin + ROWS_PER_PASS]
        lp = torch.log_softmax(compute_logits(hidden[begin:begin + len(part)]).float(), dim=-1)
        targets = [seq.prompt_ids[p + 1] for _, seq, p in part]
        chosen, tops = chosen_and_top(lp, targets, [seq.params.prompt_logprobs for _, seq, _ in part])
        ranks = ((lp > chosen.unsqueeze(1)).sum(dim=-1) + 1).tolist()
        for j, (value, (_, seq, p)) in enumerate(zip(chosen.tolist(), part)):
            seq.prompt_logprob_parts[p + 1] = TokenLogprob(targets[j], value, tops[j], rank=ranks[j])


def take(seq: Sequence) -> list[TokenLogprob]:
    """The prompt's logprobs in order (the first token's logprob None: nothing predicts it),
    handed over once: the sequence keeps no copy."""
    parts, seq.prompt_logprob_parts = seq.prompt_logprob_parts, {}
    return [TokenLogprob(seq.prompt_ids[0], None, [])] + [parts[p] for p in range(1, len(seq.prompt_ids))]
