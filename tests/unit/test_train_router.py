"""Fitting the learned router: ridge on prompt features, its penalty chosen by cross-validated
gap recovered, and a threshold that sends the asked-for share of training prompts to large."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.routing.labels import PromptLabel, read_labels
from bench.routing.routers import RoutingTable, score_curve
from bench.routing.train_router import TrainOptions, fit_gain_model
from policies.gain_model import GainModel
from policies.request_signals import code_signal


def _label(i: int, small: float, large: float) -> PromptLabel:
    return PromptLabel(f"p{i}", i, small, large, 100, 10, 10, 20, 20)


def _synthetic(n: int = 240, seed: int = 0):
    """A third of the prompts name a topic the large model knows (gain ~0.3 bpb); the
    rest gain nothing on average. Filler words vary so no other feature carries the signal."""
    rng = np.random.default_rng(seed)
    filler = ["tell", "me", "about", "the", "weather", "story", "river", "music", "garden", "history"]
    texts, labels = [], []
    for i in range(n):
        words = list(rng.choice(filler, size=6))
        helped = i % 3 == 0
        if helped:
            words.insert(int(rng.integers(0, 6)), "quokka")
        gain = (0.3 if helped else 0.0) + float(rng.normal(0, 0.05))
        texts.append(" ".join(words))
        labels.append(_label(i, 0.6, 0.6 - gain))
    return texts, labels


def test_the_fitted_model_finds_the_word_that_predicts_the_gain_and_its_threshold_splits_the_share():
    texts, labels = _synthetic()
    options = TrainOptions(alphas=(0.3, 3.0), folds=4, min_prompts_per_feature=2)
    model, summary = fit_gain_model(texts, labels, options)
    assert max(model.weights, key=model.weights.get) == "w:quokka"
    assert model.weights["w:quokka"] > 0.2
    cv = summary["cv_gap_recovered"]
    assert cv["best"] > 0.9 and cv["random"] == pytest.approx(0.3) and cv["oracle"] >= cv["best"]
    assert summary["alpha"] in (0.3, 3.0) and summary["labels"] == len(labels)
    predicted = np.array([model.predict(t, code_signal(t)) for t in texts])
    share = float((predicted >= summary["threshold_at_share"]).mean())
    assert 0.25 <= share <= 0.4    # a third of the prompts carry the word; the threshold is just under them
    assert GainModel.from_json(json.loads(json.dumps(model.to_json()))) == model


def test_score_curve_sends_the_highest_scores_first_and_names_each_threshold():
    table = RoutingTable(np.array([1.0, 1.0, 1.0]), np.array([0.5, 1.0, 0.8]), np.zeros(3), np.zeros(3))
    curve = score_curve(table, np.array([0.9, 0.1, 0.5]))
    assert [p.share for p in curve] == pytest.approx([0, 1 / 3, 2 / 3, 1])
    assert [p.threshold for p in curve[1:]] == [0.9, 0.5, 0.1]
    assert curve[1].gap_recovered == pytest.approx(0.5 / 0.7)
    assert curve[2].gap_recovered == pytest.approx(1.0)


def test_label_files_are_read_whole_lines_only(tmp_path):
    path = tmp_path / "labels.jsonl"
    path.write_text(_label(1, 0.5, 0.4).as_json() + "\n" + _label(2, 0.5, 0.3).as_json()[:30])
    labels = read_labels(path)
    assert [lb.record_index for lb in labels] == [1]
    assert labels[0].gain == pytest.approx(0.1)
    assert read_labels(tmp_path / "absent.jsonl") == []
