"""The request side of issue #8: a circuit-breaker permit and a budget reservation per tier
attempt, a deadline and the retry budget per request.

The tier scope and fallbacks. The tier is known only once the chain is walked, so each tier
attempt is admitted by one atomic reservation over every scope of the request (API key,
tenant, agent session, and that tier, priced at that tier): for the first attempt this is the
request's one decision. A fallback after a failed attempt first releases the failed attempt's
reservation (tokens, concurrency slots and budgets come back; the store's rpm count does not),
then reserves again for the next tier, so every token is charged once, to the tier that
served it, at that tier's price. The cost: a request that falls back counts twice against an
rpm limit (bounded by the retry budget). A refusal by the tier's own scope (the tier is at its
limits) moves on to the next tier like an open breaker; a refusal by any other scope is the
client's 429. An escalation is a second answer: the first is reconciled, the second reserved.

Estimate = prompt tokens + max_tokens x choices; without max_tokens, the tier's context length
minus the prompt, or DEFAULT_OUTPUT_BOUND when the tier does not know its context. Usage is
reconciled once per attempt: with the tier's counts; a stream that ends early with the events
relayed so far; an answer without usage with its estimate (never for free).
"""

from __future__ import annotations

import asyncio
import hashlib
import time

from gateway.context import RequestContext, Usage
from gateway.errors import GatewayError
from gateway.limits import GatewayLimits
from gateway.schema import CompletionRequest
from gateway.tiers.base import Tier, TierCall, TierFailure, TierUnfit
from policies.breakers import Outcome, Permit, Rejection
from policies.budgets import (
    Admission,
    BudgetStoreUnavailable,
    InvalidScope,
    Reservation,
    Scopes,
    admission_headers,
    retry_after_headers,
)
from policies.budgets.rules import check_scope_id
from policies.budgets.types import SCOPE_PREFIX
from policies.retry_budget import Deadline

DEFAULT_OUTPUT_BOUND = 4096
SESSION_HEADER = "x-session-id"


def api_key_label(key_name: str | None, authorization: str | None) -> str | None:
    """The api_key scope id: the key's name from the config, else 'sha256:' + 12 hex digits of
    its digest (never the key itself)."""
    if key_name:
        return key_name
    if not authorization:
        return None
    key = authorization.partition(" ")[2].strip()
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()[:12]


