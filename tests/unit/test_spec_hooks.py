"""Speculative decoding joins the target through public ways in only: the runner's forward
hooks and attention wrapper, and the model's `share_embedding_with`. Nothing under
engines/spec/ assigns an attribute of a runner or a model, and the engine advances a
sequence's computed tokens in one place."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch

import engines
from engines.attention.paged import PagedAttention
from engines.engine_config import EngineConfig
from engines.llm_engine import LLMEngine
from engines.loaded_model import load_model
from engines.model_runner import ModelRunner
from engines.sampler import Sampler
from engines.sampling_params import SamplingParams
from engines.scheduler import ScheduledSeq
from engines.sequence import Sequence
from engines.spec.config import SpeculativeConfig
from engines.spec.kv_mirror import MirroredAttention
from engines.spec.speculator import Speculator
from engines.stats import EngineStats
from tests.tiny_models import write_tiny_checkpoint

ENGINES = Path(engines.__file__).parent
SPEC_DIR = ENGINES / "spec"
# head dim 64 (the int8 KV kernels' size), tied embeddings: the self-draft shares the head
TINY = {"hidden_size": 128, "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2,
        "tie_word_embeddings": True}


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-hooks")
    write_tiny_checkpoint(path, seed=5, **TINY)
    return path


def _engine(loaded, spec=None) -> LLMEngine:
    return LLMEngine(loaded, EngineConfig(kv_cache_memory_bytes=2**20, max_num_batched_tokens=32, max_num_seqs=4,
                                          speculative=spec))


def _spec(method, path):
    extra = {"draft_model": str(path), "draft_kv_cache_dtype": None} if method == "draft" else {}
    return SpeculativeConfig(method=method, num_tokens=3, adaptive=False, **extra)


def _prompts():
    return [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], list(range(10, 45))]


@pytest.fixture
def writes_from_spec(monkeypatch):
    """Every attribute assignment made by code under engines/spec/ on a runner or a module."""
    writes = []

    def spying(original):
        def __setattr__(self, name, value):
            caller = Path(sys._getframe(1).f_code.co_filename)
            if caller.parent == SPEC_DIR:
                writes.append((type(self).__name__, name, caller.name))
            original(self, name, value)
        return __setattr__

    monkeypatch.setattr(ModelRunner, "__setattr__", spying(object.__setattr__), raising=False)
    monkeypatch.setattr(torch.nn.Module, "__setattr__", spying(torch.nn.Module.__setattr__))
    return writes


@pytest.mark.parametrize("method", ["ngram", "draft", "self"])
def test_spec_code_assigns_no_attribute_of_a_runner_or_a_model(tiny_path, method, writes_from_spec):
    loaded = load_model(tiny_path, "float32")
    engine = _engine(loaded, _spec(method, tiny_path))
    out = engine.generate(_prompts(), SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    assert [len(o) for o in out] == [6, 6]
    assert engine.stats.spec[method].verifications > 0
    assert writes_from_spec == []


def test_the_self_draft_is_wired_through_public_hooks(tiny_path):
    loaded = load_model(tiny_path, "float32")
    engine = _engine(loaded, _spec("self", tiny_path))
    runner, source = engine.runner, engine.speculator.source
    assert runner.hooks == (engine.speculator,)
    attn = runner.attn
    assert isinstance(attn, MirroredAttention) and isinstance(attn.inner, PagedAttention)
    assert attn.inner.pool is engine.pool and attn.draft_pool is source.pool
    assert source.runner.hooks == () and isinstance(source.runner.attn, PagedAttention)
    # One copy of the unquantized embedding and tied head: the draft's logits are the target's.
    assert source.model.embed_tokens is loaded.model.embed_tokens
    hidden = torch.randn(3, loaded.config.hidden_size)
    assert torch.equal(source.model.compute_logits(hidden), loaded.model.compute_logits(hidden))


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_other_sources_leave_the_target_attention_alone(tiny_path, method):
    engine = _engine(load_model(tiny_path, "float32"), _spec(method, tiny_path))
    assert engine.runner.hooks == (engine.speculator,)
    assert isinstance(engine.runner.attn, PagedAttention)


class _Recorder:
    def __init__(self):
        self.events = []

    def before_forward(self, scheduled):
        self.events.append(("before", scheduled, [s.num_tokens for s in scheduled]))

    def after_forward(self, scheduled, seconds):
        self.events.append(("after", scheduled, seconds))


def test_runner_hooks_run_around_every_forward_of_a_step(tiny_path):
    engine = _engine(load_model(tiny_path, "float32"))
    rec = _Recorder()
    engine.runner.add_hook(rec)
    engine.generate(_prompts(), SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    events = rec.events
    assert len(events) == 2 * engine.stats.steps
    for before, after in zip(events[::2], events[1::2]):
        assert (before[0], after[0]) == ("before", "after")
        assert before[1] is after[1] and after[2] > 0        # the same plan; the forward's seconds
    assert events[0][2] == [10, 22]      # the first step's plan: two prefill chunks (32-token budget)


def _seq(outputs=1):
    seq = Sequence("s", [1, 2, 3], SamplingParams(max_tokens=100))
    seq.output_ids = [5] * outputs
    return seq


class _TimedSource:
    name = "ngram"

    def attach(self, target_runner):
        pass

    def propose(self, entries):
        for s, k in entries:
            s.draft_ids = [9] * k
        return 0.010


def test_speculator_hooks_draft_before_and_time_decode_forwards_only():
    spec = Speculator(SpeculativeConfig(method="ngram"), _TimedSource(), Sampler(), EngineStats(), 1000)
    decode = ScheduledSeq(_seq(), 4, 1, num_lookahead=2)
    spec.before_forward([decode])
    assert decode.draft_ids == [9, 9]
    spec.after_forward([decode, ScheduledSeq(_seq(0), 0, 3)], 1.0)       # a prefill chunk rode along
    assert spec.step_cost() == 0.05                                     # not a measure of a decode step
    spec.after_forward([decode], 0.020)
    assert abs(spec.step_cost() - (0.05 + 0.5)) < 1e-9                  # a draft step: half a target step


def _augmented_counts(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text())
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.AugAssign) and isinstance(inner.target, ast.Attribute) \
                        and inner.target.attr == "num_computed_tokens":
                    hits.append((node.name, inner.lineno))
    return hits


def test_computed_tokens_advance_in_one_place():
    files = [ENGINES / "llm_engine.py", ENGINES / "model_runner.py", *sorted(SPEC_DIR.glob("*.py"))]
    hits = {f.name: _augmented_counts(f) for f in files}
    assert [name for name, found in hits.items() if found] == ["llm_engine.py"]
    assert [name for name, _ in hits["llm_engine.py"]] == ["_advance_computed"]
