"""Speculative decoding in the batching engine on the real model (fp32): greedy output is
token-identical to plain decoding for every draft source, with sequences accepting
different numbers of tokens in one batch; nothing leaks after rejections, preemptions
and aborts; the prefix cache only ever holds accepted tokens."""

from __future__ import annotations

import pytest

from engines.bad_words import bad_words_token_ids
from engines.engine_config import EngineConfig
from engines.llm_engine import LLMEngine
from engines.quantization import quantize_model
from engines.quantization.artifact import save_artifact
from engines.sampling_params import SamplingParams
from engines.spec.config import SpeculativeConfig

pytestmark = pytest.mark.slow

MAX_TOKENS = 24
QUESTIONS = [
    "hi", "What is the capital of France?", "Write a haiku about autumn.", "Explain gravity briefly.",
    "List three prime numbers.", "Who wrote Hamlet?", "Translate 'good morning' to Spanish.",
    "Repeat exactly: the cat sat on the mat, the cat sat on the mat.", "Name a color.",
    "Fix the typo and repeat the sentence: 'The quikc brown fox jumps over the lazy dog.'",
    "Summarise this: " + "The quick brown fox jumps over the lazy dog. " * 30,
    "Give me a Python one-liner to reverse a list.", "Why is the sky blue?",
    "Add a docstring to this function:\ndef add(a, b):\n    return a + b",
    "What is the boiling point of water?", "Recommend a book.",
]


def _prompts(loaded):
    return [loaded.tokenizer.encode(loaded.chat_template.render([{"role": "user", "content": q}])) for q in QUESTIONS]


def _engine(loaded, spec=None, **overrides) -> LLMEngine:
    cfg = {"kv_cache_memory_bytes": 64 * 2**20, "max_num_batched_tokens": 256, "max_num_seqs": 32,
           "speculative": spec, **overrides}
    return LLMEngine(loaded, EngineConfig(**cfg))


@pytest.fixture(scope="module")
def plain(real_fp32):
    """Greedy outputs without speculation (batched == alone is tests/integration/test_engine.py's)."""
    return _engine(real_fp32).generate(_prompts(real_fp32), SamplingParams(max_tokens=MAX_TOKENS, temperature=0))


@pytest.fixture(scope="module")
def int4_copy(real_fp32, tmp_path_factory):
    """A separate draft model sharing the tokenizer: the checkpoint at INT4 g128 (~65 % top-1
    agreement with fp32, so many drafts are rejected), loaded from its own directory."""
    from engines.loaded_model import load_model

    out = tmp_path_factory.mktemp("draft-int4-g128")
    model = load_model("default", "float32")
    quantize_model(model.model, "int4-rtn", 128, progress=False)
    save_artifact(model.model, real_fp32.path, out, "int4-rtn", 128)
    return str(out)


def _spec(method, int4_copy, **overrides):
    cfg = {"method": method, "num_tokens": 4, "max_batch": 32, **overrides}
    if method == "draft":
        cfg.update(draft_model=int4_copy, draft_kv_cache_dtype=None)
    return SpeculativeConfig(**cfg)


def _assert_no_leak(engine: LLMEngine) -> None:
    bm = engine.block_manager
    bm.check_invariants([])
    assert bm.num_free_blocks == bm.num_blocks


@pytest.mark.parametrize("method", ["ngram", "draft", "self"])
def test_greedy_with_speculation_equals_plain_decoding(real_fp32, plain, int4_copy, method):
    engine = _engine(real_fp32, _spec(method, int4_copy))
    outputs = engine.generate(_prompts(real_fp32), SamplingParams(max_tokens=MAX_TOKENS, temperature=0))
    assert outputs == plain
    stats = engine.stats.spec[method]
    # Speculation happened, drafts were rejected (rollback ran) and accepted lengths differ.
    assert stats.proposed_tokens > stats.accepted_tokens > 0
    assert sum(1 for n in stats.accepted_length_hist if n) >= 3
    assert sum(stats.accepted_length_hist) == stats.verifications
    assert stats.emitted_tokens == stats.accepted_tokens + stats.verifications
    if method == "self":
        assert engine.speculator.source.pool.dtype.is_floating_point is False      # int8 draft KV
        # INT4 g32 weights over the target's own (mirrored) K/V: a broken mirror shows up here only.
        assert stats.acceptance_rate > 0.8
    _assert_no_leak(engine)


