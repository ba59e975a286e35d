"""OpenAI-format error bodies, and the exception that carries one through the request path."""

from __future__ import annotations

import json

from starlette.responses import JSONResponse, Response


def param_path(parts) -> str:
    """A field's path as OpenAI writes it in `param`: names joined by dots, list indices in
    brackets (messages[0].content)."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, type_: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param, code), status_code=status)


class GatewayError(Exception):
    """A request that ends with an OpenAI error body. `raw` passes an upstream's own body through;
    `headers` go on the response (Retry-After, x-ratelimit-*)."""

    def __init__(self, status: int, message: str, type_: str | None = None, param: str | None = None,
                 code: str | None = None, raw: bytes | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_ or _default_type(status)
        self.param = param
        self.code = code
        self.raw = raw
        self.headers = headers

    def body_bytes(self) -> bytes:
        if self.raw is not None:
            return self.raw
        return json.dumps(error_body(self.message, self.type, self.param, self.code)).encode()

    def response(self, headers: dict[str, str] | None = None) -> Response:
        if self.headers:
            headers = {**self.headers, **(headers or {})}
        return Response(self.body_bytes(), status_code=self.status, headers=headers, media_type="application/json")


def _default_type(status: int) -> str:
    if status == 403:
        return "permission_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


MODEL_ECHO_CHARS = 64


def unknown_model(name: str) -> GatewayError:
    """The 404 of a model id the caller may not use; it names at most MODEL_ECHO_CHARS of it (the
    id is the caller's bytes, and an error is no place to send them back in bulk)."""
    shown = name if len(name) <= MODEL_ECHO_CHARS else name[:MODEL_ECHO_CHARS] + "..."
    return GatewayError(404, f"The model '{shown}' does not exist or you do not have access to it",
                        param="model", code="model_not_found")
