"""A card held below its requested limit from outside (a BMC or node-level cap: enforced
under requested, sustained) is given what it can use and the rest is lent; the operator
is told once (a log line, and a metric: see tests/channels), and its role does not flip."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from support.rig import busy, card, make_rig
from powerbudgetd.control import observe
from powerbudgetd_sim.physics import BankEvent


def ceiling(at_s: float, index: int, limit_w: float | None) -> BankEvent:
    return BankEvent(at_s, index, "ceiling", limit_w=limit_w)


def test_a_card_capped_from_outside_is_given_what_it_can_use_and_the_rest_lent() -> None:
    """Four busy cards at 1000 W (250 W each); from t = 5 s a BMC holds card 1 at 180 W."""
    rig = make_rig([card(i, busy()) for i in range(4)], 1000)
    rig.bank._events = [(5.0, 0, ceiling(5.0, 1, 180.0))]
    rig.run(5.0)
    roles = []
    with capture_logs() as logs:
        rig.run(65.0, lambda r: roles.append(r.ctl.cards[1].role))
        assert r_truth_ok(rig)
    assert rig.bank.cards[1].requested(rig.bank.now) == 180_000  # asked for what it can use
    assert [rig.enforced_w(i) for i in (0, 2, 3)] == [pytest.approx(820.0 / 3, abs=0.01)] * 3  # the rest lent
    assert sum(a != b for a, b in zip(roles, roles[1:])) == 0
    said = [e for e in logs if e["event"] == "limit_capped_outside"]
    assert len(said) == 1 and (said[0]["index"], said[0]["requested_w"], said[0]["enforced_w"]) == (1, 250.0, 180.0)
    assert rig.reports[-1].snapshot.cards[1].outside_cap_w == 180.0


def test_a_capped_recipient_neither_flips_nor_floods_the_log_and_a_lifted_cap_is_found(monkeypatch) -> None:
    """Cards 0 and 1 busy (recipients at their 300 W max), 2 and 3 idle donors; a node cap
    holds card 1 at 200 W from t = 5 s and lets go at t = 40 s; the card is offered its
    share again every 20 s."""
    monkeypatch.setattr(observe, "OUTSIDE_CAP_CHECK_S", 20.0)
    rig = make_rig([card(0, busy()), card(1, busy()), card(2), card(3)], 1000)
    rig.bank._events = [(5.0, 0, ceiling(5.0, 1, 200.0)), (40.0, 1, ceiling(40.0, 1, None))]
    rig.run(5.0)
    roles = []
    with capture_logs() as logs:
        rig.run(60.0, lambda r: roles.append(r.ctl.cards[1].role))
        assert r_truth_ok(rig)
    flips = sum(a != b for a, b in zip(roles, roles[1:]))
    assert flips == 0, flips
    names = [e["event"] for e in logs]
    assert names.count("limit_capped_outside") == 1 and names.count("limit_cap_outside_lifted") == 1
    assert rig.reports[-1].snapshot.cards[1].outside_cap_w is None
    assert [rig.enforced_w(i) for i in range(4)] == [300.0, 300.0, 150.0, 150.0]  # lent to it again


def r_truth_ok(rig) -> bool:
    return all(r.snapshot.sum_limit_bound_w <= 1000.0 for r in rig.reports[60:]) and rig.truth_w() <= 1000.0
