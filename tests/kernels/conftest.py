"""Triton kernel tests: CPU tensors under the Triton interpreter.

TRITON_INTERPRET must be set before any kernel module is imported (triton.jit chooses
between compiling and interpreting at decoration). triton is imported here on purpose: where
it is missing these tests fail at collection instead of being skipped.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: F401  (fail loudly without triton)
