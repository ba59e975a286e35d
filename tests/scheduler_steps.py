"""Scheduler tests without a model: sequences with distinct prompts, and a step in which the
model is pretended to have run."""

from __future__ import annotations

from engines.sampling_params import SamplingParams
from engines.scheduler import Scheduler
from engines.sequence import Sequence


def make_seq(rid: str, n_prompt: int, priority: int = 0, rank: int = 0, arrival: float = 0.0) -> Sequence:
    base = 100 * sum(map(ord, rid))               # distinct prompts per id, no shared prefix
    return Sequence(rid, list(range(base, base + n_prompt)), SamplingParams(max_tokens=50),
                    priority=priority, rank=rank, arrival=arrival)


def run_step(sched: Scheduler):
    """Pretend the model ran: mark tokens computed and sample one token where due."""
    out = sched.schedule()
    for s in out.scheduled:
        s.seq.num_computed_tokens += s.num_tokens
        if s.samples:
            s.seq.output_ids.append(7)
    return out
