"""From the YAML limits and a request's scopes to the store's rules; prices; UTC periods."""

from __future__ import annotations

import math

from policies.budgets.types import (
    NO_LIMIT,
    SCOPE_PREFIX,
    InvalidScope,
    ScopeRule,
    Scopes,
)
from policies.limits_config import LimitsConfig, ScopeLimits, TierPrice

NANO_PER_USD = 1_000_000_000
MAX_SCOPE_ID_CHARS = 200
US_PER_DAY = 86_400 * 1_000_000


def check_scope_id(kind: str, value: str) -> str:
    if not value:
        raise InvalidScope(f"{kind} must not be empty")
    if len(value) > MAX_SCOPE_ID_CHARS:
        raise InvalidScope(f"{kind} is longer than {MAX_SCOPE_ID_CHARS} characters")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise InvalidScope(f"{kind} contains control characters")
    return value


def usd_to_nano(usd: float | None) -> int:
    return NO_LIMIT if usd is None else round(usd * NANO_PER_USD)


def cost_nano(price: TierPrice | None, input_tokens: int, output_tokens: int) -> int:
    """Cost in nano-USD, rounded up so that many small requests never undercharge a budget."""
    if price is None:
        return 0
    # One token at $P per million tokens costs P * 1000 nano-USD.
    return math.ceil(input_tokens * price.input_per_1m * 1000 + output_tokens * price.output_per_1m * 1000)


def _rule(scope_id: str, limits: ScopeLimits) -> ScopeRule:
    def n(v):
        return NO_LIMIT if v is None else int(v)
    return ScopeRule(
        scope=scope_id, rpm=n(limits.rpm), tpm=n(limits.tpm), max_concurrent=n(limits.max_concurrent),
        tokens_per_day=n(limits.tokens_per_day), tokens_per_month=n(limits.tokens_per_month),
        cost_per_day=usd_to_nano(limits.cost_per_day), cost_per_month=usd_to_nano(limits.cost_per_month))


def scope_rules(config: LimitsConfig, scopes: Scopes) -> tuple[ScopeRule, ...]:
    """The rules of every scope of this request that has at least one limit, in a fixed order."""
    tables = (("api_key", config.api_keys, scopes.api_key),
              ("tenant", config.tenants, scopes.tenant),
              ("tier", config.tiers, scopes.tier),
              ("session", config.sessions, scopes.session))
    rules = []
    for kind, table, value in tables:
        if value is None:
            continue
        check_scope_id(kind, value)
        limits = table.for_id(value)
        if limits is None or limits.is_empty():
            continue
        # A session id is chosen by the client: key it under the tenant so tenants never collide.
        key = f"{scopes.tenant or ''}/{value}" if kind == "session" else value
        rules.append(_rule(SCOPE_PREFIX[kind] + key, limits))
    return tuple(rules)


def describe_scope(scope_id: str | None) -> str:
    """'t:acme' -> "tenant 'acme'" for error messages."""
    if not scope_id:
        return "this request"
    names = {v: k.replace("_", " ") for k, v in SCOPE_PREFIX.items()}
    kind = names.get(scope_id[:2], "scope")
    value = scope_id[2:]
    if kind == "session":
        value = value.split("/", 1)[-1]
    return f"{kind} {value!r}"


# --- UTC calendar periods (the Redis script computes the same labels from Redis' clock) ---

def _civil_from_days(z: int) -> tuple[int, int, int]:
    """Days since 1970-01-01 -> (year, month, day) in the proleptic Gregorian calendar."""
    z += 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    y = yoe + era * 400
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return (y + 1 if m <= 2 else y), m, d


def _days_from_civil(y: int, m: int, d: int) -> int:
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    mp = m - 3 if m > 2 else m + 9
    doy = (153 * mp + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def periods(now_us: int) -> tuple[str, str, int, int]:
    """(day label, month label, start of the next day, start of the next month), times in µs."""
    days = now_us // US_PER_DAY
    y, m, d = _civil_from_days(days)
    ny, nm = (y + 1, 1) if m == 12 else (y, m + 1)
    return (f"{y:04d}{m:02d}{d:02d}", f"{y:04d}{m:02d}", (days + 1) * US_PER_DAY,
            _days_from_civil(ny, nm, 1) * US_PER_DAY)
