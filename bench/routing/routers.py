"""The router arithmetic, RouteLLM's way: each router sends a share of the calls to the large
tier, and is judged by how much of the small-to-large quality gap it recovers at that share.

Pure functions over per-prompt arrays (bits per byte and CPU-seconds of each tier), so every
router is evaluated on the same measurements, offline, and a threshold sweep costs no model
time. Quality is bits per byte of the reference answer: lower is better.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from policies.cascade import CascadeConfig, CascadeSignal, should_escalate


@dataclass(frozen=True)
class RoutingTable:
    """One row per prompt: each tier's bits per byte and CPU-seconds for answering it."""
    small_bpb: np.ndarray
    large_bpb: np.ndarray
    small_cost: np.ndarray
    large_cost: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.small_bpb)
        if n == 0 or any(len(a) != n for a in (self.large_bpb, self.small_cost, self.large_cost)):
            raise ValueError("a routing table needs the same non-zero number of prompts in every column")

    @property
    def n(self) -> int:
        return len(self.small_bpb)

    @property
    def gain(self) -> np.ndarray:
        """What sending each prompt to large buys, in bits per byte (negative: large is worse)."""
        return self.small_bpb - self.large_bpb


@dataclass(frozen=True)
class RouterPoint:
    share: float                   # of the calls that reach the large tier
    mean_bpb: float
    gap_recovered: float | None    # None when both tiers score the same on average
    mean_cost: float               # CPU-seconds per request, wasted small-tier work included
    threshold: float | None = None

    def as_dict(self) -> dict:
        """The JSON form, with quality stated as -bits per byte (higher is better)."""
        return {**asdict(self), "quality": -self.mean_bpb}


def share_key(share: float) -> str:
    """The JSON key of a router's figures at a share: 0.3 -> "at_30"."""
    return f"at_{round(share * 100)}"


BOOTSTRAP_SUFFIX = "_bootstrap"


def ratio_key(share: float) -> str:
    """The benchmark JSON's headline key at a share: 0.3 -> "router_vs_random_at_30"; the
    ratio's bootstrap interval sits under the same key + BOOTSTRAP_SUFFIX."""
    return f"router_vs_random_{share_key(share)}"


def find_ratio_key(report: dict) -> str:
    """The headline key of a benchmark JSON, whatever share it was run at."""
    return next(k for k in report if k.startswith("router_vs_random_") and not k.endswith(BOOTSTRAP_SUFFIX))


def gap_recovered(small_bpb: float, large_bpb: float, router_bpb: float) -> float | None:
    """(small - router) / (small - large) of the mean bits per byte: 0 = small-only, 1 = large-only."""
    gap = small_bpb - large_bpb
    if abs(gap) < 1e-12:
        return None
    return (small_bpb - router_bpb) / gap


def evaluate(table: RoutingTable, to_large: np.ndarray, wasted_cost: np.ndarray | float = 0.0,
             threshold: float | None = None) -> RouterPoint:
    """A router's figures given which prompts it sends to large; `wasted_cost` is what a prompt
    sent to large had already cost on small (a cascade's probe), charged on those prompts only."""
    to_large = np.asarray(to_large, dtype=bool)
    bpb = float(np.where(to_large, table.large_bpb, table.small_bpb).mean())
    wasted = np.broadcast_to(np.asarray(wasted_cost, dtype=float), to_large.shape)
    cost = float(np.where(to_large, table.large_cost + wasted, table.small_cost).mean())
    return RouterPoint(float(to_large.mean()), bpb,
                       gap_recovered(float(table.small_bpb.mean()), float(table.large_bpb.mean()), bpb),
                       cost, threshold)


def small_only(table: RoutingTable) -> RouterPoint:
    return evaluate(table, np.zeros(table.n, dtype=bool))


def large_only(table: RoutingTable) -> RouterPoint:
    return evaluate(table, np.ones(table.n, dtype=bool))


def _ranked_curve(table: RoutingTable, order: np.ndarray) -> list[RouterPoint]:
    """Send the first k prompts of `order` to large, for k = 0..n."""
    to_large = np.zeros(table.n, dtype=bool)
    points = [evaluate(table, to_large)]
    for index in order:
        to_large[index] = True
        points.append(evaluate(table, to_large))
    return points


def oracle_curve(table: RoutingTable) -> list[RouterPoint]:
    """Hindsight: at every share, the prompts that gain most from the large tier go there."""
    return _ranked_curve(table, np.argsort(-table.gain, kind="stable"))


