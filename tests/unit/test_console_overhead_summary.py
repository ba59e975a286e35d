"""The console-cost arithmetic of `tiergate bench gateway --console`: one tab's cost derived from
many tabs' with an interval, and phase orders that do not favour a side."""

from bench.serving.console_overhead import ClosedLoopResult, PhaseLog, _orders, summarise


def _log(tabs: int, ratios_many: list[float], ratio_one: float = 1.0, base: int = 1000) -> PhaseLog:
    rounds = len(ratios_many)
    results = {0: [ClosedLoopResult(base, 0, 1.0) for _ in range(rounds)],
               1: [ClosedLoopResult(round(base * ratio_one), 0, 1.0) for _ in range(rounds)],
               tabs: [ClosedLoopResult(round(base * r), 0, 1.0) for r in ratios_many]}
    return PhaseLog(tabs, results, cpu_s={0: 1.0, 1: 1.0, tabs: 1.2}, polls={0: 0, 1: rounds, tabs: tabs * rounds})


def test_one_console_costs_the_many_tab_cost_over_the_tabs():
    doc = summarise(_log(16, [0.96, 0.95, 0.97, 0.96]), per_poll_ms=3.0, concurrency=32, seconds=1.0, rounds=4)
    many = doc["many_tabs"]
    assert many["cost"] == 0.04 and doc["cost_of_one_console"] == 0.0025
    low, high = many["cost_per_tab_95"]
    assert 0.0018 <= low <= 0.0025 <= high <= 0.0032
    assert doc["meets_bar"] is True
    assert doc["throughput_rps"] == {"0": 1000.0, "1": 1000.0, "16": 960.0}
    assert doc["gateway_cpu_ms_per_request"]["0"] == 0.25      # 1 CPU-s over 4,000 requests


def test_a_cost_over_the_bar_or_an_interval_reaching_it_fails():
    over = summarise(_log(16, [0.80, 0.82, 0.81, 0.79]), 3.0, 32, 1.0, 4)
    assert over["cost_of_one_console"] > 0.01 and over["meets_bar"] is False
    # a mean under the bar whose interval reaches past it is not shown to be under it
    noisy = summarise(_log(8, [0.99, 0.80, 1.0, 0.98]), 3.0, 32, 1.0, 4)
    assert noisy["cost_of_one_console"] < 0.01 and noisy["many_tabs"]["cost_per_tab_95"][1] > 0.01
    assert noisy["meets_bar"] is False


def test_a_single_tab_run_is_judged_on_its_own_ratio():
    results = {0: [ClosedLoopResult(1000, 0, 1.0)], 1: [ClosedLoopResult(995, 0, 1.0)]}
    doc = summarise(PhaseLog(1, results, {0: 1.0, 1: 1.0}, {0: 0, 1: 1}), 3.0, 32, 1.0, 1)
    assert "many_tabs" not in doc and doc["cost_of_one_console"] == 0.005 and doc["meets_bar"] is True


def test_phase_orders_run_every_side_once_a_round_and_rotate():
    orders = _orders((0, 1, 16), 6)
    assert all(sorted(o) == [0, 1, 16] for o in orders)
    assert {o[0] for o in orders} == {0, 1, 16}
    follows = {(o[i], o[i + 1]) for o in orders for i in range(2)}
    assert follows == {(a, b) for a in (0, 1, 16) for b in (0, 1, 16) if a != b}
