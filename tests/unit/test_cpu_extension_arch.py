"""TIERGATE_CPU_ARCH builds the kernels for another instruction set into a directory of its own,
and leaves the default (native) build where it was."""

from __future__ import annotations

from kernels.cpu_extension import _build_fingerprint


def test_each_target_instruction_set_gets_its_own_build(monkeypatch):
    monkeypatch.delenv("TIERGATE_CPU_ARCH", raising=False)
    default = _build_fingerprint()
    monkeypatch.setenv("TIERGATE_CPU_ARCH", "native")
    assert _build_fingerprint() == default
    monkeypatch.setenv("TIERGATE_CPU_ARCH", "haswell")
    avx2 = _build_fingerprint()
    monkeypatch.setenv("TIERGATE_CPU_ARCH", "znver1")
    assert len({default, avx2, _build_fingerprint()}) == 3
