"""What a request's own settings do to its logits before temperature and the filters:
logit_bias, the ban on stopping before min_tokens, and the repetition, frequency and presence
penalties. In that order, as vLLM applies them (a bias can flip a logit's sign, which the
repetition penalty then reads).

Each row is one sequence at one position: its history is the sequence's output so far plus the
draft tokens ahead of that position, so speculative verification sees exactly what plain
decoding would (engines/spec/verify.py).
"""

from __future__ import annotations

import torch

from engines.sampling_params import SamplingParams
from engines.sequence import Sequence


def adjusts(params: SamplingParams) -> bool:
    return (bool(params.logit_bias) or params.min_tokens > 0 or params.repetition_penalty != 1.0
            or params.uses_penalties)


def adjust_logits(logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: frozenset[int],
                  drafts: list[list[int]] | None = None) -> torch.Tensor:
    """`logits` row i adjusted for seqs[i] after its output plus drafts[i] (a copy when any row
    changes; the raw logits stay what logprobs read)."""
    if not any(adjusts(s.params) for s in seqs):
        return logits
    logits = logits.clone()
    for i, seq in enumerate(seqs):
        p = seq.params
        if not adjusts(p):
            continue
        output = seq.output_ids + drafts[i] if drafts else seq.output_ids
        row = logits[i]                                    # a view: edits land in `logits`
        if p.logit_bias:
            ids = torch.tensor(list(p.logit_bias), device=row.device)
            row.index_add_(0, ids, torch.tensor(list(p.logit_bias.values()), dtype=row.dtype, device=row.device))
        if len(output) < p.min_tokens:
            _ban_stopping(row, p.stop_token_set(eos_token_ids), constrained=p.grammar is not None)
        if p.repetition_penalty != 1.0:
            _repetition(row, seq.prompt_ids + output, p.repetition_penalty)
        if p.uses_penalties and output:
            ids = torch.tensor(output, device=row.device)
            counts = torch.zeros_like(row).index_add_(0, ids, torch.ones(len(ids), dtype=row.dtype, device=row.device))
            row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)
    return logits


def _ban_stopping(row: torch.Tensor, stop_ids: frozenset[int], constrained: bool) -> None:
    """EOS and the request's stop tokens at -inf. A grammar that allows nothing but stopping
    keeps its way: its output is complete and cannot be made longer."""
    ids = [t for t in stop_ids if t < row.shape[0]]
    if not ids:
        return
    banned = row.index_fill(0, torch.tensor(ids, device=row.device), float("-inf"))
    if constrained and not bool(torch.isfinite(banned).any()):
        return
    row.copy_(banned)


def _repetition(row: torch.Tensor, seen: list[int], penalty: float) -> None:
    """The CTRL paper's rule as HF and vLLM apply it, over the prompt and the output: a seen
    token's positive logit divided by the penalty, a negative one multiplied."""
    ids = torch.tensor(sorted(set(seen)), device=row.device)       # distinct on the host: no device sync
    values = row[ids]
    row[ids] = torch.where(values > 0, values / penalty, values * penalty)
