"""Start a real gateway (uvicorn on a free loopback port, in a thread of the test process) and,
when wanted, the instant OpenAI-compatible upstream in another thread.

In-process so tests can look inside the tiers (an engine's KV blocks) while talking to the
gateway over real HTTP. Gateways are shared per pytest session through `shared()`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from pathlib import Path

import httpx
import uvicorn

from bench.datasets.sharegpt import calibration_source
from gateway.app import build_app
from tests.fakes.upstream import serve as serve_upstream
from gateway.reload import ConfigReloader
from gateway.runtime import RuntimeHolder, build_runtime
from policies.config import load_config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningGateway:
    def __init__(self, config_path: Path, wait_ready: bool = True, timeout_s: float = 300, telemetry=None):
        self.config_path = Path(config_path)
        cfg = load_config(self.config_path)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        calibration = calibration_source()
        self.holder = RuntimeHolder(build_runtime(cfg, calibration=calibration), str(self.config_path), calibration)
        self.reloader = ConfigReloader(self.holder, self.config_path, "127.0.0.1")
        app = build_app(self.holder, self.reloader, telemetry)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                   access_log=False, lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, name="test-gateway", daemon=True)
        self.thread.start()
        self._wait("/healthz", 60)
        if wait_ready:
            self._wait("/readyz", timeout_s)

    def wait_loaded(self, timeout_s: float = 300) -> None:
        """Until no tier is still loading (loaded or failed): a config with a tier meant to be down
        never gets a 200 from /readyz."""
        deadline = time.time() + timeout_s
        while any(t.state == "loading" for t in self.runtime.tiers.values()):
            if time.time() > deadline:
                raise RuntimeError(f"tiers still loading after {timeout_s:.0f} s")
            time.sleep(0.1)

    def _wait(self, path: str, timeout_s: float) -> None:
        deadline = time.time() + timeout_s
        last = None
        while time.time() < deadline:
            try:
                last = httpx.get(self.base + path, timeout=2)
                if last.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"gateway {path} not 200 after {timeout_s}s: {last.text if last else 'no answer'}")

    @property
    def runtime(self):
        return self.holder.current

    def reload(self, why: str = "test") -> bool:
        """Run a reload on the server's own loop and wait for its verdict."""
        loop = self.server_loop()
        return asyncio.run_coroutine_threadsafe(self.reloader.reload(why), loop).result(timeout=30)

    def server_loop(self) -> asyncio.AbstractEventLoop:
        for server in self.server.servers:
            return server.get_loop()
        raise RuntimeError("server not started")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)


class InstantUpstream:
    """The fake upstream (tests/fakes/upstream.py) in a thread."""

    def __init__(self):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run():
            asyncio.set_event_loop(self._loop)
            started = asyncio.Event()
            task = self._loop.create_task(serve_upstream("127.0.0.1", self.port, started))
            self._loop.run_until_complete(started.wait())
            ready.set()
            try:
                self._loop.run_until_complete(task)
            except asyncio.CancelledError:
                pass

        self._task_thread = threading.Thread(target=run, name="instant-upstream", daemon=True)
        self._task_thread.start()
        if not ready.wait(10):
            raise RuntimeError("instant upstream did not start")

    def stop(self) -> None:
        def cancel_all():
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
        self._loop.call_soon_threadsafe(cancel_all)
        self._task_thread.join(timeout=10)


def shared(request, key: str, factory):
    """One instance per pytest session for `key`, stopped when the session ends."""
    stash = request.config.__dict__.setdefault("_tiergate_shared", {})
    if key not in stash:
        stash[key] = factory()
        request.config.add_cleanup(stash[key].stop)
    return stash[key]


