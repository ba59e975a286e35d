"""The C++ kernel build must not wait forever on a lock that a killed build left behind."""

from __future__ import annotations

import subprocess
import sys
import threading

from kernels.cpu_extension import _exclusive_build


def test_a_stale_torch_lock_file_is_removed_under_the_build_lock(tmp_path):
    (tmp_path / "lock").write_text("")     # what a build killed mid-way leaves
    with _exclusive_build(tmp_path):
        assert not (tmp_path / "lock").exists()


def test_the_build_lock_is_released_when_its_holder_is_killed(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from kernels.cpu_extension import _exclusive_build\n"
         f"with _exclusive_build(Path({str(tmp_path)!r})):\n    print('held', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        acquired = threading.Event()

        def take() -> None:
            with _exclusive_build(tmp_path):
                acquired.set()

        waiter = threading.Thread(target=take, daemon=True)
        waiter.start()
        assert not acquired.wait(0.5)          # held by a live process: we wait
        holder.kill()
        holder.wait()
        assert acquired.wait(60)               # its death releases the lock
    finally:
        holder.kill()
        holder.wait()
