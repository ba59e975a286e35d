"""A first HTTP app: /healthz, /v1/models and non-streaming chat completions on one
embedded tier, served by the single-sequence generator one request at a time.

The gateway issue replaces it with the full proxy (batching engine, routing, budgets).
"""

from __future__ import annotations

import json
import threading
import time
import uuid

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from engines.chat_template import ChatTemplateError
from engines.loaded_model import LoadedModel
from engines.simple_generate import SimpleSampling, generate_tokens
from gateway.errors import error_response


def build_app(loaded: LoadedModel, model_id: str, max_model_len: int) -> Starlette:
    lock = threading.Lock()  # the simple generator serves one sequence at a time

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
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 128
        temperature = body.get("temperature", 1.0)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return error_response(400, "max_tokens must be a positive integer", param="max_tokens")
        if not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
            return error_response(400, "temperature must be between 0 and 2", param="temperature")
        try:
            prompt = loaded.chat_template.render(messages)
        except ChatTemplateError as exc:
            return error_response(400, str(exc), param="messages")
        prompt_ids = loaded.tokenizer.encode(prompt)
        if len(prompt_ids) + max_tokens > max_model_len:
            return error_response(
                400, f"prompt ({len(prompt_ids)} tokens) plus max_tokens ({max_tokens}) exceeds "
                f"the context length {max_model_len}", param="max_tokens", code="context_length_exceeded")
        sampling = SimpleSampling(max_tokens=max_tokens, temperature=float(temperature), seed=body.get("seed"))

        def run() -> list[int]:
            with lock:
                return list(generate_tokens(loaded.model, prompt_ids, sampling, loaded.tokenizer.eos_token_ids))

        out = await run_in_threadpool(run)
        finished = bool(out) and out[-1] in loaded.tokenizer.eos_token_ids
        text_ids = out[:-1] if finished else out
        return JSONResponse({
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model_id,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": loaded.tokenizer.decode(text_ids)},
                "finish_reason": "stop" if finished else "length",
            }],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(out),
                      "total_tokens": len(prompt_ids) + len(out)},
        })

    return Starlette(routes=[
        Route("/healthz", healthz),
        Route("/v1/models", models),
        Route("/v1/chat/completions", chat, methods=["POST"]),
    ])
