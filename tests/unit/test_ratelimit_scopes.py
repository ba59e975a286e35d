"""x-ratelimit-* figures come from the caller's own scopes (API key, tenant, session), never from
a tier's scope, which every tenant shares: on the memory store and in Redis' script alike."""

from __future__ import annotations

import uuid

import pytest

from policies.budgets import Budgets, Scopes, admission_headers
from policies.limits_config import LimitsConfig
from tests.redis_server import running_redis


@pytest.fixture(scope="module")
def redis_url():
    with running_redis() as server:
        yield server.url


@pytest.fixture(params=["memory", "redis"])
async def make_budgets(request):
    made = []

    def make(**limits) -> Budgets:
        if request.param == "memory":
            store = {"backend": "memory"}
        else:
            store = {"backend": "redis", "url": request.getfixturevalue("redis_url"),
                     "key_prefix": "t" + uuid.uuid4().hex[:10]}
        budgets = Budgets.from_config(LimitsConfig.model_validate({"store": store, **limits}))
        made.append(budgets)
        return budgets

    yield make
    for budgets in made:
        await budgets.close()


TIER = {"tiers": {"by_id": {"shared": {"rpm": 50, "tpm": 1000}}}}


async def test_the_tier_scope_is_left_out_of_the_headers(make_budgets):
    budgets = make_budgets(tenants={"by_id": {"acme": {"rpm": 1000, "tpm": 100_000}}}, **TIER)
    admitted = await budgets.reserve(Scopes(tenant="acme", tier="shared"), 10, 10)
    assert admitted.allowed
    headers = admission_headers(admitted)
    assert (headers["x-ratelimit-limit-requests"], headers["x-ratelimit-remaining-requests"]) == ("1000", "999")
    assert (headers["x-ratelimit-limit-tokens"], headers["x-ratelimit-remaining-tokens"]) == ("100000", "99980")


async def test_a_caller_with_no_limits_of_its_own_gets_no_ratelimit_headers(make_budgets):
    budgets = make_budgets(**TIER)
    admitted = await budgets.reserve(Scopes(tenant="free", tier="shared"), 10, 10)
    assert admitted.allowed and admission_headers(admitted) == {}


async def test_session_and_key_scopes_are_the_callers(make_budgets):
    budgets = make_budgets(api_keys={"by_id": {"ci": {"rpm": 300}}}, sessions={"default": {"rpm": 200}}, **TIER)
    admitted = await budgets.reserve(Scopes(api_key="ci", tenant="acme", tier="shared", session="s1"), 1, 1)
    assert admission_headers(admitted)["x-ratelimit-limit-requests"] == "200"   # not the tier's 50


async def test_a_tier_refusal_still_happens(make_budgets):
    budgets = make_budgets(**{"tiers": {"by_id": {"shared": {"rpm": 1}}}})
    scopes = Scopes(tenant="acme", tier="shared")
    assert (await budgets.reserve(scopes, 1, 0)).allowed
    refused = await budgets.reserve(scopes, 1, 0)
    assert not refused.allowed and refused.scope == "m:shared"
    assert not [h for h in admission_headers(refused) if h.startswith("x-ratelimit")]
