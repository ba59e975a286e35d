"""A tenant's `priority` means "higher first" (the config's word) all the way into the engine:
with one free slot, the waiting request of the higher-priority tenant is admitted first, though
it arrived later."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.context import RequestContext
from gateway.schema import CompletionRequest
from gateway.tiers.base import TierCall
from gateway.tiers.embedded import EmbeddedTier
from policies.tier_config import EmbeddedTierConfig
from tests.tiny_models import write_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-priority")
    write_tiny_checkpoint(path, seed=7, initializer_range=0.2)
    return path


async def _until(condition, what: str) -> None:
    deadline = time.monotonic() + 120          # generous: a loaded machine is slow, not stuck
    while not condition():
        assert time.monotonic() < deadline, f"not true after 120s: {what}"
        await asyncio.sleep(0.01)


async def test_the_higher_priority_tenant_is_admitted_first_when_the_engine_is_full(tiny_dir):
    tier = EmbeddedTier("tiny", EmbeddedTierConfig(model=str(tiny_dir), dtype="float32", max_model_len=256,
                                                  kv_cache_memory="1MiB", max_num_seqs=1, max_num_batched_tokens=64))
    await tier.start()
    assert tier.ready
    llm = tier.engine.engine
    finished: list[str] = []

    async def call(tenant: str, priority: int) -> None:
        # As the pipeline sets them from the tenant's config (gateway/pipeline.py).
        ctx = RequestContext(request_id=tenant, endpoint="completions", tenant=tenant, priority=priority)
        body = CompletionRequest.model_validate({"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 6,
                                                 "temperature": 0, "ignore_eos": True})
        await tier.complete(TierCall(ctx, body, "tiny"))
        finished.append(tenant)

    # Hold the engine's steps (requests still enter its queue), so both wait for the one slot.
    llm.has_unfinished = lambda: False
    try:
        low = asyncio.create_task(call("low", 1))
        await _until(lambda: llm.scheduler.num_waiting == 1, "the first request queued")
        high = asyncio.create_task(call("high", 10))
        await _until(lambda: llm.scheduler.num_waiting == 2, "both requests queued")
    finally:
        del llm.has_unfinished
    await asyncio.wait_for(asyncio.gather(low, high), 120)
    # One slot: the first admitted runs to its end before the other starts.
    assert finished == ["high", "low"]
    await tier.close()
