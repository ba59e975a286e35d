"""Verification of draft tokens: the exact rule that keeps the target's distribution.

For draft x_j drawn from q_j, with p_j the target's processed distribution at that
position (the request's own adjustments, engines/logit_adjust.py, over the history including
the earlier drafts; temperature, top-k/p, min-p): accept with probability
min(1, p_j(x_j) / q_j(x_j)); at the first rejection draw from normalize(max(0, p_j - q_j)) and stop; when all k are accepted draw a bonus token
from p_k. A point-mass proposal (n-gram) has q_j = one-hot(x_j). Greedy requests accept
while the draft equals the target's argmax and then take the target's argmax. Seeded requests
accept while the draft equals the target's own draw at that position (see _seeded), so that a
seed names one text, with or without drafts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engines.sampler import Sampler, TokenLogprob
from engines.sequence import Sequence


@dataclass
class SpecGroup:
    seq: Sequence
    row: int                        # logits row of the sequence's last token; drafts follow
    drafts: list[int]
    q: torch.Tensor | None          # [len(drafts), V] draft distributions; None: point mass


@dataclass
class Verdict:
    num_accepted: int
    tokens: list[int]               # the accepted drafts, then the target's own token
    logprobs: list[TokenLogprob] | None


def accept_probability(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """min(1, p(x) / q(x)) per draft token (q(x) > 0: x was drawn from q)."""
    return (p_x / q_x.clamp_min(torch.finfo(q_x.dtype).tiny)).clamp_max(1.0)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """What to draw from after rejecting a draft: max(0, p - q) (unnormalized)."""
    return (p - q).clamp_min(0.0)


def verify(logits: torch.Tensor, groups: list[SpecGroup], sampler: Sampler) -> list[Verdict]:
    rows = [g.row + j for g in groups for j in range(len(g.drafts) + 1)]
    params = [g.seq.params for g in groups for _ in range(len(g.drafts) + 1)]
    raw = logits[rows]
    processed = sampler.adjust(raw, [g.seq for g in groups for _ in range(len(g.drafts) + 1)],
                               [g.drafts[:j] for g in groups for j in range(len(g.drafts) + 1)])
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    probs = sampler.probs(processed[sampled], [params[i] for i in sampled]) if sampled else None
    prob_row = {r: i for i, r in enumerate(sampled)}
    # Greedy rows' argmaxes come to the host in one copy for all groups.
    best = processed.argmax(dim=-1).tolist() if len(sampled) < len(params) else []
    verdicts = []
    offset = 0
    for g in groups:
        n = len(g.drafts) + 1
        if g.seq.params.greedy:
            m, token = _greedy(best[offset:offset + n], g.drafts)
        else:
            p = probs[prob_row[offset]:prob_row[offset] + n]
            m, token = _sampled(p, g, sampler)
        tokens = g.drafts[:m] + [token]
        lps = None
        if g.seq.params.logprobs:
            lps = sampler.logprobs(raw[offset:offset + m + 1], tokens, [g.seq.params] * (m + 1))
        verdicts.append(Verdict(m, tokens, lps))
        offset += n
    return verdicts


def _greedy(best: list[int], drafts: list[int]) -> tuple[int, int]:
    m = 0
    while m < len(drafts) and drafts[m] == best[m]:
        m += 1
    return m, best[m]


def _sampled(p: torch.Tensor, g: SpecGroup, sampler: Sampler) -> tuple[int, int]:
    if g.seq.draws is not None:
        return _seeded(p, g, sampler)
    k = len(g.drafts)
    device = p.device
    drafts = torch.tensor(g.drafts, device=device)
    rows = torch.arange(k, device=device)
    p_x = p[rows, drafts]
    q_x = torch.ones(k, device=device) if g.q is None else g.q[rows, drafts]
    # The k acceptance probabilities come to the host (where the uniforms are drawn) in one copy.
    accepted = sampler.uniform(k) < accept_probability(p_x, q_x).cpu()     # u ~ U[0, 1)
    m = k if bool(accepted.all()) else int((~accepted).nonzero()[0])
    if m == k:
        weights = p[k]
    else:
        q_m = g.q[m] if g.q is not None else torch.zeros_like(p[m]).index_fill_(0, drafts[m:m + 1], 1.0)
        weights = residual(p[m], q_m)
        if not bool((weights > 0).any()):
            weights = p[m]   # p == q: a rejection had probability 0; guards rounding only
    return m, int(sampler.draw(weights.unsqueeze(0), [None])[0])


def _seeded(p: torch.Tensor, g: SpecGroup, sampler: Sampler) -> tuple[int, int]:
    """The target samples every position itself, with that position's own uniform; a draft is
    accepted while it equals the target's token. Each emitted token is then exactly the one
    plain decoding draws at its position, whatever k was. For a point-mass draft this accepts
    with probability p(x), as the rule above does; a model draft drawn with the same uniform
    (engines/spec/model_draft.py) agrees with the target wherever their CDFs overlap."""
    k = len(g.drafts)
    own = sampler.draw(p, [g.seq.uniform_at(j) for j in range(k + 1)]).tolist()
    return _greedy(own, g.drafts)
