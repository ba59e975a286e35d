"""The bootstrap interval of the routing benchmark's headline ratio: what it must be on tables
whose answer is known, and that evaluate_routers reports it for the learned router only."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from bench.routing.cost import TierCost
from bench.routing.evaluation import evaluate_routers
from bench.routing.routers import BOOTSTRAP_SUFFIX, RoutingTable, find_ratio_key, interpolate, ratio_key, score_curve
from bench.routing.uncertainty import bootstrap_gap, ratio_interval
from tests.unit.test_bench_routing import _measurements


def _table(small, large) -> RoutingTable:
    small, large = np.asarray(small, dtype=float), np.asarray(large, dtype=float)
    return RoutingTable(small, large, np.ones(len(small)), np.full(len(small), 2.0))


def test_prompts_that_all_gain_alike_recover_exactly_the_share_on_every_resample():
    table = _table(np.full(40, 1.0), np.full(40, 0.5))
    got = ratio_interval(table, np.random.default_rng(3).normal(size=40), 0.3, resamples=200)
    assert got["resamples"] == 200
    assert got["ci95"] == pytest.approx([1.0, 1.0]) and got["sd"] == pytest.approx(0.0, abs=1e-12)
    assert got["fraction_at_least_2"] == 0.0


def test_ranking_by_the_true_gain_never_falls_below_random_and_its_reverse_never_above():
    rng = np.random.default_rng(0)
    gain = rng.uniform(0.01, 1.0, 60)
    table = _table(np.full(60, 2.0), 2.0 - gain)
    best = bootstrap_gap(table, gain, 0.3, resamples=300)
    worst = bootstrap_gap(table, -gain, 0.3, resamples=300)
    assert len(best) == len(worst) == 300
    assert best.min() >= 0.3 - 1e-9 and worst.max() <= 0.3 + 1e-9
    assert best.mean() > 0.4 > 0.2 > worst.mean()


def test_the_interval_is_seeded_and_holds_the_point_estimate_of_a_noisy_router():
    rng = np.random.default_rng(1)
    gain = rng.normal(0.1, 0.3, 200)
    scores = gain + rng.normal(0.0, 0.3, 200)
    table = _table(np.full(200, 1.0), 1.0 - gain)
    point = interpolate(table, score_curve(table, scores), 0.3).gap_recovered / 0.3
    first, again = (ratio_interval(table, scores, 0.3, resamples=300, seed=5),
                    ratio_interval(table, scores, 0.3, resamples=300, seed=5))
    assert first == again and first["resamples"] == 300
    low, high = first["ci95"]
    assert low < point < high and 0 < first["sd"] < high - low
    assert ratio_interval(table, scores, 0.3, resamples=300, seed=6) != first


def test_no_gap_on_any_resample_gives_no_interval():
    table = _table(np.full(10, 1.0), np.full(10, 1.0))
    assert len(bootstrap_gap(table, np.arange(10.0), 0.3, resamples=20)) == 0
    assert ratio_interval(table, np.arange(10.0), 0.3, resamples=20) is None


def test_evaluate_routers_reports_the_interval_for_the_learned_router_only():
    costs = TierCost(2, 100.0, 10.0), TierCost(2, 50.0, 5.0)
    rules = evaluate_routers(_measurements(), *costs, probe_tokens=8, signal="mean_logprob", share=0.5)
    assert rules.router_vs_random_interval is None
    # predicted gains that find the three helped prompts, then the code prompt
    learned_rows = [replace(r, predicted_gain=g) for r, g in zip(_measurements(), (0.9, 0.8, 0.7, 0.2, 0, 0, 0, 0))]
    learned = evaluate_routers(learned_rows, *costs, probe_tokens=8, signal="mean_logprob", share=0.5)
    assert learned.router_vs_random == pytest.approx(2.0)
    interval = learned.router_vs_random_interval
    # the scores order the prompts as their gains do: no resample does worse than random or
    # better than recovering the whole gap at half the calls
    assert interval is not None and 1.0 - 1e-9 <= interval["ci95"][0] <= interval["ci95"][1] <= 2.0 + 1e-9


def test_the_headline_key_is_found_beside_its_bootstrap_whatever_the_share():
    assert ratio_key(0.3) == "router_vs_random_at_30"
    report = {"benchmark": "routing", ratio_key(0.25) + BOOTSTRAP_SUFFIX: None, ratio_key(0.25): 2.1}
    assert find_ratio_key(report) == "router_vs_random_at_25"
