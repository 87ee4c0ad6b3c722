"""A budget change made by a reload: the next tick's writes say ``reload``, decreases first."""

from __future__ import annotations

from powerbudgetd.core.model import Timings
from support.rig import Rig, scenario_rig


def booted(budget_w: float) -> Rig:
    rig = scenario_rig("workstation-4", Timings(), budget_w=budget_w, seed=0)
    while not rig.ctl.ready:
        rig.step()
    return rig


def test_lower_budget_acts_in_the_next_tick_with_reason_reload() -> None:
    rig = booted(1000)
    rig.ctl.set_budget(900, reason="reload")
    writes = rig.step().writes
    assert [(w.reason, w.from_w, w.to_w) for w in writes] == [("reload", 250.0, 225.0)] * 4
    # the tick after carries its own reasons again, and the bank settles at the budget
    for _ in range(20):
        assert all(w.reason != "reload" for w in rig.step().writes)
    assert rig.bank.sum_limit_bound_mw() <= 900_000


def test_set_budget_without_reason_keeps_the_policy_reasons() -> None:
    rig = booted(1000)
    rig.ctl.set_budget(1100)
    writes = rig.step().writes
    assert writes and all(w.reason != "reload" for w in writes)
