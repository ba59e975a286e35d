"""Build (once, cached on disk) and load the C++ CPU kernels in kernels/cpu/.

Compiling needs a C++ compiler; without one the callers fall back to torch reference ops.
TIERGATE_CPU_ARCH (a GCC -march value, default "native") builds for another CPU's instruction
set, e.g. "haswell" to run and time the AVX2 paths on a CPU with AVX-512.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import platform
import sys
import time
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

_SOURCES = ("vector_math.cpp", "attention_fp32.cpp", "attention_bf16.cpp", "paged_attention.cpp", "kv_int8.cpp",
            "kv_fp8.cpp", "kv_int4.cpp", "kv_attention.cpp", "fp8_linear.cpp", "elementwise.cpp",
            "int8_linear.cpp", "block_tiles.cpp", "block_tiles_avx512.cpp",
            "block_linear.cpp", "decoder_layer.cpp")
_FUNCTIONS = ("paged_attention", "write_kv", "paged_attention_quantized", "write_kv_int8", "write_kv_fp8",
              "write_kv_int4", "fp8_linear", "fp8_to_bf16", "add_rms_norm", "silu_mul", "rope_split_qkv",
              "quantize_rows_int8", "w8a8_linear", "quantize_blocks_q8", "q4_block_linear", "q8_block_linear",
              "decoder_layer_blocks")


def _target_arch() -> str:
    return os.environ.get("TIERGATE_CPU_ARCH", "").strip() or "native"


def _build_fingerprint() -> str:
    """One build per (CPU, target instruction set, Python environment): -march=native builds for
    this CPU, and torch's build check treats another environment's include paths as a change and
    rebuilds."""
    import torch

    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = platform.processor() or platform.machine()
    arch = _target_arch()
    ident = f"{flags}|{sys.prefix}|{torch.__version__}" + ("" if arch == "native" else f"|{arch}")
    return hashlib.sha256(ident.encode()).hexdigest()[:10]


def _build_dir() -> Path:
    root = os.environ.get("TIERGATE_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tiergate"
    path = Path(root) / "torch_extensions" / _build_fingerprint()
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def _exclusive_build(build_dir: Path):
    """One build at a time per build directory, held with flock, which the kernel releases when
    its holder dies. torch's own lock is a plain file that a killed build (Ctrl-C during the first
    start) leaves behind, and every later start would wait on it forever; under our flock no
    other builder is alive, so such a file is stale and is removed."""
    with open(build_dir / "tiergate.flock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        (build_dir / "lock").unlink(missing_ok=True)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@functools.cache  # memo of one immutable compiled module per process
def load_cpu_kernels() -> ModuleType | None:
    if os.environ.get("TIERGATE_CPU_KERNELS", "1") == "0":
        return None
    from torch.utils.cpp_extension import load_inline

    here = Path(__file__).parent / "cpu"
    source = "\n".join((here / name).read_text() for name in _SOURCES)
    started = time.perf_counter()
    build_dir = _build_dir()
    try:
        with _exclusive_build(build_dir):
            module = load_inline(
                name="tiergate_cpu_kernels",
                cpp_sources=[source],
                functions=list(_FUNCTIONS),
                extra_cflags=["-O3", f"-march={_target_arch()}", "-fopenmp", "-ffast-math"],
                extra_ldflags=["-fopenmp"],
                build_directory=str(build_dir),
                verbose=False,
            )
    except Exception as exc:  # no compiler, missing headers: fall back to torch ops
        log.warning("CPU kernels unavailable, using torch reference ops (%s)", str(exc).splitlines()[0][:200])
        return None
    log.info("CPU kernels ready in %.1fs", time.perf_counter() - started)
    return module
