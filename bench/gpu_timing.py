"""Kernel timings for the GPU benchmarks.

Two figures per call:
  eager_ms  triton's do_bench median: launches from Python, L2 flushed between calls. What an
            eager caller pays, host launch cost included (tens of microseconds per Triton
            launch on this host, more than a small kernel runs).
  cold_ms   the kernels' own GPU time: calls captured in a CUDA graph, each after a write
            over a buffer larger than L2, minus a graph of the writes alone. No launch cost,
            and no operand left in the 60 MB L2 by the previous call (a warm replay would
            credit a 13 MB weight or a 34 MB KV cache with L2 bandwidth).
"""

from __future__ import annotations

import statistics
import time

import torch

FLUSH_BYTES = 256 << 20        # over four times an H200's L2
CALLS_PER_GRAPH = 20
REPLAYS = 9


def eager_ms(fn) -> float:
    from triton.testing import do_bench
    return do_bench(fn, warmup=10, rep=40, return_mode="median")


def _replay_ms(graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream) -> float:
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        graph.replay()
        end.record(stream)
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def cold_graph_ms(fn, flush: torch.Tensor) -> float | None:
    """GPU ms of one call of `fn` with a cold L2, or None when `fn` cannot be captured (an op
    that synchronizes with the host)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            fn()                                           # compiled and allocator warm before capture
            both, writes = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
            with torch.cuda.graph(both, stream=stream):
                for _ in range(CALLS_PER_GRAPH):
                    flush.zero_()
                    fn()
            with torch.cuda.graph(writes, stream=stream):
                for _ in range(CALLS_PER_GRAPH):
                    flush.zero_()
            torch.cuda.synchronize()
            total, alone = _replay_ms(both, stream), _replay_ms(writes, stream)
    except RuntimeError:
        torch.cuda.synchronize()
        return None
    return max(total - alone, 1e-6) / CALLS_PER_GRAPH


class Timer:
    """timed(fn) -> (cold_ms or None, eager_ms); on the CPU smoke run (interpreter) one wall-clock
    call stands for the eager figure and there is no cold one."""

    def __init__(self, smoke: bool, device: torch.device):
        self.smoke = smoke
        self.flush = None if smoke else torch.empty(FLUSH_BYTES // 4, dtype=torch.float32, device=device)

    def __call__(self, fn) -> tuple[float | None, float]:
        return (None if self.smoke else cold_graph_ms(fn, self.flush)), self.eager(fn)

    def eager(self, fn) -> float:
        if not self.smoke:
            return eager_ms(fn)
        fn()
        started = time.perf_counter()
        fn()
        return (time.perf_counter() - started) * 1e3
