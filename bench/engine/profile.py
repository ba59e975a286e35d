"""`tiergate bench profile`: where one decode step's time goes, at several batch sizes.

B ShareGPT requests are submitted at once and stepped until every one is decoding; then the
next steps are timed with a stack of exclusive timers wrapped around the engine's parts, so that
each category counts its own time and not that of the parts it calls:

  schedule      the scheduler's plan (admission, block growth, preemption)
  prepare       building the step's chunks from the plan (runner, Python)
  step_tensors  flattening them into token ids, positions, slot mapping, block tables (runner)
  gemm          every linear layer: QKV, O, gate/up, down (dense, INT8, INT4 or FP8 kernels)
  attention     the paged attention backend (KV store + attention over the blocks)
  norm          the fused residual-add + RMSNorm
  rope          rotary embedding of Q and K (and the split of the fused QKV output)
  glue          what the layers do between those (views, SiLU * mul, the embedding lookup)
  head          the output head and the cast of the logits
  sample        sampling (penalties, temperature, top-k/p, the draw, logprobs if asked)
  emit          appending tokens, detokenizing, stop checks, building the outputs
  other         the rest of the step (stats, lookahead release)

The timers are perf_counter calls around Python calls (a few hundred per step), cheap next to
a step of milliseconds; torch runs CPU ops synchronously, so a call's time is its ops' time.
A model with a fused decoder (engines/model/fused_decoder.py) runs its layers one op at a time
here, so that the parts can be told apart: its served steps skip the per-op dispatch counted
in glue, norm, rope and attention.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager

from rich.console import Console
from rich.table import Table

from engines.engine_config import EngineConfig
from engines.llm_engine import LLMEngine
from engines.loaded_model import load_model
from engines.model.layers import RMSNorm
from engines.model import llama as llama_module
from engines.model.llama import Attention, DecoderLayer
from engines.quantization.methods import effective_group_size
from engines.sampling_params import SamplingParams
from kernels.fused import rope_split_qkv

CATEGORIES = ("schedule", "prepare", "step_tensors", "gemm", "attention", "norm", "rope", "glue", "head",
              "sample", "emit", "other")


class ExclusiveTimers:
    """Wrapped calls add their time minus that of the wrapped calls they make."""

    def __init__(self):
        self.totals: dict[str, float] = defaultdict(float)
        self._stack: list[float] = []
        self.on = False

    def wrap(self, fn: Callable, category: str) -> Callable:
        totals, stack = self.totals, self._stack

        def timed(*args, **kwargs):
            if not self.on:
                return fn(*args, **kwargs)
            started = time.perf_counter()
            stack.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                inner = stack.pop()
                spent = time.perf_counter() - started
                totals[category] += spent - inner
                if stack:
                    stack[-1] += spent
        return timed

    def reset(self) -> None:
        self.totals.clear()


@contextmanager
def instrumented(engine: LLMEngine, timers: ExclusiveTimers):
    """Wrap the engine's parts (instance attributes; the model module's rope function is put back after)."""
    runner, model = engine.runner, engine.runner.model
    patched: list[tuple[object, str]] = []

    def patch(obj, name: str, category: str) -> None:
        setattr(obj, name, timers.wrap(getattr(obj, name), category))
        patched.append((obj, name))

    patch(engine, "step", "other")
    patch(engine, "_schedule", "schedule")
    patch(runner, "execute", "prepare")
    patch(runner, "forward", "step_tensors")
    patch(engine, "_pick_tokens", "sample")
    patch(engine, "_emit", "emit")
    patch(model, "forward", "glue")
    patch(model, "compute_logits", "head")
    patch(runner.attn, "forward", "attention")
    for module in model.modules():
        if isinstance(module, RMSNorm):
            patch(module, "add_and_norm", "norm")
        elif isinstance(module, (DecoderLayer, Attention)) or type(module).__name__ == "SwiGLU":
            patch(module, "forward", "glue")
        elif hasattr(module, "in_features") and type(module).__name__.endswith("Linear"):
            patch(module, "forward", "gemm")
    patch(llama_module, "rope_split_qkv", "rope")
    # The parts are timed one op at a time: the model's layers run unfused meanwhile.
    fused, model.fused_decoder = model.fused_decoder, None
    try:
        yield
    finally:
        model.fused_decoder = fused
        for obj, name in patched:
            if obj is llama_module:
                setattr(obj, name, rope_split_qkv)
            else:
                delattr(obj, name)


def profile_batch(engine: LLMEngine, prompts: list[list[int]], steps: int, timers: ExclusiveTimers) -> dict:
    """Submit the prompts, step until all decode, then time `steps` decode steps."""
    params = SamplingParams(max_tokens=steps + 8, temperature=0, ignore_eos=True)
    for i, ids in enumerate(prompts):
        engine.add_request(f"p{i}", ids, params)
    while any(not seq.is_decoding for seq in engine.scheduler.running) or engine.scheduler.num_waiting:
        engine.step()
    engine.step()                       # one plain decode step before measuring
    running = len(engine.scheduler.running)
    step_ms = []
    timers.reset()
    timers.on = True
    for _ in range(steps):
        started = time.perf_counter()
        engine.step()
        step_ms.append((time.perf_counter() - started) * 1e3)
    timers.on = False
    for i in range(len(prompts)):
        engine.abort_request(f"p{i}")
    total = sum(step_ms)
    parts = {c: timers.totals.get(c, 0.0) * 1e3 / steps for c in CATEGORIES}
    return {
        "batch": running,
        "step_ms": {"mean": total / steps, "median": statistics.median(step_ms), "min": min(step_ms)},
        "output_tokens_per_s": running * 1e3 * steps / total,
        "ms_per_step": parts,
        "share": {c: v / (total / steps) for c, v in parts.items()},
    }


def run_profile_bench(json_out: str, batch_sizes: list[int], model: str, dtype: str, quantization: str | None,
                      steps: int, prompt_tokens: int) -> int:
    from bench.common import machine_info, write_json
    from bench.datasets.sharegpt import load_sharegpt_requests

    console = Console(stderr=True)
    loaded = load_model(model, dtype)
    if quantization:
        from engines.quantization.build import quantize_loaded
        quantize_loaded(loaded, quantization, effective_group_size(quantization, 64))
    requests = load_sharegpt_requests(loaded.tokenizer, loaded.chat_template, max(batch_sizes), prompt_tokens, 128,
                                      seed=0)
    prompts = [r.prompt_ids for r in requests]
    timers = ExclusiveTimers()
    results = []
    for b in batch_sizes:
        kv = max(64, (b * (prompt_tokens + steps + 24) * _kv_bytes_per_token(loaded) * 5 // 4) >> 20)
        engine = LLMEngine(loaded, EngineConfig(kv_cache_memory_bytes=kv << 20, max_num_seqs=b,
                                                max_num_batched_tokens=max(2048, b)))
        with instrumented(engine, timers):
            console.log(f"batch {b}: profiling {steps} decode steps")
            results.append(profile_batch(engine, prompts[:b], steps, timers))
        del engine
    doc = {"benchmark": "profile", "machine": machine_info(),
           "workload": {"model": model, "dtype": dtype, "quantization": quantization, "steps": steps,
                        "max_prompt_tokens": prompt_tokens, "prompts": "ShareGPT V3 first human turns"},
           "categories": list(CATEGORIES), "batches": results}
    write_json(json_out, doc)
    console.print(_table(results))
    return 0


def _kv_bytes_per_token(loaded) -> int:
    cfg = loaded.config
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * loaded.model.dtype.itemsize


def _table(results: list[dict]) -> Table:
    table = Table(title="decode step, ms (share)")
    table.add_column("part")
    for r in results:
        table.add_column(f"batch {r['batch']}")
    for c in CATEGORIES:
        table.add_row(c, *(f"{r['ms_per_step'][c]:.2f} ({r['share'][c]:.0%})" for r in results))
    table.add_row("step", *(f"{r['step_ms']['mean']:.2f}" for r in results))
    table.add_row("tok/s", *(f"{r['output_tokens_per_s']:.0f}" for r in results))
    return table
