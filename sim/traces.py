"""Recorded H200 power traces (package data under ``traces/``).

Read off one NVIDIA H200 (driver 580, limit 700 W) with NVML reads only; see
``traces/TRACES.md``. A trace replays the instant power (field 186) as demand.
"""

from __future__ import annotations

import bisect
import csv
import functools
import io
from dataclasses import dataclass
from importlib import resources

TRACE_LIMIT_W = 700.0  # enforced limit while recording (h200-load-steps.meta.json)
TRACES = ("h200-load-steps", "h200-serving")


@dataclass(frozen=True)
class Trace:
    """Instant board power over time: ``times_s`` ascending, ``power_w`` the same length."""

    name: str
    times_s: tuple[float, ...]
    power_w: tuple[float, ...]

    @property
    def duration_s(self) -> float:
        return self.times_s[-1]

    def at(self, t_s: float, loop: bool = True) -> float:
        """Power in W at ``t_s`` (step-held; wraps around when ``loop``)."""
        if loop:
            t_s %= self.duration_s
        i = bisect.bisect_right(self.times_s, t_s) - 1
        return self.power_w[min(max(i, 0), len(self.power_w) - 1)]


@functools.cache
def load_trace(name: str) -> Trace:
    """Load a packaged trace by name (one of ``TRACES``). Raises KeyError if unknown."""
    if name not in TRACES:
        raise KeyError(f"unknown trace {name!r}; known: {', '.join(TRACES)}")
    path = resources.files("powerbudgetd_sim") / "traces" / f"{name}.csv"
    times, power = [], []
    with io.TextIOWrapper(path.open("rb"), encoding="utf-8", newline="") as fh:
        for row in csv.DictReader(fh):
            times.append(float(row["t_s"]))
            power.append(int(row["power_instant_mw"]) / 1000.0)
    return Trace(name, tuple(times), tuple(power))
