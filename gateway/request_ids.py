"""Every response carries an `x-request-id`, as OpenAI's do: clients (the openai SDK's
`request_id`) and support tickets quote it. The completion endpoints set their own (the id their
spans, log line and console decision carry); every other response (models, tokenize, health,
a 404 or 405 of a path that is not ours) gets a fresh one here."""

from __future__ import annotations

import uuid

HEADER = b"x-request-id"


class RequestIds:
    """ASGI middleware; `own_ids`: paths whose POST endpoint sets the header itself (not wrapped,
    so a stream's chunks pass without an extra call each)."""

    def __init__(self, app, own_ids: frozenset[str] = frozenset()):
        self.app = app
        self.own_ids = own_ids

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] == "POST" and scope["path"] in self.own_ids:
            await self.app(scope, receive, send)
            return

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                if not any(name.lower() == HEADER for name, _ in headers):
                    headers.append((HEADER, uuid.uuid4().hex.encode()))
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_id)
