"""--report DIR of serve, offline, ladder, prefix, spec and gateway: a Markdown report whose
images are PNGs beside it, drawn from the benchmarks' JSON (the committed figures in docs/bench,
from before per-request samples were kept, and a serve JSON with samples)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench.bench_reports import WRITERS, write_report
from bench.serving.console_overhead import ClosedLoopResult, PhaseLog, summarise

DOCS = Path(__file__).resolve().parents[2] / "docs" / "bench"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _check(path: Path) -> str:
    text = path.read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert images
    for name in images:
        assert (path.parent / name).read_bytes()[:8] == PNG_MAGIC
    return text


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_report_from_the_committed_json(kind, tmp_path):
    text = _check(write_report(kind, DOCS / f"{kind}.json", tmp_path / kind))
    assert text.startswith(f"# tiergate bench {kind}\n") and "| " in text


def test_serve_report_draws_cdfs_from_samples(tmp_path):
    doc = json.loads((DOCS / "serve.json").read_text())
    doc["server"]["samples"] = {"ttft_ms": [100.0, 120.5, 180.0, 400.0], "tpot_ms": [50.0, 55.0, 61.0]}
    source = tmp_path / "serve.json"
    source.write_text(json.dumps(doc))
    _check(write_report("serve", source, tmp_path / "out"))


def test_gateway_report_shows_the_console_cost(tmp_path):
    doc = json.loads((DOCS / "gateway.json").read_text())
    results = {0: [ClosedLoopResult(1000, 0, 1.0)] * 3, 1: [ClosedLoopResult(995, 0, 1.0)] * 3,
               16: [ClosedLoopResult(950, 0, 1.0)] * 3}
    doc["console"] = summarise(PhaseLog(16, results, {0: 1.0, 1: 1.0, 16: 1.1}, {0: 0, 1: 3, 16: 48}),
                               per_poll_ms=1.2, concurrency=32, seconds=1.0, rounds=3)
    source = tmp_path / "gateway.json"
    source.write_text(json.dumps(doc))
    text = _check(write_report("gateway", source, tmp_path / "out"))
    assert "With an operator console open" in text and "console_throughput.png" in text
    assert "16 tabs" in text and "one console costs 0.3130%" in text
