"""The process side of the multi-process benchmarks (gateway, tracing through the gateway):
ports, child processes with their logs, their CPU time, and the machine's load."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loadavg() -> list[float]:
    # The CPU is shared: other work on the machine shows up here and in the tails.
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_process(cmd: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A child in the repository root, stdout and stderr into `log_path`."""
    log = open(log_path, "w")  # noqa: SIM115 - the child writes to it until terminated
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)


def stop_processes(procs: list[subprocess.Popen], timeout_s: float = 30) -> None:
    """SIGTERM all, then wait for each (SIGKILL when one does not stop in time)."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
