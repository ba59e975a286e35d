"""Human-readable reasons for a refused request (the `message` of the OpenAI error body)."""

from __future__ import annotations

from policies.budgets.rules import NANO_PER_USD, describe_scope
from policies.budgets.types import HELD_SUFFIX, QUOTA_KINDS, Decision, ScopeRule

REASON_RATE = "rate_limit_exceeded"
REASON_QUOTA = "insufficient_quota"


def reason_for(code: str) -> str:
    return REASON_QUOTA if code in QUOTA_KINDS else REASON_RATE


def refusal_message(decision: Decision, rules: tuple[ScopeRule, ...], tokens: int, cost_nano: int) -> str:
    rule = next((r for r in rules if r.scope == decision.scope), None)
    who = describe_scope(decision.scope)
    limit = getattr(rule, decision.code, None) if rule is not None else None
    code = decision.code
    retry = decision.retry_after_s
    wait = f" Retry after {retry:.3f}s." if retry is not None else ""
    if code == "rpm":
        return f"Rate limit reached for {who}: {limit} requests per minute.{wait}"
    if code == "tpm":
        if retry is None:
            return (f"Request too large for {who}: {tokens} tokens (prompt + max_tokens) exceed the limit "
                    f"of {limit} tokens per minute. Lower max_tokens or shorten the prompt.")
        return f"Rate limit reached for {who}: {limit} tokens per minute, this request needs {tokens}.{wait}"
    if code == "max_concurrent":
        return f"Too many concurrent requests for {who}: at most {limit} at once.{wait}"
    held = code.endswith(HELD_SUFFIX)
    if held:
        code = code.removesuffix(HELD_SUFFIX)
        limit = getattr(rule, code, None) if rule is not None else None
    period = "day" if code.endswith("_day") else "month"
    if code.startswith("cost"):
        budget = f"${limit / NANO_PER_USD:.6g}" if limit is not None else "its"
        need = f"${cost_nano / NANO_PER_USD:.6g}"
    else:
        budget = f"{limit} tokens" if limit is not None else "its"
        need = f"{tokens} tokens"
    if held:
        return (f"The budget of {who} ({budget} per {period}) is held by requests in flight; this request "
                f"({need}) fits once they finish and give back what they did not use.{wait}")
    if retry is None:
        return f"This request ({need}) exceeds the whole budget of {who} ({budget} per {period})."
    return (f"You exceeded the budget of {who}: {budget} per {period} (this request needs {need}). "
            f"The budget renews in {retry:.0f}s (UTC).")
