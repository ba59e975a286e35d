"""Bits per byte and the cascade's probe on a tiny random Llama (the real model's code path):
each equals a direct computation from the model's full-sequence logits; the workload keeps
only its slice and cuts references at the cap; the speed measurements run on the engine and
leave it empty."""

from __future__ import annotations

import math
import random

import pytest
import torch

from bench.eval.ppl import _logits as full_logits
from bench.routing.probes import probe_first_tokens
from bench.routing.scoring import score_exchange
from bench.routing.speed import BatchSpeed, SingleStreamTimer, best_round, measure_batch
from bench.routing.workload import WorkloadCaps, WorkloadError, cut_reference, load_routing_prompts
from bench.datasets.sharegpt import ROUTING_HELDOUT_START
from engines.loaded_model import load_model
from engines.simple_generate import SimpleSampling, generate_tokens
from tests.tiny_models import TINY_VOCAB, write_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-routing")
    write_tiny_checkpoint(path, seed=11, initializer_range=0.2)
    return load_model(path, "float32")


def _ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, TINY_VOCAB) for _ in range(n)]


@pytest.mark.parametrize("n_prompt,n_answer", [(1, 1), (5, 9), (17, 30)])
def test_bits_per_byte_equals_the_direct_sum_over_answer_tokens(tiny, n_prompt, n_answer):
    prompt, answer = _ids(n_prompt, n_prompt), _ids(n_answer, n_answer + 100)
    answer_bytes = 3 * n_answer + 1
    got = score_exchange(tiny.model, prompt, answer, answer_bytes, prompt_logprobs=True)
    ids = prompt + answer
    logp = torch.log_softmax(full_logits(tiny.model, ids).double(), dim=-1)
    token_lp = [float(logp[i - 1, ids[i]]) for i in range(1, len(ids))]
    bits = -sum(token_lp[n_prompt - 1:]) / math.log(2)
    assert got.bits_per_byte == pytest.approx(bits / answer_bytes, rel=1e-5)
    assert got.prompt_tokens == n_prompt and got.answer_tokens == n_answer
    want_prompt = sum(token_lp[:n_prompt - 1]) / (n_prompt - 1) if n_prompt > 1 else 0.0
    assert got.prompt_mean_logprob == pytest.approx(want_prompt, rel=1e-5, abs=1e-6)
    # without the prompt's logprobs, the answer's bits are the same
    assert score_exchange(tiny.model, prompt, answer, answer_bytes).answer_bits == pytest.approx(got.answer_bits,
                                                                                              rel=1e-6)


def test_probe_matches_greedy_generation_and_its_distributions(tiny):
    prompts = [_ids(n, n) for n in (3, 12, 20, 33)]
    probes = probe_first_tokens(tiny, prompts, tokens=6, batch=2)
    eos = tiny.tokenizer.eos_token_ids
    for prompt, probe in zip(prompts, probes):
        tokens = list(generate_tokens(tiny.model, prompt, SimpleSampling(max_tokens=6), eos))
        assert len(probe.logprobs) == len(probe.entropies) == len(tokens)
        logp = torch.log_softmax(full_logits(tiny.model, prompt + tokens)[len(prompt) - 1:].double(), dim=-1)
        for i, token in enumerate(tokens):
            assert probe.logprobs[i] == pytest.approx(float(logp[i, token]), abs=1e-4)
            assert probe.entropies[i] == pytest.approx(float(-(logp[i].exp() * logp[i]).sum()), abs=1e-4)


def test_reference_is_cut_at_the_end_of_its_last_kept_token(tiny):
    assert cut_reference(tiny.tokenizer, "w3 w4   w5 w6", 2) == ("w3 w4", True)
    assert cut_reference(tiny.tokenizer, "w3 w4", 2) == ("w3 w4", False)


def _record(i: int, answer: str = "w5 w6 w7 w8") -> dict:
    return {"id": f"r{i}", "conversations": [{"from": "human", "value": f"w{3 + i % 50}"},
                                             {"from": "gpt", "value": answer}]}


def test_workload_reads_only_its_slice_and_skips_short_references(tiny):
    records = [_record(i) for i in range(ROUTING_HELDOUT_START)]
    records += [_record(ROUTING_HELDOUT_START, "w5"), *(_record(ROUTING_HELDOUT_START + i) for i in range(1, 4))]
    caps = WorkloadCaps(max_prompt_tokens=64, max_reference_tokens=3, min_reference_tokens=2)
    got = load_routing_prompts(tiny.tokenizer, tiny.chat_template, 3, caps, records=iter(records))
    assert [p.record_index for p in got] == [ROUTING_HELDOUT_START + i for i in (1, 2, 3)]
    assert all(p.reference == "w5 w6 w7" and p.reference_truncated for p in got)
    with pytest.raises(WorkloadError):
        load_routing_prompts(tiny.tokenizer, tiny.chat_template, 4, caps, records=iter(records))


def test_speed_measurements_count_the_tokens_they_time(tiny):
    prompts = [_ids(n, n) for n in (5, 9, 14)]
    speed = measure_batch(tiny, prompts, decode_tokens=4)
    assert speed.batch == 3
    assert min(speed.prefill_tokens_per_s, speed.decode_tokens_per_s, speed.prefill_tokens_per_s_full_cpu,
               speed.decode_tokens_per_s_full_cpu) > 0
    timer = SingleStreamTimer(tiny, prompts, new_tokens=5, k=3)
    timing = timer.time(prompts[1])
    assert timing.prompt_tokens == 9
    assert 0 < timing.ttft_ms <= timing.time_to_k_ms and timing.tpot_ms > 0
    assert timer.engine.num_requests == 0 and timer.engine.block_manager.num_used_blocks == 0
    best = best_round([speed, BatchSpeed(3, 1.0, 1e9, 1.0, 1.0, 0.5, 2.0)])
    assert best.decode_tokens_per_s == 1e9 and best.prefill_tokens_per_s == speed.prefill_tokens_per_s
