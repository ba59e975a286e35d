"""Scheduling rules on the real block manager (no model needed)."""

from __future__ import annotations

from engines.block_manager import BlockManager
from engines.scheduler import Scheduler
from engines.sequence import SeqStatus
from tests.scheduler_steps import make_seq, run_step

BS = 4


def test_token_budget_chunks_long_prompts():
    sched = Scheduler(BlockManager(64, BS, enable_prefix_caching=False), max_num_seqs=8, max_num_batched_tokens=10)
    sched.add(make_seq("long", 25, arrival=0))
    sched.add(make_seq("short", 3, arrival=1))
    first = run_step(sched)
    assert [(s.seq.request_id, s.num_tokens) for s in first.scheduled] == [("long", 10)]
    second = run_step(sched)
    assert [(s.seq.request_id, s.num_tokens) for s in second.scheduled] == [("long", 10)]
    third = run_step(sched)                       # 5 left of the prompt, then the short one joins
    assert [(s.seq.request_id, s.num_tokens) for s in third.scheduled] == [("long", 5), ("short", 3)]
    assert third.num_tokens <= 10
    fourth = run_step(sched)                      # both decode now: one token each
    assert [s.num_tokens for s in fourth.scheduled] == [1, 1]


def test_priority_then_arrival_order_for_admission():
    sched = Scheduler(BlockManager(64, BS), max_num_seqs=1, max_num_batched_tokens=100)
    sched.add(make_seq("late-urgent", 3, priority=-1, arrival=5))
    sched.add(make_seq("early", 3, priority=0, arrival=1))
    sched.add(make_seq("earliest", 3, priority=0, arrival=0))
    assert [s.seq.request_id for s in run_step(sched).scheduled] == ["late-urgent"]
    assert [s.request_id for s in sched.waiting] == ["earliest", "early"]


def test_admission_keeps_headroom_and_is_first_come_first_served():
    bm = BlockManager(6, BS, enable_prefix_caching=False)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=100, headroom_blocks=2)
    sched.add(make_seq("a", 12, arrival=0))            # 3 blocks: 3 free afterwards >= 2
    sched.add(make_seq("b", 8, arrival=1))             # 2 blocks: would leave 1 < 2 -> waits
    sched.add(make_seq("c", 1, arrival=2))             # would fit, but may not overtake b
    out = run_step(sched)
    assert [s.seq.request_id for s in out.scheduled] == ["a"]
    assert sched.num_waiting == 2


def test_preemption_takes_the_newest_and_blocks_admission_that_step():
    bm = BlockManager(4, BS, enable_prefix_caching=False)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=100, headroom_blocks=0)
    old, new = make_seq("old", 4, arrival=0), make_seq("new", 4, arrival=1)
    sched.add(old)
    sched.add(new)
    run_step(sched)                               # both prefilled: 2 blocks used
    run_step(sched)                               # both need a second block: 4 used
    for _ in range(3):
        run_step(sched)                           # fill the second blocks
    sched.add(make_seq("waiting", 1, arrival=2))
    out = run_step(sched)                         # old needs a 3rd block: none free
    assert [s.request_id for s in out.preempted] == ["new"]
    assert new.status is SeqStatus.WAITING and new.num_computed_tokens == 0 and not new.block_table
    assert [s.seq.request_id for s in out.scheduled] == ["old"]   # no admission in this step
    assert sched.num_preemptions == 1
    bm.check_invariants(sched.running)


def test_remove_frees_blocks_at_once():
    bm = BlockManager(8, BS)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=100)
    seq = make_seq("x", 9)
    sched.add(seq)
    run_step(sched)
    assert bm.num_free_blocks < 8
    sched.remove(seq)
    assert bm.num_free_blocks == 8 and seq.status is SeqStatus.FINISHED and not sched.has_work()
