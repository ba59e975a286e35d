"""From per-prompt measurements to every router's figures: the baselines (small-only,
large-only, oracle, random), tiergate's router (code signal + cascade) across its threshold
sweep, the candidate signals, and the headline ratio against random at one share."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.routing.cost import TierCost
from bench.routing.probes import Probe
from bench.routing.routers import (RoutingTable, evaluate, interpolate, large_only, oracle_curve, random_expected,
                                   random_sampled_curve, score_curve, share_key, small_only, threshold_sweep)
from bench.routing.scoring import ExchangeScore
from bench.routing.signals import ProbeRecord, candidate_signals, judge_signal, probe_confidence
from bench.routing.uncertainty import ratio_interval
from policies.cascade import CascadeSignal

RANDOM_GRID = tuple(i / 20 for i in range(21))


@dataclass(frozen=True)
class PromptMeasurement:
    prompt_id: str
    record_index: int
    code_reason: str | None     # policies.request_signals.code_signal of the question
    small: ExchangeScore        # with the prompt's mean logprob
    large: ExchangeScore
    probe: Probe                # the small tier's first greedy tokens
    language_reason: str | None = None   # policies.language_signal.language_signal of the question
    predicted_gain: float | None = None  # the learned router's prediction for the question (bits per byte)


def routing_table(rows: list[PromptMeasurement], small_cost: TierCost, large_cost: TierCost) -> RoutingTable:
    """Each tier answers with the reference's length in its own tokens."""
    def cost(tier: TierCost, scores: list[ExchangeScore]) -> np.ndarray:
        return tier.request([s.prompt_tokens for s in scores], [s.answer_tokens for s in scores])

    small, large = [r.small for r in rows], [r.large for r in rows]
    return RoutingTable(np.array([s.bits_per_byte for s in small]), np.array([s.bits_per_byte for s in large]),
                        cost(small_cost, small), cost(large_cost, large))


def probe_records(rows: list[PromptMeasurement]) -> list[ProbeRecord]:
    return [ProbeRecord(r.small.prompt_tokens, r.small.prompt_mean_logprob or 0.0, r.probe.logprobs,
                        r.probe.entropies) for r in rows]


def _sweep_entry(table: RoutingTable, sweep, share: float, **extra) -> dict:
    return {**extra, share_key(share): interpolate(table, sweep, share).as_dict(),
            "sweep": [p.as_dict() for p in sweep]}


@dataclass(frozen=True)
class RoutingEvaluation:
    table: RoutingTable
    routers: dict               # name -> figures (JSON-ready)
    signals: dict               # candidate signal -> figures (JSON-ready)
    share: float
    router_vs_random: float | None   # tiergate's gap recovered at `share` / random's (= share)
    # its bootstrap interval over the prompts (bench.routing.uncertainty), for a router that
    # ranks prompts by one score (the learned gain model); None for the rules and cascade
    router_vs_random_interval: dict | None = None


