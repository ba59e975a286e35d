"""`tiergate bench routing`: score every held-out prompt on both tiers, measure both tiers'
speed in the same run, then judge every router offline on those numbers.

Phases: the small tier scores each prompt (bits per byte of the reference, the prompt's
logprob) and probes it (the first greedy tokens a cascade would judge); the large tier scores
it; both tiers' throughput and latency are measured side by side; the routers, the candidate
signals and the headline figures are computed from those tables; JSON, then the optional
Markdown report.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from bench.common import machine_info, percentiles, write_json
from bench.routing.cost import TierCost
from bench.routing.evaluation import PromptMeasurement, RoutingEvaluation, evaluate_routers
from bench.routing.latency import cascade_latency
from bench.routing.probes import Probe, probe_first_tokens
from bench.routing.routers import BOOTSTRAP_SUFFIX, find_ratio_key, ratio_key
from bench.routing.scoring import ExchangeScore, encode_exchange, score_question
from bench.routing.signals import CANDIDATE_KS
from bench.routing.speed import BatchSpeed, RequestTiming, SingleStreamTimer, best_round, measure_batch
from bench.routing.uncertainty import describe_interval
from bench.routing.workload import RoutingPrompt, WorkloadCaps, load_routing_prompts, slice_bounds
from engines.loaded_model import load_model
from policies.cascade import CascadeSignal
from policies.gain_model import load_gain_model, resolve_gain_model_path
from policies.language_signal import language_signal
from policies.request_signals import code_signal


@dataclass(frozen=True)
class RoutingOptions:
    num_prompts: int = 300
    small: str = "default"
    large: str = "qwen"
    dtype: str = "float32"
    probe_tokens: int = 8               # K: the cascade's held-back tokens
    signal: CascadeSignal = "mean_logprob"
    caps: WorkloadCaps = field(default_factory=WorkloadCaps)
    slice_name: str = "heldout"
    share: float = 0.30                 # the headline share of calls to large
    seed: int = 0                       # the sampled random router
    speed_batch: int = 32
    speed_decode_tokens: int = 32
    speed_rounds: int = 2               # alternating small/large rounds; each tier's best is kept
    latency_prompts: int = 8
    latency_tokens: int = 24            # per single-stream request; at least K
    gain_model: str | None = "smollm2-qwen2.5-coder"   # the learned router (bundled name or path); None: rules


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TimeRemainingColumn(), console=console)


def _score_all(loaded, prompts: list[RoutingPrompt], console: Console, label: str,
               prompt_logprobs: bool, hidden_rows: tuple[int, ...] = (0,)) -> list[ExchangeScore]:
    scores = []
    with _progress(console) as bar:
        task = bar.add_task(f"{label}: bits per byte", total=len(prompts))
        for prompt in prompts:
            scores.append(score_question(loaded, prompt.question, prompt.reference, prompt_logprobs=prompt_logprobs,
                                         hidden_rows=hidden_rows))
            bar.advance(task)
    return scores


def _probe_all(loaded, prompts: list[RoutingPrompt], console: Console, tokens: int, batch: int) -> list[Probe]:
    ids = [encode_exchange(loaded, p.question, p.reference)[0] for p in prompts]
    with _progress(console) as bar:
        task = bar.add_task(f"small: first {tokens} greedy tokens", total=len(prompts))
        return probe_first_tokens(loaded, ids, tokens, batch, on_done=lambda n: bar.advance(task, n))


def _predicted_gain(gain, question: str, code: str | None, small: ExchangeScore) -> float | None:
    if gain is None:
        return None
    return gain.predict_with_prefill(gain.predict(question, code), small.prompt_hidden)


def _measure_speeds(small, large, prompts: list[RoutingPrompt], options: RoutingOptions,
                    console: Console, held_back: int) -> tuple[dict, dict, dict]:
    """Both tiers' throughput, alternating rounds (each tier's best kept), then the latency
    prompts each timed on small and at once on large; the cascade holds `held_back` tokens."""
    ids = {tier: [encode_exchange(loaded, p.question, p.reference)[0] for p in prompts]
           for tier, loaded in (("small", small), ("large", large))}
    step = max(1, len(prompts) // options.latency_prompts)
    picked = list(range(0, len(prompts), step))[:options.latency_prompts]
    rounds: dict[str, list[BatchSpeed]] = {"small": [], "large": []}
    for r in range(options.speed_rounds):
        for tier, loaded in (("small", small), ("large", large)):
            console.log(f"{tier}: throughput at batch {min(options.speed_batch, len(prompts))} "
                        f"(round {r + 1}/{options.speed_rounds})")
            rounds[tier].append(measure_batch(loaded, ids[tier][:options.speed_batch], options.speed_decode_tokens))
    timers = {tier: SingleStreamTimer(loaded, [ids[tier][i] for i in picked], options.latency_tokens,
                                      held_back) for tier, loaded in (("small", small), ("large", large))}
    timings: dict[str, list[RequestTiming]] = {"small": [], "large": []}
    with _progress(console) as bar:
        task = bar.add_task("single-stream latency, small then large", total=len(picked))
        for i in picked:
            for tier in ("small", "large"):
                timings[tier].append(timers[tier].time(ids[tier][i]))
            bar.advance(task)
    speeds = {tier: _speed_entry(rounds[tier], timings[tier]) for tier in ("small", "large")}
    return speeds["small"], speeds["large"], cascade_latency(timings["small"], timings["large"], held_back)


def _speed_entry(rounds: list[BatchSpeed], timings: list[RequestTiming]) -> dict:
    ttft_s = sum(t.ttft_ms for t in timings) / 1000
    return {
        "batch": asdict(best_round(rounds)),
        "batch_rounds": [asdict(r) for r in rounds],
        "single_stream": {
            "ttft_ms": percentiles([t.ttft_ms for t in timings]),
            "tpot_ms": percentiles([t.tpot_ms for t in timings]),
            "time_to_k_ms": percentiles([t.time_to_k_ms for t in timings]),
            "prefill_tokens_per_s": sum(t.prompt_tokens for t in timings) / ttft_s,
            "decode_tokens_per_s": 1000 / statistics.median(t.tpot_ms for t in timings),
        },
    }


def _tier_cost(speed: dict, cores: int) -> TierCost:
    """From the rates per CPU-second received, so that the cost is the CPU time a request takes
    however busy the machine was (on an idle machine the wall-clock rates give the same)."""
    batch = speed["batch"]
    return TierCost(cores, batch["prefill_tokens_per_s_full_cpu"], batch["decode_tokens_per_s_full_cpu"])


def run_routing_bench(json_out: str, report_dir: str | None, options: RoutingOptions) -> int:
    console = Console(stderr=True)
    started = time.perf_counter()
    cores = torch.get_num_threads()
    # First: a gain model that cannot be read fails in a moment, not after a model load.
    gain = load_gain_model(resolve_gain_model_path(options.gain_model)) if options.gain_model else None
    console.log(f"small tier {options.small!r}: loading ({options.dtype})")
    small = load_model(options.small, options.dtype)
    prompts = load_routing_prompts(small.tokenizer, small.chat_template, options.num_prompts, options.caps,
                                   options.slice_name)
    hidden_rows = gain.prefill.rows if gain is not None and gain.prefill is not None else (0,)
    small_scores = _score_all(small, prompts, console, "small", prompt_logprobs=True, hidden_rows=hidden_rows)
    probes = _probe_all(small, prompts, console, max(options.probe_tokens, *CANDIDATE_KS), options.speed_batch)
    if options.large == options.small:
        large = small                      # one model as both tiers: a dry run of the pipeline
    else:
        console.log(f"large tier {options.large!r}: loading ({options.dtype})")
        large = load_model(options.large, options.dtype)
    large_scores = _score_all(large, prompts, console, "large", prompt_logprobs=False)
    reads_prefill = gain is not None and gain.reads_prefill
    # A cascade judged on the prefill holds back only the first token it samples anyway.
    held_back = 1 if reads_prefill else options.probe_tokens
    small_speed, large_speed, latency = _measure_speeds(small, large, prompts, options, console, held_back)

    codes = [code_signal(p.question) for p in prompts]
    rows = [PromptMeasurement(p.prompt_id, p.record_index, code, s, l, probe, language_signal(p.question),
                              _predicted_gain(gain, p.question, code, s))
            for p, code, s, l, probe in zip(prompts, codes, small_scores, large_scores, probes)]
    small_cost, large_cost = _tier_cost(small_speed, cores), _tier_cost(large_speed, cores)
    threshold = gain.trained.get("threshold_at_share") if gain else None
    result = evaluate_routers(rows, small_cost, large_cost, options.probe_tokens, options.signal, options.share,
                              options.seed, threshold, reads_prefill)
    report = build_report(options, prompts, rows, result, latency, small_speed, large_speed, cores)
    report["wall_s"] = time.perf_counter() - started
    write_json(json_out, report)
    if report_dir:
        from bench.routing.report import write_routing_report   # matplotlib only when a report is asked for
        path = write_routing_report(report, report_dir)
        console.log(f"report: {path}")
    console.print(_summary(report))
    return 0


def build_report(options: RoutingOptions, prompts: list[RoutingPrompt], rows: list[PromptMeasurement],
                 result: RoutingEvaluation, latency: dict, small_speed: dict, large_speed: dict, cores: int) -> dict:
    """The benchmark's JSON: headline figures first, then machine, workload, tiers, routers."""
    start, end = slice_bounds(options.slice_name)
    key = ratio_key(options.share)
    return {
        "benchmark": "routing",
        key: result.router_vs_random,
        key + BOOTSTRAP_SUFFIX: result.router_vs_random_interval,
        "cascade_ttft_overhead": latency["cascade_ttft_overhead"],
        "machine": machine_info(),
        "workload": {
            "source": f"ShareGPT V3 {options.slice_name} routing slice (records {start}-{end or 'end'}), first human "
                      "turn as the prompt, first gpt answer as the reference",
            "prompts": len(prompts),
            "first_record": prompts[0].record_index, "last_record": prompts[-1].record_index,
            **asdict(options.caps),
            "references_truncated": sum(p.reference_truncated for p in prompts),
            "code_prompts": sum(r.code_reason is not None for r in rows),
            "non_english_prompts": sum(r.language_reason is not None for r in rows),
            "probe_tokens": options.probe_tokens, "cascade_signal": options.signal,
            "gain_model": options.gain_model,
            "quality": "bits per byte of the reference answer, teacher-forced, each model in its own chat "
                       "template; lower is better; `quality` fields are -bpb",
            "cost": f"CPU-seconds per request = {cores} cores * (prompt tokens / prefill tok/s + reference tokens / "
                    f"decode tok/s) at batch {options.speed_batch}, the rates per CPU-second received (best of "
                    f"{options.speed_rounds} alternating rounds); an escalated cascade request adds the small "
                    "tier's prefill and probe tokens",
        },
        "tiers": {
            "small": {"source": options.small, "dtype": options.dtype, "speed": small_speed,
                      "mean_bpb": float(result.table.small_bpb.mean())},
            "large": {"source": options.large, "dtype": options.dtype, "speed": large_speed,
                      "mean_bpb": float(result.table.large_bpb.mean())},
        },
        "routers": result.routers,
        "signals": result.signals,
        "latency": latency,
        "per_prompt": [_prompt_row(r) for r in rows],
    }


