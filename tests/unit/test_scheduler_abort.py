"""Removing waiting sequences (aborts) from a long queue: cheap, honoured, and admission order
unchanged. Cost is counted in priority comparisons, never timed."""

from __future__ import annotations

import math
import random

from engines.block_manager import BlockManager
from engines.sampling_params import SamplingParams
from engines.scheduler import Scheduler
from engines.sequence import Sequence, SeqStatus


def _counted(op: str):
    def compare(self, other):
        CountedPriority.count += 1
        return getattr(int, op)(self, other)
    return compare


class CountedPriority(int):
    """An int priority that counts how often the heap compares it."""

    count = 0
    __lt__, __le__, __gt__, __ge__ = (_counted(op) for op in ("__lt__", "__le__", "__gt__", "__ge__"))
    __eq__, __ne__ = _counted("__eq__"), _counted("__ne__")
    __hash__ = int.__hash__


def _seqs(n: int, rng: random.Random, start: int = 0) -> list[Sequence]:
    # Few distinct priorities and arrivals, so ties (broken by order of adding) are common.
    return [Sequence(f"s{start + i}", [3 + (start + i) % 50], SamplingParams(max_tokens=4),
                     priority=CountedPriority(rng.randrange(4)), arrival=float(rng.randrange(20)))
            for i in range(n)]


def _scheduler(max_num_seqs: int) -> Scheduler:
    return Scheduler(BlockManager(20_000, 4, enable_prefix_caching=False), max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=20_000, headroom_blocks=0)


def test_removing_a_waiting_sequence_costs_at_most_log_n_comparisons():
    rng = random.Random(1)
    n = 5_000
    sched = _scheduler(max_num_seqs=1)
    seqs = _seqs(n, rng)
    for seq in seqs:
        sched.add(seq)
    removed = rng.sample(seqs, 500)
    CountedPriority.count = 0
    for seq in removed:
        sched.remove(seq)
    # Rebuilding the heap on each removal costs ~n comparisons each (millions here).
    assert CountedPriority.count <= len(removed) * 2 * math.log2(n)
    assert sched.num_waiting == n - len(removed)
    assert all(seq.status is SeqStatus.FINISHED for seq in removed)


def test_aborts_among_many_waiting_are_honoured_and_admission_order_is_kept():
    rng = random.Random(2)
    sched = _scheduler(max_num_seqs=64)
    order: dict[str, int] = {}                  # request id -> order of adding, the tie-break
    live: dict[str, Sequence] = {}              # waiting and not aborted

    def add(batch):
        for seq in batch:
            order[seq.request_id] = len(order)
            sched.add(seq)
            live[seq.request_id] = seq

    add(_seqs(4_000, rng))
    admitted, aborted, step = set(), set(), 0
    while live:
        # Abort a random share of what waits (the head included, sometimes), and keep adding.
        for rid in rng.sample(sorted(live), min(len(live), rng.randrange(0, 300))):
            sched.remove(live.pop(rid))
            aborted.add(rid)
        if step < 10:
            add(_seqs(200, rng, start=len(order)))
        expected = sorted(live, key=lambda r: (int(live[r].priority), live[r].arrival, order[r]))[:64]
        assert sched.num_waiting == len(live)
        out = sched.schedule()
        assert [s.seq.request_id for s in out.scheduled] == expected
        for s in out.scheduled:              # finished: out of the engine, blocks freed
            sched.remove(live.pop(s.seq.request_id))
            admitted.add(s.seq.request_id)
        step += 1
    assert sched.num_waiting == 0 and not sched.has_work()
    assert sched.bm.num_free_blocks == sched.bm.num_blocks
    assert aborted and not aborted & admitted and len(admitted | aborted) == len(order)
