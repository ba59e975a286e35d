"""What serve needs of this machine beyond a valid file, checked by check-config and serve before
anything starts: an embedded tier's model is a GGUF file or a checkpoint directory, and the
embedded tiers' KV pools fit in this machine's memory (exit 2, one line naming the field)."""

from __future__ import annotations

import pytest

from gateway.cli import main
from gateway.cli.start_checks import physical_memory_bytes


def _config(tmp_path, model: str, kv: str = "32MiB", processes: int = 0) -> str:
    path = tmp_path / "gw.yaml"
    path.write_text(f"tiers:\n  small:\n    model: '{model}'\n    kv_cache_memory: {kv}\n"
                    f"    engine_processes: {processes}\n")
    return str(path)


def _check(capsys, path: str) -> tuple[int, str]:
    code = main(["check-config", path])
    captured = capsys.readouterr()
    return code, (captured.err or captured.out).strip()


def test_a_bundled_model_passes(tmp_path, capsys):
    code, out = _check(capsys, _config(tmp_path, "default"))
    assert code == 0 and out.endswith("ok (1 tiers, default 'small')")


@pytest.mark.parametrize("make,reason", [
    (lambda d: d / "missing.gguf", "model path not found"),
    (lambda d: (d / "notes.txt").write_text("hello") and d / "notes.txt", "not a GGUF file"),
    (lambda d: (d / "empty").mkdir() or d / "empty", "no config.json in the model directory"),
])
def test_a_model_the_loaders_cannot_read_is_refused_before_start(tmp_path, capsys, make, reason):
    code, err = _check(capsys, _config(tmp_path, str(make(tmp_path))))
    assert code == 2 and len(err.splitlines()) == 1
    assert "tiers.small.model: " + reason in err


@pytest.mark.skipif(physical_memory_bytes() is None, reason="this system does not report its memory")
def test_kv_pools_past_this_machines_memory_are_refused(tmp_path, capsys):
    too_much = physical_memory_bytes() // 2**20 + 1
    code, err = _check(capsys, _config(tmp_path, "default", kv=f"{too_much}MiB"))
    assert code == 2 and "tiers.small.kv_cache_memory: " in err and "more than this machine's" in err
    # every engine process holds a pool of its own
    half = physical_memory_bytes() // 2**20 // 2 + 1
    code, err = _check(capsys, _config(tmp_path, "default", kv=f"{half}MiB", processes=2))
    assert code == 2 and "tiers.small.kv_cache_memory: " in err
