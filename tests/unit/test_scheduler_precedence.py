"""Which sequence gives way: a waiting sequence that comes first (by priority, then arrival, a
choice's rank counting as later arrival) takes a full tier's seat or blocks from the running
sequence that comes last, so one request's many choices or a lower-priority tenant cannot hold
the tier until they finish; nobody is preempted for nothing, and draft slots do not take the
head's blocks (real block manager, no model)."""

from __future__ import annotations

from engines.block_manager import BlockManager
from engines.scheduler import Scheduler
from engines.sequence import RANK_SPACING_S, SeqStatus
from tests.scheduler_steps import make_seq, run_step

BS = 4


def _ids(seqs):
    return sorted(s.request_id for s in seqs)


def test_a_first_choice_takes_the_seat_of_another_requests_last_choice():
    sched = Scheduler(BlockManager(64, BS), max_num_seqs=4, max_num_batched_tokens=100)
    for rank in range(4):                          # one request, four choices: every seat
        sched.add(make_seq(f"big-{rank}", 3, rank=rank, arrival=0))
    run_step(sched)
    run_step(sched)
    sched.add(make_seq("other", 3, arrival=1))
    out = run_step(sched)
    assert _ids(out.preempted) == ["big-3"]
    assert "other" in _ids(s.seq for s in out.scheduled)       # admitted in the same step
    assert _ids(sched.running) == ["big-0", "big-1", "big-2", "other"]
    for _ in range(3):                             # and it stays that way: no back and forth
        out = run_step(sched)
        assert not out.preempted
        assert _ids(sched.running) == ["big-0", "big-1", "big-2", "other"]
    assert [s.request_id for s in sched.waiting] == ["big-3"]
    sched.bm.check_invariants(sched.running)


def test_equal_first_choices_wait_their_turn():
    sched = Scheduler(BlockManager(64, BS), max_num_seqs=2, max_num_batched_tokens=100)
    sched.add(make_seq("a", 3, arrival=0))
    sched.add(make_seq("b", 3, arrival=1))
    run_step(sched)
    sched.add(make_seq("c", 3, arrival=2))             # later, same priority and rank: no preemption
    out = run_step(sched)
    assert not out.preempted
    assert _ids(sched.running) == ["a", "b"]
    assert sched.waiting[0].status is SeqStatus.WAITING


def test_a_higher_priority_takes_the_seat_of_the_lowest():
    sched = Scheduler(BlockManager(64, BS), max_num_seqs=2, max_num_batched_tokens=100)
    sched.add(make_seq("low-old", 3, priority=1, arrival=0))
    sched.add(make_seq("low-new", 3, priority=1, arrival=1))
    run_step(sched)
    sched.add(make_seq("urgent", 3, priority=0, arrival=2))
    out = run_step(sched)
    assert _ids(out.preempted) == ["low-new"]
    assert _ids(sched.running) == ["low-old", "urgent"]


def test_full_blocks_are_freed_from_the_last_in_order_until_the_newcomer_fits():
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=100, headroom_blocks=0)
    for rank in range(4):                          # 7 tokens and the first output: 2 blocks each
        sched.add(make_seq(f"big-{rank}", 7, rank=rank, arrival=0))
    run_step(sched)
    assert bm.num_free_blocks == 0
    sched.add(make_seq("other", 7, arrival=1))         # needs 2 blocks; the others need no more this step
    out = run_step(sched)
    assert _ids(out.preempted) == ["big-3"]
    assert "other" in _ids(s.seq for s in out.scheduled)
    bm.check_invariants(sched.running)


def test_a_sequence_out_of_blocks_preempts_the_highest_rank_not_the_newest():
    bm = BlockManager(6, BS, enable_prefix_caching=False)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=100, headroom_blocks=0)
    sched.add(make_seq("big-0", 4, rank=0, arrival=0))
    sched.add(make_seq("big-5", 4, rank=5, arrival=0))
    run_step(sched)
    sched.add(make_seq("other", 4, arrival=1))
    run_step(sched)                               # all three prefilled: 3 blocks, one token out each
    for _ in range(4):
        out = run_step(sched)                     # each needs a second block: one of them must go
        if out.preempted:
            break
    assert _ids(out.preempted) == ["big-5"]
    assert _ids(sched.running) == ["big-0", "other"]
    bm.check_invariants(sched.running)


def test_a_later_choice_counts_as_arriving_later_but_not_for_ever():
    """Choice k of a request counts as arriving k x RANK_SPACING_S after it: a request that came
    sooner than that takes its seat, one that came later waits its turn."""
    sched = Scheduler(BlockManager(64, BS), max_num_seqs=2, max_num_batched_tokens=100)
    sched.add(make_seq("big-0", 3, rank=0, arrival=0))
    sched.add(make_seq("big-1", 3, rank=1, arrival=0))
    run_step(sched)
    sched.add(make_seq("late", 3, arrival=RANK_SPACING_S + 0.1))
    out = run_step(sched)
    assert not out.preempted and _ids(sched.running) == ["big-0", "big-1"]
    sched.add(make_seq("soon", 3, arrival=RANK_SPACING_S - 0.1))
    out = run_step(sched)
    assert _ids(out.preempted) == ["big-1"] and _ids(sched.running) == ["big-0", "soon"]


def test_out_of_blocks_the_last_in_order_goes_even_if_admitted_after_the_one_growing():
    """The running list is kept in order: a higher priority admitted after a lower one is still
    served first, and the lower one is what a shortage of blocks preempts."""
    bm = BlockManager(5, BS, enable_prefix_caching=False)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=100, headroom_blocks=0)
    low, high = make_seq("low", 4, priority=1, arrival=0), make_seq("high", 4, priority=0, arrival=1)
    sched.add(low)
    run_step(sched)
    sched.add(high)
    run_step(sched)
    assert [s.request_id for s in sched.running] == ["high", "low"]
    for _ in range(12):
        out = run_step(sched)
        assert "high" not in _ids(out.preempted)
        if out.preempted:
            break
    assert _ids(out.preempted) == ["low"] and high.num_preemptions == 0
    bm.check_invariants(sched.running)


def test_nobody_is_preempted_for_a_head_that_would_not_fit_anyway():
    bm = BlockManager(10, BS, enable_prefix_caching=False)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=200, headroom_blocks=0)
    sched.add(make_seq("first", 15, priority=0, arrival=0))     # 4 blocks, comes before the head
    sched.add(make_seq("low", 7, priority=5, arrival=0))        # 2 blocks, after it
    run_step(sched)
    sched.add(make_seq("head", 40, priority=1, arrival=1))      # 10 blocks: more than low could free
    out = run_step(sched)
    assert not out.preempted and _ids(sched.running) == ["first", "low"]


def test_draft_slots_leave_the_blocks_the_head_needs_for_a_free_seat():
    bm = BlockManager(12, BS, enable_prefix_caching=False)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=200, headroom_blocks=0,
                      lookahead=lambda seq, running: 4)
    for rank in range(4):
        sched.add(make_seq(f"big-{rank}", 5, rank=rank, arrival=0))
    run_step(sched)                               # 2 blocks each: 4 free
    sched.add(make_seq("other", 13, arrival=10))       # needs those 4
    out = run_step(sched)
    assert "other" in _ids(s.seq for s in out.scheduled)
    assert all(s.num_lookahead == 0 for s in out.scheduled)
    assert not out.preempted
