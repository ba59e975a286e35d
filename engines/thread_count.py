"""The CPU threads of one engine's ops, set for the calling thread alone.

torch.set_num_threads(n) sets the calling thread's OpenMP team size, and also the count every
thread that runs its first torch op later starts with: an engine thread that asked for one
thread would hand one thread to the next tier loading, its dtype measurement and its engine.
OpenMP's own omp_set_num_threads changes only the calling thread's team, so it is called on
the OpenMP runtime torch loaded (found among the process's mapped libraries), after torch has
set this thread up (its first get_num_threads), so that torch's set-up does not undo it.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

_RUNTIMES = ("libgomp", "libiomp5", "libomp")


def _torch_first(paths: list[str]) -> list[str]:
    """Torch's own runtime before any other: other wheels (scikit-learn, ...) map a vendored copy
    of libgomp of their own, and setting that one's team size does nothing to torch's ops."""
    home = str(Path(torch.__file__).resolve().parent)
    homes = (home + "/", home + ".libs/")
    return sorted(paths, key=lambda p: not p.startswith(homes))


@functools.cache     # one runtime per process
def _openmp_runtime() -> ctypes.CDLL | None:
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    paths = []
    for line in maps:
        path = line.split()[-1] if line.split() else ""
        if (path.startswith("/") and path not in paths
                and any(Path(path).name.startswith(name) for name in _RUNTIMES)):
            paths.append(path)
    for path in _torch_first(paths):
        try:
            lib = ctypes.CDLL(path)
            lib.omp_set_num_threads.argtypes = [ctypes.c_int]
            return lib
        except (OSError, AttributeError):
            continue
    return None


def set_thread_count(n: int) -> int:
    """This thread's ops run on `n` threads; other threads, present and future, keep theirs.
    Returns the count torch now reports for this thread."""
    if n < 1:
        raise ValueError("a thread count must be at least 1")
    torch.get_num_threads()              # torch's per-thread set-up first
    runtime = _openmp_runtime()
    if runtime is None:                  # no OpenMP runtime found: torch's own setter, process-wide
        torch.set_num_threads(n)
    else:
        runtime.omp_set_num_threads(n)
    return torch.get_num_threads()