def embedded_config(tiny_dir: Path) -> str:
    """The real model (fp32: greedy answers are exact) and two tiny random tiers for routing."""
    tiny = (f"{{model: '{tiny_dir}', dtype: float32, max_model_len: 256, kv_cache_memory: 4MiB, "
            "max_num_seqs: 8, max_num_batched_tokens: 256}")
    return f"""
auth: {{enabled: false}}
server: {{reload_poll_s: 0}}
tiers:
  smol: {{model: default, dtype: float32, max_model_len: 512, kv_cache_memory: 64MiB, max_num_seqs: 16,
          max_num_batched_tokens: 512}}
  tiny-a: {tiny}
  tiny-b: {tiny}
  broken: {{model: '{tiny_dir}/missing', dtype: float32}}
models:
  smol: {{chain: [smol]}}
  multi: {{chain: [smol]}}
  routed: {{chain: [broken, smol]}}
  broken-only: {{chain: [broken]}}
  esc: {{chain: [tiny-a], cascade: {{to: smol, threshold: -0.5}}}}
  no-esc: {{chain: [tiny-a], cascade: {{to: smol, threshold: -1000}}}}
classification:
  rules:
    - {{name: long, profile: memory, when: {{prompt_tokens: {{gte: 300}}, model: multi}}}}
routing:
  rules:
    - {{name: lat, match: {{profile: latency, model: multi}}, chain: [tiny-a, smol]}}
    - {{name: mem, match: {{profile: memory, model: multi}}, chain: [tiny-b, smol]}}
"""


def byte_model_config(model_dir: Path, *, max_model_len: int = 256, kv_cache_memory: str = "4MiB",
                      max_num_batched_tokens: int = 256, tiers: str = "", models: str = "", sections: str = "",
                      auth: str = "{enabled: false}") -> str:
    """A gateway whose model `bytes` is the tiny byte-level Llama at `model_dir` (constrained
    decoding tests: it can spell anything and, unmasked, writes noise); `tiers` and `models` add
    YAML lines to those sections, `sections` whole top-level sections, `auth` the auth section."""
    return f"""
auth: {auth}
server: {{reload_poll_s: 0}}
tiers:
  bytes: {{model: '{model_dir}', dtype: float32, max_model_len: {max_model_len}, kv_cache_memory: {kv_cache_memory},
          max_num_seqs: 8, max_num_batched_tokens: {max_num_batched_tokens}}}
{tiers}models:
  bytes: {{chain: [bytes]}}
{models}{sections}"""


def start_byte_gateway(tmp_dir: Path, seed: int, **config):
    """A running gateway serving the tiny byte-level Llama (seeded; initializer range 0.2, so its
    greedy output varies with the prompt) as model `bytes`, with its tokenizer and the transformers
    model it was written from: (gateway, tokenizer, hf model)."""
    from tokenizers import Tokenizer

    from tests.tiny_models import write_tiny_byte_checkpoint

    hf = write_tiny_byte_checkpoint(tmp_dir / "bytes", seed=seed, initializer_range=0.2).eval()
    path = tmp_dir / "gateway.yaml"
    path.write_text(byte_model_config(tmp_dir / "bytes", **config))
    return RunningGateway(path), Tokenizer.from_file(str(tmp_dir / "bytes" / "tokenizer.json")), hf


def start_embedded_gateway(tmp_dir: Path) -> RunningGateway:
    from tests.tiny_models import write_tiny_checkpoint

    tiny = tmp_dir / "tiny"
    write_tiny_checkpoint(tiny)
    path = tmp_dir / "gateway.yaml"
    path.write_text(embedded_config(tiny))
    gw = RunningGateway(path, wait_ready=False)
    gw.wait_loaded()
    return gw


def logged_request(caplog, request_id: str) -> dict:
    """The request's JSON log line (written just after its response), waiting a little for it."""
    deadline = time.time() + 120
    while time.time() < deadline:
        for record in caplog.records:
            if record.name == "tiergate.requests" and request_id in record.getMessage():
                return json.loads(record.getMessage())
        time.sleep(0.02)
    raise AssertionError(f"no log line for {request_id}")