def score_curve(table: RoutingTable, scores: np.ndarray) -> list[RouterPoint]:
    """A router that ranks prompts by a score (higher = more to gain from large) and sends the
    top k to large, for every k: what any threshold on the score does, since a threshold
    keeps exactly the prompts scored above it. Ties go in file order."""
    points = _ranked_curve(table, np.argsort(-np.asarray(scores, dtype=float), kind="stable"))
    ranked = np.sort(np.asarray(scores, dtype=float))[::-1]
    # the threshold that sends the first k to large: the k-th score itself (>= threshold goes)
    return [points[0], *(RouterPoint(p.share, p.mean_bpb, p.gap_recovered, p.mean_cost, float(t))
                         for p, t in zip(points[1:], ranked))]


def random_expected(table: RoutingTable, share: float) -> RouterPoint:
    """A router that flips a coin with P(large) = share: bpb = small + share * (large - small)
    in expectation, so it recovers exactly `share` of the gap."""
    small, large = small_only(table), large_only(table)
    bpb = small.mean_bpb + share * (large.mean_bpb - small.mean_bpb)
    cost = small.mean_cost + share * (large.mean_cost - small.mean_cost)
    return RouterPoint(share, bpb, gap_recovered(small.mean_bpb, large.mean_bpb, bpb), cost)


def random_sampled_curve(table: RoutingTable, seed: int) -> list[RouterPoint]:
    """One seeded draw: a random order of the prompts, the first k of it to large."""
    return _ranked_curve(table, np.random.default_rng(seed).permutation(table.n))


def threshold_sweep(table: RoutingTable, confidence: np.ndarray, signal: CascadeSignal,
                    forced_large: np.ndarray | None = None, wasted_cost: np.ndarray | float = 0.0) -> list[RouterPoint]:
    """The cascade at every threshold that changes its decisions. `confidence` is
    policies.cascade.confidence per prompt (higher = surer); prompts in `forced_large` (the
    code signal) go to large without a probe, the rest escalate by `should_escalate`, paying
    `wasted_cost` when they do. Thresholds are in the signal's own unit, as in the config."""
    confidence = np.asarray(confidence, dtype=float)
    forced = np.zeros(table.n, dtype=bool) if forced_large is None else np.asarray(forced_large, dtype=bool)
    in_unit = confidence if signal == "mean_logprob" else -confidence
    values = sorted({float(v) for v in in_unit if not math.isnan(v)})
    # Each observed value keeps everything on its own side; one more threshold escalates all.
    thresholds = [*values, math.inf] if signal == "mean_logprob" else [*reversed(values), -math.inf]
    wasted = np.broadcast_to(np.asarray(wasted_cost, dtype=float), forced.shape)
    points = []
    for threshold in thresholds:
        cfg = CascadeConfig(to="large", signal=signal, threshold=threshold)
        escalated = np.array([should_escalate(cfg, float(c)) for c in confidence], dtype=bool) & ~forced
        points.append(evaluate(table, forced | escalated, np.where(escalated, wasted, 0.0), threshold))
    return sorted(points, key=lambda p: p.share)


def with_ends(table: RoutingTable, points: list[RouterPoint]) -> list[RouterPoint]:
    """The curve with small-only and large-only added where it does not reach them: any share in
    between is then reachable by sending a coin-flipped part of the traffic through the router."""
    points = sorted(points, key=lambda p: p.share)
    if not points or points[0].share > 0:
        points = [small_only(table), *points]
    if points[-1].share < 1:
        points = [*points, large_only(table)]
    return points


def interpolate(table: RoutingTable, points: list[RouterPoint], share: float) -> RouterPoint:
    """The curve's figures at `share`, linear between its neighbouring points."""
    curve = with_ends(table, points)
    shares = np.array([p.share for p in curve])

    def at(values: list[float]) -> float:
        return float(np.interp(share, shares, np.array(values, dtype=float)))

    bpb = at([p.mean_bpb for p in curve])
    return RouterPoint(share, bpb, gap_recovered(float(table.small_bpb.mean()), float(table.large_bpb.mean()), bpb),
                       at([p.mean_cost for p in curve]))


def average_gap_recovered(table: RoutingTable, points: list[RouterPoint]) -> float | None:
    """RouteLLM's APGR: the area under gap recovered over share in [0, 1] (random: 0.5)."""
    curve = with_ends(table, points)
    if any(p.gap_recovered is None for p in curve):
        return None
    shares = np.array([p.share for p in curve])
    gaps = np.array([p.gap_recovered for p in curve])
    return float(np.sum((shares[1:] - shares[:-1]) * (gaps[1:] + gaps[:-1]) / 2))


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing their mean rank."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    sorted_values = values[order]
    start = 0
    for end in range(1, len(values) + 1):
        if end == len(values) or sorted_values[end] != sorted_values[start]:
            ranks[order[start:end]] = (start + end + 1) / 2
            start = end
    return ranks


def auc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    """P(score of a positive > score of a negative), ties counting half (Mann-Whitney)."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    ranks = _average_ranks(scores)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    rx, ry = _average_ranks(np.asarray(x, dtype=float)), _average_ranks(np.asarray(y, dtype=float))
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])
