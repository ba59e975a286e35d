"""The request side of budgets, rate limits and circuit breakers: a breaker permit and a budget
reservation per tier attempt, a deadline and the retry budget per request.

The tier scope and fallbacks. The tier is known only once the chain is walked, so each tier
attempt is admitted by one atomic reservation over every scope of the request (API key,
tenant, agent session, and that tier, priced at that tier): for the first attempt this is the
request's one decision. A fallback after a failed attempt first releases the failed attempt's
reservation (tokens, concurrency slots and budgets come back; the store's rpm count does not),
then reserves again for the next tier, so every token is charged once, to the tier that
served it, at that tier's price. The cost: a request that falls back counts twice against an
rpm limit (bounded by the retry budget). A refusal by the tier's own scope (the tier is at its
limits) moves on to the next tier like an open breaker; a refusal by any other scope is the
client's 429. A cascade that escalates makes a second call: the first tier's attempt is
reconciled with what it generated, the target's reserved anew.

The reservation is an upper bound of what the tier can count, never a guess (reconciling
cannot take tokens back, so an estimate below the count lets concurrent requests overshoot a
budget): an embedded tier's exact prompt ids; at an upstream, a bound from the prompt's UTF-8
length or the tier's tokenizer, plus max_tokens x choices, or the tier's context, or
DEFAULT_OUTPUT_BOUND then sent as max_tokens (gateway/token_bounds.py). Each attempt
(gateway/attempt.py) reconciles its reservation once.
"""

from __future__ import annotations

from gateway.attempt import CANCELLED, Attempt
from gateway.auth import bearer_key
from gateway.context import RequestContext
from gateway.errors import GatewayError
from gateway.limits import GatewayLimits
from gateway.skips import Skip, SkipReason
from gateway.telemetry.request import RequestTelemetry
from gateway.tiers.base import Tier, TierCall, TierUnfit
from gateway.token_bounds import output_bound, prompt_bound, prompt_count
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
from policies.config import KEY_DIGEST_PREFIX, hash_api_key
from policies.retry_budget import Deadline

SESSION_HEADER = "x-session-id"
# What a client turned away by tiers still loading or restarting is told to wait: a model loads
# in seconds, and a shorter wait only brings the same answer back.
COMING_UP_RETRY_S = 2.0


def api_key_label(key_name: str | None, authorization: str | None) -> str | None:
    """The api_key scope id: the key's name from the config, else 'sha256:' + 12 hex digits of
    its digest (never the key itself), as the config names it (KeySource.scope_id)."""
    if key_name:
        return key_name
    key = bearer_key(authorization)
    return None if key is None else KEY_DIGEST_PREFIX + hash_api_key(key)[:12]


