"""Walking a route's chain of tiers: which tier a request calls next, and why the others were
passed over (lacks a capability the request needs, not ready, busy, breaker open, tier at its
budget limits, failed, too small). A cascade's gate is armed for each call it may judge, and a
stream's start is held back until the gate has decided."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from gateway.attempt import Attempt
from gateway.errors import GatewayError
from gateway.request_limits import RequestLimits
from gateway.runtime import Runtime
from gateway.skips import Skip, SkipReason
from gateway.tiers.base import EmptyStream, Tier, TierAnswer, TierCall, TierFailure, TierUnfit
from gateway.tiers.upstream_errors import TENANT_SHARE, TierOverloaded
from policies.needs import required_capabilities

events = logging.getLogger("gateway.pipeline")    # the pipeline's log of tier failures

# The request field that makes a capability needed, named in the 400 when no tier has it.
CAPABILITY_PARAMS = {"tools": "tools", "json_schema": "response_format", "logprobs": "logprobs"}


class ChainWalk:
    """Walks a route's chain: the next tier that may be called (ready, not busy while a later
    one may be free, its breaker lets the call through, the budget reserved for it), recording
    a Skip in the request's context for every tier passed over. A GatewayError (the client's
    fault) ends the walk at once."""

    def __init__(self, rt: Runtime, request: RequestLimits, chain: tuple[str, ...], escalation: bool = False,
                 overflow: str | None = None):
        """`escalation`: the chain a cascade hands the request to (its target, then the first
        tier): a target the request's budgets refuse is passed over for the first tier, which
        took the request already, instead of ending it with a 429. `overflow`: the tier a
        request too long for every tier of the chain goes to, unjudged (the route's cascade
        target: a hint or rule that chose a small-context chain must not refuse what the route's
        larger tier serves)."""
        self.rt, self.request, self.chain = rt, request, chain
        self.escalation = escalation
        self.overflow = overflow if overflow not in chain else None
        self.unjudged: str | None = None       # the overflow tier, once taken: no gate judges it
        self.ctx = request.ctx
        self.index = 0
        self.unfit: TierUnfit | None = None    # the roomiest (else the last) tier that could not hold it
        # The last tier the gateway had no connection for: its 503 / 429 is the answer when no
        # tier serves the request (the client may retry shortly), ahead of an unfit's 400.
        self.overloaded: TierOverloaded | None = None
        self.failure: TierFailure | None = None  # the last tier that failed
        self.busy: list[Tier] = []             # passed over at their max_in_flight, in chain order
        self.coming_up: list[str] = []         # passed over while loading or restarting
        self.required = required_capabilities(self.ctx.needs)
        self.capable = False                   # some tier of the chain has every capability needed

    async def complete(self, call: TierCall) -> tuple[Attempt, TierAnswer]:
        """The first whole answer of the chain (its attempt has ended). Escalate (from a
        cascade's gate) goes to the caller."""
        while True:
            attempt = await self.next_attempt()
            self._arm(call, attempt.tier, stream=False)
            try:
                return attempt, await attempt.complete(call)
            except (TierUnfit, TierFailure) as exc:
                self._failed(attempt, exc)

    async def stream(self, call: TierCall) -> tuple[Attempt, AsyncIterator[bytes], list[bytes]]:
        """The first stream of the chain that produced a chunk: its attempt (still open, for the
        relay to end), the rest of its chunks and the chunks read so far: the first, or, while a
        cascade's gate judges the tier, every chunk up to its decision (none was sent, so a
        failure meanwhile still falls back). Escalate goes to the caller."""
        while True:
            attempt = await self.next_attempt()
            gate = self._arm(call, attempt.tier, stream=True)
            chunks = attempt.tier.stream(call)
            try:
                held = [await attempt.first_chunk(chunks)]
                while gate is not None and gate.deciding:
                    chunk = await attempt.next_chunk(chunks)
                    if chunk is None:
                        break
                    held.append(chunk)
                return attempt, chunks, held
            except (TierUnfit, TierFailure) as exc:
                await chunks.aclose()
                self._failed(attempt, exc)

    def _arm(self, call: TierCall, tier: Tier, stream: bool):
        """The request's cascade gate if it judges this call to `tier`, else None."""
        gate = call.gate if tier.name != self.unjudged else None
        call.scoring = gate if gate is not None and gate.arm(tier.name, tier.token_signals(stream),
                                                             tier.prompt_hidden_size) else None
        return call.scoring

    async def next_attempt(self) -> Attempt:
        """Raises the request's error when no tier is left."""
        while True:
            tier = self._next_tier()
            opened = await self.request.open_attempt(tier, refusal_skips=self.escalation and tier.name == self.chain[0])
            if isinstance(opened, Attempt):
                self.ctx.tier = opened.tier.name
                return opened
            self.ctx.fallbacks.append(opened)

    def _next_tier(self) -> Tier:
        rt, fallbacks = self.rt, self.ctx.fallbacks
        while self.index < len(self.chain):
            name = self.chain[self.index]
            self.index += 1
            if self.required:
                missing = self.required - rt.tiers[name].capabilities
                if missing:
                    fallbacks.append(Skip(name, SkipReason.CAPABILITY, ", ".join(sorted(missing))))
                    continue
                self.capable = True
            why = rt.unusable_reason(name)
            if why is not None:
                fallbacks.append(Skip(name, SkipReason.NOT_READY, why))
                if rt.tiers[name].coming_up:
                    self.coming_up.append(name)
                continue
            tier = rt.tiers[name]
            if tier.busy:
                self.busy.append(tier)
                fallbacks.append(Skip(name, SkipReason.TIER_BUSY, f"busy ({tier.in_flight} calls in flight)"))
                continue
            return tier
        if self.busy:                           # every tier left is busy: wait in the first one's queue
            return self.busy.pop(0)
        if self.required and not self.capable:
            raise self._incapable()
        if self.overflow is not None and self.failure is None and self.unfit is not None and self.unfit.room:
            self.chain, self.unjudged, self.overflow = self.chain + (self.overflow,), self.overflow, None
            return self._next_tier()
        error = self.request.nothing_left(self.chain, self.overloaded or self.unfit, tuple(self.coming_up))
        own = self.failure.error if self.failure is not None else None
        if own is not None and error.code == "no_tier_available":
            error = own                         # the failed tier's own answer says more (e.g. a 500)
        raise error

    def _incapable(self) -> GatewayError:
        """No tier of the chain can honour what the request needs: the client's 400, naming the
        field that needs it."""
        lacking = [c for c in CAPABILITY_PARAMS if c in self.required]
        param = CAPABILITY_PARAMS[lacking[0]]
        return GatewayError(400, f"no tier serving model '{self.ctx.model}' supports {' and '.join(lacking)}",
                            param=param, code="unsupported_capability")

    def _failed(self, attempt: Attempt, exc: TierUnfit | TierFailure) -> None:
        """An attempt gave no answer (it has ended itself): note why, then move on."""
        name = attempt.tier.name
        if isinstance(exc, TierOverloaded):
            self.overloaded = exc
            reason = SkipReason.TENANT_SHARE if exc.code == TENANT_SHARE else SkipReason.POOL_EXHAUSTED
            self.ctx.fallbacks.append(Skip(name, reason, exc.code))
            return
        if isinstance(exc, TierUnfit):
            if self.unfit is None or exc.room >= self.unfit.room:
                self.unfit = exc
            self.ctx.fallbacks.append(Skip(name, SkipReason.TIER_UNFIT, str(exc)))
            return
        self.failure = exc
        reason = SkipReason.EMPTY_STREAM if isinstance(exc, EmptyStream) else SkipReason.TIER_FAILURE
        # str(exc) is what a client may see: the reason code (with an HTTP status). `detail` (an
        # upstream's address, what it sent, which may quote the prompt) is not, and reaches the log
        # line and the console only for a tenant whose content the operator lets be recorded.
        detail = getattr(exc, "detail", None) if attempt.span.content_permitted else None
        skip = Skip(name, reason, f"failed: {detail or exc}")
        self.ctx.fallbacks.append(skip)
        events.warning("tier %s failed for %s: %s", name, self.ctx.request_id, skip.detail)
