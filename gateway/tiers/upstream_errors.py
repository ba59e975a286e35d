"""How a call to an upstream tier fails, told apart so that fallback, breakers and clients each
get what they need.

- UpstreamFailure: the upstream failed (down, 5xx, timeout, a malformed or oversized answer).
  A TierFailure: the next tier is tried and the breaker counts it. Its `str()` is what clients
  may see (the x-tiergate-fallbacks header, a 503 message, an SSE error event): a fixed reason
  code, never the upstream's address or the bytes it sent. `detail` is for operators (logs,
  spans).
- TierOverloaded: the gateway itself has no connection for the call (its pool for the tier is
  exhausted, or the tenant holds its whole share of it). The tier did nothing wrong, so no
  breaker counts it: a TierUnfit, the next tier may take the request, and `error` (a 503 or
  429 in OpenAI form) is the answer when none can.
"""

from __future__ import annotations

import re

from gateway.errors import GatewayError
from gateway.tiers.base import TierFailure, TierUnfit
from policies.budgets.headers import retry_after_headers

POOL_EXHAUSTED = "upstream_pool_exhausted"
TENANT_SHARE = "tenant_connection_share_exceeded"


class UpstreamFailure(TierFailure):
    def __init__(self, code: str, detail: str = "", *, error: GatewayError | None = None):
        super().__init__(code, error=error)
        self.code = code          # low-cardinality: read_timeout, http_503, invalid_json, ...
        self.detail = detail      # for operators only: may quote the upstream's address or bytes

    def __str__(self) -> str:
        return f"the upstream tier failed ({self.code})"


# Waiting on an upstream that was reached (a connect timeout is an unreachable one: 503), or its
# own gateway timeout.
_TIMEOUTS = ("read_timeout", "write_timeout", "timeout", "http_504")
MAX_PASSED_RETRY_AFTER_S = 3600
_SECONDS = re.compile(r"[0-9]{1,9}")      # Retry-After as delta-seconds; an HTTP date is not passed on


def client_error_for(code: str, retry_after: str | None = None) -> GatewayError | None:
    """What a client gets when this failure was the last word of the chain (None: the gateway's
    generic 503): a timeout is a 504, as gateways answer one; an upstream that said it is
    overloaded (429, 503) is a 503 with its own Retry-After, when it sent a usable one."""
    if code in _TIMEOUTS:
        return GatewayError(504, f"the upstream tier did not answer in time ({code})", type_="server_error",
                            code="upstream_timeout")
    if code in ("http_429", "http_503"):
        # The upstream's header is its bytes: only plain ASCII digits are read.
        seconds = retry_after.strip() if retry_after is not None else ""
        headers = retry_after_headers(min(int(seconds), MAX_PASSED_RETRY_AFTER_S)) \
            if _SECONDS.fullmatch(seconds) else None
        return GatewayError(503, f"the upstream tier is overloaded or unavailable ({code})", type_="server_error",
                            code="upstream_unavailable", headers=headers)
    return None


class TierOverloaded(TierUnfit):
    def __init__(self, code: str, error: GatewayError):
        super().__init__(error)
        self.code = code          # POOL_EXHAUSTED or TENANT_SHARE


def pool_exhausted(tier: str) -> TierOverloaded:
    return TierOverloaded(POOL_EXHAUSTED, GatewayError(
        503, f"every connection of the gateway to tier {tier} is in use; try again shortly",
        type_="server_error", code=POOL_EXHAUSTED, headers={"retry-after": "1"}))


def tenant_share_exceeded(tier: str) -> TierOverloaded:
    return TierOverloaded(TENANT_SHARE, GatewayError(
        429, f"your share of the gateway's connections to tier {tier} is in use; try again shortly",
        type_="requests", code=TENANT_SHARE, headers={"retry-after": "1"}))
