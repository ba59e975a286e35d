"""`make test` runs -m "not slow" and `make test-slow` runs -m slow; pytest exits 5 (a failure)
when a marker selects nothing. This fast test keeps the slow selection from becoming empty
unnoticed (the fast one holds this test)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_the_slow_selection_is_not_empty():
    marked = [p for p in TESTS.rglob("test_*.py") if "pytest.mark.slow" in p.read_text(encoding="utf-8")]
    assert len(marked) >= 5, marked
