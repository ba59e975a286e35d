"""One call to one tier, from its admission to its end.

An Attempt owns what the call holds: the circuit-breaker permit, the budget reservation, the
tier span with the tier's in-flight count, and the time spent waiting on the tier. `end()`
gives all of it back exactly once: the span ends and the tier's count drops first (the next
tier choice sees it), then the breaker learns the outcome and the reservation is reconciled
with the usage, or released when the call produced nothing.

What a call is charged: the usage its tier reported during the attempt (an answer's, a stream's
usage chunk, or what a tier reports of a call it could not finish: an embedded tier its engine's
output so far), read from the request's usage as it grew. When the tier reported nothing:
- a stream cut short before its usage chunk: the prompt reserved + one token per event relayed;
- an answer without usage: what was reserved;
- a call the tier may have worked on without saying how much: an upstream that answered and
  then failed (a TierFailure with `answered` set: its body lost or unreadable), and an upstream
  call cut short by the client leaving or the deadline, are charged what was reserved (it may
  have generated all of it); a stream cut short before its first event the prompt reserved;
- otherwise (refused, failed before any work): nothing, the reservation is released.
Work started is thus never free. That holds for a cascade's first tier too: a call its gate
ended (Escalate) is charged what its tier reported of it, though the client sees only the
answer of the tier it was handed to.

An attempt whose reservation bounds the output only if the tier is told so (`output_cap`: no
max_tokens from the client, no known context) sends the call with that max_tokens, and gives
the request its own body back when it ends.

Every tier call goes the same way: RequestLimits.open_attempt(tier), then complete() for a
whole answer, or first_chunk() (and next_chunk() while a cascade holds a stream's start back)
for a stream, whose relay calls end().
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING, TypeVar

from gateway.cascade_gate import Escalate
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
# Tier kinds that put the usage of a call they could not finish into the request's usage.
_REPORTS_UNFINISHED = frozenset({"embedded"})


class Attempt:
    __slots__ = ("_body", "_ended", "_first_chunk", "_streaming", "_unreported", "_usage_at_start", "estimate",
                 "permit", "request", "reservation", "seconds", "span", "started", "tier", "tier_first_token_at")

    def __init__(self, request: RequestLimits, tier: Tier, permit: Permit, reservation: Reservation | None,
                 estimate: tuple[int, int], span: TierSpan, *, output_cap: int | None = None):
        self.request = request            # the request's limits: deadline, breakers, budgets, context
        self.tier = tier
        self.permit = permit
        self.reservation = reservation    # None when no budget applies
        self.estimate = estimate          # (prompt, output) tokens reserved
        self.span = span
        self.started = time.perf_counter()
        self.seconds = 0.0                # spent waiting on the tier
        # When the tier produced its first token, where the client saw it later (a cascade held
        # the stream's start back): the breaker judges the tier's own time. None: ctx.first_token_at.
        self.tier_first_token_at: float | None = None
        self._ended = False
        usage = request.ctx.usage
        self._usage_at_start = (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
        self._unreported: tuple[int, int] | None = None   # charged if the tier reports nothing
        self._streaming = self._first_chunk = False
        self._body = None
        if output_cap is not None:
            call = request.call
            self._body = call.body
            call.body = call.body.model_copy(update={"max_tokens": output_cap})
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
        self._streaming = True
        try:
            first = await self._wait(anext(chunks))
            self._first_chunk = True
            return first
        except StopAsyncIteration:
            empty = EmptyStream("empty stream")
            await self._failed(empty)
            raise empty from None
        except BaseException as exc:
            await self._failed(exc)
            raise

    async def next_chunk(self, chunks: AsyncIterator[bytes]) -> bytes | None:
        """A later chunk of a stream whose start is still held back (None: the stream ended).
        Nothing has reached the client yet, so a failure may still fall back, as in first_chunk."""
        try:
            return await self._wait(anext(chunks))
        except StopAsyncIteration:
            return None
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
            self._unreported = self._cut_short()
            await self.end(Outcome.CANCELLED, None, error_type=type(error).__name__)
            raise error from None
        finally:
            waited = time.perf_counter() - started
            self.seconds += waited
            request.ctx.tier_seconds += waited

    async def _failed(self, exc: BaseException) -> None:
        """The call gave no answer: charged what the tier reported, or what it may have used."""
        outcome, error_type = _outcome_of(exc)
        if isinstance(exc, TierFailure):
            self.request.failure = f"{self.tier.name}: {exc}"   # a next attempt is a retry
            if exc.answered:                                   # it had generated its answer
                self._unreported = self.estimate
        elif isinstance(exc, (GeneratorExit, asyncio.CancelledError)):
            self._unreported = self._cut_short()
        await self.end(outcome, None, error_type=error_type)

    def _cut_short(self) -> tuple[int, int] | None:
        """What a call ended by the client or the deadline may have used without its tier telling."""
        if self.tier.kind in _REPORTS_UNFINISHED:
            return None
        # A stream relays tokens as they come: before its first event only the prompt was worked on.
        return (self.estimate[0], 0) if self._streaming else self.estimate

    # ---- the end ---------------------------------------------------------------------
    async def end(self, outcome: Outcome, usage: Usage | None, events: int = 0, *,
                  error_type: str | None = None) -> None:
        """Once; later calls do nothing. `usage` not None: the call answered (`events`: stream
        events relayed); what is charged is what the tier reported during the attempt (see the
        module notes). `error_type` marks the span failed."""
        if self._ended:
            return
        self._ended = True
        if self._body is not None:        # later calls of the request get the client's own body
            self.request.call.body = self._body
        if error_type is not None:
            self.span.fail(error_type)
        self.tier.in_flight -= 1
        self.span.end()
        self._count_tier_usage()
        steps = [self._record(outcome)]
        if self.reservation is not None:
            steps.append(self._settle(self._charge(usage is not None, events)))
        if len(steps) == 2 and self.request.limits.shared:
            await asyncio.gather(*steps)       # two Redis round trips at once
        else:
            for step in steps:
                await step

    def _count_tier_usage(self) -> None:
        """What the tier reported during this attempt, under the tier's name (for metrics)."""
        usage, start = self.request.ctx.usage, self._usage_at_start
        done = Usage(usage.prompt_tokens - start[0], usage.completion_tokens - start[1], usage.cached_tokens - start[2])
        if done.prompt_tokens or done.completion_tokens or done.cached_tokens:
            self.request.ctx.tier_usage.setdefault(self.tier.name, Usage()).add(done)

    def _charge(self, answered: bool, events: int) -> tuple[int, int] | None:
        """(prompt, completion) tokens to reconcile with; None releases the reservation."""
        usage = self.request.ctx.usage
        prompt = usage.prompt_tokens - self._usage_at_start[0]
        completion = usage.completion_tokens - self._usage_at_start[1]
        bound_prompt, bound_output = self.estimate
        if prompt or completion:       # what the tier reported during this attempt
            # The reservation bounds what the tier can count (it was sent the max_tokens reserved):
            # a tier reporting more is wrong, and one answer must not charge a tenant's (or a
            # tier's) whole budget away.
            return min(prompt, bound_prompt), min(completion, bound_output)
        if events:                     # a stream cut short before its usage chunk: one token per event
            return bound_prompt, min(events, bound_output)
        if answered:                   # no usage reported: charged what was reserved, never free
            return self.estimate
        if self._first_chunk:          # a stream whose relay never ran: its first event was made
            return self.estimate[0], 1
        return self._unreported

    async def _record(self, outcome: Outcome) -> None:
        ctx = self.request.ctx
        # Time to first token is seen on streams only (a whole answer's time is not a TTFT, nor is
        # a beam search's, whose stream starts when the search is done).
        ttft = None
        first = self.tier_first_token_at or ctx.first_token_at
        timed = ctx.stream and not self.request.call.body.beam_search
        if outcome is Outcome.SUCCESS and timed and first is not None and first >= self.started:
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


def _outcome_of(exc: BaseException) -> tuple[Outcome, str | None]:
    """The breaker outcome and the span's error.type of a call that raised `exc`."""
    if isinstance(exc, Escalate):          # the tier worked; the cascade chose another answer
        return Outcome.SUCCESS, None
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
