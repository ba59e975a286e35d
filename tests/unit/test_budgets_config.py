"""The limits schema, scope rules, prices, UTC periods and response headers."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from policies.budgets import (
    Admission,
    InvalidScope,
    RateLimitInfo,
    Scopes,
    admission_headers,
)
from policies.budgets.headers import format_duration
from policies.budgets.rules import cost_nano, describe_scope, periods, scope_rules
from policies.limits_config import LimitsConfig, TierPrice

ROOT = Path(__file__).resolve().parents[2]


def test_example_config_is_valid():
    raw = yaml.safe_load((ROOT / "config" / "examples" / "redis.yaml").read_text())
    cfg = LimitsConfig.model_validate(raw["limits"])
    assert cfg.store.backend == "redis" and cfg.store.on_store_failure in ("open", "closed")


def test_empty_section_means_memory_and_no_limits():
    cfg = LimitsConfig.model_validate({})
    assert cfg.store.backend == "memory"
    assert scope_rules(cfg, Scopes(api_key="k", tenant="t", tier="m", session="s")) == ()


@pytest.mark.parametrize("raw,needle", [
    ({"store": {"backend": "redis"}}, "needs a url"),
    ({"store": {"backend": "redis", "url": "http://x"}}, "must start with redis://"),
    ({"store": {"reservation_ttl_s": 10}, "retry": {"deadline_s": 30}}, "must exceed retry.deadline_s"),
    ({"tenants": {"by_id": {"acme": {"rpm": -1}}}}, "greater than or equal to 0"),
    ({"tenants": {"by_id": {"acme": {"tokens_per_week": 5}}}}, "tokens_per_week"),
    ({"store": {"on_store_failure": "maybe"}}, "on_store_failure"),
    ({"breakers": {"default": {"failure_rate": 1.5}}}, "failure_rate"),
    ({"store": {"key_prefix": "has space"}}, "key_prefix"),
])
def test_bad_limits_name_the_field(raw, needle):
    with pytest.raises(ValidationError, match=needle):
        LimitsConfig.model_validate(raw)


def test_rules_pick_by_id_over_default_and_skip_empty_scopes():
    cfg = LimitsConfig.model_validate({
        "api_keys": {"default": {"rpm": 60}, "by_id": {"batch": {"tpm": 1000}}},
        "tenants": {"default": {"cost_per_day": 1.5}},
        "tiers": {"by_id": {"big": {"max_concurrent": 4}}},
        "sessions": {"default": {}},
    })
    rules = scope_rules(cfg, Scopes(api_key="batch", tenant="acme", tier="small", session="s1"))
    assert [r.scope for r in rules] == ["k:batch", "t:acme"]
    assert rules[0].tpm == 1000 and rules[0].rpm == -1
    assert rules[1].cost_per_day == 1_500_000_000
    assert all(r.budget_flags == 3 for r in rules)        # every scope counts its day and month use
    rules = scope_rules(cfg, Scopes(api_key="web", tier="big"))
    assert [(r.scope, r.rpm, r.max_concurrent) for r in rules] == [("k:web", 60, -1), ("m:big", -1, 4)]


@pytest.mark.parametrize("bad", ["", "x" * 201, "a\nb", "tab\there"])
def test_malformed_scope_ids_are_refused(bad):
    cfg = LimitsConfig.model_validate({"sessions": {"default": {"rpm": 1}}})
    with pytest.raises(InvalidScope):
        scope_rules(cfg, Scopes(tenant="acme", session=bad))


def test_cost_is_rounded_up_in_nano_usd():
    price = TierPrice(input_per_1m=0.15, output_per_1m=0.6)
    assert cost_nano(price, 1, 0) == 150
    assert cost_nano(price, 1000, 1000) == 750_000
    assert cost_nano(TierPrice(input_per_1m=0.0001), 1, 0) == 1   # never free when priced
    assert cost_nano(None, 10**6, 10**6) == 0


@pytest.mark.parametrize("when", ["1970-01-01T00:00:00", "2024-02-29T23:59:59.999999", "2024-12-31T12:00:00",
                                  "2100-03-01T00:00:00", "2026-11-30T00:00:00"])
def test_periods_match_the_calendar(when):
    t = dt.datetime.fromisoformat(when).replace(tzinfo=dt.UTC)
    us = int(t.timestamp()) * 1_000_000 + t.microsecond
    day, month, next_day, next_month = periods(us)
    assert day == t.strftime("%Y%m%d") and month == t.strftime("%Y%m")
    nd = dt.datetime.combine(t.date() + dt.timedelta(days=1), dt.time(), dt.UTC)
    nm = dt.datetime(t.year + (t.month == 12), t.month % 12 + 1, 1, tzinfo=dt.UTC)
    assert next_day == int(nd.timestamp()) * 1_000_000 and next_month == int(nm.timestamp()) * 1_000_000


def test_describe_scope():
    assert describe_scope("t:acme") == "tenant 'acme'"
    assert describe_scope("k:ci") == "api key 'ci'"
    assert describe_scope("s:acme/run-7") == "session 'run-7'"


@pytest.mark.parametrize("seconds,text", [(0, "0ms"), (0.0004, "1ms"), (0.25, "250ms"), (1, "1s"),
                                          (6.5, "6.5s"), (90, "1m30s"), (3725.0, "1h2m5s")])
def test_duration_format(seconds, text):
    assert format_duration(seconds) == text


def test_headers_of_a_refusal_round_retry_after_up():
    info = RateLimitInfo(limit_requests=60, remaining_requests=0, reset_requests_s=59.2,
                         limit_tokens=None)
    refused = Admission(False, "rate_limit_exceeded", "m", 0.2001, info, None)
    assert admission_headers(refused) == {
        "x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "59.2s", "retry-after": "1", "retry-after-ms": "201"}
    allowed = Admission(True, None, "", None, RateLimitInfo(limit_tokens=10, remaining_tokens=3,
                                                            reset_tokens_s=0.5), None)
    assert admission_headers(allowed) == {"x-ratelimit-limit-tokens": "10", "x-ratelimit-remaining-tokens": "3",
                                          "x-ratelimit-reset-tokens": "500ms"}
