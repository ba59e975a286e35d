"""API keys -> tenants. Keys are compared as SHA-256 digests, so plain keys live nowhere in
the config; the digest table is built once per config.

A presented key is never repeated in an answer or a log line, not even in part: the 401
message is fixed, so the request's log line and span (which carry the message) hold nothing
of it either."""

from __future__ import annotations

from gateway.errors import GatewayError
from policies.config import AuthConfig, hash_api_key

_MISSING = ("You didn't provide an API key. Provide it in an Authorization header using Bearer auth "
            "(Authorization: Bearer YOUR_KEY).")
_INCORRECT = "Incorrect API key provided."


class KeyTable:
    def __init__(self, auth: AuthConfig):
        self.enabled = auth.enabled
        self.anonymous = (auth.anonymous_tenant, None)
        self._by_digest = {key.digest(): (key.tenant, key.name) for key in auth.keys}
        self._admin = frozenset(key.digest() for key in auth.admin_keys)

    def authenticate(self, authorization: str | None) -> tuple[str, str | None]:
        """(tenant, key label) of the caller, or a 401 GatewayError."""
        if not self.enabled:
            return self.anonymous
        digest = _digest(authorization)
        if digest is None:
            raise GatewayError(401, _MISSING)
        found = self._by_digest.get(digest)
        if found is None:
            raise GatewayError(401, _INCORRECT, code="invalid_api_key")
        return found

    def is_admin(self, authorization: str | None) -> bool:
        return bool(self._admin) and _digest(authorization) in self._admin


def bearer_key(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer KEY` header; None when there is none."""
    if not authorization:
        return None
    scheme, _, key = authorization.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        return None
    return key


def _digest(authorization: str | None) -> str | None:
    key = bearer_key(authorization)
    # hashed as configured keys are (hash_api_key), so that the two can only ever agree
    return None if key is None else hash_api_key(key)
