"""The server URL `bench serve` is pointed at, checked before the workload is built: a URL that is
not one, or a server that does not answer, is one line and not a failed run."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from gateway.cli.usage_error import UsageError

CONNECT_TIMEOUT_S = 5.0


def check_server_url(url: str, flag: str) -> None:
    """Raises UsageError unless `url` is an http(s) URL whose host accepts a TCP connection."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise UsageError(f"{flag} {url!r} has an invalid port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{flag} must be an http:// or https:// URL such as http://127.0.0.1:8000/v1, "
                         f"not {url!r}")
    port = port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise UsageError(f"{flag} {url}: cannot connect to {parts.hostname}:{port} ({reason})") from None
