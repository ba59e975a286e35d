"""The routing signals a tier can read about a prompt before answering it, and how well each
separates the prompts the large tier helps from those it does not.

Every signal is a confidence (higher = surer that the small tier will do): the cascade's own
(policies.cascade.confidence over the small tier's first K greedy tokens, as mean logprob or
mean entropy) at several K, and the small tier's mean logprob of the prompt itself, which the
prefill gives for free. Each one is swept as a cascade on its own; the code signal
(policies.request_signals) is a yes/no rule and is judged by its single point.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.routing.routers import (RoutingTable, auc, average_gap_recovered, interpolate, share_key, spearman,
                                   threshold_sweep)
from policies.cascade import CascadeSignal, confidence

CANDIDATE_KS = (1, 4, 8, 16)


@dataclass(frozen=True)
class ProbeRecord:
    """What the small tier saw of one prompt: its prompt length, the prompt's mean logprob,
    and its first greedy tokens' logprobs and entropies (nats)."""
    prompt_tokens: int
    prompt_mean_logprob: float
    probe_logprobs: tuple[float, ...]
    probe_entropies: tuple[float, ...]


@dataclass(frozen=True)
class CandidateSignal:
    name: str                 # "mean_logprob@8", "mean_entropy@4", "prompt_logprob"
    signal: CascadeSignal     # the unit its thresholds are written in
    confidence: np.ndarray    # per prompt, higher = surer
    wasted_cost: np.ndarray   # CPU-s the small tier has spent when the decision falls


def probe_confidence(records: list[ProbeRecord], signal: CascadeSignal, k: int) -> np.ndarray:
    return np.array([confidence(signal, r.probe_logprobs[:k], r.probe_entropies[:k]) for r in records])


def candidate_signals(records: list[ProbeRecord], probe_cost,
                      ks: tuple[int, ...] = CANDIDATE_KS) -> list[CandidateSignal]:
    """`probe_cost(prompt_tokens, generated_tokens)`: the small tier's CPU-s for that much work."""
    prompt_tokens = np.array([r.prompt_tokens for r in records])
    out = []
    for signal in ("mean_logprob", "mean_entropy"):
        for k in ks:
            generated = np.array([min(k, len(r.probe_logprobs)) for r in records])
            out.append(CandidateSignal(f"{signal}@{k}", signal, probe_confidence(records, signal, k),
                                       probe_cost(prompt_tokens, generated)))
    # The prompt's own logprob is a mean logprob too, known once the prefill is done.
    prompt_conf = np.array([r.prompt_mean_logprob for r in records])
    out.append(CandidateSignal("prompt_logprob", "mean_logprob", prompt_conf, probe_cost(prompt_tokens, 0)))
    return out


def large_helps(table: RoutingTable) -> np.ndarray:
    """The label a signal should predict: the prompt gains more than the median prompt from large."""
    return table.gain > np.median(table.gain)


def judge_signal(table: RoutingTable, candidate: CandidateSignal, share: float,
                 forced_large: np.ndarray | None = None) -> dict:
    """The signal's sweep as a cascade alone, its AUC and rank correlation against the gain
    (doubt = -confidence), its APGR, and its gap recovered at `share`, alone and behind the
    code signal."""
    sweep = threshold_sweep(table, candidate.confidence, candidate.signal, wasted_cost=candidate.wasted_cost)
    doubt = -candidate.confidence
    entry = {
        "auc_large_helps": auc(doubt, large_helps(table)),
        "spearman_with_gain": spearman(doubt, table.gain),
        "apgr": average_gap_recovered(table, sweep),
        share_key(share): interpolate(table, sweep, share).as_dict(),
        "sweep": [p.as_dict() for p in sweep],
    }
    if forced_large is not None:
        with_code = threshold_sweep(table, candidate.confidence, candidate.signal, forced_large, candidate.wasted_cost)
        entry["with_code_signal_" + share_key(share)] = interpolate(table, with_code, share).as_dict()
    return entry
