"""Batched sampling: the requests' logit adjustments, temperature, top-k, top-p, min-p, seeds
and logprobs as tensor operations over all rows at once.

Logprobs (and, for requests that ask, the entropy of the distribution each token came from) are
taken from the model's own distribution: the raw logits, before penalties, temperature and
filters, so that they say how sure the model was whatever the request's sampling settings (a
greedy request's sampling distribution is a point mass, whose entropy says nothing).

The pieces (`adjust`, `probs`, `draw`, `logprobs`) are also used by speculative decoding,
whose exact acceptance rule works on the same processed distributions (engines/spec/).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engines.grammar.mask import MaskBuilder, apply_masks, unpack
from engines.logit_adjust import adjust_logits
from engines.sampling_params import SamplingParams
from engines.sequence import Sequence


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float | None          # None only for a prompt's first token (prompt logprobs): nothing predicts it
    top: list[tuple[int, float]]   # (token id, logprob), best first
    entropy: float | None = None   # nats, of the model's distribution at this position (if asked)
    rank: int | None = None        # the token's rank in that distribution, 1 = likeliest (prompt logprobs)


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]


# Top-k and top-p look at this many best tokens of each row first (a partial selection), and
# sort the whole vocabulary only for rows whose filter reaches past them.
CANDIDATES = 1024


def _top_p(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep each row's smallest prefix of tokens, best first, whose mass reaches top_p (the top
    token always stays). On a CPU, rows whose best CANDIDATES tokens already reach it are cut
    there and only the others are sorted whole; elsewhere every row is sorted (a GPU sorts fast,
    and deciding which rows need it would wait for the device)."""
    if probs.device.type != "cpu":
        return _top_p_sorted(probs, top_p)
    k = min(CANDIDATES, probs.shape[1])
    values, order = probs.topk(k, dim=-1)
    before = values.cumsum(-1) - values                       # mass ahead of each candidate
    reached = (before[:, -1] + values[:, -1]) >= top_p         # the candidates hold top_p's mass
    keep = before < top_p.unsqueeze(1)
    out = torch.zeros_like(probs).scatter_(1, order, torch.where(keep, values, 0.0))
    if not bool(reached.all()):
        rows = (~reached).nonzero().squeeze(1)
        out[rows] = _top_p_sorted(probs[rows], top_p[rows])
    return out


