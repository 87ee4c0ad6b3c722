"""Every log field about what a card is counted at equals what its ledger counts.

A card lost, back, unreadable or whose write fails is logged with the watts it is
reserved at (``counted_w``, ``reserved_w``, and the over-budget cause's "counted at" /
"reserved at"); each must be the ledger's bound for that card when the tick ends (the
figure the controller plans with), never another computation of it."""

from __future__ import annotations

import re

from structlog.testing import capture_logs

from support.rig import Fault, busy, card, make_rig
from powerbudgetd_sim.physics import BankEvent

COUNT_FIELDS = ("counted_w", "reserved_w")
CAUSE = re.compile(r"GPU (\d+) [^;]*?(?:counted|reserved) at ([\d.]+) W")


def test_log_fields_about_a_cards_count_equal_the_ledgers_bound() -> None:
    """Three busy 150-300 W cards at their 250 W shares of 750 W. Card 2 falls off the
    bus at 3 s and comes back at 6 s (at its 300 W default); every call on card 1 fails
    from 8 s to 9 s; card 0's writes are refused once at 12 s."""
    faults = [Fault("*", "UNKNOWN", card=1, from_s=8.0, until_s=9.0),
              Fault("nvmlDeviceSetPowerManagementLimit", "UNKNOWN", card=0, from_s=12.0, count=1)]
    events = [BankEvent(3.0, 2, "disappear"), BankEvent(6.0, 2, "appear"), BankEvent(12.0, 0, "set_limit", limit_w=300.0)]
    rig = make_rig([card(i, busy()) for i in range(3)], 750, faults=faults, events=events)
    checked: list[str] = []
    while rig.t < 15.0:
        with capture_logs() as logs:
            rig.step()
        bound_w = {c.uuid: c.bound_mw / 1000 for c in rig.ctl.cards}
        by_index = {c.index: c.bound_mw / 1000 for c in rig.ctl.cards}
        for e in logs:
            for name in COUNT_FIELDS:
                if name in e and "uuid" in e:
                    assert e[name] == bound_w[e["uuid"]], (rig.t, e, bound_w)
                    checked.append(e["event"])
            for index, watts in CAUSE.findall(e.get("cause") or ""):
                assert float(watts) == by_index[int(index)], (rig.t, e["cause"], by_index)
                checked.append("over_budget cause")
    assert {"card_gone", "card_returned", "card_unreadable", "write_failed", "over_budget cause"} <= set(checked)
