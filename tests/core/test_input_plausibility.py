"""The plausibility rule every measured wall figure passes (core.plausible), on its own and
as the UPS's measured load uses it: a reading below our own cards' draw at the plug, a
sentinel or a frozen value is rejected, the budget never rises on it, and trust returns
only after a run of plausible readings."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerbudgetd.core.plausible import FROZEN_READINGS, TRUST_AFTER, InputCheck
from powerbudgetd.core.ups import UpsGuard, UpsParams, parse_vars
from support.examples import examples

EFF = 0.9


def test_a_reading_below_what_our_cards_draw_at_the_plug_is_rejected_and_named() -> None:
    check = InputCheck("ups")
    v = check.check(850.0, 800.0, EFF)  # 800 W of board power is 889 W at the plug
    assert v.reason == "below_own_draw" and not v.trusted and v.changed
    assert "ups reads 850 W" in v.detail and "800 W of board power" in v.detail and "889 W at the plug" in v.detail
    assert check.check(900.0, 800.0, EFF).plausible  # above it: plausible (the host's own draw is the rest)


@pytest.mark.parametrize("value_w", [0.0, 65535.0, 32767.0, 4294967295.0])
def test_sentinels_are_rejected_whatever_our_draw(value_w: float) -> None:
    assert InputCheck("wall_meter").check(value_w, 0.0, EFF).reason == "sentinel"


def test_a_frozen_value_is_rejected_once_our_draw_has_moved_under_it() -> None:
    check = InputCheck("ups")
    for i in range(FROZEN_READINGS - 1):
        assert check.check(1200.0, 400.0 + 50 * (i % 2), EFF).plausible  # still possible: a steady meter
    assert check.check(1200.0, 800.0, EFF).reason == "frozen"  # ours moved 400 W board, it did not
    steady = InputCheck("ups")
    for _ in range(3 * FROZEN_READINGS):  # a steady bank under a steady meter is not frozen
        assert steady.check(1200.0, 600.0, EFF).plausible
    coarse = InputCheck("ups")
    for i in range(2 * FROZEN_READINGS):  # a 1 % step of a 10 kW UPS hides a 100 W move
        assert coarse.check(5000.0, 600.0 + 100 * (i % 2), EFF, resolution_w=100.0).plausible


def test_trust_returns_after_a_run_of_plausible_readings_and_says_so_once() -> None:
    check = InputCheck("ups")
    assert check.check(0.0, 800.0, EFF).changed
    assert not check.check(0.0, 800.0, EFF).changed  # one warning, not one per reading
    verdicts = [check.check(1100.0, 800.0, EFF) for _ in range(TRUST_AFTER)]
    assert [v.trusted for v in verdicts] == [False] * (TRUST_AFTER - 1) + [True]
    assert [v.changed for v in verdicts] == [False] * (TRUST_AFTER - 1) + [True]
    assert f"after {TRUST_AFTER} plausible readings (2 rejected)" in verdicts[-1].detail
    check.check(0.0, 800.0, EFF)
    check.check(1100.0, 800.0, EFF)
    assert check.check(0.0, 800.0, EFF).changed is False  # still distrusted: the run starts over
    assert check.good_run == 0


def test_a_distrusted_source_may_lower_its_budget_never_raise_it() -> None:
    check = InputCheck("ups")
    check.check(0.0, 800.0, EFF)
    assert check.admit(600.0, 550.0) == 550.0
    assert check.admit(600.0, 700.0) == 600.0
    assert check.admit(600.0, None) == 600.0  # "not limiting" is a raise
    assert check.admit(None, 700.0) == 700.0
    trusted = InputCheck("ups")
    assert trusted.admit(600.0, 700.0) == 700.0 and trusted.admit(600.0, None) is None


def ups(load: str | None = None, realpower: str | None = None) -> dict[str, str]:
    v = {"ups.status": "OL", "ups.realpower.nominal": "1500"}
    if load is not None:
        v["ups.load"] = load
    if realpower is not None:
        v["ups.realpower"] = realpower
    return v


@pytest.mark.parametrize("lie", [ups(load="0"), ups(load="95", realpower="0")])
def test_the_ups_measured_load_of_zero_never_raises_the_budget(lie: dict[str, str]) -> None:
    g = UpsGuard(UpsParams(wall_limit_w=1200.0, psu_efficiency=EFF, hysteresis_w=20.0))
    g.observe(parse_vars(ups(load="95")), 0.0, board_w=800.0, configured_w=1000.0)  # 1425 W: 225 W over
    held = g.evaluate(0.0, 1000.0, 600.0).budget_w
    assert held is not None and held < 800
    for t in range(1, 20):
        g.observe(parse_vars(lie), float(t), board_w=800.0, configured_w=1000.0)
        assert g.evaluate(float(t), 1000.0, 600.0).budget_w == held
    assert g.verdict is not None and g.verdict.reason in ("sentinel", "below_own_draw")
    # Plausible and low (the load fell to 60 %: 900 W): trusted again after the run, then it rises.
    for t in range(20, 20 + TRUST_AFTER - 1):
        g.observe(parse_vars(ups(load="60")), float(t), board_w=800.0, configured_w=1000.0)
        assert g.evaluate(float(t), 1000.0, 600.0).budget_w == held
    g.observe(parse_vars(ups(load="60")), 30.0, board_w=800.0, configured_w=1000.0)
    risen = g.evaluate(30.0, 1000.0, 600.0).budget_w
    assert risen is None or risen > held  # trusted: it rises (part of the way: core.sensor's bounded rise)
    # 900 W at the plug, the next readings (each a change) take it back to no longer limiting.
    for t, load in enumerate(["61", "60", "61", "60", "61"], start=40):
        g.observe(parse_vars(ups(load=load)), float(t), board_w=800.0, configured_w=1000.0)
    assert g.evaluate(50.0, 1000.0, 600.0).budget_w is None


@given(st.lists(st.tuples(st.booleans(), st.floats(0, 3000), st.floats(50, 1200)), min_size=1, max_size=40))
@settings(max_examples=examples(200))
def test_the_measured_load_budget_never_rises_on_an_implausible_reading(
        readings: list[tuple[bool, float, float]]) -> None:
    g = UpsGuard(UpsParams(wall_limit_w=1200.0, psu_efficiency=EFF, hysteresis_w=20.0))
    recent = [readings[0][2]] * 2
    for t, (lie, wall_w, board_w) in enumerate(readings):
        # a lie: a sentinel, or below what the cards drew at the plug at any time it may
        # have been taken (since the last poll, less the meter's 1 s of averaging: these
        # polls are 1 s apart; core.sensor pairs it so)
        lowest_w, recent = min(board_w, *recent), [recent[1], board_w]
        if lie:
            wall_w = 0.0 if wall_w > 1500 else wall_w * (lowest_w / EFF) / 3000 * 0.99
        before = g.evaluate(float(t), 1000.0, 300.0).budget_w
        g.observe(parse_vars({"ups.status": "OL", "ups.realpower": repr(wall_w)}), float(t), board_w=board_w,
                  configured_w=1000.0)
        after = g.evaluate(float(t), 1000.0, 300.0).budget_w
        if lie:
            assert after == before


@pytest.mark.parametrize("value_w", [1e300, 2.0**31 * 10, 1_000_001.0, float("inf"), float("nan")])
def test_a_figure_no_plug_gives_is_refused_and_the_budget_kept(value_w: float) -> None:
    """A garbled figure (a BMC's 1e300, a PDU's raw 2^31 scaled, inf, NaN) is no reading:
    refused as a sentinel, naming the range, and the budget it allows keeps its value
    (not driven to the floor by one bad answer)."""
    from powerbudgetd.core.sensor import LoopParams, MeterLoop

    loop = MeterLoop("bmc", LoopParams(1200.0, 0.9))
    loop.own_draw(0.0, 500.0)
    loop.poll(900.0, 0.0, 1000.0)
    kept = loop.budget_w
    loop.own_draw(1.0, 500.0)
    v = loop.poll(value_w, 1.0, 1000.0)
    assert v is not None and v.reason == "sentinel" and "0 to 1e+06 W" in v.detail
    assert loop.budget_w == kept
