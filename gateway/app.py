"""The Starlette app: OpenAI endpoints, vLLM's /tokenize and /detokenize, health, readiness, OpenAPI.

Embedded tiers load in the background once the server listens: /healthz answers at once,
/readyz says 200 only when every tier may take calls (loaded, its engine alive), else 503;
its detailed view names each tier that may not, and why.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.admin_access import AdminAccess
from gateway.console.recorder import ConsoleRecorder
from gateway.console.routes import console_routes
from gateway.console.state import ConsoleState
from gateway.errors import GatewayError, error_response, unknown_model
from gateway.openapi import openapi_document
from gateway.pipeline import Pipeline
from gateway.reload import ConfigReloader
from gateway.request_ids import RequestIds
from gateway.runtime import RuntimeHolder
from gateway.telemetry.metrics import METRICS_OPENAPI, metrics_endpoint
from gateway.telemetry.setup import Telemetry, build_telemetry
from gateway.telemetry.tier_stats import breaker_states, tier_set_source
from gateway.tokenize_api import TokenizeEndpoints

log = logging.getLogger(__name__)


def freeze_heap() -> None:
    """Move everything alive now (modules, torch, weights' Python objects) out of the garbage
    collector's sight: full collections then scan only request-time objects, instead of
    pausing the event loop for tens of milliseconds."""
    gc.collect()
    gc.freeze()


def _model_card(alias: str, created: int) -> dict:
    return {"id": alias, "object": "model", "created": created, "owned_by": "tiergate"}


def build_app(holder: RuntimeHolder, reloader: ConfigReloader | None = None,
              telemetry: Telemetry | None = None, host: str | None = None) -> Starlette:
    """`telemetry`: built from the config's `telemetry:` section and OTEL_* when not given (tests
    pass one with an in-memory exporter). Raises TelemetryConfigError on a bad OTEL_* value.
    Telemetry settings are read once: a reload does not change them (tenants' opt-ins it does).
    `host`: the listen address (default: the reloader's, else the config's); off loopback the
    operator's endpoints need an admin key."""
    telemetry = telemetry or build_telemetry(holder.current.config.telemetry)
    telemetry.metrics.add_tier_set(tier_set_source(holder))
    telemetry.metrics.set_breaker_reader(lambda: breaker_states(holder))
    pipeline = Pipeline(holder, telemetry)
    tokenizing = TokenizeEndpoints(holder)
    admin = AdminAccess(holder, host or (reloader.host if reloader is not None else holder.current.config.server.host))
    console = ConsoleRecorder(holder)      # the operator console's view of the traffic (/console)
    pipeline.on_end.append(console.request_ended)
    # By (config generation, the caller's model ids): a reload may change the names, tenants differ.
    documents: dict[tuple[int, tuple[str, ...]], dict] = {}
    background: set[asyncio.Task] = set()
    created = int(time.time())       # a model card's `created`: when this gateway began serving it

    async def healthz(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        detailed = admin.allows(request)
        rt = holder.current
        tiers = {name: tier.describe() for name, tier in rt.tiers.items()}
        # Ready: every tier may take calls now (loaded and, if embedded, its engine alive).
        not_ready = {name: why for name, tier in rt.tiers.items() if (why := tier.unusable_reason()) is not None}
        loading = any(tier.state == "loading" for tier in rt.tiers.values())
        body = {"status": "ready" if not not_ready else "loading" if loading else "not_ready", "tiers": tiers}
        if not_ready:
            body["not_ready"] = not_ready
        return JSONResponse(body if detailed else {"status": body["status"]}, status_code=503 if not_ready else 200)

    async def models(request: Request) -> Response:
        rt = holder.current
        try:
            tenant, _ = rt.keys.authenticate(request.headers.get("authorization"))
        except GatewayError as exc:
            return exc.response()
        data = [_model_card(alias, created) for alias in rt.models_for(rt.tenant(tenant))]
        return JSONResponse({"object": "list", "data": data})

    async def model(request: Request) -> Response:
        """OpenAI's retrieve-model: the card of one model the caller may use, else its 404."""
        rt = holder.current
        try:
            tenant, _ = rt.keys.authenticate(request.headers.get("authorization"))
            name = request.path_params["model"]
            if name not in rt.models_for(rt.tenant(tenant)):
                raise unknown_model(name)
        except GatewayError as exc:
            return exc.response()
        return JSONResponse(_model_card(name, created))

    async def openapi_json(request: Request) -> Response:
        """The document states the model ids the caller may use (a schema-driven client reaches the
        tiers): every one without auth, its tenant's with a valid key, none to a caller without one
        (it would learn other tenants' model ids)."""
        rt = holder.current
        try:
            tenant, _ = rt.keys.authenticate(request.headers.get("authorization"))
            models = tuple(rt.models_for(rt.tenant(tenant)))
        except GatewayError:
            models = ()
        key = (holder.generation, models)
        if key not in documents:
            if len(documents) > 64 or any(generation != holder.generation for generation, _ in documents):
                documents.clear()
            documents[key] = openapi_document(list(models))
            documents[key]["paths"]["/metrics"] = METRICS_OPENAPI
        return JSONResponse(documents[key])

    async def http_error(_: Request, exc: HTTPException) -> Response:
        response = error_response(exc.status_code, exc.detail or "error",
                                  code="not_found" if exc.status_code == 404 else None)
        response.headers.update(exc.headers or {})        # a 405's Allow
        return response

    async def server_error(_: Request, exc: Exception) -> Response:
        log.error("unhandled error", exc_info=exc)
        return error_response(500, "internal error in the gateway", type_="server_error")

    @asynccontextmanager
    async def lifespan(_app):
        for tier in holder.current.tiers.values():
            task = asyncio.create_task(tier.start(), name=f"load-{tier.name}")
            background.add(task)
            task.add_done_callback(background.discard)
        if reloader is not None:
            reloader.start()
        ticking = asyncio.create_task(console.run(), name="console-tick")   # sparklines, shared history
        background.add(ticking)
        ticking.add_done_callback(background.discard)
        await holder.open_limits().check_store()    # budgets, breakers, retry budget
        freeze_heap()
        try:
            yield
        finally:
            if reloader is not None:
                await reloader.stop()
            for task in list(background):
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await asyncio.gather(*(t.close() for t in holder.current.tiers.values()), return_exceptions=True)
            await holder.close_limits()   # queued reconciliations applied (bounded wait), stores closed
            await asyncio.to_thread(telemetry.shutdown)   # exports the spans still queued

    routes = [
        Route("/v1/chat/completions", pipeline, methods=["POST"]),   # ASGI endpoints: the hot path
        Route("/v1/completions", pipeline, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/tokenize", tokenizing.tokenize, methods=["POST"]),
        Route("/detokenize", tokenizing.detokenize, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
        Route("/metrics", admin.guard(metrics_endpoint(telemetry.metrics)), methods=["GET"], name="metrics"),
        *console_routes(admin, ConsoleState(holder, console, reloader)),
    ]
    pipeline_paths = frozenset(r.path for r in routes[:2])
    app = Starlette(routes=routes, lifespan=lifespan,
                    middleware=[Middleware(RequestIds, own_ids=pipeline_paths)],
                    exception_handlers={HTTPException: http_error, Exception: server_error})
    # Starlette would answer `/metrics/` with a 307 to a Location built from the client's Host
    # header (an open redirect); a path that is not ours is a 404 in OpenAI form instead.
    app.router.redirect_slashes = False
    return app
