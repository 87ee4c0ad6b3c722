"""The CPU packages' power from the kernel's powercap RAPL energy counters: pure
arithmetic on samples (``hw.rapl`` reads the files).

Each package zone (``intel-rapl:N``) counts the energy its package has drawn, in µJ,
from 0 up to ``max_energy_range_uj`` and round again. Power is the energy between two
samples over the time between them; a counter lower than the last one has wrapped once
(the window is far shorter than a wrap: ~65 s at 1 kW for a 2^36 µJ range, hours at a
package's usual draw), so the energy is what it counted up to the range and from 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ZoneSample:
    """One zone's counter: ``energy_uj`` and its ``max_energy_range_uj`` (µJ)."""

    energy_uj: int
    max_energy_range_uj: int


def energy_j(before: ZoneSample, after: ZoneSample) -> float:
    """The energy (J) a zone counted from ``before`` to ``after``, across one wrap.
    Raises ValueError for a counter outside its range."""
    for s in (before, after):
        if not 0 <= s.energy_uj <= s.max_energy_range_uj or s.max_energy_range_uj <= 0:
            raise ValueError(f"energy_uj {s.energy_uj} outside [0, max_energy_range_uj {s.max_energy_range_uj}]")
    delta = after.energy_uj - before.energy_uj
    if delta < 0:  # wrapped: up to the range, then from 0
        delta += after.max_energy_range_uj
    return delta / 1e6


class RaplPower:
    """The packages' summed power (W) from successive samples taken at least
    ``window_s`` apart (s, on one monotonic clock passed in). :meth:`add` returns the
    power over the window just closed, or None while it is still open (or after a zone
    set changed: a fresh window)."""

    def __init__(self, window_s: float) -> None:
        if not window_s > 0:
            raise ValueError("window_s > 0")
        self.window_s = window_s
        self._last: tuple[float, Mapping[str, ZoneSample]] | None = None
        self.watts: float | None = None  # the last window's power

    def add(self, now: float, zones: Mapping[str, ZoneSample]) -> float | None:
        if self._last is None or set(self._last[1]) != set(zones) or now <= self._last[0]:
            self._last = (now, dict(zones))
            return None
        t0, before = self._last
        if now - t0 < self.window_s:
            return None
        joules = sum(energy_j(before[z], zones[z]) for z in zones)
        self._last = (now, dict(zones))
        self.watts = joules / (now - t0)
        return self.watts

    def reset(self) -> None:
        """A failed read: the next sample opens a fresh window."""
        self._last = None
