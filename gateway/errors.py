"""OpenAI-format error bodies."""

from __future__ import annotations

from starlette.responses import JSONResponse


def error_response(status: int, message: str, type_: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)
