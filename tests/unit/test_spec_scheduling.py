"""Lookahead slots in the scheduler and their rollback in the block manager (no model)."""

from __future__ import annotations

from engines.block_manager import BlockManager
from engines.sampling_params import SamplingParams
from engines.scheduler import Scheduler
from engines.sequence import Sequence

BS = 4


def _seq(rid, n_prompt, base=None):
    base = 100 * sum(map(ord, rid)) if base is None else base
    return Sequence(rid, list(range(base, base + n_prompt)), SamplingParams(max_tokens=50))


def _decode_ready(sched: Scheduler, *seqs):
    """Admit and prefill the sequences, sampling their first token."""
    for seq in seqs:
        sched.add(seq)
    out = sched.schedule()
    for s in out.scheduled:
        s.seq.num_computed_tokens += s.num_tokens
        s.seq.output_ids.append(7)
        sched.bm.register_computed(s.seq)


def test_decoding_sequences_get_lookahead_slots_counted_in_the_budget():
    bm = BlockManager(64, BS)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=12, lookahead=lambda seq, n: 3)
    a = _seq("a", 6)
    _decode_ready(sched, a)
    sched.add(_seq("b", 20))
    out = sched.schedule()
    first, second = out.scheduled
    assert (first.seq, first.num_tokens, first.num_lookahead) == (a, 1, 3)
    assert len(a.block_table) * BS >= a.num_computed_tokens + 1 + 3        # slots for the drafts exist
    assert (second.seq.request_id, second.num_tokens, second.num_lookahead) == ("b", 8, 0)   # 12 - (1 + 3)
    assert out.num_tokens == 12


def test_prefilling_sequences_never_speculate_and_the_budget_caps_k():
    asked = []
    sched = Scheduler(BlockManager(64, BS), max_num_seqs=8, max_num_batched_tokens=3,
                      lookahead=lambda seq, n: asked.append(seq.request_id) or 5)
    a = _seq("a", 2)
    _decode_ready(sched, a)
    assert asked == []                              # the prefill step asked nobody
    (s,) = sched.schedule().scheduled
    assert asked == ["a"] and s.num_lookahead == 2  # 1 + 2 fills the 3-token budget


def test_lookahead_is_dropped_rather_than_preempting_anyone():
    bm = BlockManager(4, BS, enable_prefix_caching=False)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=100, headroom_blocks=0,
                      lookahead=lambda seq, n: 8)
    a, b = _seq("a", 7), _seq("b", 7)
    _decode_ready(sched, a, b)                      # 2 blocks each: the pool is full
    assert bm.num_free_blocks == 0
    out = sched.schedule()
    assert not out.preempted
    assert [(s.num_tokens, s.num_lookahead) for s in out.scheduled] == [(1, 0), (1, 0)]


def test_truncate_returns_draft_blocks_first_in_line_for_reuse():
    bm = BlockManager(6, BS)
    keeper = _seq("keep", 9)
    assert bm.try_admit(keeper)
    keeper.num_computed_tokens = 9
    bm.register_computed(keeper)                    # 2 full blocks cached
    bm.free(keeper)                                 # ... and waiting in the free list
    seq = _seq("s", 5, base=5000)
    assert bm.try_admit(seq)
    assert bm.try_grow(seq, 5 + 8)                  # 2 blocks more for drafts: 4 in all, 2 left free
    lookahead_blocks = seq.block_table[2:]
    bm.truncate(seq, 7)                             # 7 tokens kept: 2 blocks
    assert len(seq.block_table) == 2
    bm.check_invariants([seq])
    # The freed draft blocks are reused before the blocks holding the cached prefix...
    other = _seq("o", 8, base=9000)
    assert bm.try_admit(other)
    assert sorted(other.block_table) == sorted(lookahead_blocks)
    # ... which still serve a request with the same prompt.
    bm.free(other)
    again = _seq("keep", 9)
    assert bm.try_admit(again) and again.num_computed_tokens == 8


def test_preemption_resets_the_draft_models_progress():
    bm = BlockManager(3, BS, enable_prefix_caching=False)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=100, headroom_blocks=0)
    old, new = _seq("old", 3), _seq("new", 3)
    _decode_ready(sched, old, new)                  # one block each, one free
    for s in sched.schedule().scheduled:            # both decode position 3: 5 tokens each now
        s.seq.num_computed_tokens += 1
        s.seq.output_ids.append(7)
    new.num_draft_computed = 4
    out = sched.schedule()                          # both need a 2nd block: the newer one yields
    assert out.preempted == [new] and new.num_draft_computed == 0 and new.block_table == []


def test_draft_slots_never_starve_later_running_sequences():
    sched = Scheduler(BlockManager(64, BS), max_num_seqs=8, max_num_batched_tokens=100, lookahead=lambda seq, n: 8)
    seqs = [_seq(r, 3) for r in ("a", "b", "c")]
    _decode_ready(sched, *seqs)
    sched.max_num_batched_tokens = 4
    out = sched.schedule()
    assert [(s.seq.request_id, s.num_tokens, s.num_lookahead) for s in out.scheduled] == \
        [("a", 1, 1), ("b", 1, 0), ("c", 1, 0)]
