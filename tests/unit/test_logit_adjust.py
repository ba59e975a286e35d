"""A request's own logit adjustments (allowed_token_ids, bad_words, logit_bias, min_tokens,
repetition / frequency / presence penalties) against direct computations and transformers' processors, in plain sampling and in
speculative verification, and their validation."""

from __future__ import annotations

import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from engines.bad_words import bad_words_token_ids
from engines.grammar.spec import GrammarSpec
from engines.request_limits import RequestLimits
from engines.sampler import Sampler
from engines.sampling_params import InvalidRequestError, SamplingParams
from engines.sequence import Sequence
from engines.spec.verify import SpecGroup, verify

V, EOS, STOP = 40, 39, 7


def _logits(rows: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 3


def _seq(prompt=(1, 2), output=(), temperature=0.0, **params) -> Sequence:
    return Sequence("r", list(prompt), SamplingParams(temperature=temperature, max_tokens=32, **params),
                    output_ids=list(output), eos_token_ids=frozenset({EOS}))


@pytest.mark.parametrize("penalty", [0.7, 1.3, 2.5])
def test_repetition_penalty_equals_transformers_over_prompt_and_output(penalty):
    logits = _logits(seed=4)
    seq = _seq(prompt=[3, 5, 5, 11], output=[11, 20, 3], repetition_penalty=penalty)
    expected = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([seq.all_token_ids]), logits.clone())
    assert torch.allclose(Sampler().adjust(logits, [seq]), expected)


def test_logit_bias_is_added_to_the_listed_tokens_only():
    logits = _logits(2, seed=1)
    seqs = [_seq(logit_bias={4: 100.0, 9: -2.5}), _seq()]
    out = Sampler().adjust(logits, seqs)
    expected = logits.clone()
    expected[0, 4] += 100.0
    expected[0, 9] -= 2.5
    assert torch.equal(out, expected)
    assert Sampler()(logits, seqs).token_ids == [4, int(logits[1].argmax())]


def test_frequency_and_presence_penalties_read_the_output_only():
    logits = _logits(seed=2)
    seq = _seq(prompt=[6, 6], output=[5, 5, 8], frequency_penalty=0.5, presence_penalty=0.25)
    expected = logits.clone()
    expected[0, 5] -= 2 * 0.5 + 0.25
    expected[0, 8] -= 0.5 + 0.25
    assert torch.allclose(Sampler().adjust(logits, [seq]), expected)


def test_min_tokens_bans_eos_and_stop_tokens_until_reached():
    logits = torch.zeros(1, V)
    logits[0, EOS], logits[0, STOP], logits[0, 12] = 9.0, 8.0, 1.0
    sampler = Sampler()
    for n in range(3):
        seq = _seq(output=[1] * n, min_tokens=3, stop_token_ids=[STOP, 10_000])     # an id past the vocab is harmless
        assert sampler(logits, [seq]).token_ids == [12]
    assert sampler(logits, [_seq(output=[1] * 3, min_tokens=3)]).token_ids == [EOS]
    # ignore_eos: EOS is an ordinary token, min_tokens does not touch it
    assert sampler(logits, [_seq(min_tokens=3, ignore_eos=True)]).token_ids == [EOS]


def test_min_tokens_done_leaves_the_batch_uncopied():
    logits = _logits(2)
    seqs = [_seq(output=[1] * 3, min_tokens=3), _seq()]
    assert Sampler().adjust(logits, seqs) is logits


def test_a_mask_that_would_leave_no_token_gives_way():
    """The request's own constraints contradict each other: the row keeps a token it allows
    rather than sampling from nothing (greedy would take token 0, sampling a NaN distribution)."""
    logits = _logits(seed=8)
    for temperature in (0.0, 1.0):
        seq = _seq(allowed_token_ids=(EOS,), min_tokens=4, temperature=temperature)
        assert Sampler(seed=0)(logits, [seq]).token_ids == [EOS]
        seq = _seq(output=[3], allowed_token_ids=(3, 4), bad_words_token_ids=((3,), (3, 4)), temperature=temperature)
        assert Sampler(seed=0)(logits, [seq]).token_ids[0] in (3, 4)


def test_the_token_sets_become_tensors_once():
    seq = _seq(output=[5], allowed_token_ids=(3, 4, 5), bad_words_token_ids=((4,),), logit_bias={3: 1.0},
               repetition_penalty=1.2, min_tokens=3)
    sampler = Sampler()
    sampler.adjust(_logits(), [seq])
    cache = seq.adjust_cache
    assert cache is not None and cache.allowed.tolist() == [3, 4, 5] and cache.stop.tolist() == [EOS]
    sampler.adjust(_logits(seed=1), [seq])
    assert seq.adjust_cache is cache


def test_min_tokens_leaves_a_grammar_that_can_only_end():
    """A constrained row whose grammar allows nothing but stopping keeps its stop token: the
    ban would leave no token at all."""
    logits = torch.full((1, V), float("-inf"))
    logits[0, EOS] = 0.0
    grammar = GrammarSpec.json_object()
    seq = _seq(min_tokens=5, grammar=grammar)
    sampler = Sampler()
    assert torch.equal(sampler.adjust(logits, [seq]), logits)
    logits[0, 3] = -1.0        # another way on: the ban applies
    assert sampler(logits, [_seq(min_tokens=5, grammar=grammar)]).token_ids == [3]


