"""Block allocation for the paged KV cache, with prefix caching.

Full blocks are identified by a hash chain over (parent hash, the block's tokens), rooted
in the engine identity (model, quantization, KV dtype) and the request's prefix scope
(a tenant salt, or the shared scope). A hit is checked against the stored tokens. Freed
blocks keep their hash and wait in an LRU free list; allocation evicts the oldest first.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass

from engines.sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None
    parent_hash: bytes | None = None
    token_ids: tuple[int, ...] | None = None


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True, identity: str = ""):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.identity = identity
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[bytes, int] = {}
        self._roots: dict[str | None, bytes] = {}
        self.prefix_queried_tokens = 0
        self.prefix_hit_tokens = 0

    # ---- queries -------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- hashing -------------------------------------------------------------------
    def _root(self, scope: str | None) -> bytes:
        root = self._roots.get(scope)
        if root is None:
            key = f"{self.identity}\x00{'shared' if scope is None else 'scope:' + scope}"
            root = self._roots[scope] = hashlib.blake2b(key.encode(), digest_size=16).digest()
        return root

    def _extend_hashes(self, seq: Sequence, num_full_blocks: int) -> None:
        hashes = seq.block_hashes
        if len(hashes) >= num_full_blocks:
            return
        tokens = seq.all_token_ids
        bs = self.block_size
        parent = hashes[-1] if hashes else self._root(seq.prefix_scope)
        for i in range(len(hashes), num_full_blocks):
            h = hashlib.blake2b(parent, digest_size=16)
            h.update(array("q", tokens[i * bs:(i + 1) * bs]).tobytes())
            parent = h.digest()
            hashes.append(parent)

    def _lookup_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks covering a prefix of `seq`, leaving at least its last token (and the
        rows of a prompt hidden state it waits for, or its whole prompt when it waits for the
        prompt's logprobs) to compute."""
        if not self.enable_prefix_caching:
            return []
        max_blocks = (seq.num_tokens - seq.prompt_rows_to_compute) // self.block_size
        self._extend_hashes(seq, max_blocks)
        tokens = seq.all_token_ids
        bs = self.block_size
        hits: list[int] = []
        parent = None
        for i in range(max_blocks):
            block_id = self._cached.get(seq.block_hashes[i])
            if block_id is None:
                break
            block = self.blocks[block_id]
            # Verify: a hash match alone is not trusted.
            if block.parent_hash != parent or block.token_ids != tuple(tokens[i * bs:(i + 1) * bs]):
                break
            hits.append(block_id)
            parent = block.block_hash
        return hits

    # ---- allocation ----------------------------------------------------------------
    def try_admit(self, seq: Sequence, headroom_blocks: int = 0) -> bool:
        """Give `seq` blocks for all its tokens, reusing cached prefix blocks.

        Succeeds only if `headroom_blocks` stay free afterwards; allocates nothing otherwise.
        """
        hits = self._lookup_prefix(seq)
        new_needed = self.blocks_needed(seq.num_tokens) - len(hits)
        if len(self._free) - self._hits_now_free(hits) - new_needed < headroom_blocks:
            return False
        for block_id in hits:
            self._take_ref(block_id)
        seq.block_table = hits + [self._pop_free() for _ in range(new_needed)]
        seq.num_computed_tokens = len(hits) * self.block_size
        seq.num_registered_blocks = len(hits)
        if seq.num_preemptions == 0:
            seq.num_cached_prompt_tokens = seq.num_computed_tokens
        self.prefix_queried_tokens += seq.num_tokens
        self.prefix_hit_tokens += seq.num_computed_tokens
        return True

    def blocks_to_admit(self, seq: Sequence) -> int:
        """Free blocks admitting `seq` now would take: its new blocks, and the cached prefix
        blocks it reuses that nobody holds (they sit in the free list)."""
        hits = self._lookup_prefix(seq)
        return self.blocks_needed(seq.num_tokens) - len(hits) + self._hits_now_free(hits)

    def blocks_freed_by(self, seq: Sequence) -> int:
        """Blocks that freeing `seq` would return to the free list (those no other sequence holds)."""
        return sum(1 for b in seq.block_table if self.blocks[b].ref_count == 1)

    def _hits_now_free(self, hits: list[int]) -> int:
        # A cached block nobody holds sits in the free list: reusing it takes it from there.
        return sum(1 for b in hits if self.blocks[b].ref_count == 0)

    def try_grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Make `seq`'s block table cover `num_tokens` tokens; all or nothing."""
        extra = self.blocks_needed(num_tokens) - len(seq.block_table)
        if extra <= 0:
            return True
        if extra > len(self._free):
            return False
        seq.block_table.extend(self._pop_free() for _ in range(extra))
        return True

    def register_computed(self, seq: Sequence) -> None:
        """Enter the sequence's newly computed full blocks into the prefix cache."""
        if not self.enable_prefix_caching:
            return
        full = seq.num_computed_tokens // self.block_size
        if full <= seq.num_registered_blocks:
            return
        self._extend_hashes(seq, full)
        tokens = seq.all_token_ids
        bs = self.block_size
        for i in range(seq.num_registered_blocks, full):
            block = self.blocks[seq.block_table[i]]
            h = seq.block_hashes[i]
            if block.block_hash is None and h not in self._cached:
                block.block_hash = h
                block.parent_hash = seq.block_hashes[i - 1] if i else None
                block.token_ids = tuple(tokens[i * bs:(i + 1) * bs])
                self._cached[h] = block.block_id
        seq.num_registered_blocks = full

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Give back the blocks past the first `num_tokens` tokens (rejected speculative slots).

        They never held a registered (hashed) block: registration stops at the computed,
        accepted tokens. They go to the front of the free list, to be reused before blocks
        that still carry a cached prefix.
        """
        keep = self.blocks_needed(num_tokens)
        for block_id in reversed(seq.block_table[keep:]):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
                if block.block_hash is None:
                    self._free.move_to_end(block_id, last=False)
        del seq.block_table[keep:]
        seq.num_registered_blocks = min(seq.num_registered_blocks, keep)

    def free(self, seq: Sequence) -> None:
        """Return the sequence's blocks. Tail blocks first, so shared prefixes are evicted last."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
        seq.block_table = []
        seq.num_registered_blocks = 0

    def reset_prefix_cache(self) -> None:
        for block_id in self._free:
            self._forget(self.blocks[block_id])

    # ---- internals -----------------------------------------------------------------
    def _take_ref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._free[block_id]
        block.ref_count += 1

    def _pop_free(self) -> int:
        block_id, _ = self._free.popitem(last=False)  # least recently freed
        block = self.blocks[block_id]
        self._forget(block)
        block.ref_count = 1
        return block_id

    def _forget(self, block: Block) -> None:
        if block.block_hash is not None and self._cached.get(block.block_hash) == block.block_id:
            del self._cached[block.block_hash]
        block.block_hash = block.parent_hash = block.token_ids = None

    def check_invariants(self, live: list[Sequence]) -> None:
        """Raise AssertionError when the bookkeeping is inconsistent (used by tests)."""
        refs = [0] * self.num_blocks
        for seq in live:
            assert len(set(seq.block_table)) == len(seq.block_table), "block twice in one table"
            for b in seq.block_table:
                refs[b] += 1
        for block in self.blocks:
            assert block.ref_count == refs[block.block_id], f"block {block.block_id} refcount drift"
            assert (block.ref_count == 0) == (block.block_id in self._free), f"block {block.block_id} free-list drift"
        for h, b in self._cached.items():
            assert self.blocks[b].block_hash == h, "hash table points at a block with another hash"
