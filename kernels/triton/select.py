"""Whether an op runs its Triton kernel.

TIERGATE_KERNELS picks the backend family (read once per process, like TIERGATE_CPU_KERNELS;
tests that change it call `kernel_choice.cache_clear()`):
  auto (default)  Triton on CUDA tensors when triton is installed; CPU ops on CPU tensors.
  triton          Triton everywhere. CPU tensors need the interpreter (TRITON_INTERPRET=1):
                  this is how CI runs the whole engine through the kernels without a GPU.
  torch           never Triton (CUDA falls back to the torch reference ops).
The check runs several times per layer, so its CPU path is one attribute read and one
cached call.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

ENV = "TIERGATE_KERNELS"
CHOICES = ("auto", "triton", "torch")


class KernelConfigError(RuntimeError):
    """The environment asks for kernels this machine cannot run."""


@functools.cache  # whether a package is installed does not change within a process
def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache  # one decision per process; see the module docstring
def kernel_choice() -> str:
    choice = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise KernelConfigError(f"{ENV}={choice!r}: expected one of {', '.join(CHOICES)}")
    if choice == "triton" and not triton_installed():
        raise KernelConfigError(f"{ENV}=triton but triton is not installed (pip install -e '.[triton]')")
    return choice


def use_triton(t: torch.Tensor | torch.device) -> bool:
    """True when the op on tensors like `t` (or on this device) should run its Triton kernel."""
    cuda = t.type == "cuda" if isinstance(t, torch.device) else t.is_cuda
    choice = kernel_choice()
    if cuda:
        return choice != "torch" and triton_installed()
    if choice != "triton":
        return False
    if not interpreting():
        raise KernelConfigError(f"{ENV}=triton on CPU tensors needs TRITON_INTERPRET=1 (the Triton interpreter)")
    return True
