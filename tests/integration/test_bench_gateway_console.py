"""`tiergate bench gateway --console` end to end: real processes (an instant upstream, the
gateway), real HTTP, the console tabs polling with the admin key. The figures themselves are
noise at this size; what is checked is that every phase ran, every tab's polls were answered,
and the verdict follows from the measured ratios."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_console_cost_measures_one_and_many_tabs(tmp_path):
    out = tmp_path / "gw.json"
    done = subprocess.run([sys.executable, "-m", "gateway.cli", "bench", "gateway", "--json", str(out),
                           "--rate", "50", "--seconds", "0.5", "--rounds", "1", "--console", "--console-tabs", "4",
                           "--console-concurrency", "4"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    c = json.loads(out.read_text())["console"]
    assert c["tabs"] == 4 and set(c["throughput_rps"]) == {"0", "1", "4"}
    assert all(rate > 0 for rate in c["throughput_rps"].values())
    assert c["errors"] == {"0": 0, "1": 0, "4": 0, "console": 0}
    # a tab polls once on opening and then once a second; none polls while no console is open
    assert c["console_polls"]["0"] == 0 and c["console_polls"]["1"] >= 1 and c["console_polls"]["4"] >= 4
    many = c["many_tabs"]
    assert many["polls_per_s"] > 0
    assert c["cost_of_one_console"] == pytest.approx(many["cost"] / many["polls_per_s"], rel=0.01, abs=1e-5)
    assert c["meets_bar"] == (many["cost_per_tab_95"][1] < c["bar"])
