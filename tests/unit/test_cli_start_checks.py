"""What serve needs of this machine beyond a valid file, checked by check-config and serve before
anything starts: an embedded tier's model (and draft model) is a GGUF file or a checkpoint
directory, its device exists, the embedded tiers' KV pools fit in this machine's memory, and a
server without auth listens on loopback (exit 2, one line naming the field). The KV pool's lower
bound: tests/unit/test_cli_kv_minimum.py."""

from __future__ import annotations

import pytest

from gateway.cli import main
from gateway.cli.start_checks import physical_memory_bytes


def _config(tmp_path, model: str, kv: str = "32MiB", processes: int = 0) -> str:
    path = tmp_path / "gw.yaml"
    path.write_text(f"auth: {{enabled: false}}\ntiers:\n  small:\n    model: '{model}'\n    kv_cache_memory: {kv}\n"
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


def test_a_cuda_device_this_torch_does_not_see_is_refused(tmp_path, capsys, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = tmp_path / "gw.yaml"
    path.write_text("auth: {enabled: false}\ntiers:\n  gpu: {device: cuda}\n")
    code, err = _check(capsys, str(path))
    assert code == 2 and len(err.splitlines()) == 1
    assert "tiers.gpu.device: " in err and "sees no CUDA device" in err


def test_a_draft_model_that_is_not_there_is_refused(tmp_path, capsys):
    path = tmp_path / "gw.yaml"
    path.write_text(f"auth: {{enabled: false}}\ntiers:\n  spec: {{speculative: {{method: draft, "
                    f"draft_model: '{tmp_path / 'missing.gguf'}'}}}}\n")
    code, err = _check(capsys, str(path))
    assert code == 2 and len(err.splitlines()) == 1
    assert "tiers.spec.speculative.draft_model: model path not found" in err


UPSTREAM = "tiers: {up: {kind: upstream, base_url: 'http://127.0.0.1:9/v1', model: m}}\n"


def test_check_config_refuses_auth_off_off_loopback_as_serve_does(tmp_path, capsys):
    path = tmp_path / "gw.yaml"
    path.write_text("server: {host: 0.0.0.0}\nauth: {enabled: false}\n" + UPSTREAM)
    code, err = _check(capsys, str(path))
    assert code == 2 and len(err.splitlines()) == 1
    assert "loopback only" in err and "server.host 0.0.0.0" in err
    path.write_text("server: {host: '::1'}\nauth: {enabled: false}\n" + UPSTREAM)
    assert _check(capsys, str(path))[0] == 0
