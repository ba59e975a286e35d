"""The grammar compiler's one worker is shared by every request of an engine: a short spec is
compiled before a longer one queued just ahead of it, but not before one that has waited its
length's delay; a request whose compile never started before its time ran out gets a retryable
busy error (its compile dropped), not a 400 blaming its own constraint; a caller that leaves
takes its queued compile with it; a shutdown fails what is queued. A stand-in spec holds the worker until the test lets it go; every other compile is
llguidance's own."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest

from engines.errors import EngineDeadError, GrammarCompilerBusyError
from engines.grammar import GrammarCompiler, GrammarSpec
from engines.grammar.compiler import QUEUE_DELAY_PER_CHAR_S
from engines.tokenizer import TextTokenizer
from gateway.errors import GatewayError
from gateway.tiers.embedded_outputs import tier_error

HOLD = GrammarSpec.regex("hold", "guided_regex")
SMALL = GrammarSpec.choice(["yes", "no"], "guided_choice")
BIG = GrammarSpec.choice([f"option number {i}" for i in range(2000)], "guided_choice")


class HeldCompiler(GrammarCompiler):
    """Compiles as usual, except that HOLD waits for `release` in the worker, and every spec the
    worker finishes is noted in order."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.holding = threading.Event()
        self.release = threading.Event()
        self.done: list[str] = []

    def new_state(self, spec):
        if spec == HOLD:
            self.holding.set()
            self.release.wait(30)
        state = super().new_state(spec)
        self.done.append(spec.param if spec != BIG else "big")
        return state


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from tests.tiny_models import write_tiny_byte_checkpoint

    path = tmp_path_factory.mktemp("bytes")
    write_tiny_byte_checkpoint(path)
    return TextTokenizer.from_file(path / "tokenizer.json", {})


def _compiler(tok, **kwargs) -> HeldCompiler:
    compiler = HeldCompiler(tok, tok.backend.get_vocab_size(), **kwargs)
    compiler.llg_tokenizer                          # built before anything is timed
    return compiler


@contextlib.contextmanager
def _behind_hold(compiler: HeldCompiler):
    """The worker held on HOLD while the block queues jobs (into the list it gets); then let go,
    and every job waited for."""
    jobs = [compiler.submit(HOLD)]
    assert compiler.holding.wait(30)
    yield jobs
    compiler.release.set()
    for job in jobs:
        job.result(30)


def test_a_short_spec_is_compiled_before_longer_ones_queued_ahead_of_it(tok):
    compiler = _compiler(tok)
    try:
        with _behind_hold(compiler) as jobs:
            jobs += [compiler.submit(BIG), compiler.submit(SMALL)]
        assert compiler.done == ["guided_regex", "guided_choice", "big"]
    finally:
        compiler.shutdown()


def test_a_cached_spec_goes_before_a_short_new_one(tok):
    compiler = _compiler(tok)
    try:
        compiler.submit(BIG).result(30)             # compiled once: cached
        compiler.done.clear()
        with _behind_hold(compiler) as jobs:
            jobs += [compiler.submit(SMALL), compiler.submit(BIG)]
        assert compiler.done == ["guided_regex", "big", "guided_choice"]
    finally:
        compiler.shutdown()


def test_a_compile_that_never_started_in_time_is_a_busy_error_and_leaves_the_queue(tok):
    compiler = _compiler(tok, timeout_s=0.2)

    async def scenario():
        held = compiler.submit(HOLD)
        assert await asyncio.to_thread(compiler.holding.wait, 30)
        with pytest.raises(GrammarCompilerBusyError):
            await compiler.state_for(SMALL)
        compiler.release.set()
        await asyncio.wrap_future(held)
        # the dropped compile never runs; the next request for it compiles normally
        assert compiler.done == ["guided_regex"]
        compiler.timeout_s = 30.0
        assert await compiler.state_for(SMALL) is not None
        assert compiler.done == ["guided_regex", "guided_choice"]

    try:
        asyncio.run(scenario())
    finally:
        compiler.release.set()
        compiler.shutdown()


def test_a_long_spec_goes_before_short_ones_sent_after_its_delay(tok):
    compiler = _compiler(tok)
    try:
        with _behind_hold(compiler) as jobs:
            jobs.append(compiler.submit(BIG))
            time.sleep(len(BIG.text) * QUEUE_DELAY_PER_CHAR_S + 0.05)     # its delay has passed
            jobs.append(compiler.submit(SMALL))
        assert compiler.done == ["guided_regex", "big", "guided_choice"]
    finally:
        compiler.shutdown()


def test_a_caller_that_stops_waiting_takes_its_queued_compile_with_it(tok):
    compiler = _compiler(tok)

    async def scenario():
        held = compiler.submit(HOLD)
        assert await asyncio.to_thread(compiler.holding.wait, 30)
        waiting = asyncio.create_task(compiler.state_for(SMALL))
        while not compiler._queue:                  # until it is queued behind HOLD
            await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        compiler.release.set()
        await asyncio.wrap_future(held)
        await asyncio.wrap_future(compiler.submit(BIG))   # the worker has passed where SMALL was
        assert compiler.done == ["guided_regex", "big"]

    try:
        asyncio.run(scenario())
    finally:
        compiler.release.set()
        compiler.shutdown()


def test_shutdown_fails_what_is_queued_as_the_engine_gone(tok):
    compiler = _compiler(tok)
    held = compiler.submit(HOLD)
    assert compiler.holding.wait(30)
    queued = compiler.submit(SMALL)
    compiler.shutdown()
    with pytest.raises(EngineDeadError):
        queued.result(30)
    compiler.release.set()
    held.result(30)
    with pytest.raises(EngineDeadError):
        compiler.submit(SMALL).result(30)


def test_the_busy_error_is_a_retryable_503_not_a_failure_of_the_tier():
    error = tier_error(GrammarCompilerBusyError("the constraint compiler is busy with other requests; retry shortly"))
    assert isinstance(error, GatewayError)           # not a TierFailure: no fallback, no breaker count
    assert error.status == 503 and error.type == "server_error" and error.code == "constraint_compiler_busy"
    assert error.headers == {"Retry-After": "1"}
