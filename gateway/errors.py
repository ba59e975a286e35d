"""OpenAI-format error bodies, and the exception that carries one through the request path."""

from __future__ import annotations

import json

from starlette.responses import JSONResponse, Response


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
