"""The routing benchmark's Markdown report: the quality-cost frontier of every router and the
frontiers of the candidate signals, drawn from the benchmark's JSON (bench/report.py does the
file and figure mechanics)."""

from __future__ import annotations

import math
from pathlib import Path

from bench.report import MarkdownReport, new_figure
from bench.routing.routers import BOOTSTRAP_SUFFIX, find_ratio_key
from bench.routing.uncertainty import describe_interval


def _xy(points: list[dict], x: str) -> tuple[list[float], list[float]]:
    ys = [math.nan if p["gap_recovered"] is None else p["gap_recovered"] for p in points]
    return [p[x] * (1000 if x == "mean_cost" else 1) for p in points], ys


def _frontier_figure(report: dict):
    routers = report["routers"]
    key = _share_key(report)
    figure = new_figure(12, 4.8)
    for ax, x, label in zip(figure.subplots(1, 2), ("share", "mean_cost"),
                            ("share of calls to the large tier", "mean cost, CPU-ms per request")):
        ax.plot(*_xy(routers["oracle"]["curve"], x), color="0.55", lw=1.2, label="oracle (hindsight)")
        ax.plot(*_xy(routers["random"]["expected"], x), "k--", lw=1, label="random (expected)")
        ax.plot(*_xy(routers["random"]["sampled"]["curve"], x), color="0.75", lw=0.8,
                label=f"random (seed {routers['random']['sampled']['seed']})")
        ax.plot(*_xy(routers["cascade_only"]["sweep"], x), color="tab:orange", lw=1.3,
                label=f"cascade only ({routers['cascade_only']['signal']}@{routers['cascade_only']['tokens']})")
        learned = routers["tiergate"].get("signal") == "predicted_gain"
        prefill = learned and routers["tiergate"].get("tokens") == 1
        tiergate_label = ("tiergate (gain model: text + small prefill)" if prefill
                          else "tiergate (learned gain model)" if learned else "tiergate (code, non-English + cascade)")
        ax.plot(*_xy(routers["tiergate"]["sweep"], x), color="tab:blue", lw=2, label=tiergate_label)
        if "rules_and_cascade" in routers and routers["tiergate"].get("signal") == "predicted_gain":
            ax.plot(*_xy(routers["rules_and_cascade"]["sweep"], x), color="tab:cyan", lw=1.2,
                    label="code, non-English + cascade")
        for name, marker, color in (("small_only", "o", "tab:green"), ("large_only", "s", "tab:red"),
                                    ("code_signal", "D", "tab:purple"), ("prompt_signals", "P", "tab:brown")):
            ax.plot(*_xy([routers[name]], x), marker, color=color, ms=7, label=name.replace("_", " "))
        ax.plot(*_xy([routers["tiergate"][key]], x), "*", color="tab:blue", ms=13, label=f"tiergate {key}")
        if x == "share":
            ax.axvline(report_share(report), color="0.85", lw=0.8, zorder=0)
        ax.set_xlabel(label)
        ax.set_ylabel("quality gap recovered")
        ax.grid(alpha=0.3)
    figure.axes[0].legend(fontsize=7, loc="lower right")
    return figure


def _signals_figure(report: dict):
    figure = new_figure(8, 5.5)
    ax = figure.subplots()
    ax.plot(*_xy(report["routers"]["oracle"]["curve"], "share"), color="0.55", lw=1.2, label="oracle")
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="random")
    for name, entry in report["signals"].items():
        style = "-" if name.startswith("mean_logprob") else ":" if name.startswith("mean_entropy") else "-."
        ax.plot(*_xy(entry["sweep"], "share"), style, lw=1.3, label=f"{name} (APGR {_fmt(entry['apgr'])})")
    ax.set_xlabel("share of calls to the large tier")
    ax.set_ylabel("quality gap recovered")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return figure


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _share_key(report: dict) -> str:
    return next(k for k in report["routers"]["tiergate"] if k.startswith("at_"))


def report_share(report: dict) -> float:
    return int(_share_key(report)[3:]) / 100


