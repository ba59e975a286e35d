"""What `tiergate` tells OpenMP before torch loads: workers that sleep when they wait, unless the
operator chose a policy (or a spin count, which libgomp counts over the policy)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_SHOW = ("import json, os, gateway.cli; "
         "print(json.dumps({k: os.environ.get(k) for k in ('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT')}))")


def _env_after_import(**given: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")} | given
    done = subprocess.run([sys.executable, "-c", _SHOW], env=env, capture_output=True, text=True, timeout=120,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_default_is_passive():
    assert _env_after_import() == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None}


@pytest.mark.parametrize("given, expected", [
    ({"OMP_WAIT_POLICY": "ACTIVE"}, {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": None}),
    ({"GOMP_SPINCOUNT": "100000"}, {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "100000"}),
])
def test_an_operators_choice_is_kept(given, expected):
    assert _env_after_import(**given) == expected
