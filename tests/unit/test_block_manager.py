"""Block manager invariants under random operations, plus the prefix-cache rules."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engines.block_manager import BlockManager
from engines.sampling_params import SamplingParams
from engines.sequence import Sequence

BS = 4


def _seq(tokens, scope=None, rid="r"):
    return Sequence(rid, list(tokens), SamplingParams(), prefix_scope=scope)


def _compute_all(bm: BlockManager, seq: Sequence) -> None:
    seq.num_computed_tokens = seq.num_tokens
    bm.register_computed(seq)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.integers(0, 3), st.integers(1, 30), st.sampled_from([None, "a", "b"])),
        st.tuples(st.just("grow"), st.integers(0, 50), st.integers(1, 6)),
        st.tuples(st.just("free"), st.integers(0, 50)),
        st.tuples(st.just("reset"),),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, num_blocks=st.integers(4, 24), headroom=st.integers(0, 2))
def test_invariants_hold_under_random_operations(ops, num_blocks, headroom):
    bm = BlockManager(num_blocks, BS)
    live: list[Sequence] = []
    for n, op in enumerate(ops):
        if op[0] == "admit":
            _, prefix_id, length, scope = op
            # A few shared prefixes, so prefix hits and shared blocks happen often.
            tokens = [prefix_id] * 8 + list(range(100 + n, 100 + n + length))
            seq = _seq(tokens, scope, rid=str(n))
            free_before = bm.num_free_blocks
            if bm.try_admit(seq, headroom):
                assert len(seq.block_table) == bm.blocks_needed(seq.num_tokens)
                assert seq.num_computed_tokens < seq.num_tokens  # the last token is always computed
                assert seq.num_computed_tokens % BS == 0
                _compute_all(bm, seq)
                live.append(seq)
            else:
                assert bm.num_free_blocks == free_before  # nothing allocated on failure
        elif op[0] == "grow" and live:
            seq = live[op[1] % len(live)]
            table_before = list(seq.block_table)
            seq.output_ids.extend([7] * op[2])
            if bm.try_grow(seq, seq.num_tokens):
                _compute_all(bm, seq)
            else:
                del seq.output_ids[-op[2]:]
                assert seq.block_table == table_before
        elif op[0] == "free" and live:
            bm.free(live.pop(op[1] % len(live)))
        elif op[0] == "reset":
            bm.reset_prefix_cache()
        bm.check_invariants(live)
    for seq in live:
        bm.free(seq)
    bm.check_invariants([])
    assert bm.num_free_blocks == num_blocks


def test_second_request_hits_all_full_prefix_blocks():
    bm = BlockManager(32, BS)
    system = list(range(50, 63))                      # 13 tokens: 3 full blocks + 1
    a = _seq(system + [1, 2, 3], rid="a")
    assert bm.try_admit(a)
    _compute_all(bm, a)
    b = _seq(system + [9, 9], rid="b")
    assert bm.try_admit(b)
    assert b.num_computed_tokens == 12                 # 3 full blocks of the shared 13
    assert b.block_table[:3] == a.block_table[:3]
    assert bm.prefix_hit_tokens == 12


def test_last_prompt_token_is_always_computed():
    bm = BlockManager(32, BS)
    a = _seq(range(8), rid="a")
    assert bm.try_admit(a)
    _compute_all(bm, a)
    b = _seq(range(8), rid="b")                        # identical, block-aligned prompt
    assert bm.try_admit(b)
    assert b.num_computed_tokens == 4                   # not 8: one token must produce logits


def test_scopes_do_not_share_blocks():
    bm = BlockManager(32, BS)
    a = _seq(range(9), scope="tenant-a", rid="a")
    assert bm.try_admit(a)
    _compute_all(bm, a)
    assert bm.try_admit(b := _seq(range(9), scope="tenant-b", rid="b"))
    assert b.num_computed_tokens == 0
    assert bm.try_admit(c := _seq(range(9), scope="tenant-a", rid="c"))
    assert c.num_computed_tokens == 8


def test_freed_blocks_stay_cached_and_are_evicted_oldest_first():
    bm = BlockManager(4, BS)
    old = _seq([1] * 4 + [2], rid="old")                # 2 blocks, first one cacheable
    assert bm.try_admit(old)
    _compute_all(bm, old)
    bm.free(old)
    new = _seq([3] * 4 + [4], rid="new")
    assert bm.try_admit(new)
    _compute_all(bm, new)
    bm.free(new)
    # Both cached prefixes survive while free blocks remain.
    assert bm.try_admit(again := _seq([1] * 4 + [5], rid="again"))
    assert again.num_computed_tokens == 4
    bm.free(again)
    # A 4-block request evicts everything; then nothing hits.
    assert bm.try_admit(big := _seq(range(200, 216), rid="big"))
    bm.free(big)
    assert bm.try_admit(probe := _seq([3] * 4 + [4], rid="probe"))
    assert probe.num_computed_tokens == 0


def test_hash_hit_is_verified_against_tokens():
    bm = BlockManager(8, BS)
    a = _seq([1, 2, 3, 4, 5], rid="a")
    assert bm.try_admit(a)
    _compute_all(bm, a)
    bm.blocks[a.block_table[0]].token_ids = (9, 9, 9, 9)  # simulate a colliding entry
    assert bm.try_admit(b := _seq([1, 2, 3, 4, 6], rid="b"))
    assert b.num_computed_tokens == 0
