"""The exact verification rule on given distributions: every emitted position follows the
target p, whatever the draft q; greedy is exact match; penalties see the earlier drafts.
Negative controls show the statistical check fails for rules that are slightly off."""

from __future__ import annotations

import pytest
import torch

import engines.spec.verify as verify_mod
from engines.sampler import Sampler
from engines.sampling_params import SamplingParams
from engines.sequence import Sequence
from engines.spec.verify import SpecGroup, verify
from tests.stats_checks import chi2_pvalue

V, K, TRIALS = 8, 3, 10000



def _distributions(seed: int, scale: float = 1.5):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(K + 1, V, generator=g) * scale, dim=-1)
    q = torch.softmax(torch.randn(K, V, generator=g) * scale, dim=-1)
    return p, q


def _run(p: torch.Tensor, q: torch.Tensor | None, fixed_drafts: list[int] | None = None, trials: int = TRIALS):
    """Verify `trials` independent proposals; returns the emitted token lists."""
    g = torch.Generator().manual_seed(1)
    params = SamplingParams(temperature=1.0, max_tokens=8)
    groups = []
    for t in range(trials):
        drafts = fixed_drafts or [int(torch.multinomial(q[j], 1, generator=g)) for j in range(K)]
        groups.append(SpecGroup(Sequence(f"r{t}", [0], params), t * (K + 1), drafts, q))
    logits = p.log().repeat(trials, 1)
    return [v.tokens for v in verify(logits, groups, Sampler(seed=2))]


def _position_pvalues(emitted: list[list[int]], p: torch.Tensor) -> list[float]:
    out = []
    for j in range(K + 1):
        tokens = torch.tensor([e[j] for e in emitted if len(e) > j])
        assert len(tokens) > 200, "too few samples at this position for the test to mean anything"
        out.append(chi2_pvalue(torch.bincount(tokens, minlength=V), p[j]))
    return out


def test_every_position_follows_the_target_for_a_sampled_draft():
    p, q = _distributions(0)
    assert (p - q[0].unsqueeze(0)).abs().sum(-1).min() > 0.5   # q is far from p: rejections are common
    emitted = _run(p, q)
    accepted = [len(e) - 1 for e in emitted]
    assert 0 < sum(a == 0 for a in accepted) and 0 < sum(a == K for a in accepted)   # residual and bonus paths
    assert min(_position_pvalues(emitted, p)) > 1e-3


def test_point_mass_proposal_follows_the_target():
    """n-gram drafts are a point mass: accepted with probability p(x), else drawn from p without x."""
    p, _ = _distributions(3, scale=2.5)
    drafts = [int(p[j].argmax()) for j in range(K)]   # the likeliest: all three paths get samples
    emitted = _run(p, None, fixed_drafts=drafts)
    assert min(_position_pvalues(emitted, p)) > 1e-3


@pytest.mark.parametrize("broken", ["residual_is_p", "always_accept", "no_clamp"])
def test_the_check_rejects_rules_that_are_off(monkeypatch, broken):
    """Negative controls: the same statistics catch a rule that is only slightly wrong."""
    if broken == "residual_is_p":
        monkeypatch.setattr(verify_mod, "residual", lambda p, q: p)
    elif broken == "always_accept":
        monkeypatch.setattr(verify_mod, "accept_probability", lambda p_x, q_x: torch.ones_like(p_x))
    else:   # accept with p/q but resample from |p - q|
        monkeypatch.setattr(verify_mod, "residual", lambda p, q: (p - q).abs())
    p, q = _distributions(0)
    assert min(_position_pvalues(_run(p, q), p)) < 1e-8


def _greedy_group(drafts, rows, history=(), **params):
    seq = Sequence("g", [0], SamplingParams(temperature=0.0, max_tokens=8, **params))
    seq.output_ids = list(history)
    return SpecGroup(seq, 0, drafts, None), torch.tensor(rows, dtype=torch.float32)


def test_greedy_accepts_the_matching_prefix_then_takes_the_argmax():
    rows = [[0, 5, 1, 0], [0, 0, 5, 1], [5, 0, 1, 0], [0, 1, 0, 5]]    # argmax 1, 2, 0, 3
    group, logits = _greedy_group([1, 2, 3], rows)
    (v,) = verify(logits, [group], Sampler())
    assert v.num_accepted == 2 and v.tokens == [1, 2, 0]
    group, logits = _greedy_group([1, 2, 0], rows)
    (v,) = verify(logits, [group], Sampler())
    assert v.num_accepted == 3 and v.tokens == [1, 2, 0, 3]      # all accepted: the bonus token


