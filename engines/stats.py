"""Engine counters, read by the gateway's metrics and by the benchmarks."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class SpecStats:
    """Speculative decoding counters of one draft source ("ngram", "draft" or "self")."""
    source: str
    max_drafts: int = 0                  # k_max: the histogram has k_max + 1 bins
    proposed_tokens: int = 0             # draft tokens sent to verification
    accepted_tokens: int = 0             # of those, accepted by the exact rule
    verifications: int = 0               # (sequence, step) pairs that verified drafts
    emitted_tokens: int = 0              # accepted + the target's own token per verification
    accepted_length_hist: list[int] = field(default_factory=list)   # [m] = verifications accepting m
    draft_time_s: float = 0.0            # proposing (draft forwards, n-gram lookups)
    backoff_steps: int = 0               # steps without speculation: batch above max_batch

    def record(self, proposed: int, accepted: int) -> None:
        self.proposed_tokens += proposed
        self.accepted_tokens += accepted
        self.verifications += 1
        self.emitted_tokens += accepted + 1
        hist = self.accepted_length_hist
        if len(hist) <= accepted:
            hist.extend([0] * (max(accepted, self.max_drafts) + 1 - len(hist)))
        hist[accepted] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.proposed_tokens if self.proposed_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return self.accepted_tokens / self.verifications if self.verifications else 0.0

    def as_dict(self) -> dict:
        out = asdict(self)
        out.update(acceptance_rate=self.acceptance_rate, mean_accepted_length=self.mean_accepted_length)
        return out


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
    spec: dict[str, SpecStats] = field(default_factory=dict)   # per draft source

    def spec_source(self, source: str, max_drafts: int = 0) -> SpecStats:
        stats = self.spec.get(source)
        if stats is None:
            stats = self.spec[source] = SpecStats(source, max_drafts)
        return stats

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
                   kv_fragmentation=self.kv_fragmentation,
                   spec={name: s.as_dict() for name, s in self.spec.items()})
        return out
