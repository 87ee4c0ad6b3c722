"""A short soak in CI: random NVML faults and outside changes for a quarter of an hour
of bank time, no violation tick. (The 24-hour run is benchmarks/soak.py.)"""

from __future__ import annotations

import importlib.util

import pytest
from support.paths import REPO

pytestmark = pytest.mark.slow  # a quarter hour of bank time: the full run (CI) covers it


def test_quarter_hour_of_random_faults_keeps_the_budget():
    spec = importlib.util.spec_from_file_location("soak", REPO / "benchmarks" / "soak.py")
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    lines = []
    assert soak.soak(0.25, seed=3, report=lines.append) == 0
    assert "0 violation ticks" in lines[-1]
