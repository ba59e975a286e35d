"""A seeded request's random numbers, one per output position.

A seeded sampled token at output position t is drawn with the t-th uniform of the request's
own generator, whatever happened before it: how many draft tokens a speculative step verified
(the scheduler cuts drafts when the KV pool is tight, backs off in big batches, or a draft
model proposes more or fewer), a preemption, or what ran beside it in the batch. Verification
then accepts a draft exactly when it equals the token the target samples at its position with
that position's uniform (engines/spec/verify.py), so a seed gives the same text with and
without speculation.
"""

from __future__ import annotations

import torch

# Uniforms are drawn from the generator this many at a time (one call instead of one per token).
CHUNK = 64


class PositionDraws:
    def __init__(self, seed: int):
        self._generator = torch.Generator().manual_seed(seed)
        self._values: list[float] = []
        self._base = 0          # output position of self._values[0]

    def at(self, position: int) -> float:
        """The uniform in [0, 1) of output position `position` (the same on every call)."""
        index = position - self._base
        if index < 0:
            raise ValueError(f"position {position} was released (earliest kept: {self._base})")
        while len(self._values) <= index:
            self._values.extend(torch.rand(CHUNK, dtype=torch.float64, generator=self._generator).tolist())
        return self._values[index]

    def release_before(self, position: int) -> None:
        """Positions before `position` are emitted and never drawn again: drop their uniforms
        (whole chunks at a time, so that a long answer keeps O(CHUNK) of them)."""
        drop = (position - self._base) // CHUNK * CHUNK
        if drop > 0:
            del self._values[:drop]
            self._base += drop
