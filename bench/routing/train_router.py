"""`tiergate bench routing-train`: fit the learned router's gain model on labelled training
prompts (bench/routing/labels.py) and write it as a policies.gain_model file.

The model is ridge regression of each prompt's gain (small-tier minus large-tier bits per byte
of its reference) on policies.prompt_features, each prompt's vector scaled to unit length. Its
penalty is chosen by K-fold cross-validation on the training labels alone, judged the way the
routing benchmark judges a router: the quality gap recovered at a share of calls to large when
the prompts are ranked by predicted gain. The held-out slice is never read here. The threshold
written beside the model is the predicted gain above which `share` of the training prompts fall
(out-of-fold predictions, which spread as the predictions on unseen prompts do).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

import numpy as np
from rich.console import Console
from scipy import sparse
from sklearn.linear_model import Ridge
from sklearn.model_selection import KFold

from bench.datasets.sharegpt import _first_exchange, iter_sharegpt_records
from bench.routing.labels import PromptLabel, read_labels
from bench.routing.routers import RoutingTable, interpolate, score_curve
from bench.routing.workload import WorkloadError
from policies.gain_model import GainModel
from policies.prompt_features import FEATURES_VERSION, prompt_vector
from policies.request_signals import code_signal


@dataclass(frozen=True)
class TrainOptions:
    min_prompts_per_feature: int = 3     # rarer features are noise on a few thousand prompts
    alphas: tuple[float, ...] = (0.3, 1.0, 3.0, 10.0)
    folds: int = 5
    share: float = 0.30
    gain_clip: float = 1.0               # |gain| beyond this (bits per byte) is clipped: a few odd references
    seed: int = 0
    small: str = "smollm2-135m-instruct"
    large: str = "qwen2.5-coder-0.5b-instruct"


def question_texts(records: set[int]) -> dict[int, str]:
    """The first human turn of each named ShareGPT record."""
    out: dict[int, str] = {}
    last = max(records) if records else -1
    for index, record in enumerate(iter_sharegpt_records()):
        if index > last:
            break
        if index in records:
            exchange = _first_exchange(record)
            if exchange is not None:
                out[index] = exchange[0]
    return out


@dataclass(frozen=True)
class FeatureMatrix:
    matrix: sparse.csr_matrix
    names: list[str]


def featurise(texts: list[str], min_prompts: int, names: list[str] | None = None) -> FeatureMatrix:
    """Rows of prompt_vector; columns are the features seen in at least `min_prompts` texts
    (or exactly `names`, to featurise new texts for a fitted model)."""
    rows = [prompt_vector(t, code_signal(t)) for t in texts]
    if names is None:
        counts: dict[str, int] = {}
        for row in rows:
            for name in row:
                counts[name] = counts.get(name, 0) + 1
        names = sorted(n for n, c in counts.items() if c >= min_prompts)
    column = {n: i for i, n in enumerate(names)}
    data, indices, indptr = [], [], [0]
    for row in rows:
        for name, value in row.items():
            j = column.get(name)
            if j is not None:
                indices.append(j)
                data.append(value)
        indptr.append(len(indices))
    matrix = sparse.csr_matrix((np.array(data, dtype=np.float64), np.array(indices, dtype=np.int64),
                                np.array(indptr, dtype=np.int64)), shape=(len(texts), len(names)))
    return FeatureMatrix(matrix, names)


def _table(labels: list[PromptLabel]) -> RoutingTable:
    zeros = np.zeros(len(labels))
    return RoutingTable(np.array([lb.small_bpb for lb in labels]), np.array([lb.large_bpb for lb in labels]),
                        zeros, zeros)


def gap_at(table: RoutingTable, scores: np.ndarray, share: float) -> float:
    return interpolate(table, score_curve(table, scores), share).gap_recovered or 0.0


def cross_validated(texts: list[str], labels: list[PromptLabel], options: TrainOptions, alpha: float) -> np.ndarray:
    """Out-of-fold predicted gains: each fold's features and model come from the other folds only."""
    gains = np.clip(np.array([lb.gain for lb in labels]), -options.gain_clip, options.gain_clip)
    predicted = np.zeros(len(labels))
    folds = KFold(options.folds, shuffle=True, random_state=options.seed)
    for train, test in folds.split(texts):
        features = featurise([texts[i] for i in train], options.min_prompts_per_feature)
        model = Ridge(alpha=alpha).fit(features.matrix, gains[train])
        held = featurise([texts[i] for i in test], options.min_prompts_per_feature, features.names)
        predicted[test] = model.predict(held.matrix)
    return predicted


def fit_gain_model(texts: list[str], labels: list[PromptLabel], options: TrainOptions,
                   console: Console | None = None) -> tuple[GainModel, dict]:
    table = _table(labels)
    cv = {}
    best_alpha, best_gap, best_oof = None, -np.inf, None
    for alpha in options.alphas:
        oof = cross_validated(texts, labels, options, alpha)
        gap = gap_at(table, oof, options.share)
        cv[str(alpha)] = gap
        if console:
            console.log(f"alpha {alpha:g}: cross-validated gap recovered at {options.share:.0%} = {gap:.3f}")
        if gap > best_gap:
            best_alpha, best_gap, best_oof = alpha, gap, oof
    gains = np.clip(np.array([lb.gain for lb in labels]), -options.gain_clip, options.gain_clip)
    features = featurise(texts, options.min_prompts_per_feature)
    ridge = Ridge(alpha=best_alpha).fit(features.matrix, gains)
    weights = {n: round(float(w), 6) for n, w in zip(features.names, ridge.coef_) if abs(w) >= 1e-6}
    threshold = float(np.quantile(best_oof, 1 - options.share))
    summary = {
        "labels": len(labels), "features": len(features.names), "features_kept": len(weights),
        "features_version": FEATURES_VERSION, "alpha": best_alpha, "folds": options.folds,
        "cv_gap_recovered": {"share": options.share, "by_alpha": cv, "best": best_gap,
                             "random": options.share, "oracle": gap_at(table, table.gain, options.share)},
        "threshold_at_share": threshold,
        "options": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(options).items()
                    if k not in ("small", "large")},
    }
    return GainModel(round(float(ridge.intercept_), 6), weights, options.small, options.large, summary), summary


def run_train(labels_path: str, out_path: str, options: TrainOptions) -> int:
    console = Console(stderr=True)
    started = time.perf_counter()
    labels = read_labels(labels_path)
    if len(labels) < 5 * options.folds:
        raise WorkloadError(f"{labels_path} holds {len(labels)} labelled prompts: too few to fit and "
                            f"cross-validate a router ({5 * options.folds} at least)")
    texts_by_record = question_texts({lb.record_index for lb in labels})
    labels = [lb for lb in labels if lb.record_index in texts_by_record]
    texts = [texts_by_record[lb.record_index] for lb in labels]
    console.log(f"{len(labels)} labelled prompts; fitting ({options.folds}-fold CV over {len(options.alphas)} penalties)")
    model, summary = fit_gain_model(texts, labels, options, console)
    with open(out_path, "w", encoding="utf-8") as sink:
        json.dump(model.to_json(), sink, indent=1)
        sink.write("\n")
    console.log(f"wrote {out_path}: {summary['features_kept']} weights, alpha {summary['alpha']:g}, CV gap recovered "
                f"at {options.share:.0%} {summary['cv_gap_recovered']['best']:.3f} (random {options.share:.3f}, "
                f"oracle {summary['cv_gap_recovered']['oracle']:.3f}), threshold {summary['threshold_at_share']:.4f} "
                f"({time.perf_counter() - started:.0f} s)")
    return 0
