"""A seeded request's uniforms are a function of the output position alone."""

from __future__ import annotations

import pytest

from engines.position_draws import CHUNK, PositionDraws


def test_a_position_has_one_uniform_whatever_was_asked_before():
    forward = PositionDraws(7)
    values = [forward.at(i) for i in range(3 * CHUNK)]
    jumped = PositionDraws(7)
    assert jumped.at(2 * CHUNK + 5) == values[2 * CHUNK + 5]        # asked out of order
    assert [jumped.at(i) for i in range(3 * CHUNK)] == values
    assert all(0.0 <= v < 1.0 for v in values) and len(set(values)) == len(values)
    assert PositionDraws(8).at(0) != values[0]


def test_released_positions_are_dropped_and_later_ones_kept():
    draws = PositionDraws(3)
    values = [draws.at(i) for i in range(2 * CHUNK + 10)]
    draws.release_before(CHUNK + 3)                  # whole chunks only: position CHUNK stays
    assert draws.at(CHUNK) == values[CHUNK] and draws.at(2 * CHUNK + 9) == values[2 * CHUNK + 9]
    with pytest.raises(ValueError, match="released"):
        draws.at(CHUNK - 1)
