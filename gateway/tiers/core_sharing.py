"""Which tier may use the machine's idle cores.

A tier whose engine runs with `solo_threads` takes more threads while it is the only embedded
tier with calls in flight, and gives them back the moment another one has work: spinning
OpenMP workers are fast on idle cores and slow everything sharing theirs (docs/BENCHMARKS.md).
Upstream tiers compute elsewhere and do not count. Each tier reports its busy/idle transitions
(Tier.on_busy_change); this tells every embedded tier whether it is alone after each one.
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.tiers.base import Tier


class CoreSharing:
    def __init__(self, tiers: Iterable[Tier]):
        self.tiers = [t for t in tiers if t.kind == "embedded"]
        for tier in self.tiers:
            tier.on_busy_change = self.update
        self.update()

    def update(self) -> None:
        busy = [t for t in self.tiers if t.in_flight > 0]
        for tier in self.tiers:
            tier.set_alone(all(t is tier for t in busy))

    def detach(self) -> None:
        """The tiers are about to serve another runtime's sharing (a reload)."""
        for tier in self.tiers:
            if tier.on_busy_change == self.update:
                tier.on_busy_change = None
