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
        bs = self.block_size
        decodes = [s for s in scheduled if s.num_tokens == 1]
        prefills = [s for s in scheduled if s.num_tokens > 1]
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        for s in decodes:
            seq, p = s.seq, s.start
            ids.append(seq.output_ids[-1] if p >= len(seq.prompt_ids) else seq.prompt_ids[p])
            positions.append(p)
            slots.append(seq.block_table[p // bs] * bs + p % bs)
        for s in prefills:
            seq, start, end = s.seq, s.start, s.start + s.num_tokens
            ids.extend(seq.all_token_ids[start:end])
            positions.extend(range(start, end))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
        meta = build_step_metadata(
            bs,
            [(s.seq.block_table, s.start + 1) for s in decodes],
            [(s.seq.block_table, s.start, s.num_tokens) for s in prefills],
            torch.tensor(slots, dtype=torch.long),
        )
        self.attn.prepare(meta)
        ordered = decodes + prefills
        sample_rows: list[int] = []
        sampling: list[ScheduledSeq] = []
        row = 0
        for s in ordered:
            row += s.num_tokens
            if s.samples:
                sample_rows.append(row - 1)
                sampling.append(s)
        hidden = self.model(torch.tensor(ids, dtype=torch.long), torch.tensor(positions, dtype=torch.long), self.attn)
        if not sampling:
            return [], torch.empty(0)
        return sampling, self.model.compute_logits(hidden[torch.tensor(sample_rows)])