def write_routing_report(report: dict, directory: str | Path) -> Path:
    key = _share_key(report)
    routers, workload, latency = report["routers"], report["workload"], report["latency"]
    small, large = report["tiers"]["small"], report["tiers"]["large"]
    md = MarkdownReport(directory, "Is routing worth it? Quality kept per cost")
    machine = report["machine"]
    md.paragraph(f"{workload['prompts']} prompts: {workload['source']}. Small tier `{small['source']}`, large tier "
                 f"`{large['source']}`, {small['dtype']}, on {machine['cpu']} ({machine['threads']} threads). "
                 f"Quality: {workload['quality']}. Cost: {workload['cost']}.")
    ratio_key = find_ratio_key(report)
    interval = report.get(ratio_key + BOOTSTRAP_SUFFIX)
    md.table(["headline", "value"], [
        [f"{ratio_key} (bar: >= 2)", report[ratio_key]],
        *([[f"{ratio_key}: 95 % bootstrap interval over the prompts ({interval['resamples']} resamples)",
            f"{describe_interval(interval)} ({interval['fraction_at_least_2']:.0%} of "
            "resamples >= 2)"]] if interval else []),
        ["cascade_ttft_overhead", report["cascade_ttft_overhead"]],
        ["escalated TTFT vs large alone", latency["escalated_vs_large_ttft"]],
        ["mean bpb small / large", f"{small['mean_bpb']:.4f} / {large['mean_bpb']:.4f}"],
        ["code prompts", workload["code_prompts"]],
        ["non-English prompts", workload.get("non_english_prompts", 0)],
    ])
    md.heading("Routers")
    rows = [["small only", routers["small_only"]], ["large only", routers["large_only"]],
            ["code signal", routers["code_signal"]], ["code or non-English", routers["prompt_signals"]],
            [f"oracle {key}", routers["oracle"][key]],
            [f"random {key} (expected)", routers["random"][key]],
            [f"random {key} (seeded draw)", routers["random"]["sampled"][key]],
            [f"tiergate {key}", routers["tiergate"][key]], [f"cascade only {key}", routers["cascade_only"][key]]]
    if "rules_and_cascade" in routers:
        rows.append([f"code, non-English + cascade {key}", routers["rules_and_cascade"][key]])
    if "at_config_threshold" in routers["tiergate"]:
        rows.append(["tiergate at the config's threshold", routers["tiergate"]["at_config_threshold"]])
    md.table(["router", "share to large", "mean bpb", "gap recovered", "CPU-ms / request"],
             [[name, p["share"], p["mean_bpb"], p["gap_recovered"], p["mean_cost"] * 1000] for name, p in rows])
    md.figure(_frontier_figure(report), "frontier",
              "Quality gap recovered against the share of calls to large (left) and the mean cost (right)")
    md.heading("Candidate signals (each as a cascade on its own)")
    md.paragraph("AUC: how often a prompt that gains more than the median from the large tier gets less "
                 "confidence than one that gains less (0.5 = no information). APGR: the area under the "
                 "frontier (random = 0.5).")
    md.table(["signal", "AUC", "Spearman vs gain", "APGR", f"gap {key}", f"gap {key} behind the prompt signals"],
             [[name, e["auc_large_helps"], e["spearman_with_gain"], e["apgr"], e[key]["gap_recovered"],
               e[f"with_code_signal_{key}"]["gap_recovered"]] for name, e in report["signals"].items()])
    md.figure(_signals_figure(report), "signals", "Frontier of each candidate signal")
    md.heading(f"Latency (single stream, {latency['prompts']} prompts, each on small then at once on large)")
    md.paragraph(f"cascade_ttft_overhead = median over prompts of (K - 1) * TPOT / TTFT of the small tier, K = "
                 f"{latency['tokens']}: {_fmt(latency['cascade_ttft_overhead'])} (timed directly, K-th token vs "
                 f"first: {_fmt(latency['cascade_ttft_overhead_measured'])}). Escalated requests: small TTFT + "
                 f"(K - 1) * small TPOT + large TTFT, {_fmt(latency['escalated_vs_large_ttft'])}x the large tier's "
                 "own TTFT (median of per-prompt ratios).")
    md.table(["figure", "p50 ms", "p90 ms"], [[name, value["p50"], value["p90"]] for name, value in latency.items()
                                             if name.endswith("_ms")])
    speed_rows = []
    for tier in ("small", "large"):
        speed = report["tiers"][tier]["speed"]
        batch, single = speed["batch"], speed["single_stream"]
        speed_rows.append([tier, batch["batch"], batch["prefill_tokens_per_s"], batch["decode_tokens_per_s"],
                           batch["prefill_tokens_per_s_full_cpu"], batch["decode_tokens_per_s_full_cpu"],
                           batch["prefill_cpu_utilisation"], batch["decode_cpu_utilisation"],
                           single["prefill_tokens_per_s"], single["decode_tokens_per_s"]])
    md.heading("Throughput")
    md.paragraph("Best of the alternating rounds. 'Full CPU': tokens x threads / process CPU-seconds, the rate "
                 "the cost model uses; CPU utilisation = process CPU time / (wall time x threads), well below 1 "
                 "when the machine was shared.")
    md.table(["tier", "batch", "prefill tok/s", "decode tok/s", "prefill full CPU", "decode full CPU",
              "CPU util. prefill", "CPU util. decode", "prefill tok/s (batch 1)", "decode tok/s (batch 1)"],
             speed_rows)
    return md.write()