class RequestLimits:
    """Per-request budget and breaker state, and the opener of its tier attempts. Each attempt
    ends itself (Attempt.end); finish() ends the request's part once."""

    def __init__(self, limits: GatewayLimits, ctx: RequestContext, call: TierCall, trace: RequestTelemetry,
                 api_key: str | None, session: str | None):
        self.limits = limits
        self.ctx = ctx
        self.call = call
        self.trace = trace
        self.api_key = api_key
        self.session = session
        self.deadline = Deadline.after(limits.config.retry.deadline_s)
        self.failure: str | None = None          # the last tier failure: every later attempt is a retry
        self.retry_denied = False
        self.rejections: list[Rejection] = []    # open breakers passed on the way
        self.tier_refusal: Admission | None = None
        self.current: Attempt | None = None      # the latest attempt
        self.finished = False
        if session is not None and limits.active:
            try:
                check_scope_id(SESSION_HEADER, session)
            except InvalidScope as exc:
                raise GatewayError(400, str(exc), param=SESSION_HEADER) from None
        limits.in_flight += 1
        limits.retry.record_request()

    # ---- before an attempt ------------------------------------------------------------
    async def open_attempt(self, tier: Tier, refusal_skips: bool = False) -> Attempt | Skip:
        """Take a breaker permit and a reservation for a call to `tier` and open its attempt
        (span, in-flight count). Returns why the tier is skipped instead (open breaker, tier at
        its limits, or with `refusal_skips` the request's own budgets refusing it); raises the
        request's 429 / 503 / 504."""
        if self.deadline.expired:
            raise self.deadline_error()
        verdict = await self.limits.breakers.allow(tier.name)
        if isinstance(verdict, Rejection):          # no call is made: not a retry
            self.rejections.append(verdict)
            self.ctx.breaker_events.append((tier.name, verdict.state))
            return Skip(tier.name, SkipReason.BREAKER_OPEN, f"circuit breaker {verdict.state.replace('_', '-')} "
                                                            f"(retry in {verdict.retry_after:.1f}s)")
        if verdict.is_probe:                          # a half-open breaker let this call through
            self.ctx.breaker_events.append((tier.name, "probe"))
        reservation, estimate, cap = None, (0, 0), None
        try:
            if self.failure is not None and not self.limits.retry.try_retry():
                self.retry_denied = True
                raise self.nothing_left((), None)
            if self.limits.active:
                estimate, cap = await self._estimate(tier)
                reservation = await self._reserve(tier, estimate, refusal_skips)
        except BaseException:      # no call will be made: the permit goes back uncounted
            await self._drop_permit(verdict)
            raise
        if isinstance(reservation, Skip):
            await self._drop_permit(verdict)
            return reservation
        span = self.trace.tier_span(self.ctx, self.call, tier)
        self.call.span = span          # the tier adds its events and response facts to it
        self.current = Attempt(self, tier, verdict, reservation, estimate, span,
                               output_cap=cap if reservation is not None and reservation.scopes else None)
        return self.current

    async def _reserve(self, tier: Tier, estimate: tuple[int, int], refusal_skips: bool = False) -> Reservation | Skip:
        """The reservation over every scope, or why this tier is skipped (its own scope is full);
        raises the client's 429, or 503 when the store is down and the policy is fail-closed."""
        scopes = Scopes(self.api_key, self.ctx.tenant, tier.name, self.session)
        try:
            admission = await self.limits.budgets.reserve(scopes, *estimate)
        except BudgetStoreUnavailable as exc:
            raise GatewayError(503, str(exc), type_="server_error", code="budget_store_unavailable",
                               headers=retry_after_headers(exc.retry_after)) from None
        except InvalidScope as exc:
            raise GatewayError(400, str(exc)) from None
        self.ctx.admission = admission
        if admission.allowed:
            self.ctx.ratelimit_headers = admission_headers(admission)
            return admission.reservation
        if admission.scope == SCOPE_PREFIX["tier"] + tier.name:   # this tier is full: maybe the next one
            self.tier_refusal = admission
            return Skip(tier.name, SkipReason.TIER_BUDGET, f"{admission.limit_kind} limit of the tier reached")
        if refusal_skips:
            return Skip(tier.name, SkipReason.BUDGET, f"{admission.limit_kind} limit of {admission.scope} reached")
        raise refusal_error(admission)

    async def _estimate(self, tier: Tier) -> tuple[tuple[int, int], int | None]:
        """(prompt, completion) tokens to reserve for a call to `tier`, at least what it can count,
        and the max_tokens the call must carry for that to hold (None: it holds already)."""
        call, body = self.call, self.call.body
        context = tier.context_length
        count = getattr(tier, "count_prompt_tokens", None)
        if count is not None:        # the tier tokenizes the prompt itself (embedded): its very ids
            prompt = count(call)
            output, cap = output_bound(body, context, exact_prompt=prompt)
            return (prompt, output), cap
        counter = await self.limits.tokenizers.counter(getattr(tier.config, "tokenizer", None))
        prompt = prompt_bound(body, counter)
        if context:                  # a longer prompt is refused there, and counts nothing
            prompt = min(prompt, context * prompt_count(body))
        output, cap = output_bound(body, context)
        return (prompt, output), cap

    async def _drop_permit(self, permit: Permit) -> None:
        # No call was made: frees a half-open probe slot; not counted.
        await self.limits.breakers.record(permit, Outcome.CANCELLED)

    # ---- the request's end -------------------------------------------------------------
    async def finish(self) -> None:
        """Once, when the request ends: an attempt still open (a stream whose relay never ran)
        is given back uncounted, then the request leaves these limits."""
        if self.finished:
            return
        self.finished = True
        try:
            if self.current is not None:
                await self.current.end(Outcome.CANCELLED, None, error_type=CANCELLED)
        finally:
            self.limits.in_flight -= 1

    # ---- errors ---------------------------------------------------------------------
    def nothing_left(self, chain: tuple[str, ...], unfit: TierUnfit | None,
                     coming_up: tuple[str, ...] = ()) -> GatewayError:
        """The error when no tier of the chain answered (`coming_up`: the tiers passed over
        while loading or restarting, which will serve without an operator's help)."""
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
        if coming_up:
            return GatewayError(503, f"no tier could serve the request{tried}: {', '.join(coming_up)} still "
                                     f"starting; retry shortly", type_="server_error", code="no_tier_available",
                                headers=retry_after_headers(COMING_UP_RETRY_S))
        last = f"; the last failure: {self.failure}" if self.failure else ""
        return GatewayError(503, f"no tier could serve the request{tried}{last}", type_="server_error",
                            code="no_tier_available")

    def deadline_error(self) -> GatewayError:
        seconds = self.limits.config.retry.deadline_s
        return GatewayError(504, f"the request did not finish within its deadline of {seconds:g}s",
                            type_="server_error", code="deadline_exceeded")


def refusal_error(admission: Admission) -> GatewayError:
    """429 in OpenAI's shape: insufficient_quota for a spent budget, rate_limit_exceeded otherwise."""
    if admission.reason == "insufficient_quota":
        type_ = "insufficient_quota"
    else:
        kind = admission.limit_kind or ""
        type_ = "tokens" if kind == "tpm" or kind.startswith("tokens_per_") else "requests"
    return GatewayError(429, admission.message, type_=type_, code=admission.reason,
                        headers=admission_headers(admission))
