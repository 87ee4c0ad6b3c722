"""Units: integer milliwatts inside the control arithmetic and at NVML's edge, watts
everywhere a number is shown, configured or logged. Conversions happen here only
(the rule: docs/design/layout.md, "Units"; tests/test_one_home.py holds it)."""

from __future__ import annotations

import math


def to_mw(watts: float) -> int:
    """W to integer mW, rounded to the nearest mW (callers round toward safety first)."""
    return int(round(watts * 1000.0))


def budget_mw(watts: float) -> int:
    """A budget in W to integer mW, rounded down: a budget is never rounded up."""
    return int(watts * 1000)


def to_w(milliwatts: int | float) -> float:
    """mW (NVML's unit) to W."""
    return milliwatts / 1000.0


def opt_mw(watts: float | None) -> int | None:
    """:func:`to_mw`, passing ``None`` (unknown) through."""
    return None if watts is None else to_mw(watts)


def opt_w(milliwatts: int | float | None) -> float | None:
    """:func:`to_w`, passing ``None`` (unknown) through."""
    return None if milliwatts is None else to_w(milliwatts)


def uw_to_w_up(microwatts: int) -> float:
    """µW (the kernel's hwmon power files) to W, rounded up to a whole mW: a limit that
    may be in force is never counted lower."""
    return -(-microwatts // 1000) / 1000.0


def w_to_uw_down(watts: float, step_w: float = 0.001) -> int:
    """W to µW for a write, rounded down to ``step_w`` (a driver's step, at least 1 mW):
    a write never sets more than asked."""
    step_mw = max(1, int(round(step_w * 1000)))
    mw = math.floor(round(watts * 1000.0, 6))
    return (mw - mw % step_mw) * 1000


def to_j(millijoules: int | float) -> float:
    """mJ (NVML's energy counter) to J."""
    return millijoules / 1000.0


def to_ms(seconds: float) -> int:
    """s to whole ms, rounded to the nearest (gRPC's channel options count in ms)."""
    return int(round(seconds * 1000.0))
