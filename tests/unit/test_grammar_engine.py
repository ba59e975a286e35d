"""Grammar-constrained decoding in the batching engine, on a tiny random Llama over a byte-level
vocabulary (it can spell JSON; its own choices are noise, so every valid answer is the mask's
doing): constrained rows are valid JSON under their schema, unconstrained rows beside them are
untouched, and the constraint survives chunked prefill, preemption (recompute), prefix-cache hits,
aborts and a speculating engine (which does not speculate for a constrained sequence)."""

from __future__ import annotations

import asyncio
import json
import threading

import jsonschema
import pytest

from engines.async_engine import AsyncEngine
from engines.engine_config import EngineConfig
from engines.grammar import GrammarError, GrammarSpec
from engines.llm_engine import LLMEngine
from engines.loaded_model import load_model
from engines.sampling_params import SamplingParams
from engines.spec.config import SpeculativeConfig
from tests.tiny_models import write_tiny_byte_checkpoint

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "n", "tags", "ok"],
          "properties": {"name": {"type": "string", "maxLength": 6},
                         "n": {"type": "integer", "minimum": 0, "maximum": 99},
                         "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
                         "ok": {"type": "boolean"}}}
MAX_TOKENS = 120


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-bytes")
    write_tiny_byte_checkpoint(path, seed=3, initializer_range=0.2)
    return load_model(path, "float32")


def _engine(loaded, **overrides) -> LLMEngine:
    cfg = dict(kv_cache_memory_bytes=2**20, max_num_batched_tokens=256, max_num_seqs=16, max_model_len=256)
    cfg.update(overrides)
    return LLMEngine(loaded, EngineConfig(**cfg))


def _prompt(loaded, text: str) -> list[int]:
    return loaded.tokenizer.encode(loaded.chat_template.render([{"role": "user", "content": text}]))


def _constrained(seed: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=seed, grammar=GrammarSpec.json_schema(SCHEMA),
                          **kw)


def _valid(loaded, tokens: list[int]) -> dict:
    value = json.loads(loaded.tokenizer.decode(tokens))
    jsonschema.validate(value, SCHEMA)
    return value


def test_constrained_rows_are_valid_and_unconstrained_rows_untouched(tiny):
    prompts = [_prompt(tiny, f"question {i}") for i in range(6)]
    greedy = SamplingParams(max_tokens=24, temperature=0.0)
    alone = _engine(tiny).generate(prompts[:3], greedy)
    mixed = _engine(tiny).generate(prompts, [greedy] * 3 + [_constrained(i) for i in range(3)])
    assert mixed[:3] == alone                       # a mask on other rows changes nothing here
    for out in mixed[3:]:
        _valid(tiny, out)
    assert len({tuple(o) for o in mixed[3:]}) > 1   # seeds differ, answers differ


def test_chunked_prefill_and_prefix_cache_hits(tiny):
    engine = _engine(tiny, max_num_batched_tokens=16)  # every prompt is prefilled in chunks
    prompt = _prompt(tiny, "a longer question " * 4)
    first = engine.generate([prompt], _constrained(1))[0]
    hits = engine.block_manager.prefix_hit_tokens
    second = engine.generate([prompt], _constrained(1))[0]
    assert engine.block_manager.prefix_hit_tokens > hits
    assert first == second                            # same seed, same constrained answer
    _valid(tiny, first)


def test_preempted_sequences_resume_in_their_grammar(tiny):
    # A pool too small for all of them at full length: the newest are preempted and recomputed.
    engine = _engine(tiny, kv_cache_memory_bytes=KV_BYTES_FOR(tiny, 14), max_num_seqs=8)
    prompts = [_prompt(tiny, f"q{i}") for i in range(6)]
    outs = engine.generate(prompts, [_constrained(i, ignore_eos=True) for i in range(6)])
    assert engine.scheduler.num_preemptions > 0
    reference = _engine(tiny).generate(prompts, [_constrained(i, ignore_eos=True) for i in range(6)])
    assert outs == reference                          # recompute kept every grammar state in step
    for out in outs:
        _valid(tiny, out)


def KV_BYTES_FOR(loaded, blocks: int) -> int:
    from engines.kv_cache import KVPool

    return blocks * KVPool.bytes_per_block(loaded.config, 16, loaded.dtype)


def test_abort_of_a_constrained_request_leaves_the_others(tiny):
    engine = _engine(tiny)
    prompts = [_prompt(tiny, "x"), _prompt(tiny, "y")]
    engine.add_request("a", prompts[0], _constrained(1))
    engine.add_request("b", prompts[1], _constrained(2))
    got = []
    for _ in range(3):
        engine.step()
    engine.abort_request("a")
    while engine.has_unfinished():
        got += [t for out in engine.step() for t in out.token_ids]
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    alone = _engine(tiny).generate([prompts[1]], _constrained(2))[0]
    assert alone[-len(got):] == got


def test_a_speculating_engine_does_not_speculate_for_constrained_requests(tiny):
    spec = SpeculativeConfig(method="ngram", num_tokens=3, adaptive=False)
    engine = _engine(tiny, speculative=spec)
    prompt = _prompt(tiny, "repeat repeat repeat repeat")
    engine.add_request("c", prompt, _constrained(5))
    engine.add_request("p", prompt, SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    outputs = {"c": [], "p": []}
    last = {}
    while engine.has_unfinished():
        for out in engine.step():
            outputs[out.request_id] += out.token_ids
            last[out.request_id] = out
    assert last["c"].spec_proposed == 0 and last["p"].spec_proposed > 0
    _valid(tiny, outputs["c"])


def test_compiles_are_cached_by_digest_and_bad_schemas_name_their_field(tiny):
    compiler = _engine(tiny).grammars
    spec = GrammarSpec.json_schema(SCHEMA)
    first = compiler.compile(spec)
    assert compiler.compile(GrammarSpec.json_schema(dict(SCHEMA))) is first and compiler.hits == 1
    with pytest.raises(GrammarError) as info:
        compiler.compile(GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "nope"}}}))
    assert info.value.param == "response_format"
    with pytest.raises(GrammarError) as info:
        compiler.compile(GrammarSpec.lark("start: (", param="tools"))
    assert info.value.param == "tools"


def test_a_compile_past_the_timeout_is_refused_and_the_engine_thread_never_compiles(tiny):
    llm = _engine(tiny)
    release = threading.Event()
    compiled_in = []
    real = llm.grammars.new_state

    def slow(spec):
        compiled_in.append(threading.current_thread().name)
        release.wait(30)         # held until the test lets it go: past any timeout
        return real(spec)

    llm.grammars.new_state = slow
    llm.grammars.timeout_s = 0.05
    engine = AsyncEngine(llm)

    async def run():
        async for _ in engine.generate("r", _prompt(tiny, "x"), _constrained(1)):
            pass

    try:
        with pytest.raises(GrammarError) as info:
            asyncio.run(run())
        assert info.value.param == "response_format" and "compile" in str(info.value)
    finally:
        release.set()
        engine.shutdown()
    assert compiled_in and all(name.startswith("tiergate-grammar") for name in compiled_in)
