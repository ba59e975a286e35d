"""How far the headline ratio would move on another sample of prompts of the same kind.

A few hundred prompts measure a router's gap recovered with a spread of several hundredths:
each prompt's gain comes from one reference answer, and a handful of prompts with large gains
weigh on the mean. The percentile bootstrap over prompts says how much: resample the prompts
with replacement, rank each resample by the router's own scores (so its share is met on the
resample), and read the gap recovered at the share again. The random router recovers exactly
the share on any sample (in expectation), so the ratio's interval is the gap's divided by it.
"""

from __future__ import annotations

import numpy as np

from bench.routing.routers import RoutingTable, interpolate, score_curve


def bootstrap_gap(table: RoutingTable, scores: np.ndarray, share: float, resamples: int = 1000,
                  seed: int = 0) -> np.ndarray:
    """Gap recovered at `share` by ranking on `scores` (higher = to large first), on each of
    `resamples` resamples of the prompts; a resample whose tiers tie on average has no gap to
    recover and is left out."""
    scores = np.asarray(scores, dtype=float)
    rng = np.random.default_rng(seed)
    gaps = []
    for _ in range(resamples):
        pick = rng.integers(0, table.n, table.n)
        sample = RoutingTable(table.small_bpb[pick], table.large_bpb[pick], table.small_cost[pick],
                              table.large_cost[pick])
        gap = interpolate(sample, score_curve(sample, scores[pick]), share).gap_recovered
        if gap is not None:
            gaps.append(gap)
    return np.array(gaps)


def ratio_interval(table: RoutingTable, scores: np.ndarray, share: float, resamples: int = 1000,
                   seed: int = 0) -> dict | None:
    """The ratio to random at `share` on the bootstrap resamples: its 95 % percentile interval,
    spread, and the fraction of resamples at or above 2 (the bar the benchmark is read against).
    None when no resample has a gap to recover."""
    ratios = bootstrap_gap(table, scores, share, resamples, seed) / share
    if not len(ratios):
        return None
    low, high = np.quantile(ratios, [0.025, 0.975])
    return {"resamples": int(len(ratios)), "seed": seed, "ci95": [float(low), float(high)],
            "sd": float(ratios.std()), "fraction_at_least_2": float((ratios >= 2).mean())}


def describe_interval(interval: dict) -> str:
    """The interval as the report and the console print it: "1.74 - 2.19"."""
    low, high = interval["ci95"]
    return f"{low:.2f} - {high:.2f}"
