"""A new budget is checked against what the last tick counted, not by calling NVML:
``set_budget`` runs on the daemon's event loop between ticks, so a call there on a hung
card we do not control would hold the loop up to the call's deadline."""

from __future__ import annotations

import time

import pytest

from support.rig import Fault, card, make_rig
from powerbudgetd.core.model import CardOverride
from powerbudgetd.errors import BudgetInfeasible
from powerbudgetd.hw.calls import DeadlineCalls


def test_a_budget_change_makes_no_nvml_call_even_with_a_hung_card_we_do_not_control() -> None:
    """Card 2 is excluded (counted, never written); from t = 2 s, after the last tick,
    every call on it hangs 3 s of wall time. A budget change then returns at once, and
    the floor check still counts card 2 at what the last tick counted it at."""
    calls = DeadlineCalls(1.0)
    rig = make_rig([card(0), card(1), card(2)], 900, faults=[Fault("*", "SLOW", card=2, from_s=2.0, delay_s=3.0)],
                   calls=calls, overrides={"2": CardOverride(exclude=True)})
    rig.run(2.0)
    rig.bank.advance_to(rig.t)  # t = 2 s: card 2 hangs from now, no tick has seen it yet
    fixed = rig.ctl.cards[2]
    assert not fixed.controllable
    started = time.monotonic()
    rig.ctl.set_budget(850)
    took_s = time.monotonic() - started
    assert took_s < 0.1, f"set_budget waited {took_s:.2f} s: an NVML call on the caller's thread"
    # Two floors of 150 W beside card 2's bound: a budget below that sum is still refused.
    floor_w = 2 * 150 + fixed.bound_mw / 1000
    with pytest.raises(BudgetInfeasible):
        rig.ctl.set_budget(floor_w - 1)
