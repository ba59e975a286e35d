"""The console's HTTP side: the page (/console), its three static files and the JSON it polls
(/console/api/state).

Who may see it follows gateway/admin_access.py, as /metrics does: on a loopback listen address
it is open; off loopback the JSON needs an admin key (Authorization: Bearer ADMIN_KEY), and
without any admin key configured the console is off altogether (every console path answers
404). The page and its files hold no data, only the code that asks for it; they are shipped in
the package (gateway/console/static/) and load nothing from anywhere else, which the page's
Content-Security-Policy enforces in the browser.
"""

from __future__ import annotations

import json
import math
from importlib.resources import files

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.admin_access import AdminAccess
from gateway.console.state import DECISIONS, ConsoleState
from gateway.errors import GatewayError
from gateway.finite_json import finite

_CONTENT_TYPES = {"index.html": "text/html; charset=utf-8", "console.js": "text/javascript; charset=utf-8",
                  "console.css": "text/css; charset=utf-8"}
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_HEADERS = {"cache-control": "no-store", "content-security-policy": _CSP, "x-content-type-options": "nosniff",
            "referrer-policy": "no-referrer"}
MAX_DECISIONS = 200


def _static() -> dict[str, bytes]:
    folder = files("gateway.console") / "static"
    return {name: (folder / name).read_bytes() for name in _CONTENT_TYPES}


def encode(document: dict) -> bytes:
    try:
        return json.dumps(document, allow_nan=False, separators=(",", ":")).encode()
    except ValueError:
        return json.dumps(finite(document), allow_nan=False, separators=(",", ":")).encode()


def _number(request: Request, name: str, low: float, high: float) -> float | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and low <= value <= high):
        raise GatewayError(400, f"{name} must be a number in [{low:g}, {high:g}]", param=name)
    return value


def console_routes(admin: AdminAccess, state: ConsoleState) -> list[Route]:
    static = _static()

    def enabled() -> bool:
        return admin.open or bool(admin.holder.current.config.auth.admin_keys)

    def off() -> Response:
        return GatewayError(404, "Not Found", code="not_found").response()

    async def page(_: Request) -> Response:
        if not enabled():
            return off()
        return Response(static["index.html"], media_type=_CONTENT_TYPES["index.html"], headers=_HEADERS)

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if not enabled() or name not in static or name == "index.html":
            return off()
        return Response(static[name], media_type=_CONTENT_TYPES[name], headers=_HEADERS)

    async def api_state(request: Request) -> Response:
        if not enabled():
            return off()
        refused = admin.refusal(request)
        if refused is not None:
            return refused
        try:
            since = _number(request, "since", 0, 1e11)
            decisions = _number(request, "decisions", 0, MAX_DECISIONS)
        except GatewayError as exc:
            return exc.response()
        document = await state.document(since, DECISIONS if decisions is None else int(decisions))
        return Response(encode(document), media_type="application/json", headers={"cache-control": "no-store"})

    return [
        Route("/console", page, methods=["GET"]),
        Route("/console/", page, methods=["GET"]),
        Route("/console/static/{name}", asset, methods=["GET"]),
        Route("/console/api/state", api_state, methods=["GET"]),
    ]
