"""What a reload makes of a file the way serve would at start: relative file names are looked up
next to the config, a settled file that is not UTF-8 is reported (not taken for one still being
written), and a change only a restart can apply (the listening address) is refused, old config
kept. The real reloader and runtime over an upstream tier that is never called."""

from __future__ import annotations

import shutil
from pathlib import Path

from gateway.reload import ConfigReloader
from gateway.runtime import RuntimeHolder, build_runtime
from policies.config import load_config

GAIN_MODEL = Path(__file__).resolve().parents[2] / "policies" / "gain_models" / "smollm2-qwen2.5-coder.json"


def _text(port: int = 8000, extra: str = "") -> str:
    return (f"auth: {{enabled: false}}\nserver: {{port: {port}, reload_poll_s: 0, reload_settle_s: 0}}\n"
            "tiers:\n  up: {kind: upstream, base_url: 'http://127.0.0.1:9/v1', model: x}\n" + extra)


def _reloader(path) -> ConfigReloader:
    holder = RuntimeHolder(build_runtime(load_config(path)), str(path))
    return ConfigReloader(holder, path, "127.0.0.1")


async def _close(reloader: ConfigReloader) -> None:
    await reloader.stop()
    for tier in reloader.holder.current.tiers.values():
        await tier.close()


async def test_a_relative_gain_model_is_found_next_to_the_config_on_reload(tmp_path, monkeypatch):
    (tmp_path / "models").mkdir()
    shutil.copy(GAIN_MODEL, tmp_path / "models" / "mine.json")
    path = tmp_path / "gw.yaml"
    gain = "classification: {gain_model: {file: models/mine.json, threshold: 0.2}}\n"
    path.write_text(_text(extra=gain))
    monkeypatch.chdir(Path(__file__).parent)        # not where the config is
    reloader = _reloader(path)
    try:
        path.write_text(_text(extra=gain + "models:\n  renamed: {chain: [up]}\n"))
        assert await reloader.reload("SIGHUP"), reloader.last_error
        assert list(reloader.holder.current.config.models) == ["renamed"]
    finally:
        await _close(reloader)


async def test_a_settled_file_that_is_not_utf8_is_reported_by_the_poller(tmp_path):
    path = tmp_path / "gw.yaml"
    path.write_text(_text())
    reloader = _reloader(path)
    try:
        path.write_bytes(_text().encode() + b"# \xff\xfe\n")
        assert await reloader.poll_once() is None       # first look: it may still be being written
        assert await reloader.poll_once() is False      # the same on the second: loaded, and refused
        assert reloader.last_error.endswith("not UTF-8 text")
        assert reloader.rejected["error"] == reloader.last_error
    finally:
        await _close(reloader)


async def test_a_new_listening_port_is_refused_until_a_restart(tmp_path):
    path = tmp_path / "gw.yaml"
    path.write_text(_text(port=8000))
    reloader = _reloader(path)
    before = reloader.holder.current
    try:
        path.write_text(_text(port=8001, extra="models:\n  renamed: {chain: [up]}\n"))
        assert not await reloader.reload("SIGHUP")
        assert reloader.last_error == "server.port changed: restart to apply"
        assert reloader.holder.current is before
    finally:
        await _close(reloader)
