"""What the cascade does to time to first token, from single-stream timings of both tiers on
the same prompts, each prompt timed on small and then at once on large (so both see the same
load on a shared machine).

A request the cascade keeps on small reaches the client only once K tokens are judged, so its
TTFT grows by about (K - 1) * TPOT; one it escalates waits for the small tier's prefill and K
tokens, then the large tier's own TTFT. Ratios are taken per prompt, then their median.
"""

from __future__ import annotations

import statistics

from bench.common import percentiles
from bench.routing.speed import RequestTiming


def cascade_latency(small: list[RequestTiming], large: list[RequestTiming], k: int) -> dict:
    if not small or len(small) != len(large):
        raise ValueError("need the same non-empty list of prompts timed on both tiers")
    kept_overhead = [(k - 1) * s.tpot_ms / s.ttft_ms for s in small]
    measured_overhead = [(s.time_to_k_ms - s.ttft_ms) / s.ttft_ms for s in small]
    escalated = [s.ttft_ms + (k - 1) * s.tpot_ms + l.ttft_ms for s, l in zip(small, large)]
    return {
        "tokens": k,
        "prompts": len(small),
        "small_ttft_ms": percentiles([s.ttft_ms for s in small]),
        "small_tpot_ms": percentiles([s.tpot_ms for s in small]),
        "large_ttft_ms": percentiles([l.ttft_ms for l in large]),
        "large_tpot_ms": percentiles([l.tpot_ms for l in large]),
        # (K - 1) * TPOT / TTFT of the small tier, per prompt: the headline
        "cascade_ttft_overhead": statistics.median(kept_overhead),
        # the same hold-back timed directly: the K-th token's arrival against the first's
        "cascade_ttft_overhead_measured": statistics.median(measured_overhead),
        "kept_on_small_ttft_ms": percentiles([s.ttft_ms + (k - 1) * s.tpot_ms for s in small]),
        "escalated_ttft_ms": percentiles(escalated),
        "escalated_vs_large_ttft": statistics.median(e / l.ttft_ms for e, l in zip(escalated, large)),
    }
