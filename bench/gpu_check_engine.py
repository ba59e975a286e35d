"""Whole-engine part of bench/gpu_check.py: the real SmolLM2 loaded on CUDA runs
LLMEngine end to end (KV pool, step tensors, sampler on the GPU; attention, norms, RoPE and
SiLU in Triton), against the CPU path in the same process:
  fp32  greedy tokens must equal the CPU path's (PASS/FAIL)
  bf16  runs on CUDA + Triton (PASS/FAIL); token agreement with the CPU bf16 path reported
        (bf16 greedy tokens may legitimately differ, see DESIGN)
  decode tokens/s on the GPU at batch 1 and 32, per dtype.
With `smoke` (CPU, interpreter) the "device" side is the CPU too: it checks this script only.
The CUDA side (pinned uploads, CUDA generators, compiled kernels inside the engine) is covered
on CPU-only machines by the meta-device tests alone; this script is what runs it for real.
"""

from __future__ import annotations

import time

import torch

from engines.engine_config import EngineConfig
from engines.llm_engine import LLMEngine
from engines.loaded_model import load_model
from engines.sampling_params import SamplingParams

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List three prime numbers greater than 20.",
]


def _prompts(loaded) -> list[list[int]]:
    render = loaded.chat_template.render
    return [loaded.tokenizer.encode(render([{"role": "user", "content": q}])) for q in QUESTIONS]


def _engine(loaded, batch: int) -> LLMEngine:
    return LLMEngine(loaded, EngineConfig(kv_cache_memory_bytes=256 * 2**20, max_num_seqs=max(batch, 4),
                                          max_num_batched_tokens=2048))


def greedy(loaded, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], LLMEngine]:
    engine = _engine(loaded, len(prompts))
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return engine.generate(prompts, params), engine


def agreement(reference: list[list[int]], got: list[list[int]]) -> dict:
    """Identical sequences, and the share of tokens before each sequence's first difference."""
    prefix = 0
    for ref, out in zip(reference, got):
        n = 0
        while n < min(len(ref), len(out)) and ref[n] == out[n]:
            n += 1
        prefix += n
    total = sum(len(r) for r in reference)
    same = sum(r == o for r, o in zip(reference, got))
    return {"identical_sequences": same, "sequences": len(reference), "matching_prefix_tokens": prefix,
            "tokens": total, "agreement": prefix / max(1, total)}


def decode_tokens_per_s(loaded, prompt: list[int], batch: int, new_tokens: int) -> float:
    """Output tokens/s of decode steps only: the prefills run first, untimed. Each step ends
    with the sampled ids on the host (one sync), so wall time per step is the real cost."""
    engine = _engine(loaded, batch)
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"b{i}", prompt + [prompt[-1 - i % len(prompt)]], params)
    produced = 0
    while produced < batch and engine.has_unfinished():           # prefills (and first tokens)
        produced += sum(len(o.token_ids) for o in engine.step())
    started, timed = time.perf_counter(), 0
    while engine.has_unfinished():
        timed += sum(len(o.token_ids) for o in engine.step())
    return timed / (time.perf_counter() - started)


def run(device: torch.device, smoke: bool, emit) -> dict:
    """emit(section, dict) stores and writes each result as it comes; returns the whole section."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False     # fp32 must be fp32 for the exactness check
    max_tokens, batches, new_tokens = (2, (1, 2), 2) if smoke else (32, (1, 32), 64)
    result: dict = {}
    for dtype in ("float32", "bfloat16"):
        started = time.perf_counter()
        entry: dict = {"dtype": dtype}
        try:
            cpu_model = load_model("default", dtype)
            prompts = _prompts(cpu_model)[: 2 if smoke else None]
            reference, _ = greedy(cpu_model, prompts, max_tokens)
            dev_model = cpu_model if device.type == "cpu" else load_model("default", dtype, device=device)
            got, engine = greedy(dev_model, prompts, max_tokens)
            entry.update(cpu_tokens=reference, device_tokens=got, attention_ops=engine.runner.attn.ops.name,
                         pool_device=str(engine.pool.k.device), **agreement(reference, got))
            on_device = engine.pool.k.device == dev_model.device and (smoke or entry["attention_ops"] == "triton")
            ran = on_device and all(len(o) == max_tokens for o in got)
            entry["ok"] = ran and (dtype != "float32" or reference == got)
            rates = entry["decode_tokens_per_s"] = {}
            for b in batches:
                decode_tokens_per_s(dev_model, prompts[0], b, 4)          # warm-up: compiles this batch's variants
                rates[str(b)] = decode_tokens_per_s(dev_model, prompts[0], b, new_tokens)
        except Exception as exc:  # noqa: BLE001  report it as a FAIL line, keep the other dtype's figures
            entry.update(ok=False, exception=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
        entry["seconds"] = time.perf_counter() - started
        result[dtype] = entry
        emit(result)
        print_entry(entry, device)
    return result


def print_entry(e: dict, device: torch.device) -> None:
    verdict = "PASS" if e["ok"] else "FAIL"
    if "exception" in e:
        print(f"{verdict} engine {e['dtype']} on {device}: {e['exception']}", flush=True)
        return
    what = "greedy tokens identical to the CPU path" if e["dtype"] == "float32" else "ran end to end"
    print(f"{verdict} engine {e['dtype']} on {e['pool_device']} ({e['attention_ops']} attention): {what}; "
          f"{e['identical_sequences']}/{e['sequences']} sequences identical, "
          f"{100 * e['agreement']:.1f} % of tokens before the first difference", flush=True)
    rates = ", ".join(f"batch {b}: {r:.0f}" for b, r in e.get("decode_tokens_per_s", {}).items())
    print(f"INFO engine {e['dtype']} decode tokens/s on {e['pool_device']}: {rates}", flush=True)