def _top_p_sorted(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= top_p.unsqueeze(1)
    drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
    return probs.masked_fill(drop, 0.0)


class Sampler:
    """Works on logits of any device: the tensors it builds follow them, and the sampled ids
    come back to the host once per call (one .tolist())."""

    def __init__(self, seed: int | None = None):
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(seed)
        self._device_generators: dict[torch.device, torch.Generator] = {}
        self.masks = MaskBuilder()

    def generator_for(self, device: torch.device) -> torch.Generator:
        """The sampler's generator on `device` (CUDA draws need a CUDA generator), seeded like the CPU one."""
        if device.type == "cpu":
            return self.generator
        gen = self._device_generators.get(device)
        if gen is None:
            gen = self._device_generators[device] = torch.Generator(device)
            gen.manual_seed(self.generator.initial_seed())
        return gen

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> SampleResult:
        params = [s.params for s in seqs]
        raw = logits
        logits = self.constrain(logits, seqs)
        logits = self.adjust(logits, seqs)
        picked = [i for i, p in enumerate(params) if not p.greedy]
        if len(picked) == len(params):      # every row samples: no row index to build (or copy)
            tokens = self.draw(self.probs(logits, params), [s.uniform_at() for s in seqs])
        else:
            # max's indices are argmax's (the first of equal maxima), at a third of its time on CPUs
            tokens = logits.max(dim=-1).indices
        if picked and len(picked) < len(params):
            rows = torch.tensor(picked, device=logits.device)
            probs = self.probs(logits[rows], [params[i] for i in picked])
            tokens[rows] = self.draw(probs, [seqs[i].uniform_at() for i in picked])
        token_list = tokens.tolist()
        return SampleResult(token_list, self.logprobs(raw, token_list, params))

    # ---- the pieces ------------------------------------------------------------------
    def constrain(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Tokens each constrained row's grammar rules out at -inf: one bitmask for all those
        rows, applied at once; unconstrained rows (and the raw logits that logprobs read) as they were."""
        rows = [i for i, s in enumerate(seqs) if s.grammar is not None]
        if not rows:
            return logits
        bitmask = self.masks.bitmask([seqs[i].grammar for i in rows], logits.shape[1])
        return apply_masks(logits, rows, unpack(bitmask, logits.shape[1]))

    def adjust(self, logits: torch.Tensor, seqs: list[Sequence], drafts: list[list[int]] | None = None) -> torch.Tensor:
        """Each row's own adjustments: allowed ids, bad words, logit_bias, min_tokens and
        penalties (engines/logit_adjust.py); row i is seqs[i] after its output plus drafts[i]
        when given."""
        return adjust_logits(logits, seqs, drafts)

    @staticmethod
    def probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """The distribution each (non-greedy) row samples from: temperature, top-k, top-p, min-p."""
        # The settings as one host table: which filters apply is decided on the host (no device
        # sync) and the table reaches the logits' device in one copy.
        host = torch.tensor([[p.temperature, p.top_p, p.min_p] for p in params], dtype=logits.dtype)
        use_top_p, use_min_p = bool((host[:, 1] < 1).any()), bool((host[:, 2] > 0).any())
        table = host.to(logits.device)
        temps, top_p, min_p = table[:, 0:1], table[:, 1], table[:, 2]
        logits = logits / temps
        top_k = [p.top_k for p in params]
        if any(top_k):
            vocab = logits.shape[1]
            # Clamped before the tensor is built: a k past int64 must not overflow it.
            ks = [min(k, vocab) if k > 0 else vocab for k in top_k]
            k = torch.tensor(ks, device=logits.device)
            # The k-th largest value by a partial selection when every k is small (a full sort of
            # the vocabulary per row costs ~100x more on a CPU); rows without top-k keep all.
            kmax = max(k for k, asked in zip(ks, top_k) if asked > 0)
            ranked = logits.topk(kmax, dim=-1).values if kmax <= CANDIDATES else logits.sort(dim=-1, descending=True).values
            kth = ranked.gather(1, (k.clamp(max=ranked.shape[1]) - 1).unsqueeze(1))
            unfiltered = torch.tensor([asked <= 0 for asked in top_k], device=logits.device).unsqueeze(1)
            logits = logits.masked_fill((logits < kth) & ~unfiltered, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if use_top_p:
            probs = _top_p(probs, top_p)
        if use_min_p:
            floor = probs.max(dim=-1, keepdim=True).values * min_p.unsqueeze(1)
            probs = probs.masked_fill(probs < floor, 0.0)
        return probs

    def draw(self, weights: torch.Tensor, uniforms: list[float | None]) -> torch.Tensor:
        """One token per row, drawn proportionally to `weights` (need not be normalized).

        Inverse CDF: one uniform per row, placed in the row's running sum (float64, so that the
        last of ~150k terms still counts), instead of one random number per vocabulary entry
        (drawing those cost more than the model's step at batch 32 on a CPU). A row's uniform is
        the one given for it (a seeded request's, by output position: engines/position_draws.py,
        which makes seeded requests reproducible whatever else is in the batch, on any device),
        or, where None is given, drawn from the engine's shared generator.
        """
        n = weights.shape[0]
        values = torch.empty(n, dtype=torch.float64)
        given = [(i, u) for i, u in enumerate(uniforms) if u is not None]
        if len(given) < n:
            values.uniform_(generator=self.generator)
        if given:
            rows, fixed = zip(*given)
            values[list(rows)] = torch.tensor(fixed, dtype=torch.float64)
        cdf = weights.to(torch.float64).cumsum(dim=-1)
        target = (values.to(weights.device) * cdf[:, -1]).unsqueeze(1)
        # The first entry whose running sum passes the target; a zero-weight entry never does.
        index = torch.searchsorted(cdf, target, right=True).squeeze(1)
        return index.clamp_(max=weights.shape[1] - 1)

    def uniform(self, n: int) -> torch.Tensor:
        """n draws from U[0, 1) on the host from the shared generator (callers compare them with host values)."""
        return torch.rand(n, generator=self.generator)

    @staticmethod
    def logprobs(raw: torch.Tensor, tokens: list[int], params: list[SamplingParams]) -> list[TokenLogprob | None]:
        """Logprobs of the chosen tokens under the model's own distribution (raw logits)."""
        out: list[TokenLogprob | None] = [None] * len(tokens)
        want = [i for i, p in enumerate(params) if p.logprobs]
        if not want:
            return out
        lp = torch.log_softmax(raw[want], dim=-1)
        chosen, tops = chosen_and_top(lp, [tokens[i] for i in want], [params[i].top_logprobs for i in want])
        entropies = _entropies(lp, [params[i].entropy for i in want])
        for j, (i, value) in enumerate(zip(want, chosen.tolist())):
            out[i] = TokenLogprob(tokens[i], value, tops[j], entropies[j])
        return out


def chosen_and_top(lp: torch.Tensor, tokens: list[int], counts: list[int]) -> tuple[torch.Tensor, list[list[tuple[int, float]]]]:
    """Row j of `lp` (log-probabilities): the logprob of tokens[j] (a tensor, on lp's device) and
    its counts[j] likeliest (token id, logprob). Each tensor comes to the host once (.tolist()),
    not once per row."""
    chosen = lp.gather(1, torch.tensor(tokens, device=lp.device).unsqueeze(1)).squeeze(1)
    k = max(counts)
    if not k:
        return chosen, [[] for _ in counts]
    values, order = lp.topk(k, dim=-1)
    values, order = values.tolist(), order.tolist()
    return chosen, [list(zip(order[j][:n], values[j][:n])) for j, n in enumerate(counts)]


def _entropies(lp: torch.Tensor, asked: list[bool]) -> list[float | None]:
    """-sum(p log p) of the rows of `lp` (log-probabilities) whose request asked for it. A token
    the model rules out (logprob -inf) adds nothing (0 * -inf is taken as 0)."""
    out: list[float | None] = [None] * len(asked)
    rows = [j for j, a in enumerate(asked) if a]
    if not rows:
        return out
    sub = lp if len(rows) == len(asked) else lp[rows]
    plogp = torch.nan_to_num(sub.exp() * sub, nan=0.0)      # 0 * -inf is nan: taken as 0
    values = (-plogp.sum(dim=-1)).tolist()
    for j, value in zip(rows, values):
        out[j] = value
    return out
