"""`tiergate bench decode`: single-stream decode tokens/s of our model next to transformers'
`generate`, on the same weights, same prompt, same dtype, in one process."""

from __future__ import annotations

import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from engines.loaded_model import load_model
from engines.simple_generate import SimpleSampling, generate_tokens
from bench.common import machine_info, write_json

PROMPT = "Write a detailed essay about the history of the Roman Empire."


def _time_ours(loaded, prompt_ids: list[int], new_tokens: int) -> float:
    sampling = SimpleSampling(max_tokens=new_tokens, ignore_eos=True)
    started = time.perf_counter()
    n = sum(1 for _ in generate_tokens(loaded.model, prompt_ids, sampling))
    elapsed = time.perf_counter() - started
    assert n == new_tokens
    return n / elapsed


def _time_transformers(model, prompt_ids: list[int], new_tokens: int) -> float:
    ids = torch.tensor([prompt_ids])
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    elapsed = time.perf_counter() - started
    assert out.shape[1] - ids.shape[1] == new_tokens
    return new_tokens / elapsed


def run_decode_bench(json_out: str, new_tokens: int, repeats: int, dtypes: list[str]) -> int:
    from transformers import AutoModelForCausalLM  # a test extra: only the benchmark needs it

    console = Console(stderr=True)
    report = {
        "benchmark": "decode",
        "machine": machine_info(),
        "workload": {"prompt": PROMPT, "new_tokens": new_tokens, "repeats": repeats, "batch": 1,
                     "note": "tokens/s includes prefill of the prompt; EOS ignored; best-of-repeats is not used, median is"},
        "results": {},
    }
    table = Table(title="single-stream decode, tokens/s (median)")
    for col in ("dtype", "tiergate", "transformers", "ratio"):
        table.add_column(col)
    for dtype in dtypes:
        console.log(f"loading models in {dtype}")
        loaded = load_model("default", dtype)
        torch_dtype = loaded.dtype
        ref = AutoModelForCausalLM.from_pretrained(loaded.path, dtype=torch_dtype).eval()
        prompt_ids = loaded.tokenizer.encode(loaded.chat_template.render([{"role": "user", "content": PROMPT}]))
        _time_ours(loaded, prompt_ids, 8)  # warm-up both
        _time_transformers(ref, prompt_ids, 8)
        ours, theirs = [], []
        for i in range(repeats):
            console.log(f"{dtype}: repeat {i + 1}/{repeats}")
            ours.append(_time_ours(loaded, prompt_ids, new_tokens))
            theirs.append(_time_transformers(ref, prompt_ids, new_tokens))
        ours_med, theirs_med = statistics.median(ours), statistics.median(theirs)
        report["results"][dtype] = {
            "tiergate": {"output_tokens_per_s": ours_med, "runs": ours},
            "transformers": {"output_tokens_per_s": theirs_med, "runs": theirs},
            "ratio_tiergate_over_transformers": ours_med / theirs_med,
            "prompt_tokens": len(prompt_ids),
        }
        table.add_row(dtype, f"{ours_med:.1f}", f"{theirs_med:.1f}", f"{ours_med / theirs_med:.2f}x")
        del ref, loaded
    console.print(table)
    write_json(json_out, report)
    return 0
