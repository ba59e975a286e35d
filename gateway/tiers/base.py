"""What every tier offers the request pipeline, and how its failures are told apart.

Three outcomes besides an answer, so fallback and circuit breakers can act on them:
- GatewayError: the request itself is wrong (4xx); it goes back to the client as is.
- TierUnfit: the request cannot run on this tier (prompt beyond its context); the next tier
  in the chain may take it; not a tier failure.
- TierFailure: the tier failed on its side (not loaded, engine dead, upstream down, 5xx,
  timeout); the next tier is tried if nothing was streamed yet, and a breaker counts it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.context import RequestContext, Usage
from gateway.errors import GatewayError
from gateway.schema import RequestBody
from gateway.telemetry.tracing import TierSpan, untraced_tier_span
from policies.cascade import PER_TOKEN_SIGNALS

if TYPE_CHECKING:
    from gateway.cascade_gate import CascadeGate

# What a tier can report of each token it generates, for a cascade to judge (policies/cascade.py).
ALL_TOKEN_SIGNALS: frozenset[str] = frozenset(PER_TOKEN_SIGNALS)
NO_TOKEN_SIGNALS: frozenset[str] = frozenset()


class TierFailure(Exception):
    """A server-side failure of one tier. `error`, when given, is what the client gets if no
    other tier of the chain answers, instead of the gateway's generic 503 (an engine step that
    raised: 500 engine_step_failed)."""

    def __init__(self, message: str, *, error: GatewayError | None = None):
        super().__init__(message)
        self.error = error
        # Set when the tier had finished generating before the failure (an upstream's 2xx whose
        # body was then lost): its tokens were spent, so the attempt is charged, not refunded.
        self.answered = False


class EmptyStream(TierFailure):
    """The tier's stream ended before its first chunk: a failure, told apart in spans."""


class TierUnfit(Exception):
    """This tier cannot take the request; `error` is what the client gets if no tier can.
    `room`: the most tokens (prompt and answer) the tier takes, when its context is why: of the
    tiers a request is too long for, the client hears of the roomiest."""

    def __init__(self, error: GatewayError, room: int = 0):
        super().__init__(error.message)
        self.error = error
        self.room = room


@dataclass
class TierCall:
    ctx: RequestContext
    body: RequestBody
    alias: str                       # the model id the client named, echoed in responses
    # The request's cascade, if its route has one (gateway/cascade_gate.py), and the same gate
    # while it judges the current attempt: the tier then reports its first tokens' logprobs (and
    # entropies) to it, which may end the call with Escalate before anything reaches the client.
    gate: CascadeGate | None = None
    scoring: CascadeGate | None = None
    # Prompt token ids already computed (classification), keyed by tokenizer identity.
    prompt_ids: dict[str, list[list[int]]] = field(default_factory=dict)
    # The span of the current tier attempt (the pipeline sets one per attempt): the tier adds
    # engine events, usage and response attributes, and upstreams inject its traceparent.
    span: TierSpan = field(default_factory=untraced_tier_span)

    @property
    def endpoint(self) -> str:
        return self.ctx.endpoint


@dataclass
class TierAnswer:
    body: bytes                      # the OpenAI JSON response, ready to send
    usage: Usage


class Tier:
    """Base of both tier kinds. `state` is "loading", "ready" or "failed" (an embedded tier also
    has "restarting"). `unusable_reason()` is the tier's health: None when it may take calls;
    `ready` says the same as a bool, and /readyz and the chain walk read them."""

    kind = "abstract"
    address: str | None = None           # where a remote tier listens (for its spans)
    port: int | None = None
    # How long a stream's client may leave a send waiting before it is cut off (None: the
    # gateway's default). Upstream tiers set it: a stalled client there holds a pooled connection.
    client_write_timeout_s: float | None = None

    def __init__(self, name: str, config):
        self.name = name
        self.config = config
        self.state = "loading"
        self.error: str | None = None
        self._in_flight = 0
        # Told when the tier goes from no calls in flight to some, or back (gateway/tiers/core_sharing.py).
        self.on_busy_change: Callable[[], None] | None = None

    @property
    def in_flight(self) -> int:
        """Calls the gateway has open to this tier (for /metrics, max_in_flight and core sharing)."""
        return self._in_flight

    @in_flight.setter
    def in_flight(self, value: int) -> None:
        was_busy = self._in_flight > 0
        self._in_flight = value
        if was_busy != (value > 0) and self.on_busy_change is not None:
            self.on_busy_change()

    def set_alone(self, alone: bool) -> None:
        """Whether no other tier on this machine has calls in flight. Tiers that compute here
        may use more cores then; the others ignore it."""

    @property
    def ready(self) -> bool:
        return self.unusable_reason() is None

    @property
    def busy(self) -> bool:
        """At its `max_in_flight`: routing prefers the next tier of the chain."""
        limit = getattr(self.config, "max_in_flight", None)
        return limit is not None and self.in_flight >= limit

    @property
    def coming_up(self) -> bool:
        """Unusable for now but on its way to serving without an operator (loading): a client
        turned away is told to retry, where one turned away by a failed load is not."""
        return self.state == "loading"

    def unusable_reason(self) -> str | None:
        if self.state == "ready":
            return None
        return "still loading" if self.state == "loading" else f"failed: {self.error}"

    @property
    def context_length(self) -> int | None:
        return None

    @property
    def capabilities(self) -> frozenset[str]:
        """What requests may need of this tier (policies/needs.py), from its config."""
        return self.config.capability_set()

    def token_signals(self, stream: bool) -> frozenset[str]:
        """The cascade signals this tier can report per token, in a stream or a whole answer."""
        return NO_TOKEN_SIGNALS

    @property
    def prompt_hidden_size(self) -> int | None:
        """The size of the prompt hidden state this tier reports with its first token (a
        cascade's predicted_gain reads it), or None where it reports none."""
        return None

    def describe(self) -> dict:
        out = {"kind": self.kind, "state": self.state}
        if self.error:
            out["error"] = self.error
        return out

    async def start(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def complete(self, call: TierCall) -> TierAnswer:
        raise NotImplementedError

    def stream(self, call: TierCall) -> AsyncIterator[bytes]:
        """SSE bytes. The first item arrives only once the tier has produced output, so a tier
        that fails raises before any byte reaches the client."""
        raise NotImplementedError
