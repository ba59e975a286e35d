"""Turn a step plan into flat tensors, run the model once, return logits to sample from."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engines.attention.paged import PagedAttention, build_step
from engines.kv_cache import KVPool
from engines.model import LlamaForCausalLM
from engines.scheduler import ScheduledSeq


@dataclass
class Chunk:
    """Tokens of one sequence computed in a forward, from position `start`."""
    block_table: list[int]
    start: int
    token_ids: list[int]
    logit_rows: int = 0        # how many of its last rows need logits


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, pool: KVPool):
        self.model = model
        self.pool = pool
        self.device = model.embed_tokens.weight.device
        if pool.k.device != self.device:
            raise ValueError(f"KV pool on {pool.k.device} but the model on {self.device}")
        self.block_size = pool.block_size
        self.attn = PagedAttention(pool)

    def execute(self, scheduled: list[ScheduledSeq]) -> tuple[list[ScheduledSeq], torch.Tensor]:
        """Run one step. Returns the scheduled entries that sample and their logits: `num_rows`
        consecutive rows per entry (its last token's, then one per draft token)."""
        chunks: list[Chunk] = []
        sampling: list[ScheduledSeq] = []
        for s in scheduled:
            seq, start = s.seq, s.start
            if s.num_tokens == 1 and start >= len(seq.prompt_ids):
                ids = [seq.output_ids[start - len(seq.prompt_ids)]]    # a decode: no list concat
            else:
                ids = seq.all_token_ids[start:start + s.num_tokens]
            if s.draft_ids:
                ids = ids + s.draft_ids
            chunks.append(Chunk(seq.block_table, start, ids, s.num_rows))
            if s.samples:
                sampling.append(s)
        logits = self.forward(chunks)
        return sampling, logits

    def forward(self, chunks: list[Chunk]) -> torch.Tensor:
        """One flat forward over all chunks; logits [sum of logit_rows, V] in chunk order."""
        ids: list[int] = []
        positions: list[int] = []
        rows: list[int] = []
        for c in chunks:
            ids.extend(c.token_ids)
            positions.extend(range(c.start, c.start + len(c.token_ids)))
            rows.extend(range(len(ids) - c.logit_rows, len(ids)))
        # Every step tensor is built on the host and reaches the model's device in one copy.
        meta, (ids_t, positions_t, rows_t) = build_step(
            self.block_size, [(c.block_table, c.start, len(c.token_ids)) for c in chunks], self.device,
            [ids, positions, rows])
        self.attn.prepare(meta)
        hidden = self.model(ids_t, positions_t, self.attn)
        if not rows:
            return torch.empty(0, device=self.device)
        return self.model.compute_logits(hidden[rows_t])
