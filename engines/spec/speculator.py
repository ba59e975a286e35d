"""Speculative decoding inside the continuous-batching step.

Per step: the scheduler asks `lookahead` how many draft slots each decoding sequence
should get (adaptive k, 0 above `max_batch` running sequences, never past max_tokens or
the context); the target runner's before-forward hook (`before_forward`) fills the drafts;
the target computes each speculating sequence's last token and its drafts in the same flat
forward as everyone else, and its after-forward hook times that forward for adaptive k;
`verify` applies the exact rule per sequence, so each accepts a different number of
tokens. The engine then appends the accepted tokens and rolls the rest back
(engines/llm_engine.py).

`attach` is the one place the speculator joins the target runner, through the runner's
public hooks only (engines/model_runner.py).
"""

from __future__ import annotations

import time

import torch

from engines.model_runner import ModelRunner
from engines.sampler import Sampler
from engines.scheduler import ScheduledSeq
from engines.sequence import Sequence
from engines.spec.adaptive import AdaptiveK
from engines.spec.config import SpeculativeConfig
from engines.spec.source import DraftSource
from engines.spec.verify import SpecGroup, Verdict, verify
from engines.stats import EngineStats, SpecStats

EWMA_WEIGHT = 0.2


class Speculator:
    def __init__(self, config: SpeculativeConfig, source: DraftSource, sampler: Sampler, stats: EngineStats,
                 max_model_len: int):
        self.config = config
        self.source = source
        self.sampler = sampler
        self.engine_stats = stats
        self.max_model_len = max_model_len
        self.k = AdaptiveK(config.num_tokens, config.adaptive)
        self._draft_step_s: float | None = None     # EWMA: one draft token for the batch
        self._target_step_s: float | None = None    # EWMA: one target forward

    @property
    def stats(self) -> SpecStats:
        # Looked up each time: benchmarks may reset the engine's counters.
        return self.engine_stats.spec_source(self.source.name, self.config.num_tokens)

    def step_cost(self) -> float:
        """Cost of one more draft token, in target steps: drafting it plus verifying its row."""
        draft = 0.0
        if self._draft_step_s is not None and self._target_step_s:
            draft = self._draft_step_s / self._target_step_s
        return draft + self.config.verify_cost

    def attach(self, target_runner: ModelRunner) -> None:
        """Draft before and time after each of the target's forwards; let the source join
        them too (the self-draft mirrors the target's K/V)."""
        target_runner.add_hook(self)
        self.source.attach(target_runner)

    # ---- the target runner's hooks ---------------------------------------------------
    def before_forward(self, scheduled: list[ScheduledSeq]) -> None:
        self.propose(scheduled)

    def after_forward(self, scheduled: list[ScheduledSeq], seconds: float) -> None:
        if all(s.num_tokens == 1 for s in scheduled):
            # Decode steps only: a prefill chunk would make drafting look cheap.
            self.observe_target_step(seconds)

    # ---- before the forward ----------------------------------------------------------
    def lookahead(self, seq: Sequence, num_running: int) -> int:
        if num_running > self.config.max_batch:
            return 0
        # The step emits up to k + 1 tokens: stay within max_tokens and the context.
        room = min(seq.params.max_tokens - len(seq.output_ids), self.max_model_len - seq.num_tokens) - 1
        if room <= 0:
            return 0
        return min(self.k.choose(seq, self.step_cost()), room)

    def propose(self, scheduled: list[ScheduledSeq]) -> None:
        entries = [(s, s.num_lookahead) for s in scheduled if s.num_lookahead > 0]
        if not entries:
            return
        started = time.perf_counter()
        step_s = self.source.propose(entries)
        self.stats.draft_time_s += time.perf_counter() - started
        if step_s is not None:
            self._draft_step_s = _ewma(self._draft_step_s, step_s)

    def observe_target_step(self, seconds: float) -> None:
        self._target_step_s = _ewma(self._target_step_s, seconds)

    def count_backoff(self, num_running: int) -> None:
        if num_running > self.config.max_batch:
            self.stats.backoff_steps += 1

    # ---- after the forward -----------------------------------------------------------
    def verify(self, logits: torch.Tensor, groups: list[SpecGroup]) -> list[Verdict]:
        verdicts = verify(logits, groups, self.sampler)
        stats = self.stats
        for g, v in zip(groups, verdicts):
            stats.record(len(g.drafts), v.num_accepted)
            self.k.observe(g.seq, len(g.drafts), v.num_accepted)
        return verdicts


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else (1 - EWMA_WEIGHT) * old + EWMA_WEIGHT * new
