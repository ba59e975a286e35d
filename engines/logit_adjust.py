"""What a request's own settings do to its logits before temperature and the filters:
allowed_token_ids, bad_words, logit_bias, the ban on stopping before min_tokens, and the
repetition, frequency and presence penalties. In that order, as vLLM applies them (a bias
cannot bring back a token the allowed list rules out; a bias can flip a logit's sign, which the
repetition penalty then reads).

A row constrained by a grammar keeps the grammar's way when a ban or the allowed list would
leave it no token at all: the grammar's output must stay valid, and a row with nothing left
could not be sampled.

Each row is one sequence at one position: its history is the sequence's output so far plus the
draft tokens ahead of that position, so speculative verification sees exactly what plain
decoding would (engines/spec/verify.py).
"""

from __future__ import annotations

import torch

from engines.sampling_params import SamplingParams
from engines.sequence import Sequence


def adjusts(params: SamplingParams) -> bool:
    return (params.allowed_token_ids is not None or bool(params.bad_words_token_ids) or bool(params.logit_bias)
            or params.min_tokens > 0 or params.repetition_penalty != 1.0 or params.uses_penalties)


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
        constrained = p.grammar is not None
        if seq.allowed_ids is not None:
            _keep_only(row, seq.allowed_ids, constrained)
        if p.bad_words_token_ids:
            _ban(row, _bad_word_ends(output, p.bad_words_token_ids), constrained)
        if p.logit_bias:
            ids = torch.tensor(list(p.logit_bias), device=row.device)
            row.index_add_(0, ids, torch.tensor(list(p.logit_bias.values()), dtype=row.dtype, device=row.device))
        if len(output) < p.min_tokens:
            _ban(row, p.stop_token_set(eos_token_ids), constrained)
        if p.repetition_penalty != 1.0:
            _repetition(row, seq.prompt_ids + output, p.repetition_penalty)
        if p.uses_penalties and output:
            ids = torch.tensor(output, device=row.device)
            counts = torch.zeros_like(row).index_add_(0, ids, torch.ones(len(ids), dtype=row.dtype, device=row.device))
            row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)
    return logits


def _ban(row: torch.Tensor, token_ids, constrained: bool) -> None:
    """`token_ids` (those inside the vocabulary) at -inf."""
    ids = [t for t in token_ids if t < row.shape[0]]
    if ids:
        _settle(row, row.index_fill(0, torch.tensor(ids, device=row.device), float("-inf")), constrained)


def _keep_only(row: torch.Tensor, allowed: torch.Tensor, constrained: bool) -> None:
    allowed = allowed.to(row.device)
    kept = torch.full_like(row, float("-inf")).index_copy_(0, allowed, row.index_select(0, allowed))
    _settle(row, kept, constrained)


def _settle(row: torch.Tensor, masked: torch.Tensor, constrained: bool) -> None:
    """`row` becomes `masked`, unless a grammar's row would be left with no token (see above)."""
    if constrained and not bool(torch.isfinite(masked).any()):
        return
    row.copy_(masked)


def _bad_word_ends(output: list[int], words: tuple[tuple[int, ...], ...]) -> set[int]:
    """The last token of every bad word whose other tokens the output ends with (a one-token
    word always): the token that would complete it now."""
    ends, tails = set(), {}
    for word in words:
        n = len(word) - 1
        if n == 0:
            ends.add(word[0])
            continue
        if n not in tails:
            tails[n] = tuple(output[-n:]) if len(output) >= n else None
        if tails[n] == word[:-1]:
            ends.add(word[-1])
    return ends


def _repetition(row: torch.Tensor, seen: list[int], penalty: float) -> None:
    """The CTRL paper's rule as HF and vLLM apply it, over the prompt and the output: a seen
    token's positive logit divided by the penalty, a negative one multiplied."""
    ids = torch.tensor(sorted(set(seen)), device=row.device)       # distinct on the host: no device sync
    values = row[ids]
    row[ids] = torch.where(values > 0, values / penalty, values * penalty)
