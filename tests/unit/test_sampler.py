"""Batched sampling against direct computations on crafted logits."""

from __future__ import annotations

import pytest
import torch

from engines.sampler import Sampler
from engines.sampling_params import InvalidRequestError, SamplingParams
from engines.sequence import Sequence

V = 50


def _seqs(*params: SamplingParams) -> list[Sequence]:
    return [Sequence(str(i), [1], p) for i, p in enumerate(params)]


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax_and_restrictive_filters_reduce_to_greedy():
    logits = _logits(4)
    seqs = _seqs(SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_k=1),
                 SamplingParams(temperature=1.5, top_p=1e-6), SamplingParams(temperature=1.0, min_p=1.0))
    out = Sampler(seed=0)(logits, seqs)
    assert out.token_ids == logits.argmax(-1).tolist()


def test_top_k_never_leaves_the_k_best():
    logits = _logits(1, seed=3)
    allowed = set(logits[0].topk(3).indices.tolist())
    sampler = Sampler(seed=1)
    picks = {sampler(logits, _seqs(SamplingParams(temperature=2.0, top_k=3))).token_ids[0] for _ in range(200)}
    assert picks <= allowed and len(picks) > 1


def test_top_p_keeps_the_smallest_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05] + [0.0] * (V - 4)])
    logits = torch.log(probs.clamp_min(1e-12))
    sampler = Sampler(seed=2)
    picks = {sampler(logits, _seqs(SamplingParams(temperature=1.0, top_p=0.75))).token_ids[0] for _ in range(300)}
    assert picks == {0, 1}


def test_sampling_follows_the_distribution():
    probs = torch.tensor([[0.7, 0.2, 0.1] + [0.0] * (V - 3)])
    logits = torch.log(probs.clamp_min(1e-12))
    sampler = Sampler(seed=5)
    draws = [sampler(logits, _seqs(SamplingParams(temperature=1.0))).token_ids[0] for _ in range(3000)]
    freq = torch.bincount(torch.tensor(draws), minlength=3)[:3].float() / len(draws)
    assert torch.allclose(freq, probs[0, :3], atol=0.03)


def test_seeded_request_is_reproducible_whatever_the_batch():
    logits = _logits(3, seed=7)
    alone = [Sampler()(logits[1:2], _seqs(SamplingParams(temperature=1.0, seed=42))).token_ids[0] for _ in range(2)]
    mixed = Sampler(seed=99)(logits, [
        Sequence("a", [1], SamplingParams(temperature=1.0)),
        Sequence("b", [1], SamplingParams(temperature=1.0, seed=42)),
        Sequence("c", [1], SamplingParams(temperature=0.7)),
    ]).token_ids[1]
    assert alone[0] == alone[1] == mixed


def test_penalties_push_repeated_tokens_down():
    logits = torch.zeros(1, V)
    logits[0, 5] = 1.0
    logits[0, 6] = 0.9
    seq = Sequence("a", [1], SamplingParams(temperature=0, frequency_penalty=0.2), output_ids=[5])
    assert Sampler()(logits, [seq]).token_ids == [6]
    seq = Sequence("b", [1], SamplingParams(temperature=0, presence_penalty=0.05), output_ids=[5, 5, 5])
    assert Sampler()(logits, [seq]).token_ids == [5]  # presence counts once: 1.0 - 0.05 > 0.9


def test_logprobs_are_the_model_distribution():
    logits = _logits(2, seed=11)
    out = Sampler()(logits, _seqs(SamplingParams(temperature=0, logprobs=True, top_logprobs=3),
                                  SamplingParams(temperature=0)))
    expected = torch.log_softmax(logits[0], -1)
    lp = out.logprobs[0]
    assert lp.token_id == out.token_ids[0]
    assert lp.logprob == pytest.approx(expected.max().item(), abs=1e-5)
    assert [t for t, _ in lp.top] == expected.topk(3).indices.tolist()
    assert out.logprobs[1] is None


def test_entropy_of_the_model_distribution_only_for_requests_asking():
    logits = _logits(3, seed=5)
    logits[2, :10] = float("-inf")                  # tokens ruled out add nothing (0 * log 0 = 0)
    out = Sampler()(logits, _seqs(SamplingParams(temperature=0.7, logprobs=True, entropy=True, seed=1),
                                  SamplingParams(temperature=0, logprobs=True),
                                  SamplingParams(temperature=0, logprobs=True, entropy=True)))
    for row in (0, 2):
        p = torch.softmax(logits[row], -1)
        expected = -(p[p > 0] * p[p > 0].log()).sum().item()    # raw logits: temperature does not change it
        assert out.logprobs[row].entropy == pytest.approx(expected, abs=1e-5)
    assert out.logprobs[1].entropy is None
    assert out.logprobs[1].logprob == pytest.approx(torch.log_softmax(logits[1], -1).max().item(), abs=1e-5)


@pytest.mark.parametrize("kwargs,param", [
    ({"max_tokens": 0}, "max_tokens"), ({"temperature": 3.0}, "temperature"), ({"top_p": 0.0}, "top_p"),
    ({"top_k": -1}, "top_k"), ({"stop": ["a"] * 5}, "stop"), ({"top_logprobs": 2}, "top_logprobs"),
    ({"entropy": True}, "entropy"),
])
def test_invalid_params_name_the_field(kwargs, param):
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**kwargs).validate()
    assert info.value.param == param


@pytest.mark.parametrize("scale", [0.5, 3.0, 12.0])       # flat to peaked rows
def test_top_p_from_candidates_equals_the_full_sort(monkeypatch, scale):
    """Rows whose best CANDIDATES tokens reach top_p are cut among them, the others sorted
    whole: the same nucleus either way (CANDIDATES made small so that both kinds of row occur)."""
    import engines.sampler as sampler_module

    monkeypatch.setattr(sampler_module, "CANDIDATES", 8)
    probs = torch.softmax(_logits(16, seed=11) * scale / 3, dim=-1)
    top_p = torch.linspace(0.05, 0.99, 16)
    got = sampler_module._top_p(probs, top_p)
    assert torch.equal(got, sampler_module._top_p_sorted(probs, top_p))
    assert ((got > 0).sum(-1) >= 1).all()


@pytest.mark.parametrize("ks", [(0, 3, 5, 1), (0, 3, 20, 50)])   # all within CANDIDATES / past it
def test_top_k_by_partial_selection_keeps_exactly_the_k_best(monkeypatch, ks):
    import engines.sampler as sampler_module

    monkeypatch.setattr(sampler_module, "CANDIDATES", 8)
    logits = _logits(len(ks), seed=13)
    probs = Sampler.probs(logits, [SamplingParams(temperature=1.0, top_k=k) for k in ks])
    for row, k in enumerate(ks):
        kept = set((probs[row] > 0).nonzero().squeeze(1).tolist())
        assert kept == set(logits[row].topk(k or V).indices.tolist()), (row, k)


def test_inverse_cdf_draw_never_picks_a_zero_weight_and_follows_the_weights():
    weights = torch.zeros(4000, V)
    weights[:, 7], weights[:, 9], weights[:, V - 1] = 0.5, 0.25, 0.25     # entries between are 0
    draws = Sampler(seed=3).draw(weights, [None] * 4000)
    freq = torch.bincount(draws, minlength=V).float() / 4000
    assert set(draws.tolist()) <= {7, 9, V - 1}
    assert abs(freq[7] - 0.5) < 0.04 and abs(freq[9] - 0.25) < 0.04 and abs(freq[V - 1] - 0.25) < 0.04
