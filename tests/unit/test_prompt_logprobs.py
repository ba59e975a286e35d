"""Prompt logprobs in the batching engine on a tiny random Llama (fp32): every prompt token's
logprob, rank and top alternatives equal transformers' over the whole prompt, whether the prefill is
chunked, batched with other requests or the prompt is in the prefix cache (it is then computed
again: a cached block has no logits); the generated tokens are those of the same request without
them, and nothing leaks."""

from __future__ import annotations

import random

import pytest
import torch

from engines.engine_config import EngineConfig
from engines.llm_engine import LLMEngine
from engines.loaded_model import load_model
from engines.sampling_params import InvalidRequestError, SamplingParams
from tests.tiny_models import TINY_VOCAB, write_tiny_checkpoint

TOP = 3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-prompt-lp")
    hf = write_tiny_checkpoint(path, seed=5, initializer_range=0.2)
    return load_model(path, "float32"), hf.eval()


def _prompts():
    rng = random.Random(9)
    return [[rng.randrange(3, TINY_VOCAB) for _ in range(n)] for n in (1, 5, 17, 40, 90)]


def _engine(loaded) -> LLMEngine:
    # 16 tokens a step: the longer prompts are prefilled in several chunks.
    return LLMEngine(loaded, EngineConfig(kv_cache_memory_bytes=2**20, max_num_batched_tokens=16, max_num_seqs=8))


def _run(engine, requests):
    outputs = {rid: [] for rid, _, _ in requests}
    for rid, ids, params in requests:
        engine.add_request(rid, ids, params)
    while engine.has_unfinished():
        for out in engine.step():
            outputs[out.request_id].append(out)
    return outputs


def _check(hf, ids, lps):
    assert len(lps) == len(ids) and [lp.token_id for lp in lps] == ids
    assert lps[0].logprob is None and lps[0].top == []
    if len(ids) == 1:
        return
    with torch.no_grad():
        expected = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
    for p in range(1, len(ids)):
        assert lps[p].logprob == pytest.approx(float(expected[p - 1, ids[p]]), abs=1e-4)
        assert lps[p].rank == int((expected[p - 1] > expected[p - 1, ids[p]]).sum()) + 1
        values, order = expected[p - 1].topk(TOP)
        assert [t for t, _ in lps[p].top] == order.tolist()
        assert [v for _, v in lps[p].top] == pytest.approx(values.tolist(), abs=1e-4)


def test_prompt_logprobs_equal_transformers_in_chunks_and_batches(tiny):
    loaded, hf = tiny
    engine = _engine(loaded)
    asked = SamplingParams(max_tokens=4, temperature=0, prompt_logprobs=TOP)
    plain = SamplingParams(max_tokens=4, temperature=0)
    requests = [(f"lp{i}", ids, asked) for i, ids in enumerate(_prompts())]
    requests += [(f"plain{i}", ids, plain) for i, ids in enumerate(_prompts())]
    outputs = _run(engine, requests)
    for i, ids in enumerate(_prompts()):
        deltas = outputs[f"lp{i}"]
        assert [d.prompt_logprobs is not None for d in deltas] == [True] + [False] * (len(deltas) - 1)
        _check(hf, ids, deltas[0].prompt_logprobs)
        tokens = [t for d in deltas for t in d.token_ids]
        assert tokens == [t for d in outputs[f"plain{i}"] for t in d.token_ids]
        assert all(d.prompt_logprobs is None for d in outputs[f"plain{i}"])
    engine.block_manager.check_invariants([])
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_cached_prompt_is_computed_again_for_its_logprobs(tiny):
    loaded, hf = tiny
    engine = _engine(loaded)
    ids = _prompts()[-1]
    _run(engine, [("warm", ids, SamplingParams(max_tokens=2, temperature=0))])
    again = _run(engine, [("hit", ids, SamplingParams(max_tokens=2, temperature=0))])["hit"]
    assert again[-1].cached_tokens > 0                     # the prompt's blocks are cached
    deltas = _run(engine, [("lp", ids, SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=0))])["lp"]
    assert deltas[-1].cached_tokens == 0
    lps = deltas[0].prompt_logprobs
    assert all(lp.top == [] for lp in lps)
    _check_values(hf, ids, lps)


