"""HTTP headers of an admission: x-ratelimit-* (OpenAI's names) and Retry-After."""

from __future__ import annotations

import math

from policies.budgets.types import Admission, RateLimitInfo


def format_duration(seconds: float) -> str:
    """OpenAI's reset format: '250ms', '6s', '1m30s', '2h0m5s' (rounded up to the millisecond)."""
    ms = max(0, math.ceil(seconds * 1000 - 1e-6))
    if ms < 1000:
        return f"{ms}ms"
    total_s = ms / 1000
    h, rest = divmod(total_s, 3600)
    m, s = divmod(rest, 60)
    s_text = f"{s:.3f}".rstrip("0").rstrip(".") + "s"
    if h >= 1:
        return f"{int(h)}h{int(m)}m{s_text}"
    if m >= 1:
        return f"{int(m)}m{s_text}"
    return s_text


def ratelimit_headers(info: RateLimitInfo) -> dict[str, str]:
    headers = {}
    if info.limit_requests is not None:
        headers["x-ratelimit-limit-requests"] = str(info.limit_requests)
        headers["x-ratelimit-remaining-requests"] = str(info.remaining_requests)
        headers["x-ratelimit-reset-requests"] = format_duration(info.reset_requests_s or 0.0)
    if info.limit_tokens is not None:
        headers["x-ratelimit-limit-tokens"] = str(info.limit_tokens)
        headers["x-ratelimit-remaining-tokens"] = str(info.remaining_tokens)
        headers["x-ratelimit-reset-tokens"] = format_duration(info.reset_tokens_s or 0.0)
    return headers


def retry_after_headers(retry_after: float | None) -> dict[str, str]:
    """Retry-After in whole seconds (HTTP), rounded up so a client that obeys it is admitted;
    retry-after-ms for clients that read it (the openai SDKs do)."""
    if retry_after is None:
        return {}
    return {"retry-after": str(max(0, math.ceil(retry_after))),
            "retry-after-ms": str(max(0, math.ceil(retry_after * 1000)))}


def admission_headers(admission: Admission) -> dict[str, str]:
    """Every header the gateway adds to a response (admitted or refused) for this admission."""
    headers = ratelimit_headers(admission.limits)
    if not admission.allowed:
        headers.update(retry_after_headers(admission.retry_after))
    return headers
