"""A draft model proposes by decoding k tokens itself, with its own paged KV pool.

The draft pool has as many blocks of the same size as the target's, so the draft reads
and writes through the target's block tables: no second block manager, and freeing a
sequence's blocks (finish, abort, preemption) frees its draft KV too.

A separate draft model never trusts KV it did not write for this sequence:
`seq.num_draft_computed` says how far its KV is valid, it restarts at 0 on admission, and
before drafting the draft model computes whatever it is missing (the prompt, tokens decoded
while speculation was off, the last accepted token), at most `max_catchup_tokens` per step.
The self-draft (`mirrored`) needs none of that: the target's forwards write their K/V into
its pool too (engines/spec/kv_mirror.py), so it is always current up to the target's
computed tokens.
"""

from __future__ import annotations

import time

import torch

from engines.kv_cache import KVPool
from engines.model import LlamaForCausalLM
from engines.model_runner import Chunk, ModelRunner
from engines.sampler import Sampler
from engines.scheduler import ScheduledSeq
from engines.spec.kv_mirror import MirroredAttention


class ModelDraftSource:
    def __init__(self, name: str, model: LlamaForCausalLM, pool: KVPool, sampler: Sampler,
                 max_catchup_tokens: int, mirrored: bool = False):
        self.name = name
        self.mirrored = mirrored
        self.model = model
        self.pool = pool
        self.runner = ModelRunner(model, pool)
        self.sampler = sampler
        self.max_catchup_tokens = max_catchup_tokens

    def attach(self, target_runner: ModelRunner) -> None:
        """The self-draft's KV is the target's own: every target forward also writes into this
        pool. A separate draft model computes its own KV and takes nothing from the target."""
        if self.mirrored:
            target_runner.wrap_attention(lambda inner: MirroredAttention(inner, self.pool))

    def propose(self, entries: list[tuple[ScheduledSeq, int]]) -> float | None:
        for s, _ in entries:
            s.draft_ids, s.draft_probs = [], None
        # Step 1: catch up to the sequence's last token and draw the first draft.
        budget = self.max_catchup_tokens
        chunks, ready = [], []
        for s, k in entries:
            seq = s.seq
            if self.mirrored:
                seq.num_draft_computed = seq.num_computed_tokens
            begin = seq.num_draft_computed
            lag = seq.num_tokens - begin
            take = lag if lag <= 2 else min(lag, budget)   # a decode's usual lag never waits
            if take <= 0:
                continue
            budget -= take
            done = begin + take == seq.num_tokens
            tokens = [seq.output_ids[-1]] if take == 1 and done else seq.all_token_ids[begin:begin + take]
            chunks.append(Chunk(seq.block_table, begin, tokens, 1 if done else 0))
            seq.num_draft_computed = begin + take
            if done:
                ready.append((s, k, []))
        if not chunks:
            return None
        started = time.perf_counter()
        logits = self.runner.forward(chunks)
        # A forward of at most two tokens per sequence is a draft decode step: timed for adaptive k.
        step_s = time.perf_counter() - started if all(len(c.token_ids) <= 2 for c in chunks) else None
        active = ready
        while active:
            self._draw(active, logits)
            # Step j: feed each draft back in, for the sequences that want more.
            active = [a for a in active if len(a[0].draft_ids) < a[1]]
            if not active:
                break
            chunks = []
            for s, _, _ in active:
                seq = s.seq
                chunks.append(Chunk(seq.block_table, seq.num_draft_computed, [s.draft_ids[-1]], 1))
                seq.num_draft_computed += 1
            started = time.perf_counter()
            logits = self.runner.forward(chunks)
            step_s = time.perf_counter() - started
        for s, _, q_rows in ready:
            if q_rows:
                s.draft_probs = torch.cat(q_rows)
        return step_s

    def _draw(self, active, logits: torch.Tensor) -> None:
        """Append one draft token per active entry, drawn from the draft's processed distribution."""
        params = [a[0].seq.params for a in active]
        logits = self.sampler.adjust(logits, [a[0].seq for a in active], [a[0].draft_ids for a in active])
        tokens = logits.argmax(dim=-1)
        sampled = [i for i, p in enumerate(params) if not p.greedy]
        if sampled:
            q = self.sampler.probs(logits[sampled], [params[i] for i in sampled])
            # A seeded request's draft uses the uniform its target will draw that position with.
            tokens[sampled] = self.sampler.draw(q, [active[i][0].seq.uniform_at(len(active[i][0].draft_ids))
                                                    for i in sampled])
            for j, i in enumerate(sampled):
                active[i][2].append(q[j:j + 1])
        for (s, _, _), token in zip(active, tokens.tolist()):
            s.draft_ids.append(token)
