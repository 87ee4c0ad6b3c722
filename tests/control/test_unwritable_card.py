"""A card whose writes never take (setting is not supported, or writes succeed and change
nothing) is held at what may be in force on it, on its own: the bank is not put in
failsafe, and the other cards keep lending among themselves."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from support.rig import Fault, busy, card, make_rig
from powerbudgetd.core.model import Mode, Role

BUDGET_W = 1000.0
FAIR_W = 250.0  # 1000 W over four cards


@pytest.mark.parametrize("how", ["ignores_writes", "not_supported"])
def test_a_card_that_will_not_take_writes_is_held_alone_and_the_others_keep_lending(how: str) -> None:
    """Cards 0 and 1 busy, card 2 idle (a donor), card 3 idle and unwritable after boot."""
    if how == "ignores_writes":
        specs, faults = [card(0, busy()), card(1, busy()), card(2), card(3, ignores_writes=True)], []
    else:
        specs = [card(0, busy()), card(1, busy()), card(2), card(3)]
        faults = [Fault("nvmlDeviceSetPowerManagementLimit", "NOT_SUPPORTED", card=3, from_s=0.5)]
    rig = make_rig(specs, BUDGET_W, faults=faults)
    lending_ticks = modes_after_ready = 0
    modes = set()

    def check(r) -> None:
        nonlocal lending_ticks, modes_after_ready
        assert r.ctl.sum_bound_mw >= r.bank.sum_limit_bound_mw()  # card 3 never counted under the truth
        if r.ctl.ready and r.t > 1.0:
            modes.add(r.ctl.mode)
            assert r.truth_w() <= BUDGET_W
        if r.t >= 10.0:
            modes_after_ready += 1
            lending_ticks += r.enforced_w(2) == 150.0 and min(r.enforced_w(0), r.enforced_w(1)) > FAIR_W

    with capture_logs() as logs:
        rig.run(120.0, check)
    assert Mode.FAILSAFE not in modes and modes == {Mode.DYNAMIC}
    assert lending_ticks == modes_after_ready  # lending among the healthy cards throughout
    c3 = rig.ctl.cards[3]
    assert c3.role == Role.FIXED and c3.bound_mw >= rig.bank.cards[3].limit_bound_mw(rig.bank.now)
    held = [e for e in logs if e["event"] in ("write_unconfirmed", "write_failed")]
    assert len(held) == 1 and held[0]["index"] == 3  # the operator told once, not at each retry
