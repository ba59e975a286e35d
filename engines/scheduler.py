"""Iteration-level scheduling: which sequences compute how many tokens in the next step.

One token budget covers prefill chunks and decode tokens alike. Sequences are ordered by
priority, then arrival, where a choice's rank among its request's choices (prompts x n) counts
as later arrival (Sequence.sort_key): one request asking for many choices does not come before
every request that arrives while it runs. The running list is kept in that order and served in
it; when a running sequence needs a block and none is free, the last running sequence in that
order is preempted and will be recomputed. Waiting sequences are admitted in that order, only if
their blocks fit with headroom to spare, and not in a step where running sequences ran out of
blocks.

A waiting sequence that comes before a running one takes its place when the seats
(max_num_seqs) or blocks are full: the running sequence last in the order is preempted first,
as vLLM's priority scheduling does. Without it a request with many choices, or a lower-priority
tenant's long answers, would hold the tier until they finish.

The waiting queue is a heap with lazy deletion: removing a waiting sequence (an abort) only
forgets its entry, O(1); the heap drops forgotten entries when they reach its top, and is
rebuilt once they outnumber the live ones, so it stays within about twice the queue.

Speculative decoding: a decoding sequence may be given `num_lookahead` extra slots for
draft tokens (the `lookahead` callback decides how many). They count against the token
budget and are allocated with the sequence's blocks; when they do not fit, or would take the
blocks the head of the queue needs to be admitted to a free seat, the sequence decodes without
them rather than preempting or holding off anyone.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engines.block_manager import BlockManager
from engines.sequence import SeqStatus, Sequence


@dataclass
class ScheduledSeq:
    seq: Sequence
    start: int          # first position computed this step
    num_tokens: int     # of the sequence's own tokens
    num_lookahead: int = 0          # slots reserved for draft tokens after them
    # Filled by the speculator before the forward: draft tokens computed after the
    # sequence's tokens, and the draft distribution each was drawn from (None: point mass
    # or greedy).
    draft_ids: list[int] = field(default_factory=list)
    draft_probs: torch.Tensor | None = None
    num_accepted: int = 0           # filled by verification: drafts the target kept

    @property
    def samples(self) -> bool:
        return self.start + self.num_tokens == self.seq.num_tokens

    @property
    def num_rows(self) -> int:
        """Logits rows this entry needs: its last token's, plus one per draft token."""
        return 1 + len(self.draft_ids) if self.samples else 0


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        """Budgeted tokens: the sequences' own plus their reserved draft slots."""
        return sum(s.num_tokens + s.num_lookahead for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 headroom_blocks: int = 1, lookahead: Callable[[Sequence, int], int] | None = None):
        """lookahead(seq, number of running sequences) -> draft slots wanted by a decoding seq."""
        self.bm = block_manager
        self.lookahead = lookahead
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.headroom_blocks = headroom_blocks
        self.running: list[Sequence] = []
        # Heap of [*sort key, counter, seq]; an entry whose seq is None was removed.
        self._waiting: list[list] = []
        self._entries: dict[int, list] = {}     # id(seq) -> its live heap entry
        self._counter = itertools.count()
        self.num_preemptions = 0

    # ---- queue -------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self._entries)

    @property
    def waiting(self) -> list[Sequence]:
        """In admission order (sorts the queue: for inspection, not the step)."""
        return [entry[-1] for entry in sorted(self._entries.values())]

    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        # The counter is unique, so entries never compare their sequences.
        entry = [*seq.sort_key(), next(self._counter), seq]
        self._entries[id(seq)] = entry      # the entry holds seq: its id is not reused meanwhile
        heapq.heappush(self._waiting, entry)

    def has_work(self) -> bool:
        return bool(self.running or self._entries)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out (finished or aborted) and free its blocks at once."""
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SeqStatus.WAITING:
            self._forget_waiting(seq)
        self.bm.free(seq)
        seq.num_draft_computed = 0
        seq.status = SeqStatus.FINISHED

    # ---- the step plan -------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self._yield_to_waiting(out)
        yielded = len(out.preempted)
        budget = self.max_num_batched_tokens
        # The running list is in sort-key order, so a sequence's possible victims (those after it)
        # are exactly the ones still in `queue`: nobody is preempted for one that comes after it.
        queue = deque(self.running)
        num_running = len(self.running)
        reserve = self._reserve_for_head() if self.lookahead is not None else 0
        kept: list[Sequence] = []
        while queue:
            seq = queue.popleft()
            n = min(seq.num_uncomputed, budget)
            if n == 0:
                kept.append(seq)
                continue
            # Draft slots never take the one token each later running sequence needs.
            k = self._lookahead(seq, num_running, budget - n - len(queue))
            if k and not self._grow_with_drafts(seq, n, k, reserve):
                k = 0                     # speculation never costs anyone a preemption or a seat
            while not self.bm.try_grow(seq, seq.num_computed_tokens + n):
                victim = max([*queue, seq], key=Sequence.sort_key)
                if victim is not seq:
                    queue.remove(victim)
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            else:
                out.scheduled.append(ScheduledSeq(seq, seq.num_computed_tokens, n, k))
                budget -= n + k
                kept.append(seq)
        self.running = kept
        if len(out.preempted) == yielded:       # no running sequence ran out of blocks
            budget = self._admit(out, budget)
        return out

    def _reserve_for_head(self) -> int:
        """Free blocks the head of the queue needs to take a free seat this step (0 if no seat)."""
        head = self._head()
        if head is None or len(self.running) >= self.max_num_seqs:
            return 0
        return self.bm.blocks_to_admit(head) + self.headroom_blocks

    def _grow_with_drafts(self, seq: Sequence, n: int, k: int, reserve: int) -> bool:
        """Blocks for n tokens and k draft slots, unless the draft slots' blocks would leave fewer
        than `reserve` free (the waiting head's)."""
        plain = max(len(seq.block_table), self.bm.blocks_needed(seq.num_computed_tokens + n))
        extra = self.bm.blocks_needed(seq.num_computed_tokens + n + k) - plain
        if extra > 0 and self.bm.num_free_blocks - extra < reserve:
            return False
        return self.bm.try_grow(seq, seq.num_computed_tokens + n + k)

    def _yield_to_waiting(self, out: SchedulerOutput) -> None:
        """Preempt the fewest running sequences, last in order first and only ones the head of
        the queue comes before, that give it a seat and its blocks; none if even all of those
        would not. Done before the step's plan, so a preempted sequence is never in it."""
        head = self._head()
        if head is None or not self.running:
            return
        seats_short = len(self.running) + 1 - self.max_num_seqs
        blocks_short = self.bm.blocks_to_admit(head) + self.headroom_blocks - self.bm.num_free_blocks
        victims: list[Sequence] = []
        for seq in reversed(self.running):          # the list is in sort-key order
            if seats_short <= 0 and blocks_short <= 0:
                break
            if seq.sort_key() <= head.sort_key():
                break
            victims.append(seq)
            seats_short -= 1
            blocks_short -= self.bm.blocks_freed_by(seq)
        if seats_short > 0 or blocks_short > 0:
            return
        for victim in victims:
            self.running.remove(victim)
            self._preempt(victim)
            out.preempted.append(victim)

    def _forget_waiting(self, seq: Sequence) -> None:
        entry = self._entries.pop(id(seq), None)
        if entry is None:
            return
        entry[-1] = None                    # a tombstone, dropped when it reaches the top
        if len(self._waiting) > 2 * len(self._entries) + 16:
            # Rebuilt once removed entries outnumber live ones: O(n) every n removals.
            self._waiting = list(self._entries.values())
            heapq.heapify(self._waiting)

    def _head(self) -> Sequence | None:
        """The next sequence to admit, dropping removed entries on the way."""
        heap = self._waiting
        while heap and heap[0][-1] is None:
            heapq.heappop(heap)
        return heap[0][-1] if heap else None

    def _admit(self, out: SchedulerOutput, budget: int) -> int:
        while budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self._head()
            if seq is None:
                break
            if not self.bm.try_admit(seq, self.headroom_blocks):
                break  # first come, first served: no overtaking of the head of the queue
            heapq.heappop(self._waiting)
            del self._entries[id(seq)]
            seq.status = SeqStatus.RUNNING
            if seq.scheduled_time is None:
                seq.scheduled_time = time.monotonic()
            bisect.insort(self.running, seq, key=Sequence.sort_key)
            n = min(seq.num_uncomputed, budget)
            out.scheduled.append(ScheduledSeq(seq, seq.num_computed_tokens, n))
            budget -= n
        return budget

    def _lookahead(self, seq: Sequence, num_running: int, budget_left: int) -> int:
        # A constrained sequence never speculates: drafts are not masked by its grammar.
        if self.lookahead is None or not seq.is_decoding or seq.grammar is not None:
            return 0
        return max(0, min(self.lookahead(seq, num_running), budget_left))

    def _preempt(self, seq: Sequence) -> None:
        self.bm.free(seq)
        seq.num_computed_tokens = 0
        seq.num_draft_computed = 0
        seq.num_preemptions += 1
        seq.preempted_time = time.monotonic()
        self.num_preemptions += 1
        self.add(seq)
