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
               "--speed-decode-tokens", "2", "--latency-prompts", "1", "--latency-tokens", "4", "--gain-model", "none",
               "--max-reference-tokens", "32"])
    assert rc == 0
    report = json.loads(out.read_text())
    for key in ("router_vs_random_at_30", "cascade_ttft_overhead", "machine", "workload", "tiers", "routers",
                "signals", "latency", "per_prompt"):
        assert key in report, key
    assert report["workload"]["prompts"] == 4 and len(report["per_prompt"]) == 4
    assert report["workload"]["first_record"] >= 15_000
    # one model as both tiers: identical scores, so there is no gap to recover
    assert report["router_vs_random_at_30"] is None and report["router_vs_random_at_30_bootstrap"] is None
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


def test_labels_resume_then_train_then_judge_the_learned_router(tmp_path):
    """routing-labels scores training prompts on both tiers and continues an interrupted file
    without rescoring; routing-train fits a gain model on them; bench routing judges it."""
    labels, model = tmp_path / "labels.jsonl", tmp_path / "gain.json"
    common = ["--small", "default", "--large", "default", "--max-reference-tokens", "16"]
    assert main(["bench", "routing-labels", "--out", str(labels), "--num-prompts", "20", *common]) == 0
    first = labels.read_text().splitlines()
    assert len(first) == 20
    labels.write_text("\n".join(first[:12]) + "\n" + first[12][:25])     # a run cut off mid-line
    assert main(["bench", "routing-labels", "--out", str(labels), "--num-prompts", "30", *common]) == 0
    rows = [json.loads(line) for line in labels.read_text().splitlines() if line.endswith("}")]
    assert [r["id"] for r in rows[:12]] == [json.loads(line)["id"] for line in first[:12]]
    assert len({r["id"] for r in rows}) == 30 and all(r["record"] < 15_000 for r in rows)
    assert all(r["small_bpb"] == pytest.approx(r["large_bpb"]) for r in rows)   # one model as both tiers

    cache = tmp_path / "prefill.npz"
    assert main(["bench", "routing-train", "--labels", str(labels), "--out", str(model), "--folds", "3",
                 "--prefill-cache", str(cache)]) == 0
    fitted = json.loads(model.read_text())
    assert fitted["format"] == "tiergate-gain-model" and fitted["trained"]["labels"] == 30
    # SmolLM2's hidden size at two rows: the last token and <|im_end|>, which closes the user's turn
    # (then "\n<|im_start|>ass" "istant\n": 5 more)
    assert fitted["prefill"]["rows"] == [0, 5] and len(fitted["prefill"]["weights"]) == 2 * 576 and cache.is_file()
    text_only = tmp_path / "text.json"
    assert main(["bench", "routing-train", "--labels", str(labels), "--out", str(text_only), "--folds", "3",
                 "--prefill-model", "none"]) == 0
    assert "prefill" not in json.loads(text_only.read_text())

    out = tmp_path / "routing.json"
    rc = main(["bench", "routing", "--json", str(out), "--num-prompts", "3", "--small", "default", "--large",
               "default", "--probe-tokens", "2", "--speed-batch", "2", "--speed-decode-tokens", "2",
               "--latency-prompts", "1", "--latency-tokens", "2", "--max-reference-tokens", "16",
               "--gain-model", str(model)])
    assert rc == 0
    report = json.loads(out.read_text())
    tiergate = report["routers"]["tiergate"]
    assert tiergate["signal"] == "predicted_gain" and tiergate["tokens"] == 1     # judged on the prefill
    assert all(isinstance(p["predicted_gain"], float) for p in report["per_prompt"])
    assert report["router_vs_random_at_30_bootstrap"] is None      # one model: no gap on any resample
    assert "rules_and_cascade" in report["routers"]
    assert report["cascade_ttft_overhead"] == 0.0 and report["latency"]["tokens"] == 1   # nothing more held back


def test_routing_train_refuses_a_file_with_too_few_labels(tmp_path, capsys):
    labels = tmp_path / "labels.jsonl"
    labels.write_text("")
    rc = main(["bench", "routing-train", "--labels", str(labels), "--out", str(tmp_path / "m.json")])
    assert rc == 2
    assert "too few" in capsys.readouterr().err
