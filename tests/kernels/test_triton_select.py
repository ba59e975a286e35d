"""TIERGATE_KERNELS decides where the Triton kernels run; bad settings fail with one clear line."""

from __future__ import annotations

import pytest
import torch

from kernels.dispatch import AttentionOps
from kernels.triton.select import KernelConfigError, kernel_choice, use_triton


@pytest.fixture
def kernels_env(monkeypatch):
    def set_choice(value, interpret="1"):
        if value is None:
            monkeypatch.delenv("TIERGATE_KERNELS", raising=False)
        else:
            monkeypatch.setenv("TIERGATE_KERNELS", value)
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
        kernel_choice.cache_clear()
    yield set_choice
    kernel_choice.cache_clear()


def test_default_is_triton_on_cuda_only(kernels_env):
    kernels_env(None)
    assert not use_triton(torch.zeros(2))
    assert use_triton(torch.device("cuda"))
    assert AttentionOps("cpu").name != "triton"


def test_forced_triton_runs_cpu_tensors_under_the_interpreter(kernels_env):
    kernels_env("triton")
    assert use_triton(torch.zeros(2))
    assert AttentionOps("cpu").name == "triton"


def test_forced_triton_without_the_interpreter_is_a_clear_error(kernels_env):
    kernels_env("triton", interpret="0")
    with pytest.raises(KernelConfigError, match="TRITON_INTERPRET=1"):
        use_triton(torch.zeros(2))


def test_torch_choice_keeps_cuda_off_triton_and_bad_values_are_rejected(kernels_env):
    kernels_env("torch")
    assert not use_triton(torch.device("cuda"))
    kernels_env("cuda-please")
    with pytest.raises(KernelConfigError, match="expected one of auto, triton, torch"):
        use_triton(torch.zeros(2))
