"""`tiergate bench routing-train`: fit the learned router's gain model on labelled training
prompts (bench/routing/labels.py) and write it as a policies.gain_model file.

The model is ridge regression of each prompt's gain (small-tier minus large-tier bits per byte
of its reference) on policies.prompt_features, each prompt's vector scaled to unit length, and,
unless told otherwise, on the small model's prompt hidden states (bench/routing/prefill_states.py:
the last prompt token's and that of the token closing the user's turn, which has read all of it),
each of their values standardised over the training prompts, the whole scaled by `scale / sqrt(size)`,
so that `scale` weighs the prefill against the text. The standardisation is folded into the
written weights and bias, so serving takes a plain dot product. Penalty and scale are chosen by
K-fold cross-validation on the training labels alone, judged the way the routing benchmark
judges a router: the quality gap recovered at a share of calls to large when the prompts are
ranked by predicted gain. The held-out slice is never read here. The threshold written beside
the model is the predicted gain above which `share` of the training prompts fall (out-of-fold
predictions, which spread as the predictions on unseen prompts do).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from scipy import sparse
from sklearn.linear_model import Ridge
from sklearn.model_selection import KFold

from bench.datasets.sharegpt import _first_exchange, iter_sharegpt_records
from bench.routing.labels import PromptLabel, read_labels
from bench.routing.routers import RoutingTable, interpolate, score_curve
from bench.routing.workload import WorkloadError
from policies.gain_model import GainModel, PrefillWeights
from policies.prompt_features import FEATURES_VERSION, prompt_vector
from policies.request_signals import code_signal


@dataclass(frozen=True)
class TrainOptions:
    min_prompts_per_feature: int = 3     # rarer features are noise on a few thousand prompts
    alphas: tuple[float, ...] = (0.3, 1.0, 3.0, 10.0)
    prefill_scales: tuple[float, ...] = (1.0, 1.5, 2.0)   # the prompt hidden state's weight beside the text
    # The prompt rows read, back from the last prompt token; None: the last token and the token
    # that closes the user's turn (ChatML's <|im_end|>: the template's closing tokens are
    # counted on the model).
    prefill_rows: tuple[int, ...] | None = None
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


@dataclass(frozen=True)
class Standardiser:
    """Per-value mean and spread of the training prompts' hidden states, and the block's scale."""
    mean: np.ndarray
    scale: np.ndarray      # multiplies (h - mean): scale_factor / (std * sqrt(size))

    @classmethod
    def fit(cls, states: np.ndarray, factor: float) -> Standardiser:
        return cls(states.mean(0), factor / ((states.std(0) + 1e-6) * np.sqrt(states.shape[1])))

    def apply(self, states: np.ndarray) -> np.ndarray:
        return (states - self.mean) * self.scale


def _design(text: FeatureMatrix, states: np.ndarray | None, standard: Standardiser | None) -> sparse.csr_matrix:
    if states is None:
        return text.matrix
    return sparse.hstack([text.matrix, sparse.csr_matrix(standard.apply(states))]).tocsr()


def _fit(texts: list[str], states: np.ndarray | None, gains: np.ndarray, options: TrainOptions, alpha: float,
         scale: float | None):
    features = featurise(texts, options.min_prompts_per_feature)
    standard = Standardiser.fit(states, scale) if states is not None else None
    ridge = Ridge(alpha=alpha).fit(_design(features, states, standard), gains)
    return features, standard, ridge


def cross_validated(texts: list[str], labels: list[PromptLabel], options: TrainOptions, alpha: float,
                    states: np.ndarray | None = None, scale: float | None = None) -> np.ndarray:
    """Out-of-fold predicted gains: each fold's features, standardisation and model come from
    the other folds only."""
    gains = np.clip(np.array([lb.gain for lb in labels]), -options.gain_clip, options.gain_clip)
    predicted = np.zeros(len(labels))
    folds = KFold(options.folds, shuffle=True, random_state=options.seed)
    for train, test in folds.split(texts):
        features, standard, ridge = _fit([texts[i] for i in train], None if states is None else states[train],
                                         gains[train], options, alpha, scale)
        held = featurise([texts[i] for i in test], options.min_prompts_per_feature, features.names)
        predicted[test] = ridge.predict(_design(held, None if states is None else states[test], standard))
    return predicted


def fit_gain_model(texts: list[str], labels: list[PromptLabel], options: TrainOptions,
                   console: Console | None = None, states: np.ndarray | None = None,
                   prefill_model: str = "", prefill_rows: tuple[int, ...] = (0,)) -> tuple[GainModel, dict]:
    """`states`: the small model's prompt hidden states at `prefill_rows`, concatenated, one row
    per label (None: text only)."""
    table = _table(labels)
    cv = {}
    best, best_gap, best_oof = None, -np.inf, None
    scales = options.prefill_scales if states is not None else (None,)
    for scale in scales:
        for alpha in options.alphas:
            oof = cross_validated(texts, labels, options, alpha, states, scale)
            gap = gap_at(table, oof, options.share)
            key = str(alpha) if scale is None else f"alpha {alpha:g}, scale {scale:g}"
            cv[key] = gap
            if console:
                console.log(f"{key}: cross-validated gap recovered at {options.share:.0%} = {gap:.3f}")
            if gap > best_gap:
                best, best_gap, best_oof = (alpha, scale), gap, oof
    alpha, scale = best
    gains = np.clip(np.array([lb.gain for lb in labels]), -options.gain_clip, options.gain_clip)
    features, standard, ridge = _fit(texts, states, gains, options, alpha, scale)
    n_text = len(features.names)
    coef = ridge.coef_
    weights = {n: round(float(w), 6) for n, w in zip(features.names, coef[:n_text]) if abs(w) >= 1e-6}
    bias = float(ridge.intercept_)
    prefill = None
    if standard is not None:
        dense = coef[n_text:] * standard.scale          # the standardisation folded into the weights
        bias -= float(dense @ standard.mean)
        prefill = PrefillWeights(prefill_model, tuple(float(w) for w in dense), prefill_rows)
    threshold = float(np.quantile(best_oof, 1 - options.share))
    summary = {
        "labels": len(labels), "features": n_text, "features_kept": len(weights),
        "features_version": FEATURES_VERSION, "alpha": alpha,
        "prefill": None if standard is None else {"model": prefill_model, "size": prefill.size, "rows": list(prefill_rows),
                                                  "scale": scale},
        "folds": options.folds,
        "cv_gap_recovered": {"share": options.share, "by_penalty": cv, "best": best_gap,
                             "random": options.share, "oracle": gap_at(table, table.gain, options.share)},
        "threshold_at_share": threshold,
        "options": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(options).items()
                    if k not in ("small", "large")},
    }
    return GainModel(round(bias, 6), weights, options.small, options.large, summary, prefill), summary


def run_train(labels_path: str, out_path: str, options: TrainOptions, prefill_model: str | None = "default",
              dtype: str = "float32", cache: str | None = None) -> int:
    """`prefill_model`: the small tier's model whose prompt hidden states join the text's
    features (None: a text-only model)."""
    console = Console(stderr=True)
    started = time.perf_counter()
    labels = read_labels(labels_path)
    if len(labels) < 5 * options.folds:
        raise WorkloadError(f"{labels_path} holds {len(labels)} labelled prompts: too few to fit and "
                            f"cross-validate a router ({5 * options.folds} at least)")
    texts_by_record = question_texts({lb.record_index for lb in labels})
    labels = [lb for lb in labels if lb.record_index in texts_by_record]
    texts = [texts_by_record[lb.record_index] for lb in labels]
    states, rows = None, (0,)
    if prefill_model is not None:
        from engines.loaded_model import load_model
        from bench.routing.prefill_states import prompt_hidden_states
        from bench.routing.scoring import template_tail_tokens
        console.log(f"small tier {prefill_model!r}: loading ({dtype}) for its prompt hidden states")
        loaded = load_model(prefill_model, dtype)
        rows = options.prefill_rows or (0, template_tail_tokens(loaded) - 1)
        console.log(f"prompt rows read, back from the last token: {', '.join(map(str, rows))}")
        by_record = prompt_hidden_states(loaded, {lb.record_index: texts_by_record[lb.record_index] for lb in labels},
                                         Path(cache) if cache else None, console, rows)
        states = np.stack([by_record[lb.record_index] for lb in labels])
    console.log(f"{len(labels)} labelled prompts; fitting ({options.folds}-fold CV over {len(options.alphas)} penalties"
                f"{'' if states is None else f' x {len(options.prefill_scales)} prefill scales'})")
    model, summary = fit_gain_model(texts, labels, options, console, states, options.small, rows)
    with open(out_path, "w", encoding="utf-8") as sink:
        json.dump(model.to_json(), sink, indent=1)
        sink.write("\n")
    console.log(f"wrote {out_path}: {summary['features_kept']} weights, alpha {summary['alpha']:g}, CV gap recovered "
                f"at {options.share:.0%} {summary['cv_gap_recovered']['best']:.3f} (random {options.share:.3f}, "
                f"oracle {summary['cv_gap_recovered']['oracle']:.3f}), threshold {summary['threshold_at_share']:.4f} "
                f"({time.perf_counter() - started:.0f} s)")
    return 0
