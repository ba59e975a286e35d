"""Process-level memory allocator tuning for CPU inference.

glibc serves large allocations with fresh mmap pages and returns them on free, so every
step's activation tensors page-fault anew; for the tensor sizes of a batched step this
costs as much as the arithmetic. Raising the mmap and trim thresholds keeps freed memory
in the heap for reuse.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory(threshold_bytes: int = 1 << 30) -> bool:
    """Ask glibc to reuse freed blocks below `threshold_bytes`; False where not glibc."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, min(threshold_bytes, 32 << 20)) == 1
    ok &= mallopt(_M_TRIM_THRESHOLD, threshold_bytes) == 1
    if not ok:
        log.debug("mallopt refused; allocator left as is")
    return ok
