"""A real redis-server for tests: started on a free loopback port, killable and restartable.

Never the system Redis on 6379: each server is our own child process, without persistence
(`--save "" --appendonly no`), so killing it loses its data as a crashed cache node would.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

REDIS_SERVER = os.environ.get("TIERGATE_REDIS_SERVER") or shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ping(port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self, port: int | None = None):
        if not Path(REDIS_SERVER).exists():
            raise RuntimeError(f"redis-server not found at {REDIS_SERVER}: apt-get install -y redis-server")
        self.port = port or free_port()
        self._dir = tempfile.mkdtemp(prefix="tiergate-redis-")
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 60.0) -> RedisServer:
        assert not self.running, "already running"
        self._proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self._dir, "--daemonize", "no", "--loglevel", "warning", "--maxclients", "4096"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while not _ping(self.port):
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                raise RuntimeError(f"redis-server on port {self.port} exited: {err.strip()[-500:]}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server on port {self.port} did not answer PING in {timeout}s")
            time.sleep(0.01)
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash: no shutdown, and (without persistence) all data is lost."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait(timeout=10)
        self._close_pipe()

    def restart(self) -> RedisServer:
        """Start again on the same port (clients reconnect to the same URL)."""
        self.kill()
        return self.start()

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        self._close_pipe()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _close_pipe(self) -> None:
        if self._proc is not None and self._proc.stderr is not None:
            self._proc.stderr.close()


def launch(attempts: int = 3) -> RedisServer:
    """A started server on a free port; another port if someone took the one we picked."""
    for attempt in range(attempts):
        server = RedisServer()
        try:
            return server.start()
        except RuntimeError:
            server.stop()
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


@contextlib.contextmanager
def running_redis():
    server = launch()
    try:
        yield server
    finally:
        server.stop()
