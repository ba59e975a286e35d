"""API keys -> tenants. Keys are compared as SHA-256 digests, so plain keys live nowhere in
the config; the digest table is built once per config."""

from __future__ import annotations

import hashlib

from gateway.errors import GatewayError
from policies.config import AuthConfig

_MISSING = ("You didn't provide an API key. Provide it in an Authorization header using Bearer auth "
            "(Authorization: Bearer YOUR_KEY).")


class KeyTable:
    def __init__(self, auth: AuthConfig):
        self.enabled = auth.enabled
        self.anonymous = (auth.anonymous_tenant, None)
        self._by_digest = {key.digest(): (key.tenant, key.name) for key in auth.keys}

    def authenticate(self, authorization: str | None) -> tuple[str, str | None]:
        """(tenant, key label) of the caller, or a 401 GatewayError."""
        if not self.enabled:
            return self.anonymous
        if not authorization:
            raise GatewayError(401, _MISSING)
        scheme, _, key = authorization.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise GatewayError(401, _MISSING)
        found = self._by_digest.get(hashlib.sha256(key.encode()).hexdigest())
        if found is None:
            shown = key[:3] + "..." + key[-4:] if len(key) > 8 else "***"
            raise GatewayError(401, f"Incorrect API key provided: {shown}.", code="invalid_api_key")
        return found
