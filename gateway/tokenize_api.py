"""vLLM's `/tokenize` and `/detokenize`: a model's own token ids for a prompt or a chat (through
its chat template, with the template controls the chat endpoint honours), and text for ids.
Clients count tokens against a model's context or budget with them, or build token-id prompts.

The tokenizer is an embedded tier's: a routed alias answers only when every embedded tier it may
reach tokenizes the same way (else the client names a concrete model), and a model served only
upstream is a 400. Keys and the tenant's model list apply as on the completion endpoints; no
budget is charged (nothing is generated). Bodies are bounded as the completion endpoints' are,
and big ones are tokenized off the event loop.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.errors import GatewayError
from gateway.request_body import OFF_LOOP_BYTES, read_body
from gateway.runtime import Runtime, RuntimeHolder
from gateway.schema import ChatCompletionRequest, CompletionRequest, parse_body
from gateway.schema_extensions import unknown_names
from gateway.tiers.embedded import EmbeddedTier
from gateway.tiers.embedded_prompts import render_prompts

MAX_DETOKENIZE_IDS = 1 << 20
_TOKENIZE_ONLY = ("return_token_strs",)


class TokenizeEndpoints:
    def __init__(self, holder: RuntimeHolder):
        self.holder = holder

    async def tokenize(self, request: Request) -> Response:
        try:
            rt = self.holder.current
            fields, raw_size = await self._body(rt, request)
            strs = fields.pop("return_token_strs", False)
            if not isinstance(strs, bool):
                raise GatewayError(400, "return_token_strs must be a boolean", param="return_token_strs")
            chat = "messages" in fields
            if not chat and not isinstance(fields.get("prompt"), str):
                raise GatewayError(400, "prompt must be a string (or send messages)", param="prompt")
            model = ChatCompletionRequest if chat else CompletionRequest
            body = parse_body(model, json.dumps(fields).encode())
            unknown = unknown_names(model.known_extensions, body.model_extra)
            if unknown:
                raise GatewayError(400, f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0],
                                   code="unknown_parameter")
            tier = _tier_for(rt, request, body.model)
            if raw_size <= OFF_LOOP_BYTES:
                return JSONResponse(_tokenized(tier, body, strs))
            return JSONResponse(await asyncio.to_thread(_tokenized, tier, body, strs))
        except GatewayError as exc:
            return exc.response()

    async def detokenize(self, request: Request) -> Response:
        try:
            rt = self.holder.current
            fields, raw_size = await self._body(rt, request)
            extra = sorted(set(fields) - {"model", "tokens"})
            if extra:
                raise GatewayError(400, f"Unrecognized request argument supplied: {extra[0]}", param=extra[0],
                                   code="unknown_parameter")
            model, tokens = fields.get("model"), fields.get("tokens")
            if not isinstance(model, str):
                raise GatewayError(400, "'model' is a required property", param="model")
            if not isinstance(tokens, list) or len(tokens) > MAX_DETOKENIZE_IDS or \
                    not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
                raise GatewayError(400, f"tokens must be a list of at most {MAX_DETOKENIZE_IDS} token ids",
                                   param="tokens")
            tier = _tier_for(rt, request, model)
            vocab = tier.loaded.tokenizer.backend.get_vocab_size(with_added_tokens=True)
            bad = next((t for t in tokens if not 0 <= t < vocab), None)
            if bad is not None:
                raise GatewayError(400, f"token id {bad} is outside the model's vocabulary (0-{vocab - 1})",
                                   param="tokens")
            decode = tier.loaded.tokenizer.decode
            text = decode(tokens) if raw_size <= OFF_LOOP_BYTES else await asyncio.to_thread(decode, tokens)
            return JSONResponse({"prompt": text})
        except GatewayError as exc:
            return exc.response()

    @staticmethod
    async def _body(rt: Runtime, request: Request) -> tuple[dict[str, Any], int]:
        # The key first: a stranger's body is never read.
        rt.keys.authenticate(request.headers.get("authorization"))
        length = request.headers.get("content-length")
        raw = await read_body(request.receive, None if length is None else length.encode(), rt.max_body_bytes,
                              rt.config.server.body_timeout_s)
        try:
            fields = json.loads(raw)
        except ValueError as exc:
            raise GatewayError(400, f"request body is not valid JSON ({exc})") from None
        if not isinstance(fields, dict):
            raise GatewayError(400, "request body must be a JSON object")
        return fields, len(raw)


def _tier_for(rt: Runtime, request: Request, model: str) -> EmbeddedTier:
    """The embedded tier whose tokenizer answers for `model`, as the tenant may see it."""
    tenant_name, _ = rt.keys.authenticate(request.headers.get("authorization"))
    tenant = rt.tenant(tenant_name)
    if not rt.router.knows(model) or (tenant.models is not None and model not in tenant.models):
        raise GatewayError(404, f"The model '{model}' does not exist or you do not have access to it",
                           param="model", code="model_not_found")
    tiers = [rt.tiers[name] for name in rt.counters[model]]
    if not tiers:
        raise GatewayError(400, f"model '{model}' is served by upstream tiers only: its tokenizer is not here",
                           param="model")
    # Every tier still loading could tokenize differently from the loaded ones: wait for them.
    if any(tier.loaded is None and tier.state == "loading" for tier in tiers):
        raise GatewayError(503, f"model '{model}' is still loading", type_="server_error", code="model_loading")
    loaded = [tier for tier in tiers if tier.loaded is not None]
    if not loaded:
        raise GatewayError(503, f"no tier of model '{model}' is loaded", type_="server_error", code="model_unavailable")
    if len({tier.tokenizer_key for tier in loaded}) > 1:
        raise GatewayError(400, f"the tiers of '{model}' ({', '.join(t.name for t in loaded)}) tokenize "
                                f"differently: name one of its concrete models", param="model")
    return loaded[0]


def _tokenized(tier: EmbeddedTier, body: ChatCompletionRequest | CompletionRequest, strs: bool) -> dict:
    ids = render_prompts(tier.loaded, body)[0]
    backend = tier.loaded.tokenizer.backend
    return {"count": len(ids), "max_model_len": tier.context_length, "tokens": ids,
            "token_strs": [backend.id_to_token(t) for t in ids] if strs else None}
