"""`tiergate generate --tier T` runs the tier's own weights, as `serve` loads them: for the default
config's `small` tier, SmolLM2's GGUF blocks with int8 activations (w4a8-gguf), not the
unquantized model."""

from __future__ import annotations

import pytest

from engines.loaded_model import load_model
from engines.quantization.build import quantize_loaded
from engines.simple_generate import SimpleSampling, generate_tokens
from engines.quantization.dense_prefill import block_linears
from gateway.cli import commands
from gateway.cli.main import main

pytestmark = pytest.mark.slow

PROMPT = "Name the capital city of Italy."


def _greedy_text(loaded, max_tokens: int) -> str:
    ids = loaded.tokenizer.encode(loaded.chat_template.render([{"role": "user", "content": PROMPT}]))
    eos = loaded.tokenizer.eos_token_ids
    out = [t for t in generate_tokens(loaded.model, ids, SimpleSampling(max_tokens=max_tokens), eos) if t not in eos]
    return loaded.tokenizer.decode(out)


@pytest.fixture
def models(monkeypatch) -> list:
    """The models the CLI's generate runs, as it passes them to generate_tokens."""
    seen = []

    def recording(model, *args, **kwargs):
        seen.append(model)
        return generate_tokens(model, *args, **kwargs)

    monkeypatch.setattr(commands, "generate_tokens", recording)
    return seen


def test_generate_runs_the_tiers_quantized_weights(capsys, models):
    quantized = load_model("default", "float32")
    quantize_loaded(quantized, "w4a8-gguf", 32)
    expected = _greedy_text(quantized, 12)
    assert main(["generate", "--config", "config/default.yaml", "--tier", "small", "--dtype", "float32",
                 "--max-tokens", "12", PROMPT]) == 0
    (model,) = models
    assert len(block_linears(model)) == 4 * model.config.num_hidden_layers
    assert model.quantized_head is not None          # the GGUF's Q8_0 head
    printed = capsys.readouterr().out.strip()
    assert printed == expected.strip() and "Rome" in printed


def test_a_model_named_on_the_command_line_runs_as_given(capsys, models):
    assert main(["generate", "--config", "config/default.yaml", "--tier", "small", "--model", "default",
                 "--dtype", "float32", "--max-tokens", "12", PROMPT]) == 0
    (model,) = models
    assert not block_linears(model) and model.quantized_head is None
    assert capsys.readouterr().out.strip() == _greedy_text(load_model("default", "float32"), 12).strip()
