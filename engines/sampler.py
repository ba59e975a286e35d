"""Batched sampling: penalties, temperature, top-k, top-p, min-p, seeds and logprobs as
tensor operations over all rows at once."""

from __future__ import annotations

from dataclasses import dataclass

import torch

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
        if any(p.uses_penalties for p in params):
            logits = self._apply_penalties(logits.clone(), seqs)
        greedy = torch.tensor([p.greedy for p in params])
        tokens = logits.argmax(dim=-1)
        if not bool(greedy.all()):
            rows = (~greedy).nonzero().squeeze(1)
            tokens[rows] = self._sample(logits[rows], [seqs[i] for i in rows.tolist()])
        token_list = tokens.tolist()
        logprobs: list[TokenLogprob | None] = [None] * len(seqs)
        want = [i for i, p in enumerate(params) if p.logprobs]
        if want:
            lp = torch.log_softmax(raw[want], dim=-1)
            k = max(params[i].top_logprobs for i in want)
            top_vals, top_ids = lp.topk(k, dim=-1) if k else (None, None)
            for j, i in enumerate(want):
                n = params[i].top_logprobs
                top = list(zip(top_ids[j, :n].tolist(), top_vals[j, :n].tolist())) if n else []
                logprobs[i] = TokenLogprob(token_list[i], float(lp[j, token_list[i]]), top)
        return SampleResult(token_list, logprobs)

    @staticmethod
    def _apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        for i, seq in enumerate(seqs):
            p = seq.params
            if not p.uses_penalties or not seq.output_ids:
                continue
            ids = torch.tensor(seq.output_ids)
            counts = torch.zeros(logits.shape[1], dtype=logits.dtype).index_add_(0, ids, torch.ones(len(ids)))
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
        return logits

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        params = [s.params for s in seqs]
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
        # Exponential race: argmax(p / E) with E ~ Exp(1) draws from p; a per-request
        # generator makes seeded requests reproducible whatever else is in the batch.
        noise = torch.empty_like(probs)
        seeded = [i for i, s in enumerate(seqs) if s.generator is not None]
        if len(seeded) < len(seqs):
            noise.exponential_(generator=self.generator)
        for i in seeded:
            noise[i].exponential_(generator=seqs[i].generator)
        return (probs / noise).argmax(dim=-1)
