"""The beam search's rules on hand-computed cases. The engine is a table of next-token logprobs
(a test double: a real model cannot be made to give these exact distributions; the gateway test
compares the search on a real model with transformers' beam search)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from engines.sampler import TokenLogprob
from gateway.context import Usage
from gateway.tiers.beam_search import Beam, BeamSettings, search

STOP, A, B, C = 0, 1, 2, 3
PROMPT = [7, 8]
TABLE = {
    (): [(A, -0.1), (B, -0.5), (STOP, -3.0), (C, -4.0)],
    (A,): [(STOP, -0.2), (A, -1.0), (B, -2.0), (C, -3.0)],
    (B,): [(A, -0.1), (STOP, -1.5), (B, -2.5), (C, -3.0)],
}
ELSEWHERE = [(A, -1.0), (B, -1.2), (C, -1.5), (STOP, -2.0)]


class TableEngine:
    def __init__(self, table=TABLE, elsewhere=ELSEWHERE):
        self.table, self.elsewhere = table, elsewhere
        self.calls: list[tuple[int, ...]] = []

    async def generate(self, request_id, ids, params, scope, priority, rank=0):
        assert ids[:len(PROMPT)] == PROMPT and params.max_tokens == 1 and params.top_logprobs == 4
        generated = tuple(ids[len(PROMPT):])
        self.calls.append(generated)
        top = self.table.get(generated, self.elsewhere)
        # As if the prefix cache held all but the last two tokens.
        yield SimpleNamespace(logprobs=[TokenLogprob(top[0][0], top[0][1], top=list(top))],
                              prompt_tokens=len(ids), cached_tokens=max(0, len(ids) - 2))


def _run(engine, max_tokens=3, penalty=1.0, stop=frozenset({STOP})):
    spent = Usage()
    beams = asyncio.run(search(engine, "r", PROMPT, BeamSettings(2, max_tokens, stop, penalty), None, 0, spent))
    return beams, spent


def test_finished_and_live_beams_compete_by_length_normalised_score():
    engine = TableEngine()
    beams, spent = _run(engine)
    # a+stop: -0.3 over 1 token (the stop token is not counted); b a a: -1.6 over 3 tokens.
    assert beams == [Beam((A, STOP), pytest.approx(-0.3), True), Beam((B, A, A), pytest.approx(-1.6), False)]
    # One call for the prompt, then one per live beam per step; each later call prefilled the two
    # tokens the cache did not hold, charged as prompt tokens.
    assert engine.calls[0] == () and len(engine.calls) == 5 and spent.completion_tokens == 5
    assert spent.prompt_tokens == len(PROMPT) + 4 * 2 and spent.cached_tokens == 0


def test_without_length_normalisation_the_summed_logprob_decides():
    beams, _ = _run(TableEngine(), penalty=0.0)
    assert [b.tokens for b in beams] == [(A, STOP), (B, A, A)]
    assert beams[1].score(0.0) == pytest.approx(-1.6)


def test_the_search_stops_once_no_live_beam_can_beat_the_finished_ones():
    # After the first step every continuation is far less likely than stopping.
    table = {(): [(A, -0.1), (B, -0.2), (STOP, -5.0), (C, -6.0)],
             (A,): [(STOP, -0.1), (A, -9.0), (B, -9.0), (C, -9.0)],
             (B,): [(STOP, -0.1), (A, -9.0), (B, -9.0), (C, -9.0)]}
    engine = TableEngine(table)
    beams, spent = _run(engine, max_tokens=50)
    assert [b.tokens for b in beams] == [(A, STOP), (B, STOP)] and all(b.stopped for b in beams)
    assert len(engine.calls) == 3 and spent.completion_tokens == 3


def test_with_no_stop_token_every_beam_runs_to_max_tokens():
    beams, _ = _run(TableEngine(), max_tokens=4, stop=frozenset())
    assert all(len(b.tokens) == 4 and not b.stopped for b in beams)