class RequestLimits:
    """Per-request budget and breaker state. Every attempt ends in exactly one of
    attempt_failed / answered / stream_finished / abandon; finish() ends the request."""

    def __init__(self, limits: GatewayLimits, ctx: RequestContext, call: TierCall, api_key: str | None,
                 session: str | None):
        self.limits = limits
        self.ctx = ctx
        self.call = call
        self.api_key = api_key
        self.session = session
        self.deadline = Deadline.after(limits.config.retry.deadline_s)
        self.permit: Permit | None = None
        self.reservation: Reservation | None = None
        self.estimate = (0, 0)
        self.attempt_started = 0.0
        self.failure: str | None = None          # the last tier failure: the next attempt is a retry
        self.retry_denied = False
        self.rejections: list[Rejection] = []    # open breakers passed on the way
        self.tier_refusal: Admission | None = None
        self.finished = False
        self.handed_off = False                  # a stream's relay owns the end of the request
        if session is not None and limits.active:
            try:
                check_scope_id(SESSION_HEADER, session)
            except InvalidScope as exc:
                raise GatewayError(400, str(exc), param=SESSION_HEADER) from None
        limits.in_flight += 1
        limits.retry.record_request()

    # ---- before an attempt ------------------------------------------------------------
    async def admit(self, tier: Tier) -> str | None:
        """Take a breaker permit and a reservation for a call to `tier`. Returns why the tier is
        skipped (open breaker, tier at its limits), or None when the call may go; raises the
        request's 429 / 503 / 504."""
        if self.deadline.expired:
            raise self._deadline_error()
        answer = await self.limits.breakers.allow(tier.name)
        if not answer.allowed:          # no call is made: not a retry
            self.rejections.append(answer)
            self.ctx.breaker_events.append((tier.name, answer.state))
            return f"{tier.name}: circuit breaker {answer.state.replace('_', '-')} (retry in {answer.retry_after:.1f}s)"
        self.permit = answer
        if self.failure is not None and not self.limits.retry.try_retry():
            self.retry_denied = True
            await self._drop_permit()
            raise self.nothing_left((), None)
        if self.limits.active:
            skip = await self._reserve(tier)
            if skip is not None:
                return skip
        self.attempt_started = time.perf_counter()
        return None

    async def _reserve(self, tier: Tier) -> str | None:
        self.estimate = self._estimate(tier)
        scopes = Scopes(self.api_key, self.ctx.tenant, tier.name, self.session)
        try:
            admission = await self.limits.budgets.reserve(scopes, *self.estimate)
        except BudgetStoreUnavailable as exc:
            await self._drop_permit()
            raise GatewayError(503, str(exc), type_="server_error", code="budget_store_unavailable",
                               headers=retry_after_headers(exc.retry_after)) from None
        except InvalidScope as exc:
            await self._drop_permit()
            raise GatewayError(400, str(exc)) from None
        self.ctx.admission = admission
        if admission.allowed:
            self.reservation = admission.reservation
            self.ctx.ratelimit_headers = admission_headers(admission)
            return None
        await self._drop_permit()
        if admission.scope == SCOPE_PREFIX["tier"] + tier.name:   # this tier is full: maybe the next one
            self.tier_refusal = admission
            return f"{tier.name}: {admission.limit_kind} limit of the tier reached"
        raise refusal_error(admission)

    def _estimate(self, tier: Tier) -> tuple[int, int]:
        body = self.call.body
        prompt = self.ctx.prompt_tokens_estimate or 0
        prompts = len(body.prompts()) if isinstance(body, CompletionRequest) else 1
        choices = max(body.n, getattr(body, "best_of", None) or 0)
        per_choice = body.output_limit
        if per_choice is None:
            context = tier.context_length
            per_choice = max(1, context - prompt // prompts) if context else DEFAULT_OUTPUT_BOUND
        return prompt, per_choice * choices * prompts

    # ---- the attempt's end ------------------------------------------------------------
    async def bounded(self, awaitable):
        """Await a tier call within what is left of the request's deadline."""
        try:
            async with asyncio.timeout(self.deadline.remaining()) as scope:
                return await awaitable
        except TimeoutError:
            if not scope.expired():
                raise
        await self._end(Outcome.CANCELLED, None)
        raise self._deadline_error()

    async def attempt_failed(self, exc: BaseException) -> None:
        """The call failed before any output: nothing was consumed."""
        if isinstance(exc, TierFailure):
            self.failure = f"{self.permit.name if self.permit else '?'}: {exc}"
            outcome = Outcome.FAILURE
        elif isinstance(exc, (TierUnfit, GatewayError)):
            outcome = Outcome.CLIENT_ERROR          # the request's fault (or fit), never the tier's
        else:
            outcome = Outcome.CANCELLED
        await self._end(outcome, None)

    async def answered(self, usage: Usage) -> None:
        """A whole (non-streamed) answer: the breaker counts a success, the budget its usage."""
        await self._end(Outcome.SUCCESS, self._charge(usage, 0))

    async def stream_finished(self, failed: bool, usage: Usage, events: int) -> None:
        """The end of a relayed stream (done, failed midway, or the client left)."""
        if self.permit is not None or self.reservation is not None:
            await self._end(Outcome.FAILURE if failed else Outcome.SUCCESS, self._charge(usage, events))
        await self.finish()

    async def abandon(self) -> None:
        """Whatever is still held (a cancelled call, an unexpected error) is released uncounted."""
        if self.permit is not None or self.reservation is not None:
            await self._end(Outcome.CANCELLED, None)

    async def finish(self) -> None:
        await self.abandon()
        if not self.finished:
            self.finished = True
            self.limits.in_flight -= 1

    def finish_later(self) -> None:
        """For a stream whose relay never ran: finish in the background."""
        if not self.finished:
            self.limits.spawn(self.finish())

    def _charge(self, usage: Usage, events: int) -> tuple[int, int]:
        if usage.prompt_tokens or usage.completion_tokens:
            return usage.prompt_tokens, usage.completion_tokens
        if events:                     # a stream cut short before its usage chunk: one token per event
            return self.estimate[0], events
        return self.estimate           # no usage reported: charged what was reserved

    async def _end(self, outcome: Outcome, tokens: tuple[int, int] | None) -> None:
        permit, reservation = self.permit, self.reservation
        self.permit = self.reservation = None
        steps = []
        if permit is not None:
            steps.append(self._record(permit, outcome))
        if reservation is not None:
            steps.append(self._settle(reservation, tokens))
        if len(steps) == 2 and self.limits.shared:
            await asyncio.gather(*steps)       # two Redis round trips at once
        else:
            for step in steps:
                await step

    async def _record(self, permit: Permit, outcome: Outcome) -> None:
        # Time to first token is seen on streams only (a whole answer's time is not a TTFT).
        ttft = None
        first = self.ctx.first_token_at
        if outcome is Outcome.SUCCESS and self.ctx.stream and first is not None and first >= self.attempt_started:
            ttft = first - self.attempt_started
        result = await self.limits.breakers.record(permit, outcome, ttft)
        self.ctx.breaker_events.append((permit.name, outcome.name.lower()))
        if result in ("opened", "closed"):
            self.ctx.breaker_events.append((permit.name, result))

    async def _settle(self, reservation: Reservation, tokens: tuple[int, int] | None) -> None:
        if tokens is None:
            await self.limits.budgets.release(reservation)
        else:
            await self.limits.budgets.reconcile(reservation, *tokens)

    async def _drop_permit(self) -> None:
        permit, self.permit = self.permit, None
        if permit is not None:     # frees a half-open probe slot; not counted
            await self.limits.breakers.record(permit, Outcome.CANCELLED)

    # ---- errors ---------------------------------------------------------------------
    def nothing_left(self, chain: tuple[str, ...], unfit: TierUnfit | None) -> GatewayError:
        """The error when no tier of the chain answered."""
        if unfit is not None:
            return unfit.error
        if self.retry_denied:
            return GatewayError(503, f"tier failed ({self.failure}) and the retry budget is spent; try again later",
                                type_="server_error", code="retry_budget_exhausted",
                                headers=retry_after_headers(1.0))
        if self.tier_refusal is not None:
            return refusal_error(self.tier_refusal)
        tried = f" (tried {', '.join(chain)})" if chain else ""
        if self.rejections:
            retry = min(r.retry_after for r in self.rejections)
            return GatewayError(503, f"no tier could serve the request{tried}: circuit breakers open for "
                                     f"{', '.join(r.name for r in self.rejections)}",
                                type_="server_error", code="no_tier_available", headers=retry_after_headers(retry))
        return GatewayError(503, f"no tier could serve the request{tried}", type_="server_error",
                            code="no_tier_available")

    def _deadline_error(self) -> GatewayError:
        seconds = self.limits.config.retry.deadline_s
        return GatewayError(504, f"the request did not finish within its deadline of {seconds:g}s",
                            type_="server_error", code="deadline_exceeded")


def refusal_error(admission: Admission) -> GatewayError:
    """429 in OpenAI's shape: insufficient_quota for a spent budget, rate_limit_exceeded otherwise."""
    if admission.reason == "insufficient_quota":
        type_ = "insufficient_quota"
    else:
        type_ = "tokens" if admission.limit_kind == "tpm" else "requests"
    return GatewayError(429, admission.message, type_=type_, code=admission.reason,
                        headers=admission_headers(admission))
