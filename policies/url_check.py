"""Service addresses in the config, checked when it is read: a URL that cannot be connected to
(no host, a port out of range, spaces, a Redis database that is not a number) is the file's error,
named by its field, not a traceback at start or a tier that fails every request. Messages do not
repeat the URL: it may carry a password. Where a configured URL is logged or shown (/readyz, a
failure's detail), it is shown_url's form of it, without its credentials."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

# Query parameters that may carry a secret (redis-py reads ?password=; proxies take ?api_key=...).
_SECRET_PARAM = re.compile(r"(?i)((?:^|&)[^=&]*(?:pass|secret|token|key|auth)[^=&]*=)[^&]*")


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


def check_base_url(url: str, field: str) -> str:
    """An http(s) URL that paths are appended to (an upstream's /v1): a query or a fragment would
    end up before the appended path (`/v1?api-version=X/chat/completions`), and credentials in it
    would be written wherever the URL is; ValueError naming `field` for either."""
    check_url(url, ("http", "https"), field)
    parts = urlsplit(url)
    if parts.query or parts.fragment or url.rstrip().endswith(("?", "#")):
        raise ValueError(f"{field} must not have a query (?...) or a fragment (#...): paths are appended to it")
    if "@" in parts.netloc:
        raise ValueError(f"{field} must not carry credentials (user:password@); give the API key through "
                         f"api_key_env")
    return url


def shown_url(url: str) -> str:
    """`url` as logs and status pages show it: its userinfo (a password, or a token as user name)
    and the values of query parameters that look secret replaced by ***."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(an invalid URL)"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    query = _SECRET_PARAM.sub(r"\1***", parts.query)
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def check_redis_url(url: str, field: str) -> str:
    """A redis://, rediss:// or unix:// URL; its database (the path, or ?db=) must be a number."""
    check_url(url, ("redis", "rediss", "unix"), field)
    parts = urlsplit(url)
    if parts.scheme != "unix":
        db = parts.path.lstrip("/")
        if db and not db.isdigit():
            raise ValueError(f"{field}: the database {db!r} is not a number")
    return url
