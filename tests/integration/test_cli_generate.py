"""`tiergate generate --tier T` runs the tier's own engine, as `serve` builds it: for the default
config's `small` tier, SmolLM2's GGUF blocks with int8 activations (w4a8-gguf) and an int8 KV
cache, so that it answers as the served tier does; `--model` runs a model as given."""

from __future__ import annotations

import pytest

from engines.llm_engine import LLMEngine
from engines.loaded_model import load_model
from engines.quantization.dense_prefill import block_linears
from engines.sampling_params import SamplingParams
from engines.simple_generate import SimpleSampling, generate_tokens
from gateway.cli import commands
from gateway.cli.main import main
from gateway.tiers import embedded_load
from policies.config import load_config

pytestmark = pytest.mark.slow

PROMPT = "Name the capital city of Italy."


def _ids(loaded) -> list[int]:
    return loaded.tokenizer.encode(loaded.chat_template.render([{"role": "user", "content": PROMPT}]))


def _greedy_text(loaded, max_tokens: int) -> str:
    eos = loaded.tokenizer.eos_token_ids
    out = [t for t in generate_tokens(loaded.model, _ids(loaded), SimpleSampling(max_tokens=max_tokens), eos)
           if t not in eos]
    return loaded.tokenizer.decode(out)


@pytest.fixture
def engines(monkeypatch) -> list:
    """The engines the CLI's generate builds for a tier."""
    seen = []
    build = embedded_load.engine_on

    def recording(*args, **kwargs):
        engine = build(*args, **kwargs)
        seen.append(engine)
        return engine

    monkeypatch.setattr(embedded_load, "engine_on", recording)
    return seen


@pytest.fixture
def models(monkeypatch) -> list:
    """The models the CLI's generate runs token by token (a model named with --model)."""
    seen = []

    def recording(model, *args, **kwargs):
        seen.append(model)
        return generate_tokens(model, *args, **kwargs)

    monkeypatch.setattr(commands, "generate_tokens", recording)
    return seen


def test_generate_runs_the_tiers_own_engine(capsys, engines, models):
    assert main(["generate", "--config", "config/default.yaml", "--tier", "small", "--dtype", "float32",
                 "--max-tokens", "12", PROMPT]) == 0
    printed = capsys.readouterr().out.strip()
    (engine,) = engines
    assert not models
    model = engine.loaded.model
    assert len(block_linears(model)) == 4 * model.config.num_hidden_layers
    assert model.quantized_head is not None          # the GGUF's Q8_0 head
    assert engine.config.kv_cache_dtype == "int8"    # the tier's KV cache
    # The same answer as a second engine built as the served tier builds its own.
    settings = load_config("config/default.yaml").tiers["small"].model_copy(update={"dtype": "float32"})
    loaded, notes = embedded_load.load_tier_model("small", settings)
    served = LLMEngine(loaded, embedded_load.engine_config(settings, "int8", None))
    try:
        (tokens,) = served.generate([_ids(loaded)], SamplingParams(max_tokens=12, temperature=0))
    finally:
        served.shutdown()
    eos = loaded.tokenizer.eos_token_ids
    # Not a quality check: at int8 KV the first token of this answer is a near tie (0.05 nats
    # between "Il" and "The" on an Intel Xeon), which CPUs' rounding decides differently.
    assert printed and printed == loaded.tokenizer.decode([t for t in tokens if t not in eos]).strip()


def test_a_request_beyond_the_tiers_context_is_a_usage_error(capsys):
    assert main(["generate", "--config", "config/default.yaml", "--tier", "small", "--dtype", "float32",
                 "--max-tokens", "5000", PROMPT]) == 2
    err = capsys.readouterr().err
    assert "exceeds the context length 2048" in err and "Traceback" not in err


def test_a_model_named_on_the_command_line_runs_as_given(capsys, models):
    assert main(["generate", "--config", "config/default.yaml", "--tier", "small", "--model", "default",
                 "--dtype", "float32", "--max-tokens", "12", PROMPT]) == 0
    (model,) = models
    assert not block_linears(model) and model.quantized_head is None
    assert capsys.readouterr().out.strip() == _greedy_text(load_model("default", "float32"), 12).strip()
