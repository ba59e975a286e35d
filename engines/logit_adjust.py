"""What a request's own settings do to its logits before temperature and the filters:
allowed_token_ids, bad_words, logit_bias, the ban on stopping before min_tokens, and the
repetition, frequency and presence penalties. In that order, as vLLM applies them (a bias
cannot bring back a token the allowed list rules out, since -inf + b is -inf; a bias can flip a
logit's sign, which the repetition penalty then reads).

A ban (bad words, min_tokens) or an allowed list that would leave a row no token at all is not
applied to that row: a row with nothing left cannot be sampled (greedy would take token 0,
sampling a NaN distribution), and a grammar's output must stay valid. The request's own
constraints then give way in the order they came: the allowed list before the bans, the
grammar before everything.

Each row is one sequence at one position: its history is the sequence's output so far plus the
draft tokens ahead of that position, so speculative verification sees exactly what plain
decoding would (engines/spec/verify.py). The request's fixed token sets become tensors once, on
first use (Sequence.adjust_cache), not at every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engines.sequence import Sequence


@dataclass
class _Prepared:
    """A request's fixed token sets as tensors on the logits' device, ids past the vocabulary dropped."""
    device: torch.device
    allowed: torch.Tensor | None
    stop: torch.Tensor | None              # what min_tokens bans: EOS and stop_token_ids
    bad_singles: torch.Tensor | None       # one-token bad words: banned at every position
    bad_longer: tuple[tuple[int, ...], ...]
    bias_ids: torch.Tensor | None
    bias_values: torch.Tensor | None
    prompt_ids: torch.Tensor | None        # the prompt's distinct ids, for the repetition penalty


def adjusts(seq: Sequence, num_output: int) -> bool:
    """Whether the sequence's row after `num_output` tokens changes at all."""
    p = seq.params
    return (p.allowed_token_ids is not None or bool(p.bad_words_token_ids) or bool(p.logit_bias)
            or num_output < p.min_tokens or p.repetition_penalty != 1.0 or p.uses_penalties)


def adjust_logits(logits: torch.Tensor, seqs: list[Sequence], drafts: list[list[int]] | None = None) -> torch.Tensor:
    """`logits` row i adjusted for seqs[i] after its output plus drafts[i] (a copy when any row
    changes; the raw logits stay what logprobs read)."""
    extra = [len(d) for d in drafts] if drafts else [0] * len(seqs)
    rows = [i for i, seq in enumerate(seqs) if adjusts(seq, len(seq.output_ids) + extra[i])]
    if not rows:
        return logits
    logits = logits.clone()
    for i in rows:
        seq, p = seqs[i], seqs[i].params
        output = seq.output_ids + drafts[i] if drafts else seq.output_ids
        row = logits[i]                                    # a view: edits land in `logits`
        ready = _prepared(seq, row)
        if ready.allowed is not None:
            kept = torch.full_like(row, float("-inf")).index_copy_(0, ready.allowed, row.index_select(0, ready.allowed))
            _settle(row, kept)
        if ready.bad_singles is not None or ready.bad_longer:
            _ban(row, ready.bad_singles, _bad_word_ends(output, ready.bad_longer))
        if ready.bias_ids is not None:
            row.index_add_(0, ready.bias_ids, ready.bias_values.to(row.dtype))
        if len(output) < p.min_tokens and ready.stop is not None:
            _ban(row, ready.stop, ())
        if ready.prompt_ids is not None:
            # Duplicated ids are read before any write and all get the same value: no need to dedupe.
            seen = torch.cat([ready.prompt_ids, torch.tensor(output, dtype=torch.long, device=row.device)])
            values = row[seen]
            row[seen] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
        if p.uses_penalties and output:
            ids = torch.tensor(output, device=row.device)
            counts = torch.zeros_like(row).index_add_(0, ids, torch.ones(len(ids), dtype=row.dtype, device=row.device))
            row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)
    return logits


def _prepared(seq: Sequence, row: torch.Tensor) -> _Prepared:
    ready = seq.adjust_cache
    if ready is None or ready.device != row.device:
        ready = seq.adjust_cache = _prepare(seq, row.shape[0], row.device)
    return ready


def _prepare(seq: Sequence, vocab: int, device: torch.device) -> _Prepared:
    p = seq.params

    def ids(values) -> torch.Tensor | None:
        inside = sorted({t for t in values if t < vocab})
        return torch.tensor(inside, dtype=torch.long, device=device) if inside else None

    bias = {t: b for t, b in p.logit_bias.items() if t < vocab}
    return _Prepared(
        device=device,
        allowed=ids(p.allowed_token_ids) if p.allowed_token_ids is not None else None,
        stop=ids(seq.stop_ids) if p.min_tokens else None,
        bad_singles=ids(w[0] for w in p.bad_words_token_ids if len(w) == 1),
        bad_longer=tuple(w for w in p.bad_words_token_ids if len(w) > 1),
        bias_ids=torch.tensor(list(bias), dtype=torch.long, device=device) if bias else None,
        bias_values=torch.tensor(list(bias.values()), device=device) if bias else None,
        prompt_ids=ids(seq.prompt_ids) if p.repetition_penalty != 1.0 else None,
    )


def _ban(row: torch.Tensor, fixed: torch.Tensor | None, more: set[int] | tuple) -> None:
    """The `fixed` ids and the `more` ones (those inside the vocabulary) at -inf."""
    if more:
        more_ids = torch.tensor([t for t in more if t < row.shape[0]], dtype=torch.long, device=row.device)
        fixed = more_ids if fixed is None else torch.cat([fixed, more_ids])
    if fixed is not None and fixed.numel():
        _settle(row, row.index_fill(0, fixed, float("-inf")))


def _settle(row: torch.Tensor, masked: torch.Tensor) -> None:
    """`row` becomes `masked`, unless that leaves no token (see the module's note). One check
    per masked row: a device sync on a GPU, paid only by requests that ban or allow tokens."""
    if bool(torch.isfinite(masked).any()):
        row.copy_(masked)


def _bad_word_ends(output: list[int], words: tuple[tuple[int, ...], ...]) -> set[int]:
    """The last token of every bad word whose other tokens the output ends with: the token that
    would complete it now."""
    ends, tails = set(), {}
    for word in words:
        n = len(word) - 1
        if n not in tails:
            tails[n] = tuple(output[-n:]) if len(output) >= n else None
        if tails[n] == word[:-1]:
            ends.add(word[-1])
    return ends
