"""Record what Triton's JIT would compile for each kernel launch, on a machine without a GPU.

The kernel wrappers run as they would on CUDA, on CPU tensors of the real sizes: a stand-in
driver answers for a GPU of the given architecture, the JIT specializes every argument as
it does for a real launch (16-byte aligned pointers, integers divisible by 16, integers
equal to 1 made constants), and a cache hook records that specialization and skips the
compile and the launch. Plans see `sms` multiprocessors, as on the GPU.
Kernel outputs are left unwritten: the recorder is for compiling, never for results. Run
it in a process of its own: each kernel's JIT keeps the stand-in's target for device 0
after the context exits.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass


@dataclass
class Launch:
    fn: object                 # the JITFunction
    signature: dict
    constexprs: dict
    attrs: dict
    num_warps: int
    num_stages: int
    key: str                   # identical launches compile once

    @property
    def name(self) -> str:
        return self.fn.fn.__name__


class _NoGpuDriver:
    """The part of Triton's driver interface the JIT reads before it compiles."""

    def __init__(self, target):
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self):
        return self.target

    def is_active(self) -> bool:
        return True


@contextlib.contextmanager
def recording(arch: int, sms: int):
    """Inside: Triton launches are recorded into the yielded list instead of running."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    launches: list[Launch] = []

    def hook(*, key, fn, compile, **_):
        launches.append(Launch(fn.jit_function, compile["signature"], compile["constants"], compile["configs"][0],
                               compile["num_warps"], compile["num_stages"], f"{fn.name}:{key}"))
        return True                                   # skip compiling and launching

    from kernels.triton import _common

    # Every module that imported the SM count (kernel wrappers, benchmark cases) plans for `sms`.
    patched = [(m, m.num_sms) for m in list(sys.modules.values())
               if getattr(m, "num_sms", None) is _common.num_sms]
    previous_hook = knobs.runtime.jit_cache_hook
    previous_driver = driver._active      # None until first use; reset_active() would build a CUDA driver
    driver.set_active(_NoGpuDriver(GPUTarget("cuda", arch, 32)))
    knobs.runtime.jit_cache_hook = hook
    for module, _ in patched:
        module.num_sms = lambda device, _sms=sms: _sms
    try:
        yield launches
    finally:
        for module, original in patched:
            module.num_sms = original
        knobs.runtime.jit_cache_hook = previous_hook
        driver.set_active(previous_driver)
