"""Turn a step plan into flat tensors, run the model once, return logits to sample from."""

from __future__ import annotations

import torch

from engines.attention.paged import PagedAttention, build_step_metadata
from engines.kv_cache import KVPool
from engines.model import LlamaForCausalLM
from engines.scheduler import ScheduledSeq


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, pool: KVPool):
        self.model = model
        self.pool = pool
        self.block_size = pool.block_size
        self.attn = PagedAttention(pool)

    def execute(self, scheduled: list[ScheduledSeq]) -> tuple[list[ScheduledSeq], torch.Tensor]:
        """Run one step. Returns the scheduled entries that sample, and their logits [N, V]."""
        ids: list[int] = []
        sample_rows: list[int] = []
        sampling: list[ScheduledSeq] = []
        for s in scheduled:
            seq, start, end = s.seq, s.start, s.start + s.num_tokens
            if s.num_tokens == 1 and start >= len(seq.prompt_ids):
                ids.append(seq.output_ids[start - len(seq.prompt_ids)])   # a decode: no list concat
            else:
                ids.extend(seq.all_token_ids[start:end])
            if s.samples:
                sample_rows.append(len(ids) - 1)
                sampling.append(s)
        self.attn.prepare(build_step_metadata(
            self.block_size, [(s.seq.block_table, s.start, s.num_tokens) for s in scheduled]))
        hidden = self.model(torch.tensor(ids, dtype=torch.long), _positions(scheduled), self.attn)
        if not sampling:
            return [], torch.empty(0)
        return sampling, self.model.compute_logits(hidden[torch.tensor(sample_rows)])


def _positions(scheduled: list[ScheduledSeq]) -> torch.Tensor:
    out: list[int] = []
    for s in scheduled:
        out.extend(range(s.start, s.start + s.num_tokens))
    return torch.tensor(out, dtype=torch.long)