def _prompt_row(row: PromptMeasurement) -> dict:
    s, l = row.small, row.large
    return {"id": row.prompt_id, "record": row.record_index, "code": row.code_reason,
            "non_english": row.language_reason,
            "small_bpb": s.bits_per_byte, "large_bpb": l.bits_per_byte, "reference_bytes": s.answer_bytes,
            "small_prompt_tokens": s.prompt_tokens, "large_prompt_tokens": l.prompt_tokens,
            "small_reference_tokens": s.answer_tokens, "large_reference_tokens": l.answer_tokens,
            "predicted_gain": row.predicted_gain,
            "prompt_mean_logprob": s.prompt_mean_logprob, "probe_logprobs": list(row.probe.logprobs),
            "probe_entropies": list(row.probe.entropies)}


def _summary(report: dict) -> Table:
    routers = report["routers"]
    table = Table(title=f"routing: {report['workload']['prompts']} prompts")
    headline = find_ratio_key(report)
    interval = report.get(headline + BOOTSTRAP_SUFFIX)
    if report[headline] is not None:
        table.caption = f"{headline} = {report[headline]:.2f}" + (
            f" (95 % bootstrap over the prompts: {describe_interval(interval)})"
            if interval else "")
    for col in ("router", "share to large", "mean bpb", "gap recovered", "CPU-ms / request"):
        table.add_column(col)

    def row(name: str, p: dict) -> None:
        gap = "-" if p["gap_recovered"] is None else f"{p['gap_recovered']:.3f}"
        table.add_row(name, f"{p['share']:.2f}", f"{p['mean_bpb']:.4f}", gap, f"{p['mean_cost'] * 1000:.1f}")

    key = next(k for k in routers["tiergate"] if k.startswith("at_"))
    row("small only", routers["small_only"])
    row("large only", routers["large_only"])
    row("code signal", routers["code_signal"])
    row("code or non-English", routers["prompt_signals"])
    row(f"oracle {key}", routers["oracle"][key])
    row(f"random {key}", routers["random"][key])
    row(f"tiergate {key}", routers["tiergate"][key])
    row(f"cascade only {key}", routers["cascade_only"][key])
    row(f"rules + cascade {key}", routers["rules_and_cascade"][key])
    return table
