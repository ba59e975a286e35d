"""Walking a route's chain of tiers: which tier a request calls next, and why the others were
passed over (unusable, breaker open, tier at its budget limits, failed, too small)."""

from __future__ import annotations

import logging

from gateway.context import RequestContext
from gateway.errors import GatewayError
from gateway.runtime import Runtime
from gateway.tiers.base import Tier, TierFailure, TierUnfit
from policies.route import next_candidate

events = logging.getLogger("gateway.pipeline")    # the pipeline's log of tier failures


class ChainWalk:
    """Walks a route's chain: the next tier that may be called (usable, its breaker lets the
    call through, the budget reserved for it), recording why the others were passed over."""

    def __init__(self, rt: Runtime, ctx: RequestContext, chain: tuple[str, ...]):
        self.rt, self.ctx, self.chain = rt, ctx, chain
        self.index = 0
        self.unfit: TierUnfit | None = None    # the last tier that could not hold the request
        self.busy: list[Tier] = []             # passed over at their max_in_flight, in chain order

    async def next_tier(self) -> Tier:
        """Raises the request's error when no tier is left."""
        ctx = self.ctx
        while True:
            self.index, skipped = next_candidate(self.chain, self.index, self.rt.usable)
            ctx.fallbacks.extend(skipped)
            if self.index < len(self.chain):
                tier = self.rt.tiers[self.chain[self.index]]
                self.index += 1
                if tier.busy:
                    self.busy.append(tier)
                    ctx.fallbacks.append(f"{tier.name}: busy ({tier.in_flight} calls in flight)")
                    continue
            elif self.busy:                     # every tier left is busy: wait in the first one's queue
                tier = self.busy.pop(0)
            else:
                raise ctx.limits_guard.nothing_left(self.chain, self.unfit)
            skip = await ctx.limits_guard.admit(tier)     # breaker permit + budget reservation, or why not
            if skip is None:
                ctx.tier = tier.name
                return tier
            ctx.fallbacks.append(skip)

    async def failed(self, tier: Tier, exc: TierUnfit | TierFailure | GatewayError) -> None:
        """An attempt gave no answer: release what it held, then move on, or end the request
        when the error is the client's (a GatewayError)."""
        await self.ctx.limits_guard.attempt_failed(exc)
        if isinstance(exc, GatewayError):
            raise exc
        if isinstance(exc, TierUnfit):
            self.unfit = exc
            self.ctx.fallbacks.append(f"{tier.name}: {exc}")
        else:
            self.ctx.fallbacks.append(f"{tier.name}: failed: {exc}")
            events.warning("tier %s failed for %s: %s", tier.name, self.ctx.request_id, exc)
