"""One card's range and its [cards] settings: the rule the card set and failsafe share."""

from __future__ import annotations

import dataclasses

from powerbudgetd.control.cardlimits import card_limits, override_for
from powerbudgetd.core.model import CardOverride
from powerbudgetd.hw.card import Capabilities
from powerbudgetd.hw.nvml import GpuInfo, PowerReading


def info(lo: float | None = 100.0, hi: float | None = 300.0, default: float | None = 300.0) -> GpuInfo:
    return GpuInfo(0, "GPU-a", "card", lo, hi, default, None)


def reading(requested: float | None, enforced: float | None) -> PowerReading:
    return PowerReading(None, None, requested, enforced)


def test_settings_by_uuid_first_then_by_index() -> None:
    by_uuid, by_index = CardOverride(max_w=200), CardOverride(max_w=250)
    assert override_for({"GPU-a": by_uuid, "0": by_index}, "GPU-a", 0) is by_uuid
    assert override_for({"0": by_index}, "GPU-a", 0) is by_index
    assert override_for({"1": by_index}, None, 0) == CardOverride()


def test_a_max_w_lowers_the_range_never_below_the_floor_and_rounds_down() -> None:
    assert card_limits(info(), CardOverride(max_w=200.0004), None).max_mw == 200_000
    assert card_limits(info(), CardOverride(max_w=50), None).max_mw == 100_000  # the floor wins
    assert card_limits(info(), CardOverride(), None).max_mw == 300_000


def test_the_worst_case_counts_a_limit_read_above_the_stated_maximum() -> None:
    lim = card_limits(info(), CardOverride(), reading(320.0, 310.0))
    assert lim.worst_mw == 320_000 and lim.max_mw == 320_000 and lim.controllable


def test_excluded_or_invalid_constraints_are_not_ours_to_write() -> None:
    assert not card_limits(info(), CardOverride(exclude=True), None).controllable
    bad = card_limits(info(lo=300.0, hi=100.0), CardOverride(), reading(250.0, 250.0))
    assert not bad.controllable and not bad.valid and bad.min_mw == 0 and bad.worst_mw == 300_000
    unknown = card_limits(info(None, None, None), CardOverride(), None, bank_max_mw=700_000)
    assert unknown.worst_mw == 700_000 and not unknown.controllable


def test_a_stepped_card_floor_is_the_lowest_step_it_can_hold_and_its_worst_case_is_not_stepped() -> None:
    """amdgpu keeps whole W: a minimum of 150.5 W can only be held at 151 W (counting the
    floor at 150.5 W would count the card lower than it may hold), the top target is the
    highest whole W within the range, and the worst case stays the maximum as read."""
    amd = dataclasses.replace(info(150.5, 300.9, 300.9), caps=Capabilities(separate_requested=False,
                                                                          limit_step_w=1.0))
    lim = card_limits(amd, CardOverride(), None)
    assert (lim.min_mw, lim.max_mw, lim.worst_mw) == (151_000, 300_000, 300_900)
    xe = dataclasses.replace(amd, min_limit_w=150.51, caps=Capabilities(separate_requested=False, limit_step_w=0.125))
    xe_lim = card_limits(xe, CardOverride(max_w=200.2), None)
    assert (xe_lim.min_mw, xe_lim.max_mw) == (150_625, 200_125)
    nvml = card_limits(info(150.5, 300.9, 300.9), CardOverride(), None)
    assert (nvml.min_mw, nvml.max_mw) == (150_500, 300_900)