def evaluate_routers(rows: list[PromptMeasurement], small_cost: TierCost, large_cost: TierCost, probe_tokens: int,
                     signal: CascadeSignal, share: float = 0.30, seed: int = 0,
                     gain_threshold: float | None = None, gain_reads_prefill: bool = False) -> RoutingEvaluation:
    """tiergate's router is the learned gain model when the rows carry its predictions (every
    threshold swept; `gain_threshold`, the config's, also reported as the one point it gives),
    else the hand-written rules (code, non-English) with the cascade behind them. A gain model
    that reads the prefill is a cascade: every prompt starts on small, and the ones it escalates
    have paid the small tier's prefill and first token."""
    table = routing_table(rows, small_cost, large_cost)
    probes = probe_records(rows)
    is_code = np.array([r.code_reason is not None for r in rows])
    # what the default config's rules send to large before any tier runs: code, then non-English
    forced = is_code | np.array([r.language_reason is not None for r in rows])
    prompt_tokens = np.array([p.prompt_tokens for p in probes])
    generated = np.array([min(probe_tokens, len(p.probe_logprobs)) for p in probes])
    wasted = small_cost.probe(prompt_tokens, generated)
    cascade_conf = probe_confidence(probes, signal, probe_tokens)
    rules_cascade = threshold_sweep(table, cascade_conf, signal, forced, wasted)
    cascade = threshold_sweep(table, cascade_conf, signal, wasted_cost=wasted)
    rules_entry = _sweep_entry(table, rules_cascade, share, description=(
        f"code and non-English prompts to large; the rest start on small and escalate when {signal} over the first "
        f"{probe_tokens} greedy tokens falls short of the threshold"), signal=signal, tokens=probe_tokens,
        min_share=rules_cascade[0].share)
    learned = all(r.predicted_gain is not None for r in rows)
    predicted = np.array([r.predicted_gain for r in rows]) if learned else None
    if learned and gain_reads_prefill:
        prefill_wasted = small_cost.probe(prompt_tokens, np.ones(len(rows)))
        gain_sweep = threshold_sweep(table, -predicted, "predicted_gain", wasted_cost=prefill_wasted)
        tiergate_entry = _sweep_entry(table, gain_sweep, share, description=(
            "the learned gain model (policies/gain_model.py) as a cascade: every prompt starts on small, and those "
            "whose gain predicted from the text and the small tier's prefill (its hidden states at the prompt "
            "rows the model reads) is above the threshold escalate with their first token, their small prefill "
            "counted as wasted"), signal="predicted_gain", tokens=1)
        if gain_threshold is not None:
            escalated = predicted > gain_threshold
            tiergate_entry["at_config_threshold"] = evaluate(table, escalated, np.where(escalated, prefill_wasted, 0.0),
                                                             threshold=gain_threshold).as_dict()
    elif learned:
        gain_sweep = score_curve(table, predicted)
        tiergate_entry = _sweep_entry(table, gain_sweep, share, description=(
            "the learned gain model (policies/gain_model.py): prompts whose predicted gain is at or above the "
            "threshold go to large, from the text alone (no small-tier work wasted)"), signal="predicted_gain")
        if gain_threshold is not None:
            tiergate_entry["at_config_threshold"] = evaluate(table, predicted >= gain_threshold,
                                                             threshold=gain_threshold).as_dict()
    else:
        tiergate_entry = rules_entry
    oracle = oracle_curve(table)
    sampled = random_sampled_curve(table, seed)
    routers = {
        "small_only": small_only(table).as_dict(),
        "large_only": large_only(table).as_dict(),
        "oracle": {share_key(share): interpolate(table, oracle, share).as_dict(),
                   "curve": [p.as_dict() for p in oracle]},
        "random": {
            share_key(share): random_expected(table, share).as_dict(),
            "expected": [random_expected(table, s).as_dict() for s in RANDOM_GRID],
            "sampled": {"seed": seed, share_key(share): interpolate(table, sampled, share).as_dict(),
                        "curve": [p.as_dict() for p in sampled]},
        },
        "code_signal": evaluate(table, is_code).as_dict(),
        "prompt_signals": evaluate(table, forced).as_dict(),
        "tiergate": tiergate_entry,
        "rules_and_cascade": rules_entry,
        "cascade_only": _sweep_entry(table, cascade, share, signal=signal, tokens=probe_tokens),
    }
    signals = {c.name: judge_signal(table, c, share, forced)
               for c in candidate_signals(probes, small_cost.probe)}
    router_gap = routers["tiergate"][share_key(share)]["gap_recovered"]
    random_gap = routers["random"][share_key(share)]["gap_recovered"]
    ratio = router_gap / random_gap if router_gap is not None and random_gap else None
    interval = ratio_interval(table, predicted, share, seed=seed) if learned and ratio is not None else None
    return RoutingEvaluation(table, routers, signals, share, ratio, interval)
