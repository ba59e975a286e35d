"""/openapi.json: the request schemas come from the pydantic models the gateway validates
with, so the document cannot drift from what is accepted."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic.json_schema import models_json_schema

from gateway.schema import ChatCompletionRequest, CompletionRequest

_REF = "#/components/schemas/{model}"

_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}

_USAGE = {"type": "object", "properties": {
    "prompt_tokens": {"type": "integer"}, "completion_tokens": {"type": "integer"},
    "total_tokens": {"type": "integer"},
    "prompt_tokens_details": {"type": "object", "properties": {"cached_tokens": {"type": "integer"}}}}}

_CHAT_RESPONSE = {"type": "object", "properties": {
    "id": {"type": "string"}, "object": {"const": "chat.completion"}, "created": {"type": "integer"},
    "model": {"type": "string"}, "usage": {"$ref": "#/components/schemas/Usage"},
    "choices": {"type": "array", "items": {"type": "object", "properties": {
        "index": {"type": "integer"},
        "message": {"type": "object", "properties": {"role": {"const": "assistant"}, "content": {"type": "string"}}},
        "logprobs": {"type": ["object", "null"]},
        "finish_reason": {"enum": ["stop", "length"]}}}}}}

_COMPLETION_RESPONSE = {"type": "object", "properties": {
    "id": {"type": "string"}, "object": {"const": "text_completion"}, "created": {"type": "integer"},
    "model": {"type": "string"}, "usage": {"$ref": "#/components/schemas/Usage"},
    "choices": {"type": "array", "items": {"type": "object", "properties": {
        "index": {"type": "integer"}, "text": {"type": "string"}, "logprobs": {"type": ["object", "null"]},
        "finish_reason": {"enum": ["stop", "length"]}}}}}}

_MODEL = {"type": "object", "properties": {"id": {"type": "string"}, "object": {"const": "model"},
                                           "created": {"type": "integer"}, "owned_by": {"type": "string"}}}
_MODELS = {"type": "object", "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": _MODEL}}}

_ROUTING_HEADERS = {
    "x-request-id": "id of this request in logs and traces",
    "x-tiergate-tier": "tier that answered",
    "x-tiergate-profile": "latency, throughput or memory",
    "x-tiergate-overhead-ms": "gateway time excluding the tier's",
    "x-tiergate-reasons": "why the request got its profile, what it needs, and the cascade's decision",
    "x-tiergate-fallbacks": "tiers skipped before the one that answered, with the reason",
    "x-tiergate-escalated-from": "the cascade's first tier, when its start looked unsure and the request was "
                                 "answered by x-tiergate-tier instead",
}


def _error_responses() -> dict:
    ref = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    return {str(code): {"description": text, **ref} for code, text in [
        (400, "bad input: malformed JSON, wrong type, out-of-range value, context_length_exceeded, "
              "unsupported_capability (no tier of the model supports e.g. tools)"),
        (401, "missing or invalid API key (when auth is on)"), (404, "unknown model"),
        (413, "request body too large"), (503, "no tier could serve the request")]}


def _completion_path(summary: str, request: str, response: str) -> dict:
    headers = {name: {"description": text, "schema": {"type": "string"}} for name, text in _ROUTING_HEADERS.items()}
    return {"post": {
        "summary": summary,
        "security": [{"bearer": []}, {}],
        "parameters": [{"name": "x-tiergate-profile", "in": "header", "required": False,
                        "description": "profile hint, honoured when the tenant allows it",
                        "schema": {"enum": ["latency", "throughput", "memory"]}}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": _REF.format(model=request)}}}},
        "responses": {
            "200": {"description": "the answer; with stream: true, server-sent events ending in `data: [DONE]`",
                    "headers": headers,
                    "content": {"application/json": {"schema": {"$ref": _REF.format(model=response)}},
                                "text/event-stream": {"schema": {"type": "string"}}}},
            **_error_responses()}}}


_TOKENIZE_REQUEST = {
    "type": "object", "required": ["model"],
    "description": "a prompt (as /v1/completions takes one, text only) or a chat (as /v1/chat/completions "
                   "takes one: messages, tools, add_generation_prompt, continue_final_message, "
                   "chat_template_kwargs); the chat fields are validated as there",
    "properties": {"model": {"type": "string"}, "prompt": {"type": "string"}, "messages": {"type": "array"},
                   "add_special_tokens": {"type": "boolean"}, "return_token_strs": {"type": "boolean"}}}
_TOKENIZE_RESPONSE = {
    "type": "object", "required": ["count", "max_model_len", "tokens"],
    "properties": {"count": {"type": "integer"}, "max_model_len": {"type": ["integer", "null"]},
                   "tokens": {"type": "array", "items": {"type": "integer"}},
                   "token_strs": {"type": ["array", "null"], "items": {"type": "string"}}}}
_DETOKENIZE_REQUEST = {
    "type": "object", "required": ["model", "tokens"], "additionalProperties": False,
    "properties": {"model": {"type": "string"}, "tokens": {"type": "array", "items": {"type": "integer"}}}}
_DETOKENIZE_RESPONSE = {"type": "object", "required": ["prompt"], "properties": {"prompt": {"type": "string"}}}


def _tokenizer_path(summary: str, request: dict, response: dict) -> dict:
    return {"post": {
        "summary": summary, "security": [{"bearer": []}, {}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
        "responses": {"200": {"description": "ok", "content": {"application/json": {"schema": response}}},
                      **_error_responses()}}}


def openapi_document(models: Sequence[str] = ()) -> dict:
    """`models`: the model names this gateway serves; given, `model` is stated as their enum, so a
    schema-driven client (or fuzzer) sends requests that reach a tier."""
    _, defs = models_json_schema([(ChatCompletionRequest, "validation"), (CompletionRequest, "validation")],
                                 ref_template=_REF)
    schemas = dict(defs.get("$defs", {}))
    if models:
        for request in ("ChatCompletionRequest", "CompletionRequest"):
            schemas[request]["properties"]["model"] = {**schemas[request]["properties"]["model"],
                                                       "enum": list(models)}
    schemas.update(Error=_ERROR, Usage=_USAGE, ChatCompletion=_CHAT_RESPONSE, Completion=_COMPLETION_RESPONSE,
                   Model=_MODEL, ModelList=_MODELS)
    tokenize, detokenize = _TOKENIZE_REQUEST, _DETOKENIZE_REQUEST
    if models:
        named = {"type": "string", "enum": list(models)}
        tokenize = {**tokenize, "properties": {**tokenize["properties"], "model": named}}
        detokenize = {**detokenize, "properties": {**detokenize["properties"], "model": named}}
    simple = {"200": {"description": "ok"}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "tiergate", "version": "0.1.0",
                 "description": "OpenAI-compatible gateway with embedded engines and remote tiers"},
        "components": {"schemas": schemas, "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": {
            "/v1/chat/completions": _completion_path("Chat completion", "ChatCompletionRequest", "ChatCompletion"),
            "/v1/completions": _completion_path("Text completion", "CompletionRequest", "Completion"),
            "/v1/models": {"get": {"summary": "Model ids this caller may use", "responses": {"200": {
                "description": "the list", "content": {"application/json": {"schema": {
                    "$ref": "#/components/schemas/ModelList"}}}}, "401": _error_responses()["401"]}}},
            "/tokenize": _tokenizer_path("vLLM's: a model's token ids for a prompt or a chat (embedded tiers)",
                                         tokenize, _TOKENIZE_RESPONSE),
            "/detokenize": _tokenizer_path("vLLM's: the text of a model's token ids (embedded tiers)",
                                           detokenize, _DETOKENIZE_RESPONSE),
            "/v1/models/{model}": {"get": {
                "summary": "One model this caller may use (404 for any other name)",
                "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "the model", "content": {"application/json": {"schema": {
                    "$ref": "#/components/schemas/Model"}}}},
                    "401": _error_responses()["401"], "404": _error_responses()["404"]}}},
            "/healthz": {"get": {"summary": "The process is up", "responses": simple}},
            "/readyz": {"get": {"summary": "Every tier is loaded (503 with per-tier states until then)",
                                "responses": {**simple, "503": {"description": "still loading or a tier failed"}}}},
            "/openapi.json": {"get": {"summary": "This document", "responses": simple}},
        },
    }
