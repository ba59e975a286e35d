"""Adaptive k from measured acceptance, backing off on large batches, never past max_tokens."""

from __future__ import annotations

from engines.sampler import Sampler
from engines.sampling_params import SamplingParams
from engines.scheduler import ScheduledSeq
from engines.sequence import Sequence
from engines.spec.adaptive import AdaptiveK
from engines.spec.config import SpeculativeConfig
from engines.spec.speculator import Speculator
from engines.stats import EngineStats


def _seq(max_tokens=100, outputs=1):
    seq = Sequence("s", [1, 2, 3], SamplingParams(max_tokens=max_tokens))
    seq.output_ids = [5] * outputs
    return seq


def test_k_grows_with_acceptance_and_shrinks_without_it():
    ctl, seq = AdaptiveK(k_max=6, adaptive=True), _seq()
    for _ in range(20):
        ctl.observe(seq, 6, 6)
    assert ctl.alpha(seq) > 0.95 and ctl.choose(seq, cost=0.1) == 6
    for _ in range(20):
        ctl.observe(seq, 2, 0)
    assert ctl.alpha(seq) < 0.1 and ctl.choose(seq, cost=0.1) == 0
    mid = _seq()
    for _ in range(20):
        ctl.observe(mid, 4, 1)                     # one accepted, then a rejection: alpha ~ 1/2
    assert 0.4 < ctl.alpha(mid) < 0.6
    assert ctl.choose(mid, cost=0.1) == 3          # 0.5**3 >= 0.1 > 0.5**4
    assert ctl.choose(mid, cost=0.3) == 1


def test_a_sequence_that_stopped_speculating_tries_again_later():
    ctl, seq = AdaptiveK(k_max=4, adaptive=True), _seq()
    for _ in range(20):
        ctl.observe(seq, 4, 0)
    steps = 0
    while ctl.choose(seq, cost=0.1) == 0:
        steps += 1
        assert steps < 100
    assert steps > 3                              # not at once: the estimate drifts back to the prior


def test_fixed_k_when_not_adaptive():
    ctl, seq = AdaptiveK(k_max=5, adaptive=False), _seq()
    for _ in range(20):
        ctl.observe(seq, 5, 0)
    assert ctl.choose(seq, cost=0.9) == 5


class _NoSource:
    """Proposes nothing; reports that one draft step took `step_s`."""
    name = "ngram"

    def __init__(self, step_s=0.0):
        self.step_s = step_s

    def propose(self, entries):
        return self.step_s


def _speculator(source=None, **cfg):
    return Speculator(SpeculativeConfig(method="ngram", **cfg), source or _NoSource(), Sampler(), EngineStats(), 1000)


def test_backs_off_above_max_batch_and_counts_it():
    spec = _speculator(num_tokens=4, max_batch=8, adaptive=False)
    assert spec.lookahead(_seq(), num_running=8) == 4
    assert spec.lookahead(_seq(), num_running=9) == 0
    spec.count_backoff(9)
    spec.count_backoff(3)
    assert spec.stats.backoff_steps == 1


def test_lookahead_stays_within_max_tokens_and_context():
    spec = _speculator(num_tokens=4, adaptive=False)
    assert spec.lookahead(_seq(max_tokens=10, outputs=7), 1) == 2     # up to 3 tokens emitted: 10 in all
    assert spec.lookahead(_seq(max_tokens=10, outputs=9), 1) == 0
    short = Speculator(SpeculativeConfig(method="ngram", num_tokens=4, adaptive=False), _NoSource(), Sampler(),
                       EngineStats(), max_model_len=6)
    assert short.lookahead(_seq(outputs=1), 1) == 1                   # 4 tokens now, at most 6


def test_draft_cost_is_measured_against_the_target_step():
    spec = _speculator(_NoSource(step_s=0.010), verify_cost=0.05)
    assert spec.step_cost() == 0.05                      # nothing measured yet
    spec.observe_target_step(0.020)
    spec.propose([ScheduledSeq(_seq(), 4, 1, num_lookahead=2)])
    assert abs(spec.step_cost() - (0.05 + 0.5)) < 1e-9   # a draft step costs half a target step


def test_seeded_sampled_requests_back_off_and_follow_timings_like_the_rest():
    """A seed changes no draw when k changes (engines/position_draws.py), so it buys no
    exemption: a seeded request backs off and weighs timings like any other."""
    spec = _speculator(_NoSource(step_s=1.0), num_tokens=4, max_batch=2)
    spec.observe_target_step(0.01)
    spec.propose([ScheduledSeq(_seq(), 4, 1, num_lookahead=1)])     # drafting "costs" 100 target steps
    seeded = Sequence("s", [1, 2, 3], SamplingParams(max_tokens=100, temperature=0.8, seed=7))
    seeded.output_ids = [5]
    for seq in (_seq(), seeded):
        assert spec.lookahead(seq, num_running=1) == 0                 # not worth it by the timings
        assert spec.lookahead(seq, num_running=3) == 0                 # and backed off
