"""The routing benchmark's arithmetic on small synthetic inputs with known answers: gap
recovered, the oracle, random (expected and sampled), threshold sweeps through the cascade
policy, interpolation at a share, APGR/AUC, the cost model with a cascade's wasted work, and
the cascade's TTFT figures."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.routing.cost import TierCost
from bench.routing.evaluation import PromptMeasurement, evaluate_routers
from bench.routing.latency import cascade_latency
from bench.routing.probes import Probe
from bench.routing.routers import (RouterPoint, RoutingTable, auc, average_gap_recovered, evaluate, gap_recovered,
                                   interpolate, oracle_curve, random_expected, random_sampled_curve, spearman,
                                   threshold_sweep)
from bench.routing.scoring import ExchangeScore
from bench.routing.speed import RequestTiming


def _table(small=(1.0, 1.0, 1.0, 1.0), large=(0.5, 0.9, 1.2, 0.0), small_cost=(1.0,) * 4, large_cost=(10.0,) * 4):
    # gains: 0.5, 0.1, -0.2, 1.0; mean small 1.0, mean large 0.65 -> gap 0.35
    return RoutingTable(*(np.array(x, dtype=float) for x in (small, large, small_cost, large_cost)))


def test_gap_recovered_is_zero_for_small_one_for_large_and_none_without_a_gap():
    assert gap_recovered(1.0, 0.6, 1.0) == 0.0
    assert gap_recovered(1.0, 0.6, 0.6) == 1.0
    assert gap_recovered(1.0, 0.6, 0.8) == pytest.approx(0.5)
    assert gap_recovered(1.0, 1.0, 0.9) is None


def test_evaluate_charges_wasted_work_only_on_prompts_sent_to_large():
    table = _table()
    point = evaluate(table, np.array([True, False, False, True]), wasted_cost=np.array([2.0, 2.0, 2.0, 2.0]))
    assert point.share == 0.5
    assert point.mean_bpb == pytest.approx((0.5 + 1.0 + 1.0 + 0.0) / 4)
    assert point.gap_recovered == pytest.approx((1.0 - 0.625) / 0.35)
    assert point.mean_cost == pytest.approx((12 + 1 + 1 + 12) / 4)


def test_oracle_sends_the_largest_gains_first():
    curve = oracle_curve(_table())
    assert [p.share for p in curve] == [0, 0.25, 0.5, 0.75, 1.0]
    # order by gain: prompt 3 (1.0), prompt 0 (0.5), prompt 1 (0.1), prompt 2 (-0.2)
    assert [p.mean_bpb for p in curve] == pytest.approx([1.0, 0.75, 0.625, 0.6, 0.65])
    assert curve[3].gap_recovered == pytest.approx(0.4 / 0.35)      # the oracle can beat large-only
    assert curve[-1].gap_recovered == pytest.approx(1.0)


def test_random_expected_recovers_exactly_its_share():
    point = random_expected(_table(), 0.3)
    assert point.gap_recovered == pytest.approx(0.3)
    assert point.mean_bpb == pytest.approx(1.0 - 0.3 * 0.35)
    assert point.mean_cost == pytest.approx(1.0 + 0.3 * 9.0)


def test_random_sampled_is_seeded_and_spans_small_to_large():
    table = _table()
    a, b = random_sampled_curve(table, 7), random_sampled_curve(table, 7)
    assert a == b
    assert a[0].gap_recovered == 0.0 and a[-1].gap_recovered == pytest.approx(1.0)
    assert [p.share for p in a] == [0, 0.25, 0.5, 0.75, 1.0]


def test_threshold_sweep_escalates_below_a_logprob_threshold_and_pays_the_probe():
    table = _table()
    confidence = np.array([-2.0, -0.5, -0.1, -3.0])      # prompt 3 least sure, then 0
    sweep = threshold_sweep(table, confidence, "mean_logprob", wasted_cost=0.5)
    assert [p.share for p in sweep] == [0, 0.25, 0.5, 0.75, 1.0]
    # thresholds are the observed values: at -0.5, prompts 3 and 0 (strictly below) escalate
    half = sweep[2]
    assert half.threshold == -0.5
    assert half.mean_bpb == pytest.approx((0.5 + 1.0 + 1.0 + 0.0) / 4)
    assert half.mean_cost == pytest.approx((10.5 + 1 + 1 + 10.5) / 4)
    assert sweep[-1].threshold == math.inf


def test_threshold_sweep_entropy_escalates_above_and_code_goes_straight_to_large():
    table = _table()
    entropy = np.array([1.0, 0.2, 0.1, 3.0])
    forced = np.array([False, True, False, False])         # the code signal fired on prompt 1
    sweep = threshold_sweep(table, -entropy, "mean_entropy", forced, wasted_cost=0.5)
    assert sweep[0].share == 0.25 and sweep[0].mean_cost == pytest.approx((1 + 10 + 1 + 1) / 4)
    # entropy threshold 1.0: only prompt 3 (3.0 > 1.0) escalates, plus the forced prompt 1
    point = next(p for p in sweep if p.threshold == 1.0)
    assert point.share == 0.5
    assert point.mean_cost == pytest.approx((1 + 10 + 1 + 10.5) / 4)   # no probe on the forced prompt
    assert sweep[-1].share == 1.0 and sweep[-1].threshold == -math.inf


def test_interpolation_is_linear_and_mixes_with_small_only_below_the_curve():
    table = _table()
    points = [RouterPoint(0.2, 0.93, 0.2, 3.0), RouterPoint(0.6, 0.79, 0.6, 7.0)]
    mid = interpolate(table, points, 0.3)
    assert mid.gap_recovered == pytest.approx(0.3)
    assert mid.mean_cost == pytest.approx(4.0)
    low = interpolate(table, points, 0.1)                   # halfway from small-only (0, 0, cost 1)
    assert low.gap_recovered == pytest.approx(0.1) and low.mean_cost == pytest.approx(2.0)


def test_apgr_of_the_diagonal_is_one_half_and_the_oracle_beats_it():
    table = _table()
    diagonal = [random_expected(table, s) for s in (0.0, 0.5, 1.0)]
    assert average_gap_recovered(table, diagonal) == pytest.approx(0.5)
    assert average_gap_recovered(table, oracle_curve(table)) > 0.5
    same = _table(large=(1.0, 1.0, 1.0, 1.0))
    assert average_gap_recovered(same, oracle_curve(same)) is None


def test_auc_and_spearman_on_known_orderings():
    labels = np.array([True, True, False, False])
    assert auc(np.array([0.9, 0.8, 0.1, 0.2]), labels) == 1.0
    assert auc(np.array([0.1, 0.2, 0.9, 0.8]), labels) == 0.0
    assert auc(np.array([0.5, 0.5, 0.5, 0.5]), labels) == 0.5
    assert auc(np.array([0.1, 0.2]), np.array([True, True])) is None
    assert spearman(np.array([1, 2, 3, 4]), np.array([10, 20, 30, 40])) == pytest.approx(1.0)
    assert spearman(np.array([1, 2, 3, 4]), np.array([4, 3, 3, 1])) == pytest.approx(-0.9486833)


def test_cost_is_cores_times_prefill_plus_decode_time():
    tier = TierCost(cores=2, prefill_tokens_per_s=100.0, decode_tokens_per_s=10.0)
    assert tier.request(50, 20) == pytest.approx(2 * (0.5 + 2.0))
    assert tier.request(np.array([100, 0]), np.array([0, 10])) == pytest.approx([2.0, 2.0])
    assert tier.probe(100, 8) == pytest.approx(2 * (1.0 + 0.8))
    with pytest.raises(ValueError):
        TierCost(cores=0, prefill_tokens_per_s=1.0, decode_tokens_per_s=1.0)


def test_cascade_latency_adds_k_minus_one_tpot_and_escalation_adds_the_large_ttft():
    small = [RequestTiming(10, 100.0, 20.0, 250.0), RequestTiming(10, 200.0, 20.0, 330.0),
             RequestTiming(10, 100.0, 40.0, 400.0)]
    large = [RequestTiming(12, 400.0, 50.0, 800.0), RequestTiming(12, 400.0, 50.0, 800.0),
             RequestTiming(12, 200.0, 50.0, 600.0)]
    got = cascade_latency(small, large, 8)
    # per prompt (K - 1) * TPOT / TTFT: 1.4, 0.7, 2.8 -> median 1.4; timed directly: 1.5, 0.65, 3.0
    assert got["cascade_ttft_overhead"] == pytest.approx(1.4)
    assert got["cascade_ttft_overhead_measured"] == pytest.approx(1.5)
    assert got["kept_on_small_ttft_ms"]["p50"] == pytest.approx(340.0)
    # escalated: 640 / 400, 740 / 400, 580 / 200 -> median 1.85
    assert got["escalated_ttft_ms"]["p50"] == pytest.approx(640.0)
    assert got["escalated_vs_large_ttft"] == pytest.approx(1.85)
    with pytest.raises(ValueError):
        cascade_latency(small, large[:2], 8)


def _measurements():
    """Eight prompts; the large tier helps prompts 0-2 a lot, code prompt 3 a little, the rest
    not at all; the small tier's probe is unsure exactly on 0-2."""
    rows = []
    for i in range(8):
        helps = i < 3
        small = ExchangeScore(20, 10, 40, 40.0, -2.0 if helps else -1.0)          # 1.0 bpb
        large = ExchangeScore(25, 9, 40, 20.0 if helps else (36.0 if i == 3 else 40.0))
        lp = -3.0 if helps else -0.2
        rows.append(PromptMeasurement(f"p{i}", i, "syntax def" if i == 3 else None, small, large,
                                      Probe((lp,) * 16, (-lp,) * 16)))
    return rows


