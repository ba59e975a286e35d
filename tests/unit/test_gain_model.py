"""The learned router on the serving side: prompt features, the gain model file (refused when it
is not one this version can read), the config that loads it, and the need it adds."""

from __future__ import annotations

import json
import math

import pytest

from policies.classify import Classifier, RequestFeatures
from policies.config import ConfigError, load_config, parse_config
from policies.gain_model import (BUNDLED_DIR, FORMAT, GainModel, GainModelError, PrefillWeights, load_gain_model,
                                 resolve_gain_model_path)
from policies.prompt_features import FEATURES_VERSION, MAX_WORDS, prompt_features, prompt_vector
from policies.request_signals import code_signal
from policies.route import Router


def _model_json(weights: dict, bias: float = 0.0, **extra) -> dict:
    return {"format": FORMAT, "features_version": FEATURES_VERSION, "bias": bias, "weights": weights, **extra}


def test_features_name_words_openings_lengths_and_detector_verdicts():
    text = "Write a Python function that reverses a list, please?"
    f = prompt_features(text, code_signal(text))
    assert f["open0:write"] == 1.0 and f["open1:a"] == 1.0
    assert f["w:python"] == f["w:reverses"] == 1.0
    assert f["question_mark"] == 1.0 and f["code_signal"] == 1.0
    assert "non_english_signal" not in f
    assert sum(1 for k in f if k.startswith("chars:")) == 1
    spanish = "¿Cuál es la capital de Francia y por qué es tan famosa en el mundo?"
    es = prompt_features(spanish, code_signal(spanish))
    assert es["non_english_signal"] == 1.0 and "code_signal" not in es


def test_features_are_bounded_on_a_huge_prompt():
    text = " ".join(f"word{i}" for i in range(100_000))
    f = prompt_features(text, code_signal(text))
    assert sum(1 for k in f if k.startswith("w:")) == MAX_WORDS


def test_prediction_is_bias_plus_the_weights_of_present_features():
    model = GainModel.from_json(_model_json({"w:python": 0.25, "open0:write": -0.05, "w:absent": 9.0}, bias=0.01))
    # the vector is scaled to unit length: each of the prompt's n features counts 1/sqrt(n)
    n = len(prompt_features("write python", None))
    assert model.predict("write python", None) == pytest.approx(0.01 + (0.25 - 0.05) / math.sqrt(n))
    assert model.predict("hello there", None) == pytest.approx(0.01)
    assert math.fsum(v * v for v in prompt_vector("write python", None).values()) == pytest.approx(1.0)


@pytest.mark.parametrize("data, why", [
    ({"format": "other"}, "not a gain model"),
    (_model_json({}) | {"features_version": FEATURES_VERSION + 1}, "fit it again"),
    (_model_json({"w:x": float("nan")}), "finite"),
    (_model_json({"w:x": 1.0}, bias="0"), "finite"),
    (_model_json({"w:x": True}), "finite"),
    ([1, 2], "not a gain model"),
])
def test_a_file_that_is_not_a_usable_gain_model_is_refused_with_a_reason(data, why):
    with pytest.raises(GainModelError, match=why):
        GainModel.from_json(data)


def test_round_trip_through_json_keeps_every_weight(tmp_path):
    model = GainModel(0.02, {"w:a": 0.1, "w:b": -0.3}, "s", "l", {"labels": 10})
    path = tmp_path / "m.json"
    path.write_text(json.dumps(model.to_json()))
    assert load_gain_model(path) == model


def test_a_prefill_part_round_trips_and_adds_its_dot_product(tmp_path):
    model = GainModel(0.1, {"w:python": 0.2}, "s", "l", {}, PrefillWeights("smollm2", (0.5, -1.0)))
    path = tmp_path / "m.json"
    path.write_text(json.dumps(model.to_json()))
    loaded = load_gain_model(path)
    assert loaded == model and loaded.reads_prefill
    assert loaded.predict_with_prefill(0.1, [2.0, 0.5]) == pytest.approx(0.1 + 1.0 - 0.5)
    with pytest.raises(GainModelError, match="hidden state of 3 values; the gain model reads 2"):
        loaded.predict_with_prefill(0.1, [1.0, 2.0, 3.0])
    assert not GainModel(0.0, {}).reads_prefill


def test_prefill_rows_split_the_weights_and_round_trip(tmp_path):
    """Rows back from the last prompt token: the weights are one block per row, in that order."""
    model = GainModel(0.0, {}, "s", "l", {}, PrefillWeights("smollm2", (1.0, 0.0, 0.0, 2.0), (0, 5)))
    assert model.prefill.row_size == 2
    path = tmp_path / "m.json"
    path.write_text(json.dumps(model.to_json()))
    loaded = load_gain_model(path)
    assert loaded == model and loaded.prefill.rows == (0, 5)
    assert loaded.predict_with_prefill(0.0, [3.0, 9.0, 9.0, 0.5]) == pytest.approx(3.0 + 1.0)
    # A file written before rows existed reads the last token only.
    older = GainModel.from_json(_model_json({}, prefill={"model": "m", "weights": [0.1, 0.2]}))
    assert older.prefill.rows == (0,) and older.prefill.row_size == 2


@pytest.mark.parametrize("rows", [[], [0, 0], [-1], [32], [0, 1, 2, 3, 4], [0, 1, 2], "0", [True]])
def test_prefill_rows_out_of_bounds_or_not_splitting_the_weights_are_refused(rows):
    with pytest.raises(GainModelError, match="prefill"):
        GainModel.from_json(_model_json({}, prefill={"model": "m", "weights": [0.1, 0.2, 0.3, 0.4], "rows": rows}))


