"""A budget change made by a reload: the next tick's writes say ``reload``, decreases first."""

from __future__ import annotations

from powerbudgetd.control.controller import Controller
from powerbudgetd.hw.nvml import Nvml
from powerbudgetd_sim.libnvml import SimNvmlLibrary
from powerbudgetd_sim.physics import SimBank
from powerbudgetd_sim.scenario import load_scenario


def booted(budget_w: float) -> tuple[Controller, SimBank, float]:
    sim = SimBank(list(load_scenario("workstation-4").cards))
    nvml = Nvml(SimNvmlLibrary(sim))
    nvml.init()
    ctl = Controller(nvml, budget_w)
    ctl.start()
    t = 0.0
    while not ctl.ready:
        sim.advance_to(t)
        ctl.tick(t)
        t = round(t + 0.1, 9)
    return ctl, sim, t


def test_lower_budget_acts_in_the_next_tick_with_reason_reload() -> None:
    ctl, sim, t = booted(1000)
    ctl.set_budget(900, reason="reload")
    sim.advance_to(t)
    writes = ctl.tick(t).writes
    assert [(w.reason, w.from_w, w.to_w) for w in writes] == [("reload", 250.0, 225.0)] * 4
    # the tick after carries its own reasons again, and the bank settles at the budget
    for _ in range(20):
        t = round(t + 0.1, 9)
        sim.advance_to(t)
        assert all(w.reason != "reload" for w in ctl.tick(t).writes)
    assert sim.sum_limit_bound_mw() <= 900_000


def test_set_budget_without_reason_keeps_the_policy_reasons() -> None:
    ctl, sim, t = booted(1000)
    ctl.set_budget(1100)
    sim.advance_to(t)
    writes = ctl.tick(t).writes
    assert writes and all(w.reason != "reload" for w in writes)
