"""The actuator's last guard: no increase past the budget, whatever the plan says.

The plan never asks for one (see tests/core/test_plan_writes.py); these tests hand the
actuator, and a controller, a plan that does, and check it is refused, nothing is
written, and the refusal is logged as a bug."""

from __future__ import annotations

from structlog.testing import capture_logs

from support.rig import busy, card, make_rig
from powerbudgetd.control.actuator import Actuator
from powerbudgetd.core.plan import Write


def refusals(logs: list[dict]) -> list[dict]:
    return [e for e in logs if e["event"] == "plan_breaks_budget"]


def test_an_increase_past_the_budget_is_refused_and_logged_as_a_bug() -> None:
    rig = make_rig([card(0), card(1)], 500)
    rig.run(1.0)  # both at their 250 W shares, confirmed
    uuid = rig.ctl.cards[0].uuid
    actuator = Actuator(rig.nvml)
    writes_before = rig.bank.cards[0].writes
    with capture_logs() as logs:
        (applied,) = actuator.apply([Write(uuid, 250_000, 300_000)], sum_bound_mw=500_000, budget_mw=500_000)
    assert applied.skipped and not applied.done
    assert rig.bank.cards[0].writes == writes_before and rig.bank.cards[0].requested_mw == 250_000
    (line,) = refusals(logs)
    assert line["log_level"] == "error" and line["bug"] is True
    assert line["sum_after_w"] == 550.0 and line["budget_w"] == 500.0 and line["uuid"] == uuid


def test_a_decrease_frees_nothing_for_an_increase_in_the_same_plan() -> None:
    """A decrease counts only once read back: an increase that relies on it is refused,
    the decrease itself is sent; an increase that fits is sent."""
    rig = make_rig([card(0), card(1), card(2)], 750)
    rig.run(1.0)
    a, b, c = (x.uuid for x in rig.ctl.cards)
    plan = [Write(a, 250_000, 200_000), Write(b, 250_000, 300_000), Write(c, 250_000, 250_000)]
    with capture_logs() as logs:
        applied = Actuator(rig.nvml).apply(plan, sum_bound_mw=750_000, budget_mw=750_000)
    assert [x.done for x in applied] == [True, False, True]
    assert len(refusals(logs)) == 1 and rig.bank.cards[1].requested_mw == 250_000
    fits = Actuator(rig.nvml).apply([Write(b, 250_000, 260_000)], sum_bound_mw=740_000, budget_mw=750_000)
    assert fits[0].done and rig.bank.cards[1].requested_mw == 260_000


def test_a_controller_handed_a_bad_plan_keeps_the_bank_within_budget() -> None:
    """Both cards busy at their 250 W shares of 500 W; the plan raises card 0 to its
    300 W maximum every tick: the controller's actuator refuses it, and the truth (the
    bank's own sum of limits that may be in force) never passes the budget."""
    rig = make_rig([card(0, busy()), card(1, busy())], 500)
    rig.run(1.0)
    assert rig.ctl.cards[0].bound_mw == 250_000
    bad = [Write(rig.ctl.cards[0].uuid, 250_000, 300_000)]
    rig.ctl._plan = lambda *args, **kw: bad  # type: ignore[method-assign]
    with capture_logs() as logs:
        for _ in range(10):
            rig.step()
            assert rig.truth_w() <= 500.0
    assert len(refusals(logs)) == 10 and rig.bank.cards[0].requested_mw == 250_000


def test_lower_writes_decreases_only_and_refuses_an_increase_as_a_bug() -> None:
    """``failsafe``'s writer: it spends no budget, so an increase is refused whatever the
    sums, and each decrease is sent."""
    rig = make_rig([card(0), card(1)], 500)
    rig.run(1.0)
    a, b = (x.uuid for x in rig.ctl.cards)
    with capture_logs() as logs:
        applied = Actuator(rig.nvml).lower([Write(a, 250_000, 200_000), Write(b, 250_000, 251_000)])
    assert [x.done for x in applied] == [True, False] and applied[1].skipped
    assert rig.bank.cards[0].requested_mw == 200_000 and rig.bank.cards[1].requested_mw == 250_000
    (line,) = [e for e in logs if e["event"] == "increase_refused"]
    assert line["bug"] is True and line["uuid"] == b
