"""Service addresses in the config, checked when it is read: a URL that cannot be connected to
(no host, a port out of range, spaces, a Redis database that is not a number) is the file's error,
named by its field, not a traceback at start or a tier that fails every request. Messages do not
repeat the URL: it may carry a password."""

from __future__ import annotations

from urllib.parse import urlsplit


def check_url(url: str, schemes: tuple[str, ...], field: str) -> str:
    """`url` itself when it is an address a client can use; ValueError naming `field` otherwise."""
    shown = " or ".join(f"{s}://" for s in schemes)
    try:
        parts = urlsplit(url)
        port = parts.port                   # raises on a port that is not a number in range
    except ValueError as exc:
        raise ValueError(f"{field} is not a valid URL ({exc})") from None
    if parts.scheme not in schemes:
        raise ValueError(f"{field} must start with {shown}")
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError(f"{field} names no socket path")
        return url
    if not parts.hostname or any(c.isspace() for c in url):
        raise ValueError(f"{field} names no usable host")
    if port == 0:
        raise ValueError(f"{field}: port 0 cannot be connected to")
    return url


def check_redis_url(url: str, field: str) -> str:
    """A redis://, rediss:// or unix:// URL; its database (the path, or ?db=) must be a number."""
    check_url(url, ("redis", "rediss", "unix"), field)
    parts = urlsplit(url)
    if parts.scheme != "unix":
        db = parts.path.lstrip("/")
        if db and not db.isdigit():
            raise ValueError(f"{field}: the database {db!r} is not a number")
    return url
