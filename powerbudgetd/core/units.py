"""Units: integer milliwatts inside the control arithmetic and at NVML's edge, watts
everywhere a number is shown, configured or logged. Conversions happen here only
(the rule: docs/design/layout.md, "Units"; tests/test_one_home.py holds it)."""

from __future__ import annotations


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


def to_j(millijoules: int | float) -> float:
    """mJ (NVML's energy counter) to J."""
    return millijoules / 1000.0
