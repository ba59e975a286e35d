"""The size bound on an answer's prompt scores: prompt tokens x (alternatives + 1) x the choices
that carry them, a 400 naming the field that asked."""

from __future__ import annotations

import pytest

from gateway.errors import GatewayError
from gateway.schema import ChatCompletionRequest, CompletionRequest
from gateway.tiers.prompt_echo import MAX_PROMPT_LOGPROB_ENTRIES, check_size, engine_prompt_logprobs


def _completion(**fields):
    return CompletionRequest.model_validate({"model": "m", "prompt": "x", **fields})


def test_the_engine_scores_with_the_larger_count_and_only_when_asked():
    assert engine_prompt_logprobs(_completion()) is None
    assert engine_prompt_logprobs(_completion(echo=True)) is None          # echo without logprobs: text only
    assert engine_prompt_logprobs(_completion(echo=True, logprobs=2, prompt_logprobs=5)) == 5
    assert engine_prompt_logprobs(_completion(logprobs=2)) is None


@pytest.mark.parametrize("fields,param", [({"echo": True, "logprobs": 20, "n": 16}, "logprobs"),
                                          ({"prompt_logprobs": 20, "n": 16}, "prompt_logprobs")])
def test_too_many_entries_are_a_400_naming_the_field(fields, param):
    body = _completion(**fields)
    tokens = MAX_PROMPT_LOGPROB_ENTRIES // (21 * 16)
    check_size(body, [[1] * tokens])
    with pytest.raises(GatewayError) as info:
        check_size(body, [[1] * (tokens + 1)])
    assert info.value.status == 400 and info.value.param == param


def test_a_chat_carries_its_prompt_scores_once_whatever_n():
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                 "n": 16, "prompt_logprobs": 20})
    check_size(body, [[1] * (MAX_PROMPT_LOGPROB_ENTRIES // 21)])


def test_only_the_first_choice_of_each_prompt_is_scored():
    """Its siblings share the scores and read the prompt from the prefix cache."""
    from types import SimpleNamespace

    from engines.request_limits import RequestLimits
    from gateway.tiers.embedded_jobs import engine_jobs

    call = SimpleNamespace(body=_completion(prompt=["a", "b"], echo=True, logprobs=1, n=3), scoring=None)
    engine = SimpleNamespace(max_model_len=64, check_request=lambda ids, params: None, tokenizer=None,
                             limits=RequestLimits(vocab_size=128, max_model_len=64, block_size=16, admissible_blocks=8))
    jobs = engine_jobs(call, [[1, 2], [3]], engine)
    assert [(i, p.prompt_logprobs) for i, _, p in jobs] == [(0, 1), (1, None), (2, None), (3, 1), (4, None), (5, None)]
