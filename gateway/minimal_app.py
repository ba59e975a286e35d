"""A first HTTP app: /healthz, /v1/models and non-streaming chat completions on one
embedded tier, served by the batching engine (concurrent requests share steps).

The gateway issue replaces it with the full proxy (routing, budgets, streaming, auth).
"""

from __future__ import annotations

import json
import time
import uuid
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from engines.async_engine import AsyncEngine
from engines.chat_template import ChatTemplateError
from engines.sampling_params import InvalidRequestError, SamplingParams
from gateway.errors import error_response


def build_app(engine: AsyncEngine, model_id: str) -> Starlette:
    loaded = engine.engine.loaded

    async def healthz(_: Request):
        return JSONResponse({"status": "ok"})

    async def models(_: Request):
        return JSONResponse({"object": "list", "data": [
            {"id": model_id, "object": "model", "created": 0, "owned_by": "tiergate"}]})

    async def chat(request: Request):
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return error_response(400, "request body is not valid JSON")
        if not isinstance(body, dict):
            return error_response(400, "request body must be a JSON object")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("content"), str) and isinstance(m.get("role"), str)
            for m in messages
        ):
            return error_response(400, "messages must be a non-empty list of {role, content} objects", param="messages")
        if body.get("stream"):
            return error_response(400, "streaming is not supported by this minimal server yet", param="stream")
        stop = body.get("stop") or []
        try:
            params = SamplingParams(
                max_tokens=body.get("max_tokens") or body.get("max_completion_tokens") or 128,
                temperature=float(body.get("temperature", 1.0)),
                top_p=float(body.get("top_p", 1.0)),
                seed=body.get("seed"),
                stop=[stop] if isinstance(stop, str) else list(stop),
                presence_penalty=float(body.get("presence_penalty", 0.0)),
                frequency_penalty=float(body.get("frequency_penalty", 0.0)),
            )
            prompt_ids = loaded.tokenizer.encode(loaded.chat_template.render(messages))
            text, last = "", None
            async for out in engine.generate(f"chatcmpl-{uuid.uuid4().hex}", prompt_ids, params):
                text += out.text
                last = out
        except InvalidRequestError as exc:
            code = "context_length_exceeded" if "context length" in str(exc) else None
            return error_response(400, str(exc), param=exc.param, code=code)
        except ChatTemplateError as exc:
            return error_response(400, str(exc), param="messages")
        except (TypeError, ValueError) as exc:
            return error_response(400, f"invalid sampling parameter: {exc}")
        return JSONResponse({
            "id": last.request_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model_id,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": last.finish_reason}],
            "usage": {"prompt_tokens": last.prompt_tokens, "completion_tokens": last.completion_tokens,
                      "total_tokens": last.prompt_tokens + last.completion_tokens,
                      "prompt_tokens_details": {"cached_tokens": last.cached_tokens}},
        })

    @asynccontextmanager
    async def lifespan(_app):
        yield
        engine.shutdown()

    return Starlette(routes=[
        Route("/healthz", healthz),
        Route("/v1/models", models),
        Route("/v1/chat/completions", chat, methods=["POST"]),
    ], lifespan=lifespan)