@pytest.mark.parametrize("value", [-1, 21])
def test_prompt_logprobs_out_of_range_name_the_field(value):
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(prompt_logprobs=value).validate()
    assert info.value.param == "prompt_logprobs"


def test_with_a_prompt_hidden_state_in_the_same_forward(tiny):
    """Both read kept rows of one forward: each gets its own."""
    loaded, hf = tiny
    ids = _prompts()[3]
    hidden_only = SamplingParams(max_tokens=2, temperature=0, prompt_hidden=True, prompt_hidden_rows=(0, 3))
    both = SamplingParams(max_tokens=2, temperature=0, prompt_hidden=True, prompt_hidden_rows=(0, 3), prompt_logprobs=1)
    alone = _run(_engine(loaded), [("h", ids, hidden_only)])["h"][0]
    together = _run(_engine(loaded), [("b", ids, both), ("o", _prompts()[4], SamplingParams(max_tokens=2, prompt_logprobs=2))])
    first = together["b"][0]
    assert first.prompt_hidden == pytest.approx(alone.prompt_hidden, abs=1e-5)
    _check_values(hf, ids, first.prompt_logprobs)
    _check_values(hf, _prompts()[4], together["o"][0].prompt_logprobs)


def test_on_a_speculative_engine(tiny):
    from engines.spec.config import SpeculativeConfig

    loaded, hf = tiny
    spec = LLMEngine(loaded, EngineConfig(kv_cache_memory_bytes=2**20, max_num_batched_tokens=16, max_num_seqs=8,
                                          speculative=SpeculativeConfig(method="ngram", num_tokens=3)))
    plain = _run(_engine(loaded), [("p", _prompts()[3], SamplingParams(max_tokens=8, temperature=0))])["p"]
    deltas = _run(spec, [("s", _prompts()[3], SamplingParams(max_tokens=8, temperature=0, prompt_logprobs=TOP))])["s"]
    _check(hf, _prompts()[3], deltas[0].prompt_logprobs)
    assert [t for d in deltas for t in d.token_ids] == [t for d in plain for t in d.token_ids]


def _check_values(hf, ids, lps):
    with torch.no_grad():
        expected = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
    assert [lp.logprob for lp in lps[1:]] == pytest.approx([float(expected[p - 1, ids[p]]) for p in range(1, len(ids))],
                                                          abs=1e-4)


def test_a_predicted_output_speeds_speculation_and_changes_no_token(tiny):
    """OpenAI's predicted output on an n-gram speculating engine: drafted from, so the answer the
    prediction spells is accepted in fewer steps; the tokens are the plain engine's."""
    from engines.spec.config import SpeculativeConfig

    loaded, _ = tiny
    ids = _prompts()[3]
    greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    plain = [t for d in _run(_engine(loaded), [("p", ids, greedy)])["p"] for t in d.token_ids]

    def speculate(prediction):
        # adaptive=False: adaptive k weighs measured times, and may draft nothing on a busy machine.
        spec = LLMEngine(loaded, EngineConfig(kv_cache_memory_bytes=2**20, max_num_batched_tokens=16, max_num_seqs=8,
                                              speculative=SpeculativeConfig(method="ngram", num_tokens=4,
                                                                            adaptive=False)))
        params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, prediction_token_ids=tuple(prediction))
        deltas = _run(spec, [("s", ids, params)])["s"]
        return [t for d in deltas for t in d.token_ids], deltas[-1].spec_accepted, len(deltas)

    tokens, accepted, steps = speculate(plain)
    assert tokens == plain and accepted >= 18 and steps <= 8
    wrong = [(t + 1) % TINY_VOCAB for t in plain]          # a prediction it never follows changes nothing either
    assert speculate(wrong)[0] == plain
