"""The transformers baseline for `tiergate bench offline`: static batching.

Requests are cut, in the order given, into batches of `batch_size`. Each batch is
left-padded into one tensor and run through `generate` until its longest request
has all its tokens; shorter requests keep decoding (wasted work) because a static
batch only ends as a whole. EOS is ignored (min_new_tokens == max_new_tokens), so
every request gets at least its `output_len` tokens; only those count as useful.

Token times come from a logits processor: `generate` calls it once per step, right
after the forward pass that produced that step's logits, so its first call marks
the end of the batch's prefill.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench.common import percentiles
from bench.datasets.sharegpt import BenchRequest


@dataclass
class StaticBatchResult:
    batch_size: int
    elapsed_s: float
    output_tokens: int  # useful tokens: sum of each request's output_len
    generated_tokens: int  # incl. wasted ones (a batch runs to its longest output)
    output_tokens_per_s: float
    ttft_ms: dict  # {"p50","p90","p99"}: from bench start (queueing included) to the request's first token
    tpot_ms: dict  # {"p50","p90","p99"}: per request, time per output token after the first


class _StepClock:
    """A pass-through logits processor that stamps the time of every decode step."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if scores.is_cuda:  # the forward was only queued; wait for it so the stamp is honest
            torch.cuda.synchronize(scores.device)
        self.stamps.append(time.perf_counter())
        return scores


def left_padded_batch(prompts: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and attention_mask for `prompts`, padded on the left to the longest one."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every request needs at least one prompt token")
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, width - len(ids):] = 1
    return input_ids, attention_mask


def _generate(model, batch: list[BenchRequest], pad_token_id: int, device: torch.device) -> tuple[list[float], int]:
    """Run one static batch; return the per-step time stamps and the tokens it generated."""
    from transformers import LogitsProcessorList

    input_ids, attention_mask = left_padded_batch([r.prompt_ids for r in batch], pad_token_id)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    new_tokens = max(r.output_len for r in batch)
    clock = _StepClock()
    out = model.generate(
        input_ids,
        attention_mask=attention_mask,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=pad_token_id,
        logits_processor=LogitsProcessorList([clock]),
    )
    generated_per_row = out.shape[1] - input_ids.shape[1]
    if len(clock.stamps) < new_tokens:
        raise RuntimeError(f"generate made {len(clock.stamps)} steps, expected {new_tokens}")
    return clock.stamps, generated_per_row * len(batch)


def run_hf_static(
    model_path: str | Path,
    requests: list[BenchRequest],
    batch_size: int,
    dtype: torch.dtype,
    pad_token_id: int,
    progress: bool = True,
    *,
    device: str | torch.device = "cpu",
    warmup: bool = True,
) -> StaticBatchResult:
    """Serve `requests` with transformers' `generate` in static batches of `batch_size`.

    The clock starts after the model is loaded (and warmed up with one short
    request), so every request's TTFT includes the time it waited for earlier batches.
    """
    from transformers import AutoModelForCausalLM  # only the benchmarks need transformers

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not requests:
        raise ValueError("no requests to run")
    if any(r.output_len < 1 for r in requests):
        raise ValueError("every request needs output_len >= 1")
    device = torch.device(device)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).eval()
    batches = [requests[i:i + batch_size] for i in range(0, len(requests), batch_size)]

    ttft_s: list[float] = []
    tpot_s: list[float] = []
    generated = 0
    columns = (TextColumn("hf static b={task.fields[bs]}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with torch.inference_mode(), Progress(*columns, console=Console(stderr=True), disable=not progress) as bar:
        if warmup:
            first = requests[0]
            _generate(model, [BenchRequest("warmup", first.prompt, first.prompt_ids, 2)], pad_token_id, device)
        task = bar.add_task("requests", total=len(requests), bs=batch_size)
        started = time.perf_counter()
        for batch in batches:
            stamps, made = _generate(model, batch, pad_token_id, device)
            generated += made
            for request in batch:
                first_token = stamps[0]
                ttft_s.append(first_token - started)
                if request.output_len > 1:
                    tpot_s.append((stamps[request.output_len - 1] - first_token) / (request.output_len - 1))
            bar.advance(task, len(batch))
        elapsed = time.perf_counter() - started

    useful = sum(r.output_len for r in requests)
    return StaticBatchResult(
        batch_size=batch_size,
        elapsed_s=elapsed,
        output_tokens=useful,
        generated_tokens=generated,
        output_tokens_per_s=useful / elapsed if elapsed > 0 else float("nan"),
        ttft_ms=percentiles([t * 1e3 for t in ttft_s]),
        tpot_ms=percentiles([t * 1e3 for t in tpot_s]),
    )
