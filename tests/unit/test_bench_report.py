"""The report writer: a Markdown file whose tables are well formed and whose images are PNGs
that exist beside it, for the generic writer and for the routing benchmark's report."""

from __future__ import annotations

import re
from dataclasses import asdict, replace

import pytest

from bench.report import MarkdownReport, format_cell, new_figure
from bench.routing.cost import TierCost
from bench.routing.evaluation import evaluate_routers
from bench.routing.latency import cascade_latency
from bench.routing.report import write_routing_report
from bench.routing.runner import RoutingOptions, build_report
from bench.routing.speed import BatchSpeed, RequestTiming
from bench.routing.workload import RoutingPrompt
from tests.unit.test_bench_routing import _measurements

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _images(markdown: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)


def test_markdown_report_writes_tables_and_figures_it_references(tmp_path):
    report = MarkdownReport(tmp_path / "out", "A title")
    report.paragraph("Some text.")
    report.table(["name", "value", "none"], [["a|b", 0.123456, None], ["c", 3, True]])
    figure = new_figure(3, 2)
    figure.subplots().plot([0, 1], [1, 0])
    report.figure(figure, "line", "A line")
    path = report.write()
    text = path.read_text()
    assert text.startswith("# A title\n")
    assert "| a\\|b | 0.123 | - |" in text and "| c | 3 | yes |" in text
    assert _images(text) == ["line.png"]
    assert (tmp_path / "out" / "line.png").read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(ValueError):
        report.figure(figure, "../escape", "no")
    with pytest.raises(ValueError):
        report.table(["one"], [[1, 2]])
    assert format_cell(1234567.0) == "1.23e+06"


@pytest.mark.parametrize("learned", [False, True])
def test_routing_report_references_pngs_that_exist(tmp_path, learned):
    rows = _measurements()
    if learned:   # the learned router's predictions: the report adds the ratio's bootstrap interval
        rows = [replace(r, predicted_gain=0.1 * (8 - i)) for i, r in enumerate(rows)]
    prompts = [RoutingPrompt(r.prompt_id, r.record_index, "q", "a", False) for r in rows]
    small_cost, large_cost = TierCost(2, 100.0, 10.0), TierCost(2, 50.0, 5.0)
    result = evaluate_routers(rows, small_cost, large_cost, probe_tokens=8, signal="mean_logprob")
    timings = [RequestTiming(20, 100.0, 20.0, 240.0), RequestTiming(30, 150.0, 25.0, 330.0)]
    figures = {"p50": 10.0, "p90": 12.0, "p99": 13.0}
    speed = {"batch": asdict(BatchSpeed(32, 100.0, 10.0, 110.0, 11.0, 0.9, 0.9)),
             "single_stream": {"ttft_ms": figures, "tpot_ms": figures, "time_to_k_ms": figures,
                               "prefill_tokens_per_s": 100.0, "decode_tokens_per_s": 10.0}}
    report = build_report(RoutingOptions(num_prompts=len(rows)), prompts, rows, result,
                          cascade_latency(timings, timings, 8), speed, speed, 2)
    assert report["router_vs_random_at_30"] is not None
    assert (report["router_vs_random_at_30_bootstrap"] is not None) == learned
    path = write_routing_report(report, tmp_path / "routing")
    assert ("bootstrap interval" in path.read_text()) == learned
    images = _images(path.read_text())
    assert images == ["frontier.png", "signals.png"]
    for name in images:
        assert (path.parent / name).read_bytes()[:8] == PNG_MAGIC
