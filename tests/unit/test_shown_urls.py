"""Configured URLs written to logs or shown (/readyz, a tier failure's detail) carry no
credentials: the budget store's Redis URL with its password, an upstream's base URL (whose
userinfo the config refuses, and which is shown without it all the same)."""

from __future__ import annotations

import logging

from gateway.limits import GatewayLimits
from gateway.tiers.upstream import UpstreamTier
from policies.limits_config import LimitsConfig
from policies.telemetry_config import http_url_problem
from policies.tier_config import UpstreamTierConfig
from tests.redis_server import free_port


async def test_an_unreachable_budget_store_is_logged_without_its_password(caplog):
    caplog.set_level(logging.WARNING, logger="gateway.limits")
    url = f"redis://:s3cret@127.0.0.1:{free_port()}/0"
    limits = GatewayLimits.open(LimitsConfig.model_validate({
        "store": {"backend": "redis", "url": url, "on_store_failure": "open", "timeout_s": 0.5},
        "tenants": {"by_id": {"acme": {"tokens_per_day": 100}}}}))
    try:
        await limits.check_store()
    finally:
        await limits.close()
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "unreachable at start" in logged and "127.0.0.1" in logged and "s3cret" not in logged


def test_an_upstream_url_is_shown_and_reported_without_credentials():
    config = UpstreamTierConfig.model_construct(kind="upstream", base_url="http://user:s3cret@10.0.0.5:8000/v1",
                                                model="m")
    tier = UpstreamTier("up", config)
    failure = tier._failure(OSError("refused"))
    assert tier.describe()["base_url"] == "http://***@10.0.0.5:8000/v1"
    assert "10.0.0.5:8000" in failure.detail and "s3cret" not in failure.detail


def test_a_bad_collector_url_is_named_in_its_error_without_credentials():
    problem = http_url_problem("ftp://user:s3cret@collector:4318")
    assert "collector:4318" in problem and "s3cret" not in problem
