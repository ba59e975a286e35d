"""vLLM's `/tokenize` and `/detokenize`: a model's own token ids for a prompt or a chat (through
its chat template, with the template controls and `truncate_prompt_tokens` the completion
endpoints honour: the very ids they run), and text for ids.
Clients count tokens against a model's context or budget with them, or build token-id prompts.

The tokenizer is an embedded tier's: a routed alias answers only when every embedded tier it may
reach tokenizes the same way (else the client names a concrete model), and a model served only
upstream is a 400. Keys and the tenant's model list apply as on the completion endpoints; no
budget is charged (nothing is generated). Bodies are bounded as the completion endpoints' are;
a big one is parsed, tokenized and answered in a worker thread, a few at a time, so that neither
the event loop nor the shared thread pool is held by one client.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pydantic_core
from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import GatewayError, unknown_model
from gateway.request_body import CLOSE, OFF_LOOP_BYTES, read_body
from gateway.runtime import Runtime, RuntimeHolder
from gateway.schema import ChatCompletionRequest, CompletionRequest, parse_body
from gateway.schema_extensions import unknown_names
from gateway.tiers.embedded import EmbeddedTier
from gateway.tiers.embedded_jobs import check_supported
from gateway.tiers.embedded_prompts import render_prompts, truncate_prompts

MAX_DETOKENIZE_IDS = 1 << 20
OFF_LOOP_JOBS = 2          # big bodies worked on at once; the others wait their turn
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


class TokenizeEndpoints:
    def __init__(self, holder: RuntimeHolder):
        self.holder = holder
        self._off_loop = asyncio.Semaphore(OFF_LOOP_JOBS)

    async def tokenize(self, request: Request) -> Response:
        return await self._answer(request, _tokenize)

    async def detokenize(self, request: Request) -> Response:
        return await self._answer(request, _detokenize)

    async def _answer(self, request: Request, work) -> Response:
        rt = self.holder.current
        headers = request.headers
        try:
            # The key first: a stranger's body is never read (and the connection is not kept).
            tenant, _ = rt.keys.authenticate(headers.get("authorization"))
        except GatewayError as exc:
            exc.headers = {**(exc.headers or {}), **CLOSE}
            return exc.response()
        try:
            length = headers.get("content-length")
            raw = await read_body(request.receive, None if length is None else length.encode(), rt.max_body_bytes,
                                  rt.config.server.body_timeout_s)
            if len(raw) <= OFF_LOOP_BYTES:
                body = work(rt, tenant, raw)
            else:
                async with self._off_loop:
                    body = await asyncio.to_thread(work, rt, tenant, raw)
            return Response(body, media_type="application/json")
        except GatewayError as exc:
            return exc.response()


def _tokenize(rt: Runtime, tenant: str, raw: bytes) -> bytes:
    fields = _object(raw)
    strs = fields.pop("return_token_strs", None)
    if strs is not None and not isinstance(strs, bool):
        raise GatewayError(400, "return_token_strs must be a boolean", param="return_token_strs")
    chat = "messages" in fields
    if not chat and not isinstance(fields.get("prompt"), str):
        raise GatewayError(400, "prompt must be a string (or send messages)", param="prompt")
    model = ChatCompletionRequest if chat else CompletionRequest
    body = parse_body(model, _dumps(fields).encode())
    unknown = unknown_names(model.known_extensions, body.model_extra)
    if unknown:
        raise GatewayError(400, f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0],
                           code="unknown_parameter")
    check_supported(body)          # what would change the prompt and no embedded tier does
    tier = _tier_for(rt, tenant, body.model)
    ids = truncate_prompts(body, render_prompts(tier.loaded, body), tier.context_length)[0]
    backend = tier.loaded.tokenizer.backend
    return _dumps({"count": len(ids), "max_model_len": tier.context_length, "tokens": ids,
                   "token_strs": [backend.id_to_token(t) for t in ids] if strs else None}).encode()


def _detokenize(rt: Runtime, tenant: str, raw: bytes) -> bytes:
    fields = _object(raw)
    extra = sorted(set(fields) - {"model", "tokens"})
    if extra:
        raise GatewayError(400, f"Unrecognized request argument supplied: {extra[0]}", param=extra[0],
                           code="unknown_parameter")
    model, tokens = fields.get("model"), fields.get("tokens")
    if not isinstance(model, str):
        raise GatewayError(400, "'model' is a required property", param="model")
    if not isinstance(tokens, list) or len(tokens) > MAX_DETOKENIZE_IDS or \
            not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise GatewayError(400, f"tokens must be a list of at most {MAX_DETOKENIZE_IDS} token ids", param="tokens")
    tier = _tier_for(rt, tenant, model)
    vocab = tier.loaded.tokenizer.backend.get_vocab_size(with_added_tokens=True)
    bad = next((t for t in tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise GatewayError(400, f"token id {bad} is outside the model's vocabulary (0-{vocab - 1})", param="tokens")
    # Special tokens stay in the text, as vLLM gives them: a chat's ids come back as its template wrote it.
    return _dumps({"prompt": tier.loaded.tokenizer.decode(tokens, skip_special_tokens=False)}).encode()


def _object(raw: bytes) -> dict[str, Any]:
    try:
        fields = pydantic_core.from_json(raw)      # bounded nesting, unlike json.loads
    except ValueError as exc:
        raise GatewayError(400, f"request body is not valid JSON ({exc})") from None
    if not isinstance(fields, dict):
        raise GatewayError(400, "request body must be a JSON object")
    return fields


def _tier_for(rt: Runtime, tenant_name: str, model: str) -> EmbeddedTier:
    """The embedded tier whose tokenizer answers for `model`, as the tenant may see it."""
    tenant = rt.tenant(tenant_name)
    if not rt.router.knows(model) or (tenant.models is not None and model not in tenant.models):
        raise unknown_model(model)
    tiers = [rt.tiers[name] for name in rt.counters[model]]
    if not tiers:
        raise GatewayError(400, f"model '{model}' is served by upstream tiers only: its tokenizer is not here",
                           param="model")
    # A tier still loading could tokenize differently from the loaded ones: wait for it.
    if any(tier.tokenizer_key is None and tier.state == "loading" for tier in tiers):
        raise GatewayError(503, f"model '{model}' is still loading", type_="server_error", code="model_loading")
    loaded = [tier for tier in tiers if tier.loaded is not None and tier.tokenizer_key is not None]
    if not loaded:
        raise GatewayError(503, f"no tier of model '{model}' is loaded", type_="server_error", code="model_unavailable")
    if len({tier.tokenizer_key for tier in loaded}) > 1:
        raise GatewayError(400, f"'{model}' reaches models that tokenize differently: name one of its concrete models",
                           param="model")
    return loaded[0]
