"""A missing or corrupt model file ends the CLI with one line on stderr, exit 2, no traceback."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest


def _run_cli(*args: str, env_cache) -> subprocess.CompletedProcess:
    # A fresh cache directory would also mean a fresh build of the C++ kernels (minutes on two
    # cores); these errors come from loading, before any kernel runs, so the torch ops serve.
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True, timeout=120,
        env={"TIERGATE_CACHE_DIR": str(env_cache), "TIERGATE_CPU_KERNELS": "0", "PATH": "/usr/bin:/bin"},
    )


def _assert_one_line_error(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tiergate: error:") and needle in lines[0], proc.stderr


def test_missing_model_file(tmp_path):
    proc = _run_cli("generate", "--model", str(tmp_path / "absent.gguf"), "hi", env_cache=tmp_path / "c")
    _assert_one_line_error(proc, "not found")


def test_garbage_gguf(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"this is not a gguf file at all" * 10)
    proc = _run_cli("generate", "--model", str(bad), "hi", env_cache=tmp_path / "c")
    _assert_one_line_error(proc, "not a readable GGUF")


@pytest.mark.slow
def test_truncated_gguf(tmp_path, default_gguf):
    cut = tmp_path / "cut.gguf"
    with default_gguf.open("rb") as src:
        cut.write_bytes(src.read(default_gguf.stat().st_size // 2))
    proc = _run_cli("generate", "--model", str(cut), "hi", env_cache=tmp_path / "c")
    _assert_one_line_error(proc, "cut.gguf")


def test_corrupt_safetensors_dir(tmp_path):
    from tests.tiny_models import write_tiny_checkpoint

    write_tiny_checkpoint(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"\x00" * 64)
    proc = _run_cli("generate", "--model", str(tmp_path / "m"), "hi", env_cache=tmp_path / "c")
    _assert_one_line_error(proc, "safetensors")


def test_missing_config_json(tmp_path):
    from tests.tiny_models import write_tiny_checkpoint

    write_tiny_checkpoint(tmp_path / "m")
    (tmp_path / "m" / "config.json").unlink()
    proc = _run_cli("generate", "--model", str(tmp_path / "m"), "hi", env_cache=tmp_path / "c")
    _assert_one_line_error(proc, "config.json")


def test_bad_config_file(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tiers:\n  small:\n    dtype: int3\n")
    proc = _run_cli("check-config", str(cfg), env_cache=tmp_path / "c")
    _assert_one_line_error(proc, "tiers.small.dtype")


@pytest.mark.slow          # dequantizes the real GGUF
def test_gguf_cache_is_reused(tmp_path, default_gguf, monkeypatch):
    """The second start reads the cached safetensors copy, never the GGUF."""
    from engines.loaders import gguf_cache

    local = tmp_path / default_gguf.name
    shutil.copy(default_gguf, local)
    first = gguf_cache.materialize_gguf(local, tmp_path / "cache", progress=False)

    def fail(*_a, **_k):
        raise AssertionError("GGUF parsed again despite a cache entry")

    monkeypatch.setattr(gguf_cache, "read_gguf", fail)
    assert gguf_cache.materialize_gguf(local, tmp_path / "cache") == first
    assert sorted(p.name for p in first.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