def test_penalties_count_the_earlier_drafts():
    """Row j is penalised by the output so far plus drafts[:j], as plain decoding would be."""
    rows = [[0, 3, 2.5, 0], [0, 3, 2.5, 0]]                      # token 1 leads by 0.5
    group, logits = _greedy_group([1], rows, presence_penalty=1.0)
    (v,) = verify(logits, [group], Sampler())
    assert v.tokens == [1, 2]          # row 1 saw draft 1 once: 3 - 1 < 2.5


def test_logprobs_come_from_the_raw_rows_of_emitted_tokens():
    rows = [[0, 5, 1, 0], [0, 0, 5, 1], [5, 0, 1, 0]]
    group, logits = _greedy_group([1, 3], rows, logprobs=True, top_logprobs=1)
    (v,) = verify(logits, [group], Sampler())
    assert v.tokens == [1, 2]
    expected = torch.log_softmax(logits, -1)
    assert [lp.token_id for lp in v.logprobs] == [1, 2]
    assert v.logprobs[0].logprob == pytest.approx(float(expected[0, 1]))
    assert v.logprobs[1].logprob == pytest.approx(float(expected[1, 2]))
    assert v.logprobs[1].top[0][0] == 2


def _seeded_group(seed: int, drafts: list[int], q: torch.Tensor | None, emitted: int = 0) -> SpecGroup:
    seq = Sequence(f"s{seed}", [0], SamplingParams(temperature=1.0, max_tokens=64, seed=seed))
    seq.output_ids = [0] * emitted
    return SpecGroup(seq, 0, drafts, q)


def _plain_seeded(p: torch.Tensor, seed: int, emitted: int = 0) -> list[int]:
    """What plain decoding draws at each position of p for this seed (one token per step)."""
    seq = Sequence("plain", [0], SamplingParams(temperature=1.0, max_tokens=64, seed=seed))
    seq.output_ids = [0] * emitted
    tokens = []
    for j in range(len(p)):
        tokens.append(int(Sampler(seed=99).draw(p[j:j + 1], [seq.uniform_at()])[0]))
        seq.output_ids.append(tokens[-1])
    return tokens


@pytest.mark.parametrize("emitted", [0, 70])
def test_a_seeded_request_emits_plain_decodings_tokens_whatever_the_drafts(emitted):
    """With a seed, each emitted token is the one plain decoding draws at that position, for any
    number of drafts, drafts right or wrong, point mass or drawn from q: a seed names one text
    whether or not a step speculated (and how far)."""
    p, q = _distributions(0)
    for seed in range(200):
        plain = _plain_seeded(p, seed, emitted)
        for k in range(K + 1):
            for drafts, proposal in ((plain[:k], None), ([(t + 1) % V for t in plain[:k]], None),
                                     (plain[:k], q[:k])):
                (v,) = verify(p[:k + 1].log(), [_seeded_group(seed, drafts, proposal, emitted)], Sampler(seed=seed + 1))
                assert v.tokens == plain[:len(v.tokens)] and len(v.tokens) == v.num_accepted + 1
                assert v.num_accepted == (k if drafts == plain[:k] else 0)


def test_seeded_verification_follows_the_target_across_seeds():
    """Over many seeds, every position a seeded request emits follows p, for point-mass drafts
    and for drafts drawn from q with the position's own uniform (as the draft model does)."""
    p, _ = _distributions(3, scale=2.5)
    noise = torch.randn(K, V, generator=torch.Generator().manual_seed(4))
    q = torch.softmax(p[:K].log() + noise, dim=-1)          # a draft model near the target
    for proposal in (None, q):
        emitted = []
        for seed in range(6000):
            group = _seeded_group(seed, [], proposal)
            group.drafts = [int(p[j].argmax()) for j in range(K)] if proposal is None else \
                [int(Sampler().draw(q[j:j + 1], [group.seq.uniform_at(j)])[0]) for j in range(K)]
            (v,) = verify(p.log(), [group], Sampler(seed=seed))
            emitted.append(v.tokens)
        assert min(_position_pvalues(emitted, p)) > 1e-3