def test_verification_bans_stopping_at_the_drafts_before_min_tokens():
    """Row j of a speculating sequence is its output plus drafts[:j]: EOS drafted before
    min_tokens is rejected, and allowed from the position that reaches it."""
    rows = torch.zeros(3, V)
    rows[:, EOS], rows[:, 12] = 5.0, 1.0
    sampler = Sampler()
    seq = _seq(output=[1], min_tokens=2)
    (v,) = verify(rows, [SpecGroup(seq, 0, [EOS, 12], None)], sampler)
    assert v.num_accepted == 0 and v.tokens == [12]
    (v,) = verify(rows, [SpecGroup(seq, 0, [12, EOS], None)], sampler)
    assert v.num_accepted == 2 and v.tokens == [12, EOS, EOS]


def test_verification_applies_the_bias_and_repetition_penalty_of_each_position():
    rows = torch.zeros(3, V)
    rows[:, 20], rows[:, 21] = 3.0, 2.0
    seq = _seq(prompt=[1], repetition_penalty=2.0, logit_bias={22: 2.5})
    # position 0: 20 leads (3 > 2.5); position 1: 20 seen -> 1.5, so 22 (2.5) leads; then 21
    (v,) = verify(rows, [SpecGroup(seq, 0, [20, 22], None)], Sampler())
    assert v.tokens == [20, 22, 21]


def test_allowed_token_ids_keep_only_those_and_a_bias_cannot_bring_others_back():
    logits = _logits(seed=6)
    seq = _seq(allowed_token_ids=(3, 17, 30), logit_bias={5: 100.0})
    out = Sampler().adjust(logits, [seq])
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [3, 17, 30]
    assert torch.equal(out[0, [3, 17, 30]], logits[0, [3, 17, 30]])
    sampler = Sampler(seed=1)
    picks = {sampler(logits, [Sequence("s", [1], SamplingParams(temperature=2.0, allowed_token_ids=(3, 17, 30)))]).token_ids[0]
             for _ in range(100)}
    assert picks <= {3, 17, 30} and len(picks) > 1


def test_bad_words_ban_the_token_that_would_complete_them():
    logits = torch.zeros(1, V)
    logits[0, 9] = 5.0
    words = ((9,), (4, 9), (2, 3, 11))          # 9 alone is banned wherever; 11 only after 2, 3
    seq = _seq(output=[2, 3], bad_words_token_ids=words[1:])
    assert Sampler().adjust(logits, [seq])[0, 11] == float("-inf")
    assert Sampler().adjust(logits, [seq])[0, 9] == 5.0                 # the output does not end with 4
    seq = _seq(output=[1, 4], bad_words_token_ids=words[1:])
    out = Sampler().adjust(logits, [seq])
    assert out[0, 9] == float("-inf") and out[0, 11] == 0.0
    assert Sampler()(logits, [_seq(output=[7], bad_words_token_ids=words[:1])]).token_ids != [9]


def test_a_grammar_row_left_with_nothing_keeps_the_grammar():
    logits = torch.full((1, V), float("-inf"))
    logits[0, 4] = 0.0
    seq = _seq(allowed_token_ids=(5, 6), bad_words_token_ids=((4,),), grammar=GrammarSpec.json_object())
    assert torch.equal(Sampler().adjust(logits, [seq]), logits)


@pytest.mark.parametrize("kwargs,param", [
    ({"repetition_penalty": 0.0}, "repetition_penalty"), ({"repetition_penalty": 101.0}, "repetition_penalty"),
    ({"min_tokens": 33}, "min_tokens"), ({"min_tokens": -1}, "min_tokens"),
    ({"logit_bias": {3: 101.0}}, "logit_bias"), ({"logit_bias": {-1: 1.0}}, "logit_bias"),
    ({"logit_bias": {i: 1.0 for i in range(1025)}}, "logit_bias"),
    ({"allowed_token_ids": ()}, "allowed_token_ids"), ({"allowed_token_ids": (-1,)}, "allowed_token_ids"),
    ({"bad_words_token_ids": ((),)}, "bad_words"), ({"bad_words_token_ids": ((1,) * 16385,)}, "bad_words"),
])
def test_invalid_adjustments_name_the_field(kwargs, param):
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(max_tokens=32, **kwargs).validate()
    assert info.value.param == param


@pytest.mark.parametrize("field", ["logit_bias", "allowed_token_ids"])
def test_a_token_past_the_vocabulary_is_refused(field):
    limits = RequestLimits(vocab_size=V, max_model_len=128, block_size=16, admissible_blocks=8)
    ids = {"logit_bias": lambda t: {t: 1.0}, "allowed_token_ids": lambda t: (1, t)}[field]
    limits.check([1], SamplingParams(**{field: ids(V - 1)}))
    with pytest.raises(InvalidRequestError) as info:
        limits.check([1], SamplingParams(**{field: ids(V)}))
    assert info.value.param == field


def test_bad_words_are_read_in_both_spellings_where_the_tokenizer_has_them(real_fp32):
    tok = real_fp32.tokenizer
    words = bad_words_token_ids(tok, ["  Paris", "", "hello world"])
    assert words == (tuple(tok.encode("Paris", add_special_tokens=False)), tuple(tok.encode(" Paris", add_special_tokens=False)),
                     tuple(tok.encode("hello world", add_special_tokens=False)),
                     tuple(tok.encode(" hello world", add_special_tokens=False)))
    assert words[0] != words[1] and len(words[0]) == len(words[1])


def test_a_space_of_its_own_is_not_a_second_spelling(tmp_path):
    """A byte-level vocabulary without leading-space tokens spells ' Q' as two tokens: only 'Q' is banned."""
    from engines.tokenizer import TextTokenizer
    from tests.tiny_models import write_tiny_byte_checkpoint

    write_tiny_byte_checkpoint(tmp_path)
    tok = TextTokenizer.from_file(tmp_path / "tokenizer.json", {})
    assert bad_words_token_ids(tok, ["Q"]) == ((tok.encode("Q", add_special_tokens=False)[0],),)
