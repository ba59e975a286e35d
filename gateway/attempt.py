"""One call to one tier, from its admission to its end.

An Attempt owns what the call holds: the circuit-breaker permit, the budget reservation, the
tier span with the tier's in-flight count, and the time spent waiting on the tier. `end()`
gives all of it back exactly once: the span ends and the tier's count drops first (the next
tier choice sees it), then the breaker learns the outcome and the reservation is reconciled
with the usage, or released when the call produced nothing.

The chain walk and escalation call tiers the same way: RequestLimits.open_attempt(tier), then
complete() for a whole answer or first_chunk() for a stream (whose relay calls end()).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING, TypeVar

from gateway.context import Usage
from gateway.errors import GatewayError
from gateway.skips import SkipReason
from gateway.telemetry.tracing import TierSpan
from gateway.tiers.base import EmptyStream, Tier, TierAnswer, TierCall, TierFailure, TierUnfit
from policies.breakers import Outcome, Permit
from policies.budgets import Reservation

if TYPE_CHECKING:
    from gateway.request_limits import RequestLimits

T = TypeVar("T")
CANCELLED = "cancelled"     # span error.type when the client left: not the tier's failure


class Attempt:
    __slots__ = ("_ended", "estimate", "permit", "request", "reservation", "seconds", "span", "started", "tier")

    def __init__(self, request: RequestLimits, tier: Tier, permit: Permit, reservation: Reservation | None,
                 estimate: tuple[int, int], span: TierSpan):
        self.request = request            # the request's limits: deadline, breakers, budgets, context
        self.tier = tier
        self.permit = permit
        self.reservation = reservation    # None when no budget applies
        self.estimate = estimate          # (prompt, output) tokens reserved
        self.span = span
        self.started = time.perf_counter()
        self.seconds = 0.0                # spent waiting on the tier
        self._ended = False
        tier.in_flight += 1

    @property
    def ended(self) -> bool:
        return self._ended

    # ---- the call --------------------------------------------------------------------
    async def complete(self, call: TierCall) -> TierAnswer:
        """A whole answer; the attempt has ended when this returns or raises. The answer's
        usage counts for the request (also when a later escalation replaces the answer)."""
        try:
            answer = await self._wait(self.tier.complete(call))
        except BaseException as exc:
            await self._failed(exc)
            raise
        self.request.ctx.usage.add(answer.usage)
        await self.end(Outcome.SUCCESS, answer.usage)
        return answer

    async def first_chunk(self, chunks: AsyncIterator[bytes]) -> bytes:
        """A stream's first chunk. Nothing has reached the client yet, so a failure may still
        fall back: the attempt then ends here; otherwise the relay ends it."""
        try:
            return await self._wait(anext(chunks))
        except StopAsyncIteration:
            empty = EmptyStream("empty stream")
            await self._failed(empty)
            raise empty from None
        except BaseException as exc:
            await self._failed(exc)
            raise

    async def _wait(self, awaitable: Awaitable[T]) -> T:
        """Await the tier within what is left of the request's deadline, timing the wait (the
        request's overhead figure excludes it)."""
        request = self.request
        started = time.perf_counter()
        try:
            async with asyncio.timeout(request.deadline.remaining()) as scope:
                return await awaitable
        except TimeoutError:
            if not scope.expired():
                raise
            error = request.deadline_error()
            await self.end(Outcome.CANCELLED, None, error_type=type(error).__name__)
            raise error from None
        finally:
            waited = time.perf_counter() - started
            self.seconds += waited
            request.ctx.tier_seconds += waited

    async def _failed(self, exc: BaseException) -> None:
        """The call gave no answer: nothing was consumed, the reservation is released."""
        outcome, error_type = _outcome_of(exc)
        if isinstance(exc, TierFailure):
            self.request.failure = f"{self.tier.name}: {exc}"   # a next attempt is a retry
        await self.end(outcome, None, error_type=error_type)

    # ---- the end ---------------------------------------------------------------------
    async def end(self, outcome: Outcome, usage: Usage | None, events: int = 0, *,
                  error_type: str | None = None) -> None:
        """Once; later calls do nothing. `usage` None releases the reservation; else it is
        reconciled with `usage` (`events`: stream events relayed, for a stream cut short
        before its usage chunk). `error_type` marks the span failed."""
        if self._ended:
            return
        self._ended = True
        if error_type is not None:
            self.span.fail(error_type)
        self.tier.in_flight -= 1
        self.span.end()
        steps = [self._record(outcome)]
        if self.reservation is not None:
            steps.append(self._settle(None if usage is None else self._tokens(usage, events)))
        if len(steps) == 2 and self.request.limits.shared:
            await asyncio.gather(*steps)       # two Redis round trips at once
        else:
            for step in steps:
                await step

    def _tokens(self, usage: Usage, events: int) -> tuple[int, int]:
        if usage.prompt_tokens or usage.completion_tokens:
            return usage.prompt_tokens, usage.completion_tokens
        if events:                     # a stream cut short before its usage chunk: one token per event
            return self.estimate[0], events
        return self.estimate           # no usage reported: charged what was reserved, never free

    async def _record(self, outcome: Outcome) -> None:
        ctx = self.request.ctx
        # Time to first token is seen on streams only (a whole answer's time is not a TTFT).
        ttft = None
        first = ctx.first_token_at
        if outcome is Outcome.SUCCESS and ctx.stream and first is not None and first >= self.started:
            ttft = first - self.started
        name = self.permit.name
        result = await self.request.limits.breakers.record(self.permit, outcome, ttft)
        ctx.breaker_events.append((name, outcome.name.lower()))
        if result in ("opened", "closed"):
            ctx.breaker_events.append((name, result))

    async def _settle(self, tokens: tuple[int, int] | None) -> None:
        budgets = self.request.limits.budgets
        if tokens is None:
            await budgets.release(self.reservation)
        else:
            await budgets.reconcile(self.reservation, *tokens)


def _outcome_of(exc: BaseException) -> tuple[Outcome, str]:
    """The breaker outcome and the span's error.type of a call that raised `exc`."""
    if isinstance(exc, EmptyStream):
        return Outcome.FAILURE, SkipReason.EMPTY_STREAM.value
    if isinstance(exc, TierFailure):
        return Outcome.FAILURE, SkipReason.TIER_FAILURE.value
    if isinstance(exc, TierUnfit):         # the request's fit, never the tier's fault
        return Outcome.CLIENT_ERROR, SkipReason.TIER_UNFIT.value
    if isinstance(exc, GatewayError):      # the request's fault
        return Outcome.CLIENT_ERROR, type(exc).__name__
    if isinstance(exc, (GeneratorExit, asyncio.CancelledError)):
        return Outcome.CANCELLED, CANCELLED
    return Outcome.CANCELLED, type(exc).__name__
