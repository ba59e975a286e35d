"""`bench ladder`'s rungs follow the project's order and each adds exactly one optimisation;
its quality and ratio figures are computed as documented."""

from __future__ import annotations

from dataclasses import fields

from bench.engine.ladder import _agreement, _ratio, ladder_rungs

ORDER = ["baseline", "batching", "int4-awq", "prefix-cache", "kv-int8", "spec-ngram"]


def _knobs(rung) -> dict:
    return {f.name: getattr(rung, f.name) for f in fields(rung) if f.name not in ("name", "adds")}


def test_each_rung_adds_exactly_one_thing_in_the_fixed_order():
    rungs = ladder_rungs(64)
    assert [r.name for r in rungs] == ORDER
    for before, after in zip(rungs, rungs[1:]):
        a, b = _knobs(before), _knobs(after)
        changed = [k for k in a if a[k] != b[k]]
        assert len(changed) == 1, (after.name, changed)
    assert rungs[0].max_num_seqs == 1 and rungs[-1].spec is not None and rungs[-1].spec.method == "ngram"


def test_agreement_counts_tokens_up_to_the_first_difference():
    reference = {"a": [1, 2, 3, 4], "b": [5, 6], "c": [7, 8, 9, 10]}
    mine = {"a": [1, 2, 3, 4], "b": [5, 0], "c": [0, 8, 9, 10]}
    got = _agreement(mine, reference)
    assert got == {"prefix_token_agreement": round(5 / 10, 4), "identical_outputs": 1, "requests": 3}


def test_ratios_use_p50_of_percentile_figures_and_skip_the_first_rung():
    assert _ratio({"output_tokens_per_s": 30.0}, {"output_tokens_per_s": 10.0}, "output_tokens_per_s") == 3.0
    assert _ratio({"tpot_ms": {"p50": 40.0, "p99": 90.0}}, {"tpot_ms": {"p50": 20.0}}, "tpot_ms") == 2.0
    assert _ratio({"output_tokens_per_s": 1.0}, None, "output_tokens_per_s") is None
