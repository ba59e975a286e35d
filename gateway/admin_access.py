"""Who sees the operator's view of the gateway: /metrics and the detailed /readyz.

On a loopback listen address only processes on this machine can connect, and both stay open.
Off loopback the figures (tier states and their errors, traffic per tenant and tier, breaker
states) are the operator's: /metrics needs an admin key (`auth.admin_keys`), and /readyz
without one answers its status alone, which is all a load balancer needs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from gateway.auth import bearer_key
from gateway.errors import GatewayError
from gateway.runtime import RuntimeHolder
from policies.config import is_loopback

Endpoint = Callable[[Request], Awaitable[Response]]


class AdminAccess:
    def __init__(self, holder: RuntimeHolder, host: str):
        self.holder = holder       # the keys are read per request: a reload may change them
        self.open = is_loopback(host)

    def allows(self, request: Request) -> bool:
        return self.open or self.holder.current.keys.is_admin(request.headers.get("authorization"))

    def refusal(self, request: Request) -> Response | None:
        """None when the caller may see the operator's view; else its 401 / 403 in OpenAI form."""
        if self.allows(request):
            return None
        if bearer_key(request.headers.get("authorization")) is None:
            return GatewayError(401, "This endpoint needs an admin key: Authorization: Bearer ADMIN_KEY.").response()
        return GatewayError(403, "This endpoint needs an admin key.", code="admin_key_required").response()

    def guard(self, endpoint: Endpoint) -> Endpoint:
        async def guarded(request: Request) -> Response:
            refused = self.refusal(request)
            return refused if refused is not None else await endpoint(request)
        return guarded