def test_evaluate_routers_headline_on_a_router_that_finds_the_helped_prompts():
    result = evaluate_routers(_measurements(), TierCost(2, 100.0, 10.0), TierCost(2, 50.0, 5.0), probe_tokens=8,
                              signal="mean_logprob", share=0.5)
    # gap = mean(small - large) = (3 * 0.5 + 0.1) / 8; tiergate at share 0.5 sends 0-3 to large
    assert result.routers["tiergate"]["at_50"]["gap_recovered"] == pytest.approx(1.0)
    assert result.router_vs_random == pytest.approx(1.0 / 0.5)
    assert result.routers["code_signal"]["share"] == pytest.approx(1 / 8)
    assert result.routers["tiergate"]["min_share"] == pytest.approx(1 / 8)
    assert set(result.signals) == {f"{s}@{k}" for s in ("mean_logprob", "mean_entropy") for k in (1, 4, 8, 16)} | {
        "prompt_logprob"}
    # "large helps" = gain above the median (0.05): prompts 0-3; prompt 3 (code) ties the negatives
    assert result.signals["mean_logprob@8"]["auc_large_helps"] == pytest.approx((3 * 4 + 0.5 * 4) / 16)
    assert result.signals["prompt_logprob"]["auc_large_helps"] == pytest.approx((3 * 4 + 0.5 * 4) / 16)
    # the cascade's escalated prompts pay the small tier's prefill and 8 probe tokens
    small_cost, large_cost = 2 * (20 / 100 + 10 / 10), 2 * (25 / 50 + 9 / 5)
    probe = 2 * (20 / 100 + 8 / 10)
    want = (3 * (large_cost + probe) + large_cost + 4 * small_cost) / 8
    assert result.routers["tiergate"]["at_50"]["mean_cost"] == pytest.approx(want)
