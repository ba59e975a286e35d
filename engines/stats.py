"""Engine counters, read by the gateway's metrics and by the benchmarks."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class EngineStats:
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0
    kv_capacity_tokens: int = 0
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    preemptions: int = 0
    queue_depth: int = 0
    running: int = 0
    steps: int = 0
    last_step_ms: float = 0.0
    total_step_s: float = 0.0
    prompt_tokens_computed: int = 0
    generated_tokens: int = 0
    # Internal fragmentation: slots of allocated blocks that hold no token, summed over steps.
    kv_wasted_slot_steps: int = 0
    kv_allocated_slot_steps: int = 0

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_queried_tokens if self.prefix_queried_tokens else 0.0

    @property
    def kv_fragmentation(self) -> float:
        return self.kv_wasted_slot_steps / self.kv_allocated_slot_steps if self.kv_allocated_slot_steps else 0.0

    def as_dict(self) -> dict:
        out = asdict(self)
        out.update(kv_usage=self.kv_usage, prefix_hit_rate=self.prefix_hit_rate,
                   kv_fragmentation=self.kv_fragmentation)
        return out
