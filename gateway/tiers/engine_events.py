"""Span events from one engine request's outputs: scheduled, preempted, speculative acceptance.

The engine reports these facts on every output (engines.RequestOutput) with its own
time.monotonic() clock; they are turned into events on the tier span with the time they
happened, not the time the output reached the gateway. The queued and first-token events are
emitted by the tier itself, as they happen.
"""

from __future__ import annotations

import time


def _wall_ns(monotonic_s: float) -> int:
    return time.time_ns() - int((time.monotonic() - monotonic_s) * 1e9)


class EngineEvents:
    def __init__(self, span):
        self.span = span
        self._scheduled = False
        self._preemptions = 0

    def observe(self, out) -> None:
        if not self.span.recording:
            return
        if not self._scheduled and out.scheduled_at is not None:
            self._scheduled = True
            self.span.scheduled(at_ns=_wall_ns(out.scheduled_at))
        if out.num_preemptions > self._preemptions:
            # Only the latest preemption's time is known: earlier ones of the same gap share it.
            at_ns = _wall_ns(out.preempted_at) if out.preempted_at is not None else None
            for _ in range(out.num_preemptions - self._preemptions):
                self.span.preempted(at_ns=at_ns)
            self._preemptions = out.num_preemptions
        if out.finished and out.spec_proposed:
            self.span.speculative(out.spec_accepted, out.spec_proposed)
