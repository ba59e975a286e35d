"""A learned router's model: how much better (in bits per byte of a reference answer) the large
tier is predicted to answer a prompt than the small one, from the prompt's text and, where the
model has that part, from the small tier's prefill.

The prefill part is a weight vector over the small model's final hidden states at the prompt's
last token (the row its first token is sampled from) and, where the model says so, a few rows
before it: the small tier computes them for every request it starts, so the cascade reads them
with the first token and escalates before any byte is sent, at the cost of one small prefill
for the requests it hands over.

A linear model over policies.prompt_features (scaled to unit length), fitted by `tiergate bench routing-train` on
prompts scored on both tiers (RouteLLM's way: learn from per-prompt outcomes). It is a JSON
file of named weights, so it is read without running anything from it, and a prediction is a
few dictionary lookups. The file names the tiers it was fitted for and the feature version;
a file of another version is refused rather than read with features that mean something else.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from policies.prompt_features import FEATURES_VERSION, prompt_vector

BUNDLED_DIR = Path(__file__).parent / "gain_models"
# Rows near the prompt's end only: an engine computes each row back again on a cached prefix.
MAX_PREFILL_ROWS = 4
MAX_PREFILL_ROW_BACK = 32
FORMAT = "tiergate-gain-model"


class GainModelError(ValueError):
    """The file is not a gain model this version can use (one-line reason)."""


def check_prefill_rows(rows: tuple[int, ...]) -> None:
    """Raises GainModelError unless `rows` are 1 to MAX_PREFILL_ROWS distinct offsets in
    [0, MAX_PREFILL_ROW_BACK)."""
    if (not 0 < len(rows) <= MAX_PREFILL_ROWS or len(set(rows)) != len(rows)
            or any(not 0 <= r < MAX_PREFILL_ROW_BACK for r in rows)):
        raise GainModelError(f"a gain model's prefill rows must be 1 to {MAX_PREFILL_ROWS} distinct offsets "
                             f"in [0, {MAX_PREFILL_ROW_BACK})")


@dataclass(frozen=True)
class PrefillWeights:
    """Weights over the small model's final hidden states at a few prompt rows, concatenated:
    `rows` counts back from the last prompt token (0 = it; in a chat template the token that
    closes the user's turn is a few rows back). Any standardisation of the training features is
    folded into them and the model's bias."""
    model: str                  # the model whose hidden states they read (for people; checked by size)
    weights: tuple[float, ...]
    rows: tuple[int, ...] = (0,)

    def __post_init__(self) -> None:
        check_prefill_rows(self.rows)
        if len(self.weights) % len(self.rows):
            raise GainModelError(f"{len(self.weights)} prefill weights do not split into {len(self.rows)} rows")

    @property
    def size(self) -> int:
        return len(self.weights)

    @property
    def row_size(self) -> int:
        """The hidden size of the model it reads."""
        return len(self.weights) // len(self.rows)

    def dot(self, hidden) -> float:
        if len(hidden) != len(self.weights):
            raise GainModelError(f"a prompt hidden state of {len(hidden)} values; the gain model reads "
                                 f"{len(self.weights)} ({self.model})")
        return math.fsum(w * h for w, h in zip(self.weights, hidden))


@dataclass(frozen=True)
class GainModel:
    bias: float
    weights: dict[str, float]
    small: str = ""
    large: str = ""
    trained: dict = field(default_factory=dict)   # what it was fitted on (labels, penalty, CV figures)
    prefill: PrefillWeights | None = None

    @property
    def reads_prefill(self) -> bool:
        """Its prediction needs the small tier's prompt hidden state: a cascade signal, not a
        classification feature."""
        return self.prefill is not None

    def predict(self, text: str, code: str | None) -> float:
        """The text's part (with the bias): the whole prediction for a text-only model. `code`:
        request_signals.code_signal of `text` (a feature; the caller has it)."""
        weights = self.weights
        return self.bias + sum(weights.get(name, 0.0) * value for name, value in prompt_vector(text, code).items())

    def predict_with_prefill(self, text_part: float, hidden) -> float:
        """The whole prediction: predict()'s value plus the prefill part on `hidden`."""
        if self.prefill is None:
            return text_part
        return text_part + self.prefill.dot(hidden)

    def to_json(self) -> dict:
        return {"format": FORMAT, "features_version": FEATURES_VERSION, "small": self.small, "large": self.large,
                "bias": self.bias, "trained": self.trained,
                "weights": dict(sorted(self.weights.items(), key=lambda kv: -abs(kv[1]))),
                **({"prefill": {"model": self.prefill.model, "rows": list(self.prefill.rows),
                                "weights": list(self.prefill.weights)}}
                   if self.prefill is not None else {})}

    @classmethod
    def from_json(cls, data) -> GainModel:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise GainModelError(f"not a gain model (format is not {FORMAT!r})")
        if data.get("features_version") != FEATURES_VERSION:
            raise GainModelError(f"fitted on features version {data.get('features_version')!r}; this tiergate "
                                 f"computes version {FEATURES_VERSION}: fit it again")
        weights = data.get("weights")
        bias = data.get("bias")
        if not isinstance(weights, dict) or not _finite(bias) or not all(
                isinstance(k, str) and _finite(v) for k, v in weights.items()):
            raise GainModelError("a gain model needs a finite bias and a map of feature names to finite weights")
        return cls(float(bias), {k: float(v) for k, v in weights.items()}, str(data.get("small", "")),
                   str(data.get("large", "")), dict(data.get("trained") or {}), _prefill(data.get("prefill")))


def _prefill(data) -> PrefillWeights | None:
    if data is None:
        return None
    weights = data.get("weights") if isinstance(data, dict) else None
    if not isinstance(weights, list) or not weights or not all(_finite(w) for w in weights):
        raise GainModelError("a gain model's prefill part needs a non-empty list of finite weights")
    rows = data.get("rows", [0])
    if not isinstance(rows, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in rows):
        raise GainModelError("a gain model's prefill rows must be a list of integers")
    return PrefillWeights(str(data.get("model", "")), tuple(float(w) for w in weights), tuple(rows))


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def resolve_gain_model_path(name: str, base_dir: Path | None = None) -> Path:
    """A bare name ("smollm2-qwen2.5-coder") is a model bundled with tiergate; anything else is a
    path, relative to `base_dir` (the config file's folder) when not absolute."""
    if "/" not in name and not name.endswith(".json"):
        return BUNDLED_DIR / f"{name}.json"
    path = Path(name).expanduser()
    return path if path.is_absolute() or base_dir is None else base_dir / path


def load_gain_model(path: Path) -> GainModel:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GainModelError(f"no gain model at {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GainModelError(f"cannot read {path}: {exc}") from None
    return GainModel.from_json(data)
