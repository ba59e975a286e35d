"""`tiergate bench routing` end to end on a handful of held-out prompts with the bundled model
as both tiers: the JSON has the headline fields, every router, and the report its plots."""

from __future__ import annotations

import json
import math

import pytest

from gateway.cli.main import main

pytestmark = pytest.mark.slow


def test_bench_routing_end_to_end_with_one_model_as_both_tiers(tmp_path):
    out, report_dir = tmp_path / "routing.json", tmp_path / "report"
    rc = main(["bench", "routing", "--json", str(out), "--report", str(report_dir), "--num-prompts", "4",
               "--small", "default", "--large", "default", "--probe-tokens", "4", "--speed-batch", "2",
               "--speed-decode-tokens", "2", "--latency-prompts", "1", "--latency-tokens", "4",
               "--max-reference-tokens", "32"])
    assert rc == 0
    report = json.loads(out.read_text())
    for key in ("router_vs_random_at_30", "cascade_ttft_overhead", "machine", "workload", "tiers", "routers",
                "signals", "latency", "per_prompt"):
        assert key in report, key
    assert report["workload"]["prompts"] == 4 and len(report["per_prompt"]) == 4
    assert report["workload"]["first_record"] >= 15_000
    # one model as both tiers: identical scores, so there is no gap to recover
    assert report["router_vs_random_at_30"] is None
    assert all(p["small_bpb"] == pytest.approx(p["large_bpb"]) for p in report["per_prompt"])
    assert all(len(p["probe_logprobs"]) <= 16 for p in report["per_prompt"])
    for name in ("small_only", "large_only", "oracle", "random", "code_signal", "tiergate", "cascade_only"):
        assert name in report["routers"]
    assert report["routers"]["large_only"]["share"] == 1.0
    assert math.isfinite(report["cascade_ttft_overhead"]) and report["cascade_ttft_overhead"] > 0
    assert (report_dir / "report.md").is_file()
    assert (report_dir / "frontier.png").is_file() and (report_dir / "signals.png").is_file()


def test_bench_routing_rejects_more_prompts_than_the_slice_holds(tmp_path, capsys):
    rc = main(["bench", "routing", "--json", str(tmp_path / "r.json"), "--num-prompts", "100000",
               "--large", "default"])
    assert rc == 2
    assert "usable prompts" in capsys.readouterr().err