@pytest.mark.parametrize("prefill", [{"weights": []}, {"weights": [1.0, float("inf")]}, {"weights": "1,2"}, [1.0]])
def test_a_broken_prefill_part_is_refused(prefill):
    with pytest.raises(GainModelError, match="prefill part"):
        GainModel.from_json(_model_json({}, prefill=prefill))


PREFILL_CONFIG = """
auth: {enabled: false}
tiers:
  small: {}
  large: {}
models:
  auto: {chain: [small], cascade: {to: large, signal: predicted_gain, threshold: 0.1}}
classification:
  gain_model: {file: GAIN}
"""


def test_a_predicted_gain_cascade_needs_a_model_that_reads_the_prefill_and_large_gain_one_that_does_not(tmp_path):
    (tmp_path / "text.json").write_text(json.dumps(_model_json({"w:python": 0.3})))
    (tmp_path / "prefill.json").write_text(json.dumps(_model_json({}, prefill={"model": "m", "weights": [0.1]})))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(PREFILL_CONFIG.replace("GAIN", "prefill.json"))
    loaded = load_config(cfg)
    assert Classifier(loaded.classification).gain_threshold is None     # no large_gain from a partial prediction
    cfg.write_text(PREFILL_CONFIG.replace("GAIN", "text.json"))
    with pytest.raises(ConfigError, match=r"models\.auto\.cascade: signal predicted_gain needs"):
        load_config(cfg)
    cfg.write_text(CONFIG.replace("GAIN", "prefill.json"))
    with pytest.raises(ConfigError, match="large_gain needs classification.gain_model with a text-only model"):
        load_config(cfg)


def test_names_resolve_to_bundled_files_and_paths_to_the_config_folder(tmp_path):
    assert resolve_gain_model_path("smollm2-qwen2.5-coder") == BUNDLED_DIR / "smollm2-qwen2.5-coder.json"
    assert resolve_gain_model_path("models/m.json", tmp_path) == tmp_path / "models" / "m.json"
    assert resolve_gain_model_path("/abs/m.json", tmp_path).as_posix() == "/abs/m.json"


CONFIG = """
auth: {enabled: false}
tiers:
  small: {}
  large: {}
models:
  auto: {chain: [small, large]}
classification:
  gain_model: {file: GAIN, threshold: 0.05}
routing:
  rules:
    - {name: gain, match: {needs: [large_gain]}, chain: [large, small]}
"""


def _features(gain: float | None) -> RequestFeatures:
    return RequestFeatures("chat", "auto", "t", "standard", False, predicted_gain=gain)


def test_the_config_loads_the_model_beside_it_and_routes_predicted_gains_to_large(tmp_path):
    (tmp_path / "gain.json").write_text(json.dumps(_model_json({"w:python": 0.3})))
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(CONFIG.replace("GAIN", "gain.json"))
    cfg = load_config(cfg_path)
    classifier, router = Classifier(cfg.classification), Router(cfg.models, cfg.routing.rules)
    gain = classifier.predict_gain("fix my python loop", None)
    assert gain == pytest.approx(0.3 / math.sqrt(len(prompt_features("fix my python loop", None))))
    verdict = classifier.classify(_features(gain))
    assert "large_gain" in verdict.needs
    assert any(f"large_gain (predicted {gain:+.3f} bpb)" in r for r in verdict.reasons)
    assert router.route("t", "standard", "auto", verdict.profile, verdict.needs).chain == ("large", "small")
    below = classifier.classify(_features(classifier.predict_gain("tell me a story", None)))
    assert "large_gain" not in below.needs
    assert router.route("t", "standard", "auto", below.profile, below.needs).chain == ("small", "large")


def test_without_a_gain_model_nothing_is_predicted():
    classifier = Classifier(parse_config("auth: {enabled: false}\ntiers: {a: {}}\n").classification)
    assert classifier.gain_model is None and classifier.predict_gain("anything", None) is None
    assert "large_gain" not in classifier.classify(_features(None)).needs


def test_a_missing_or_broken_gain_model_fails_the_config_with_its_field(tmp_path):
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(CONFIG.replace("GAIN", "missing.json"))
    with pytest.raises(ConfigError, match=r"classification\.gain_model: no gain model at .*missing\.json"):
        load_config(cfg_path)
    (tmp_path / "bad.json").write_text("{not json")
    cfg_path.write_text(CONFIG.replace("GAIN", "bad.json"))
    with pytest.raises(ConfigError, match=r"classification\.gain_model: cannot read"):
        load_config(cfg_path)


def test_the_bundled_model_reads_smollm2s_prefill_and_the_default_cascades_on_it():
    """Its decisions on real prompts need the small model's prefill: tests/integration/
    test_default_routing.py makes them through `tiergate serve`."""
    root = BUNDLED_DIR.parents[1]
    cfg = load_config(root / "config" / "default.yaml")
    model = cfg.classification.gain_model.model
    # SmolLM2's hidden states (576 values) at its last prompt token and at <|im_end|>, 5 rows before
    assert model.reads_prefill and model.prefill.rows == (0, 5) and model.prefill.row_size == 576
    assert model.trained["labels"] >= 2000
    cascades = {r.name: r.cascade for r in cfg.routing.rules if r.cascade is not None}
    assert set(cascades) == {"latency", "throughput"}
    for cascade in cascades.values():
        assert cascade.signal == "predicted_gain"
        assert cascade.threshold == pytest.approx(model.trained["threshold_at_share"], abs=5e-4)
