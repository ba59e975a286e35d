"""Core sharing: a tier is told it is alone exactly while no other embedded tier has calls in
flight; upstream tiers never count; a reload's new sharing takes the reused tiers over."""

from __future__ import annotations

from gateway.tiers.base import Tier
from gateway.tiers.core_sharing import CoreSharing


class _Recording(Tier):
    def __init__(self, name: str, kind: str = "embedded"):
        super().__init__(name, config=None)
        self.kind = kind
        self.told: list[bool] = []

    def set_alone(self, alone: bool) -> None:
        self.told.append(alone)


def test_alone_follows_the_other_embedded_tiers_calls():
    fast, small, remote = _Recording("fast"), _Recording("small"), _Recording("remote", kind="upstream")
    CoreSharing([fast, small, remote])
    assert fast.told[-1] and small.told[-1] and remote.told == []    # nothing in flight: everyone alone
    fast.in_flight += 1
    assert fast.told[-1] and not small.told[-1]
    fast.in_flight += 1                        # still busy: no transition, nobody told again
    assert len(fast.told) == 2
    remote.in_flight += 1                      # an upstream call computes elsewhere
    assert fast.told[-1] and len(fast.told) == 2
    small.in_flight += 1
    assert not fast.told[-1] and not small.told[-1]
    fast.in_flight -= 2
    assert small.told[-1] and fast.told[-1] is False
    small.in_flight -= 1
    assert fast.told[-1] and small.told[-1]


def test_a_new_sharing_takes_the_tiers_over_and_the_old_one_lets_go():
    fast, small = _Recording("fast"), _Recording("small")
    old = CoreSharing([fast, small])
    new = CoreSharing([fast])                  # `small` left the config
    old.detach()
    assert fast.on_busy_change == new.update and small.on_busy_change is None
    small.in_flight += 1                       # a retired tier's last calls no longer count
    assert fast.told[-1]
