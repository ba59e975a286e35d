"""Numeric request fields at and past their bounds: the schema refuses what the engine cannot hold,
and whatever the schema lets through samples without raising."""

from __future__ import annotations

import json

import pytest
import torch

from gateway.errors import GatewayError
from gateway.schema import MAX_TOP_K, SEED_RANGE, ChatCompletionRequest, parse_body
from engines.sampler import Sampler
from engines.sampling_params import InvalidRequestError, SamplingParams
from engines.sequence import Sequence


def _chat(**fields) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}).encode()


@pytest.mark.parametrize("field, value", [
    ("top_k", 2 ** 63), ("top_k", MAX_TOP_K + 1), ("top_k", -2),
    ("seed", SEED_RANGE[1] + 1), ("seed", SEED_RANGE[0] - 1),
    ("max_tokens", 2 ** 63), ("max_completion_tokens", 2 ** 40),
    ("stop", ["x" * 5000]),
])
def test_out_of_range_fields_are_a_400_naming_the_field(field, value):
    with pytest.raises(GatewayError) as caught:
        parse_body(ChatCompletionRequest, _chat(**{field: value}))
    assert caught.value.status == 400 and caught.value.param.startswith(field)


@pytest.mark.parametrize("top_k", [MAX_TOP_K, 10 ** 6, 49_153])
@pytest.mark.parametrize("seed", [SEED_RANGE[0], SEED_RANGE[1], None])
def test_the_largest_accepted_values_sample_like_no_top_k(top_k, seed):
    body = parse_body(ChatCompletionRequest, _chat(top_k=top_k, seed=seed))
    logits = torch.randn(2, 64)
    params = SamplingParams(temperature=1.0, top_k=body.top_k, seed=body.seed).validate()
    seqs = [Sequence(str(i), [1], params) for i in range(2)]
    out = Sampler(seed=0)(logits, seqs)
    assert all(0 <= t < 64 for t in out.token_ids)
    # top_k past the vocabulary keeps every token: the same draws as with top_k off.
    again = Sampler(seed=0)(logits, [Sequence(str(i), [1], SamplingParams(temperature=1.0, seed=body.seed))
                                     for i in range(2)])
    if seed is not None:
        assert out.token_ids == again.token_ids


def test_the_engine_refuses_a_seed_past_64_bits():
    with pytest.raises(InvalidRequestError) as caught:
        SamplingParams(seed=SEED_RANGE[1] + 1).validate()
    assert caught.value.param == "seed"
