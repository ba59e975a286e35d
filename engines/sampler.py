"""Batched sampling: penalties, temperature, top-k, top-p, min-p, seeds and logprobs as
tensor operations over all rows at once.

The pieces (`penalize`, `probs`, `draw`, `logprobs`) are also used by speculative decoding,
whose exact acceptance rule works on the same processed distributions (engines/spec/).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engines.sampling_params import SamplingParams
from engines.sequence import Sequence


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]   # (token id, logprob), best first


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]


class Sampler:
    def __init__(self, seed: int | None = None):
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(seed)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> SampleResult:
        params = [s.params for s in seqs]
        raw = logits
        logits = self.penalize(logits, params, [s.output_ids for s in seqs])
        greedy = torch.tensor([p.greedy for p in params])
        tokens = logits.argmax(dim=-1)
        if not bool(greedy.all()):
            rows = (~greedy).nonzero().squeeze(1)
            picked = rows.tolist()
            probs = self.probs(logits[rows], [params[i] for i in picked])
            tokens[rows] = self.draw(probs, [seqs[i].generator for i in picked])
        token_list = tokens.tolist()
        return SampleResult(token_list, self.logprobs(raw, token_list, params))

    # ---- the pieces ------------------------------------------------------------------
    @staticmethod
    def penalize(logits: torch.Tensor, params: list[SamplingParams], histories: list[list[int]]) -> torch.Tensor:
        """Presence/frequency penalties over each row's own history (a copy when any applies)."""
        if not any(p.uses_penalties for p in params):
            return logits
        logits = logits.clone()
        for i, (p, history) in enumerate(zip(params, histories)):
            if not p.uses_penalties or not history:
                continue
            ids = torch.tensor(history)
            counts = torch.zeros(logits.shape[1], dtype=logits.dtype).index_add_(0, ids, torch.ones(len(ids)))
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
        return logits

    @staticmethod
    def probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """The distribution each (non-greedy) row samples from: temperature, top-k, top-p, min-p."""
        temps = torch.tensor([p.temperature for p in params], dtype=logits.dtype).unsqueeze(1)
        logits = logits / temps
        top_k = [p.top_k for p in params]
        if any(top_k):
            k = torch.tensor([k if k else logits.shape[1] for k in top_k]).clamp(max=logits.shape[1])
            kth = logits.sort(dim=-1, descending=True).values.gather(1, (k - 1).unsqueeze(1))
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        top_p = torch.tensor([p.top_p for p in params], dtype=probs.dtype)
        if bool((top_p < 1).any()):
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            # Keep the smallest prefix whose mass reaches top_p (the top token always stays).
            drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= top_p.unsqueeze(1)
            drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
            probs = probs.masked_fill(drop, 0.0)
        min_p = torch.tensor([p.min_p for p in params], dtype=probs.dtype)
        if bool((min_p > 0).any()):
            floor = probs.max(dim=-1, keepdim=True).values * min_p.unsqueeze(1)
            probs = probs.masked_fill(probs < floor, 0.0)
        return probs

    def draw(self, weights: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
        """One token per row, drawn proportionally to `weights` (need not be normalized).

        Exponential race: argmax(w / E) with E ~ Exp(1) draws from w; a per-request
        generator makes seeded requests reproducible whatever else is in the batch.
        """
        noise = torch.empty_like(weights)
        seeded = [i for i, g in enumerate(generators) if g is not None]
        if len(seeded) < len(generators):
            noise.exponential_(generator=self.generator)
        for i in seeded:
            noise[i].exponential_(generator=generators[i])
        return (weights / noise).argmax(dim=-1)

    def uniform(self, n: int, generator: torch.Generator | None) -> torch.Tensor:
        return torch.rand(n, generator=generator or self.generator)

    @staticmethod
    def logprobs(raw: torch.Tensor, tokens: list[int], params: list[SamplingParams]) -> list[TokenLogprob | None]:
        """Logprobs of the chosen tokens under the model's own distribution (raw logits)."""
        out: list[TokenLogprob | None] = [None] * len(tokens)
        want = [i for i, p in enumerate(params) if p.logprobs]
        if not want:
            return out
        lp = torch.log_softmax(raw[want], dim=-1)
        k = max(params[i].top_logprobs for i in want)
        top_vals, top_ids = lp.topk(k, dim=-1) if k else (None, None)
        for j, i in enumerate(want):
            n = params[i].top_logprobs
            top = list(zip(top_ids[j, :n].tolist(), top_vals[j, :n].tolist())) if n else []
            out[i] = TokenLogprob(tokens[i], float(lp[j, tokens[i]]), top)
        return out
