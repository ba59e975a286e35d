"""`--report DIR` of the serving and engine benchmarks (serve, offline, ladder, prefix, spec,
gateway): one Markdown report with PNG plots each, drawn from the benchmark's own JSON (the
routing benchmark has its own, bench/routing/report.py). bench/report.py does the mechanics.

The plots: throughput against concurrency (or batch size) where a benchmark measures several,
TTFT and TPOT CDFs from the per-request samples the JSON keeps (`samples`; a JSON without them,
from before they were kept, gets its p50/p90/p99 drawn as points on the same axes), the
optimisation ladder's rungs, and the gateway's added latency with the console's cost.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.report import MarkdownReport, new_figure

_QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


def _machine(report: MarkdownReport, doc: dict) -> None:
    m = doc.get("machine", {})
    report.paragraph(f"Machine: {m.get('cpu')}, {m.get('cores')} cores, {m.get('threads')} torch threads, "
                     f"torch {m.get('torch')}. Workload: `{json.dumps(doc.get('workload', {}))[:600]}`")


def _cdf(ax, label: str, samples: list[float] | None, pct: dict | None) -> None:
    if samples:
        xs = sorted(samples)
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=label)
    elif pct:
        pts = [(pct[k], q) for k, q in _QUANTILES if pct.get(k) is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o--", label=f"{label} (p50/p90/p99)")


def _cdf_figure(sides: dict[str, dict]):
    """sides: name -> an entry with ttft_ms / tpot_ms percentiles and maybe `samples`."""
    figure = new_figure(11, 4.2)
    for ax, key, title in zip(figure.subplots(1, 2), ("ttft_ms", "tpot_ms"), ("TTFT", "TPOT")):
        for name, side in sides.items():
            _cdf(ax, name, (side.get("samples") or {}).get(key), side.get(key))
        ax.set_xlabel(f"{title}, ms")
        ax.set_ylabel("share of requests at or below")
        ax.set_title(f"{title} CDF")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return figure


def _bars(labels: list[str], values: list[float | None], ylabel: str, title: str):
    figure = new_figure(max(6.0, 0.9 * len(labels) + 2), 4.2)
    ax = figure.subplots()
    ax.bar(range(len(labels)), [v or 0 for v in values], color="tab:blue")
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    return figure


def _pct_row(entry: dict, key: str) -> list:
    p = entry.get(key) or {}
    return [p.get("p50"), p.get("p90"), p.get("p99")]


# ---- one per benchmark ----------------------------------------------------------------------
def serve_report(doc: dict, directory: str | Path) -> Path:
    report = MarkdownReport(directory, "tiergate bench serve")
    _machine(report, doc)
    sides = {"server": doc["server"], **({"compare": doc["compare"]} if doc.get("compare") else {})}
    report.table(["side", "req/s", "output tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "failed"],
                 [[name, s["request_throughput_per_s"], s["output_tokens_per_s"], s["ttft_ms"]["p50"],
                   s["ttft_ms"]["p99"], s["tpot_ms"]["p50"], s["tpot_ms"]["p99"], s["failed"]]
                  for name, s in sides.items()])
    report.figure(_cdf_figure(sides), "latency_cdf", "TTFT and TPOT CDFs")
    if len(doc.get("levels") or ()) > 1 or doc.get("compare"):
        _serve_levels(report, doc["levels"])
    return report.write()


def _serve_levels(report: MarkdownReport, levels: list[dict]) -> None:
    """Each concurrency level on both servers: a table with the ratios, and the figures plotted
    against concurrency."""
    names = [n for n in ("server", "compare") if n in levels[0]]
    report.heading("By concurrency")
    headers = ["concurrency"] + [f"{n} {k}" for n in names for k in ("tok/s", "TTFT p50", "TPOT p50")]
    if "compare" in names:
        headers.append("tok/s ratio")
    rows = []
    for level in levels:
        row = [level["concurrency"]]
        for n in names:
            row += [level[n]["output_tokens_per_s"], level[n]["ttft_ms"].get("p50"), level[n]["tpot_ms"].get("p50")]
        if "compare" in names:
            row.append(level["ratio"]["output_tokens_per_s"])
        rows.append(row)
    report.table(headers, rows)
    figure = new_figure(15, 4.2)
    xs = [level["concurrency"] for level in levels]
    for ax, (key, pct, title) in zip(figure.subplots(1, 3), (("output_tokens_per_s", None, "output tokens/s"),
                                                             ("ttft_ms", "p50", "TTFT p50, ms"),
                                                             ("tpot_ms", "p50", "TPOT p50, ms"))):
        for n in names:
            ys = [level[n][key] if pct is None else level[n][key].get(pct) for level in levels]
            ax.plot(xs, ys, "o-", label=n)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    report.figure(figure, "by_concurrency", "throughput, TTFT and TPOT against concurrency")


def offline_report(doc: dict, directory: str | Path) -> Path:
    report = MarkdownReport(directory, "tiergate bench offline")
    _machine(report, doc)
    ours = doc["tiergate"]
    hf = {k: v for k, v in doc.items() if k.startswith("transformers_static_b")}
    report.table(["system", "batch", "output tok/s", "TTFT p50 ms", "TPOT p50 ms"],
                 [["tiergate", ours.get("config", {}).get("max_num_seqs"), ours["output_tokens_per_s"],
                   ours["ttft_ms"]["p50"], ours["tpot_ms"]["p50"]]]
                 + [[name, v["batch_size"], v["output_tokens_per_s"], v["ttft_ms"]["p50"], v["tpot_ms"]["p50"]]
                    for name, v in hf.items()])
    figure = new_figure(7, 4.2)
    ax = figure.subplots()
    sizes = sorted(hf.values(), key=lambda v: v["batch_size"])
    ax.plot([v["batch_size"] for v in sizes], [v["output_tokens_per_s"] for v in sizes], "o-",
            label="transformers, static batches")
    ax.plot([ours.get("config", {}).get("max_num_seqs") or 1], [ours["output_tokens_per_s"]], "*", ms=14,
            label="tiergate, continuous batching (max sequences)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("requests in flight (batch size)")
    ax.set_ylabel("output tokens/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    report.figure(figure, "throughput_vs_concurrency", "Throughput against concurrency")
    report.figure(_cdf_figure({"tiergate": ours, **hf}), "latency_cdf", "TTFT and TPOT CDFs")
    return report.write()


def ladder_report(doc: dict, directory: str | Path) -> Path:
    report = MarkdownReport(directory, "tiergate bench ladder")
    _machine(report, doc)
    rungs = doc["rungs"]
    names = list(rungs)
    report.table(["rung", "adds", "tok/s (batch)", "x total", "TPOT p50 (one at a time)", "KV tokens", "identical"],
                 [[n, r["adds"], r["throughput"]["output_tokens_per_s"], r["ratios"]["throughput_total"],
                   r["latency"]["tpot_ms"]["p50"], r["kv_capacity_tokens"],
                   (r.get("quality_vs_baseline") or {}).get("identical_outputs")] for n, r in rungs.items()])
    figure = new_figure(12, 4.2)
    left, right = figure.subplots(1, 2)
    throughput = [rungs[n]["throughput"]["output_tokens_per_s"] for n in names]
    tpot = [rungs[n]["latency"]["tpot_ms"]["p50"] for n in names]
    for ax, values, ylabel in ((left, throughput, "output tokens/s"), (right, tpot, "TPOT p50, ms")):
        ax.bar(range(len(names)), values, color="tab:blue")
        ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
    left.set_title("throughput, all requests at once")
    right.set_title("latency, one request at a time")
    report.figure(figure, "ladder_rungs", "The optimisation ladder, one rung at a time")
    report.figure(_cdf_figure({n: rungs[n]["throughput"] for n in names}), "latency_cdf",
                  "TTFT and TPOT of each rung (all requests at once)")
    return report.write()


def prefix_report(doc: dict, directory: str | Path) -> Path:
    report = MarkdownReport(directory, "tiergate bench prefix")
    _machine(report, doc)
    report.table(["cache", "TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms"],
                 [["cold", *_pct_row(doc["cold"], "ttft_ms")], ["warm", *_pct_row(doc["warm"], "ttft_ms")]])
    report.paragraph(f"warm / cold at p50: {doc.get('ratio_warm_over_cold_p50'):.3g}")
    report.figure(_bars(["cold", "warm"], [doc["cold"]["ttft_ms"]["p50"], doc["warm"]["ttft_ms"]["p50"]],
                        "TTFT p50, ms", "Time to first token behind a cached system prompt"), "prefix_ttft",
                  "TTFT, cold vs warm prefix cache")
    return report.write()


def spec_report(doc: dict, directory: str | Path) -> Path:
    report = MarkdownReport(directory, "tiergate bench spec")
    _machine(report, doc)
    sections = {k: v for k, v in doc.items() if k.startswith("batch") and isinstance(v, dict)}
    rows = [[section, name, r.get("output_tokens_per_s"), r.get("speedup"), r.get("acceptance_rate")]
            for section, configs in sections.items() for name, r in configs.items()]
    report.table(["workload", "decoding", "output tok/s", "speedup", "acceptance"], rows)
    chat = {int(k[len("batch"):].split("_")[0]): v for k, v in sections.items() if k.endswith("_chat")}
    figure = new_figure(7, 4.2)
    ax = figure.subplots()
    for name in dict.fromkeys(n for v in chat.values() for n in v):
        pts = sorted((b, v[name]["output_tokens_per_s"]) for b, v in chat.items() if name in v)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("requests in flight (batch size)")
    ax.set_ylabel("output tokens/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    report.figure(figure, "throughput_vs_concurrency", "Chat throughput against concurrency, per decoding")
    return report.write()


def gateway_report(doc: dict, directory: str | Path) -> Path:
    report = MarkdownReport(directory, "tiergate bench gateway")
    _machine(report, doc)
    passes = {"memory store": doc, **({"redis store": doc["redis"]} if doc.get("redis") else {})}
    rows, labels, added = [], [], []
    for name, res in passes.items():
        rows.append([f"direct ({name} pass)", *_pct_row(res["direct"], "latency_ms"), res["direct"]["errors"]])
        rows.append([f"gateway, {name}", *_pct_row(res["gateway"], "latency_ms"), res["gateway"]["errors"]])
        labels.append(name)
        added.append(res["added_latency_ms"])
    report.table(["side", "p50 ms", "p90 ms", "p99 ms", "errors"], rows)
    figure = new_figure(7, 4.2)
    ax = figure.subplots()
    width = 0.8 / max(1, len(labels))
    for i, (label, a) in enumerate(zip(labels, added)):
        ax.bar([j + i * width for j in range(3)], [a["p50"], a["p90"], a["p99"]], width, label=label)
    ax.set_xticks([j + width * (len(labels) - 1) / 2 for j in range(3)], ["p50", "p90", "p99"])
    ax.set_ylabel("latency added by the gateway, ms")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    report.figure(figure, "added_latency", "Latency the gateway adds")
    c = doc.get("console")
    if c:
        report.heading("With an operator console open")
        rates, cpu = c["throughput_rps"], c["gateway_cpu_ms_per_request"]
        base = rates["0"]
        labels = [f"{tabs} tab{'s' if tabs != '1' else ''}" if tabs != "0" else "no console" for tabs in rates]
        report.table(["", "req/s", "ratio of totals", "gateway CPU ms per request"],
                     [[label, rate, round(rate / base, 4) if base else None, cpu[tabs]]
                      for label, (tabs, rate) in zip(labels, rates.items())])
        many = c.get("many_tabs")
        if many:
            report.paragraph(f"{c['tabs']} tabs: throughput x{many['mean_ratio']} (95 % interval {many['ratio_95']} "
                             f"over {c['rounds']} rounds), so one console costs {many['cost_per_tab']:.4%} "
                             f"(95 % interval {many['cost_per_tab_95'][0]:.3%} to {many['cost_per_tab_95'][1]:.3%}); "
                             f"bar < {c['bar']:.0%}: {c['meets_bar']}. "
                             f"CPU per poll {c['gateway_cpu_ms_per_poll']} ms.")
        report.figure(_bars(labels, list(rates.values()), "requests/s (closed loop)",
                            f"{c['concurrency']} clients back to back"),
                      "console_throughput", "Gateway throughput with no console, one tab and many tabs polling it")
    return report.write()


def profile_report(doc: dict, directory: str | Path) -> Path:
    report = MarkdownReport(directory, "tiergate bench profile")
    _machine(report, doc)
    batches, categories = doc["batches"], doc["categories"]
    report.table(["part"] + [f"batch {b['batch']} ms" for b in batches] + [f"batch {b['batch']} share" for b in batches],
                 [[c] + [b["ms_per_step"][c] for b in batches] + [b["share"][c] for b in batches] for c in categories]
                 + [["step"] + [b["step_ms"]["mean"] for b in batches] + [1.0 for _ in batches],
                    ["output tok/s"] + [b["output_tokens_per_s"] for b in batches] + [None for _ in batches]])
    figure = new_figure(9, 4.5)
    ax = figure.subplots()
    bottoms = [0.0] * len(batches)
    labels = [str(b["batch"]) for b in batches]
    for c in categories:
        shares = [b["share"][c] for b in batches]
        ax.bar(labels, shares, bottom=bottoms, label=c)
        bottoms = [x + y for x, y in zip(bottoms, shares)]
    ax.set_xlabel("batch size (sequences decoding)")
    ax.set_ylabel("share of the decode step")
    ax.set_title("where a decode step's time goes")
    ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    report.figure(figure, "step_profile", "share of a decode step per part, by batch size")
    return report.write()


WRITERS = {"profile": profile_report, "serve": serve_report, "offline": offline_report, "ladder": ladder_report, "prefix": prefix_report,
           "spec": spec_report, "gateway": gateway_report}


def write_report(kind: str, json_path: str | Path, directory: str | Path) -> Path:
    """The report of benchmark `kind` from the JSON it wrote."""
    return WRITERS[kind](json.loads(Path(json_path).read_text()), directory)
