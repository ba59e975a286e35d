"""Before `serve` loads anything: the address it will listen on resolves and the port can be bound.

uvicorn binds only after the runtime is built, so a port in use or a host that is not this
machine's would otherwise show after every model had loaded (and exit with uvicorn's message).
The probe binds as uvicorn's server does (asyncio's create_server: every address the host
resolves to, SO_REUSEADDR so that a port left in TIME_WAIT by a previous run passes, IPv6
sockets v6-only) and closes its sockets at once, leaving the port free for uvicorn.
"""

from __future__ import annotations

import errno
import socket
from contextlib import ExitStack

from gateway.cli.usage_error import UsageError


def check_can_listen(host: str, port: int, host_flag: str, port_flag: str) -> None:
    """UsageError naming `host_flag` or `port_flag` (the option, or the config field, that set it)."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        raise UsageError(f"{host_flag} {host!r} does not resolve to an address "
                         f"({_reason(exc)})") from None
    with ExitStack() as probes:
        for family, kind, proto, _, address in dict.fromkeys(addresses):
            try:
                probe = probes.enter_context(socket.socket(family, kind, proto))
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise UsageError(f"{port_flag} {port}: the port is in use on {host} ({_reason(exc)})") from None
                if exc.errno == errno.EACCES:
                    raise UsageError(f"{port_flag} {port}: not allowed to listen on it ({_reason(exc)})") from None
                raise UsageError(f"{host_flag} {host!r}: cannot listen there ({_reason(exc)})") from None


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc)