@pytest.mark.parametrize("method", ["ngram", "self"])
def test_logit_adjustments_with_speculation_equal_plain_decoding(real_fp32, plain, int4_copy, method):
    """Repetition penalty, min_tokens, logit_bias and bad words reach every verified position as
    they reach plain decoding's: the greedy outputs are the same tokens, and they differ from
    unadjusted ones."""
    tok = real_fp32.tokenizer
    eos = tok.eos_token_ids
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, repetition_penalty=1.3, min_tokens=MAX_TOKENS - 4,
                            logit_bias={tok.encode(" the")[0]: 3.0},
                            bad_words_token_ids=bad_words_token_ids(tok, ["Paris", "the cat"]))
    reference = _engine(real_fp32).generate(_prompts(real_fp32), params)
    outputs = _engine(real_fp32, _spec(method, int4_copy)).generate(_prompts(real_fp32), params)
    assert outputs == reference
    assert all(len(out) >= MAX_TOKENS - 4 and not eos & set(out[:MAX_TOKENS - 4]) for out in outputs)
    assert sum(out != ref for out, ref in zip(outputs, plain)) >= len(plain) // 2


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_preemption_with_speculation_keeps_outputs_and_frees_everything(real_fp32, int4_copy, method):
    """All four prompts fit the pool, their 48 new tokens do not: someone must be preempted
    (and recomputed, the draft model included) mid-speculation."""
    prompts = [p for i, p in enumerate(_prompts(real_fp32)) if i in (1, 7, 9, 13)]
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    reference = _engine(real_fp32).generate(prompts, params)
    blocks = sum(-(-len(p) // 16) for p in prompts) + 2
    per_block = 2 * 30 * 16 * 3 * 64 * 4 * (2 if method == "draft" else 1)   # the draft's pool shares the budget
    engine = _engine(real_fp32, _spec(method, int4_copy), kv_cache_memory_bytes=per_block * blocks,
                     headroom_fraction=0.0)
    assert engine.block_manager.num_blocks == blocks
    assert sum(-(-(len(p) + 48) // 16) for p in prompts) > blocks
    outputs = engine.generate(prompts, params)
    assert engine.stats.preemptions > 0
    assert engine.stats.spec[method].verifications > 0
    assert outputs == reference
    _assert_no_leak(engine)


def _check_cache_holds_accepted_tokens(engine: LLMEngine, live) -> None:
    bm = engine.block_manager
    bm.check_invariants(live)
    bs = bm.block_size
    for seq in live:
        tokens = seq.all_token_ids
        # No draft slot kept: blocks for its tokens at most (the newest may get its block next step).
        assert bm.blocks_needed(seq.num_computed_tokens) <= len(seq.block_table) <= bm.blocks_needed(seq.num_tokens)
        for i, block_id in enumerate(seq.block_table):
            block = bm.blocks[block_id]
            if block.block_hash is not None:      # a cached block: full of this sequence's computed tokens
                assert (i + 1) * bs <= seq.num_computed_tokens
                assert block.token_ids == tuple(tokens[i * bs:(i + 1) * bs])


def test_aborts_and_rejections_leave_no_block_behind(real_fp32, int4_copy):
    engine = _engine(real_fp32, _spec("draft", int4_copy), block_size=4)
    prompts = _prompts(real_fp32)
    params = SamplingParams(max_tokens=40, temperature=0.8, seed=3)
    for i, p in enumerate(prompts[:8]):
        engine.add_request(f"r{i}", p, params)
    aborted = 0
    while engine.has_unfinished():
        engine.step()
        live = [r.seq for r in engine._requests.values()]
        _check_cache_holds_accepted_tokens(engine, live)
        speculating = [s for s in live if s.num_draft_computed > 0]
        if speculating and aborted < 3:                  # abort mid-speculation, draft KV included
            assert engine.abort_request(speculating[0].request_id).finish_reason == "abort"
            aborted += 1
    assert aborted == 3
    stats = engine.stats.spec["draft"]
    assert stats.proposed_tokens > stats.accepted_tokens > 0
    _assert_no_leak(engine)


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_a_seed_gives_plain_decodings_tokens_however_far_it_speculates(real_fp32, int4_copy, method):
    """A seeded sampled request's tokens are the ones plain decoding draws: alone, in a batch
    that backs off (above max_batch), and with a KV pool so tight that the scheduler cuts its
    drafts to keep seats for waiting requests. How many drafts a step verified changes nothing."""
    prompts = _prompts(real_fp32)
    seeded = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.9, top_p=0.95, seed=42)
    others = SamplingParams(max_tokens=6, temperature=0.9)       # done early: the rest speculate
    mix = prompts[6:10] + prompts[:6]
    plain = _engine(real_fp32).generate(prompts[6:10], seeded)
    assert len(set(map(tuple, plain))) == 4
    spec = _spec(method, int4_copy, max_batch=2)
    alone = [_engine(real_fp32, spec).generate([p], seeded)[0] for p in prompts[6:10]]
    backing_off = _engine(real_fp32, spec)
    batched = backing_off.generate(mix, [seeded] * 4 + [others] * 6)[:4]
    tight = _engine(real_fp32, _spec(method, int4_copy), kv_cache_memory_bytes=12 * 2**20, block_size=4)
    squeezed = tight.generate(mix, [seeded] * 4 + [others] * 6)[:4]
    assert alone == plain and batched == plain and squeezed == plain
    assert backing_off.stats.spec[method].backoff_steps > 0
    for engine in (backing_off, tight):
        stats = engine.stats.spec[method]
        assert stats.proposed_tokens > stats.accepted_tokens > 0
        _assert_no_leak(engine)
