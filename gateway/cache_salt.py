"""Prefix-cache scopes for the engines and `cache_salt` for upstream tiers, derived from a
secret the gateway holds.

A scope decides which requests may reuse each other's cached prompt blocks, and so which
requests can learn (from `usage.prompt_tokens_details.cached_tokens`, or from timing) that
another one sent a given prompt. A tenant gets a scope of its own unless the operator put it
in the shared scope or in a named group; a request's `cache_salt` narrows whatever scope the
tenant has to the requests carrying the same salt, never widens it.

Every scope is an HMAC under the gateway's secret (the operator's `server.prefix_cache_secret_env`,
else random per process), over length-prefixed parts: no client value can name, guess or
collide with another tenant's scope, and a salt is only ever mixed in under its tenant's.
An upstream tier that supports vLLM's `cache_salt` gets a one-way hash of the scope, so two
tenants behind one upstream are isolated there too, and the upstream learns nothing of the
gateway's secret or of the client's own salt.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from policies.policy_config import PrefixCacheGroup, PrefixCacheMode

_UPSTREAM_LABEL = b"tiergate upstream cache_salt\x00"


class PrefixScopes:
    """Derives scopes; holds the per-process secret used when the operator configures none."""

    def __init__(self, process_secret: bytes | None = None):
        self._process_secret = process_secret or secrets.token_bytes(32)

    def scope(self, configured_secret: str | None, tenant: str, mode: PrefixCacheMode,
              request_salt: str | None = None) -> str:
        key = configured_secret.encode() if configured_secret is not None else self._process_secret
        parts = scope_parts(tenant, mode, request_salt)
        return hmac.new(key, _encode(parts), hashlib.sha256).hexdigest()


def scope_parts(tenant: str, mode: PrefixCacheMode, request_salt: str | None) -> tuple[str, ...]:
    """What a scope is made of: who shares it, then the request's salt if any. The tenant name
    enters only an isolated scope, so tenants of one group (or of the shared scope) agree."""
    if isinstance(mode, PrefixCacheGroup):
        parts: tuple[str, ...] = ("group", mode.group)
    elif mode == "shared":
        parts = ("shared",)
    else:
        parts = ("tenant", tenant)
    if request_salt is not None:
        parts += ("salt", request_salt)
    return parts


def upstream_cache_salt(scope: str) -> str:
    return hashlib.sha256(_UPSTREAM_LABEL + scope.encode()).hexdigest()


def set_upstream_cache_salt(body: dict, scope: str | None, supported: bool) -> None:
    """Rewrite an outgoing body's `cache_salt`: the client's value never leaves as sent (it would
    let tenants behind one upstream share, or probe, each other's cache); a tier that supports
    the field gets the scope's salt, any other tier none (it may reject an unknown field)."""
    body.pop("cache_salt", None)
    if supported and scope is not None:
        body["cache_salt"] = upstream_cache_salt(scope)


def _encode(parts: tuple[str, ...]) -> bytes:
    # Length-prefixed, so ("tenant", "a:salt") and ("tenant", "a", "salt", ...) never meet.
    out = bytearray()
    for part in parts:
        raw = part.encode()
        out += len(raw).to_bytes(4, "big") + raw
    return bytes(out)
