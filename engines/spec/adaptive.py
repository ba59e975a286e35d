"""How many tokens to draft for a sequence: adapted to its measured acceptance.

Per sequence, an exponentially weighted count of accepted drafts (successes) and of
rejections (failures) estimates alpha, the chance that a draft token is accepted given the
one before it was. Adding the j-th draft token yields alpha**j more tokens in expectation
and costs one more draft step plus one more verified row, `cost` in units of a target step.
So k is the largest j <= k_max with alpha**j >= cost; with alpha**1 < cost the sequence
decodes plainly, and its estimate drifts back toward the prior so that it tries again.
"""

from __future__ import annotations

import math

from engines.sequence import Sequence

PRIOR_ALPHA = 0.7
PRIOR_WEIGHT = 2.0        # the prior counts as this many observations
DECAY = 0.8               # weight kept by old observations at each new one
RECOVERY = 0.1            # per plain step, how far the estimate drifts back to the prior


class AdaptiveK:
    def __init__(self, k_max: int, adaptive: bool):
        self.k_max = k_max
        self.adaptive = adaptive
        self._prior = (PRIOR_ALPHA * PRIOR_WEIGHT, (1 - PRIOR_ALPHA) * PRIOR_WEIGHT)

    def alpha(self, seq: Sequence) -> float:
        s, f = seq.spec_ewma or self._prior
        return s / (s + f) if s + f > 0 else PRIOR_ALPHA

    def choose(self, seq: Sequence, cost: float) -> int:
        if not self.adaptive:
            return self.k_max
        a = self.alpha(seq)
        if a <= cost or a <= 0.0:
            self._recover(seq)
            return 0
        if a >= 1.0 or cost <= 0.0:
            return self.k_max
        return max(1, min(self.k_max, math.floor(math.log(cost) / math.log(a))))

    def observe(self, seq: Sequence, proposed: int, accepted: int) -> None:
        s, f = seq.spec_ewma or self._prior
        seq.spec_ewma = (DECAY * s + accepted, DECAY * f + (1.0 if accepted < proposed else 0.0))

    def _recover(self, seq: Sequence) -> None:
        s, f = seq.spec_ewma or self._prior
        ps, pf = self._prior
        seq.spec_ewma = (s + RECOVERY * (ps - s), f + RECOVERY * (pf - f))
