"""What a request costs on a tier, in CPU-seconds, from that tier's measured throughput.

cost = cores * (prompt_tokens / prefill_tokens_per_s + output_tokens / decode_tokens_per_s),
with the throughputs of a loaded engine (batch 32 by default): the share of the machine one
request takes while the tier serves a full batch. A cascade that escalates has already paid the
small tier's prefill and its probe tokens: that work is wasted, and charged to the request.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TierCost:
    cores: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float

    def __post_init__(self) -> None:
        if self.cores < 1 or self.prefill_tokens_per_s <= 0 or self.decode_tokens_per_s <= 0:
            raise ValueError("a tier's cost needs >= 1 core and positive throughputs")

    def request(self, prompt_tokens, output_tokens):
        """CPU-seconds of prefilling `prompt_tokens` and decoding `output_tokens` (scalars or arrays)."""
        prompt = np.asarray(prompt_tokens, dtype=float)
        output = np.asarray(output_tokens, dtype=float)
        return self.cores * (prompt / self.prefill_tokens_per_s + output / self.decode_tokens_per_s)

    def probe(self, prompt_tokens, probe_tokens):
        """What the small tier has spent when a cascade decides: the prefill and the tokens it judged."""
        return self.request(prompt_tokens, probe_tokens)
