"""`tiergate bench structured --report DIR`: the JSON as a Markdown table (bench/report.py)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.report import MarkdownReport


def write_structured_report(json_path: str, directory: str) -> Path:
    doc = json.loads(Path(json_path).read_text())
    report = MarkdownReport(directory, "Structured outputs: constrained vs plain decoding")
    m, w = doc["machine"], doc["workload"]
    report.paragraph(f"Machine: {m.get('cpu')}, {m.get('cores')} cores, {m.get('threads')} torch threads, "
                     f"torch {m.get('torch')}. Model {w['model']} ({w['dtype']}), batch {w['batch']}, "
                     f"{w['max_tokens']} output tokens per request, {w['rounds']} rounds (median).")
    report.table(["side", "output tok/s", "steps", "mask ms / step", "rounds tok/s"], [
        [side, doc[side]["output_tokens_per_s"], doc[side]["steps"], doc[side]["mask_ms_per_step"],
         ", ".join(str(v) for v in doc[side]["rounds_tokens_per_s"])] for side in ("plain", "constrained")])
    report.paragraph(f"constrained_vs_plain_throughput: **{doc['constrained_vs_plain_throughput']}** (per CPU "
                     f"second: {doc.get('constrained_vs_plain_cpu_throughput')})")
    c = doc["compile"]
    report.table(["", "p50 ms", "p90 ms", "p99 ms"],
                 [["fresh compile", c["compile_ms"]["p50"], c["compile_ms"]["p90"], c["compile_ms"]["p99"]],
                  ["cache hit", c["cache_hit_ms"]["p50"], c["cache_hit_ms"]["p90"], c["cache_hit_ms"]["p99"]]])
    return report.write()
