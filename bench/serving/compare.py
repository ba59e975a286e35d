"""`tiergate bench serve` over several concurrency levels, and against a second server in the
same run (`--compare URL`): the same ShareGPT requests, the same closed-loop client, one level
after the other, each level run on both servers before the next.

Within a level the two servers take turns going first (level 1: this one, level 2: the other,
...), so that a machine growing busier or quieter during the run does not always favour the same
side. Each server gets a few warm-up requests before its first measured level (kernels compiled,
caches filled), which are not counted. The ratios are this server's figure over the other's:
above 1 means this server has more output tokens/s, and (for latencies) takes longer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from rich.console import Console

from bench.serving.serve import ServeRequest, run_load


@dataclass(frozen=True)
class Target:
    """One server under test: where it is and what each request to it carries."""
    base_url: str
    model: str | None = None            # None: the first model its /v1/models lists
    api_key: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def level_ratios(ours: dict, theirs: dict) -> dict:
    """Ours over theirs: throughput, and p50 TTFT / TPOT."""
    return {
        "output_tokens_per_s": _ratio(ours["output_tokens_per_s"], theirs["output_tokens_per_s"]),
        "ttft_p50": _ratio(ours["ttft_ms"].get("p50"), theirs["ttft_ms"].get("p50")),
        "tpot_p50": _ratio(ours["tpot_ms"].get("p50"), theirs["tpot_ms"].get("p50")),
    }


async def _warm(target: Target, requests: list[ServeRequest], ignore_eos: bool, seed: int) -> str | None:
    """A few unmeasured requests; returns the model name the server was asked for."""
    report = await run_load(target.base_url, target.model, requests, request_rate=float("inf"),
                            concurrency=len(requests) or 1, api_key=target.api_key, seed=seed,
                            ignore_eos=ignore_eos, progress=False, extra_headers=target.headers)
    return report["model"]


async def run_levels(primary: Target, compare: Target | None, requests: list[ServeRequest], levels: list[int],
                     *, ignore_eos: bool, seed: int, warmup: int, console: Console | None = None) -> list[dict]:
    targets = {"server": primary, **({"compare": compare} if compare else {})}
    models: dict[str, str | None] = {}
    for name, target in targets.items():
        models[name] = await _warm(target, requests[:warmup], ignore_eos, seed) if warmup else target.model
    out = []
    for i, concurrency in enumerate(levels):
        order = list(targets) if i % 2 == 0 else list(reversed(targets))
        entry: dict = {"concurrency": concurrency, "first": order[0]}
        for name in order:
            target = targets[name]
            if console:
                console.log(f"{name} ({target.base_url}): concurrency {concurrency}, {len(requests)} requests")
            entry[name] = await run_load(target.base_url, models[name], requests, request_rate=float("inf"),
                                         concurrency=concurrency, api_key=target.api_key, seed=seed,
                                         ignore_eos=ignore_eos, extra_headers=target.headers)
        if compare:
            entry["ratio"] = level_ratios(entry["server"], entry["compare"])
        out.append(entry)
    return out


def sweep(primary: Target, compare: Target | None, requests: list[ServeRequest], levels: list[int], *,
          ignore_eos: bool, seed: int, warmup: int) -> list[dict]:
    return asyncio.run(run_levels(primary, compare, requests, levels, ignore_eos=ignore_eos, seed=seed,
                                  warmup=warmup, console=Console(stderr=True)))


def run_sweep_bench(json_out: str, primary: Target, compare: Target | None, levels: list[int], num_requests: int,
                    max_prompt_tokens: int, max_tokens: int, seed: int, ignore_eos: bool, warmup: int) -> int:
    from bench.common import machine_info, write_json
    from bench.serving.serve import load_serve_requests

    requests = load_serve_requests(num_requests, max_prompt_tokens, max_tokens, seed)
    results = sweep(primary, compare, requests, levels, ignore_eos=ignore_eos, seed=seed, warmup=warmup)
    doc = {
        "benchmark": "serve",
        "machine": machine_info(),
        "workload": {"source": "ShareGPT V3 first human turns", "num_requests": num_requests,
                     "concurrency": levels, "closed_loop": True, "max_prompt_tokens": max_prompt_tokens,
                     "max_tokens": max_tokens, "temperature": 0, "ignore_eos": ignore_eos, "seed": seed,
                     "warmup_requests": warmup, "base_url": primary.base_url, "headers": sorted(primary.headers),
                     **({"compare_url": compare.base_url, "compare_headers": sorted(compare.headers)}
                        if compare else {})},
        # the last level's figures at the top, as a single-level run writes them
        "server": results[-1]["server"],
        **({"compare": results[-1]["compare"]} if compare else {}),
        "levels": results,
    }
    if compare:
        doc["output_tokens_per_s_ratio"] = {f"at_{r['concurrency']}": r["ratio"]["output_tokens_per_s"]
                                            for r in results}
    write_json(json_out, doc)
    console = Console(stderr=True)
    for r in results:
        line = f"concurrency {r['concurrency']}: " + ", ".join(
            f"{name} {r[name]['output_tokens_per_s']:.1f} tok/s (TTFT p50 {r[name]['ttft_ms']['p50']:.0f} ms, "
            f"TPOT p50 {r[name]['tpot_ms']['p50']:.1f} ms, {r[name]['failed']} failed)"
            for name in ("server", "compare") if name in r)
        if compare and r["ratio"]["output_tokens_per_s"] is not None:
            line += f"; ratio {r['ratio']['output_tokens_per_s']:.2f}x"
        console.print(line)
    failed = sum(r[name]["failed"] for r in results for name in ("server", "compare") if name in r)
    return 0 if failed == 0 else 1
