"""What one card may be set to, and the ``[cards]`` settings that apply to it: the one
rule the card set (the daemon, ``check-config``) and ``failsafe`` both use.

A card is ours to write when it is not excluded and its limit constraints read and make
sense (``0 < min <= max``, ``nvmlDeviceGetPowerManagementLimitConstraints``). Its usable
range runs from its minimum limit to its worst case (:func:`~powerbudgetd.core.worstcase.worst_case_mw`),
lowered to ``[cards] max_w`` where one is set, never below the minimum. Limits in mW.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from powerbudgetd.core.model import CardOverride
from powerbudgetd.core.units import budget_mw, opt_mw, to_mw
from powerbudgetd.core.worstcase import worst_case_mw
from powerbudgetd.hw.nvml import GpuInfo, PowerReading


def override_for(overrides: Mapping[str, CardOverride], uuid: str | None, index: int,
                 bus_id: str | None = None) -> CardOverride:
    """A card's ``[cards]`` settings: by its identity first (NVML's UUID, hwmon's
    ``amdgpu-0000:03:00.0``), else by PCI bus id (``0000:03:00.0``: any vendor), else by
    index, else the defaults."""
    return ((overrides.get(uuid) if uuid else None) or (overrides.get(bus_id) if bus_id else None)
            or overrides.get(str(index)) or CardOverride())


@dataclass(frozen=True)
class CardLimits:
    """A card's range (mW): ``controllable`` (ours to write), ``min_mw`` (0 when not),
    ``max_mw`` (the most a target may be), ``worst_mw`` (the highest limit it may have or
    come back with; None when nothing is known anywhere), ``valid`` (its constraints make
    sense)."""

    controllable: bool
    valid: bool
    min_mw: int
    max_mw: int
    worst_mw: int | None


def card_limits(info: GpuInfo, override: CardOverride, reading: PowerReading | None,
                bank_max_mw: int | None = None) -> CardLimits:
    """The range of ``info`` under ``override``, from its constraints, its default and the
    limits ``reading`` holds (None: not read). ``bank_max_mw``: the largest maximum limit
    among the other cards, the worst case of a card with no limit known at all."""
    lo, hi = info.min_limit_w, info.max_limit_w
    valid = lo is not None and hi is not None and 0 < lo <= hi
    read = (reading.requested_limit_w, reading.enforced_limit_w) if reading else ()
    worst = worst_case_mw([opt_mw(v) for v in (hi, info.default_limit_w, *read)], opt_mw(override.max_w), bank_max_mw)
    # The card keeps its limit in steps (limit_step_w: amdgpu whole W, xe 1/8 W, NVML
    # 1 mW): its floor is the lowest step it can hold (its minimum rounded up: a floor
    # the card cannot be set to would be counted lower than what it holds), its top the
    # highest step within the range (rounded down: a target above it is refused).
    step = max(1, to_mw(info.caps.limit_step_w))
    min_mw = -(-to_mw(lo) // step) * step if valid and lo is not None else 0
    top = worst or 0
    # An operator's cap, rounded down as a budget is.
    max_mw = top if override.max_w is None else max(min_mw, min(top, budget_mw(override.max_w)))
    max_mw = max(min_mw, max_mw - max_mw % step)
    return CardLimits(not override.exclude and valid, valid, min_mw, max_mw, worst)
